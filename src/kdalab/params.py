"""Typed values from what a user gives: the one parse of every parameter, for the command line,
TOML files and the Python API alike.

Each validator takes the raw value (text, a number, a list, or the typed value itself) and the
name of the argument as the user wrote it (``--lower-bound`` on the command line, ``lower-bound``
in a TOML file, ``lower_bound`` in Python), and returns the typed value or raises ``ValueError``
with one message: ``<argument> <what is wrong>; <what is accepted>``. Below the edge nothing
parses or checks these again.

Lists share one grammar: items separated by commas, each an integer ``16``, a range ``3-8``
(inclusive) or a stepped range ``36-64:4``; a Python list or tuple of such items works too.

The module imports neither torch nor the layers at import time (the command line must start fast);
the validators of models, formats and devices import them when called.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from kdalab.errors import Unavailable

if TYPE_CHECKING:
    from kdalab.arith import AccumulationModel, Format

__all__ = ["integer", "int_list", "name_list", "choice", "choices", "lower_bound",
           "lower_bounds", "lower_bound_range", "accumulation", "accumulations", "scale_format",
           "device", "output_folder", "config_file", "renamed", "INT_LIST_HELP", "option_field",
           "read_sweep_file", "user_path", "run_count", "MAX_ITEMS", "MAX_RUNS",
           "MAX_RECORDS_PER_RUN"]

INT_LIST_HELP = "integers like '4,12,16', ranges like '3-8' or stepped ranges like '36-64:4'"
#: The most items one list may hold, and the most runs one sweep may plan. A list is counted
#: before it is built, so '0-99999999999' is refused at once instead of filling the memory; a
#: million seeds is already days of CPU time, and ten million runs are about 10 GB of records.
MAX_ITEMS = 1_000_000
MAX_RUNS = 10_000_000
#: The most records one run (a study's cell) may make: a cell's records are in memory at once
#: (about a kilobyte each as Python objects); the studies' defaults make at most a few hundred.
MAX_RECORDS_PER_RUN = 100_000
_ITEM = re.compile(r"^(-?\d+)(?:-(-?\d+)(?::(\d+))?)?$")


def _plain(value) -> str:
    """How a given value is quoted in a message: numbers as written, other text in quotes."""
    if isinstance(value, str):
        try:
            float(value)
            return value.strip()
        except ValueError:
            return repr(value)
    return str(value)


def integer(value, name: str, minimum: int | None = None, *, int64: bool = False) -> int:
    """An integer (``"16"`` or ``16``), at least ``minimum``; with ``int64``, one that fits in
    64 bits (a seed or size that goes into tensors and generators)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        out = int(value) if isinstance(value, int) else int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {_plain(value)}") from None
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {out}")
    if int64:
        _fits_int64(out, name)
    return out


def _fits_int64(value: int, name: str) -> None:
    """Every integer goes into 64-bit tensors and generators (seeds, sizes)."""
    if not -2**63 <= value < 2**63:
        raise ValueError(f"{name}: {value} is too large; expected integers below 2**63")


def _items(value, name: str) -> list:
    if isinstance(value, str):
        items = [t.strip() for t in value.split(",")]
        if any(not t for t in items):
            raise ValueError(f"{name} has an empty item in {value!r}; expected a comma-separated "
                             "list")
        return items
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Iterable):
        return list(value)
    raise ValueError(f"{name} must be a list, got {_plain(value)}")


