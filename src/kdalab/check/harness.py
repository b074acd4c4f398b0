"""The check itself: every kernel on every case, one flat record per (kernel, case).

**Accuracy mode** (default): against the fp64 token recurrence (``kdalab.kda.reference_forward``,
float64 on the inputs' device). Per case: output and final-state relative error
``‖x − ref‖ / ‖ref‖`` (over the judged sequences), max abs error, non-finite counts, the bf16
floor (the error of the exact output rounded to bf16, which no bf16-output kernel can beat) and
the error as a multiple of it, determinism (a second call gives identical bits) and whether the
kernel left its inputs untouched. A case passes when all of it holds: errors within the
thresholds, everything finite, two calls identical, inputs untouched.

**Fidelity mode** (``against``): against another kernel instead of fp64. Per case: the fraction
of output (and state) elements whose bits are identical, the worst relative difference
``max|a − b| / max|b|`` and the relative RMS difference; a case passes when the identical fraction
of the output reaches ``min_identical`` and the kernel is deterministic.

A kernel that raises is recorded as ``unsupported`` with its message; a kernel that declares a
case outside what it supports (:class:`~kdalab.check.adapters.KernelAdapter`) is not called. An
answer of the wrong form raises :class:`~kdalab.check.adapters.ConventionError`, and a GPU left in
an error state raises :class:`DeviceFault` (nothing later on that device could be trusted).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

from kdalab.arith import rel_rmse
from kdalab.check.adapters import ConventionError, KernelAdapter
from kdalab.check.cases import Case, CaseInputs, case_inputs, reference

__all__ = ["Thresholds", "DeviceFault", "run_check", "blank_record", "identical", "MODES"]

MODES = ("fp64", "fidelity")


class DeviceFault(Exception):
    """The device is in an error state after a kernel failed on it."""


@dataclass(frozen=True)
class Thresholds:
    """What a case must meet. ``max_output_error`` 1e-2 is 6× the bf16 floor of ordinary
    inputs (1.65e-3): room for an honest bf16 chunked kernel (FlashKDA 5.8e-3, fla 4.1e-3,
    kdalab 1.9e-3 on the H200), while a dropped state or a shifted gate gives 1e-1 or more.
    ``min_identical`` (fidelity mode): 99.9 % of output elements bit-identical."""

    max_output_error: float = 1e-2
    max_state_error: float = 1e-2
    min_identical: float = 0.999

    def __post_init__(self) -> None:
        for name in ("max_output_error", "max_state_error"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.min_identical, (int, float)) and 0 <= self.min_identical <= 1):
            raise ValueError(f"min_identical must be a fraction in [0, 1], got "
                             f"{self.min_identical!r}")


_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def identical(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same bits (same dtype), or the same value (NaN equal to NaN) when the
    dtypes differ."""
    if a.dtype == b.dtype and a.dtype.is_floating_point:
        return a.contiguous().view(_INTS[a.element_size()]) == \
            b.contiguous().view(_INTS[b.element_size()])
    a64, b64 = a.double(), b.double()
    return (a64 == b64) | (a64.isnan() & b64.isnan())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(identical(a, b).all())


def _rel(a: torch.Tensor, e: torch.Tensor) -> float:
    if a.numel() == 0:
        return math.nan
    return float(rel_rmse(a.reshape(1, -1), e.reshape(1, -1), 1)[0])


def _max_abs(a: torch.Tensor, e: torch.Tensor) -> float:
    if a.numel() == 0:
        return math.nan
    d = (a.double() - e.double()).abs()
    return float(d.max()) if bool(torch.isfinite(d).all()) else math.inf


