"""One evaluation: a draw, the target's answer, and its error against the fp64 recurrence.

Errors are relative RMS errors over the whole output and the whole final state
(``‖x − ref‖ / ‖ref‖``, :func:`kdalab.arith.rel_rmse`; ``inf`` when any value is non-finite),
against :func:`kdalab.kda.reference_forward` (the token recurrence, every step in float64, on the
inputs' device). The search maximizes :func:`objective`, log10 of the output error.

With ``grad`` (``kdalab hunt --grad``) the kernel's backward runs too, from the upstream gradients
check draws (:func:`kdalab.check.gradients.upstream`, seeded by the trial's draw seed), and each
gradient's relative RMS error against the fp64 reference's (autograd through the fp64
recurrence) is recorded (``dq_error`` … ``dh0_error``); ``grad_error`` is the worst of them
(``worst_grad`` names it), and the search maximizes its log10 instead (:func:`score`).
"""

from __future__ import annotations

import math
import time

import torch

from kdalab.arith import rel_rmse
from kdalab.check.gradients import GRADIENTS, grad_references, reference_gradients, upstream
from kdalab.hunt.target import Target, TargetError, as_case
from kdalab.inputs.sequences import SequenceSpec, draw
from kdalab.kda import reference_forward

__all__ = ["evaluate", "objective", "score", "NONFINITE_OBJECTIVE", "ZERO_OBJECTIVE"]

#: Optuna takes finite values only: a non-finite output scores as an error of 1e50, above any
#: finite one (a bf16 or fp32 output's error stays below ~1e39, their largest value over 1e-30)
NONFINITE_OBJECTIVE = 50.0
#: an exact answer (error 0) scores as 1e-30
ZERO_OBJECTIVE = -30.0


def objective(output_error: float) -> float:
    """log10 of the output error, finite (Optuna's values must be)."""
    if not math.isfinite(output_error):
        return NONFINITE_OBJECTIVE
    if output_error <= 0:
        return ZERO_OBJECTIVE
    return max(ZERO_OBJECTIVE, min(math.log10(output_error), NONFINITE_OBJECTIVE - 1))


def score(rec: dict, grad: bool) -> float:
    """The error a trial is judged by: its worst gradient's (``grad``) or its output's."""
    return rec["grad_error"] if grad else rec["output_error"]


def _rel(a: torch.Tensor, e: torch.Tensor) -> float:
    return float(rel_rmse(a.reshape(1, -1), e.reshape(1, -1), 1)[0])


def reference(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, final_state [N, H, K, V])`` of the fp64 recurrence on a draw."""
    return reference_forward(
        x["q"], x["k"], x["v"], x["g"], x["beta"], scale=x["scale"], A_log=x["A_log"],
        dt_bias=x["dt_bias"], lower_bound=x["lower_bound"], gate=x["gate"],
        initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"],
        use_qk_l2norm=x["use_qk_l2norm"], output_final_state=True)


def evaluate(target: Target, spec: SequenceSpec, seed: int, grad: bool = False) -> dict:
    """The measurements of ``target`` on ``draw(spec, seed)``: ``status`` (``measured``,
    ``unsupported``: declared by the kernel, not called, or ``raised``), ``message``,
    ``output_error``, ``state_error``, ``output_nonfinite``, ``state_nonfinite``, ``bf16_floor``
    (the exact output rounded to bf16: no bf16 output does better) and ``seconds`` (the kernel's
    call, the reference not included; :func:`~kdalab.hunt.search.run_hunt` adds ``elapsed_s``,
    the hunt's time at the trial's end: the timings are the records' only fields that differ
    from run to run); with ``grad`` also each gradient's error, ``grad_error``, ``worst_grad``
    and ``grad_nonfinite`` (the module's docstring)."""
    rec = {"status": "measured", "message": "", "output_error": None, "state_error": None,
           "output_nonfinite": None, "state_nonfinite": None, "bf16_floor": None,
           "seconds": None}
    if grad:
        rec |= {**{f"{n}_error": None for n in GRADIENTS}, "grad_error": None,
                "worst_grad": None, "grad_nonfinite": None}
    x = draw(spec, seed, target.device)
    why = target.why_not(x)
    if why is not None:
        rec.update(status="unsupported", message=why)
        return rec
    up = upstream(as_case(x), seed) if grad else ()
    t0 = time.perf_counter()
    try:
        o, s, *grads = target.differentiate(x, *up) if grad else target.run(x)
        if o.device.type == "cuda":
            torch.cuda.synchronize(o.device)
    except TargetError:
        raise
    except Exception as exc:  # a kernel that raises on valid inputs: recorded, a finding
        text = str(exc).strip().splitlines()
        rec.update(status="raised", message=f"{type(exc).__name__}: {text[0] if text else ''}"
                   [:300])
        return rec
    rec["seconds"] = time.perf_counter() - t0
    o_ref, s_ref = reference(x)
    rec.update(output_error=_rel(o, o_ref), state_error=_rel(s, s_ref),
               output_nonfinite=int((~torch.isfinite(o)).sum()),
               state_nonfinite=int((~torch.isfinite(s)).sum()),
               bf16_floor=_rel(o_ref.bfloat16(), o_ref))
    if grad:
        ref = reference_gradients(as_case(x), *up)
        errors = {n: _rel(grads[0][n], r) for n, r in ref.items()}
        rec.update({f"{n}_error": e for n, e in errors.items()},
                   grad_nonfinite=sum(int((~torch.isfinite(g)).sum()) for g in grads[0].values()))
        rec["worst_grad"] = max(errors, key=lambda n: objective(errors[n]))
        rec["grad_error"] = errors[rec["worst_grad"]]
    return rec


def gradient_floors(spec: SequenceSpec, seed: int, device: str = "cpu") -> dict:
    """The floor of each gradient on ``draw(spec, seed)`` with its upstream gradients: the
    relative error of the float32 token recurrence's gradient (rounded to bf16, as check's
    floor) against the fp64 reference's, ``{name}_floor_error``: a hunt's threshold is an
    absolute error, and a case's floors say how much of a finding is rounding that every
    bf16 gradient carries (dA_log's and ddt_bias's floors round their terms: a kernel can
    fall below them)."""
    refs = grad_references(as_case(draw(spec, seed, device)), seed)
    return {f"{n}_floor_error": _rel(refs["floor"][n], r)
            for n, r in refs["reference"].items() if n in refs["floor"]}
