"""A run-keyed result store: a sweep's records in a folder, safe to kill at any moment.

Layout of a store folder::

    manifest.json          what the records are: kind, config, fingerprint, kdalab version,
                           number of runs, record schema, the view files last drawn
    parts/<group>-<n>.parquet
                           the records, appended in parts; every record carries its run's
                           index ``run`` (0 … runs−1) and every part holds all records of
                           the runs it holds; parts never mix groups (for the inverse sweep a
                           group is one (chunk, dim)), so views aggregate one group at a time
    .lock                  held (flock) while a process writes the store

**Safety.** A part is written (by a writer thread, while the sweep goes on) to a hidden
temporary file, flushed to disk and renamed: it is in the store whole or not at all. The
manifest is replaced the same way. Opening a store to resume deletes temporary files, reads
every part's ``run`` column (page checksums verified) and drops a part that does not read
(torn), holds a run twice, or repeats a run of an earlier part; those runs are computed again.
So ``kill -9`` at any moment followed by a resume gives exactly the records of an
uninterrupted sweep. Records are read back in run order (``run``, then the order the records
of one run were appended), whatever order the parts were written in.

**Identity.** The fingerprint hashes the kind, the configuration and the record schema. A
folder holding a different sweep, records of another kdalab version, or files that are not a
store is refused (:class:`StoreError`) unless ``force`` is given, which deletes the store's
files (and the record files of earlier kdalab versions) and starts afresh. A folder holding
stored records of the same sweep needs ``resume`` (or ``force``): nothing is overwritten
silently.

Why this module is long: the store is one contract (what is on disk, how it is written, how it
is checked when opened, how it is read back), and its safety argument reads best in one place.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["StoreError", "Manifest", "RunStore", "fingerprint", "kdalab_version", "identical",
           "STORE_FORMAT", "LEGACY_FILES"]

STORE_FORMAT = 1
MANIFEST = "manifest.json"
PARTS = "parts"
LOCK = ".lock"
#: Record files of kdalab versions before the store (removed with ``force``).
LEGACY_FILES = ("records.jsonl", "records.json", "records.parquet")
#: A part is written when a group's buffer reaches this many records, when the group changes
#: or after PART_SECONDS: a kill loses at most that much work, and parts stay few.
PART_ROWS = 65_536
PART_SECONDS = 5.0
#: Parts handed to the writer thread and not yet on disk, at most (then appending waits).
PARTS_WRITING = 4
#: groups :meth:`RunStore.iter_groups` reads ahead, on as many threads
READ_AHEAD = 8


class StoreError(ValueError):
    """A store folder that cannot be used as asked; the message is one line for the user."""


def kdalab_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kdalab")
    except PackageNotFoundError:  # pragma: no cover (run from a source tree)
        return "unknown"


def _schema_spec(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


def fingerprint(kind: str, config: dict, schema: pa.Schema) -> str:
    """sha256 of what determines the records: kind, configuration and record schema."""
    text = json.dumps({"store": STORE_FORMAT, "kind": kind, "config": config,
                       "schema": _schema_spec(schema)}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Manifest:
    kind: str
    config: dict
    runs: int
    records_per_run: int
    schema: list  # [[name, type], ...]
    fingerprint: str
    kdalab_version: str
    created: str
    views: list[str] = field(default_factory=list)
    store: int = STORE_FORMAT

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True) + "\n"

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise StoreError(f"{folder}: unreadable {MANIFEST} ({exc.__class__.__name__}); "
                             "--force starts the folder afresh") from None

    def describe(self) -> str:
        cfg = ", ".join(f"{k}={_short(v)}" for k, v in sorted(self.config.items()))
        return f"{self.kind} of {self.runs} runs ({cfg})"


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _part_name(group: str, seq: int) -> str:
    return f"{group}-{seq:06d}.parquet"


def _parse_part(name: str) -> tuple[str, int] | None:
    if name.startswith(".") or not name.endswith(".parquet"):
        return None
    group, _, seq = name[: -len(".parquet")].rpartition("-")
    return (group, int(seq)) if group and seq.isdigit() else None


class RunStore:
    """Records of a sweep keyed by run (see the module doc). Use :meth:`open` to write (new or
    resumed) and :meth:`read_only` to read a store that may be complete or not.

    ``done`` is a bool array over the runs (``runs`` bytes: 10 MB for 10⁷ runs), true for the
    runs stored or appended; records are appended with :meth:`append` (an Arrow table of the
    manifest's schema, all records of the runs it holds) and reach the disk in parts.
    """

    def __init__(self, folder: Path, manifest: Manifest, schema: pa.Schema, *,
                 writable: bool, lock_fd: int | None = None):
        self.folder = folder
        self.manifest = manifest
        self.schema = schema
        self.writable = writable
        self._lock_fd = lock_fd
        self.done = np.zeros(manifest.runs, dtype=bool)
        self.parts: dict[str, list[Path]] = {}
        self.dropped: list[str] = []  # parts found torn or doubled when opened
        self._seq = 0
        self._buffers: dict[str, list[pa.Table]] = {}
        self._buffered_rows: dict[str, int] = {}
        self._last_flush = time.monotonic()
        self._writer: ThreadPoolExecutor | None = None  # writes the parts, off the caller
        self._writing: deque[tuple[str, Future]] = deque()  # (group, part being written)
        self._scan()

    # --- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, folder: str | Path, *, kind: str, config: dict, runs: int,
             records_per_run: int, schema: pa.Schema, resume: bool = False,
             force: bool = False) -> RunStore:
        """Open ``folder`` to write the sweep (``kind``, ``config``; ``runs`` runs of
        ``records_per_run`` records each): a new store, or the same sweep's stored runs kept
        with ``resume``; ``force`` replaces whatever store is there. Raises
        :class:`StoreError` (one line) for a folder it must not write."""
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise StoreError(f"--out: {folder} is a file, not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"--out: cannot write to {folder} ({exc.strerror})") from None
        lock_fd = _lock(folder)
        try:
            manifest = cls._claim(folder, kind, config, runs, records_per_run, schema, force)
            store = cls(folder, manifest, schema, writable=True, lock_fd=lock_fd)
            if store.done.any() and not (resume or force):
                raise StoreError(
                    f"{folder} already holds {int(store.done.sum())} of {runs} runs of this "
                    "sweep: --resume continues it, --force starts it over")
            return store
        except BaseException:
            os.close(lock_fd)
            raise

    @staticmethod
    def _claim(folder: Path, kind: str, config: dict, runs: int, records_per_run: int,
               schema: pa.Schema, force: bool) -> Manifest:
        fp = fingerprint(kind, {"config": config, "runs": runs,
                                "records_per_run": records_per_run}, schema)
        version = kdalab_version()
        fresh = Manifest(kind=kind, config=config, runs=runs, records_per_run=records_per_run,
                         schema=_schema_spec(schema),
                         fingerprint=fp, kdalab_version=version,
                         created=_dt.datetime.now(_dt.timezone.utc).isoformat(
                             timespec="seconds"))
        if (folder / MANIFEST).exists():
            old = None if force else Manifest.read(folder)
            if old is not None and old.fingerprint != fp:
                raise StoreError(f"{folder} holds a different sweep ({old.describe()}): choose "
                                 "another --out, or --force to replace it")
            if old is not None and old.kdalab_version != version:
                raise StoreError(f"{folder} was written by kdalab {old.kdalab_version}, this is "
                                 f"{version}; records may differ: --force starts it over")
            if old is not None:
                return old
            _clear(folder)
        elif any(p.name != LOCK for p in folder.iterdir()):
            if not force:
                raise StoreError(f"{folder} is not empty and holds no kdalab store: choose an "
                                 "empty or new --out, or --force to write into it")
            _clear(folder)
        (folder / PARTS).mkdir(exist_ok=True)
        _atomic_write_text(folder / MANIFEST, fresh.to_json())
        return fresh

    @classmethod
    def read_only(cls, folder: str | Path, *, lock: bool = False) -> RunStore:
        """The store in ``folder`` as it is on disk (torn parts are skipped, not deleted).
        ``lock``: hold the folder (no writer meanwhile) to redraw its views."""
        folder = Path(folder)
        if not (folder / MANIFEST).is_file():
            raise StoreError(f"{folder} holds no kdalab store (no {MANIFEST})")
        lock_fd = _lock(folder) if lock else None
        try:
            manifest = Manifest.read(folder)
            schema = pa.schema([(n, _arrow_type(t)) for n, t in manifest.schema])
            return cls(folder, manifest, schema, writable=False, lock_fd=lock_fd)
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
            parsed = _parse_part(path.name)
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
            runs = _int64s(pf.read(columns=["run"]).column(0))
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

    # --- writing -----------------------------------------------------------------------
    @property
    def runs(self) -> int:
        return self.manifest.runs

    @property
    def complete(self) -> bool:
        return bool(self.done.all())

    def append(self, table: pa.Table, group: str) -> None:
        """Add the records of some runs (all records of each); written out in parts, by a
        writer thread (the caller goes on computing meanwhile)."""
        if not self.writable:
            raise StoreError(f"{self.folder}: the store is open read-only")
        if not table.schema.equals(self.schema):
            raise ValueError(f"records do not match the store's schema: {table.schema} vs "
                             f"{self.schema}")
        runs = np.unique(_int64s(table.column("run")))
        if len(runs) and (runs.min() < 0 or runs.max() >= self.runs or self.done[runs].any()):
            raise ValueError("records of runs already stored (or outside the sweep) appended")
        self.done[runs] = True
        self._buffers.setdefault(group, []).append(table)
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
        """A group's buffered records to the writer thread, as the next part."""
        tables = self._buffers.pop(group, None)
        self._buffered_rows.pop(group, None)
        if not tables:
            return
        name = _part_name(group, self._seq)
        self._seq += 1
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="kdalab-parts")
        self._writing.append((group, self._writer.submit(
            _write_part, self.folder / PARTS, name, pa.concat_tables(tables))))

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

    def set_views(self, paths: Sequence[Path]) -> None:
        """Record the view files drawn from the records (replaced on the next drawing)."""
        self.manifest.views = sorted(str(Path(p).relative_to(self.folder)) for p in paths)
        _atomic_write_text(self.folder / MANIFEST, self.manifest.to_json())

    def remove_views(self) -> None:
        """Delete the view files drawn last (so no stale table survives a new drawing)."""
        for rel in self.manifest.views:
            (self.folder / rel).unlink(missing_ok=True)

    def close(self) -> None:
        """Write what is buffered and release the folder."""
        try:
            if self.writable:
                self.flush()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)  # a part being written is finished
                self._writer = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # every appended record is complete, so it is kept on an error or an interrupt too
        self.close()

    # --- reading -----------------------------------------------------------------------
    def groups(self) -> list[str]:
        self._written(0)
        return sorted(set(self.parts) | set(self._buffers))

    def read_group(self, group: str, columns: Sequence[str] | None = None) -> pa.Table:
        """A group's records in run order (``columns``: a subset, read from disk alone)."""
        self._written(0)
        return self._read_group(group, columns)

    def _read_group(self, group: str, columns: Sequence[str] | None) -> pa.Table:
        cols = None if columns is None else list(dict.fromkeys(["run", *columns]))
        tables = [pq.read_table(p, columns=cols) for p in self.parts.get(group, [])]
        if self._buffers.get(group):
            tables += [t.select(cols) if cols else t for t in self._buffers[group]]
        if not tables:
            return self.schema.empty_table() if cols is None else \
                self.schema.empty_table().select(cols)
        table = pa.concat_tables(tables)
        order = np.argsort(_int64s(table.column("run")), kind="stable")
        table = table.take(pa.array(order))
        if columns is not None and "run" not in columns:
            table = table.drop_columns(["run"])
        return table

    def iter_groups(self, columns: Sequence[str] | None = None,
                    ahead: int = READ_AHEAD) -> Iterator[tuple[str, pa.Table]]:
        """(group, records) for each group in label order, the next ``ahead`` groups read
        meanwhile on threads (pyarrow reads and decodes without the GIL: a store's many small
        parts read several at a time); memory: the groups yielded and read ahead."""
        self._written(0)
        groups = self.groups()
        if ahead < 1 or len(groups) < 2:
            for group in groups:
                yield group, self._read_group(group, columns)
            return
        from collections import deque

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


