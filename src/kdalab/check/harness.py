"""The check itself: every kernel on every case, one flat record per (kernel, case).

**Accuracy mode** (default): against the fp64 token recurrence (``kdalab.kda.reference_forward``,
float64 on the inputs' device). Per case: output and final-state relative error
``‖x − ref‖ / ‖ref‖`` (over the judged sequences), max abs error, non-finite counts, the bf16
floor (the exact output rounded to bf16), the case's **floor** (the error of the same-precision
reference, :mod:`kdalab.check.budget`) and the error as a multiple of it, determinism (a second
call gives identical bits) and whether the kernel left its inputs untouched. A case passes when
all of it holds: errors within ``budget`` × the floor (and within the absolute thresholds, if
given), everything finite, two calls identical, inputs untouched. Contract cases
(:mod:`kdalab.check.contracts`) are judged by their contract. With ``Thresholds(grad=True)``
every accuracy case also judges each gradient against the fp64 reference's, as a multiple of
its floor (:mod:`kdalab.check.gradients`), and the causal, batch_varlen and layout contracts
judge the backward too (:mod:`kdalab.check.contracts`, **Gradients**).

**Fidelity mode** (``against``): against another kernel instead of fp64. Per case: the fraction
of output (and state) elements whose bits are identical, the worst relative difference
``max|a − b| / max|b|`` and the relative RMS difference; a case passes when the identical fraction
of the output reaches ``min_identical`` and the kernel is deterministic. Contracts are not run.

No pass without a run: a kernel that raises NotImplementedError, or whose adapter declares the
case outside what it supports, is ``unsupported`` for that case; any other exception fails the
case (its first line in the message). An answer of the wrong form raises
:class:`~kdalab.check.adapters.ConventionError`, and a GPU left in an error state raises
:class:`DeviceFault` (nothing later on that device could be trusted).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

from kdalab.check.adapters import KernelAdapter
from kdalab.check.budget import DEFAULT_BUDGET, Floors, floor_reference, judge_errors
from kdalab.check.calls import (
    DeviceFault,
    Raised,
    bits_equal,
    call,
    max_abs,
    nonfinite,
    rel,
    same,
    worst_rel_diff,
)
from kdalab.check.cases import Case, CaseInputs, case_inputs, reference
from kdalab.check.contracts import CONTRACT_FIELDS, judge_contract
from kdalab.check.gradients import GRAD_FIELDS, GradientCheck, grad_references

__all__ = ["Thresholds", "DeviceFault", "run_check", "blank_record", "bits_equal", "MODES",
           "case_references"]

MODES = ("fp64", "fidelity")


@dataclass(frozen=True)
class Thresholds:
    """What a case must meet. ``budget``: the largest error, as a multiple of the case's floor
    (the same-precision reference's error; :mod:`kdalab.check.budget`). ``max_output_error``,
    ``max_state_error``: absolute limits on top of it (None: none). ``min_identical`` (fidelity
    mode): the fraction of output elements that must be bit-identical. ``grad``: the gradients
    too must be within ``budget`` × their floors (fp64 mode; ``kdalab check --grad``)."""

    budget: float = DEFAULT_BUDGET
    max_output_error: float | None = None
    max_state_error: float | None = None
    min_identical: float = 0.999
    grad: bool = False

    def __post_init__(self) -> None:
        for name in ("budget", "max_output_error", "max_state_error"):
            value = getattr(self, name)
            if value is None and name != "budget":
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not isinstance(self.grad, bool):
            raise ValueError(f"grad must be True or False, got {self.grad!r}")
        if not (isinstance(self.min_identical, (int, float)) and 0 <= self.min_identical <= 1):
            raise ValueError(f"min_identical must be a fraction in [0, 1], got "
                             f"{self.min_identical!r}")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


_FP64_FIELDS = ("o_rel_err", "state_rel_err", "o_max_abs", "state_max_abs", "o_nonfinite",
                "state_nonfinite", "o_nonfinite_all", "floor_multiple", "o_budget_multiple",
                "state_budget_multiple", "deterministic", "o_dtype", "state_dtype",
                *CONTRACT_FIELDS)
_FIDELITY_FIELDS = ("o_identical", "state_identical", "o_worst_rel_diff",
                    "state_worst_rel_diff", "o_rel_diff", "deterministic", "o_dtype",
                    "state_dtype")
_FLOORS = ("bf16_floor", "state_bf16_floor", "o_floor_err", "state_floor_err")


def _run_twice(kernel, x, case, upstream=None):
    """``(first answer, deterministic, problems)``; raises Raised if the first call raises.
    With ``upstream`` the answer has the gradients too, and ``deterministic`` is a pair
    (outputs, gradients)."""
    first, modified = call(kernel, x, case.name, upstream)
    problems = [f"modified its inputs: {', '.join(modified)}"] if modified else []
    try:
        again, _ = call(kernel, x, case.name, upstream)
    except Raised as exc:
        return first, (False, False) if upstream else False, problems + [
            f"the second call raised: {exc}"]
    deterministic = same(first[0], again[0]) and same(first[1], again[1])
    if not deterministic:
        problems.append("two calls gave different bits")
    if upstream is None:
        return first, deterministic, problems
    grads = all(same(g, again[2][n]) for n, g in first[2].items())
    if not grads:
        problems.append("two calls gave different gradient bits")
    return first, (deterministic, grads), problems


def _judge_fp64(kernel, x, case, ref, floors, th: Thresholds,
                grads: GradientCheck | None = None) -> tuple[dict, list[str]]:
    o_ref, s_ref = ref
    answer, deterministic, problems = _run_twice(kernel, x, case, grads and grads.upstream)
    (o, s), rec = answer[:2], {}
    if grads is not None:
        deterministic, rec["grad_deterministic"] = deterministic
        fields, failures = grads.judge(answer[2], th)
        rec.update(fields)
        problems = failures + problems
    oj, sj = o[x.rows], s[x.states]
    rec = {
        **rec, "o_rel_err": rel(oj, o_ref[x.rows]), "state_rel_err": rel(sj, s_ref[x.states]),
        "o_max_abs": max_abs(oj, o_ref[x.rows]), "state_max_abs": max_abs(sj, s_ref[x.states]),
        "o_nonfinite": nonfinite(oj), "state_nonfinite": nonfinite(sj),
        "o_nonfinite_all": nonfinite(o), "deterministic": deterministic,
        "o_dtype": _dtype(o), "state_dtype": _dtype(s),
    }
    failures = []
    if rec["o_nonfinite"] or rec["state_nonfinite"]:
        failures.append("non-finite output or state")
    rec.update(floors.of(o.dtype))
    fields, over = judge_errors(rec["o_rel_err"], rec["state_rel_err"], rec, th)
    rec.update(fields)
    return rec, failures + over + problems


def _judge_fidelity(kernel, x, case, theirs, floors, th: Thresholds) -> tuple[dict, list[str]]:
    (o, s), deterministic, problems = _run_twice(kernel, x, case)
    bo, bs = theirs
    rec = {"deterministic": deterministic, "o_dtype": _dtype(o), "state_dtype": _dtype(s)}
    oj, boj, sj, bsj = o[x.rows], bo[x.rows], s[x.states], bs[x.states]
    rec["o_identical"] = float(bits_equal(oj, boj).double().mean()) if oj.numel() else math.nan
    rec["state_identical"] = (float(bits_equal(sj, bsj).double().mean()) if sj.numel()
                              else math.nan)
    rec["o_worst_rel_diff"] = worst_rel_diff(oj, boj)
    rec["state_worst_rel_diff"] = worst_rel_diff(sj, bsj)
    rec["o_rel_diff"] = rel(oj, boj.double())
    failures = []
    if not rec["o_identical"] >= th.min_identical:
        failures.append(f"fewer than {100 * th.min_identical:g} % of output elements "
                        f"bit-identical")
    return rec, failures + problems


@contextlib.contextmanager
def one_thread(device: str | torch.device):
    """On the CPU, one intra-op thread for the run: a case's tensors are small, so threads only
    add contention (timings: docs/BENCHMARKS.md), and the records then do not depend on the core
    count (the hunt runs its trials under it too)."""
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_check(
    kernels: Sequence[KernelAdapter],
    cases: Sequence[Case],
    *,
    device: str | torch.device = "cpu",
    thresholds: Thresholds = Thresholds(),
    against: KernelAdapter | None = None,
    sink: Callable[[list[dict]], None] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    timings: dict[str, float] | None = None,
    exclude: Mapping[str, Collection[str]] | None = None,
    references: Callable[[Case, CaseInputs], tuple] | None = None,
    stored: Collection[tuple[str, str]] = (),
) -> list[dict]:
    """Run every kernel on every case; one record per (kernel, case).

    ``sink`` receives each case's records as soon as they exist; ``progress(done, total,
    label)`` is called after every (kernel, case); ``timings`` (if given) accumulates each
    kernel's seconds (kept out of the records, which are bit-identical from run to run).
    ``exclude`` maps a kernel's name to cases it is not run on (status ``excluded``: e.g. to
    spare a kernel that autotunes every new shape the shapes only it would add).
    ``references(case, inputs)`` gives the references (default: computed,
    :func:`case_references`); isolated workers share them, computed once. ``stored``: the
    (case, kernel) pairs that already have a record (a resumed run): not run again, and a case
    stored for every kernel is not even drawn; a record never depends on the other pairs run,
    so the records made are those an uninterrupted run makes.
    """
    device = torch.device(device)
    if against is not None and thresholds.grad:
        raise ValueError("grad: gradients are judged against fp64, not against another kernel")
    with one_thread(device):
        return _run(kernels, cases, device, thresholds, against, sink, progress, timings,
                    exclude or {}, references or functools.partial(
                        case_references, grad=thresholds.grad), set(stored))


def case_references(case: Case, x: CaseInputs, grad: bool = False) -> tuple:
    """A case's references, computed once for every kernel: ``(o, state)`` of the fp64
    recurrence and of the same-precision reference (:func:`~kdalab.check.budget.floor_reference`),
    float64 tensors; with ``grad`` (an accuracy or batch_varlen case) then its gradient references
    (:func:`~kdalab.check.gradients.grad_references`, upstream drawn from the case's seed)."""
    refs = (*reference(x), *floor_reference(x))
    judged = grad and case.kind in ("accuracy", "batch_varlen")
    return refs + (grad_references(x, case.seed),) if judged else refs


def blank_record(kernel: str, case: Case, *, device: str | torch.device,
                 thresholds: Thresholds, against: str | None) -> dict:
    """A record with every field and nothing measured (status ``unsupported``): the one
    skeleton of all records, so every run's records have the same fields in the same order."""
    mode = "fidelity" if against is not None else "fp64"
    rec = {"kernel": kernel, "case": case.name, "mode": mode, **case.describe(),
           "about": case.about, "device": torch.device(device).type}
    if mode == "fp64":
        rec.update({f: None for f in _FLOORS}, budget=thresholds.budget,
                   max_output_error=thresholds.max_output_error,
                   max_state_error=thresholds.max_state_error)
        fields = _FP64_FIELDS + (GRAD_FIELDS if thresholds.grad else ())
    else:
        rec.update(against=against, min_identical=thresholds.min_identical)
        fields = _FIDELITY_FIELDS
    rec.update({f: None for f in fields}, status="unsupported", message="")
    return rec


def _measure(rec: dict, kernel, x, case, ref, floors, thresholds, against, why,
             grads=None) -> None:
    """Fill ``rec`` with one kernel's measurements on one case (or why it did not run)."""
    why_not = kernel.unsupported(x)
    if why_not is None and thresholds.grad and kernel.no_backward:
        why_not = f"no backward: {kernel.no_backward}"
    if why_not is not None:
        rec["message"] = f"declared: {why_not}"
        return
    if against is not None and case.kind != "accuracy":
        rec.update(status="excluded", message="not run: contracts are judged in fp64 mode")
        return
    if against is not None and ref is None:
        rec["message"] = f"against {against.name}: {why}"
        return
    try:
        if against is not None:
            measured, failures = _judge_fidelity(kernel, x, case, ref, floors, thresholds)
        elif case.kind == "accuracy":
            measured, failures = _judge_fp64(kernel, x, case, ref, floors, thresholds, grads)
        else:
            measured, failures = judge_contract(kernel, x, case, ref, floors, thresholds,
                                                grads)
    except Raised as exc:
        rec.update(status="unsupported" if exc.declared else "fail", message=str(exc))
        return
    rec.update(measured, status="fail" if failures else "pass", message="; ".join(failures))
    if against is None and rec["bf16_floor"] and rec["o_rel_err"] is not None:
        rec["floor_multiple"] = rec["o_rel_err"] / rec["bf16_floor"]


def _judge_by(case, x, against, references):
    """What the case's kernels are measured against: ``(floors, (o, s) or None, why none,
    gradients)``: the fp64 reference and the case's :class:`~kdalab.check.budget.Floors` (and
    its :class:`~kdalab.check.gradients.GradientCheck`, under ``grad``), or the ``against``
    kernel's answer (and no floors)."""
    if against is None:
        o, s, fo, fs, *grads = references(case, x)
        return (Floors(x, (o, s), (fo, fs), rel), (o, s), None,
                GradientCheck(x, grads[0], rel) if grads else None)
    why = against.unsupported(x)
    if why is not None:
        return None, None, f"declared: {why}", None
    if case.kind != "accuracy":
        return None, None, "contract", None
    try:
        ref, _ = call(against, x, case.name)
    except Raised as exc:
        return None, None, str(exc), None
    return None, ref, None, None


def _run(kernels, cases, device, thresholds, against, sink, progress, timings,
         exclude, references, stored) -> list[dict]:
    records: list[dict] = []
    todo = {c.name: [k for k in kernels if (c.name, k.name) not in stored] for c in cases}
    total, done = sum(map(len, todo.values())), 0
    for case in cases:
        if not todo[case.name]:
            continue
        runs = [k for k in todo[case.name] if case.name not in exclude.get(k.name, ())]
        x = case_inputs(case, device)
        floors, ref, why, grads = (_judge_by(case, x, against, references) if runs
                                   else (None, None, None, None))
        cell = []
        for kernel in todo[case.name]:
            t0 = time.perf_counter()
            rec = blank_record(kernel.name, case, device=device, thresholds=thresholds,
                               against=None if against is None else against.name)
            if kernel not in runs:  # no floor either: the same record whoever else runs
                rec.update(status="excluded", message="not run: excluded by the caller")
            else:
                rec.update({} if floors is None else floors.default)
                rec.update({} if grads is None else grads.floors)
                _measure(rec, kernel, x, case, ref, floors, thresholds, against, why, grads)
            cell.append(rec)
            if timings is not None:
                timings[kernel.name] = timings.get(kernel.name, 0.0) + time.perf_counter() - t0
            done += 1
            if progress is not None:
                progress(done, total, f"{case.name} · {kernel.name}")
        records.extend(cell)
        if sink is not None:
            sink(cell)
    return records
