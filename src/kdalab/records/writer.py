"""Writing a store: a study's records appended as they are computed, safe to kill at any moment.

**Safety.** A part is written (by a writer thread, while the study goes on) to a hidden
temporary file, flushed to disk and renamed: it is in the store whole or not at all. The
manifest is replaced the same way. Opening a store to resume deletes temporary files and the
parts that do not read back whole (:mod:`kdalab.records.reader`); their runs are computed
again. So ``kill -9`` at any moment followed by a resume gives exactly the records of an
uninterrupted study.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kdalab.records.identity import (
    LOCK,
    MANIFEST,
    PARTS,
    Manifest,
    StoreError,
    atomic_write_text,
    clear,
    fsync_dir,
    lock,
    part_name,
)
from kdalab.records.reader import StoreReader, int64s

__all__ = ["RunStore", "PART_ROWS", "PART_SECONDS", "PARTS_WRITING"]

#: A part is written when a group's buffer reaches this many records, when the group changes
#: or after PART_SECONDS: a kill loses at most that much work, and parts stay few.
PART_ROWS = 65_536
PART_SECONDS = 5.0
#: Parts handed to the writer thread and not yet on disk, at most (then appending waits).
PARTS_WRITING = 4


class RunStore(StoreReader):
    """A store open to write (:meth:`open`, new or resumed); records are appended with
    :meth:`append` (an Arrow table of the manifest's schema, all records of the runs it
    holds) and reach the disk in parts. Reading it (:class:`StoreReader`) includes what is
    appended and not yet written."""

    writable = True

    def __init__(self, folder: Path, manifest: Manifest, schema: pa.Schema, *,
                 lock_fd: int | None = None):
        super().__init__(folder, manifest, schema, lock_fd=lock_fd)
        self._buffers: dict[str, list[pa.Table]] = {}
        self._buffered_rows: dict[str, int] = {}
        self._last_flush = time.monotonic()
        self._writer: ThreadPoolExecutor | None = None  # writes the parts, off the caller
        self._writing: deque[tuple[str, Future]] = deque()  # (group, part being written)
        # (this open wrote the manifest, and made the folder): a start that stores nothing
        # leaves nothing behind (close)
        self._started = (False, False)

    @classmethod
    def open(cls, folder: str | Path, *, kind: str, config: dict, runs: int,
             records_per_run: int, schema: pa.Schema, resume: bool = False,
             force: bool = False) -> RunStore:
        """Open ``folder`` to write the study (``kind``, ``config``; ``runs`` runs of
        ``records_per_run`` records each): a new store, or the same study's stored runs kept
        with ``resume``; ``force`` replaces whatever store is there. Raises
        :class:`StoreError` (one line) for a folder it must not write."""
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise StoreError(f"--out: {folder} is a file, not a folder")
        fresh = Manifest.new(kind, config, runs, records_per_run, schema)
        if not force:  # refused before anything is created in the folder
            _refusal(folder, fresh)
        made = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"--out: cannot write to {folder} ({exc.strerror})") from None
        lock_fd = lock(folder)
        try:
            manifest = _claim(folder, fresh, force)
            store = cls(folder, manifest, schema, lock_fd=lock_fd)
            store._started = (manifest is fresh, made)
            if store.done.any() and not (resume or force):
                raise StoreError(
                    f"{folder} already holds {int(store.done.sum())} of {runs} runs of this "
                    f"{kind}: --resume continues it, --force starts it over")
            store._set_state("running")
            return store
        except BaseException:
            os.close(lock_fd)
            raise

    # --- writing -----------------------------------------------------------------------
    def append(self, table: pa.Table, group: str) -> None:
        """Add the records of some runs (all records of each); written out in parts, by a
        writer thread (the caller goes on computing meanwhile)."""
        if not table.schema.equals(self.schema):
            raise ValueError(f"records do not match the store's schema: {table.schema} vs "
                             f"{self.schema}")
        runs = np.unique(int64s(table.column("run")))
        if len(runs) and (runs.min() < 0 or runs.max() >= self.runs or self.done[runs].any()):
            raise ValueError("records of runs already stored (or outside the study) appended")
        self._buffers.setdefault(group, []).append(table)
        self.done[runs] = True  # right after the buffer holds them (^C: see _hand_off)
        self._buffered_rows[group] = self._buffered_rows.get(group, 0) + table.num_rows
        if self._buffered_rows[group] >= PART_ROWS:
            self._hand_off(group)
        if time.monotonic() - self._last_flush >= PART_SECONDS:
            for name in list(self._buffers):
                self._hand_off(name)
            self._last_flush = time.monotonic()
        self._written(PARTS_WRITING)

    def flush(self) -> None:
        """Write every record appended, and wait until it is on disk."""
        for group in list(self._buffers):
            self._hand_off(group)
        self._last_flush = time.monotonic()
        self._written(0)

    def _hand_off(self, group: str) -> None:
        """A group's buffered records to the writer thread, as the next part. The buffer is
        let go only once the part is queued: an interrupt (^C raises anywhere in the caller)
        before that leaves the records buffered, for ``close`` to write; one after the
        queueing and before the buffer goes writes them twice, and the reader drops the
        later part (``reader._scan``) — nothing appended is lost either way."""
        tables = self._buffers.get(group)
        if not tables:
            return
        part = pa.concat_tables(tables)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="kdalab-parts")
        name = part_name(group, self._seq)
        self._seq += 1
        self._writing.append((group, self._writer.submit(_write_part, self.folder / PARTS,
                                                         name, part)))
        del self._buffers[group]
        self._buffered_rows.pop(group, None)

    def _written(self, keep: int) -> None:
        """Collect the parts written, waiting until at most ``keep`` are still being written
        (a failed write raises here)."""
        while self._writing and (len(self._writing) > keep or self._writing[0][1].done()):
            group, future = self._writing[0]
            try:
                path = future.result()
            except Exception:  # raised once; an interrupt (^C) while waiting keeps the part
                self._writing.popleft()
                raise
            self._writing.popleft()
            self.parts.setdefault(group, []).append(path)

    def _settle(self) -> None:
        self._written(0)

    def _buffered(self, group: str) -> list[pa.Table]:
        return self._buffers.get(group, [])

    def _buffered_groups(self) -> list[str]:
        return list(self._buffers)

    def _set_state(self, state: str) -> None:
        if self.manifest.state != state:
            self.manifest.state = state
            self.manifest.write(self.folder)

    def close(self) -> None:
        """Write what is buffered, say in the manifest whether every run is stored (complete)
        or not (interrupted), and release the folder."""
        try:
            self.flush()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)  # a part being written is finished
                self._writer = None
            if self._lock_fd is not None and self._started[0] and not self.done.any():
                self._undo_start()
            elif self._lock_fd is not None:
                self._set_state("complete" if self.complete else "interrupted")
            super().close()

    def _undo_start(self) -> None:
        """Remove what this open made, as nothing was stored: no manifest without parts."""
        clear(self.folder)
        _rmdir(self.folder / PARTS)
        if self._started[1]:  # the folder too, made by this open
            (self.folder / LOCK).unlink(missing_ok=True)
            _rmdir(self.folder)

    # every appended record is complete, so it is kept on an error or an interrupt too


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # not empty: what else is there stays
        pass


def _refusal(folder: Path, fresh: Manifest) -> None:
    """Raise if ``folder`` must not be written for ``fresh`` without ``force``."""
    if not folder.is_dir():
        return
    if (folder / MANIFEST).exists():
        old = Manifest.read(folder)
        if old.fingerprint != fresh.fingerprint:
            raise StoreError(f"{folder} holds other records ({old.describe()}): choose "
                             "another --out, or --force to replace it")
        if old.numerics != fresh.numerics:
            stored = ("before numerics versions" if old.numerics is None
                      else f"with numerics version {old.numerics}")
            raise StoreError(f"{folder} holds records computed {stored} (kdalab "
                             f"{old.kdalab_version}); this kdalab computes version "
                             f"{fresh.numerics}, whose numbers differ: --force starts it over")
    elif any(p.name != LOCK for p in folder.iterdir()):
        raise StoreError(f"{folder} is not empty and holds no kdalab store: choose an empty or "
                         "new --out, or --force to write into it")


def _claim(folder: Path, fresh: Manifest, force: bool) -> Manifest:
    """The manifest the store goes on with (under the folder's lock): the stored one for the
    same study, else ``fresh``, written after the folder is cleared (``force``)."""
    if not force:
        _refusal(folder, fresh)  # again, now that the folder is held
        if (folder / MANIFEST).exists():
            return Manifest.read(folder)
    else:
        clear(folder)
    (folder / PARTS).mkdir(exist_ok=True)
    atomic_write_text(folder / MANIFEST, fresh.to_json())
    return fresh


def _write_part(parts_dir: Path, name: str, table: pa.Table) -> Path:
    """Write a part atomically: a hidden temporary file, flushed to disk, then renamed (and the
    folder flushed): the part is in the store whole or not at all."""
    tmp = parts_dir / f".{name}.tmp"
    pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    final = parts_dir / name
    os.replace(tmp, final)
    fsync_dir(parts_dir)
    return final
