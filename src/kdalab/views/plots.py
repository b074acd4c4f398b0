"""Plots drawn from records. Non-finite values are drawn as markers on the top edge of the axes
(labelled), never dropped."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kdalab.experiments.aggregate import summarize  # noqa: E402

__all__ = ["plot_error_vs_chunk", "save_figure", "plot_series_with_nonfinite"]


def save_figure(fig, folder: str | Path, stem: str) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    fig.savefig(paths[0], dpi=130, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def plot_series_with_nonfinite(ax, x, y, *, label: str, **kw) -> None:
    """Plot finite points as a line; non-finite ones as 'x' markers pinned to the top edge."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    finite = np.isfinite(y) & (y > 0)
    line, = ax.plot(x[finite], y[finite], marker="o", label=label, **kw)
    bad = ~np.isfinite(y)
    if bad.any():
        ax.scatter(x[bad], np.ones(bad.sum()), marker="x", s=60, color=line.get_color(),
                   transform=ax.get_xaxis_transform(), clip_on=False, zorder=5,
                   label=f"{label}: non-finite")


def plot_error_vs_chunk(records: list[dict] | pd.DataFrame, folder: str | Path,
                        stem: str = "error_vs_chunk") -> list[Path]:
    """Median INV total and INV power error against chunk size, one panel per family, one line per
    (accumulation, lower bound, dim)."""
    summary = summarize(records)
    from kdalab.experiments.families import FAMILIES

    present = set(summary["family"])
    families = [f for f in FAMILIES if f in present] + sorted(present - set(FAMILIES))
    fig, axes = plt.subplots(1, max(len(families), 1), figsize=(5.2 * max(len(families), 1), 4.2),
                             squeeze=False)
    def key(acc, lb, d):  # NaN (no lower bound) never equals itself: use a label instead
        return (acc, "none" if math.isnan(lb) else lb, d)

    configs = [key(*k) for k in
               summary.groupby(["accumulation", "lower_bound", "dim"], dropna=False).groups]
    colors = plt.get_cmap("tab20" if len(configs) > 10 else "tab10")
    for ax, fam in zip(axes[0], families):
        g = summary[summary["family"] == fam]
        for (acc, lb, d), s in g.groupby(["accumulation", "lower_bound", "dim"], dropna=False):
            s = s.sort_values("chunk")
            tag = f"{acc}, d={d}" + ("" if math.isnan(lb) or lb == -5.0 else f", lb={lb:g}")
            color = colors(configs.index(key(acc, lb, d)) % colors.N)  # one per configuration
            plot_series_with_nonfinite(ax, s["chunk"], s["inv_total_rel_rmse_median"],
                                       label=f"INV total ({tag})", color=color)
            plot_series_with_nonfinite(ax, s["chunk"], s["inv_stable_l_rel_rmse_median"],
                                       label=f"INV power ({tag})", linestyle="--", color=color)
        ax.set_yscale("log")
        lo, hi = float(g["chunk"].min()), float(g["chunk"].max())
        pad = max(1.0, 0.04 * (hi - lo))
        ax.set_xlim(lo - pad, hi + pad)  # non-finite markers don't widen the axes themselves
        ax.set_xlabel("chunk size C")
        ax.set_ylabel("relative RMSE (median over seeds)")
        ax.set_title(fam)
        ax.axvline(16, color="grey", linewidth=0.8, linestyle=":")
        ax.grid(True, which="both", alpha=0.3)
        # legends go under the panels, where they hide no data
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1,
                  frameon=False)
    fig.suptitle("(I + L)^-1 error against chunk size (x on the top edge: non-finite)")
    return save_figure(fig, folder, stem)
