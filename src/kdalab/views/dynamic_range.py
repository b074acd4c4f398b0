"""Views of the dynamic-range records: phase-diagram heatmaps with the calculator's boundary drawn
over the measurements, error heatmaps, and tables (Markdown and CSV). Drawn from records only; the
overlaid line is :func:`kdalab.kda.dynamic_range.safe_chunk`, computed, never typed in."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402

from kdalab.kda.dynamic_range import safe_chunk  # noqa: E402

__all__ = ["status_codes", "measured_limits", "agreement_table", "calculator_table",
           "plot_phase_diagram", "plot_error_heatmap", "write_views", "diagonal_tile_tables",
           "write_diagonal_tile_views"]

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


def _overlay(ax, lbs: list[float], fmt: str, boundary: str, ftz: bool, cmax: float) -> None:
    xs, xn, ys = [], [], []
    for i, lb in enumerate(lbs):
        sc = safe_chunk(fmt, lb, boundary, exp2_ftz=ftz)
        mc = cmax * 1.5 if sc.max_chunk is None else sc.max_chunk + 0.5
        mn = cmax * 1.5 if sc.max_chunk_normal is None else sc.max_chunk_normal + 0.5
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


def _dress_panel(ax, lbs, fmt, boundary, exp2_ftz, chunks, xe, *, first_row, first_col,
                 last_row) -> None:
    """The calculator's line, axes scales and limits, and the labels of a grid's edge panels."""
    _overlay(ax, lbs, fmt, boundary, exp2_ftz, chunks.max())
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


def plot_phase_diagram(records: list[dict] | pd.DataFrame, *, family: str = "floor",
                       exp2_ftz: bool = True):
    """Rows: formats; columns: boundaries; cells: the worst status over the family's runs."""
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
            _dress_panel(ax, lbs, fmt, b, exp2_ftz, chunks, xe, first_row=r == 0,
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


def plot_error_heatmap(records: list[dict] | pd.DataFrame, column: str, *,
                       family: str = "floor", exp2_ftz: bool = True):
    """log10 of ``column`` (median over seeds); non-finite cells black."""
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
            _dress_panel(ax, lbs, fmt, b, exp2_ftz, chunks, xe, first_row=r == 0,
                         first_col=c == 0, last_row=r == len(formats) - 1)
    fig.suptitle(f"log10 {column}, {family} inputs (black: non-finite; line: calculator "
                 "max_chunk)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.92, 0.97))
    if mesh is not None:
        cax = fig.add_axes((0.93, 0.15, 0.015, 0.7))
        fig.colorbar(mesh, cax=cax)
    return fig


def measured_limits(records: list[dict] | pd.DataFrame, family: str = "floor") -> pd.DataFrame:
    """Per (format, exp2 path, boundary, lower bound): the largest swept C up to which every
    chunk's factors were finite and non-zero (``measured``), and all normal, next to the
    calculator's answers clipped to the grid."""
    df = pd.DataFrame(records)
    df = df[df["family"] == family]
    rows = []
    for (fmt, ftz, b, lb), sub in df.groupby(["format", "exp2_ftz", "boundary", "lower_bound"],
                                             sort=False):
        sub = sub.groupby("chunk")[["scales_ok", "scales_normal"]].min().sort_index()
        chunks = sub.index.to_numpy()

        def first_fail(col):
            bad = chunks[sub[col].to_numpy() == 0]
            good = chunks[chunks < bad.min()] if len(bad) else chunks
            return int(good.max()) if len(good) else 0

        sc = safe_chunk(fmt, lb, b, exp2_ftz=bool(ftz))

        def clip(v):  # the calculator's answer as the grid can see it
            v = math.inf if v is None else v
            inside = chunks[chunks <= v]
            return int(inside.max()) if len(inside) else 0

        m, mn = first_fail("scales_ok"), first_fail("scales_normal")
        rows.append({"format": fmt, "exp2_ftz": bool(ftz), "boundary": b, "lower_bound": lb,
                     "measured_max_chunk": m, "calculator_max_chunk": sc.max_chunk,
                     "measured_max_chunk_normal": mn,
                     "calculator_max_chunk_normal": sc.max_chunk_normal,
                     "calculator_in_grid": clip(sc.max_chunk),
                     "agree": clip(sc.max_chunk) == m and clip(sc.max_chunk_normal) == mn,
                     "guarantee_holds": m >= clip(sc.max_chunk)})
    return pd.DataFrame(rows)


def agreement_table(records) -> pd.DataFrame:
    """Worst case: measured limit == calculator (``agree``); model-like: every chunk up to the
    calculator's limit was measured safe (``model_like_holds``), and the median ratio of the
    measured model-like limit to the calculator's."""
    lim = measured_limits(records)
    out = lim.groupby(["format", "exp2_ftz", "boundary"], as_index=False, sort=False).agg(
        cases=("agree", "size"), agree=("agree", "sum"))
    if "model_like" in set(pd.DataFrame(records)["family"]):
        ml = measured_limits(records, family="model_like")
        ml = ml[ml["calculator_in_grid"] > 0]
        ml["ratio"] = ml["measured_max_chunk"] / ml["calculator_in_grid"]
        agg = ml.groupby(["format", "exp2_ftz", "boundary"], as_index=False, sort=False).agg(
            model_like_holds=("guarantee_holds", "sum"),
            model_like_cases=("guarantee_holds", "size"),
            model_like_ratio_median=("ratio", "median"))
        out = out.merge(agg, on=["format", "exp2_ftz", "boundary"], how="left")
    return out


def calculator_table(lower_bounds=(-1, -2, -3, -5, -8, -10, -20),
                     formats=("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2"),
                     boundaries=("start", "midpoint", "end", "per_pair"),
                     exp2_ftz: bool = True) -> pd.DataFrame:
    """The calculator's max_chunk (and max_chunk_normal where it differs) over a grid."""
    rows = []
    for fmt in formats:
        for b in boundaries:
            row = {"format": fmt, "boundary": b}
            for lb in lower_bounds:
                sc = safe_chunk(fmt, lb, b, exp2_ftz=exp2_ftz)
                a = "∞" if sc.max_chunk is None else str(sc.max_chunk)
                n = "∞" if sc.max_chunk_normal is None else str(sc.max_chunk_normal)
                row[f"{lb:g}"] = a if a == n else f"{a} ({n})"
            rows.append(row)
    return pd.DataFrame(rows)


def _markdown(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]
    for row in frame.itertuples(index=False):
        cells = []
        for v in row:
            cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _error_summary(records) -> pd.DataFrame:
    """Median L / INV error at the chunk sizes of the seed's table, bf16 and lower bound −5."""
    df = pd.DataFrame(records)
    out = df[(df["lower_bound"] == -5.0) & (df["chunk"].isin([8, 16, 17, 18, 19, 32, 64, 128]))]
    if out.empty:
        return out
    return out.groupby(["family", "format", "exp2_ftz", "boundary", "chunk"], as_index=False).agg(
        overflow=("overflow", "max"), zero=("zero", "max"),
        l_rel_rmse=("l_rel_rmse", "median"), inv_rel_rmse=("inv_rel_rmse", "median"))


def _save(fig, folder: Path, stem: str) -> list[Path]:
    if fig is None:
        return []
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    fig.savefig(paths[0], dpi=110, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def write_views(records: list[dict], out: str | Path) -> list[Path]:
    """All figures and tables of a dynamic-range run folder."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    df = pd.DataFrame(records)
    if df.empty:
        return paths
    for ftz in sorted(df["exp2_ftz"].unique(), reverse=True):
        tag = "" if ftz else "-noftz"
        for family in sorted(df["family"].unique()):
            paths += _save(plot_phase_diagram(df, family=family, exp2_ftz=bool(ftz)), folder,
                           f"phase-{family}{tag}")
            for col in ("l_rel_rmse", "inv_rel_rmse"):
                paths += _save(plot_error_heatmap(df, col, family=family, exp2_ftz=bool(ftz)),
                               folder, f"{col.split('_')[0]}-error-{family}{tag}")
    lim = measured_limits(df)
    agree = agreement_table(df)
    calc = calculator_table()
    errs = _error_summary(df)
    for name, frame in (("measured-limits", lim), ("agreement", agree),
                        ("calculator", calc), ("errors-lb-5", errs)):
        frame.to_csv(folder / f"{name}.csv", index=False)
        paths.append(folder / f"{name}.csv")
    md = ["# Dynamic range: tables", "",
          "## Calculator: max_chunk (max_chunk_normal where it differs), exp2 FTZ path", "",
          _markdown(calc), "## Worst case: measured vs calculator", "", _markdown(agree)]
    if not errs.empty:
        md += ["## Errors at lower bound −5 (median over seeds)", "", _markdown(errs)]
    (folder / "tables.md").write_text("\n".join(md), encoding="utf-8")
    paths.append(folder / "tables.md")
    return paths


# --- the diagonal-tile study -----------------------------------------------------------------

def diagonal_tile_tables(records: list[dict]) -> dict[str, pd.DataFrame]:
    """Work per chunk (counted) and error (median over seeds) per strategy and lower bound."""
    df = pd.DataFrame(records)
    work = (df.groupby(["chunk", "strategy"], sort=False, as_index=False)
            [["exps", "scalings", "gemm_macs", "dot_macs"]].first())
    work["gemm_share"] = work["gemm_macs"] / (work["gemm_macs"] + work["dot_macs"])
    err = df.groupby(["family", "chunk", "strategy", "lower_bound"], sort=False,
                     as_index=False).agg(rel_rmse=("rel_rmse", "median"),
                                         nonfinite=("nonfinite_entries", "max"),
                                         lost=("lost_entries", "max"))
    wide = err.pivot_table(index=["family", "chunk", "strategy"], columns="lower_bound",
                           values="rel_rmse", aggfunc="first", sort=False)
    wide = wide[sorted(wide.columns, reverse=True)]
    wide.columns = [f"lb {c:g}" for c in wide.columns]
    return {"work": work, "errors": err, "errors_wide": wide.reset_index()}


def write_diagonal_tile_views(records: list[dict], out: str | Path) -> list[Path]:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tabs = diagonal_tile_tables(records)
    paths = []
    for name, frame in tabs.items():
        frame.to_csv(folder / f"diagonal-{name}.csv", index=False)
        paths.append(folder / f"diagonal-{name}.csv")
    md = ["# Diagonal tile study", "", "## Work per chunk (counted)", "",
          _markdown(tabs["work"]), "## rel RMSE of P vs float64 per-pair (median over seeds; "
          "inf: non-finite entries)", "", _markdown(tabs["errors_wide"])]
    (folder / "diagonal-tables.md").write_text("\n".join(md), encoding="utf-8")
    paths.append(folder / "diagonal-tables.md")
    # error vs lower bound, one panel per chunk
    df = tabs["errors"]
    fams = list(dict.fromkeys(df["family"]))
    chunks = sorted(df["chunk"].unique())
    fig, axes = plt.subplots(len(fams), len(chunks), squeeze=False, sharey=True,
                             figsize=(3.6 * len(chunks), 3.0 * len(fams)))
    for r, fam in enumerate(fams):
        for c, ch in enumerate(chunks):
            ax = axes[r, c]
            sub = df[(df["family"] == fam) & (df["chunk"] == ch)]
            for strat, s in sub.groupby("strategy", sort=False):
                s = s.sort_values("lower_bound")
                x = -s["lower_bound"].to_numpy()
                y = s["rel_rmse"].to_numpy(dtype=float)
                fin = np.isfinite(y)
                line, = ax.plot(x[fin], y[fin], marker="o", label=strat)
                if (~fin).any():
                    ax.scatter(x[~fin], np.ones((~fin).sum()), marker="x", s=50,
                               color=line.get_color(), transform=ax.get_xaxis_transform(),
                               clip_on=False)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{fam}, C = {ch}")
            ax.set_xlabel("|lower bound|")
            if c == 0:
                ax.set_ylabel("rel RMSE of P (x on top: non-finite)")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    paths += _save(fig, folder, "diagonal-error")
    return paths
