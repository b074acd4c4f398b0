"""The views worker: a helper process (:mod:`kdalab.experiments.helper`) that a sweep starts as
it begins, so that pandas, pyarrow and matplotlib (about 1 s of imports) load while the sweep
imports torch and runs; at the end it draws the views of the sweep's store
(:func:`~kdalab.views.sweep_views.draw_sweep_views`, the same code as in the command's own
process, so the same files; the plot's SVG drawn in a forked copy while the PNG is drawn) and
hands back the files and the tables' text."""

from __future__ import annotations

from kdalab.experiments.runstore import RunStore
from kdalab.views.sweep_views import draw_sweep_views


def warm() -> None:
    """Draw a small made-up sweep's views once, into a temporary folder that is then removed
    (both formats here): the first drawing in a process also pays for loading fonts, the
    mathtext parser, the SVG backend and lazy imports, which the sweep's own drawing then
    finds done."""
    import math
    import tempfile

    import pandas as pd

    from kdalab.experiments.families import FAMILIES
    from kdalab.views import plots

    rows = [{"family": fam, "lower_bound": -5.0, "chunk": c, "dim": 128, "accumulation": acc,
             "inv_total_rel_rmse_median": math.inf if c == 64 else 10.0 ** (k - 12),
             "inv_stable_l_rel_rmse_median": 10.0 ** (k - 14)}
            for fam in FAMILIES for acc in ("fp16-seq", "h200")
            for k, c in enumerate((2, 8, 16, 24, 32, 48, 64))]
    fork, plots.FORK_FORMATS = plots.FORK_FORMATS, False
    try:
        with tempfile.TemporaryDirectory(prefix="kdalab-warm-") as folder:
            plots.plot_error_vs_chunk(pd.DataFrame(rows), folder)
    finally:
        plots.FORK_FORMATS = fork


def _draw(folder: str):
    """A request: draw the views of the store in ``folder`` (read only, no lock: the command
    holds it)."""
    paths, text = draw_sweep_views(RunStore.read_only(folder))
    return [str(p) for p in paths], text


if __name__ == "__main__":
    from kdalab.experiments.helper import serve
    from kdalab.views import plots

    plots.FORK_FORMATS = True  # the PNG and the SVG drawn at once
    serve(_draw)
