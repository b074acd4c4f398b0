"""The study protocol (:class:`kdalab.runner.Study`) for the studies whose run is a *cell*: a
key that yields a fixed number of records (end-to-end: a (family, variant, chunk) cell;
dynamic range and diagonal tile: a chunk size). A study names its cells in order, the store
group of each, how to compute a batch of cells and its record fields; the rest (batches of
the cells not stored, records as a table of the store's schema, a Ray shard) is here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa

from kdalab.records import records_table

__all__ = ["CellBatch", "CellStudy", "TYPES"]

#: A record field's type by name (the studies' FIELDS).
TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}


@dataclass(frozen=True)
class CellBatch:
    """Cells of one store group computed together: their indices (the records' ``run``) and
    keys."""

    group: str
    index: np.ndarray  # int64 [n]
    keys: list


class CellStudy:
    """A study of cells. A subclass sets ``kind`` and ``FIELDS`` ((name, type name) of every
    record field, in order) and gives :meth:`keys`, :meth:`group`, :meth:`run_cells`,
    :meth:`identity` and ``records_per_run``; ``device`` (default the CPU) says where it runs."""

    kind: str
    FIELDS: tuple[tuple[str, str], ...]
    #: cells per batch (a batch is one part of the store at most)
    MAX_BATCH = 1
    device = "cpu"

    def keys(self) -> list:
        raise NotImplementedError

    def group(self, key) -> str:
        return "cells"

    def run_cells(self, keys: Sequence) -> list[list[dict]]:
        """Each cell's records (``records_per_run`` of them), cells in order."""
        raise NotImplementedError

    def identity(self) -> dict:
        raise NotImplementedError

    def cost(self, key) -> float:
        """A rough relative cost of a cell, for progress estimates only."""
        return 1.0

    def __len__(self) -> int:
        return len(self.keys())

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([("run", pa.int64())] + [(n, TYPES[t]) for n, t in self.FIELDS])

    @property
    def gpu(self) -> bool:
        return str(self.device).startswith("cuda")

    def batches(self, max_batch: int | None = None,
                done: np.ndarray | None = None) -> Iterator[CellBatch]:
        """The cells not ``done``, in order, cut into batches of one group of at most
        ``max_batch`` cells (default :attr:`MAX_BATCH`)."""
        max_batch = max_batch or self.MAX_BATCH
        current: list[tuple[int, object]] = []
        group = None
        for i, key in enumerate(self.keys()):
            if done is not None and done[i]:
                continue
            g = self.group(key)
            if current and (g != group or len(current) >= max_batch):
                yield _batch(group, current)
                current = []
            group = g
            current.append((i, key))
        if current:
            yield _batch(group, current)

    def compute(self, batches: Iterable[CellBatch], threads: int | None = None
                ) -> Iterator[tuple[CellBatch, pa.Table]]:
        """``(batch, records)`` for each batch, in this process."""
        for batch in batches:
            cells = self.run_cells(batch.keys)
            for key, cell in zip(batch.keys, cells):
                if len(cell) != self.records_per_run:
                    raise RuntimeError(f"{self.kind}: cell {key} gave {len(cell)} records, "
                                       f"not {self.records_per_run}")
            records = [rec for cell in cells for rec in cell]
            yield batch, records_table(records, self.schema,
                                       np.repeat(batch.index, self.records_per_run).tolist())

    def shard_fn(self):
        return partial(_compute_shard, self)

    def ray_setup(self) -> tuple | None:
        return None

    def shard_runs(self, pending: int, slots: int, max_batch: int | None) -> int:
        return max_batch or self.MAX_BATCH


def _batch(group: str, cells: list[tuple[int, object]]) -> CellBatch:
    return CellBatch(group, np.array([i for i, _ in cells], dtype=np.int64),
                     [key for _, key in cells])


def _compute_shard(study: CellStudy, shard: list[CellBatch]) -> list:
    return list(study.compute(shard))