def _worst_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a − b| / max|b| (NaN against NaN counts as equal; any other non-finite: inf)."""
    if a.numel() == 0:
        return math.nan
    a64, b64 = a.double(), b.double()
    both_nan = a64.isnan() & b64.isnan()
    d = torch.where(both_nan, torch.zeros_like(a64), (a64 - b64).abs())
    if not bool(torch.isfinite(d).all()):
        return math.inf
    fin = b64[torch.isfinite(b64)]
    scale = float(fin.abs().max()) if fin.numel() else 0.0
    return float(d.max()) / (scale + 1e-30)


def _nonfinite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum())


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _device_ok(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
    except Exception as exc:  # a sticky CUDA error: every later call would fail alike
        return _message(exc)
    return None


class _Raised(Exception):
    def __init__(self, exc: BaseException):
        super().__init__(_message(exc))


def _call(kernel: KernelAdapter, x: CaseInputs, where: str):
    """One call on fresh copies of the inputs: ``((o, s), names of inputs it modified)``."""
    work = x.clone()
    try:
        o, s = kernel(work)
        if o.device.type == "cuda":
            torch.cuda.synchronize(o.device)
    except ConventionError:
        raise
    except Exception as exc:
        fault = _device_ok(x.q.device)
        if fault is not None:
            raise DeviceFault(f"kernel {kernel.name!r} on case {where!r} left the device in "
                              f"an error state: {fault}") from exc
        raise _Raised(exc) from exc
    original = x.tensors()
    modified = [n for n, t in work.tensors().items() if not _same(t, original[n])]
    return (o, s), modified


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


_FP64_FIELDS = ("o_rel_err", "state_rel_err", "o_max_abs", "state_max_abs", "o_nonfinite",
                "state_nonfinite", "o_nonfinite_all", "floor_multiple", "deterministic",
                "o_dtype", "state_dtype")
_FIDELITY_FIELDS = ("o_identical", "state_identical", "o_worst_rel_diff",
                    "state_worst_rel_diff", "o_rel_diff", "deterministic", "o_dtype",
                    "state_dtype")


def _floors(x: CaseInputs, o_ref: torch.Tensor, s_ref: torch.Tensor) -> dict:
    o, s = o_ref[x.rows], s_ref[x.states]
    return {"bf16_floor": _rel(o.bfloat16(), o), "state_bf16_floor": _rel(s.bfloat16(), s)}


def _run_twice(kernel, x, case):
    """``(first answer, deterministic, problems)``; raises _Raised if the first call raises."""
    (o, s), modified = _call(kernel, x, case.name)
    problems = [f"modified its inputs: {', '.join(modified)}"] if modified else []
    try:
        (o2, s2), _ = _call(kernel, x, case.name)
    except _Raised as exc:
        return (o, s), False, problems + [f"the second call raised: {exc}"]
    deterministic = _same(o, o2) and _same(s, s2)
    if not deterministic:
        problems.append("two calls gave different bits")
    return (o, s), deterministic, problems


def _judge_fp64(kernel, x, case, ref, th: Thresholds) -> tuple[dict, list[str]]:
    o_ref, s_ref = ref
    (o, s), deterministic, problems = _run_twice(kernel, x, case)
    oj, sj = o[x.rows], s[x.states]
    rec = {
        "o_rel_err": _rel(oj, o_ref[x.rows]), "state_rel_err": _rel(sj, s_ref[x.states]),
        "o_max_abs": _max_abs(oj, o_ref[x.rows]), "state_max_abs": _max_abs(sj, s_ref[x.states]),
        "o_nonfinite": _nonfinite(oj), "state_nonfinite": _nonfinite(sj),
        "o_nonfinite_all": _nonfinite(o), "deterministic": deterministic,
        "o_dtype": _dtype(o), "state_dtype": _dtype(s),
    }
    # messages name the rule, the record holds the numbers (so equal failures group in views)
    failures = []
    if rec["o_nonfinite"] or rec["state_nonfinite"]:
        failures.append("non-finite output or state")
    if not rec["o_rel_err"] <= th.max_output_error and math.isfinite(rec["o_rel_err"]):
        failures.append(f"output error above {th.max_output_error:g}")
    if not rec["state_rel_err"] <= th.max_state_error and math.isfinite(rec["state_rel_err"]):
        failures.append(f"state error above {th.max_state_error:g}")
    return rec, failures + problems


def _judge_fidelity(kernel, x, case, theirs, th: Thresholds) -> tuple[dict, list[str]]:
    (o, s), deterministic, problems = _run_twice(kernel, x, case)
    bo, bs = theirs
    rec = {"deterministic": deterministic, "o_dtype": _dtype(o), "state_dtype": _dtype(s)}
    oj, boj, sj, bsj = o[x.rows], bo[x.rows], s[x.states], bs[x.states]
    rec["o_identical"] = float(identical(oj, boj).double().mean()) if oj.numel() else math.nan
    rec["state_identical"] = (float(identical(sj, bsj).double().mean()) if sj.numel()
                              else math.nan)
    rec["o_worst_rel_diff"] = _worst_rel_diff(oj, boj)
    rec["state_worst_rel_diff"] = _worst_rel_diff(sj, bsj)
    rec["o_rel_diff"] = _rel(oj, boj.double())
    failures = []
    if not rec["o_identical"] >= th.min_identical:
        failures.append(f"fewer than {100 * th.min_identical:g} % of output elements "
                        f"bit-identical")
    return rec, failures + problems


@contextlib.contextmanager
def _one_thread(device: torch.device):
    """On the CPU, one intra-op thread for the run: a case's tensors are small, so threads only
    add contention (the quick suite of recipe:fp32 took 0.9 s on 1 thread and 51 s on 2 on a
    loaded 2-core machine, 2026-11-30), and the records then do not depend on the core count."""
    if device.type != "cpu":
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
) -> list[dict]:
    """Run every kernel on every case; one record per (kernel, case).

    ``sink`` receives each case's records as soon as they exist; ``progress(done, total,
    label)`` is called after every (kernel, case); ``timings`` (if given) accumulates each
    kernel's seconds (kept out of the records, which are bit-identical from run to run).
    ``exclude`` maps a kernel's name to cases it is not run on (status ``excluded``: e.g. to
    spare a kernel that autotunes every new shape the shapes only it would add).
    ``references(case, inputs)`` gives the fp64 reference (default: computed,
    :func:`~kdalab.check.cases.reference`); isolated workers share one computed once.
    """
    device = torch.device(device)
    with _one_thread(device):
        return _run(kernels, cases, device, thresholds, against, sink, progress, timings,
                    exclude or {}, references or (lambda case, x: reference(x)))


def blank_record(kernel: str, case: Case, *, device: str | torch.device,
                 thresholds: Thresholds, against: str | None) -> dict:
    """A record with every field and nothing measured (status ``unsupported``): the one
    skeleton of all records, so every run's records have the same fields in the same order."""
    mode = "fidelity" if against is not None else "fp64"
    rec = {"kernel": kernel, "case": case.name, "mode": mode, **case.describe(),
           "about": case.about, "device": torch.device(device).type}
    if mode == "fp64":
        rec.update(bf16_floor=None, state_bf16_floor=None,
                   max_output_error=thresholds.max_output_error,
                   max_state_error=thresholds.max_state_error)
        fields = _FP64_FIELDS
    else:
        rec.update(against=against, min_identical=thresholds.min_identical)
        fields = _FIDELITY_FIELDS
    rec.update({f: None for f in fields}, status="unsupported", message="")
    return rec


