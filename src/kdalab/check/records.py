"""All of the check's persistence, behind a few functions: open (or refuse) an output folder,
append records as they come, mark the run complete or interrupted, read a run back. The records
themselves go through the project's record store (``kdalab.records.legacy``); nothing else
of ``kdalab.check`` touches files of a run folder, so the store can be swapped here alone.

A check folder is recognised by its ``check.json`` (the run's description, written before the
first case runs, with ``"complete": false`` until the run ends).
"""

from __future__ import annotations

import json
from pathlib import Path

from kdalab.records.legacy import RecordWriter, read_records

__all__ = ["open_folder", "writer", "write_meta", "mark", "read", "read_run", "is_check_folder"]

META = "check.json"


def is_check_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a check run's output (its ``check.json``)."""
    try:
        meta = json.loads((Path(folder) / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "kernels" in meta


def open_folder(folder: str | Path, *, force: bool = False, name: str = "--out") -> Path:
    """``folder``, ready for a run: created if missing; one that holds anything but a check
    run's output is refused (ValueError) unless ``force``."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a file; expected a folder (created if "
                         "missing)")
    if path.is_dir() and any(path.iterdir()) and not is_check_folder(path) and not force:
        raise ValueError(f"{name}: {str(path)!r} is not empty and holds no check run; "
                         "choose another folder, or --force to write into it")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name}: cannot create the folder {str(path)!r} "
                         f"({exc.strerror or exc})") from None
    return path


def writer(folder: str | Path) -> RecordWriter:
    """A writer that appends records to ``folder`` as they come (a context manager; on a clean
    exit it also writes the complete JSON and Parquet files). ``.count``: records written."""
    return RecordWriter(folder)


def write_meta(folder: str | Path, meta: dict) -> None:
    """The run's description (``check.json``)."""
    (Path(folder) / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def mark(folder: str | Path, meta: dict, *, complete: bool) -> None:
    """Record that the run finished (``complete``) or was interrupted."""
    meta["complete"] = complete
    write_meta(folder, meta)


def read(folder: str | Path) -> list[dict]:
    """The records in ``folder`` (complete, or those written before an interruption)."""
    return read_records(folder)


def read_run(folder: str | Path, *, name: str = "--out") -> tuple[list[dict], dict]:
    """``(records, meta)`` of a check run; ValueError for a folder that holds none."""
    path = Path(folder).expanduser()
    if not is_check_folder(path):
        raise ValueError(f"{name}: {str(path)!r} holds no check run (no check.json of kdalab "
                         "check)")
    try:
        records = read_records(path)
    except FileNotFoundError:
        records = []
    if not records:
        raise ValueError(f"{name}: no records in {str(path)!r}")
    meta = json.loads((path / META).read_text(encoding="utf-8"))
    return records, meta
