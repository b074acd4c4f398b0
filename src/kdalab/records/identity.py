"""A store's identity on disk: its folder's layout, the manifest that says what the records
are, the fingerprint that decides whether a folder holds *this* study, and the folder's lock.

Layout of a store folder::

    manifest.json          what the records are: kind (the tool or study), config,
                           fingerprint, numerics version, kdalab version (for people),
                           number of runs, record schema, the view files last drawn, and the
                           state (running, interrupted, complete)
    parts/<group>-<n>.parquet
                           the records, appended in parts; every record carries its run's
                           index ``run`` (0 … runs−1) and every part holds all records of
                           the runs it holds; parts never mix groups, so views can aggregate
                           one group at a time
    .lock                  held (flock) while a process writes the store

**Identity.** The fingerprint hashes the kind, the configuration and the record schema; the
:data:`NUMERICS_VERSION` says which numbers the code computes for them. A folder holding a
different study, records of another numerics version, or files that are not a store is refused
(:class:`StoreError`) unless ``force`` is given, which deletes the store's files (and the record
files of earlier kdalab versions) and starts afresh. A folder holding stored records of the same
study needs ``resume`` (or ``force``): nothing is overwritten silently. The package version is
recorded for people and not compared: it changes with every commit, and a pull that does not
touch the numbers must not break the resume of a long run (docs/sweeps.md, "Identity").
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

__all__ = ["StoreError", "Manifest", "fingerprint", "kdalab_version", "is_store",
           "STORE_FORMAT", "NUMERICS_VERSION", "MANIFEST", "PARTS", "LOCK", "EARLIER_FILES"]

STORE_FORMAT = 1
#: The version of the numbers kdalab computes for a configuration: bumped by hand with any change
#: that changes a stored record of an unchanged configuration (an accumulation model's order, a
#: draw, a metric's formula, a check case's inputs or judgement), and only then. ``--resume``
#: refuses a store of another numbers version, so records of two computations never mix.
#: tests/test_numerics_version.py fails when the code that decides records (arith, kda, inputs,
#: studies, check) changes, until its recorded digest is renewed, and says to bump this then.
#: 3: check --grad's contract records judge the backward (their gradient fields, once empty).
NUMERICS_VERSION = 3
MANIFEST = "manifest.json"
PARTS = "parts"
LOCK = ".lock"
#: Record files of kdalab versions before the store (removed with ``force``).
EARLIER_FILES = ("records.jsonl", "records.json", "records.parquet")


class StoreError(ValueError):
    """A store folder that cannot be used as asked; the message is one line for the user."""


def kdalab_version() -> str:
    """``kdalab.__version__`` where the package says it, else the installed distribution's."""
    import kdalab

    version = getattr(kdalab, "__version__", None)
    if version:
        return str(version)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("kdalab")
    except PackageNotFoundError:  # pragma: no cover (run from a source tree)
        return "unknown"


def schema_spec(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


def fingerprint(kind: str, config: dict, schema: pa.Schema) -> str:
    """sha256 of what determines the records: kind, configuration and record schema."""
    text = json.dumps({"store": STORE_FORMAT, "kind": kind, "config": config,
                       "schema": schema_spec(schema)}, sort_keys=True, separators=(",", ":"))
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
    state: str = "running"  # running, interrupted or complete
    store: int = STORE_FORMAT
    numerics: int | None = None  # None: a store written before numerics versions

    @classmethod
    def new(cls, kind: str, config: dict, runs: int, records_per_run: int,
            schema: pa.Schema) -> Manifest:
        fp = fingerprint(kind, {"config": config, "runs": runs,
                                "records_per_run": records_per_run}, schema)
        return cls(kind=kind, config=config, runs=runs, records_per_run=records_per_run,
                   schema=schema_spec(schema), fingerprint=fp, kdalab_version=kdalab_version(),
                   created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   numerics=NUMERICS_VERSION)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True) + "\n"

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            manifest = cls(**data)
            manifest._check_types()
            return manifest
        except (OSError, ValueError, TypeError) as exc:
            raise StoreError(f"{folder}: unreadable {MANIFEST} ({exc.__class__.__name__}); "
                             "--force starts the folder afresh") from None

    def _check_types(self) -> None:
        """A TypeError where a field read from disk is not of its type (a manifest edited or
        damaged by hand), so that a reader never fails later on it."""
        def ints(*values) -> bool:
            return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                       for v in values)

        ok = (isinstance(self.kind, str) and isinstance(self.config, dict)
              and ints(self.runs, self.records_per_run, self.store)
              and isinstance(self.schema, list)
              and all(isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c)
                      for c in self.schema)
              and isinstance(self.views, list) and all(isinstance(v, str) for v in self.views)
              and (self.numerics is None or ints(self.numerics))
              and all(isinstance(v, str) for v in (self.fingerprint, self.kdalab_version,
                                                   self.created, self.state)))
        if not ok:
            raise TypeError("a field of the wrong type")

    def write(self, folder: Path) -> None:
        atomic_write_text(folder / MANIFEST, self.to_json())

    def describe(self) -> str:
        cfg = ", ".join(f"{k}={_short(v)}" for k, v in sorted(self.config.items()))
        return f"{self.kind} of {self.runs} runs ({cfg})"

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(n, _arrow_type(t)) for n, t in self.schema])


def is_store(folder: str | Path, kind: str | None = None) -> bool:
    """Whether ``folder`` holds a kdalab store (of ``kind``, if given)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return False
    try:
        manifest = Manifest.read(folder)
    except StoreError:
        return False
    return kind is None or manifest.kind == kind


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def part_name(group: str, seq: int) -> str:
    return f"{group}-{seq:06d}.parquet"


def parse_part(name: str) -> tuple[str, int] | None:
    if name.startswith(".") or not name.endswith(".parquet"):
        return None
    group, _, seq = name[: -len(".parquet")].rpartition("-")
    return (group, int(seq)) if group and seq.isdigit() else None


_ARROW_TYPES = {"int64": pa.int64(), "int32": pa.int32(), "double": pa.float64(),
                "float": pa.float32(), "string": pa.string(), "bool": pa.bool_()}


def _arrow_type(name: str) -> pa.DataType:
    try:
        return _ARROW_TYPES[name]
    except KeyError:
        raise StoreError(f"manifest: unsupported column type {name!r}") from None


def lock(folder: Path) -> int:
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


def clear(folder: Path) -> None:
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
            if p.is_file() and (parse_part(p.name) or p.name.endswith(".tmp")):
                p.unlink()
    for name in (MANIFEST, *EARLIER_FILES):
        (folder / name).unlink(missing_ok=True)
