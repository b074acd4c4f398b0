"""fla's KDA entry points on kdalab's kernels: swap one import.

    from fla.ops.kda import chunk_kda, fused_recurrent_kda           # before
    from kdalab.compat.fla import chunk_kda, fused_recurrent_kda     # after

The arguments are fla-core 0.6's (``fla/ops/kda/chunk.py``, ``fused_recurrent.py``):

* the gate: a precomputed log-decay g (``use_gate_in_kernel=False``, fla's default), the
  lower-bounded gate ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``
  (``use_gate_in_kernel=True`` with ``lower_bound``) and the unbounded softplus gate
  ``-exp(A_log) * softplus(g + dt_bias)`` (``use_gate_in_kernel=True``, ``lower_bound=None``);
  ``A_log``/``dt_bias`` as keywords;
* β as probabilities or logits (``use_beta_sigmoid_in_kernel``), ``allow_neg_eigval``
  (β = 2·sigmoid(logits));
* GVA (v, beta, g with HV heads), ``cu_seqlens``, ``initial_state [N, HV, K, V]``
  (``state_v_first``: ``[N, HV, V, K]``), ``return_intermediate_states`` (with or without
  ``cu_seqlens``);
* for decode, ``ssm_state_indices`` ``[N]`` or ``[N, T]`` (per-token states, speculative
  decoding), ``num_accepted_tokens`` and ``inplace_final_state`` (the state pool).

``chunk_kda`` is differentiable (``kdalab.kernels.chunk_kda``): ``loss.backward()`` works as
with fla. ``fused_recurrent_kda`` is forward only, as a decode step is.

Refused, with ``NotImplementedError`` naming the argument: ``cp_context`` (context
parallelism: ``kdalab.kernels.chunk_kda_transition`` carries a sequence across devices), a
headwise β (``beta [B, T, HV, V]``), ``return_intermediate_states`` outside inference mode
(as fla), a gradient through ``fused_recurrent_kda``, and any argument fla-core 0.6 does not
have. Arguments that change nothing here are accepted and ignored: ``safe_gate`` (the kernel
checks each chunk's decay span itself), ``chunk_size`` (kdalab's chunk is 16; it sets only
the granularity of ``return_intermediate_states``), ``disable_recompute``, ``use_graph``,
``max_num_seqs``, ``cu_seqlens_cpu``.
"""

from __future__ import annotations

import torch

from kdalab.kernels import chunk_kda as _chunk_kda
from kdalab.kernels import chunk_kda_fwd, kda_decode

__all__ = ["chunk_kda", "fused_recurrent_kda"]

#: fla arguments that change nothing here (graph, recompute and tiling settings)
_IGNORED = ("disable_recompute", "cu_seqlens_cpu", "use_graph", "max_num_seqs", "safe_gate",
            "chunk_size", "transpose_state_layout", "out")


def _refuse(name: str, why: str):
    raise NotImplementedError(f"kdalab.compat.fla: {name} is not supported ({why})")


def _unknown(fn: str, kwargs):
    unknown = sorted(set(kwargs) - set(_IGNORED))
    if unknown:
        _refuse(", ".join(unknown), f"not an argument of fla-core 0.6's {fn}")


def _gate(g, use_gate_in_kernel, lower_bound, A_log, dt_bias):
    """kdalab's gate arguments for fla's."""
    if not use_gate_in_kernel:  # g is the log-decay; A_log/dt_bias unused, as in fla
        return dict(gate="log_decay", lower_bound=lower_bound, A_log=None, dt_bias=None)
    return dict(gate="raw", lower_bound=lower_bound, A_log=A_log, dt_bias=dt_bias)


