"""Plots drawn from records. Non-finite values are drawn as markers on the top edge of the axes,
never dropped; markers of different series at the same x sit side by side, not on each other.
Series with identical data are drawn once, with a combined label."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullLocator  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

from kdalab.inputs.families import FAMILIES  # noqa: E402

__all__ = ["plot_error_vs_chunk", "save_figure", "plot_series_with_nonfinite", "log_errors"]

#: horizontal distance between the non-finite markers of neighbouring series, in points
MARKER_STEP_PT = 4.0
#: one marker shape per configuration, drawn smaller for each later one: where two lines
#: coincide, the later one's markers sit visibly inside the earlier one's
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


#: the PNG's resolution, dots per inch
PNG_DPI = 130


def save_figure(fig, folder: str | Path, stem: str) -> list[Path]:
    """``fig`` as ``stem``.png and ``stem``.svg in ``folder``, both cut to the figure's tight
    box (padded by :rc:`savefig.pad_inches`). The box is measured once, at the PNG's resolution,
    on the renderer that laid the figure out (its text metrics cached), and each format is then
    drawn once: ``bbox_inches="tight"`` would lay every text out again per format. Both files
    are the same bytes for the same data."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    fig.set_dpi(PNG_DPI)
    box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(
        matplotlib.rcParams["savefig.pad_inches"])
    fig.set_layout_engine(None)  # laid out already: no layout pass again in savefig

    fig.savefig(paths[0], dpi=PNG_DPI, bbox_inches=box)
    # the same bytes for the same data: no date, ids salted with a constant
    with matplotlib.rc_context({"svg.hashsalt": "kdalab"}):
        fig.savefig(paths[1], bbox_inches=box, metadata={"Date": None})
    plt.close(fig)
    return paths


def plot_series_with_nonfinite(ax, x, y, *, label: str, slot: int = 0, slots: int = 1,
                               **kw) -> None:
    """Finite points as a line, with the ``slot``'s marker (shape and size: coinciding series
    stay visible); non-finite ones as 'x' markers pinned to the top edge, shifted sideways by
    the slot so that markers at one x stay apart."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    finite = np.isfinite(y) & (y > 0)
    kw.setdefault("marker", MARKERS[slot % len(MARKERS)])
    kw.setdefault("markersize", max(3.0, 7.0 - 1.2 * slot))
    line, = ax.plot(x[finite], y[finite], label=label, zorder=2 + slot, **kw)
    bad = ~np.isfinite(y)
    if bad.any():
        shift = (slot - (slots - 1) / 2) * MARKER_STEP_PT
        where = offset_copy(ax.get_xaxis_transform(), fig=ax.figure, x=shift, y=0, units="points")
        ax.scatter(x[bad], np.ones(bad.sum()), marker="x", s=40, color=line.get_color(),
                   transform=where, clip_on=False, zorder=5, label="_nolegend_")


_SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def decade_label(y: float, _pos=None) -> str:
    """A log axis' major tick label, 10ⁿ in Unicode superscripts: plain text, where matplotlib's
    own labels are mathtext, which costs a parse per distinct label (about a fifth of the error
    plot's drawing under cProfile). A tick between decades keeps its value (``%g``)."""
    if not y > 0 or not math.isfinite(y):
        return ""
    exponent = round(math.log10(y))
    if not math.isclose(y, 10.0 ** exponent, rel_tol=1e-9):
        return f"{y:g}"
    return "10" + str(exponent).translate(_SUPERSCRIPTS)


def log_errors(ax) -> bool:
    """A log-scaled error axis (decades labelled by :func:`decade_label`; minor ticks only where
    the errors span less than two decades) where the panel holds a finite non-zero error; else
    (every error non-finite or exactly 0: nothing a log axis can place) a linear axis without
    ticks and a note saying so, the non-finite markers still on its top edge. Returns whether
    it is log."""
    drawn = [np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()]
    placed = np.concatenate([y[np.isfinite(y) & (y > 0)] for y in drawn] or [np.empty(0)])
    if placed.size:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(decade_label))
        if placed.max() >= 100 * placed.min():  # decades enough to read by: no minor ticks
            ax.yaxis.set_minor_locator(NullLocator())  # (~150 Tick artists, a fifth of a plot)
        return True
    ax.set_ylim(0.0, 1.0)
    ax.set_yticks([])
    ax.text(0.5, 0.5, "no finite non-zero error to draw\n(x on the top edge: non-finite)",
            transform=ax.transAxes, ha="center", va="center", fontsize=8, color="dimgrey")
    return False


def _series_key(s: pd.DataFrame) -> tuple:
    """The data a configuration draws, as a hashable value (identical series share it)."""
    columns = ("chunk", "inv_total_rel_rmse_median", "inv_stable_l_rel_rmse_median")
    return tuple(s[c].to_numpy(dtype=float).tobytes() for c in columns)


