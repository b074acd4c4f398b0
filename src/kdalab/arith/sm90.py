"""The H200's special-function instructions as FlashKDA issues them (``setup.py`` builds it with
``--use_fast_math``; ``csrc/smxx/utils.cuh:38-53``, ``fwd_kernel1.cuh:257,294``):

==========================  =====================================================================
``tanh.approx.f32``         its sigmoid, ``tanh(x·½)·½ + ½`` (the gate and β)
``ex2.approx.ftz.f32``      2^G and 2^−G of the base-2 log-decay, ``__expf(A_log)`` (fast math:
                            ex2 of ``fl(A_log · fl(log2 e))``)
``rsqrt.approx.ftz.f32``    ``rsqrtf(Σx² + 1e-6)`` of the q/k normalization (fast math)
==========================  =====================================================================

All three run on the multi-function unit and are not correctly rounded: the PTX ISA bounds
``tanh.approx.f32`` by a relative error of 2⁻¹¹ (so FlashKDA's sigmoid may be off by ~2⁻¹²
absolutely, far more than float32's rounding), ``ex2.approx`` and ``rsqrt.approx`` by a couple of
float32 ulps.

**Measured tables.** ``scripts/device/flashkda_golden.py`` runs each instruction on the H200 over
whole binades of inputs and writes what it finds (``flashkda_sfu_tanh.npz``,
``flashkda_sfu_ex2_rsqrt.npz``). Where those files are present (``kdalab/arith/data/`` as
``sm90_tanh.npz`` and ``sm90_ex2_rsqrt.npz``, or the folder ``$KDALAB_SM90_DATA``), the models
below are the H200's answers, read from them:

* ``tanh``: per binade 2^e ≤ |x| < 2^(e+1) either the table of outputs at the inputs whose low
  ``n`` significand bits are zero (the measurement shows the output ignores those bits: n = 2..6
  between 2⁻⁸ and 8), or ``|x|`` itself (below 2⁻⁸, subnormals included: they are not flushed),
  or 1 (from 8 up, inf included); odd in x;
* ``ex2``: y = 2^w · F[j], with F the measured outputs at j·2⁻²³ (j < 2²³) and (w, j) from |x|
  truncated to 23 fraction bits, the fraction's ones' complement for negative x
  (:func:`ex2_approx_ftz`); results below 2⁻¹²⁶ flushed to zero;
* ``rsqrt``: y(4^m·x) = 2^−m·y(x), with y measured on [1, 4);
* FlashKDA's sigmoid ``fma(tanh.approx(x·½), ½, ½)`` (:func:`sigmoid_tanh`) from ``tanh``.

Inputs the measurement does not cover fall back to the correctly rounded function, as does
everything when no tables are present; :func:`measured` says what is covered. The H200 run of the
golden data (docs/flashkda.md) measured all three on every input of whole binades:
``tanh`` for 2⁻⁴⁰ ≤ |x| < 2⁹ (both signs; 6,684,672 table entries for 2⁻⁸ ≤ |x| < 8), ``ex2``'s
2²³ fractions and ``rsqrt`` on [1, 4), with the structure each model assumes checked on whole
binades (ex2: 2⁻³⁰ ≤ |x| < 2⁷; rsqrt: 2⁻⁴⁰ ≤ x < 2⁴¹). Beyond those binades the models extend
the measured pattern; the run's outputs on every bf16 input (tanh and the sigmoid; every
exponent, subnormals and inf included) and on 4,097 inputs of ex2 around its flush to zero agree
with them bit for bit (``tests/test_sm90.py``).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from kdalab.arith.exp2 import exp2_ftz

__all__ = ["tanh_approx", "sigmoid_tanh", "ex2_approx_ftz", "rsqrt_approx_ftz", "measured",
           "reload", "DATA_DIR"]

DATA_DIR = Path(__file__).parent / "data"
_TINY = 2.0**-126
_FRAC = 1 << 23


def _data_dir() -> Path:
    return Path(os.environ.get("KDALAB_SM90_DATA", DATA_DIR))


def _files(stem: str) -> list[Path]:
    d = _data_dir()
    return [d / f"sm90_{stem}.npz", d / f"flashkda_sfu_{stem}.npz"]


def _open(stem: str):
    for path in _files(stem):
        if path.exists():
            with np.load(path) as z:
                return {k: z[k] for k in z.files}
    return None


def _summary(arrays: dict, key: str) -> dict:
    return json.loads(bytes(arrays[key]).decode())


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32).to(torch.int64)


def _from_bits(b: torch.Tensor) -> torch.Tensor:
    return ((b + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.float32)


def _check_size(what: str, table, want: int) -> None:
    if len(table) != want:
        raise ValueError(f"{what}: {len(table)} entries, a whole binade has {want}")


def _ftz_input(x: torch.Tensor) -> torch.Tensor:
    """``.ftz``: subnormal inputs read as sign-preserving zero."""
    x = x.float()
    return torch.where(x.abs() < _TINY, x * 0.0, x)


# --- tanh.approx.f32 -------------------------------------------------------------------------

_X, _ONE, _TABLE, _ROUNDED = range(4)  # how a binade's outputs are had


class _TanhModel(NamedTuple):
    """Per binade e (index e − lo + 1; index 0: every binade below the measured ones, the last:
    every binade above, inf included) how the output is had, the table's offset in ``table``
    and the low input bits it ignores."""

    lo: int
    how: torch.Tensor
    offset: torch.Tensor
    shift: torch.Tensor
    table: torch.Tensor
    rounded: list[str]


@lru_cache(maxsize=None)
def _tanh_tables() -> _TanhModel | None:
    arrays = _open("tanh")
    if arrays is None:
        return None
    summ = _summary(arrays, "summary_json")
    binades = {int(e): info for e, info in summ["binades"].items()}
    if not all(info["odd"] for info in binades.values()):
        raise ValueError("tanh.approx measurement: not odd in x; the model assumes it is")
    lo, hi = min(binades), max(binades)
    how, offset, shift, tables, rounded, pos = [], [], [], [], [], 0
    for e in range(lo - 1, hi + 2):  # lo − 1: every binade below; hi + 1: every one above
        info = binades.get(min(max(e, lo), hi), {})  # beyond: the pattern at the ends
        n, off = 0, 0
        if info.get("all_equal_x") and e <= hi:
            how.append(_X)
        elif info.get("all_one") and e >= lo:
            how.append(_ONE)
        elif info.get("stored") == "table" and lo <= e <= hi:
            n, off = info["invariant_low_bits"], pos
            tab = _table(arrays, e)
            _check_size(f"tanh.approx table of binade {e}", tab, _FRAC >> n)
            how.append(_TABLE)
            tables.append(tab)
            pos += len(tab)
        else:
            how.append(_ROUNDED)
            rounded.append(f"below {lo}" if e < lo else f"above {hi}" if e > hi else str(e))
        offset.append(off)
        shift.append(n)
    table = torch.cat(tables) if tables else torch.zeros(1)
    return _TanhModel(lo, torch.tensor(how), torch.tensor(offset), torch.tensor(shift), table,
                      rounded)


def _table(arrays: dict, e: int) -> torch.Tensor:
    """Binade ``e``'s outputs: stored as values (``e{e}``) or as the first output's bits and the
    differences of consecutive outputs' bits (``b{e}``, ``d{e}``)."""
    if f"e{e}" in arrays:
        return torch.from_numpy(arrays[f"e{e}"])
    deltas = torch.from_numpy(arrays[f"d{e}"].astype(np.int64))
    bits = int(arrays[f"b{e}"][0]) + torch.cat([torch.zeros(1, dtype=torch.int64),
                                                deltas.cumsum(0)])
    return _from_bits(bits)