def _beta(beta, v, use_beta_sigmoid_in_kernel, allow_neg_eigval):
    """(beta, beta_is_logits): 2·sigmoid(logits) computed here with ``allow_neg_eigval``."""
    if beta.ndim == v.ndim:
        _refuse("beta of shape [B, T, HV, V] (headwise beta)", "beta is one value a token")
    if allow_neg_eigval:
        if not use_beta_sigmoid_in_kernel:
            raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
        return 2.0 * torch.sigmoid(beta.float()), False
    return beta, bool(use_beta_sigmoid_in_kernel)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
              lower_bound=None, disable_recompute=False, return_intermediate_states=False,
              state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None,
              use_graph=False, max_num_seqs=None, **kwargs):
    """fla's ``chunk_kda``, differentiable. ``return_intermediate_states=True`` (inference
    mode) adds h ``[B, NT, HV, K, V]`` bf16 (``[1, NT_total, ...]`` with ``cu_seqlens``,
    each sequence's chunks in order): the state at the start of each ``chunk_size``-token
    chunk (64 by default), as fla returns it for vLLM."""
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    chunk_size = kwargs.get("chunk_size", 64)
    _unknown("chunk_kda", kwargs)
    if cp_context is not None:
        _refuse("cp_context", "use kdalab.kernels.chunk_kda_transition across devices")
    beta, beta_is_logits = _beta(beta, v, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    args = dict(scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                use_qk_l2norm=use_qk_l2norm_in_kernel, beta_is_logits=beta_is_logits,
                state_layout="VK" if state_v_first else "KV",
                **_gate(g, use_gate_in_kernel, lower_bound, A_log, dt_bias))
    if not return_intermediate_states:
        return _chunk_kda(q, k, v, g, beta, output_final_state=output_final_state, **args)
    if not torch.is_inference_mode_enabled():
        _refuse("return_intermediate_states outside torch.inference_mode()",
                "as in fla: it bypasses autograd")
    if chunk_size not in (16, 32, 64, 128):
        raise ValueError(f"chunk_size must be 16, 32, 64 or 128, got {chunk_size!r}")
    o, final, ck = chunk_kda_fwd(q, k, v, g, beta, output_final_state=True,
                                 checkpoint_every=chunk_size, **args)
    return o, (final if output_final_state else None), _chunk_starts(
        ck, initial_state, v, cu_seqlens, chunk_size)


def _chunk_starts(ck, initial_state, v, cu_seqlens, c):
    """fla's h from the checkpoints: per sequence, the initial state (zeros without one),
    then the state after every c tokens but the last chunk's end (``kernels/pool.py`` has the
    checkpoints' rows), bf16."""
    B, T = v.shape[:2]
    if cu_seqlens is None:
        lens = torch.full((B,), T, dtype=torch.int64)
    else:
        lens = cu_seqlens.detach().to("cpu", torch.int64).diff()  # the host, as fla's h does
    nt = (lens + c - 1) // c                  # chunks per sequence
    n_ck = lens // c                          # checkpoints per sequence
    ck_first = torch.cumsum(n_ck, 0) - n_ck   # each sequence's first checkpoint row
    seq = torch.repeat_interleave(torch.arange(len(lens)), nt)
    j = torch.arange(int(nt.sum())) - (torch.cumsum(nt, 0) - nt)[seq]  # chunk in sequence
    # rows of [checkpoints; initial states]: chunk 0 -> the sequence's initial state
    rows = torch.where(j == 0, ck.shape[0] + seq, ck_first[seq] + j - 1)
    starts = (initial_state.to(ck.dtype) if initial_state is not None
              else ck.new_zeros((len(lens),) + tuple(ck.shape[1:])))
    h = torch.cat([ck, starts])[rows.to(ck.device)].to(torch.bfloat16)
    return h.view(B, -1, *h.shape[1:]) if cu_seqlens is None else h[None]


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None,
                        initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                        lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's ``fused_recurrent_kda`` (and ``fused_recurrent_kda_fwd``'s serving arguments),
    forward only.

    With ``ssm_state_indices`` (``[N]`` or ``[N, T]``), ``initial_state`` is the state pool,
    updated in place (``inplace_final_state=True``, fla's default there) and returned as the
    final state; with ``[N, T]`` the state after token t goes to row ``[n, t]``, and
    ``num_accepted_tokens`` picks each sequence's start column. Without them the states are
    ``[N, HV, K, V]`` and a new fp32 final state is returned."""
    indices = kwargs.pop("ssm_state_indices", None)
    accepted = kwargs.pop("num_accepted_tokens", None)
    inplace = kwargs.pop("inplace_final_state", indices is not None)
    _unknown("fused_recurrent_kda", kwargs)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in (q, k, v, g, beta, A_log, dt_bias,
                                                 initial_state)):
        _refuse("a gradient through fused_recurrent_kda", "a decode step is forward only; "
                "kdalab.compat.fla.chunk_kda is differentiable")
    beta, beta_is_logits = _beta(beta, v, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    args = dict(scale=scale, use_qk_l2norm=use_qk_l2norm_in_kernel,
                beta_is_logits=beta_is_logits, state_layout="VK" if state_v_first else "KV",
                cu_seqlens=cu_seqlens, out=kwargs.get("out"),
                **_gate(g, use_gate_in_kernel, lower_bound, A_log, dt_bias))
    if indices is not None:
        if initial_state is None or not inplace:
            raise ValueError("ssm_state_indices needs initial_state (the pool) and "
                             "inplace_final_state=True")
        o = kda_decode(q, k, v, g, beta, state_pool=initial_state, state_indices=indices,
                       num_accepted_tokens=accepted, **args)
        return o, initial_state
    if accepted is not None:
        raise ValueError("num_accepted_tokens needs ssm_state_indices")
    n = v.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    HV, K, V = v.shape[2], q.shape[-1], v.shape[-1]
    if initial_state is not None:
        pool = initial_state.to(torch.float32, copy=True).contiguous()
    else:
        tail = (HV, V, K) if state_v_first else (HV, K, V)
        pool = torch.zeros((n, *tail), device=v.device, dtype=torch.float32)
    idx = torch.arange(n, device=v.device, dtype=torch.int32)
    o = kda_decode(q, k, v, g, beta, state_pool=pool, state_indices=idx, **args)
    return o, (pool if output_final_state else None)
