"""Kernels for tests/test_check.py, loaded by ``kdalab check tests.check_kernels:NAME`` or
``tests/check_kernels.py:NAME``: an honest fp32 kernel, three planted bugs, and wrappers that
break the convention."""

from __future__ import annotations

import torch

import kdalab.kda as kda
from kdalab.check import KernelAdapter

_STATE_FP16 = kda.get_recipe("fp32").with_(name="fp32-state-fp16", state_format="fp16")


def honest_fp32(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
    """kdalab's chunked forward in fp32 throughout."""
    return kda.forward(q, k, v, g, beta, recipe="fp32", use_qk_l2norm=use_qk_l2norm, **kw)


def drops_initial_state(q, k, v, g, beta, *, initial_state, **kw):
    """Bug: ignores the initial state (returns a final state of the right shape)."""
    o, s = kda.forward(q, k, v, g, beta, recipe="fp32", initial_state=None, **kw)
    return o, s


def gate_one_token_late(q, k, v, g, beta, **kw):
    """Bug: token t decays by token t-1's gate."""
    late = torch.cat([g[:, :1], g[:, :-1]], dim=1)
    return kda.forward(q, k, v, late, beta, recipe="fp32", **kw)


def state_in_fp16(q, k, v, g, beta, **kw):
    """Bug: the recurrent state is stored in fp16 between chunks."""
    return kda.forward(q, k, v, g, beta, recipe=_STATE_FP16, **kw)


def nondeterministic(q, k, v, g, beta, **kw):
    """Bug: a different last bit from call to call."""
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    nondeterministic.calls = getattr(nondeterministic, "calls", 0) + 1
    return o * (1 + nondeterministic.calls * 2.0 ** -20), s


def writes_its_input(q, k, v, g, beta, *, initial_state, **kw):
    """Bug: decays the caller's initial state in place."""
    o, s = honest_fp32(q, k, v, g, beta, initial_state=initial_state, **kw)
    if initial_state is not None:
        initial_state.mul_(0.5)
    return o, s


def returns_three(q, k, v, g, beta, **kw):
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    return o, s, None


def returns_vk_state(q, k, v, g, beta, **kw):
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    return o, torch.zeros(s.shape[0], s.shape[1], s.shape[2] + 1, s.shape[3])


def wrong_signature(q, k, v, g, beta, scale):
    return q, q


def _vk_kernel(q, k, v, g, beta, *, initial_state, dt_bias, cu_seqlens, **kw):
    """A kernel in FlashKDA's conventions: [N, H, V, K] states, dt_bias [H*K], int32
    cu_seqlens; K = V only, and no way to turn its q/k normalization off."""
    assert dt_bias.dim() == 1, "dt_bias must be flat"
    assert cu_seqlens is None or cu_seqlens.dtype == torch.int32, "cu_seqlens must be int32"
    o, s = kda.forward(q, k, v, g, beta, recipe="fp32", initial_state=initial_state,
                       dt_bias=dt_bias, cu_seqlens=cu_seqlens, state_layout="VK", **kw)
    return o, s


vk_adapter = KernelAdapter(_vk_kernel, state_layout="VK", dt_bias_shape="flat",
                           cu_seqlens_dtype=torch.int32, same_head_dims=True,
                           qk_l2norm_flag=None)

not_a_function = 42


def _sequences(x: torch.Tensor, cu_seqlens):
    """(batch index, token slice) of each sequence."""
    if cu_seqlens is None:
        return [(b, slice(None)) for b in range(x.shape[0])]
    cu = cu_seqlens.tolist()
    return [(0, slice(s, e)) for s, e in zip(cu, cu[1:])]


def _nan_tolerant(q, k, v, g, beta, *, leak: bool, **kw):
    bad = [(not torch.isfinite(q[b, t]).all() or not torch.isfinite(k[b, t]).all()
            or not torch.isfinite(v[b, t]).all())
           for b, t in _sequences(q, kw.get("cu_seqlens"))]
    clean = [torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0) for t in (q, k, v)]
    o, s = honest_fp32(*clean, g, beta, **kw)
    for i, (b, t) in enumerate(_sequences(q, kw.get("cu_seqlens"))):
        if bad[i] or (leak and any(bad)):
            o[b, t] = float("nan")
            s[i] = float("nan")
    return o, s


def nan_propagating(q, k, v, g, beta, **kw):
    """NaN in a sequence gives NaN in that sequence only (what a kernel should do)."""
    return _nan_tolerant(q, k, v, g, beta, leak=False, **kw)


def nan_leaking(q, k, v, g, beta, **kw):
    """Bug: NaN in one sequence spills into every sequence of the batch."""
    return _nan_tolerant(q, k, v, g, beta, leak=True, **kw)


def dies_on_varlen(q, k, v, g, beta, *, cu_seqlens, **kw):
    """Bug: the process dies on packed sequences (as after a fault on a GPU)."""
    if cu_seqlens is not None:
        import os

        os._exit(7)
    return honest_fp32(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)


def hangs_on_varlen(q, k, v, g, beta, *, cu_seqlens, **kw):
    """Bug: never returns on packed sequences."""
    if cu_seqlens is not None:
        import time

        time.sleep(3600)
    return honest_fp32(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)
