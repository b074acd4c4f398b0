"""The kernels as torch custom ops, for torch.compile and serving engines.

``torch.ops.kdalab.chunk_kda_fwd`` and ``torch.ops.kdalab.kda_decode`` (``torch.library``),
forward only, each with a fake (meta) implementation that gives the outputs' shapes without
running anything, so ``torch.compile(fullgraph=True)`` traces through them, and with the pool
declared as mutated (``mutates_args``), so the compiler orders the in-place update. The ops
run the same Triton kernels (on the CPU: under ``TRITON_INTERPRET=1``).

Custom ops return tensors only: an absent final state or checkpoint tensor comes back as an
empty tensor ``[0]``; ``checkpoint_every=0`` means none. Decode has no host sync and one
launch, so it can be captured in a CUDA graph; a prefill with a ``cu_seqlens`` the kernels
have not seen reads it on the host once (``kernels/sequences.py``), so capture prefill only
after a call with the same ``cu_seqlens`` tensor (fixed-length calls never read the host).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .api import chunk_kda_fwd
from .decode import kda_decode

__all__ = ["chunk_kda_fwd_op", "kda_decode_op"]


@torch.library.custom_op("kdalab::kda_decode", mutates_args=("state_pool",))
def kda_decode_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state_pool: Tensor,
                  state_indices: Tensor, A_log: Optional[Tensor] = None,
                  dt_bias: Optional[Tensor] = None,
                  num_accepted_tokens: Optional[Tensor] = None,
                  cu_seqlens: Optional[Tensor] = None, scale: Optional[float] = None,
                  lower_bound: Optional[float] = -5.0, gate: str = "raw",
                  use_qk_l2norm: bool = True, beta_is_logits: bool = True,
                  state_layout: str = "KV") -> Tensor:
    """``kernels.kda_decode`` as an op: returns o, updates ``state_pool`` in place."""
    return kda_decode(q, k, v, g, beta, state_pool=state_pool, state_indices=state_indices,
                      scale=scale, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                      gate=gate,
                      use_qk_l2norm=use_qk_l2norm, beta_is_logits=beta_is_logits,
                      state_layout=state_layout, num_accepted_tokens=num_accepted_tokens,
                      cu_seqlens=cu_seqlens)


@kda_decode_op.register_fake
def _(q, k, v, g, beta, state_pool, state_indices, A_log=None, dt_bias=None,
      num_accepted_tokens=None, cu_seqlens=None, scale=None, lower_bound=-5.0, gate="raw",
      use_qk_l2norm=True, beta_is_logits=True, state_layout="KV"):
    return torch.empty_like(v)


@torch.library.custom_op("kdalab::chunk_kda_fwd", mutates_args=("state_pool",))
def chunk_kda_fwd_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                     A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                     initial_state: Optional[Tensor] = None,
                     state_pool: Optional[Tensor] = None,
                     state_indices: Optional[Tensor] = None,
                     cu_seqlens: Optional[Tensor] = None, scale: Optional[float] = None,
                     lower_bound: Optional[float] = -5.0, gate: str = "raw",
                     use_qk_l2norm: bool = True, beta_is_logits: bool = True,
                     state_layout: str = "KV", output_final_state: bool = False,
                     checkpoint_every: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """``kernels.chunk_kda_fwd`` as an op: (o, final state or [0], checkpoints or [0])."""
    out = chunk_kda_fwd(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, A_log=A_log, dt_bias=dt_bias,
                        lower_bound=lower_bound, gate=gate, cu_seqlens=cu_seqlens,
                        use_qk_l2norm=use_qk_l2norm, beta_is_logits=beta_is_logits,
                        state_layout=state_layout, state_pool=state_pool,
                        state_indices=state_indices,
                        checkpoint_every=checkpoint_every or None)
    o, final = out[0], out[1]
    ck = out[2] if checkpoint_every else None
    empty = v.new_empty(0)
    return o, (final if final is not None else empty), (ck if ck is not None else empty)


@chunk_kda_fwd_op.register_fake
def _(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, state_pool=None,
      state_indices=None, cu_seqlens=None, scale=None, lower_bound=-5.0, gate="raw",
      use_qk_l2norm=True, beta_is_logits=True, state_layout="KV", output_final_state=False,
      checkpoint_every=0):
    B, T, HV, V = v.shape
    K = q.shape[-1]
    n = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dtype = (state_pool.dtype if state_pool is not None
             else initial_state.dtype if initial_state is not None else torch.float32)
    tail = (HV, V, K) if state_layout == "VK" else (HV, K, V)
    final = (v.new_empty((n, *tail), dtype=dtype)
             if output_final_state and state_pool is None else v.new_empty(0))
    ck = (v.new_empty((B * (T // checkpoint_every), *tail), dtype=dtype) if checkpoint_every
          else v.new_empty(0))
    return torch.empty_like(v), final, ck
