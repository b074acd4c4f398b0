"""Where a study's batches run: in this process (``local``, the default) or on Ray (``ray``),
its records going to its store (docs/sweeps.md).

A study is config → plan → batches → records. What the runner needs of it (the
:class:`Study` protocol): its identity for the store (``kind``, :meth:`~Study.identity`,
``len``, ``records_per_run``, ``schema``), its pending work cut into batches
(:meth:`~Study.batches`, each with its store ``group`` and the ``index`` of its runs), and how
a batch becomes records: :meth:`~Study.compute` in this process (a study may pipeline its
batches there), :meth:`~Study.shard_fn` on a Ray worker. Records depend on the run only, so
the store receives the same records bit for bit whichever backend ran them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from kdalab.records import RunStore
from kdalab.runner.ray import BACKENDS, check_backend, ray_cluster, ray_map

__all__ = ["Study", "BACKENDS", "check_backend", "open_store", "run_into_store"]


class Study(Protocol):
    kind: str  # the store's kind: which study wrote it
    records_per_run: int

    @property
    def schema(self): ...  # the records' Arrow schema, ``run`` first

    @property
    def gpu(self) -> bool: ...  # whether its batches run on a GPU (one Ray actor per GPU)

    def identity(self) -> dict: ...  # what determines the records (JSON data)

    def __len__(self) -> int: ...  # runs

    def batches(self, max_batch: int | None, done: np.ndarray | None) -> Iterator: ...

    def compute(self, batches: Iterable, threads: int | None = None) -> Iterator: ...

    def shard_fn(self) -> Callable: ...  # picklable: list of batches -> [(batch, table)]

    def ray_setup(self) -> tuple | None: ...  # (function, *args) run once per Ray actor

    def shard_runs(self, pending: int, slots: int, max_batch: int | None) -> int: ...


def open_store(study: Study, folder: str | Path, *, resume: bool = False,
               force: bool = False) -> RunStore:
    """The :class:`~kdalab.records.RunStore` for ``study`` in ``folder`` (refusals:
    :meth:`RunStore.open <kdalab.records.RunStore.open>`)."""
    return RunStore.open(folder, kind=study.kind, config=study.identity(), runs=len(study),
                         records_per_run=study.records_per_run, schema=study.schema,
                         resume=resume, force=force)


def run_into_store(study: Study, store: RunStore, *, backend: str = "local",
                   address: str | None = None, progress: Callable | None = None,
                   max_batch: int | None = None, threads: int | None = None) -> int:
    """Run the runs of ``study`` that ``store`` lacks and append their records; return how
    many ran. ``progress(batch)`` is called after each batch is stored (on Ray, as its shard
    completes). ``backend``: ``local`` (this process) or ``ray`` (:mod:`kdalab.runner.ray`:
    shards of batches on one actor per GPU or CPU; ``address`` joins a cluster)."""
    pending = int((~store.done).sum())
    batches = study.batches(max_batch, store.done.copy())

    def stored(batch, table) -> None:
        store.append(table, batch.group)
        if progress is not None:
            progress(batch)

    if backend == "local":
        for batch, table in study.compute(batches, threads):
            stored(batch, table)
        return pending
    check_backend(backend, address)
    cpus, gpus = ray_cluster(address)
    slots = max(1, gpus if study.gpu else cpus)  # ray_map says clearly when there is none
    shard_runs = study.shard_runs(pending, slots, max_batch)
    for _, results in ray_map(study.shard_fn(), _shards(batches, shard_runs), gpu=study.gpu,
                              address=address, setup=study.ray_setup(),
                              concurrency=2 if study.gpu else 1):
        for batch, table in results:
            stored(batch, table)
    return pending


def _shards(batches: Iterable, shard_runs: int) -> Iterator[list]:
    shard: list = []
    size = 0
    for batch in batches:
        shard.append(batch)
        size += len(batch.index)
        if size >= shard_runs:
            yield shard
            shard, size = [], 0
    if shard:
        yield shard
