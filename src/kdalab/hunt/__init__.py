"""``kdalab hunt``: a black-box search of the input space for a kernel's largest error against
the fp64 recurrence.

The inputs come from the one sequence-level generator (:mod:`kdalab.inputs.sequences`); the
search space maps an Optuna trial onto its knobs (:mod:`kdalab.hunt.space`); a target is any
kernel ``kdalab check`` accepts (:mod:`kdalab.hunt.target`, the one coupling to check); one
evaluation measures the output and final-state error and the non-finite counts
(:mod:`kdalab.hunt.evaluate`); :func:`run_hunt` runs the seeded TPE search within a trial count
or a time budget (:mod:`kdalab.hunt.search`), and :mod:`kdalab.hunt.files` writes the folder
(records, worst case, case file). The views are :mod:`kdalab.views.hunt`. See docs/hunt.md.
"""

from kdalab.hunt.evaluate import evaluate, objective
from kdalab.hunt.files import prepare_folder, read_case, rebuild, write_case, write_results
from kdalab.hunt.search import HuntConfig, HuntResult, draw_seed, run_hunt, summarize
from kdalab.hunt.space import Bounds, suggest
from kdalab.hunt.target import Target, TargetError, default_threshold, resolve

__all__ = ["evaluate", "objective", "prepare_folder", "read_case", "rebuild", "write_case",
           "write_results", "HuntConfig", "HuntResult", "draw_seed", "run_hunt", "summarize",
           "Bounds", "suggest", "Target", "TargetError", "default_threshold", "resolve"]