def int_list(value, name: str, minimum: int | None = None) -> tuple[int, ...]:
    """Integers in the list grammar (see the module doc), duplicates dropped, order kept."""
    out: list[int] = []
    for item in _items(value, name):
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ValueError(f"{name} must hold {INT_LIST_HELP}; got {item!r}")
        if isinstance(item, int):
            _fits_int64(item, name)
            out.append(item)
            continue
        m = _ITEM.match(item)
        lo, hi, step = (None, None, None) if m is None else m.groups()
        if m is None or step == "0" or (step is not None and int(step) < 1):
            raise ValueError(f"{name}: cannot read {item!r}; expected {INT_LIST_HELP}")
        if hi is not None and int(hi) < int(lo):
            fixed = f"{hi}-{lo}" + (f":{step}" if step else "")
            raise ValueError(f"{name}: the range {item!r} is reversed; write it from low to "
                             f"high, {fixed!r}")
        items = range(int(lo), int(lo) + 1) if hi is None else range(int(lo), int(hi) + 1,
                                                                      int(step or 1))
        for end in (items.start, items.stop - 1) if items else ():
            _fits_int64(end, name)
        if len(out) + len(items) > MAX_ITEMS:
            raise ValueError(f"{name}: {value!r} holds more than {MAX_ITEMS:,} items "
                             f"({len(out) + len(items):,}); one list holds at most {MAX_ITEMS:,}")
        out.extend(items)
    if not out:
        raise ValueError(f"{name} is empty; expected {INT_LIST_HELP}")
    for v in out:
        if minimum is not None and v < minimum:
            raise ValueError(f"{name} must be integers >= {minimum}, got {v}")
    return tuple(dict.fromkeys(out))


def name_list(value, name: str) -> tuple[str, ...]:
    """Names, comma-separated (or a list); duplicates dropped, order kept."""
    out = [str(i).strip() for i in _items(value, name)]
    if not out or any(not i for i in out):
        raise ValueError(f"{name} is empty; expected comma-separated names")
    return tuple(dict.fromkeys(out))


def choice(value, name: str, options: Iterable[str]) -> str:
    """One of ``options``."""
    options = list(options)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {_plain(value)}")
    return value


def choices(value, name: str, options: Iterable[str]) -> tuple[str, ...]:
    """A list of names, each one of ``options``."""
    options = list(options)
    return tuple(choice(v, name, options) for v in name_list(value, name))


_UNBOUNDED = ("unbounded", "none")


def lower_bound(value, name: str = "lower_bound", *, unbounded: bool = False) -> float | None:
    """The gate's lower bound: a finite number < 0 (the log-decay lies in (lower_bound, 0)),
    the one range every layer takes (a kernel that takes fewer declares it: its adapter's
    ``lower_bound_range``); with ``unbounded``, None or the word ``unbounded`` for the gate
    without a bound."""
    if unbounded and (value is None or (isinstance(value, str)
                                        and value.strip().lower() in _UNBOUNDED)):
        return None
    if isinstance(value, str) and value.strip().lower() in _UNBOUNDED:
        raise ValueError(f"{name}: this needs a bound (a finite number < 0); got {value!r}")
    try:
        if isinstance(value, bool):
            raise ValueError
        lb = float(value)
    except (TypeError, ValueError):
        lb = math.nan
    if not (math.isfinite(lb) and lb < 0):
        also = " or 'unbounded'" if unbounded else ""
        raise ValueError(f"{name} must be a finite number < 0{also} (the log-decay lies in "
                         f"(lower_bound, 0)), got {_plain(value)}")
    return lb


def lower_bounds(value, name: str = "lower_bounds", *,
                 unbounded: bool = False) -> tuple[float | None, ...]:
    """Lower bounds, comma-separated (or a list), each as :func:`lower_bound` takes it."""
    items = [None] if value is None and unbounded else _items(value, name)
    return tuple(dict.fromkeys(lower_bound(item, name, unbounded=unbounded) for item in items))


