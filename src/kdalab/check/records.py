"""All of the check's persistence, behind a few functions: open (or refuse) an output folder,
append records as cases finish, say what the run was, read a run back. The records go to the
project's one record store (:mod:`kdalab.records`, kind ``check``): Parquet parts keyed by run
(one run per (case, kernel): ``case index × kernels + kernel index``) and a manifest whose
``state`` says ``complete`` or ``interrupted``. Nothing else of ``kdalab.check`` touches the files
of a run folder.

Beside the store the folder holds ``check.json`` (the run's description: command, date, device,
versions, elapsed time; written when the store opens, updated when the run ends) and the view
files drawn from the records; all of them are listed in the manifest as the store's views, so
that a ``--force`` of another command removes them with the records.

A folder is the check's own when it holds a check store (or the ``check.json`` of a check run
written before the store). The same check (kernels, cases, options and device) run again
replaces its own folder's records; the records of another check are refused unless ``force``
(or kept and continued with ``resume``, for the same check). Any other non-empty folder is
refused unless ``force``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from kdalab.check.tensors import GRADIENTS
from kdalab.records import Manifest, RunStore, StoreError, StoreReader, is_store, records_table

__all__ = ["KIND", "META", "CheckStore", "schema", "open_run", "write_meta", "read",
           "read_run", "drawing_views", "is_check_folder"]

KIND = "check"
META = "check.json"
LOGS = "logs"  # a crashed kernel's log (kdalab.check.isolate)

_STR, _INT, _FLOAT, _BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
#: Every record field that is not one of the case's parameters, by type (a new field must be
#: added here: the store's schema is fixed before the first case runs).
_FIELDS = {
    **dict.fromkeys(("kernel", "case", "mode", "about", "device", "against", "o_dtype",
                     "state_dtype", "contract_compared", "status", "message", "seqlens"), _STR),
    **dict.fromkeys(("o_nonfinite", "state_nonfinite", "o_nonfinite_all", "grad_nonfinite"),
                    _INT),
    **dict.fromkeys(("deterministic", "grad_deterministic"), _BOOL),
    **{f"{n}_{m}": _FLOAT for n in GRADIENTS for m in ("rel_err", "floor_err", "budget_multiple")},
    **dict.fromkeys(("bf16_floor", "state_bf16_floor", "o_floor_err", "state_floor_err",
                     "budget", "max_output_error", "max_state_error", "o_rel_err",
                     "state_rel_err", "o_max_abs", "state_max_abs", "floor_multiple",
                     "o_budget_multiple", "state_budget_multiple", "contract_max_diff",
                     "grad_contract_max_diff",
                     "min_identical", "o_identical", "state_identical", "o_worst_rel_diff",
                     "state_worst_rel_diff", "o_rel_diff"), _FLOAT),
}
_ANNOTATIONS = {"str": _STR, "int": _INT, "float": _FLOAT, "float | None": _FLOAT,
                "bool": _BOOL}


def _case_fields() -> dict[str, pa.DataType]:
    from kdalab.check.cases import Case

    return {f.name: _ANNOTATIONS[f.type] for f in dataclasses.fields(Case)
            if f.type in _ANNOTATIONS}


def schema(fields: Sequence[str]) -> pa.Schema:
    """The store's schema for records with these ``fields`` (in this order), ``run`` first."""
    types = {**_case_fields(), **_FIELDS}
    unknown = [f for f in fields if f not in types]
    if unknown:
        raise RuntimeError(f"check records: no column type for {', '.join(unknown)} "
                           "(kdalab.check.records._FIELDS)")
    return pa.schema([("run", _INT)] + [(f, types[f]) for f in fields])


def is_check_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a check run's output (its store, or an earlier ``check.json``)."""
    folder = Path(folder)
    if is_store(folder, kind=KIND):
        return True
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "kernels" in meta and not (folder / "manifest.json").exists()


