"""Gradients under check (``kdalab check --grad``, ``kdalab hunt --grad``): the upstream
gradients every kernel is given, the fp64 reference, the floor, and the verdict.

The loss of a case is ``⟨dO, o⟩ + ⟨dHT, S_T⟩``; each kernel, the reference and the floor
backpropagate the same upstream gradients ``dO`` (into the output) and ``dHT`` (into the final
state) to every input that takes a gradient: ``dq, dk, dv, dg`` (the raw gate input, or the
log-decay itself where the case gives it), ``dbeta`` (of the β logits), ``dA_log, ddt_bias`` and
``dh0`` (where the case has an initial state).

**The reference** is torch's autograd through the fp64 token recurrence
(:func:`kdalab.kda.reference_forward`, through :func:`~kdalab.check.cases.recurrence`, so that
the case's gate, empty sequences and poisoned tokens are taken as the output's reference takes
them), from float64 leaves holding the inputs' values.

**The floor** is the gradient of the float32 token recurrence on the same inputs
(:func:`~kdalab.check.budget.fp32_recurrence`: the input stage in float64, every step in
float32, as the output's floor), rounded to bf16 at the tokens: ``dq, dk, dv, dg, dbeta`` and
``dh0`` are rounded to bf16 (the inputs' precision, and the precision in which a bf16 kernel's
products meet them, as the state's floor is); ``dA_log`` and ``ddt_bias`` sum over every token,
so rounding their few values (H, or H·K) would be a floor that depends on luck: their floor is
the sum, exact, of the per-token log-decay gradient rounded to bf16 (pulled back through the
gate's derivative in float64). A gradient's floor error is the floor's error against the
reference, over the judged values; a kernel's gradient passes when its error is at most the
budget times that (the output's rule: :mod:`kdalab.check.budget`).

Judged values: the per-token gradients on the case's judged rows, ``dh0`` on its judged states;
``dA_log`` and ``ddt_bias`` only when every sequence is judged (they sum over all of them, so a
poisoned sequence's NaN reaches them). docs/training.md.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from kdalab.check.budget import fp32_recurrence, multiple
from kdalab.check.cases import recurrence
from kdalab.check.tensors import GRADIENTS, CaseInputs
from kdalab.kda import reference_forward
from kdalab.kda.gate import prepare_inputs

__all__ = ["GRADIENTS", "GRAD_FIELDS", "upstream", "upstream_seed", "gradients",
           "reference_gradients", "floor_gradients", "grad_references", "GradientCheck"]

PER_TOKEN = ("dq", "dk", "dv", "dg", "dbeta")
SUMMED = ("dA_log", "ddt_bias")
#: every gradient's record fields, then the case's counts
GRAD_FIELDS = (*(f"{n}_{m}" for n in GRADIENTS for m in ("rel_err", "floor_err",
                                                         "budget_multiple")),
               "grad_nonfinite", "grad_deterministic", "grad_contract_max_diff")
_UPSTREAM_KEY = 0x64_4f_64_48  # "dOdH": keeps the upstream draw apart from the inputs' (seed)


def upstream_seed(seed: int) -> int:
    """The seed of the upstream gradients' generator for a case or trial drawn with ``seed``
    (NumPy's SeedSequence of (seed, a fixed key): a 32-bit integer)."""
    return int(np.random.SeedSequence([int(seed), _UPSTREAM_KEY]).generate_state(1)[0])


def upstream(x: CaseInputs, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dO [B, T, H, V], dHT [N, H, K, V])``: N(0, 1) values rounded to bf16 (so that they are
    exact in a bf16 or float32 output, whatever the kernel returns), drawn on a CPU generator
    seeded by :func:`upstream_seed` (dO first), float32 on the inputs' device."""
    gen = torch.Generator().manual_seed(upstream_seed(seed))
    n = x.q.shape[0] if x.cu_seqlens is None else len(x.cu_seqlens) - 1
    h, kd, vd = x.v.shape[2], x.q.shape[3], x.v.shape[3]
    do = torch.randn(tuple(x.v.shape), generator=gen).bfloat16().float()
    dht = torch.randn((n, h, kd, vd), generator=gen).bfloat16().float()
    return do.to(x.v.device), dht.to(x.v.device)


def _leaves(x: CaseInputs) -> dict[str, torch.Tensor]:
    """Float64 leaves holding the inputs' values, by gradient name."""
    return {n: getattr(x, i).detach().double().requires_grad_()
            for n, i in GRADIENTS.items() if getattr(x, i) is not None}


def _backward(x: CaseInputs, forward, do, dht, extra=()):
    """Autograd through ``recurrence(x, forward)`` from float64 leaves: ``(leaves, gradients
    by name, gradients of ``extra``)`` (tensors of the graph; an input the forward does not use
    gets zeros)."""
    leaves = _leaves(x)
    with torch.enable_grad():
        o, s = recurrence(replace(x, **{GRADIENTS[n]: t for n, t in leaves.items()}), forward)
        inputs = [*leaves.values(), *(e() for e in extra)]
        got = torch.autograd.grad((o, s), inputs, (do.to(o.dtype), dht.to(s.dtype)),
                                  allow_unused=True, retain_graph=bool(extra))
    got = [torch.zeros_like(t) if g is None else g for g, t in zip(got, inputs)]
    return leaves, dict(zip(leaves, got[:len(leaves)])), got[len(leaves):]


def gradients(x: CaseInputs, forward, do, dht) -> dict[str, torch.Tensor]:
    """The gradients of ``⟨do, o⟩ + ⟨dht, S_T⟩`` for ``forward`` (``reference_forward``'s
    signature) on the case's inputs, float64, by name."""
    return {n: g.detach() for n, g in _backward(x, forward, do, dht)[1].items()}


def reference_gradients(x: CaseInputs, do, dht) -> dict[str, torch.Tensor]:
    """The fp64 reference: autograd through the fp64 token recurrence."""
    return gradients(x, reference_forward, do, dht)


def floor_gradients(x: CaseInputs, do, dht) -> dict[str, torch.Tensor]:
    """The floor's gradients (float64 tensors holding the rounded values): the float32
    recurrence's, rounded to bf16 at the tokens (the module's docstring)."""
    seen = []

    def forward(q, k, v, g, beta, *, initial_state=None, cu_seqlens=None,
                output_final_state=True, **kw):
        prep = prepare_inputs(q, k, v, g, beta, initial_state=initial_state,
                              cu_seqlens=cu_seqlens, **kw)
        seen.append(prep.log_decay)  # the per-token log-decay, fp64, of the gate's inputs
        return fp32_recurrence(prep)

    leaves, grads, (dld,) = _backward(x, forward, do, dht, extra=(lambda: seen[0],))
    out = {n: g.detach().bfloat16().double() for n, g in grads.items() if n not in SUMMED}
    summed = [n for n in SUMMED if n in leaves]
    if summed:
        with torch.enable_grad():
            pulled = torch.autograd.grad(seen[0], [leaves[n] for n in summed],
                                         dld.bfloat16().double(), allow_unused=True)
        out.update({n: torch.zeros_like(leaves[n]) if g is None else g.detach()
                    for n, g in zip(summed, pulled)})
    return out


def grad_references(x: CaseInputs, seed: int) -> dict:
    """A case's gradient references, computed once for every kernel: ``{"do", "dht",
    "reference": {name: tensor}, "floor": {name: tensor}}`` (plain tensors and dicts: workers
    share them through files)."""
    do, dht = upstream(x, seed)
    return {"do": do, "dht": dht, "reference": reference_gradients(x, do, dht),
            "floor": floor_gradients(x, do, dht)}


class GradientCheck:
    """One case's gradients judged: the upstream gradients every kernel gets
    (:attr:`upstream`), each gradient's floor error (:attr:`floors`, record fields, the same in
    every kernel's record of the case) and :meth:`judge`."""

    def __init__(self, x: CaseInputs, refs: dict, rel):
        self._x, self._rel, self._ref = x, rel, refs["reference"]
        self.upstream = (refs["do"], refs["dht"])
        whole = bool(x.rows.all()) and bool(x.states.all())
        self.names = [n for n in GRADIENTS if n in self._ref and (whole or n not in SUMMED)]
        self.floors = {f"{n}_floor_err": rel(*self._judged(n, refs["floor"][n]))
                       for n in self.names}

    def _judged(self, name: str, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(t, reference)`` over the judged values of gradient ``name``."""
        ref = self._ref[name]
        if name in PER_TOKEN:
            return t[self._x.rows], ref[self._x.rows]
        if name == "dh0":
            return t[self._x.states], ref[self._x.states]
        return t, ref

    def judge(self, grads: dict[str, torch.Tensor], th) -> tuple[dict, list[str]]:
        """The verdict on a kernel's gradients (by name, as
        :meth:`~kdalab.check.adapters.KernelAdapter.differentiate` gives them): ``(fields,
        failures)``; ``th`` a :class:`~kdalab.check.harness.Thresholds`."""
        fields, failures, bad = {}, [], 0
        for n in self.names:
            t, ref = self._judged(n, grads[n])
            err = self._rel(t, ref)
            bad += int((~torch.isfinite(t)).sum())
            mult = multiple(err, self.floors[f"{n}_floor_err"])
            fields |= {f"{n}_rel_err": err, f"{n}_budget_multiple": mult}
            if math.isfinite(err) and mult > th.budget:
                failures.append(f"{n} error above {th.budget:g}x the floor")
        fields["grad_nonfinite"] = bad
        if bad:
            failures.insert(0, "non-finite gradient")
        return fields, failures
