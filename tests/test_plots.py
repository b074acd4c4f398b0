"""The figures' files: both formats written, whole (cut to matplotlib's own tight box, a
legend under the panels or a colorbar included), and readable."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import kdalab.views.plots as plots
from kdalab.views import end_to_end


def _summary() -> pd.DataFrame:
    """Three families, five configurations (a tall legend under the panels), a non-finite
    point and a series identical to another (drawn once, names joined)."""
    rows = []
    for fam in ("floor", "weak_decay_correlated", "model_like"):
        for acc, lb in (("fp16-seq", -5.0), ("fp16-once", -5.0), ("h200", -5.0),
                        ("fp32", float("nan")), ("h200", -3.0)):
            for c in (2, 4, 8, 16, 32):
                scale = {"fp16-seq": 1.0, "fp16-once": 1.0, "h200": 3.0, "fp32": 1e-3}[acc]
                total = math.inf if (fam == "floor" and c == 32) else scale * 1e-6 * c
                rows.append({"family": fam, "lower_bound": lb, "chunk": c, "dim": 128,
                             "accumulation": acc, "inv_total_rel_rmse_median": total,
                             "inv_stable_l_rel_rmse_median": scale * 1e-7 * c})
    return pd.DataFrame(rows)


def _svg_size(path) -> tuple[float, float]:
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    return float(root.get("width").removesuffix("pt")), float(root.get("height").removesuffix("pt"))


def _e2e_summary() -> pd.DataFrame:
    rows = [{"family": fam, "gate": gate, "variant": var, "chunk": c,
             "shown_o": math.inf if (gate == "unbounded" and c == 64) else 1e-5 * c}
            for fam in ("model_like", "long") for gate in ("lb=-5", "unbounded")
            for var in ("fp32", "bf16/fp32") for c in (16, 32, 64)]
    return pd.DataFrame(rows)


def _error_plot(folder):
    return plots.plot_error_vs_chunk(_summary(), folder)


def _heatmaps(folder):  # a colorbar, no tight_layout
    return end_to_end.plot_gate_chunk_heatmaps(_e2e_summary(), folder)


@pytest.mark.parametrize("module, draw, stem, panels", [
    (plots, _error_plot, "error_vs_chunk", 3),
    (end_to_end, _heatmaps, "e2e_gate_chunk", 2 * 2 + 1),
])
def test_figures_write_both_formats_cut_to_the_tight_box(tmp_path, monkeypatch, module, draw,
                                                         stem, panels):
    save = plots.save_figure

    def with_reference(fig, folder, stem):
        # matplotlib's own tight box at the PNG's resolution: what save_figure must match
        fig.savefig(tmp_path / "ref.png", dpi=plots.PNG_DPI, bbox_inches="tight")
        return save(fig, folder, stem)

    monkeypatch.setattr(module, "save_figure", with_reference)
    paths = draw(tmp_path / "out")
    assert [p.name for p in paths] == [f"{stem}.png", f"{stem}.svg"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    with Image.open(paths[0]) as png, Image.open(tmp_path / "ref.png") as ref:
        # the same box to a pixel (the two measure it on different renderers: a rounding apart)
        assert abs(png.width - ref.width) <= 1 and abs(png.height - ref.height) <= 1
        # not blank: the panels' lines and markers are drawn
        assert len(np.unique(np.asarray(png.convert("RGB")).reshape(-1, 3), axis=0)) > 50
        box = (png.width / plots.PNG_DPI * 72, png.height / plots.PNG_DPI * 72)  # points
    # the SVG cut to the PNG's box (to a pixel of the PNG's)
    assert all(abs(a - b) <= 72 / plots.PNG_DPI for a, b in zip(_svg_size(paths[1]), box))
    svg = paths[1].read_text(encoding="utf-8")
    assert svg.count("<g id=\"axes_") == panels  # one per panel (and the colorbar)
