"""Reading a store: its parts checked as they are found, its records back in run order.

Opening a store reads every part's ``run`` column (page checksums verified) and drops a part
that does not read (torn), holds a run twice, or repeats a run of an earlier part; a writer
deletes such parts and computes their runs again, a reader skips them. Records are read back
in run order (``run``, then the order the records of one run were appended), whatever order
the parts were written in.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kdalab.records.identity import MANIFEST, PARTS, Manifest, StoreError, parse_part
from kdalab.records.identity import lock as lock_folder

__all__ = ["StoreReader", "identical", "READ_AHEAD"]

#: groups :meth:`StoreReader.iter_groups` reads ahead, on as many threads
READ_AHEAD = 8


class StoreReader:
    """The records of a store folder keyed by run. ``done`` is a bool array over the runs
    (``runs`` bytes), true for the runs stored. :meth:`read_only` opens a folder as it is on
    disk, complete or not; :class:`~kdalab.records.writer.RunStore` adds writing."""

    writable = False

    def __init__(self, folder: Path, manifest: Manifest, schema: pa.Schema, *,
                 lock_fd: int | None = None):
        self.folder = folder
        self.manifest = manifest
        self.schema = schema
        self._lock_fd = lock_fd
        self.done = np.zeros(manifest.runs, dtype=bool)
        self.parts: dict[str, list[Path]] = {}
        self.dropped: list[str] = []  # parts found torn or doubled when opened
        self._seq = 0
        self._scan()

    @classmethod
    def read_only(cls, folder: str | Path, *, lock: bool = False,
                  kind: str | None = None) -> StoreReader:
        """The store in ``folder`` as it is on disk (torn parts are skipped, not deleted).
        ``lock``: hold the folder (no writer meanwhile) to redraw its views. ``kind``: refuse
        a store of another tool or study."""
        folder = Path(folder)
        if not (folder / MANIFEST).is_file():
            raise StoreError(f"{folder} holds no kdalab store (no {MANIFEST})")
        manifest = Manifest.read(folder)
        if kind is not None and manifest.kind != kind:
            raise StoreError(f"{folder} holds the records of {manifest.kind}, not of {kind}")
        lock_fd = lock_folder(folder) if lock else None
        try:
            return StoreReader(folder, manifest, manifest.arrow_schema(), lock_fd=lock_fd)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise

    def _scan(self) -> None:
        parts_dir = self.folder / PARTS
        if not parts_dir.is_dir():
            return
        found = []
        for path in parts_dir.iterdir():
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                if self.writable:  # a part whose writing was cut short
                    path.unlink(missing_ok=True)
                continue
            parsed = parse_part(path.name)
            if parsed is not None:
                found.append((parsed[1], parsed[0], path))
        for seq, group, path in sorted(found):
            self._seq = max(self._seq, seq + 1)
            runs = self._read_runs(path)
            if runs is None or (len(runs) and self.done[runs].any()):
                self.dropped.append(path.name)
                if self.writable:
                    path.unlink(missing_ok=True)
                continue
            self.done[runs] = True
            self.parts.setdefault(group, []).append(path)

    def _read_runs(self, path: Path) -> np.ndarray | None:
        """The distinct runs of a part, or None if the part is torn or inconsistent."""
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
            if not pf.schema_arrow.equals(self.schema):
                return None
            runs = int64s(pf.read(columns=["run"]).column(0))
        except (OSError, pa.ArrowException, ValueError):
            return None
        if len(runs) == 0:
            return runs.astype(np.int64)
        if runs.min() < 0 or runs.max() >= self.manifest.runs:
            return None
        unique, counts = np.unique(runs, return_counts=True)
        if (counts != self.manifest.records_per_run).any():  # a run's records are together
            return None
        return unique

    @property
    def runs(self) -> int:
        return self.manifest.runs

    @property
    def complete(self) -> bool:
        return bool(self.done.all())

    # --- what a writer adds: records appended and not yet in a part ---------------------
    def _settle(self) -> None:
        """Wait for the parts being written (a writer's)."""

    def _buffered(self, group: str) -> list[pa.Table]:
        return []

    def _buffered_groups(self) -> list[str]:
        return []

    # --- reading ----------------------------------------------------------------------
    def groups(self) -> list[str]:
        self._settle()
        return sorted(set(self.parts) | set(self._buffered_groups()))

    def read_group(self, group: str, columns: Sequence[str] | None = None) -> pa.Table:
        """A group's records in run order (``columns``: a subset, read from disk alone)."""
        self._settle()
        return self._read_group(group, columns)

    def _read_group(self, group: str, columns: Sequence[str] | None) -> pa.Table:
        cols = None if columns is None else list(dict.fromkeys(["run", *columns]))
        tables = [pq.read_table(p, columns=cols) for p in self.parts.get(group, [])]
        tables += [t.select(cols) if cols else t for t in self._buffered(group)]
        if not tables:
            empty = self.schema.empty_table()
            return empty if cols is None else empty.select(cols)
        table = pa.concat_tables(tables)
        order = np.argsort(int64s(table.column("run")), kind="stable")
        table = table.take(pa.array(order))
        if columns is not None and "run" not in columns:
            table = table.drop_columns(["run"])
        return table

    def iter_groups(self, columns: Sequence[str] | None = None,
                    ahead: int = READ_AHEAD) -> Iterator[tuple[str, pa.Table]]:
        """(group, records) for each group in label order, the next ``ahead`` groups read
        meanwhile on threads (pyarrow reads and decodes without the GIL: a store's many small
        parts read several at a time); memory: the groups yielded and read ahead."""
        groups = self.groups()
        if ahead < 1 or len(groups) < 2:
            for group in groups:
                yield group, self._read_group(group, columns)
            return
        pending = iter(groups)
        window: deque = deque()
        with ThreadPoolExecutor(min(ahead, len(groups)), thread_name_prefix="kdalab-read") as pool:
            def read_next() -> None:
                group = next(pending, None)
                if group is not None:
                    window.append((group, pool.submit(self._read_group, group, columns)))

            for _ in range(ahead):
                read_next()
            while window:
                group, table = window.popleft()
                read_next()
                yield group, table.result()

    def read(self, columns: Sequence[str] | None = None) -> pa.Table:
        """All records, groups in label order and runs in order within each."""
        tables = [t for _, t in self.iter_groups(columns)]
        if not tables:
            empty = self.schema.empty_table()
            return empty if columns is None else empty.select(list(columns))
        return pa.concat_tables(tables)

    def frame(self, columns: Sequence[str] | None = None, *, keep_run: bool = False):
        """All records as a pandas DataFrame (:meth:`read`), without the ``run`` key unless
        ``keep_run``."""
        table = self.read(columns)
        if not keep_run and "run" in table.column_names:
            table = table.drop_columns(["run"])
        return table.to_pandas()

    def records(self) -> list[dict]:
        """All records as dicts, without the ``run`` key, in run order."""
        return self.read().drop_columns(["run"]).to_pylist()

    def set_views(self, paths: Sequence[Path]) -> None:
        """Record the view files drawn from the records (replaced on the next drawing); the
        folder must be held (a writer, or a reader opened with ``lock``)."""
        if self._lock_fd is None:
            raise StoreError(f"{self.folder}: open the store with lock=True to draw its views")
        self.manifest.views = sorted(str(Path(p).relative_to(self.folder)) for p in paths)
        self.manifest.write(self.folder)

    def remove_views(self) -> None:
        """Delete the view files drawn last (so no stale table survives a new drawing)."""
        for rel in self.manifest.views:
            (self.folder / rel).unlink(missing_ok=True)

    # --- the folder's lock --------------------------------------------------------------
    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


def int64s(values: pa.ChunkedArray) -> np.ndarray:
    """Run indices as NumPy (an int64 column without nulls, else a StoreError)."""
    if values.null_count or values.type != pa.int64():
        raise StoreError(f"run indices: expected int64 without nulls, not {values.type}")
    return values.to_numpy()


def identical(a: pa.Table, b: pa.Table) -> bool:
    """Whether two record tables are equal bit for bit: same columns and types, same nulls,
    and every value the same bits (so NaN equals NaN, and −0 differs from +0; Arrow's own
    ``equals`` says NaN ≠ NaN)."""
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for x, y in zip(a.columns, b.columns):
        if not x.is_null().equals(y.is_null()):
            return False
        if pa.types.is_floating(x.type):
            bits = {8: np.int64, 4: np.int32, 2: np.int16}[x.type.bit_width // 8]
            xv = x.fill_null(0).to_numpy().view(bits)
            yv = y.fill_null(0).to_numpy().view(bits)
            if not np.array_equal(xv, yv):
                return False
        elif not x.equals(y):
            return False
    return True


def records_table(records: Sequence[dict], schema: pa.Schema, runs: Sequence[int]) -> pa.Table:
    """Records given as dicts, as a table of the store's ``schema`` (its first column ``run``:
    each record's run, ``runs``; a key a record lacks is null)."""
    if len(runs) != len(records):
        raise ValueError(f"runs: {len(runs)} run indices for {len(records)} records")
    rows = [{**rec, "run": int(run)} for rec, run in zip(records, runs)]
    return pa.Table.from_pylist(rows, schema=schema)
