"""The check's one door to the record store (``kdalab.records.legacy``): every record of a
check run is written and read back through these two functions."""

from __future__ import annotations

from pathlib import Path

from kdalab.records.legacy import RecordWriter, read_records

__all__ = ["writer", "read"]


def writer(folder: str | Path) -> RecordWriter:
    """A writer that appends records to ``folder`` as they come (a context manager; on a clean
    exit it also writes the complete JSON and Parquet files)."""
    return RecordWriter(folder)


def read(folder: str | Path) -> list[dict]:
    """The records in ``folder`` (complete, or those written before an interruption)."""
    return read_records(folder)
