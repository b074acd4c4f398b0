"""The kernels' contract, checked once per call at the entry point: shapes (GVA: v and beta
with HV value heads, a multiple of q's H; g with H or HV heads), dtypes, devices, the gate,
the state layout and state tensors, a state pool and checkpoints. Each ``ValueError`` names
the argument. Below the entry points nothing re-checks: the stages take a :class:`Problem`.
Index contents (``state_indices``) are never read: that would sync the host; ``cu_seqlens``
is read once per tensor (``tables.py``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from .config import KernelConfig

__all__ = ["FLOATS", "DIMS", "Gate", "Problem", "parse_gate", "prefill_problem",
           "decode_problem", "check_tensor"]

FLOATS = (torch.bfloat16, torch.float16, torch.float32)
STATE_DTYPES = (torch.float32, torch.bfloat16)
INTS = (torch.int32, torch.int64)
DIMS = (16, 32, 64, 128, 256)
#: the gate's codes in the kernels (``gate.py``)
GATE_LOWER_BOUND, GATE_SOFTPLUS, GATE_LOG_DECAY = 0, 1, 2
#: the most negative bound whose 16-token chunks always fit the split exponent: 16 steps of
#: -5 span 80 (``gate.py``: the split's range); a larger span is checked per chunk
SPLIT_SAFE_BOUND = -5.0


@dataclass(frozen=True)
class Gate:
    """How ``g`` becomes the per-step log-decay (natural log, <= 0).

    ``mode="raw"``: g is the gate's input; the log-decay is
    ``lower_bound · sigmoid(exp(A_log) · (g + dt_bias))`` with a ``lower_bound`` (K3's bounded
    gate), ``-exp(A_log) · softplus(g + dt_bias)`` with ``lower_bound=None`` (fla's unbounded
    gate, Kimi Linear). ``mode="log_decay"``: g is the log-decay itself (fla's default);
    ``lower_bound`` is then only a statement about g, which the kernel does not rely on.
    """

    mode: str = "raw"
    lower_bound: float | None = -5.0

    @property
    def code(self) -> int:
        if self.mode == "log_decay":
            return GATE_LOG_DECAY
        return GATE_SOFTPLUS if self.lower_bound is None else GATE_LOWER_BOUND

    @property
    def span_checked(self) -> bool:
        """Whether stage 1 checks each chunk's span (and takes the per-pair path past the
        split's range): every gate but a bounded raw gate whose bound keeps 16 steps inside
        that range."""
        return not (self.code == GATE_LOWER_BOUND and self.lower_bound >= SPLIT_SAFE_BOUND)

    @property
    def kernel_bound(self) -> float:
        """The bound as the kernels take it (a float argument; unused without one)."""
        return 0.0 if self.lower_bound is None else float(self.lower_bound)


def parse_gate(gate, lower_bound) -> Gate:
    """The gate arguments as a :class:`Gate` (ValueError naming the argument)."""
    if gate not in ("raw", "log_decay"):
        raise ValueError(f"gate must be 'raw' or 'log_decay', got {gate!r}")
    if lower_bound is not None:
        if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)) \
                or not math.isfinite(lower_bound) or not lower_bound < 0:
            raise ValueError(f"lower_bound must be None or a finite number < 0, "
                             f"got {lower_bound!r}")
        lower_bound = float(lower_bound)
    return Gate(gate, lower_bound)


@dataclass(frozen=True)
class Problem:
    """A validated call: B sequences of T tokens (or ``num_seqs`` packed ones, B = 1), q/k
    heads HQ, value heads H (the state's), gate heads HG, head dims K and V."""

    B: int
    T: int
    HQ: int
    H: int
    HG: int
    K: int
    V: int
    num_seqs: int
    gate: Gate
    scale: float
    use_qk_l2norm: bool
    beta_is_logits: bool
    state_layout: str
    varlen: bool

    @property
    def state_vk(self) -> bool:
        return self.state_layout == "VK"

    def state_shape(self, n: int) -> tuple[int, int, int, int]:
        return (n, self.H, self.V, self.K) if self.state_vk else (n, self.H, self.K, self.V)


def check_tensor(name: str, x, ndim, dtypes=FLOATS) -> None:
    """ValueError naming ``name`` unless ``x`` is a tensor of ``ndim`` dimensions (or one of
    them) in one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {x.dtype}; expected one of {dtypes}")


def _heads(q, k, v, g, beta):
    for name, x, ndim in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("g", g, 4), ("beta", beta, 3)):
        check_tensor(name, x, ndim)
    B, T, HQ, K = q.shape
    H, V = v.shape[2:]
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:2] != (B, T) or H % HQ != 0:
        raise ValueError(f"v must have shape [{B}, {T}, HV, V] with HV a multiple of q's "
                         f"{HQ} heads, got {tuple(v.shape)}")
    if g.shape not in ((B, T, HQ, K), (B, T, H, K)):
        raise ValueError(f"g must have shape [{B}, {T}, {HQ} or {H}, {K}], "
                         f"got {tuple(g.shape)}")
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must have shape {(B, T, H)}, got {tuple(beta.shape)}")
    if K not in DIMS or V not in DIMS:
        raise ValueError(f"head dims K={K} (q, k) and V={V} (v) must each be one of {DIMS}")
    return B, T, HQ, H, g.shape[2], K, V


def _gate_params(A_log, dt_bias, gate: Gate, HG: int, K: int) -> None:
    if gate.mode == "log_decay":
        for name, p in (("A_log", A_log), ("dt_bias", dt_bias)):
            if p is not None:
                raise ValueError(f"{name} must be None with gate='log_decay' (g is the "
                                 f"log-decay itself)")
        return
    for name, p, shapes in (("A_log", A_log, ((HG,),)),
                            ("dt_bias", dt_bias, ((HG * K,), (HG, K)))):
        if p is not None:
            check_tensor(name, p, (1, 2))
            if tuple(p.shape) not in shapes:
                raise ValueError(f"{name} must have shape {' or '.join(map(str, shapes))} "
                                 f"(per gate head), got {tuple(p.shape)}")


def _options(scale, state_layout, **flags):
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"scale must be None or a finite number, got {scale!r}")
    if state_layout not in ("KV", "VK"):
        raise ValueError(f"state_layout must be 'KV' or 'VK', got {state_layout!r}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def _same_device(device, **tensors) -> None:
    for name, x in tensors.items():
        if x is not None and x.device != device:
            raise ValueError(f"{name} is on {x.device}, q on {device}: all tensors must be on "
                             f"one device")


def _cu_seqlens(cu_seqlens, B) -> int:
    check_tensor("cu_seqlens", cu_seqlens, 1, INTS)
    if cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must have at least two entries (0 and the total length)")
    if B != 1:
        raise ValueError(f"cu_seqlens needs batch size 1 (flattened sequences), got B={B}")
    return cu_seqlens.numel() - 1


def _inputs(q, k, v, g, beta, A_log, dt_bias, gate, lower_bound, scale, state_layout,
            use_qk_l2norm, beta_is_logits, config):
    """What prefill and decode check alike: ((B, T, HQ, H, HG, K, V), the Gate)."""
    shapes = _heads(q, k, v, g, beta)
    gate = parse_gate(gate, lower_bound)
    _gate_params(A_log, dt_bias, gate, shapes[4], shapes[5])
    _options(scale, state_layout, use_qk_l2norm=use_qk_l2norm, beta_is_logits=beta_is_logits)
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config must be a KernelConfig, got {type(config).__name__}")
    return shapes, gate


def check_state_pool(state_pool, p: Problem) -> None:
    """A pool ``[P, HV, K, V]`` (``"VK"``: ``[P, HV, V, K]``), fp32 or bf16, contiguous (it is
    updated in place)."""
    check_tensor("state_pool", state_pool, 4, STATE_DTYPES)
    want = p.state_shape(state_pool.shape[0])
    if tuple(state_pool.shape) != want:
        raise ValueError(f"state_pool must have shape [P, {', '.join(map(str, want[1:]))}] "
                         f"({p.state_layout}), got {tuple(state_pool.shape)}")
    if not state_pool.is_contiguous():
        raise ValueError("state_pool must be contiguous (it is updated in place)")


def device_ok(device, name):
    """RuntimeError unless the tensors are on a GPU or the Triton interpreter is on."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError(f"kdalab.kernels.{name} runs Triton kernels: it needs CUDA tensors, "
                           f"or TRITON_INTERPRET=1 for the (slow) CPU interpreter; got tensors "
                           f"on {device}")


def prefill_problem(q, k, v, g, beta, *, scale, initial_state, A_log, dt_bias, gate,
                    lower_bound, cu_seqlens, use_qk_l2norm, beta_is_logits, state_layout,
                    config, state_pool=None, state_indices=None,
                    checkpoint_every=None) -> Problem:
    """The prefill's arguments checked (``chunk_kda_fwd``'s docstring), as a Problem; the
    contents of ``cu_seqlens`` are checked with its tables (``tables.py``), the device after
    them (``device_ok``)."""
    (B, T, HQ, H, HG, K, V), gate = _inputs(q, k, v, g, beta, A_log, dt_bias, gate, lower_bound,
                                            scale, state_layout, use_qk_l2norm,
                                            beta_is_logits, config)
    if config.dot == "fp16" and not use_qk_l2norm:
        raise ValueError("config.dot='fp16' needs use_qk_l2norm=True (fp16 operands are only "
                         "safe for unit-norm q and k)")
    num_seqs = B if cu_seqlens is None else _cu_seqlens(cu_seqlens, B)
    p = Problem(B, T, HQ, H, HG, K, V, num_seqs, gate,
                float(K ** -0.5 if scale is None else scale), use_qk_l2norm, beta_is_logits,
                state_layout, cu_seqlens is not None)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, 4, STATE_DTYPES)
        if tuple(initial_state.shape) != p.state_shape(num_seqs):
            raise ValueError(f"initial_state must have shape {p.state_shape(num_seqs)} "
                             f"({state_layout}), got {tuple(initial_state.shape)}")
    if (state_pool is None) != (state_indices is None):
        raise ValueError("state_pool and state_indices go together (give both or neither)")
    if state_pool is not None:
        if initial_state is not None:
            raise ValueError("initial_state cannot be given with state_pool (the initial "
                             "states are the pool's rows at state_indices)")
        check_state_pool(state_pool, p)
        check_tensor("state_indices", state_indices, 1, INTS)
        if tuple(state_indices.shape) != (num_seqs,):
            raise ValueError(f"state_indices must have shape ({num_seqs},), one pool row a "
                             f"sequence, got {tuple(state_indices.shape)}")
    if checkpoint_every is not None:
        c = checkpoint_every
        if isinstance(c, bool) or not isinstance(c, int) or c <= 0 or c % 16:
            raise ValueError(f"checkpoint_every must be a positive multiple of 16 (tokens), "
                             f"got {c!r}")
    _same_device(q.device, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
                 initial_state=initial_state, cu_seqlens=cu_seqlens, state_pool=state_pool,
                 state_indices=state_indices)
    return p