class CheckStore:
    """A check run's store, open to write: :meth:`write` takes records as the harness gives
    them (any order, each (case, kernel) once), finds their runs and puts them on disk;
    ``count`` says how many are stored. A context manager: closing marks the run complete or
    interrupted."""

    def __init__(self, store: RunStore, runs: dict[tuple[str, str], int]):
        self.store = store
        self.folder = store.folder
        self._runs = runs
        self._names = set(store.schema.names)
        self.count = int(store.done.sum())

    @property
    def stored(self) -> set[tuple[str, str]]:
        """The (case, kernel) pairs that have a record (those of a resumed run, then those
        written)."""
        return {pair for pair, run in self._runs.items() if self.store.done[run]}

    def write(self, records: Sequence[dict]) -> None:
        if not records:
            return
        for rec in records:
            extra = set(rec) - self._names
            if extra:  # Arrow would drop them silently
                raise RuntimeError(f"check records: no column for {', '.join(sorted(extra))} "
                                   "(kdalab.check.records._FIELDS)")
        runs = [self._runs[(r["case"], r["kernel"])] for r in records]
        self.store.append(records_table(records, self.store.schema, runs), group="check")
        # on disk now: a case costs seconds, a part milliseconds, and a kill (``timeout``'s
        # SIGTERM, kill -9) must not take the cases that finished with it
        self.store.flush()
        self.count += len(records)

    @property
    def complete(self) -> bool:
        return self.store.complete

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> CheckStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_run(folder: str | Path, *, kernels: Sequence[str], cases: Sequence[str],
             fields: Sequence[str], config: dict, force: bool = False, resume: bool = False,
             name: str = "--out") -> CheckStore:
    """The store of a check of ``kernels`` × ``cases`` (records with ``fields``; ``config``:
    what the run is, for the manifest) in ``folder``, created if missing. A folder that holds
    anything but a check run's output is refused (ValueError naming ``name``) unless
    ``force``; the check's own folder is replaced, or with ``resume`` kept: its records stay
    and :attr:`CheckStore.stored` says which pairs have one (a missing or empty folder starts
    the run, as a study's ``--resume`` does). A resumed run must be the stored one: a store
    of another configuration is refused naming what differs."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a file; expected a folder (created if "
                         "missing)")
    own = path.is_dir() and is_check_folder(path)
    if path.is_dir() and any(path.iterdir()) and not own and not force:
        raise ValueError(f"{name}: {str(path)!r} is not empty and holds no check run; "
                         "choose another folder, or --force to write into it")
    # nothing to resume without a store: a run stopped before its first record leaves only
    # its check.json (as an earlier kdalab's run did), and starts again
    keep = resume and own and is_store(path, kind=KIND)
    if keep:
        _same_run(path, config, name)
    elif own and not force:
        _not_another_run(path, config, name)
    if own and not keep:
        _clear_own(path)
    runs = {(c, k): i * len(kernels) + j for i, c in enumerate(cases)
            for j, k in enumerate(kernels)}
    try:
        store = RunStore.open(path, kind=KIND, config=config, runs=len(runs),
                              records_per_run=1, schema=schema(fields),
                              resume=keep, force=not keep)
    except StoreError as exc:
        raise ValueError(f"--resume: {exc}" if resume else str(exc)) from None
    return CheckStore(store, runs)


def _differences(stored: dict, given: dict) -> list[str]:
    """Each setting in which a stored check's configuration differs from ``given``: ``key
    stored X, given Y``."""
    return [f"{key} {_brief(stored.get(key), given.get(key))}"
            for key in dict.fromkeys([*stored, *given]) if stored.get(key) != given.get(key)]


def _not_another_run(path: Path, config: dict, name: str) -> None:
    """Refuse to replace the records of another check (other kernels, cases, options or
    device) stored in ``path``: a ValueError (one line naming what differs). The same check
    run again replaces its own records."""
    if not is_store(path, kind=KIND):
        return
    reader = StoreReader.read_only(path, kind=KIND)
    differ = _differences(reader.manifest.config, config) if reader.done.any() else []
    if differ:
        raise ValueError(f"{name} {str(path)!r} holds the records of another check (" +
                         "; ".join(differ) + "): choose another --out, or --force to replace "
                         "them")


def _same_run(path: Path, config: dict, name: str) -> None:
    """Refuse to resume the check stored in ``path`` with another ``config`` (ValueError, one
    line naming each setting that differs, stored and given)."""
    try:
        stored = Manifest.read(path).config
    except StoreError as exc:
        raise ValueError(f"--resume: {exc}") from None
    differ = _differences(stored, config)
    if differ:
        raise ValueError(f"--resume: {name} {str(path)!r} holds another check (" +
                         "; ".join(differ) + "): give the stored run's kernels and options, "
                         "or another --out")


def _brief(stored, given) -> str:
    """``stored X, given Y`` for one setting, long lists cut to their first difference."""
    if not (isinstance(stored, list) and isinstance(given, list)):
        return f"stored {stored!r}, given {given!r}"
    first = next((i for i, (a, b) in enumerate(zip(stored, given)) if a != b),
                 min(len(stored), len(given)))
    said = []
    for xs in (stored, given):
        if len(xs) <= 4:
            said.append(repr(xs))
        else:
            said.append(f"{len(xs)} items" + (f", #{first + 1} {xs[first]!r}"
                                               if first < len(xs) else ""))
    return f"stored {said[0]}, given {said[1]}"


def _clear_own(path: Path) -> None:
    """What an earlier check run left beside its store (the store clears itself)."""
    (path / META).unlink(missing_ok=True)
    shutil.rmtree(path / LOGS, ignore_errors=True)
    parts = path / "parts"  # an earlier version's per-kernel work folders
    if parts.is_dir():
        for p in parts.iterdir():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


def write_meta(folder: str | Path, meta: dict) -> Path:
    """The run's description (``check.json``)."""
    path = Path(folder) / META
    path.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return path


