"""Views of the end-to-end study, drawn from its records only: a summary table (CSV and Markdown),
error-against-chunk plots and gate × chunk heat maps (PNG and SVG). A cell where any run produced a
non-finite output or state is shown as non-finite (an ``x`` on the top edge of a line plot, a
hatched grey ``inf`` cell in a heat map), never dropped."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kdalab.studies.end_to_end import summarize  # noqa: E402
from kdalab.views.plots import log_errors, plot_series_with_nonfinite, save_figure  # noqa: E402
from kdalab.views.tables import fmt_sci, markdown_table  # noqa: E402

__all__ = ["e2e_table", "write_e2e_views", "plot_error_vs_chunk_e2e",
           "plot_gate_chunk_heatmaps", "GATE_ORDER"]

_FAMILY_ORDER = ("model_like", "saturated", "weak_decay_correlated", "long")


def GATE_ORDER(gates) -> list[str]:
    """lb=-1, lb=-2, … by decreasing bound, then unbounded."""
    def key(g):
        return (1, 0.0) if g == "unbounded" else (0, -float(g.split("=")[1]))
    return sorted(set(gates), key=key)


def e2e_table(summary: pd.DataFrame, value: str = "shown_o") -> pd.DataFrame:
    """Rows (family, gate, variant), one column per chunk size."""
    t = summary.pivot_table(index=["family", "gate", "variant"], columns="chunk", values=value,
                            aggfunc="first")
    t.columns = [f"C={c}" for c in t.columns]
    fam_rank = {f: i for i, f in enumerate(_FAMILY_ORDER)}
    t = t.reset_index()
    gates = GATE_ORDER(t["gate"])
    t["_f"] = t["family"].map(lambda f: fam_rank.get(f, 99))
    t["_g"] = t["gate"].map(gates.index)
    return t.sort_values(["_f", "_g", "variant"]).drop(columns=["_f", "_g"]).reset_index(drop=True)


def plot_error_vs_chunk_e2e(summary: pd.DataFrame, folder, *, gate: str = "lb=-5",
                            value: str = "shown_o", stem: str | None = None) -> list[Path]:
    """Error against chunk size, one panel per family, one line per variant, for one gate."""
    sub = summary[summary["gate"] == gate]
    fams = [f for f in _FAMILY_ORDER if f in set(sub["family"])]
    if not fams:
        return []
    fig, axes = plt.subplots(1, len(fams), figsize=(5.4 * len(fams), 4.6), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        s_f = sub[sub["family"] == fam]
        groups = list(s_f.groupby("variant", sort=False))
        for slot, (variant, s) in enumerate(groups):
            s = s.sort_values("chunk")
            plot_series_with_nonfinite(ax, s["chunk"], s[value], label=variant, slot=slot,
                                       slots=len(groups))
        ax.set_xscale("log", base=2)
        log_errors(ax)
        chunks = sorted(s_f["chunk"].unique())
        ax.set_xlim(chunks[0] / 1.25, chunks[-1] * 1.25)  # set: non-finite markers don't widen
        ax.set_xticks(chunks)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("chunk size C")
        ax.set_ylabel("relative RMSE vs fp64 recurrent (median)")
        ax.set_title(f"{fam}, {gate}")
        ax.grid(True, which="both", alpha=0.3)
    handles: dict = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=4, fontsize=7,
               bbox_to_anchor=(0.5, -0.02 - 0.035 * math.ceil(len(handles) / 4)))
    what = "output" if value == "shown_o" else "final state"
    fig.suptitle(f"Layer {what} error against chunk size (x on the top edge: non-finite)")
    return save_figure(fig, folder, stem or f"e2e_{'output' if value == 'shown_o' else 'state'}"
                       f"_vs_chunk_{gate.replace('=', '').replace('-', 'm')}")


def plot_gate_chunk_heatmaps(summary: pd.DataFrame, folder, *, value: str = "shown_o",
                             stem: str = "e2e_gate_chunk") -> list[Path]:
    """log10 error over (gate × chunk), one panel per (family, variant); non-finite hatched."""
    fams = [f for f in _FAMILY_ORDER if f in set(summary["family"])]
    variants = list(dict.fromkeys(summary["variant"]))
    if not fams or not variants:
        return []
    gates = GATE_ORDER(summary["gate"])
    chunks = sorted(summary["chunk"].unique())
    fig, axes = plt.subplots(len(fams), len(variants),
                             figsize=(2.3 * len(variants) + 1.5, 2.1 * len(fams) + 0.8),
                             squeeze=False)
    vmin, vmax = -8, 1
    im = None
    for r, fam in enumerate(fams):
        for c, variant in enumerate(variants):
            ax = axes[r][c]
            s = summary[(summary["family"] == fam) & (summary["variant"] == variant)]
            grid = np.full((len(gates), len(chunks)), np.nan)
            for row in s.itertuples(index=False):
                grid[gates.index(row.gate), chunks.index(row.chunk)] = getattr(row, value)
            bad = ~np.isfinite(grid) & ~np.isnan(grid)
            shown = np.where(np.isfinite(grid), np.log10(np.clip(grid, 1e-300, None)), np.nan)
            im = ax.imshow(shown, vmin=vmin, vmax=vmax, cmap="viridis", aspect="auto")
            for (i, j) in zip(*np.nonzero(bad)):
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="lightgrey",
                                           hatch="xx", edgecolor="dimgrey", linewidth=0))
                ax.text(j, i, "inf", ha="center", va="center", fontsize=6, color="black")
            for (i, j) in zip(*np.nonzero(np.isfinite(grid))):
                ax.text(j, i, f"{np.log10(max(grid[i, j], 1e-300)):.1f}", ha="center",
                        va="center", fontsize=5, color="white" if shown[i, j] < -3 else "black")
            ax.set_xticks(range(len(chunks)), [str(x) for x in chunks], fontsize=6)
            ax.set_yticks(range(len(gates)), gates if c == 0 else [""] * len(gates), fontsize=6)
            if r == 0:
                ax.set_title(variant.replace("/", "\n"), fontsize=6)
            if c == 0:
                ax.set_ylabel(fam, fontsize=7)
            if r == len(fams) - 1:
                ax.set_xlabel("C", fontsize=6)
    what = "output" if value == "shown_o" else "final state"
    fig.suptitle(f"log10 relative RMSE of the {what} vs fp64 (median over seeds; "
                 f"hatched: non-finite)", fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.6, label="log10 rel. RMSE")
    return save_figure(fig, folder, stem)


def write_e2e_views(records: list[dict] | pd.DataFrame, folder) -> tuple[list[Path], pd.DataFrame]:
    """Every view into ``folder``; returns the paths and the output-error table."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = summarize(records)
    paths = []
    summary.to_csv(folder / "e2e_summary.csv", index=False)
    paths.append(folder / "e2e_summary.csv")
    out_tab = e2e_table(summary, "shown_o")
    state_tab = e2e_table(summary, "shown_state")
    for name, tab, title in (("e2e_output_table", out_tab, "Output"),
                             ("e2e_state_table", state_tab, "Final state")):
        tab.to_csv(folder / f"{name}.csv", index=False)
        (folder / f"{name}.md").write_text(
            f"## {title} relative RMSE vs fp64 recurrent (median over seeds; ∞ where any run "
            f"is non-finite)\n\n" + markdown_table(tab, fmt_sci), encoding="utf-8")
        paths += [folder / f"{name}.csv", folder / f"{name}.md"]
    gates = GATE_ORDER(summary["gate"])
    for gate in [g for g in ("lb=-5", "unbounded") if g in gates] or gates[:1]:
        paths += plot_error_vs_chunk_e2e(summary, folder, gate=gate)
    paths += plot_error_vs_chunk_e2e(summary, folder, gate=gates[0] if "lb=-5" not in gates
                                     else "lb=-5", value="shown_state")
    paths += plot_gate_chunk_heatmaps(summary, folder)
    paths += plot_gate_chunk_heatmaps(summary, folder, value="shown_state",
                                      stem="e2e_gate_chunk_state")
    return paths, out_tab
