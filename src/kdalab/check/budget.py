"""Budgets from the floor: what a case's error is measured against.

A kernel that takes bf16 inputs and returns a bf16 output cannot be judged against a fixed
number: the error an honest kernel makes depends on the data (ordinary inputs 1.7e-3, collinear
keys with β → 1 far more). So each case computes, once, a **same-precision reference**: the token
recurrence in float32 fed the same bf16 inputs, its output rounded to the output dtype (the
convention's: v's) and its final state rounded to bf16 (the precision in which a bf16 kernel's
state meets its keys and queries in the tensor-core products). Its error against fp64 is the
case's floor; a kernel passes when its own error is at most ``budget`` times that floor
(FlashAttention's rule, with its 2; the default here and why: docs/check.md).
"""

from __future__ import annotations

import math

import torch

from kdalab.check.cases import CaseInputs, recurrence
from kdalab.kda.gate import Prepared, prepare_inputs

__all__ = ["DEFAULT_BUDGET", "Floors", "floor_reference", "fp32_forward", "fp32_recurrence",
           "multiple", "judge_errors"]

#: The default budget, a multiple of the floor. The production kernels' precision paths reach
#: 3.5x the floor on ordinary inputs on the H200 (FlashKDA 5.8e-3 against 1.65e-3; fla 2.5x) and
#: up to 4.2x on the quick suite's ordinary cases (the flashkda recipe, v past fp16's range):
#: 5 admits them there, and fails errors that grow with the data (collinear keys: 300x and
#: more). FlashAttention's 2 would fail both production kernels on ordinary inputs
#: (docs/check.md).
DEFAULT_BUDGET = 5.0


def fp32_forward(q, k, v, g, beta, *, initial_state=None, cu_seqlens=None,
                 output_final_state=True, **kw):
    """The token recurrence in float32 (``reference_forward``'s arguments): the gate, β and the
    q/k normalization prepared as the reference does, then every step in float32."""
    return fp32_recurrence(prepare_inputs(q, k, v, g, beta, initial_state=initial_state,
                                          cu_seqlens=cu_seqlens, **kw))


def fp32_recurrence(prep: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """Every step of the recurrence on prepared inputs in float32: ``(o, final state)``
    (differentiable: no in-place writes, so autograd gives the floor's gradients)."""
    qq, kk, vv = (t.float() for t in (prep.q, prep.k, prep.v))
    gg, bb = prep.log_decay.float(), prep.beta.float()
    n, hv, t, kd = qq.shape
    s = (torch.zeros(n, hv, kd, vv.shape[-1], dtype=torch.float32, device=qq.device)
         if prep.state is None else prep.state.float().clone())
    qq = qq * prep.scale
    o = []
    # products as multiply-and-sum, not matmul: a GPU may run an fp32 matmul in TF32 (a
    # setting any imported package can change), which would raise the floor
    for i in range(t):
        k_i = kk[:, :, i].unsqueeze(-1)  # [N, HV, K, 1]
        s = s * torch.exp(gg[:, :, i]).unsqueeze(-1)
        pred = (k_i * s).sum(-2, keepdim=True)  # [N, HV, 1, V]
        s = s + k_i * (bb[:, :, i, None, None] * (vv[:, :, i].unsqueeze(-2) - pred))
        o.append((qq[:, :, i].unsqueeze(-1) * s).sum(-2))
    o = torch.stack(o, dim=2) if o else torch.empty_like(vv)
    return prep.unpack(o), s


def floor_reference(x: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 token recurrence on the case's inputs, ``(o, final state)`` as float64
    tensors holding float32 values, not yet rounded (:class:`Floors` rounds them)."""
    o, s = recurrence(x, fp32_forward)
    return o.double(), s.double()


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


class Floors:
    """A case's floors over its judged values, computed from its references once.

    The output floor rounds the float32 recurrence's output to the coarser of v's dtype and the
    kernel's output dtype (a bf16-output kernel on float32 inputs is held to bf16; a float32-
    output kernel on bf16 inputs to bf16: the inputs' precision, not the float32 recurrence's
    own error, which a chunked float32 kernel does not reach on ill-conditioned inputs); the
    state floor rounds its final state to bf16. Also the bf16 floors (the exact result rounded
    to bf16)."""

    def __init__(self, x: CaseInputs, ref: tuple, floor_ref: tuple, rel):
        self._x, self._ref, self._floor, self._rel = x, ref, floor_ref, rel
        self._cache: dict = {}
        self.default = self.of(x.v.dtype)

    def of(self, out_dtype: torch.dtype) -> dict:
        """The floors for a kernel whose output has ``out_dtype``."""
        dtype = max((self._x.v.dtype, out_dtype), key=_eps)
        if dtype not in self._cache:
            x, rel = self._x, self._rel
            o, s = self._ref[0][x.rows], self._ref[1][x.states]
            fo, fs = self._floor[0][x.rows], self._floor[1][x.states]
            self._cache[dtype] = {
                "bf16_floor": rel(o.bfloat16(), o), "state_bf16_floor": rel(s.bfloat16(), s),
                "o_floor_err": rel(fo.to(dtype).double(), o),
                "state_floor_err": rel(fs.bfloat16().double(), s)}
        return self._cache[dtype]


def multiple(error: float, floor: float) -> float:
    """``error / floor``; 0 for an exact result, inf when the floor is 0 and the error is not,
    NaN when either is undefined (nothing judged)."""
    if error is None or floor is None or math.isnan(error) or math.isnan(floor):
        return math.nan
    if floor > 0:
        return error / floor
    return 0.0 if error == 0 else math.inf


def judge_errors(o_err: float, s_err: float, floors: dict, th) -> tuple[dict, list[str]]:
    """The budget's verdict on an output and a state error: ``(fields, failures)``, the fields
    ``o_budget_multiple`` and ``state_budget_multiple``; ``th`` a
    :class:`~kdalab.check.harness.Thresholds`. A non-finite error is left to the caller (it
    says so once, as non-finite)."""
    o_mult = multiple(o_err, floors.get("o_floor_err"))
    s_mult = multiple(s_err, floors.get("state_floor_err"))
    failures = []
    # messages name the rule, the record holds the numbers (so equal failures group in views)
    for what, err, mult, limit in (("output", o_err, o_mult, th.max_output_error),
                                   ("state", s_err, s_mult, th.max_state_error)):
        if err is None or not math.isfinite(err):
            continue
        if mult > th.budget:
            failures.append(f"{what} error above {th.budget:g}x the floor")
        if limit is not None and err > limit:
            failures.append(f"{what} error above {limit:g}")
    return {"o_budget_multiple": o_mult, "state_budget_multiple": s_mult}, failures

