"""The one home of kdalab's peers: fla's ``chunk_kda`` and ``fused_recurrent_kda``, and
FlashKDA's ``flash_kda.fwd``, each called in ``kdalab.kernels.chunk_kda_fwd``'s convention with
one set of guards. Used by ``kdalab check`` (its adapters) and ``benchmarks/bench_kernel.py``.

Stands alone: torch and the peer packages only (imported when a peer is called).

Every wrapper takes ``q, k, g [B, T, H, K]``, ``v [B, T, H, V]`` (bf16), ``beta [B, T, H]`` β
logits, the raw gate ``g`` (the kernel applies ``lower_bound·sigmoid(exp(A_log)·(g + dt_bias))``),
``A_log [H]`` and ``dt_bias`` (fp32; fla takes it flat ``[H*K]``, FlashKDA as ``[H, K]``: the
wrappers accept either), and returns ``(o, final_state)``. fla's wrappers also take
chunk_kda_fwd's other gates: ``lower_bound=None`` (fla's softplus gate
``−exp(A_log)·softplus(g + dt_bias)``) and ``gate="log_decay"`` (g the log-decay itself: fla's
``use_gate_in_kernel=False``; ``lower_bound``, if given, promises the decay stays above it).

The guard that matters: fla 0.6 hands ``chunk_kda`` to FlashKDA when ``flash_kda`` is importable
and gradients are off (its backend dispatch, ``fla/ops/kda/backends/flash_kda.py``), so a call
under ``torch.no_grad()`` on a machine with both installed measures FlashKDA under fla's name.
:func:`fla_chunk_kda` keeps fla's own Triton path: ``FLA_FLASH_KDA=0`` (and no TileLang backend)
and grad mode on (no input requires grad, so no graph is built).
"""

from __future__ import annotations

import contextlib
import os

import torch

__all__ = ["PEERS", "available", "fla_chunk_kda", "fla_fused_recurrent_kda", "flashkda_fwd"]

#: peer name -> the module it needs
PEERS = {"fla": "fla.ops.kda", "fla-recurrent": "fla.ops.kda", "flashkda": "flash_kda"}


def available(name: str) -> str | None:
    """None if the peer ``name`` (a key of :data:`PEERS`) can be imported here, otherwise why
    not (one line)."""
    import importlib

    if name not in PEERS:
        raise ValueError(f"peer must be one of {', '.join(PEERS)}, got {name!r}")
    try:
        importlib.import_module(PEERS[name])
    except Exception as exc:  # an ImportError, or a failure inside the package
        return f"{PEERS[name]} cannot be imported ({type(exc).__name__}: {exc})"
    return None


@contextlib.contextmanager
def _environ(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _flat(dt_bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if dt_bias is None else dt_bias.reshape(-1)


def _fla_gate(gate: str, A_log, dt_bias, lower_bound) -> dict:
    """fla's gate arguments for chunk_kda_fwd's: ``gate="log_decay"`` is fla's precomputed g
    (``use_gate_in_kernel=False``), the raw gate runs in the kernel; ``safe_gate`` (fla's M=16
    path for a bounded decay) wherever a lower bound holds (fla requires one with it)."""
    if gate not in ("raw", "log_decay"):
        raise ValueError(f"gate must be 'raw' or 'log_decay', got {gate!r}")
    if gate == "log_decay":
        return dict(use_gate_in_kernel=False, safe_gate=lower_bound is not None,
                    lower_bound=lower_bound)
    return dict(use_gate_in_kernel=True, safe_gate=lower_bound is not None, A_log=A_log,
                dt_bias=_flat(dt_bias), lower_bound=lower_bound)


def fla_chunk_kda(q, k, v, g, beta, *, scale, initial_state, output_final_state, A_log, dt_bias,
                  lower_bound, cu_seqlens, use_qk_l2norm=True, state_v_first=False, gate="raw"):
    """fla's own Triton ``chunk_kda`` with the gate, β sigmoid and q/k normalization in the kernel
    (the safe gate and the lower bound where there is one); states ``[N, H, K, V]``
    (``state_v_first``: ``[N, H, V, K]``)."""
    from fla.ops.kda import chunk_kda

    kw = {"state_v_first": True} if state_v_first else {}
    with _environ(FLA_FLASH_KDA="0", FLA_TILELANG="0"), torch.enable_grad():
        return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                         use_qk_l2norm_in_kernel=use_qk_l2norm, use_beta_sigmoid_in_kernel=True,
                         **_fla_gate(gate, A_log, dt_bias, lower_bound), **kw)


def fla_fused_recurrent_kda(q, k, v, g, beta, *, scale, initial_state, output_final_state,
                            A_log, dt_bias, lower_bound, cu_seqlens, use_qk_l2norm=True,
                            state_v_first=False, gate="raw"):
    """fla's ``fused_recurrent_kda`` (token by token, fp32 state) with the same gates."""
    from fla.ops.kda import fused_recurrent_kda

    kw = {"state_v_first": True} if state_v_first else {}
    fla_gate = _fla_gate(gate, A_log, dt_bias, lower_bound)
    fla_gate.pop("safe_gate")  # the recurrence has no intra-chunk path to choose
    if not fla_gate["use_gate_in_kernel"]:
        fla_gate["lower_bound"] = None  # read by its in-kernel gate only
    return fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                               use_qk_l2norm_in_kernel=use_qk_l2norm,
                               use_beta_sigmoid_in_kernel=True, **fla_gate, **kw)


def flashkda_fwd(q, k, v, g, beta, *, scale, initial_state, output_final_state, A_log, dt_bias,
                 lower_bound, cu_seqlens):
    """``flash_kda.fwd`` (its README and ``csrc/flash_kda.cpp``): it writes o into a buffer and
    the final state ``[N, H, V, K]`` into another of the initial state's dtype (float32
    without one); states are ``[N, H, V, K]`` both ways; ``cu_seqlens`` int64; it always
    normalizes q and k; K = V = 128. ``(o, None)`` when ``output_final_state`` is False."""
    import flash_kda

    n = q.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
    h, kd, vd = q.shape[2], q.shape[3], v.shape[3]
    out = torch.empty_like(v)
    final = None
    if output_final_state:
        dtype = torch.float32 if initial_state is None else initial_state.dtype
        final = torch.empty(n, h, vd, kd, dtype=dtype, device=q.device)
    flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias.reshape(h, kd), lower_bound,
                  initial_state=initial_state, final_state=final, cu_seqlens=cu_seqlens)
    return out, final