def lower_bound_range(value, name: str = "lower_bound") -> tuple[float, float]:
    """A range of lower bounds ``LOW:HIGH`` (text, or a pair), LOW <= HIGH, each a lower bound
    (:func:`lower_bound`); one number is the range of that bound alone."""
    if isinstance(value, str):
        lo, sep, hi = value.partition(":")
        pair = (lo, hi) if sep else (lo, lo)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = tuple(value)
    else:
        pair = (value, value)
    try:
        lo, hi = (lower_bound(x, name) for x in pair)
    except ValueError:
        raise ValueError(f"{name} must be a number < 0 or a range LOW:HIGH of them, got "
                         f"{_plain(value)}") from None
    if lo > hi:
        raise ValueError(f"{name}: the range {_plain(value)} is reversed; LOW:HIGH with LOW <= "
                         f"HIGH, e.g. '{hi:g}:{lo:g}'")
    return lo, hi


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def accumulation(value, name: str = "accumulation",
                 device_type: str | None = None) -> AccumulationModel:
    """A registered accumulation model (by name, or the model itself). A model that needs CUDA
    raises :class:`~kdalab.errors.Unavailable` without a CUDA device, and ``ValueError`` when
    ``device_type`` is given and is not ``"cuda"``."""
    from kdalab.arith import get_accumulation

    if not isinstance(value, str) and not hasattr(value, "matmul"):
        raise ValueError(f"{name} must name an accumulation model, got {_plain(value)}")
    try:
        model = get_accumulation(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if model.needs_cuda:
        twin = getattr(model, "cpu_twin", None)
        emulation = f" (its CPU emulation is {twin!r})" if twin else ""
        if not _cuda_available():
            raise Unavailable(f"{name}: {model.name!r} is the GPU's own arithmetic and needs a "
                              f"CUDA device; none is available here{emulation}")
        if device_type is not None and device_type != "cuda":
            raise ValueError(f"{name}: {model.name!r} runs on CUDA tensors only; use device "
                             f"cuda{emulation}")
    return model


def accumulations(value, name: str = "accumulations",
                  device_type: str | None = None) -> tuple[AccumulationModel, ...]:
    """Accumulation models, comma-separated names (or a list of names or models)."""
    items = name_list(value, name) if isinstance(value, str) else tuple(_items(value, name))
    if not items:
        raise ValueError(f"{name} is empty; expected accumulation model names")
    return tuple(dict.fromkeys(accumulation(v, name, device_type) for v in items))


def scale_format(value, name: str = "format") -> Format:
    """A floating-point format: a name (bf16, fp16, fp32, fp8_e4m3, fp8_e5m2, …), ``eXmY``,
    ``"X,Y"`` or ``(X, Y)`` (exponent and fraction bits); a ``-ftz`` suffix flushes subnormals."""
    from kdalab.arith import get_format

    spec = value
    if isinstance(value, str):
        bits = value.replace(" ", "").split(",")
        if len(bits) == 2 and all(b.isdigit() for b in bits):
            spec = (int(bits[0]), int(bits[1]))
    try:
        return get_format(spec)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def device(value, name: str = "device") -> str:
    """``cpu``, ``cuda`` or ``cuda:N``; a CUDA device must exist here
    (:class:`~kdalab.errors.Unavailable` otherwise)."""
    text = str(value).strip()
    if text != "cpu" and not re.fullmatch(r"cuda(:\d+)?", text):
        raise ValueError(f"{name} must be cpu, cuda or cuda:N; got {_plain(value)}")
    if text.startswith("cuda") and not _cuda_available():
        raise Unavailable(f"{name} {text}: no CUDA device is available on this machine; use "
                          "cpu")
    return text


def user_path(value, name: str) -> Path:
    """A path as the user wrote it (text or a path), ``~`` expanded; empty text is refused."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path (text), got {_plain(value)}")
    text = os.fspath(value)
    if not text.strip():
        raise ValueError(f"{name} is empty; expected a path")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~user that names no user here
        raise ValueError(f"{name}: cannot expand {text!r}: no such user here") from None


def run_count(counts: Iterable[int], name: str = "--seeds", noun: str = "runs") -> int:
    """The product of a plan's axis lengths, refused above :data:`MAX_RUNS` (``name``: the
    option to shorten, named in the message; ``noun``: what a study's runs are, e.g.
    ``cells``)."""
    total = math.prod(counts)
    if total > MAX_RUNS and noun == "runs":
        raise ValueError(f"{name}: the sweep would plan {total:,} runs; one sweep runs at most "
                         f"{MAX_RUNS:,} (fewer seeds, chunks, dims or families, or several "
                         "sweeps)")
    if total > MAX_RUNS:
        raise ValueError(f"{name}: the study would plan {total:,} {noun}; one study runs at "
                         f"most {MAX_RUNS:,} (a smaller grid, or several studies)")
    return total


def records_per_run(count: int, name: str = "--seeds", noun: str = "run") -> int:
    """A study's records per run (``noun``), refused above :data:`MAX_RECORDS_PER_RUN`
    (``name``: the option to shorten, named in the message)."""
    if count > MAX_RECORDS_PER_RUN:
        raise ValueError(f"{name}: each {noun} would make {count:,} records; one {noun} makes at "
                         f"most {MAX_RECORDS_PER_RUN:,} (fewer seeds, lower bounds or "
                         "strategies, or several studies)")
    return count


def output_folder(value, name: str = "out", *, create: bool = True) -> Path:
    """A folder to write into (``~`` expanded): created if missing; an existing file or a place
    that cannot be written is refused. With ``create=False`` nothing is made: the folder is
    only checked to be creatable (its nearest existing parent a writable folder), for a writer
    that makes it itself once everything else is known to be valid (a mistake found later then
    leaves no empty folder behind)."""
    path = user_path(value, name)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a file; expected a folder (created if "
                         "missing)")
    if not create:
        _creatable(path, name)
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name}: cannot create the folder {str(path)!r} "
                         f"({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: cannot write into {str(path)!r} (permission denied)")
    return path


def _creatable(path: Path, name: str) -> None:
    """A ValueError naming ``name`` unless ``path`` is a writable folder or can be made: the
    folders missing are made and removed again (the system's own answer: a read-only or
    virtual file system, a file in the way, permissions), so nothing is left behind."""
    missing = []
    parent = path
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    if not missing:
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{name}: cannot write into {str(path)!r} (permission denied)")
        return
    made = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
    except OSError as exc:
        raise ValueError(f"{name}: cannot create the folder {str(path)!r} "
                         f"({exc.strerror or exc})") from None
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass


def config_file(value, name: str = "config") -> Path:
    """An existing, readable file (``~`` expanded)."""
    path = user_path(value, name)
    if not path.exists():
        raise ValueError(f"{name}: no such file {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is a folder; expected a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{name}: cannot read {str(path)!r} (permission denied)")
    return path


def renamed(exc: Exception, names: dict[str, str]) -> Exception:
    """``exc``, a validator's error about a field, with the argument named as the user wrote it
    (a message starting with a field of ``names`` starts with its label instead): a config
    object checks its fields once, and the edge that filled them from options or a file says
    which option or key was wrong."""
    text = str(exc)
    for field in sorted(names, key=len, reverse=True):
        if text.startswith(field):
            return type(exc)(names[field] + text[len(field):])
    return exc


# --- sweep files: keys spelled as the command's options (no torch: read before it loads) ---

#: every spelling a sweep's key may take (option names, singular or plural) -> the field
_KEYS = {"family": "families", "chunk": "chunks", "seed": "seeds", "dim": "dims",
         "accumulation": "accumulations", "lower_bound": "lower_bounds"}


def option_field(key: str) -> str:
    """The field a sweep key names: ``--lower-bound``, ``lower-bound`` and ``lower_bounds`` all
    name ``lower_bounds``."""
    name = key.strip().lstrip("-").replace("-", "_")
    return _KEYS.get(name, name)


def read_sweep_file(path: str | Path, name: str = "config") -> dict:
    """The keys of a TOML sweep file (its ``[sweep]`` table, if it has one), as written."""
    path = config_file(path, name)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{name}: malformed TOML in {str(path)!r}: {exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{name}: {str(path)!r} is not a TOML file (not UTF-8 text)") from None
    if "sweep" in data and isinstance(data["sweep"], dict):
        data = data["sweep"]
    return data
