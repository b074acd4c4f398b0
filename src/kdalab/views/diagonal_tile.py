"""Views of the diagonal-tile study, drawn from its records: the counted work and the error
tables (CSV and Markdown), and the error against the lower bound, one panel per (family, C)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator  # noqa: E402

from kdalab.studies.diagonal_tile import summarize  # noqa: E402
from kdalab.views.plots import log_errors, plot_series_with_nonfinite, save_figure  # noqa: E402
from kdalab.views.tables import markdown_table  # noqa: E402

__all__ = ["write_diagonal_tile_views"]


def plot_error_vs_lower_bound(errors, folder: Path):
    """rel RMSE of P against |lower bound|, one line per strategy; ticks at the swept bounds."""
    fams = list(dict.fromkeys(errors["family"]))
    chunks = sorted(errors["chunk"].unique())
    bounds = sorted(-errors["lower_bound"].unique())
    fig, axes = plt.subplots(len(fams), len(chunks), squeeze=False, sharey=True,
                             figsize=(3.8 * len(chunks), 3.2 * len(fams)))
    for r, fam in enumerate(fams):
        for c, ch in enumerate(chunks):
            ax = axes[r, c]
            sub = errors[(errors["family"] == fam) & (errors["chunk"] == ch)]
            groups = list(sub.groupby("strategy", sort=False))
            for slot, (strat, s) in enumerate(groups):
                s = s.sort_values("lower_bound")
                plot_series_with_nonfinite(ax, -s["lower_bound"].to_numpy(),
                                           s["rel_rmse"].to_numpy(dtype=float), label=strat,
                                           slot=slot, slots=len(groups))
            ax.set_xscale("log")
            log_errors(ax)
            # one labelled tick per swept bound, none in between (log axes label their minor
            # ticks too, which overlap)
            ax.xaxis.set_major_locator(FixedLocator(bounds))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([f"{b:g}" for b in bounds], fontsize=8)
            ax.set_xlim(min(bounds) / 1.3, max(bounds) * 1.3)
            ax.set_title(f"{fam}, C = {ch}")
            ax.set_xlabel("|lower bound|")
            if c == 0:
                ax.set_ylabel("rel RMSE of P (x on top: non-finite)")
    handles, labels = axes[0, -1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, folder, "diagonal-error")


def write_diagonal_tile_views(records: list[dict], out: str | Path) -> list[Path]:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tabs = summarize(records)
    paths = []
    for name, frame in tabs.items():
        frame.to_csv(folder / f"diagonal-{name}.csv", index=False)
        paths.append(folder / f"diagonal-{name}.csv")
    md = ["# Diagonal tile study", "", "## Work per chunk (counted)", "",
          markdown_table(tabs["work"]), "## rel RMSE of P vs float64 per-pair (median over seeds; "
          "inf: non-finite entries)", "", markdown_table(tabs["errors_wide"])]
    (folder / "diagonal-tables.md").write_text("\n".join(md), encoding="utf-8")
    paths.append(folder / "diagonal-tables.md")
    paths += plot_error_vs_lower_bound(tabs["errors"], folder)
    return paths