def _int64s(values: pa.ChunkedArray) -> np.ndarray:
    """Run indices as NumPy (an int64 column without nulls, else a StoreError)."""
    if values.null_count or values.type != pa.int64():
        raise StoreError(f"run indices: expected int64 without nulls, not {values.type}")
    return values.to_numpy()


def _write_part(parts_dir: Path, name: str, table: pa.Table) -> Path:
    """Write a part atomically: a hidden temporary file, flushed to disk, then renamed (and the
    folder flushed): the part is in the store whole or not at all."""
    tmp = parts_dir / f".{name}.tmp"
    pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    final = parts_dir / name
    os.replace(tmp, final)
    _fsync_dir(parts_dir)
    return final


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


_ARROW_TYPES = {"int64": pa.int64(), "int32": pa.int32(), "double": pa.float64(),
                "float": pa.float32(), "string": pa.string(), "bool": pa.bool_()}


def _arrow_type(name: str) -> pa.DataType:
    try:
        return _ARROW_TYPES[name]
    except KeyError:
        raise StoreError(f"manifest: unsupported column type {name!r}") from None


def _lock(folder: Path) -> int:
    """Hold ``folder`` for this process (flock, released when it exits, even by kill -9)."""
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(f"--out: cannot write to {folder} ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(f"{folder} is being written by another kdalab process; wait for it "
                         "or choose another --out") from None
    return fd


def _clear(folder: Path) -> None:
    """Remove the store's files and earlier kdalab versions' record files from ``folder``
    (the view files the manifest lists too); other files are left alone."""
    if (folder / MANIFEST).exists():
        try:
            for rel in Manifest.read(folder).views:
                (folder / rel).unlink(missing_ok=True)
        except StoreError:
            pass
    parts = folder / PARTS
    if parts.is_dir():
        for p in parts.iterdir():
            if p.is_file() and (_parse_part(p.name) or p.name.endswith(".tmp")):
                p.unlink()
    for name in (MANIFEST, *LEGACY_FILES):
        (folder / name).unlink(missing_ok=True)
