"""Where a sweep's work runs: in this process (``local``, the default) or as Ray tasks (``ray``).

The sweep cuts its pending runs into *shards* and maps a function over them; whichever backend
runs a shard, its result is the same (records depend on the run only), so the store receives
the same records bit for bit.

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
from typing import Any

__all__ = ["BACKENDS", "check_backend", "ray_map", "ray_cluster", "RAY_MAX_RETRIES"]

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
