"""fla's KDA entry points, forward only, on kdalab's kernels: swap one import.

    from fla.ops.kda import chunk_kda, fused_recurrent_kda           # before
    from kdalab.compat.fla import chunk_kda, fused_recurrent_kda     # after

The arguments are fla-core 0.6's (``fla/ops/kda/chunk.py``, ``fused_recurrent.py``), including
``A_log``/``dt_bias`` as keywords, GVA (v, beta, g with HV heads), ``cu_seqlens``,
``initial_state [N, HV, K, V]`` (``state_v_first``: ``[N, HV, V, K]``) and, for decode,
``ssm_state_indices``, ``num_accepted_tokens`` and ``inplace_final_state`` (the state pool).
kdalab fuses the lower-bounded gate, so ``use_gate_in_kernel=True`` with a ``lower_bound`` in
[-5, 0) is required: ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``, fla's formula
whenever ``lower_bound`` is set. What kdalab does not do raises a ``ValueError`` naming the
argument: a precomputed gate, fla's unbounded softplus gate, ``allow_neg_eigval``, context
parallelism, a backward pass (the outputs carry no gradient).
"""

from __future__ import annotations

import torch

from kdalab.kernels import chunk_kda_fwd, kda_decode

__all__ = ["chunk_kda", "fused_recurrent_kda"]

#: fla arguments that change nothing in a forward pass (graph and recompute settings)
_IGNORED = ("disable_recompute", "cu_seqlens_cpu", "use_graph", "max_num_seqs", "safe_gate",
            "chunk_size", "transpose_state_layout", "out")


def _gate(use_gate_in_kernel, lower_bound, allow_neg_eigval, cp_context=None):
    if not use_gate_in_kernel:
        raise ValueError("use_gate_in_kernel=False (a precomputed log-decay g) is not "
                         "supported: kdalab fuses the lower-bounded gate; pass the raw g with "
                         "use_gate_in_kernel=True and lower_bound")
    if lower_bound is None or not (-5.0 <= float(lower_bound) < 0.0):
        raise ValueError(f"lower_bound must be set, in [-5, 0) (fla's unbounded softplus gate "
                         f"is not supported), got {lower_bound!r}")
    if allow_neg_eigval:
        raise ValueError("allow_neg_eigval=True is not supported")
    if cp_context is not None:
        raise ValueError("cp_context (context parallelism) is not supported: use "
                         "kdalab.kernels.chunk_kda_transition")


def _no_grad(*xs):
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in xs):
        raise ValueError("kdalab.compat.fla is forward only: call it under torch.no_grad() or "
                         "torch.inference_mode() (inputs require grad)")


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
              lower_bound=None, disable_recompute=False, return_intermediate_states=False,
              state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None,
              use_graph=False, max_num_seqs=None, **kwargs):
    """fla's ``chunk_kda`` (forward). ``return_intermediate_states=True`` adds h
    ``[B, NT, HV, K, V]`` bf16 (fixed length only): the state at the start of each
    ``chunk_size``-token chunk (64 by default), as fla returns it for vLLM."""
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    chunk_size = kwargs.get("chunk_size", 64)
    unknown = set(kwargs) - set(_IGNORED)
    if unknown:
        raise ValueError(f"unsupported argument(s) for chunk_kda: {sorted(unknown)}")
    _gate(use_gate_in_kernel, lower_bound, allow_neg_eigval, cp_context)
    _no_grad(q, k, v, g, beta, A_log, dt_bias, initial_state)
    layout = "VK" if state_v_first else "KV"
    args = dict(scale=scale, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias,
                lower_bound=float(lower_bound), cu_seqlens=cu_seqlens,
                use_qk_l2norm=use_qk_l2norm_in_kernel,
                beta_is_logits=use_beta_sigmoid_in_kernel, state_layout=layout)
    if not return_intermediate_states:
        return chunk_kda_fwd(q, k, v, g, beta, output_final_state=output_final_state, **args)
    if cu_seqlens is not None:
        raise ValueError("return_intermediate_states with cu_seqlens is not supported: use "
                         "kdalab.kernels.chunk_kda_fwd(checkpoint_every=...)")
    if chunk_size not in (32, 64):
        raise ValueError(f"chunk_size must be 32 or 64, got {chunk_size!r}")
    o, final, ck = chunk_kda_fwd(q, k, v, g, beta, output_final_state=True,
                                 checkpoint_every=chunk_size, **args)
    B, T = v.shape[:2]
    nt = -(-T // chunk_size)
    h = ck.new_zeros((B, nt) + tuple(ck.shape[1:]), dtype=torch.bfloat16)
    if initial_state is not None:
        h[:, 0] = initial_state
    per = T // chunk_size
    h[:, 1:] = ck.view(B, per, *ck.shape[1:])[:, :nt - 1]
    return o, (final if output_final_state else None), h


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None,
                        initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                        lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's ``fused_recurrent_kda`` (and ``fused_recurrent_kda_fwd``'s serving arguments).

    With ``ssm_state_indices`` (``[N]`` or ``[N, T]``), ``initial_state`` is the state pool,
    updated in place (``inplace_final_state=True``, fla's default there) and returned as the
    final state; ``num_accepted_tokens`` picks each sequence's start column. Without them the
    states are ``[N, HV, K, V]`` and a new fp32 final state is returned."""
    indices = kwargs.pop("ssm_state_indices", None)
    accepted = kwargs.pop("num_accepted_tokens", None)
    inplace = kwargs.pop("inplace_final_state", indices is not None)
    unknown = set(kwargs) - set(_IGNORED)
    if unknown:
        raise ValueError(f"unsupported argument(s) for fused_recurrent_kda: {sorted(unknown)}")
    _gate(use_gate_in_kernel, lower_bound, allow_neg_eigval)
    _no_grad(q, k, v, g, beta, A_log, dt_bias, initial_state)
    args = dict(scale=scale, A_log=A_log, dt_bias=dt_bias, lower_bound=float(lower_bound),
                use_qk_l2norm=use_qk_l2norm_in_kernel,
                beta_is_logits=use_beta_sigmoid_in_kernel,
                state_layout="VK" if state_v_first else "KV", cu_seqlens=cu_seqlens,
                out=kwargs.get("out"))
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
