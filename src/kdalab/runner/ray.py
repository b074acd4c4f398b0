"""The Ray backend: a study's shards of batches mapped over one actor per GPU (a GPU study) or
per CPU of a Ray cluster (docs/sweeps.md). Ray is optional: ``pip install 'kdalab[ray]'``.

``ray.init()`` starts a local cluster on this machine, or joins the one at ``address``
(``"auto"`` or ``"host:port"``; a host:port that does not answer, or answers without speaking
gRPC as Ray's GCS does, or does not accept the driver within :data:`CONNECT_TIMEOUT` seconds,
is one error naming ``--address``, without Ray's own retry warnings). Each actor has two shards
in hand, so memory stays bounded however many shards the study has, and results are handed
back as they complete. A shard whose actor dies (killed, out of memory, a lost node) is rerun
on the restarted actor (:data:`RAY_MAX_RETRIES`); the driver receives each shard's result once,
so nothing is lost or doubled.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kdalab.errors import Unavailable

__all__ = ["BACKENDS", "check_backend", "ray_map", "ray_cluster", "RAY_MAX_RETRIES",
           "CONNECT_TIMEOUT", "KdalabWorker"]

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


#: Seconds to wait for the Ray cluster at ``--address`` to join it, before giving up (Ray's
#: own client retries for minutes, with a warning every few seconds). A head that answers the
#: handshake (:func:`_probe`) accepts a driver within a few seconds.
CONNECT_TIMEOUT = 15.0
#: Seconds for the head's port to open and answer the gRPC handshake (:func:`_probe`).
PROBE_TIMEOUT = 3.0
#: HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS) answers them
#: at once with a frame of its own (RFC 9113 §3.4), a silent or foreign port does not.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _probe(address: str, timeout: float) -> None:
    """A ValueError naming ``--address`` unless a gRPC server (Ray's GCS) answers at
    ``host:port`` (with ``RAY_USE_TLS`` set, a plain open port is enough: TLS answers no plain
    handshake)."""
    import os

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--address must be host:port or auto, got {address!r}")
    hint = "start one with 'ray start --head' or give the head's host:port"
    try:
        conn = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        raise ValueError(f"--address {address}: no Ray cluster answers there ({why}); "
                         f"{hint}") from None
    head, said = b"", "closed the connection"
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return
        try:
            conn.sendall(_H2_PREFACE)
            while len(head) < 9:  # a frame's header: length (3), type (1), flags, stream
                got = conn.recv(9 - len(head))
                if not got:
                    break
                head += got
        except TimeoutError:
            said = f"said nothing for {timeout:g} s"
        except OSError:
            said = "reset the connection"
    if len(head) < 9 or head[3] not in (0x04, 0x07):  # SETTINGS, or GOAWAY: gRPC speaking
        said = "answered, not in gRPC" if head else said
        raise ValueError(f"--address {address}: a port is open there but it is no Ray cluster "
                         f"(it {said}); {hint}")


@contextlib.contextmanager
def _stderr_muted():
    """The process's stderr (file descriptor 2) sent to the null device meanwhile: Ray's C++
    core logs its connection retries there before any of its log settings apply."""
    import os
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no stderr descriptor: nothing to mute
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _quiet_ray():
    """Ray's warnings while it connects (its C++ core's "Failed to connect to GCS …" every few
    seconds, "SIGTERM handler is not set …"): off, so that a failure is kdalab's one line."""
    import logging
    import os

    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    logging.getLogger("ray").setLevel(logging.ERROR)


def _init(address: str | None, num_cpus: int | None, timeout: float | None = None):
    ray = _import_ray()
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    if address is not None and address != "auto":
        # probed even where this process already holds a cluster (a second command in one
        # process, as in the tests): an address that answers nothing is the user's mistake
        _probe(address, min(timeout, PROBE_TIMEOUT))
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                              "configure_logging": False}
    if address is not None:
        _quiet_ray()
        kwargs["address"] = address
    elif num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    if address is None:
        ray.init(**kwargs)
        return ray
    import threading

    failed: list[BaseException] = []

    def join() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as exc:  # noqa: BLE001 (said by the caller)
            failed.append(exc)

    worker = threading.Thread(target=join, name="kdalab-ray-join", daemon=True)
    with _stderr_muted():  # Ray's C++ core warns on stderr itself while it retries
        worker.start()
        worker.join(timeout)
    if worker.is_alive():
        raise Unavailable(f"--address {address}: the Ray cluster did not accept this driver "
                          f"within {timeout:.0f} s; check --address and the cluster's state")
    if failed:
        why = (str(failed[0]).splitlines() or [type(failed[0]).__name__])[0]
        raise ValueError(f"--address {address}: no Ray cluster there ({why})") from None
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
