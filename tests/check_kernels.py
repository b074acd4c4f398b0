"""Kernels for tests/test_check.py, loaded by ``kdalab check tests.check_kernels:NAME`` or
``tests/check_kernels.py:NAME``: an honest fp32 kernel, planted bugs (in forwards and in
backwards), and wrappers that break the convention."""

from __future__ import annotations

import torch

import kdalab.kda as kda
from kdalab.check import KernelAdapter
from kdalab.check.adapters import gate_mode

_STATE_FP16 = kda.get_recipe("fp32").with_(name="fp32-state-fp16", state_format="fp16")


def _lab(kw: dict) -> dict:
    """The convention's keyword arguments with the gate in kdalab.kda's words."""
    return {**kw, "gate": gate_mode(kw.get("gate", "raw"), kw.get("lower_bound"))}


def honest_fp32(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
    """kdalab's chunked forward in fp32 throughout; a decay without a bound takes the
    per-pair tiles (exp(G_i - G_j) <= 1 formed for each pair: no split exponent to overflow)."""
    _declines(q, k, v, kw.get("cu_seqlens"))
    kw = _lab(kw)
    tiles = "chunk_start" if kw["lower_bound"] is not None else "per_pair"
    return kda.forward(q, k, v, g, beta, recipe="fp32", use_qk_l2norm=use_qk_l2norm,
                       tiles=tiles, **kw)


def drops_initial_state(q, k, v, g, beta, *, initial_state, **kw):
    """Bug: ignores the initial state (returns a final state of the right shape)."""
    o, s = kda.forward(q, k, v, g, beta, recipe="fp32", initial_state=None, **_lab(kw))
    return o, s


def gate_one_token_late(q, k, v, g, beta, **kw):
    """Bug: token t decays by token t-1's gate."""
    late = torch.cat([g[:, :1], g[:, :-1]], dim=1)
    return kda.forward(q, k, v, late, beta, recipe="fp32", **_lab(kw))


def state_in_fp16(q, k, v, g, beta, **kw):
    """Bug: the recurrent state is stored in fp16 between chunks."""
    return kda.forward(q, k, v, g, beta, recipe=_STATE_FP16, **_lab(kw))


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
    cu_seqlens; K = V only, the lower-bound gate only, and no way to turn its q/k normalization
    off."""
    assert dt_bias.dim() == 1, "dt_bias must be flat"
    assert cu_seqlens is None or cu_seqlens.dtype == torch.int32, "cu_seqlens must be int32"
    o, s = kda.forward(q, k, v, g, beta, recipe="fp32", initial_state=initial_state,
                       dt_bias=dt_bias, cu_seqlens=cu_seqlens, state_layout="VK", **_lab(kw))
    return o, s


vk_adapter = KernelAdapter(_vk_kernel, state_layout="VK", dt_bias_shape="flat",
                           cu_seqlens_dtype=torch.int32, same_head_dims=True,
                           qk_l2norm_flag=None, gates=("lower_bound",))

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


# -- planted for the contracts and "no pass without a run" (tests/test_check_contracts.py) ------

def _declines(q, k, v, cu_seqlens):
    """What kdalab.kda.forward refuses, declared as a kernel declares it."""
    if not all(bool(t.isfinite().all()) for t in (q, k, v)):
        raise NotImplementedError("takes finite inputs only")
    if cu_seqlens is not None and bool((cu_seqlens.diff() == 0).any()):
        raise NotImplementedError("takes no empty sequences")


def always_raises(q, k, v, g, beta, **kw):
    """Bug: every call fails."""
    raise RuntimeError("CUDA error: an illegal memory access was encountered\nsecond line")


def import_fails_inside(q, k, v, g, beta, **kw):
    """Bug: its extension cannot be imported, discovered inside the call."""
    import kdalab_no_such_extension  # noqa: F401

    return honest_fp32(q, k, v, g, beta, **kw)


def exits(q, k, v, g, beta, **kw):
    """Bug: calls sys.exit(0) (a script's habit) instead of answering."""
    raise SystemExit(0)


def declines_everything(q, k, v, g, beta, **kw):
    """Supports nothing (honestly says so): a kernel with no case run fails the check."""
    raise NotImplementedError("nothing supported yet")


def acausal_leak(q, k, v, g, beta, **kw):
    """Bug: every output sees a trace of the sequence's last value (1e-4 of it): well within
    the accuracy budget, but not causal."""
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    return o + 1e-4 * v[:, -1:].to(o.dtype), s


def fp32_recurrence(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
    """The token recurrence in float32 (the floor's own reference, unrounded)."""
    from kdalab.check.budget import fp32_forward

    _declines(q, k, v, kw.get("cu_seqlens"))
    kw.pop("output_final_state", None)
    return fp32_forward(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, **_lab(kw))


def varlen_leaks_state(q, k, v, g, beta, *, cu_seqlens, initial_state, **kw):
    """Bug: packed sequences run as one (the state flows from one sequence into the next)."""
    if cu_seqlens is None:
        return honest_fp32(q, k, v, g, beta, cu_seqlens=None, initial_state=initial_state, **kw)
    h0 = None if initial_state is None else initial_state[:1]
    o, s = honest_fp32(q, k, v, g, beta, cu_seqlens=None, initial_state=h0, **kw)
    n = len(cu_seqlens) - 1
    return o, s.expand(n, *s.shape[1:]).contiguous()


def interrupted_on_third_case(q, k, v, g, beta, **kw):
    """Stands in for a Ctrl-C in the middle of a run (the boundary's Interrupted)."""
    from kdalab.cli.app import Interrupted

    interrupted_on_third_case.calls = getattr(interrupted_on_third_case, "calls", 0) + 1
    if interrupted_on_third_case.calls > 4:  # two cases of two calls each, then Ctrl-C
        raise Interrupted()
    return honest_fp32(q, k, v, g, beta, **kw)


def _layout_sloppy(q, k, v, g, beta, *, state_layout="KV", **kw):
    """Bug: the [N, H, V, K] path rounds its output differently."""
    o, s = honest_fp32(q, k, v, g, beta, state_layout=state_layout, **kw)
    return (o * (1 + 2.0 ** -20) if state_layout == "VK" else o), s


layout_sloppy = KernelAdapter(_layout_sloppy, other_layout={"state_layout": "VK"})



# -- planted for the decode contract (tests/test_check_decode.py) ---------------------------------

def _pool_decode(q, k, v, g, beta, *, state_pool, state_indices, use_qk_l2norm=True, **kw):
    """The float32 token recurrence as a decode step: from the states of the pool rows named,
    the final states written back (step by step it repeats fp32_recurrence's operations)."""
    from kdalab.check.budget import fp32_forward

    rows = state_indices.long()
    o, s = fp32_forward(q, k, v, g, beta, initial_state=state_pool[rows],
                        use_qk_l2norm=use_qk_l2norm, **_lab(kw))
    state_pool[rows] = s
    return o


def _vk_decode(q, k, v, g, beta, *, state_pool, state_indices, dt_bias, **kw):
    """The same on a [P, H, V, K] pool with a flat dt_bias (FlashKDA's conventions)."""
    assert state_pool.shape[-2] == v.shape[-1] and dt_bias.dim() == 1, "VK pool, flat dt_bias"
    kv = state_pool.transpose(-1, -2).contiguous()
    o = _pool_decode(q, k, v, g, beta, state_pool=kv, state_indices=state_indices,
                     dt_bias=dt_bias.reshape(q.shape[2], -1), **kw)
    state_pool.copy_(kv.transpose(-1, -2))
    return o


def _decode_forgets(q, k, v, g, beta, *, state_pool, state_indices, **kw):
    """Bug: every step starts from a zero state (the carried state is dropped)."""
    scratch = torch.zeros_like(state_pool)
    o = _pool_decode(q, k, v, g, beta, state_pool=scratch, state_indices=state_indices, **kw)
    state_pool[state_indices.long()] = scratch[state_indices.long()]
    return o


def _decode_leaks(q, k, v, g, beta, *, state_pool, state_indices, **kw):
    """Bug: right outputs and states, but the first sequence's new state is also written into
    the pool row after its own (a neighbour's slot, as an off-by-one row would)."""
    o = _pool_decode(q, k, v, g, beta, state_pool=state_pool, state_indices=state_indices, **kw)
    row = int(state_indices[0])
    state_pool[(row + 1) % state_pool.shape[0]] = state_pool[row]
    return o


honest_decode = KernelAdapter(fp32_recurrence, decode=_pool_decode)
honest_decode_vk = KernelAdapter(_vk_kernel, state_layout="VK", dt_bias_shape="flat",
                                 cu_seqlens_dtype=torch.int32, same_head_dims=True,
                                 qk_l2norm_flag=None, decode=_vk_decode,
                                 gates=("lower_bound",))
decode_forgets = KernelAdapter(fp32_recurrence, decode=_decode_forgets)
decode_leaks = KernelAdapter(fp32_recurrence, decode=_decode_leaks)


# -- planted backwards (tests/test_check_grad.py): the forward honest, the gradient wrong --------

class _ScaleGrad(torch.autograd.Function):
    """The identity, whose backward scales the gradient."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def grad_dk_scaled(q, k, v, g, beta, **kw):
    """Bug: the backward's dk is 2 % too large (every other gradient right)."""
    return honest_fp32(q, _ScaleGrad.apply(k, 1.02), v, g, beta, **kw)


def grad_drops_final_state(q, k, v, g, beta, **kw):
    """Bug: the final state's gradient (dHT) does not flow back: the right state, no gradient
    through it."""
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    return o, s.detach() + 0 * s


def grad_of_late_gate(q, k, v, g, beta, **kw):
    """Bug: the forward is right, the backward is that of a gate one token late."""
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    o_late, s_late = gate_one_token_late(q, k, v, g, beta, **kw)
    return o.detach() + (o_late - o_late.detach()), s.detach() + (s_late - s_late.detach())


def grad_detached(q, k, v, g, beta, **kw):
    """Bug: answers without an autograd graph (and declares no missing backward)."""
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    return o.detach(), s.detach()


def grad_nondeterministic(q, k, v, g, beta, **kw):
    """Bug: the same outputs every call, dv different from call to call (by 2^-9 of it: within
    the budget, so that only determinism fails)."""
    grad_nondeterministic.calls = getattr(grad_nondeterministic, "calls", 0) + 1
    return honest_fp32(q, k, _ScaleGrad.apply(v, 1 + grad_nondeterministic.calls * 2.0 ** -9),
                       g, beta, **kw)


no_backward = KernelAdapter(honest_fp32, no_backward="a forward only (planted)")


# -- planted for the gradient contracts (tests/test_check_grad.py): each backward within the
# accuracy budget (one token of T wrong by 1.6 % or less), yet breaking one contract

class _Leak(torch.autograd.Function):
    """The identity, whose backward changes the gradient of the first token (``"first"``: by
    2^-6 of it, signed by the last token's value, so the first token's gradient depends on a
    later input) or of the last (``"last"``: plus 2^-6 of the first token's, so a later
    gradient depends on an earlier upstream)."""

    @staticmethod
    def forward(ctx, x, which):
        ctx.which = which
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        grad = grad.clone()
        if ctx.which == "first":
            grad[:, :1] += 2.0 ** -6 * grad[:, :1] * torch.sign(x[:, -1:]).to(grad.dtype)
        else:
            grad[:, -1:] += 2.0 ** -6 * grad[:, :1]
        return grad, None


def grad_upstream_leak(q, k, v, g, beta, **kw):
    """Bug: the last token's output gradient takes 2^-6 of the first token's (an upstream
    gradient flows forward in time)."""
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    return _Leak.apply(o, "last"), s


def grad_sees_the_future(q, k, v, g, beta, **kw):
    """Bug: the first token's dq depends on the last token's query (the sign of its value)."""
    return honest_fp32(_Leak.apply(q, "first"), k, v, g, beta, **kw)


def _grad_layout_sloppy(q, k, v, g, beta, *, initial_state=None, state_layout="KV", **kw):
    """Bug: the [N, H, V, K] path's dh0 is 2^-7 too large (its forward right)."""
    if state_layout == "VK" and initial_state is not None:
        initial_state = _ScaleGrad.apply(initial_state, 1 + 2.0 ** -7)
    return honest_fp32(q, k, v, g, beta, initial_state=initial_state, state_layout=state_layout,
                       **kw)


grad_layout_sloppy = KernelAdapter(_grad_layout_sloppy, other_layout={"state_layout": "VK"})


def grad_varlen_scaled(q, k, v, g, beta, *, cu_seqlens=None, **kw):
    """Bug: packed sequences' dv is 5 % too large (batches right)."""
    if cu_seqlens is not None:
        v = _ScaleGrad.apply(v, 1.05)
    return honest_fp32(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)


# -- planted for the gate groups and the fp16 guard's causal case (tests/test_check_gates.py) --

def guard_redoes_the_sequence(q, k, v, g, beta, **kw):
    """Bug (issue 41's fp16 guard): when any value of v leaves fp16's range, the whole sequence
    is computed again on a path that rounds otherwise, modelled as every output scaled by
    (1 + 2^-20) (8 float32 ulps at least: every non-zero output changes): the past depends on
    the future."""
    o, s = honest_fp32(q, k, v, g, beta, **kw)
    if bool((v.float().abs() > torch.finfo(torch.float16).max).any()):
        o = o * (1 + 2.0 ** -20)
    return o, s


def ignores_the_gate_mode(q, k, v, g, beta, *, gate="raw", lower_bound=-5.0, **kw):
    """Bug: always the lower-bound gate (-5 where none is given), whatever the call says."""
    return honest_fp32(q, k, v, g, beta, lower_bound=-5.0 if lower_bound is None
                       else lower_bound, **kw)