def plot_error_vs_chunk(summary: pd.DataFrame, folder: str | Path,
                        stem: str = "error_vs_chunk") -> list[Path]:
    """Median INV total (solid) and INV power (dashed) error against chunk size, one panel per
    family, one colour per (accumulation, lower bound, dim). Configurations whose two series are
    identical (e.g. fp16-seq and fp16-once where no sum rounds differently) are drawn once, their
    names joined by '='. Drawn from the records' aggregates
    (:func:`kdalab.studies.aggregate.summarize`)."""
    present = set(summary["family"])
    families = [f for f in FAMILIES if f in present] + sorted(present - set(FAMILIES))
    fig, axes = plt.subplots(1, max(len(families), 1), figsize=(5.2 * max(len(families), 1), 4.4),
                             squeeze=False, dpi=PNG_DPI)  # laid out as the PNG is drawn
    series: list[tuple[str, pd.DataFrame]] = []  # (label, rows) per distinct configuration
    for (acc, lb, d), s in summary.groupby(["accumulation", "lower_bound", "dim"], dropna=False,
                                          sort=True):
        tag = f"d={d}" + ("" if math.isnan(lb) or lb == -5.0 else f", lb={lb:g}")
        series.append((acc, tag, s.sort_values("chunk")))
    tags = list(dict.fromkeys(tag for _, tag, _ in series))
    accs = list(dict.fromkeys(acc for acc, _, _ in series))
    colors = plt.get_cmap("tab20" if len(accs) * len(tags) > 10 else "tab10")
    legend: dict[str, tuple] = {}  # label -> (colour, marker)
    for ax, fam in zip(axes[0], families):
        drawn: dict[tuple, list[str]] = {}
        groups: dict[tuple, tuple[str, pd.DataFrame]] = {}
        for acc, tag, s in series:
            rows = s[s["family"] == fam]
            if rows.empty:
                continue
            key = (tag, _series_key(rows))
            drawn.setdefault(key, []).append(acc)
            groups.setdefault(key, (tag, rows))
        for slot, (key, names) in enumerate(drawn.items()):
            tag, rows = groups[key]
            label = f"{' = '.join(names)}, {tag}"
            color, _ = legend.setdefault(label, (colors(len(legend) % colors.N),
                                                 MARKERS[len(legend) % len(MARKERS)]))
            marker = legend[label][1]
            plot_series_with_nonfinite(ax, rows["chunk"], rows["inv_total_rel_rmse_median"],
                                       label=label, color=color, marker=marker, slot=slot,
                                       slots=len(drawn))
            plot_series_with_nonfinite(ax, rows["chunk"], rows["inv_stable_l_rel_rmse_median"],
                                       label="_nolegend_", linestyle="--", color=color,
                                       marker=marker, slot=slot, slots=len(drawn))
        g = summary[summary["family"] == fam]
        log_errors(ax)
        lo, hi = float(g["chunk"].min()), float(g["chunk"].max())
        pad = max(1.0, 0.04 * (hi - lo))
        ax.set_xlim(lo - pad, hi + pad)  # non-finite markers don't widen the axes themselves
        ax.set_xlabel("chunk size C")
        ax.set_ylabel("relative RMSE (median over seeds)")
        ax.set_title(fam, y=1.0, pad=8)  # placed, not fitted: above the top edge's markers
        ax.axvline(16, color="grey", linewidth=0.8, linestyle=":")
        ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=c, marker=m, label=lab) for lab, (c, m) in legend.items()]
    handles += [Line2D([], [], color="black", label="INV total"),
                Line2D([], [], color="black", linestyle="--", label="INV power"),
                Line2D([], [], color="black", marker="x", linestyle="", label="non-finite")]
    # under the panels, where it hides no data
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(4, len(handles)), fontsize=8, frameon=False)
    fig.suptitle("(I + L)^-1 error against chunk size (x on the top edge: non-finite)")
    _panel_margins(fig, len(axes[0]))
    return save_figure(fig, folder, stem)


#: The error plot's margins in inches: left of each panel (its y label and log tick labels),
#: right, top (the title and the panels' titles) and bottom (the tick labels and x label; the
#: legend hangs below the figure and the saved box takes it in). ``tight_layout`` measured
#: 0.77 / 0.15 / 0.68 / 0.58 in for these texts; fixed, with room for wider tick labels
#: (10⁻¹²), since its layout pass is work the tight box then does again. The saved figure is
#: cut to its tight box, so the outer margins never show as blank space.
PANEL_MARGINS_IN = {"left": 0.85, "right": 0.15, "top": 0.70, "bottom": 0.60}
#: the axis labels' distance from the axes, inches (past the widest tick labels: 10⁻¹²)
LABEL_OFFSET_IN = {"x": 0.30, "y": 0.62}


def _panel_margins(fig, panels: int) -> None:
    """Place a row of ``panels`` axes with :data:`PANEL_MARGINS_IN` (no layout pass)."""
    width, height = fig.get_size_inches()
    m = PANEL_MARGINS_IN
    axis = (width - m["left"] - m["right"] - (panels - 1) * m["left"]) / panels
    fig.subplots_adjust(left=m["left"] / width, right=1 - m["right"] / width,
                        top=1 - m["top"] / height, bottom=m["bottom"] / height,
                        wspace=m["left"] / axis)
    axis_height = height - m["top"] - m["bottom"]
    for ax in fig.axes:  # the axis labels placed, not fitted to the tick labels
        ax.yaxis.set_label_coords(-LABEL_OFFSET_IN["y"] / axis, 0.5)
        ax.xaxis.set_label_coords(0.5, -LABEL_OFFSET_IN["x"] / axis_height)