def _measure(rec: dict, kernel, x, case, ref, thresholds, against, why) -> None:
    """Fill ``rec`` with one kernel's measurements on one case (or why it did not run)."""
    why_not = kernel.unsupported(x)
    if why_not is not None:
        rec["message"] = f"declared: {why_not}"
        return
    if against is not None and ref is None:
        rec["message"] = f"against {against.name}: {why}"
        return
    judge = _judge_fp64 if against is None else _judge_fidelity
    try:
        measured, failures = judge(kernel, x, case, ref, thresholds)
    except _Raised as exc:
        rec["message"] = str(exc)
        return
    rec.update(measured, status="fail" if failures else "pass", message="; ".join(failures))
    if against is None and rec["bf16_floor"] > 0:
        rec["floor_multiple"] = rec["o_rel_err"] / rec["bf16_floor"]


def _judge_by(case, x, against, references):
    """What the case's kernels are measured against: ``(floors, (o, s) or None, why none)``:
    the fp64 reference and its bf16 floors, or the ``against`` kernel's answer."""
    if against is None:
        ref = references(case, x)
        return _floors(x, *ref), ref, None
    why = against.unsupported(x)
    if why is not None:
        return {}, None, f"declared: {why}"
    try:
        ref, _ = _call(against, x, case.name)
    except _Raised as exc:
        return {}, None, str(exc)
    return {}, ref, None


def _run(kernels, cases, device, thresholds, against, sink, progress, timings,
         exclude, references) -> list[dict]:
    records: list[dict] = []
    total, done = len(cases) * len(kernels), 0
    for case in cases:
        runs = [k for k in kernels if case.name not in exclude.get(k.name, ())]
        x = case_inputs(case, device)
        floors, ref, why = _judge_by(case, x, against, references) if runs else ({}, None, None)
        cell = []
        for kernel in kernels:
            t0 = time.perf_counter()
            rec = blank_record(kernel.name, case, device=device, thresholds=thresholds,
                               against=None if against is None else against.name)
            if kernel not in runs:  # no floor either: the same record whoever else runs
                rec.update(status="excluded", message="not run: excluded by the caller")
            else:
                rec.update(floors)
                _measure(rec, kernel, x, case, ref, thresholds, against, why)
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