def tanh_approx(x: torch.Tensor) -> torch.Tensor:
    """``tanh.approx.f32`` of float32 ``x`` (module doc: measured tables, else correctly
    rounded). Subnormal inputs are not flushed: the H200 returns them as they are."""
    x = x.float()
    t = _tanh_tables()
    if t is None:
        return torch.tanh(x.double()).float()
    dev = x.device
    ax = x.abs()
    b = _bits(ax)
    i = ((b >> 23) - 127 - t.lo + 1).clamp(0, len(t.how) - 1)
    how = t.how.to(dev)[i]
    idx = t.offset.to(dev)[i] + ((b & (_FRAC - 1)) >> t.shift.to(dev)[i])
    out = t.table.to(dev)[torch.where(how == _TABLE, idx, torch.zeros_like(idx))]
    out = torch.where(how == _X, ax, torch.where(how == _ONE, torch.ones_like(ax), out))
    if bool((how == _ROUNDED).any()):
        out = torch.where(how == _ROUNDED, torch.tanh(ax.double()).float(), out)
    out = torch.where(torch.isnan(x), x, out)
    return torch.copysign(out, x)


# --- FlashKDA's sigmoid ----------------------------------------------------------------------

def sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    """FlashKDA's sigmoid of float32 ``x`` on the H200: ``fma(tanh.approx(x·½), ½, ½)``
    (``utils.cuh:50-53``), with :func:`tanh_approx`."""
    x = x.float()
    half = torch.tensor(0.5, dtype=torch.float32, device=x.device)
    return (tanh_approx(x * half).double() * 0.5 + 0.5).float()  # one rounding: exact in f64


# --- ex2.approx.ftz.f32 ----------------------------------------------------------------------

def _instruction(name: str, table: str):
    """The arrays ``name__…`` of one instruction in the ex2/rsqrt file and its summary, or None
    where the file or its table ``name__table`` is missing."""
    arrays = _open("ex2_rsqrt")
    if arrays is None or f"{name}__{table}" not in arrays:
        return None
    return arrays, _summary(arrays, f"{name}__summary_json")


def _from_ulps(exact: torch.Tensor, ulps: np.ndarray) -> torch.Tensor:
    """Measured float32 outputs, stored as their distance in ulps from the correctly rounded
    ``exact``."""
    return _from_bits(_bits(exact) + torch.from_numpy(ulps.astype(np.int64)))


