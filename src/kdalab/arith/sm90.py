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
  between 2⁻⁸ and 8), or ``|x|`` itself (|x| < 2⁻⁹), or 1 (|x| ≥ 8); odd in x;
* ``ex2``: y = 2^w · F[j], with F the measured outputs at j·2⁻²³ (j < 2²³) and (w, j) from |x|
  truncated to 23 fraction bits, the fraction's ones' complement for negative x
  (:func:`ex2_approx_ftz`); results below 2⁻¹²⁶ flushed to zero;
* ``rsqrt``: y(4^m·x) = 2^−m·y(x), with y measured on [1, 4).

* FlashKDA's sigmoid ``fma(tanh.approx(x·½), ½, ½)`` (:func:`sigmoid_tanh`): measured on every
  bf16 input (β is bf16) and, where ``$KDALAB_SM90_POINTS`` names a file of measured points, on
  those; elsewhere computed from ``tanh``.

Inputs the measurement does not cover fall back to the correctly rounded function, as does
everything when no tables are present. :func:`measured` says what is covered. The H200 run of
2026-11-30 (docs/flashkda.md) measured ``ex2`` and ``rsqrt`` completely; ``tanh`` exactly only
for |x| < 2⁻⁵ and |x| ≥ 8 (between, it ignores just 2–5 low input bits, and the run kept
samples, not the 6.3 million-entry tables).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

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

