"""The views worker: a helper process (:mod:`kdalab.experiments.helper`) that a sweep starts as
it begins, so that pandas, pyarrow and matplotlib (about 1 s of imports) load while the sweep
imports torch and runs; at the end it draws the views of the sweep's store
(:func:`~kdalab.views.sweep_views.draw_sweep_views`, the same code as in the command's own
process, so the same files; the plot's SVG drawn in a forked copy while the PNG is drawn) and
hands back the files and the tables' text."""

from __future__ import annotations

from kdalab.experiments.runstore import RunStore
from kdalab.views.sweep_views import draw_sweep_views


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