@lru_cache(maxsize=None)
def _ex2_tables():
    found = _instruction("ex2", "frac_ulp")
    if found is None:
        return None
    arrays, summ = found
    _check_size("ex2.approx fraction table", arrays["ex2__frac_ulp"], _FRAC)
    j = torch.arange(_FRAC, dtype=torch.float64)
    frac = _from_ulps(torch.exp2(j * 2.0**-23).float(), arrays["ex2__frac_ulp"])
    exact_pos = all(v["floor"] == 0 for k, v in summ["binades"].items() if k[0] == "+")
    return frac, exact_pos


def ex2_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    """``ex2.approx.ftz.f32`` of float32 ``x`` (module doc: measured tables, else correctly
    rounded with flush-to-zero).

    With the tables: |x| is taken to fixed point with 23 fraction bits, truncated:
    t = ⌊|x|·2²³⌋ = i·2²³ + f. For x ≥ 0 the result is 2^i·F[f]. For x < 0 it is 2^−i where
    f = 0, else 2^(−i−1)·F[2²³ − 1 − f] (the fraction's ones' complement, one below the exact
    2²³ − f). Results below 2⁻¹²⁶ flush to zero.
    """
    x = _ftz_input(x)
    t = _ex2_tables()
    if t is None:
        return exp2_ftz(x)
    frac = t[0].to(x.device)
    x64 = x.double()
    fin = torch.isfinite(x64)
    tt = torch.trunc(torch.where(fin, x64.abs(), torch.zeros_like(x64)).clamp(max=300.0)
                     * 2.0**23)
    i = torch.floor(tt / _FRAC)
    f = (tt - i * _FRAC).long()
    neg = x64 < 0
    w = torch.where(neg, torch.where(f == 0, -i, -i - 1), i)
    j = torch.where(neg & (f != 0), _FRAC - 1 - f, torch.where(neg, torch.zeros_like(f), f))
    y = (frac[j].double() * torch.exp2(w)).float()
    y = torch.where(fin, y, torch.exp2(x64).float())  # 2^inf = inf, 2^-inf = 0, nan
    return torch.where(y.abs() < _TINY, torch.zeros_like(y), y)


# --- rsqrt.approx.ftz.f32 --------------------------------------------------------------------

@lru_cache(maxsize=None)
def _rsqrt_tables():
    found = _instruction("rsqrt", "e0_ulp")
    if found is None:
        return None
    arrays, summ = found
    if any(v != 0 for v in summ["binades"].values()):
        raise ValueError("rsqrt.approx measurement: y(4x) = y(x)/2 does not hold everywhere")
    tabs = []
    for par in (0, 1):
        _check_size(f"rsqrt.approx table e{par}", arrays[f"rsqrt__e{par}_ulp"], _FRAC)
        m = torch.arange(_FRAC, dtype=torch.int64)
        x = _from_bits(((par + 127) << 23) + m)
        tabs.append(_from_ulps(torch.rsqrt(x.double()).float(), arrays[f"rsqrt__e{par}_ulp"]))
    return torch.stack(tabs)  # [2, 2^23]


def rsqrt_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    """``rsqrt.approx.ftz.f32`` of float32 ``x`` (module doc: measured tables, else correctly
    rounded)."""
    x = _ftz_input(x)
    t = _rsqrt_tables()
    if t is None:
        return torch.rsqrt(x.double()).float()
    b = _bits(x)
    e = (b >> 23) - 127
    par = e % 2
    m = b & (_FRAC - 1)
    ok = (x > 0) & torch.isfinite(x)
    y = t.to(x.device)[torch.where(ok, par, 0), torch.where(ok, m, 0)].double()
    y = (y * torch.exp2(-((e - par) // 2).double())).float()
    return torch.where(ok, y, torch.rsqrt(x.double()).float())


def reload() -> None:
    """Read the tables again (after ``$KDALAB_SM90_DATA`` or the files changed)."""
    for f in (_tanh_tables, _ex2_tables, _rsqrt_tables):
        f.cache_clear()


def measured() -> dict[str, str]:
    """For each instruction, what its model is read from (or why the tables are unusable)."""
    try:
        return _measured()
    except ValueError as e:
        return {"error": str(e)}


def _measured() -> dict[str, str]:
    out = {}
    t = _tanh_tables()
    if t is None:
        out["tanh.approx.f32"] = "correctly rounded tanh (no measurement)"
    else:
        out["tanh.approx.f32"] = ("measured" if not t.rounded else
                                  f"measured except binades {', '.join(t.rounded)} (correctly "
                                  "rounded there)")
    t = _ex2_tables()
    if t is None:
        out["ex2.approx.ftz.f32"] = "correctly rounded exp2, FTZ (no measurement)"
    else:
        out["ex2.approx.ftz.f32"] = ("measured" if t[1] else
                                     "measured; 2^i·F[f] does not hold for every x >= 1")
    out["rsqrt.approx.ftz.f32"] = ("measured" if _rsqrt_tables() is not None else
                                   "correctly rounded rsqrt (no measurement)")
    return out
