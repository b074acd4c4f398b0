"""The record files of kdalab before the store (records.jsonl, records.json, records.parquet),
kept only behind ``kdalab.check.records`` until check writes through the store
(:class:`kdalab.records.RunStore`); no study uses them. Delete this module with that swap.

A folder holds ``records.jsonl`` (one JSON object per line, appended and flushed after each
batch), and, once complete, ``records.json`` (a list of objects) and ``records.parquet``.
Non-finite floats are written as the strings ``"inf"``, ``"-inf"``, ``"nan"`` in JSON.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

__all__ = ["RecordWriter", "encode_record", "decode_record", "write_records", "read_records",
           "records_frame"]

_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def encode_record(rec: dict) -> dict:
    out = {}
    for k, v in rec.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        else:
            out[k] = v
    return out


def decode_record(rec: dict) -> dict:
    return {k: (_NONFINITE[v] if isinstance(v, str) and v in _NONFINITE else v)
            for k, v in rec.items()}


class RecordWriter:
    """Append records to ``<folder>/records.jsonl``; ``close()`` also writes JSON and parquet.

    ``resume=False`` (default) starts a fresh file; records already in the folder are replaced.
    """

    def __init__(self, folder: str | Path, *, resume: bool = False):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "records.jsonl"
        if not resume:
            for name in ("records.jsonl", "records.json", "records.parquet"):
                (self.folder / name).unlink(missing_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        self.count = 0

    def write(self, records: Iterable[dict]) -> None:
        for rec in records:
            self._fh.write(json.dumps(encode_record(rec), allow_nan=False) + "\n")
            self.count += 1
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> list[dict]:
        """Finish: write records.json and records.parquet from everything in records.jsonl."""
        self._fh.close()
        records = read_records(self.folder, prefer="jsonl")
        write_records(records, self.folder)
        return records

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # keep records.jsonl as it is: every record written so far survives
            self._fh.close()


def records_frame(records: list[dict]) -> pd.DataFrame:
    return pd.DataFrame.from_records(records)


def write_records(records: list[dict], folder: str | Path) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "records.json", "w", encoding="utf-8") as fh:
        json.dump([encode_record(r) for r in records], fh, indent=1, allow_nan=False)
        fh.write("\n")
    if records:
        records_frame(records).to_parquet(folder / "records.parquet", index=False)


def read_records(folder: str | Path, prefer: str = "json") -> list[dict]:
    """Records of a run folder (records.json if complete, else the partial records.jsonl)."""
    folder = Path(folder)
    full = folder / "records.json"
    if prefer == "json" and full.exists():
        with open(full, encoding="utf-8") as fh:
            return [decode_record(r) for r in json.load(fh)]
    part = folder / "records.jsonl"
    if not part.exists():
        raise FileNotFoundError(f"no records in {folder}")
    out = []
    with open(part, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    out.append(decode_record(json.loads(line)))
                except json.JSONDecodeError:  # a line cut short by an interruption
                    break
    return out
