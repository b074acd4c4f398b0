"""Views of the dynamic-range records: phase-diagram heatmaps with the calculator's boundary drawn
over the measurements, error heatmaps, and tables (Markdown and CSV). Drawn from records only: the
sweep's, and the calculator's answers as records (:mod:`kdalab.studies.limits`); the overlaid
line is read from those, never typed in or computed here."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402

from kdalab.studies.limits import (  # noqa: E402
    TABLE_LOWER_BOUNDS,
    agreement,
    error_summary,
    measured_limits,
)
from kdalab.views.tables import markdown_table  # noqa: E402

__all__ = ["status_codes", "calculator_table", "plot_phase_diagram", "plot_error_heatmap",
           "write_views"]

STATUS = ["all normal", "subnormal factors", "zero factors", "non-finite / saturated",
          "zero and non-finite"]
_COLORS = ["#2b8a3e", "#a9d18e", "#4dabf7", "#f08c00", "#c92a2a"]


def status_codes(frame: pd.DataFrame) -> pd.Series:
    over, zero, sub = frame["overflow"] > 0, frame["zero"] > 0, frame["subnormal"] > 0
    code = np.where(over & zero, 4, np.where(over, 3, np.where(zero, 2, np.where(sub, 1, 0))))
    return pd.Series(code, index=frame.index)


def _edges(values: np.ndarray) -> np.ndarray:
    """Cell edges around sorted chunk sizes, on a log2 axis."""
    v = np.log2(values.astype(float))
    mid = (v[1:] + v[:-1]) / 2
    first = v[0] - (mid[0] - v[0] if len(v) > 1 else 0.5)
    last = v[-1] + (v[-1] - mid[-1] if len(v) > 1 else 0.5)
    return 2 ** np.concatenate([[first], mid, [last]])


def _calculator_lookup(calculator) -> dict:
    df = pd.DataFrame(calculator)
    return {(r.format, bool(r.exp2_ftz), r.boundary, float(r.lower_bound)):
            (r.max_chunk, r.max_chunk_normal) for r in df.itertuples(index=False)}


def _overlay(ax, answers: dict, lbs: list[float], fmt: str, boundary: str, ftz: bool,
             cmax: float) -> None:
    xs, xn, ys = [], [], []
    for i, lb in enumerate(lbs):
        max_chunk, max_normal = answers[(fmt, bool(ftz), boundary, float(lb))]
        mc = cmax * 1.5 if pd.isna(max_chunk) else max_chunk + 0.5
        mn = cmax * 1.5 if pd.isna(max_normal) else max_normal + 0.5
        xs += [mc, mc]
        xn += [mn, mn]
        ys += [i - 0.5, i + 0.5]
    ax.plot(xs, ys, color="black", lw=1.6, label="calculator: max_chunk")
    if xn != xs:
        ax.plot(xn, ys, color="white", lw=1.2, ls="--", label="calculator: max_chunk_normal")


def _panel_grid(frame: pd.DataFrame):
    formats = list(dict.fromkeys(frame["format"]))
    boundaries = list(dict.fromkeys(frame["boundary"]))
    fig, axes = plt.subplots(len(formats), len(boundaries), squeeze=False,
                             figsize=(3.3 * len(boundaries), 2.5 * len(formats) + 0.6),
                             sharex=True, sharey=True)
    return fig, axes, formats, boundaries


def _matrix(sub: pd.DataFrame, column: str, lbs, chunks, agg="max") -> np.ndarray:
    piv = sub.pivot_table(index="lower_bound", columns="chunk", values=column, aggfunc=agg)
    piv = piv.reindex(index=lbs, columns=chunks)
    return piv.to_numpy(dtype=float)


def _dress_panel(ax, answers, lbs, fmt, boundary, exp2_ftz, chunks, xe, *, first_row,
                 first_col, last_row) -> None:
    """The calculator's line, axes scales and limits, and the labels of a grid's edge panels."""
    _overlay(ax, answers, lbs, fmt, boundary, exp2_ftz, chunks.max())
    ax.set_xscale("log", base=2)
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(len(lbs) - 0.5, -0.5)
    if first_row:
        ax.set_title(boundary)
    if first_col:
        ax.set_ylabel(f"{fmt}\nlower bound")
        step = max(1, len(lbs) // 8)
        ax.set_yticks(range(0, len(lbs), step))
        ax.set_yticklabels([f"{lbs[i]:g}" for i in range(0, len(lbs), step)])
    if last_row:
        ax.set_xlabel("chunk C")


def plot_phase_diagram(records: list[dict] | pd.DataFrame, calculator, *, family: str = "floor",
                       exp2_ftz: bool = True):
    """Rows: formats; columns: boundaries; cells: the worst status over the family's runs."""
    answers = _calculator_lookup(calculator)
    df = pd.DataFrame(records)
    df = df[(df["family"] == family) & (df["exp2_ftz"] == exp2_ftz)].copy()
    if df.empty:
        return None
    df["status"] = status_codes(df)
    lbs = sorted(df["lower_bound"].unique(), reverse=True)
    chunks = np.array(sorted(df["chunk"].unique()))
    fig, axes, formats, boundaries = _panel_grid(df)
    cmap = ListedColormap(_COLORS)
    norm = BoundaryNorm(np.arange(-0.5, 5.5), cmap.N)
    xe = _edges(chunks)
    for r, fmt in enumerate(formats):
        for c, b in enumerate(boundaries):
            ax = axes[r, c]
            m = _matrix(df[(df["format"] == fmt) & (df["boundary"] == b)], "status", lbs,
                        chunks)
            ax.pcolormesh(xe, np.arange(len(lbs) + 1) - 0.5, np.ma.masked_invalid(m),
                          cmap=cmap, norm=norm, rasterized=True)
            _dress_panel(ax, answers, lbs, fmt, b, exp2_ftz, chunks, xe, first_row=r == 0,
                         first_col=c == 0, last_row=r == len(formats) - 1)
    handles = [plt.Rectangle((0, 0), 1, 1, color=col) for col in _COLORS]
    line = plt.Line2D([], [], color="black", lw=1.6)
    dline = plt.Line2D([], [], color="gray", lw=1.2, ls="--")
    fig.legend(handles + [line, dline], STATUS + ["calculator max_chunk",
                                                  "calculator max_chunk_normal"],
               loc="lower center", ncol=4, fontsize=8, frameon=False)
    path = "kernel path: exp2 fp32 FTZ → cast" if exp2_ftz else "exp rounded once to the format"
    fig.suptitle(f"Scale factors exp(±(G − G_b)), {family} inputs ({path})", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig


def plot_error_heatmap(records: list[dict] | pd.DataFrame, calculator, column: str, *,
                       family: str = "floor", exp2_ftz: bool = True):
    """log10 of ``column`` (median over seeds); non-finite cells black."""
    answers = _calculator_lookup(calculator)
    df = pd.DataFrame(records)
    df = df[(df["family"] == family) & (df["exp2_ftz"] == exp2_ftz)].copy()
    if df.empty:
        return None
    df["_v"] = df[column].astype(float).replace([np.inf, -np.inf], np.nan)
    df["_bad"] = ~np.isfinite(df[column].astype(float))
    lbs = sorted(df["lower_bound"].unique(), reverse=True)
    chunks = np.array(sorted(df["chunk"].unique()))
    fig, axes, formats, boundaries = _panel_grid(df)
    xe = _edges(chunks)
    cmap = plt.get_cmap("viridis").with_extremes(bad="black")
    finite = df["_v"][df["_v"] > 0]
    lo = math.floor(np.log10(finite.min())) if len(finite) else -8
    hi = math.ceil(np.log10(finite.max())) if len(finite) else 0
    mesh = None
    for r, fmt in enumerate(formats):
        for c, b in enumerate(boundaries):
            ax = axes[r, c]
            sub = df[(df["format"] == fmt) & (df["boundary"] == b)]
            v = _matrix(sub, "_v", lbs, chunks, agg="median")
            bad = _matrix(sub, "_bad", lbs, chunks, agg="max")
            with np.errstate(divide="ignore", invalid="ignore"):
                z = np.log10(v)
            z[bad > 0] = np.nan
            mesh = ax.pcolormesh(xe, np.arange(len(lbs) + 1) - 0.5, np.ma.masked_invalid(z),
                                 cmap=cmap, vmin=lo, vmax=hi, rasterized=True)
            _dress_panel(ax, answers, lbs, fmt, b, exp2_ftz, chunks, xe, first_row=r == 0,
                         first_col=c == 0, last_row=r == len(formats) - 1)
    fig.suptitle(f"log10 {column}, {family} inputs (black: non-finite; line: calculator "
                 "max_chunk)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.92, 0.97))
    if mesh is not None:
        cax = fig.add_axes((0.93, 0.15, 0.015, 0.7))
        fig.colorbar(mesh, cax=cax)
    return fig


def calculator_table(calculator, lower_bounds=TABLE_LOWER_BOUNDS,
                     exp2_ftz: bool = True) -> pd.DataFrame:
    """The calculator's max_chunk (and max_chunk_normal where it differs), one row per (format,
    boundary), one column per lower bound."""
    df = pd.DataFrame(calculator)
    df = df[(df["exp2_ftz"] == exp2_ftz) & df["lower_bound"].isin(lower_bounds)]
    rows = []
    for (fmt, b), sub in df.groupby(["format", "boundary"], sort=False):
        row = {"format": fmt, "boundary": b}
        for r in sub.sort_values("lower_bound", ascending=False).itertuples(index=False):
            a = "∞" if pd.isna(r.max_chunk) else str(int(r.max_chunk))
            n = "∞" if pd.isna(r.max_chunk_normal) else str(int(r.max_chunk_normal))
            row[f"{r.lower_bound:g}"] = a if a == n else f"{a} ({n})"
        rows.append(row)
    return pd.DataFrame(rows)


def _save(fig, folder: Path, stem: str) -> list[Path]:
    if fig is None:
        return []
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    fig.savefig(paths[0], dpi=110, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def write_views(records: list[dict], calculator: list[dict],
                out: str | Path) -> tuple[list[Path], list[tuple[str, pd.DataFrame]]]:
    """All figures and tables of a dynamic-range run folder, from its records and the
    calculator's. Returns the files and the tables to show, (title, frame): the calculator's
    answers and the worst case measured against them."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    df = pd.DataFrame(records)
    if df.empty:
        return paths, []
    for ftz in sorted(df["exp2_ftz"].unique(), reverse=True):
        tag = "" if ftz else "-noftz"
        for family in sorted(df["family"].unique()):
            paths += _save(plot_phase_diagram(df, calculator, family=family,
                                              exp2_ftz=bool(ftz)), folder, f"phase-{family}{tag}")
            for col in ("l_rel_rmse", "inv_rel_rmse"):
                paths += _save(plot_error_heatmap(df, calculator, col, family=family,
                                                  exp2_ftz=bool(ftz)),
                               folder, f"{col.split('_')[0]}-error-{family}{tag}")
    lim = measured_limits(df, calculator)
    agree = agreement(df, calculator)
    calc = calculator_table(calculator)
    errs = error_summary(df)
    for name, frame in (("measured-limits", lim), ("agreement", agree),
                        ("calculator", calc), ("calculator-answers", pd.DataFrame(calculator)),
                        ("errors-lb-5", errs)):
        frame.to_csv(folder / f"{name}.csv", index=False)
        paths.append(folder / f"{name}.csv")
    shown = [("Calculator: max_chunk (max_chunk_normal where it differs), exp2 FTZ path", calc),
             ("Worst case: measured vs calculator", agree)]
    md = ["# Dynamic range: tables", ""]
    for title, frame in shown:
        md += [f"## {title}", "", markdown_table(frame)]
    if not errs.empty:
        md += ["## Errors at lower bound −5 (median over seeds)", "", markdown_table(errs)]
    (folder / "tables.md").write_text("\n".join(md), encoding="utf-8")
    paths.append(folder / "tables.md")
    return paths, shown