@lru_cache(maxsize=None)
def _tanh_tables():
    arrays = _open("tanh")
    if arrays is None:
        return None
    summ = _summary(arrays, "summary_json")
    binades = {int(e): info for e, info in summ["binades"].items()}
    if not all(info["odd"] for info in binades.values()):
        raise ValueError("tanh.approx measurement: not odd in x; the model assumes it is")
    tables = {e: (info["invariant_low_bits"], _table(arrays, e))
              for e, info in binades.items() if info.get("stored") == "table"}
    for e, (n, tab) in tables.items():
        _check_size(f"tanh.approx table of binade {e}", tab, _FRAC >> n)
    return binades, tables


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
    rounded)."""
    x = _ftz_input(x)
    y = torch.tanh(x.double()).float()
    t = _tanh_tables()
    if t is None:
        return y
    binades, tables = t
    ax = x.abs()
    b = _bits(ax)
    e = (b >> 23) - 127
    m = b & (_FRAC - 1)
    out = y.abs()
    lo, hi = min(binades), max(binades)
    if binades[lo]["all_equal_x"]:
        out = torch.where(e < lo, ax, out)
    if binades[hi]["all_one"]:
        out = torch.where((e > hi) & (ax != 0), torch.ones_like(out), out)
    for ev, info in binades.items():
        sel = e == ev
        if info["all_equal_x"]:
            out = torch.where(sel, ax, out)
        elif info["all_one"]:
            out = torch.where(sel, torch.ones_like(out), out)
        elif ev in tables:
            n, tab = tables[ev]
            idx = torch.where(sel, m >> n, torch.zeros_like(m))
            out = torch.where(sel, tab.to(x.device)[idx], out)
    out = torch.where(torch.isnan(x), x, out)
    return torch.copysign(out, x)


# --- FlashKDA's sigmoid ----------------------------------------------------------------------

@lru_cache(maxsize=None)
def _sigmoid_points():
    """Measured (x bits, sigmoid bits), sorted by x: every bf16 input (the tanh file), and the
    points in ``$KDALAB_SM90_POINTS`` (an npz of ``x_bits``, ``sigmoid_bits``) if set."""
    keys, vals = [], []
    arrays = _open("tanh")
    if arrays is not None and "bf16_in" in arrays:
        keys.append(arrays["bf16_in"].view(np.int32))
        vals.append(arrays["bf16_sigmoid"].view(np.int32))
    extra = os.environ.get("KDALAB_SM90_POINTS")
    if extra:
        with np.load(extra) as z:
            keys.append(z["x_bits"].astype(np.int32))
            vals.append(z["sigmoid_bits"].astype(np.int32))
    if not keys:
        return None
    k, v = np.concatenate(keys), np.concatenate(vals)
    keep = ~np.isnan(k.view(np.float32))
    k, v = k[keep], v[keep]
    order = np.argsort(k, kind="stable")
    return torch.from_numpy(k[order]), torch.from_numpy(v[order])


def sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    """FlashKDA's sigmoid of float32 ``x`` on the H200: ``fma(tanh.approx(x·½), ½, ½)``
    (``utils.cuh:50-53``). Measured outputs where there are any (every bf16 input; the points of
    ``$KDALAB_SM90_POINTS``), else computed with :func:`tanh_approx`."""
    x = x.float()
    half = torch.tensor(0.5, dtype=torch.float32, device=x.device)
    y = (tanh_approx(x * half).double() * 0.5 + 0.5).float()  # one rounding: exact in float64
    pts = _sigmoid_points()
    if pts is None:
        return y
    keys, vals = (t.to(x.device) for t in pts)
    xb = x.contiguous().view(torch.int32)
    pos = torch.searchsorted(keys, xb.reshape(-1)).clamp(max=len(keys) - 1).reshape(xb.shape)
    hit = keys[pos] == xb
    return torch.where(hit, vals[pos].view(torch.float32), y)


# --- ex2.approx.ftz.f32 ----------------------------------------------------------------------

@lru_cache(maxsize=None)
def _ex2_tables():
    arrays = _open("ex2_rsqrt")
    if arrays is None or "ex2__frac_ulp" not in arrays:
        return None
    summ = _summary(arrays, "ex2__summary_json")
    _check_size("ex2.approx fraction table", arrays["ex2__frac_ulp"], _FRAC)
    j = torch.arange(_FRAC, dtype=torch.float64)
    exact = torch.exp2(j * 2.0**-23).float()
    frac = _from_bits(_bits(exact) + torch.from_numpy(arrays["ex2__frac_ulp"].astype(np.int64)))
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
    frac = t[0].to(x.device).double()
    x64 = x.double()
    fin = torch.isfinite(x64)
    tt = torch.trunc(torch.where(fin, x64.abs(), torch.zeros_like(x64)).clamp(max=300.0)
                     * 2.0**23)
    i = torch.floor(tt / _FRAC)
    f = (tt - i * _FRAC).long()
    neg = x64 < 0
    w = torch.where(neg, torch.where(f == 0, -i, -i - 1), i)
    j = torch.where(neg & (f != 0), _FRAC - 1 - f, torch.where(neg, torch.zeros_like(f), f))
    y = (frac[j] * torch.exp2(w)).float()
    y = torch.where(fin, y, torch.exp2(x64).float())  # 2^inf = inf, 2^-inf = 0, nan
    return torch.where(y.abs() < _TINY, torch.zeros_like(y), y)


# --- rsqrt.approx.ftz.f32 --------------------------------------------------------------------

@lru_cache(maxsize=None)
def _rsqrt_tables():
    arrays = _open("ex2_rsqrt")
    if arrays is None or "rsqrt__e0_ulp" not in arrays:
        return None
    summ = _summary(arrays, "rsqrt__summary_json")
    if any(v != 0 for v in summ["binades"].values()):
        raise ValueError("rsqrt.approx measurement: y(4x) = y(x)/2 does not hold everywhere")
    tabs = []
    for par in (0, 1):
        _check_size(f"rsqrt.approx table e{par}", arrays[f"rsqrt__e{par}_ulp"], _FRAC)
        m = torch.arange(_FRAC, dtype=torch.int64)
        x = _from_bits(((par + 127) << 23) + m)
        exact = torch.rsqrt(x.double()).float()
        ulp = torch.from_numpy(arrays[f"rsqrt__e{par}_ulp"].astype(np.int64))
        tabs.append(_from_bits(_bits(exact) + ulp))
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
    for f in (_tanh_tables, _sigmoid_points, _ex2_tables, _rsqrt_tables):
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
        binades, tables = t
        rest = sorted(e for e, i in binades.items()
                      if not (i["all_equal_x"] or i["all_one"] or e in tables))
        out["tanh.approx.f32"] = ("measured" if not rest else
                                  f"measured except binades {rest} (correctly rounded there)")
    pts = _sigmoid_points()
    out["sigmoid (tanh.approx form)"] = ("from tanh.approx" if pts is None else
                                        f"measured at {len(pts[0])} inputs, else from tanh.approx")
    t = _ex2_tables()
    if t is None:
        out["ex2.approx.ftz.f32"] = "correctly rounded exp2, FTZ (no measurement)"
    else:
        out["ex2.approx.ftz.f32"] = ("measured" if t[1] else
                                     "measured; 2^i·F[f] does not hold for every x >= 1")
    out["rsqrt.approx.ftz.f32"] = ("measured" if _rsqrt_tables() is not None else
                                   "correctly rounded rsqrt (no measurement)")
    return out