def decode_problem(q, k, v, g, beta, *, state_pool, state_indices, scale, A_log, dt_bias, gate,
                   lower_bound, use_qk_l2norm, beta_is_logits, state_layout,
                   num_accepted_tokens, cu_seqlens, out, config) -> Problem:
    """The decode's arguments checked (``kda_decode``'s docstring), as a Problem."""
    (B, T, HQ, H, HG, K, V), gate = _inputs(q, k, v, g, beta, A_log, dt_bias, gate, lower_bound,
                                            scale, state_layout, use_qk_l2norm,
                                            beta_is_logits, config)
    if cu_seqlens is not None:
        check_tensor("cu_seqlens", cu_seqlens, 1, INTS)
        if B != 1 or cu_seqlens.numel() < 1:
            raise ValueError(f"cu_seqlens needs batch size 1 and >= 1 entry, got B={B}")
        N = cu_seqlens.numel() - 1
    else:
        N = B
    p = Problem(B, T, HQ, H, HG, K, V, N, gate, float(K ** -0.5 if scale is None else scale),
                use_qk_l2norm, beta_is_logits, state_layout, cu_seqlens is not None)
    check_state_pool(state_pool, p)
    check_tensor("state_indices", state_indices, (1, 2), INTS)
    if state_indices.shape[0] != N:
        raise ValueError(f"state_indices must have {N} rows (one a sequence), "
                         f"got {tuple(state_indices.shape)}")
    if state_indices.ndim == 2 and cu_seqlens is None and state_indices.shape[1] < T:
        raise ValueError(f"state_indices [N, T_new] needs T_new >= {T} columns (a pool row "
                         f"for each token's state), got {tuple(state_indices.shape)}")
    if num_accepted_tokens is not None:
        check_tensor("num_accepted_tokens", num_accepted_tokens, 1, INTS)
        if state_indices.ndim != 2 or num_accepted_tokens.shape != (N,):
            raise ValueError("num_accepted_tokens must be [N] and needs state_indices [N, T_new]"
                             " (the per-token states it picks the start from)")
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != v.shape
                            or out.dtype != v.dtype or out.device != v.device
                            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous tensor like v {tuple(v.shape)} {v.dtype}")
    _same_device(q.device, k=k, v=v, g=g, beta=beta, state_pool=state_pool,
                 state_indices=state_indices, A_log=A_log, dt_bias=dt_bias,
                 num_accepted_tokens=num_accepted_tokens, cu_seqlens=cu_seqlens)
    device_ok(q.device, "kda_decode")
    return p
