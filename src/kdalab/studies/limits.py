"""Where the decay scales stop being safe: the calculator's answers as records, and the limits
the dynamic-range sweep measured, set against them.

The calculator (:func:`kdalab.kda.safe_chunk.safe_chunk`) is run here, once per (format, exp2
path, boundary, lower bound), and its answers become records like any measurement's; the views
draw both and compute nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kdalab.kda.safe_chunk import BOUNDARIES, safe_chunk

__all__ = ["TABLE_LOWER_BOUNDS", "calculator_records", "measured_limits", "agreement",
           "error_summary"]

#: the lower bounds of the calculator's summary table
TABLE_LOWER_BOUNDS = (-1.0, -2.0, -3.0, -5.0, -8.0, -10.0, -20.0)


def calculator_records(lower_bounds: Sequence[float], formats: Sequence[str],
                       boundaries: Sequence[str] = BOUNDARIES,
                       exp2_ftz: Sequence[bool] = (True,)) -> list[dict]:
    """One record per (format, exp2 path, boundary, lower bound): ``max_chunk`` and
    ``max_chunk_normal`` (None: unbounded)."""
    out = []
    for fmt in formats:
        for ftz in exp2_ftz:
            for b in boundaries:
                for lb in lower_bounds:
                    sc = safe_chunk(fmt, lb, b, exp2_ftz=bool(ftz))
                    out.append({"format": sc.format.name, "exp2_ftz": bool(ftz), "boundary": b,
                                "lower_bound": float(lb), "max_chunk": sc.max_chunk,
                                "max_chunk_normal": sc.max_chunk_normal})
    return out


def _answer(value) -> int | None:
    """A stored calculator answer: an int, or None for unbounded (NaN in a frame)."""
    return None if value is None or value != value else int(value)


def _answers(calculator: list[dict] | pd.DataFrame) -> dict:
    df = pd.DataFrame(calculator)
    return {(r.format, bool(r.exp2_ftz), r.boundary, float(r.lower_bound)):
            (_answer(r.max_chunk), _answer(r.max_chunk_normal))
            for r in df.itertuples(index=False)}


def _as_limit(value: int | None) -> float:
    return float("inf") if value is None else float(value)


def measured_limits(records: list[dict] | pd.DataFrame, calculator: list[dict] | pd.DataFrame,
                    family: str = "floor") -> pd.DataFrame:
    """Per (format, exp2 path, boundary, lower bound): the largest swept C up to which every
    chunk's factors were finite and non-zero (``measured``), and all normal, next to the
    calculator's answers clipped to the grid."""
    df = pd.DataFrame(records)
    df = df[df["family"] == family]
    answers = _answers(calculator)
    rows = []
    for (fmt, ftz, b, lb), sub in df.groupby(["format", "exp2_ftz", "boundary", "lower_bound"],
                                             sort=False):
        sub = sub.groupby("chunk")[["scales_ok", "scales_normal"]].min().sort_index()
        chunks = sub.index.to_numpy()

        def first_fail(col):
            bad = chunks[sub[col].to_numpy() == 0]
            good = chunks[chunks < bad.min()] if len(bad) else chunks
            return int(good.max()) if len(good) else 0

        def clip(v):  # the calculator's answer as the grid can see it
            inside = chunks[chunks <= _as_limit(v)]
            return int(inside.max()) if len(inside) else 0

        max_chunk, max_normal = answers[(fmt, bool(ftz), b, float(lb))]
        m, mn = first_fail("scales_ok"), first_fail("scales_normal")
        rows.append({"format": fmt, "exp2_ftz": bool(ftz), "boundary": b, "lower_bound": lb,
                     "measured_max_chunk": m, "calculator_max_chunk": max_chunk,
                     "measured_max_chunk_normal": mn,
                     "calculator_max_chunk_normal": max_normal,
                     "calculator_in_grid": clip(max_chunk),
                     "agree": clip(max_chunk) == m and clip(max_normal) == mn,
                     "guarantee_holds": m >= clip(max_chunk)})
    return pd.DataFrame(rows)


def agreement(records: list[dict] | pd.DataFrame,
              calculator: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """Worst case: measured limit == calculator (``agree``); model-like: every chunk up to the
    calculator's limit was measured safe (``model_like_holds``), and the median ratio of the
    measured model-like limit to the calculator's."""
    lim = measured_limits(records, calculator)
    out = lim.groupby(["format", "exp2_ftz", "boundary"], as_index=False, sort=False).agg(
        cases=("agree", "size"), agree=("agree", "sum"))
    if "model_like" in set(pd.DataFrame(records)["family"]):
        ml = measured_limits(records, calculator, family="model_like")
        ml = ml[ml["calculator_in_grid"] > 0]
        ml["ratio"] = ml["measured_max_chunk"] / ml["calculator_in_grid"]
        agg = ml.groupby(["format", "exp2_ftz", "boundary"], as_index=False, sort=False).agg(
            model_like_holds=("guarantee_holds", "sum"),
            model_like_cases=("guarantee_holds", "size"),
            model_like_ratio_median=("ratio", "median"))
        out = out.merge(agg, on=["format", "exp2_ftz", "boundary"], how="left")
    return out


def error_summary(records: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """Median L / INV error at the chunk sizes of the seed's table, at lower bound −5."""
    df = pd.DataFrame(records)
    out = df[(df["lower_bound"] == -5.0) & (df["chunk"].isin([8, 16, 17, 18, 19, 32, 64, 128]))]
    if out.empty:
        return out
    return out.groupby(["family", "format", "exp2_ftz", "boundary", "chunk"], as_index=False).agg(
        overflow=("overflow", "max"), zero=("zero", "max"),
        l_rel_rmse=("l_rel_rmse", "median"), inv_rel_rmse=("inv_rel_rmse", "median"))