def read(folder: str | Path) -> list[dict]:
    """The records in ``folder``'s check store, in run order (complete, or those stored before
    an interruption), without the ``run`` key."""
    return StoreReader.read_only(Path(folder).expanduser(), kind=KIND).records()


def read_run(folder: str | Path, *, name: str = "--out") -> tuple[list[dict], dict]:
    """``(records, meta)`` of a check run, ``meta["complete"]`` from the store; ValueError (one
    line naming ``name``) for a folder that holds none, or no records."""
    path = Path(folder).expanduser()
    if not is_store(path):
        raise ValueError(f"{name}: {str(path)!r} holds no check run (no records of kdalab "
                         "check)")
    kind = Manifest.read(path).kind
    if kind != KIND:
        raise ValueError(f"{name}: {str(path)!r} holds no check run: it holds the records of "
                         f"{kind}")
    reader = StoreReader.read_only(path, kind=KIND)
    records = reader.records()
    if not records:
        raise ValueError(f"{name}: no records in {str(path)!r}")
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict):  # missing, unreadable or not an object: the store's own
        meta = {"kernels": reader.manifest.config.get("kernels", [])}
    meta["complete"] = reader.complete
    return records, meta


@contextlib.contextmanager
def drawing_views(folder: str | Path) -> Iterator[tuple[StoreReader, list[Path]]]:
    """``(store, drawn)``: the check store in ``folder``, held (no check writes it meanwhile)
    while its views are drawn; on a clean exit the files drawn beside the store (those the
    caller added to ``drawn``, ``check.json``, crash logs) are listed in the manifest, so that
    they go with the records."""
    folder = Path(folder)
    try:
        store = StoreReader.read_only(folder, lock=True, kind=KIND)
    except StoreError as exc:
        raise ValueError(str(exc)) from None
    drawn: list[Path] = []
    with store:
        yield store, drawn
        extra = [folder / META] + sorted((folder / LOGS).glob("*"))
        store.set_views([p for p in dict.fromkeys([*drawn, *extra]) if p.exists()])
