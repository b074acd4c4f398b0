"""Where a sweep's work runs: in this process (``local``, the default) or on Ray (``ray``),
its records going to its store (:func:`open_store`, :func:`run_into_store`; docs/sweeps.md).

The sweep cuts its pending runs into batches, and for Ray into *shards* of batches, and maps a
function over them; whichever backend runs a shard, its result is the same (records depend on
the run only), so the store receives the same records bit for bit.

``ray``: ``ray.init()`` starts a local cluster on this machine, or joins the one at
``address`` (``"auto"`` or ``"host:port"``). The shards are run by actors, one per GPU (a GPU
sweep) or per CPU of the cluster (:class:`KdalabWorker`: a GPU actor keeps its GPU for its
lifetime, and starts CUDA once, all actors at once). Each actor has two
shards in hand, so memory stays bounded however many shards the sweep has, and results are
handed back as they complete. A shard whose actor dies (killed, out of memory, a lost node)
is rerun on the restarted actor (``RAY_MAX_RETRIES``); the driver receives each shard's result
once, so nothing is lost or doubled. Ray is optional: ``pip install 'kdalab[ray]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from kdalab import params
from kdalab.experiments.plan import Batch, SweepPlan
from kdalab.experiments.sweep import (
    DEFAULT_MAX_BATCH,
    _cpu_threads,
    iter_batch_tables,
)
from kdalab.kda.recipe import get_recipe

__all__ = ["BACKENDS", "check_backend", "ray_map", "ray_cluster", "RAY_MAX_RETRIES", "STORE_KIND",
           "KdalabWorker", "open_store", "run_into_store", "run_shard", "warm_worker"]

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


class KdalabWorker:
    """A Ray actor that runs shards (its process is titled ``ray::KdalabWorker.run`` while it
    does): one per GPU (or CPU) of the cluster, up for as long as the driver.

    Actors, not tasks, because an actor's GPU is its own for its lifetime. Ray reuses a task's
    worker process for later tasks, each leased on whichever GPU is free then, and sets
    ``CUDA_VISIBLE_DEVICES`` anew, but CUDA, once initialized in a process, stays on the
    device it found: on a local Ray with 2 (declared) GPUs and a driver slow to collect, 24 of
    40 tasks ran in a worker whose ``CUDA_VISIBLE_DEVICES`` had changed since its first task
    (docs/sweeps.md), so two workers could compute on one GPU while the other idled. And the
    costs of a start (importing torch, CUDA's context, the first kernels)
    are paid once per actor, by all actors at once, in ``setup``."""

    def __init__(self, setup: tuple | None = None):
        if setup is not None:
            setup[0](*setup[1:])

    def run(self, fn: Callable, shard):
        return fn(shard)


#: The actors of this driver: (key, handles); one set at a time, since they hold the
#: cluster's GPUs or CPUs for as long as they live.
_WORKERS: list = []


def _session(ray) -> tuple[str, str]:
    """This driver's connection: its job and its node. A cluster started anew after
    ``ray.shutdown()`` numbers its jobs from 1 again, so the job alone would take the dead
    cluster's actors for this one's; its node is new."""
    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_node_id()


def _workers(ray, slots: int, gpu: bool, setup: tuple | None, concurrency: int) -> list:
    """``slots`` actors, one GPU (or one CPU) each, reused while the key is the same (a second
    sweep in this driver finds them warm); other actors of this driver are stopped first."""
    key = (_session(ray), slots, gpu, setup, concurrency)
    if _WORKERS and _WORKERS[0][0] == key:
        return _WORKERS[0][1]
    _stop_workers(ray)
    remote = ray.remote(KdalabWorker).options(
        num_gpus=1 if gpu else 0, num_cpus=1, max_concurrency=concurrency,
        max_restarts=RAY_MAX_RETRIES, max_task_retries=RAY_MAX_RETRIES)
    handles = [remote.remote(setup) for _ in range(slots)]
    _WORKERS[:] = [(key, handles)]
    return handles


def _stop_workers(ray) -> None:
    if _WORKERS:
        (session, *_), handles = _WORKERS.pop()
        if ray.is_initialized() and session == _session(ray):  # else they died with it
            for handle in handles:
                ray.kill(handle)


def ray_map(fn: Callable, shards: Iterable, *, gpu: bool = False, address: str | None = None,
            num_cpus: int | None = None, setup: tuple | None = None, concurrency: int = 1,
            in_flight: int = 2) -> Iterator[tuple]:
    """``(shard, fn(shard))`` for every shard, as they complete (any order), computed by one
    :class:`KdalabWorker` actor per GPU of the cluster (``gpu``) or per CPU.

    ``fn`` (a function or a ``functools.partial`` of one) is pickled once; the workers must
    be able to import its module (an installed package). ``setup``: ``(function, *args)``,
    called once by each actor when it starts (hashable: actors are reused across calls with
    the same one). ``concurrency``: shards an actor runs at once (threads). ``in_flight``:
    shards handed to an actor and not yet collected, so that it never waits for the driver.
    ``num_cpus`` sizes a local cluster started here (default: the machine's). Shards are
    drawn from ``shards`` lazily, each to the actor with the fewest in hand. A shard whose
    actor dies (killed, out of memory, a lost node) is rerun on the restarted actor, up to
    :data:`RAY_MAX_RETRIES` times; an exception raised by ``fn`` is not retried.
    """
    ray = _init(address, num_cpus)
    cpus, gpus = ray_cluster(address, num_cpus)
    slots = gpus if gpu else cpus
    if slots < 1:
        where = f"the Ray cluster at {address}" if address else "this machine's Ray cluster"
        raise ValueError(f"{where} has no {'GPU' if gpu else 'CPU'} to run on")
    workers = _workers(ray, slots, gpu, setup, concurrency)
    fn_ref = ray.put(fn)  # pickled once, not once per shard
    in_hand = [0] * len(workers)
    pending: dict = {}  # ref -> (shard, worker)
    source = iter(shards)
    exhausted = False
    try:
        while True:
            while not exhausted and min(in_hand) < in_flight:
                try:
                    shard = next(source)
                except StopIteration:
                    exhausted = True
                    break
                w = in_hand.index(min(in_hand))
                pending[workers[w].run.remote(fn_ref, shard)] = (shard, w)
                in_hand[w] += 1
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                shard, w = pending.pop(ref)
                in_hand[w] -= 1
                yield shard, ray.get(ref)
    finally:  # an error or an interrupt: stop the work still in hand
        if pending:
            _stop_workers(ray)


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
        with _cpu_threads(device, threads):
            for batch, table in iter_batch_tables(batches, plan.accumulations,
                                                  recipe=plan.recipe, device=device):
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
    names = tuple(m.name for m in plan.accumulations)
    work = partial(run_shard, accumulations=list(names), recipe=plan.recipe.name,
                   device=device.type)
    # a GPU worker runs two shards at once: the GPU computes one while the other starts or
    # ends
    setup = (warm_worker, device.type, names, plan.recipe.name) if gpu else None
    for _, results in ray_map(work, _shards(batches, shard_runs), gpu=gpu, address=address,
                              setup=setup, concurrency=2 if gpu else 1):
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


def run_shard(shard: list[Batch], *, accumulations: list[str], recipe: str,
              device: str) -> list[tuple[Batch, object]]:
    """A Ray worker's shard: the records of its batches, pipelined as in the local backend, on
    one intra-op thread (Ray gives each worker one CPU)."""
    dev = torch.device(device)
    models = params.accumulations(accumulations, "accumulations", dev.type)
    with _cpu_threads(dev, 1):
        return list(iter_batch_tables(shard, models, recipe=get_recipe(recipe), device=dev))


def warm_worker(device: str, accumulations: tuple[str, ...], recipe: str) -> None:
    """A GPU worker's start: one small batch initializes CUDA, its libraries and kdalab's
    kernels, so that no shard pays for them."""
    from kdalab.experiments.inverse import launch_group
    from kdalab.experiments.runs import Run

    dev = torch.device(device)
    models = params.accumulations(list(accumulations), "accumulations", dev.type)
    with _cpu_threads(dev, 1):
        launch_group([Run("floor", -5.0, 16, 0, 16)], models, recipe=get_recipe(recipe),
                     device=dev).table()
