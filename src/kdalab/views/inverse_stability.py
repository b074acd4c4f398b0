"""Views of the inverse-stability study, drawn from its records: per chunk size, heatmaps of the
inverse's (and the chunk output's) error over key spread × β, one panel per algorithm and decay,
with the contour where the error passes 1e-2, non-finite cells marked, and for the Neumann
products the contour the theory predicts (u·growth = 1e-2, or fp16 overflow); the summary table
(CSV and Markdown) the command computes from the same records."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kdalab.views.plots import save_figure  # noqa: E402
from kdalab.views.tables import markdown_table  # noqa: E402

__all__ = ["write_inverse_stability_views", "heatmap_grid", "LEVEL"]

LEVEL = 1e-2  # the failure threshold the contours mark
_LO, _HI = -16.0, 1.0  # colour range, log10 of the error
_NONFINITE = 2.0  # where a non-finite error is placed on the log10 scale (above _HI)


def heatmap_grid(frame: pd.DataFrame, column: str) -> tuple[list, list, np.ndarray]:
    """(spreads, betas, log10 errors [β, spread]) of one panel: finite errors clipped to the
    colour range [_LO, _HI], non-finite ones _NONFINITE (above it)."""
    spreads = sorted(frame["spread"].unique())
    betas = sorted(frame["beta"].unique())
    grid = np.full((len(betas), len(spreads)), np.nan)
    for r in frame.itertuples(index=False):
        v = getattr(r, column)
        val = min(max(math.log10(v), _LO), _HI) if math.isfinite(v) and v > 0 else (
            _LO if math.isfinite(v) else _NONFINITE)  # finite errors clipped to the colours
        grid[betas.index(r.beta), spreads.index(r.spread)] = val
    return spreads, betas, grid


def _predicted_grid(frame: pd.DataFrame) -> np.ndarray:
    spreads = sorted(frame["spread"].unique())
    betas = sorted(frame["beta"].unique())
    grid = np.full((len(betas), len(spreads)), np.nan)
    for r in frame.itertuples(index=False):
        p = _NONFINITE if r.predicted_overflow else (
            min(max(math.log10(r.predicted_error), _LO), _HI) if r.predicted_error > 0 else _LO)
        grid[betas.index(r.beta), spreads.index(r.spread)] = p
    return grid


def _panel(ax, sub: pd.DataFrame, column: str, theory: bool):
    spreads, betas, grid = heatmap_grid(sub, column)
    shown = np.ma.masked_where(grid >= _NONFINITE, grid)
    im = ax.imshow(shown, origin="lower", aspect="auto", cmap="viridis", vmin=_LO, vmax=_HI,
                   interpolation="nearest")
    bad = np.argwhere(grid >= _NONFINITE)
    for yi, xi in bad:  # non-finite: a red cross on a dark cell
        ax.add_patch(plt.Rectangle((xi - 0.5, yi - 0.5), 1, 1, color="0.15"))
        ax.plot(xi, yi, marker="x", color="red", markersize=6, mew=1.5)
    level = math.log10(LEVEL)
    xs, ys = np.arange(len(spreads)), np.arange(len(betas))
    if len(spreads) > 1 and len(betas) > 1:
        if np.nanmin(grid) < level <= np.nanmax(grid):
            ax.contour(xs, ys, grid, levels=[level], colors="white", linewidths=1.6)
        if theory:
            pred = _predicted_grid(sub)
            if np.nanmin(pred) < level <= np.nanmax(pred):
                ax.contour(xs, ys, pred, levels=[level], colors="orange", linewidths=1.4,
                           linestyles="dashed")
    ax.set_xticks(xs, [f"{s:g}" for s in spreads], fontsize=7)
    ax.set_yticks(ys, [f"{b:g}" for b in betas], fontsize=7)
    return im


def plot_chunk(records: pd.DataFrame, chunk: int, column: str, folder: Path) -> list[Path]:
    sub = records[records["chunk"] == chunk]
    algs = list(dict.fromkeys(sub["algorithm"]))
    decays = sorted(sub["decay"].unique(), reverse=True)
    fig, axes = plt.subplots(len(algs), len(decays), squeeze=False,
                             figsize=(2.3 * len(decays) + 1.2, 1.9 * len(algs) + 0.8))
    im = None
    for r, alg in enumerate(algs):
        for c, g in enumerate(decays):
            ax = axes[r, c]
            panel = sub[(sub["algorithm"] == alg) & (sub["decay"] == g)]
            im = _panel(ax, panel, column, theory=alg.endswith("neumann"))
            if r == 0:
                ax.set_title(f"decay g = {g:g} / step", fontsize=8)
            if c == 0:
                ax.set_ylabel(f"{alg}\nβ", fontsize=8)
            if r == len(algs) - 1:
                ax.set_xlabel("key spread s", fontsize=8)
    what = "(I + L)⁻¹ error max|ΔX|/max|X|" if column == "inverse_error" else \
        "chunk output rel. RMSE"
    fig.suptitle(f"C = {chunk}: log10 {what}; white: measured {LEVEL:g}, orange dashed: "
                 f"predicted (u·growth), red x: non-finite", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.9, 0.97))
    cax = fig.add_axes((0.92, 0.15, 0.015, 0.7))
    fig.colorbar(im, cax=cax).ax.tick_params(labelsize=7)
    stem = f"inverse-stability-C{chunk}-{'inverse' if column == 'inverse_error' else 'output'}"
    paths = save_figure(fig, folder, stem)
    plt.close(fig)
    return paths


def write_inverse_stability_views(records: list[dict], summary: list[dict],
                                  out: str | Path) -> list[Path]:
    """Heatmaps per chunk size (inverse and output error) and the summary table."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame.from_records(records)
    paths = []
    table = pd.DataFrame.from_records(summary)
    table.to_csv(folder / "inverse-stability-summary.csv", index=False)
    paths.append(folder / "inverse-stability-summary.csv")
    md = ["# Inverse stability", "", f"Grid points failing (error ≥ {LEVEL:g} or non-finite), "
          "worst finite errors, and for the Neumann products the points the theory predicts to "
          "fail (u·growth ≥ 1e-2 or fp16 overflow) and the failures it missed.", "",
          markdown_table(table.astype(object).where(table.notna(), "—"))]
    (folder / "inverse-stability-summary.md").write_text("\n".join(md), encoding="utf-8")
    paths.append(folder / "inverse-stability-summary.md")
    for chunk in sorted(frame["chunk"].unique()):
        for column in ("inverse_error", "output_error"):
            paths += plot_chunk(frame, int(chunk), column, folder)
    return paths
