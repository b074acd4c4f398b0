"""Where a sweep's work runs: in this process (``local``, the default) or as Ray tasks (``ray``),
its records going to its store (:func:`open_store`, :func:`run_into_store`; docs/sweeps.md).

The sweep cuts its pending runs into batches, and for Ray into *shards* of batches, and maps a
function over them; whichever backend runs a shard, its result is the same (records depend on
the run only), so the store receives the same records bit for bit.

``ray``: ``ray.init()`` starts a local cluster on this machine, or joins the one at
``address`` (``"auto"`` or ``"host:port"``). A GPU shard asks for one GPU, so every GPU of the
machine or cluster works at once (Ray sets each worker's ``CUDA_VISIBLE_DEVICES``); a CPU shard
asks for one CPU. A bounded number of shards is in flight (twice the slots), so memory stays
bounded however many shards the sweep has, and results are handed back as they complete. A
task whose worker dies (killed, out of memory, a lost node) is retried by Ray
(``max_retries``); the driver receives each shard's result once, so nothing is lost or doubled.
Ray is optional: ``pip install 'kdalab[ray]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from kdalab import params
from kdalab.experiments.draw import MAX_CUDA_PROCESSES
from kdalab.experiments.plan import Batch, SweepPlan
from kdalab.experiments.sweep import (
    DEFAULT_MAX_BATCH,
    _cpu_threads,
    default_draw_processes,
    iter_batch_tables,
)
from kdalab.kda.recipe import get_recipe

__all__ = ["BACKENDS", "check_backend", "ray_map", "ray_cluster", "RAY_MAX_RETRIES", "STORE_KIND",
           "open_store", "run_into_store", "run_shard"]

BACKENDS = ("local", "ray")
#: How often Ray reruns a shard whose worker died before giving up on the sweep.
RAY_MAX_RETRIES = 3


def check_backend(name: str, address: str | None = None) -> str:
    """``name`` if it is a known backend (and Ray importable for ``ray``); else ValueError."""
    if name not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if address is not None and name != "ray":
        raise ValueError("--address joins a Ray cluster: it needs --backend ray")
    if name == "ray":
        _import_ray()
    return name


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray: pip install 'kdalab[ray]'") from None
    return ray


def _init(address: str | None, num_cpus: int | None):
    ray = _import_ray()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                                  "configure_logging": False}
        if address is not None:
            kwargs["address"] = address
        elif num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        try:
            ray.init(**kwargs)
        except ConnectionError as exc:
            raise ValueError(f"--address {address}: no Ray cluster there ({exc})") from None
    return ray


def ray_cluster(address: str | None = None, num_cpus: int | None = None) -> tuple[int, int]:
    """(CPUs, GPUs) of the Ray cluster (started here, or joined at ``address``)."""
    ray = _init(address, num_cpus)
    resources = ray.cluster_resources()
    return int(resources.get("CPU", 0)), int(resources.get("GPU", 0))


def kdalab_task(fn: Callable, shard):
    """A shard run on a Ray worker (its process is titled ``ray::kdalab_task`` meanwhile)."""
    return fn(shard)


def ray_map(fn: Callable, shards: Iterable, *, gpu: bool = False, address: str | None = None,
            num_cpus: int | None = None, in_flight: int | None = None) -> Iterator[tuple]:
    """``(shard, fn(shard))`` for every shard, as the Ray tasks complete (any order).

    ``fn`` (a function or a ``functools.partial`` of one) is pickled once; the workers must
    be able to import its module (an installed package). ``gpu``: each task asks for one GPU.
    ``num_cpus`` sizes a local cluster started here (default: the machine's); ``in_flight``
    bounds the tasks submitted and not yet collected (default twice the cluster's slots).
    Shards are drawn from ``shards`` lazily.
    """
    ray = _init(address, num_cpus)
    cpus, gpus = ray_cluster(address, num_cpus)
    slots = gpus if gpu else cpus
    if slots < 1:
        where = f"the Ray cluster at {address}" if address else "this machine's Ray cluster"
        raise ValueError(f"{where} has no {'GPU' if gpu else 'CPU'} to run on")
    in_flight = in_flight or 2 * slots
    remote = ray.remote(kdalab_task).options(num_gpus=1 if gpu else 0, num_cpus=1,
                                        max_retries=RAY_MAX_RETRIES, retry_exceptions=False)
    fn_ref = ray.put(fn)  # pickled once, not once per task
    pending: dict = {}
    source = iter(shards)
    exhausted = False
    try:
        while True:
            while not exhausted and len(pending) < in_flight:
                try:
                    shard = next(source)
                except StopIteration:
                    exhausted = True
                    break
                pending[remote.remote(fn_ref, shard)] = shard
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                shard = pending.pop(ref)
                yield shard, ray.get(ref)
    finally:  # an error or an interrupt: stop what is still queued
        for ref in pending:
            ray.cancel(ref, force=True)


# --- a sweep's plan into its store ------------------------------------------------------------

STORE_KIND = "inverse-sweep"


def open_store(plan: SweepPlan, folder: str | Path, *, resume: bool = False,
               force: bool = False):
    """The :class:`~kdalab.experiments.runstore.RunStore` for ``plan`` in ``folder``."""
    from kdalab.experiments.inverse import record_schema
    from kdalab.experiments.runstore import RunStore

    return RunStore.open(folder, kind=STORE_KIND, config=plan.identity(), runs=len(plan),
                         records_per_run=len(plan.accumulations), schema=record_schema(),
                         resume=resume, force=force)


def run_into_store(plan: SweepPlan, store, *, backend: str = "local",
                   address: str | None = None, progress: Callable[[Batch], None] | None = None,
                   max_batch: int | None = None, threads: int | None = None) -> int:
    """Run the runs of ``plan`` that ``store`` lacks and append their records; return how
    many ran. ``progress(batch)`` is called after each batch is stored (on Ray, as its shard
    completes). ``backend``: ``local`` (this process, pipelined on CUDA) or ``ray``
    (:mod:`kdalab.experiments.backends`: shards of batches as Ray tasks, one GPU or one CPU
    each; ``address`` joins a cluster). Records are the same bit for bit either way."""
    device = torch.device(plan.device)
    max_batch = max_batch or DEFAULT_MAX_BATCH[device.type == "cuda"]
    pending = int((~store.done).sum())
    batches = plan.batches(max_batch, store.done.copy())

    def stored(batch: Batch, table) -> None:
        store.append(table, batch.group)
        if progress is not None:
            progress(batch)

    if backend == "local":
        processes = default_draw_processes(pending, device)
        with _cpu_threads(device, threads):
            for batch, table in iter_batch_tables(batches, plan.accumulations,
                                                  recipe=plan.recipe, device=device,
                                                  processes=processes):
                stored(batch, table)
        return pending
    from functools import partial

    check_backend(backend, address)
    gpu = device.type == "cuda"
    cpus, gpus = ray_cluster(address)
    slots = max(1, gpus if gpu else cpus)  # ray_map says clearly when there is none
    # about four shards per slot, so the last ones finish together; CPU shards of one batch
    shard_runs = max(max_batch, min(16 * max_batch, -(-pending // (4 * slots)))) if gpu \
        else max_batch
    # the draw processes a GPU task may start: the node's cores shared by its GPUs
    processes = min(MAX_CUDA_PROCESSES, cpus // max(gpus, 1) - 4) if gpu else 0
    work = partial(run_shard, accumulations=[m.name for m in plan.accumulations],
                   recipe=plan.recipe.name, device=device.type,
                   processes=processes if processes >= 2 else 0)
    for _, results in ray_map(work, _shards(batches, shard_runs), gpu=gpu, address=address):
        for batch, table in results:
            stored(batch, table)
    return pending


def _shards(batches: Iterable[Batch], shard_runs: int) -> Iterator[list[Batch]]:
    shard: list[Batch] = []
    size = 0
    for batch in batches:
        shard.append(batch)
        size += len(batch.runs)
        if size >= shard_runs:
            yield shard
            shard, size = [], 0
    if shard:
        yield shard


def run_shard(shard: list[Batch], *, accumulations: list[str], recipe: str, device: str,
              processes: int = 0) -> list[tuple[Batch, object]]:
    """A Ray task: the records of a shard's batches, pipelined as in the local backend, on one
    intra-op thread on the CPU (Ray gives each task one CPU)."""
    dev = torch.device(device)
    models = params.accumulations(accumulations, "accumulations", dev.type)
    with _cpu_threads(dev, 1):
        return list(iter_batch_tables(shard, models, recipe=get_recipe(recipe), device=dev,
                                      processes=processes))
