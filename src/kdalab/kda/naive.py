"""The float64 recurrent reference: the delta rule one token at a time, as fla's
``naive_recurrent_kda`` writes it, in float64.

For each token t (per sequence, per value head), with per-channel log-decay g_t ∈ ℝᴷ:

    S ← diag(exp g_t) · S
    S ← S + β_t · k_t (v_t − Sᵀk_t)ᵀ
    o_t = Sᵀ (scale · q_t)

``S`` is ``[K, V]``. Grouped values: HV value heads share the H query/key heads
(``HV = G·H``; head ``i`` of v uses q/k head ``i // G``, as fla's ``repeat_interleave``).
Variable-length batches (``cu_seqlens``) run each sequence from its own initial state; internally
they are packed into a zero-padded batch, which is exact: a padded token has g = 0, k = 0, β = 0,
so it leaves S bit-for-bit unchanged.

Differentiable: torch's autograd through it gives the float64 gradients (the gradient reference
of ``kdalab check --grad``, docs/training.md); the forward's bits are those of the plain call.
"""

from __future__ import annotations

import torch

from kdalab.arith import FP64
from kdalab.arith.linalg import matmul64
from kdalab.kda.gate import Prepared, prepare_inputs

__all__ = ["recurrent_kda", "recurrent_core", "reference_forward"]


def recurrent_core(q, k, v, log_decay, beta, scale: float, state=None):
    """The recurrence on core-layout float64 tensors ``[N, HV, T, ·]``; returns ``(o, S)``."""
    q, k, v, g, b = (x.double() for x in (q, k, v, log_decay, beta))
    n, hv, t, kd = q.shape
    s = (torch.zeros(n, hv, kd, v.shape[-1], dtype=torch.float64, device=q.device)
         if state is None else state.double().clone())
    q = q * scale
    o = []  # stacked at the end: no in-place writes, so autograd can differentiate it
    for i in range(t):
        k_i = k[:, :, i].unsqueeze(-2)  # [N, HV, 1, K]
        s = s * torch.exp(g[:, :, i]).unsqueeze(-1)
        pred = matmul64(k_i, s)  # [N, HV, 1, V]
        s = s + k_i.transpose(-1, -2) * (b[:, :, i, None, None] * (v[:, :, i].unsqueeze(-2) - pred))
        o.append(matmul64(q[:, :, i].unsqueeze(-2), s).squeeze(-2))
    return (torch.stack(o, dim=2) if o else torch.empty_like(v)), s


def _run(prep: Prepared, output_final_state: bool, state_layout: str):
    o, s = recurrent_core(prep.q, prep.k, prep.v, prep.log_decay, prep.beta, prep.scale,
                          prep.state)
    return prep.unpack(o), (Prepared.state_out(s, state_layout) if output_final_state else None)


def recurrent_kda(q, k, v, g, beta, *, scale=None, initial_state=None,
                  output_final_state=False, cu_seqlens=None, state_layout="KV"):
    """fla's ``naive_recurrent_kda`` in float64, plus ``cu_seqlens`` and the state layout.

    ``g`` is the log-decay ``[B, T, H or HV, K]`` (≤ 0), ``beta`` the write strength
    ``[B, T, HV]`` (no activation), no q/k normalization. Returns ``(o [B, T, HV, V], S or None)``
    in float64, ``S`` as ``[N, HV, K, V]`` (``state_layout="VK"``: ``[N, HV, V, K]``).
    """
    prep = prepare_inputs(q, k, v, g, beta, scale=scale, gate="log_decay", lower_bound=None,
                          beta_is_logits=False, use_qk_l2norm=False, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, state_layout=state_layout, gate_format=FP64)
    return _run(prep, output_final_state, state_layout)


def reference_forward(q, k, v, g, beta, *, scale=None, A_log=None, dt_bias=None,
                      lower_bound=-5.0, gate="lower_bound", beta_is_logits=True,
                      use_qk_l2norm=True, initial_state=None, output_final_state=False,
                      cu_seqlens=None, state_layout="KV"):
    """The layer with :func:`kdalab.kda.forward`'s arguments, every step in float64, recurrent.

    The gold result the end-to-end study measures every chunked recipe against.
    """
    prep = prepare_inputs(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias,
                          lower_bound=lower_bound, gate=gate, beta_is_logits=beta_is_logits,
                          use_qk_l2norm=use_qk_l2norm, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, state_layout=state_layout, gate_format=FP64)
    return _run(prep, output_final_state, state_layout)
