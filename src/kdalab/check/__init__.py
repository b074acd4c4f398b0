"""``kdalab check``: an accuracy and conformance report card for any KDA forward kernel.

Cases are data (:mod:`kdalab.check.cases`), kernels are adapters to one convention
(:mod:`kdalab.check.adapters`), and :func:`run_check` (:mod:`kdalab.check.harness`) returns one
flat record per (kernel, case), each error judged against the case's floor
(:mod:`kdalab.check.budget`), with contracts one call cannot see (:mod:`kdalab.check.contracts`)
and captured inputs (:mod:`kdalab.check.capture`, :mod:`kdalab.check.replay`); the views
(``kdalab.views.check``) draw from the records only. See docs/check.md.
"""

from kdalab.check.adapters import ConventionError, KernelAdapter, KernelUnavailable
from kdalab.check.budget import DEFAULT_BUDGET, floor_reference
from kdalab.check.builtin import BUILTIN, load_kernel
from kdalab.check.capture import capture
from kdalab.check.cases import (
    SUITES,
    Case,
    CaseInputs,
    case_inputs,
    get_suite,
    reference,
    select_cases,
)
from kdalab.check.harness import DeviceFault, Thresholds, bits_equal, run_check
from kdalab.check.replay import replay_cases, write_inputs

__all__ = ["BUILTIN", "ConventionError", "KernelAdapter", "KernelUnavailable", "load_kernel",
           "SUITES", "Case", "CaseInputs", "case_inputs", "get_suite", "reference",
           "select_cases", "DeviceFault", "Thresholds", "bits_equal", "run_check",
           "DEFAULT_BUDGET", "floor_reference", "capture", "replay_cases", "write_inputs"]
