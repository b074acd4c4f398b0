"""The layer's input stage: the decay gate, β, q/k normalization, and the checks on every argument.

Gates (log-space decay per step and key channel, always < 0 or ≤ 0):

================  ===============================================================================
``lower_bound``   ``lower_bound · sigmoid(exp(A_log) · (g + dt_bias))`` — K3, FlashKDA, fla's
                  ``safe_gate``; without ``A_log`` the factor is 1. Lies in (lower_bound, 0).
``unbounded``     ``−exp(A_log) · softplus(g + dt_bias)`` — Kimi Linear; can be arbitrarily
                  negative (the contrast case).
``log_decay``     ``g`` is the log-decay itself, ≤ 0: fla's ``chunk_kda`` default
                  (``use_gate_in_kernel=False``), and kdalab's kernels' ``gate="log_decay"``.
================  ===============================================================================

β is ``sigmoid(beta)`` for logits or used as given. q and k may be L2-normalized the way FlashKDA
does it: ``x · rsqrt(Σx² + 1e-6)``.

Arithmetic: in float64 (the reference) every step is float64. In float32 (the kernels' gate) each
operation is a float32 operation; with ``base2=True`` the result is the *base-2* log-decay, as
FlashKDA computes it:
``fl(lower_bound·log2 e) · sigmoid(exp2(fl(A_log·log2 e)) · (g + dt_bias))``.
Which float32 sigmoid, exp2 and rsqrt (torch's, or the H200's approximate instructions as
FlashKDA issues them) is the recipe's :class:`~kdalab.arith.scalar.ScalarOps` (``ops``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kdalab import params
from kdalab.arith import FP32, FP64, Format, exp2_ftz, get_format, quantize
from kdalab.arith.scalar import TORCH_OPS, ScalarOps

__all__ = ["GATES", "LOG2E", "log_decay", "beta_activation", "l2_normalize", "check_finite",
           "check_float", "Prepared", "prepare_inputs", "check_cu_seqlens", "FLOAT_DTYPES"]

GATES = ("lower_bound", "unbounded", "log_decay")
LOG2E = math.log2(math.e)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --- argument checks -----------------------------------------------------------------------

def check_float(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")


def check_finite(name: str, x: torch.Tensor) -> None:
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf")


def check_cu_seqlens(cu_seqlens: torch.Tensor, total: int, batch: int) -> list[int]:
    """Offsets as a Python list; raises ValueError naming ``cu_seqlens``."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise ValueError("cu_seqlens must be a 1-D integer tensor")
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must have at least two entries")
    if batch != 1:
        raise ValueError(f"cu_seqlens needs batch size 1 (sequences packed along T), got {batch}")
    offs = [int(x) for x in cu_seqlens.tolist()]
    if offs[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offs[0]}")
    if any(b <= a for a, b in zip(offs, offs[1:])):
        raise ValueError(f"cu_seqlens must be strictly increasing, got {offs}")
    if offs[-1] != total:
        raise ValueError(f"cu_seqlens must end at T={total}, got {offs[-1]}")
    return offs


# --- the gate ---------------------------------------------------------------------------------

def _head_view(t: torch.Tensor, heads: int, width: int | None, name: str) -> torch.Tensor:
    n = heads * (width or 1)
    if t.numel() != n:
        shape = f"[{heads}]" if width is None else f"[{heads}*{width}] or [{heads}, {width}]"
        raise ValueError(f"{name} must have shape {shape} (g has {heads} heads), got "
                         f"{tuple(t.shape)}")
    return t.reshape(heads, 1) if width is None else t.reshape(heads, width)


def log_decay(
    g: torch.Tensor,
    *,
    gate: str = "lower_bound",
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = -5.0,
    fmt: Format | str = FP64,
    base2: bool = False,
    ftz: bool = True,
    ops: ScalarOps = TORCH_OPS,
) -> torch.Tensor:
    """Per-step, per-channel log-decay from gate inputs ``g [..., H, K]``.

    Returns natural-log decay (``base2=False``) or base-2 decay (``base2=True``: the natural value
    times log2 e, folded into the constants as FlashKDA does), computed and returned in ``fmt``
    (float64 or float32 arithmetic). ``ftz`` applies to exp2 of ``A_log`` on the base-2 path;
    ``ops`` computes the float32 sigmoid and exp2.
    """
    gate, lower_bound, fmt = _gate_options(gate, lower_bound, fmt)
    return _log_decay(g, gate, A_log, dt_bias, lower_bound, fmt, base2, ftz, ops)


def _gate_options(gate, lower_bound, fmt) -> tuple[str, float | None, Format]:
    """The gate's options, parsed once (ValueError naming the argument)."""
    gate = params.choice(gate, "gate", GATES)
    if gate == "lower_bound" or lower_bound is not None:
        lower_bound = params.lower_bound(lower_bound)
    fmt = get_format(fmt)
    if fmt not in (FP64, FP32):
        raise ValueError(f"gate_format: the gate is computed in fp64 or fp32, got {fmt.name}")
    return gate, lower_bound, fmt


def _log_decay(g, gate: str, A_log, dt_bias, lower_bound: float | None, fmt: Format,
               base2: bool, ftz: bool, ops: ScalarOps = TORCH_OPS) -> torch.Tensor:
    dt = torch.float64 if fmt == FP64 else torch.float32
    heads, width = g.shape[-2], g.shape[-1]
    x = g.to(dt)
    if gate == "log_decay":
        return x * LOG2E if base2 else x
    if dt_bias is not None:
        x = x + _head_view(dt_bias, heads, width, "dt_bias").to(dt)
    a = None
    if A_log is not None:
        a_log = _head_view(A_log, heads, None, "A_log").to(dt)
        if base2 and dt == torch.float32:  # FlashKDA: ex2.ftz(fl(A_log·fl(log2 e)))
            a = ops.exp2_f32(a_log * LOG2E, ftz=ftz)
        elif base2:
            a = exp2_ftz(a_log * LOG2E, ftz=ftz).to(dt)
        else:
            a = torch.exp(a_log)
    if gate == "lower_bound":
        if a is not None:
            x = a * x
        lb = lower_bound * LOG2E if base2 else lower_bound
        lb_t = torch.tensor(lb, dtype=dt, device=x.device)  # the constant rounded to dt first
        return lb_t * (ops.sigmoid_f32(x) if dt == torch.float32 else torch.sigmoid(x))
    out = -F.softplus(x)
    if a is not None:
        out = a * out
    return out * LOG2E if base2 else out


def beta_activation(beta: torch.Tensor, *, is_logits: bool = True,
                    fmt: Format | str = FP64, ops: ScalarOps = TORCH_OPS) -> torch.Tensor:
    """``sigmoid(beta)`` (logits) or ``beta``, computed in ``fmt`` (fp64 or fp32; float32 by
    ``ops``)."""
    dt = torch.float64 if get_format(fmt) == FP64 else torch.float32
    b = beta.to(dt)
    if not is_logits:
        return b
    return ops.sigmoid_f32(b) if dt == torch.float32 else torch.sigmoid(b)


def _fma32(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 fused multiply-add c + a·b (exact product, one rounding of the sum: the product
    of two float32 values is exact in float64)."""
    return (c.double() + a.double() * b.double()).float()


def l2_normalize(x: torch.Tensor, *, eps: float = 1e-6, fmt: Format | str = FP64,
                 lanes: int | None = None, out: Format | str | None = None,
                 ops: ScalarOps = TORCH_OPS) -> torch.Tensor:
    """``x · rsqrt(Σ x² + eps)`` over the last dimension.

    ``fmt=fp64``: in float64. ``fmt=fp32`` with ``lanes=16`` (and D divisible by 16): FlashKDA's
    order — each of 16 lanes sums D/16 squares by float32 FMA in order, then a butterfly over the
    lanes (xor 8, 4, 2, 1), float32 rsqrt (``ops``), float32 product. ``out`` rounds the result
    (FlashKDA: back to bf16). Returns float64/float32 values (rounded to ``out`` where given).
    """
    fmt = get_format(fmt)
    if fmt == FP64:
        xd = x.double()
        y = xd * torch.rsqrt(xd.square().sum(-1, keepdim=True) + eps)
    else:
        xf = x.float()
        d = xf.shape[-1]
        if lanes and d % lanes == 0:
            groups = xf.reshape(*xf.shape[:-1], lanes, d // lanes)
            part = torch.zeros(*xf.shape[:-1], lanes, dtype=torch.float32, device=x.device)
            for i in range(d // lanes):
                part = _fma32(part, groups[..., i], groups[..., i])
            off = lanes // 2
            while off >= 1:
                part = part + part[..., torch.arange(lanes, device=x.device) ^ off]
                off //= 2
            ss = part[..., :1]
        else:
            ss = xf.square().sum(-1, keepdim=True)
        y = xf * ops.rsqrt_f32(ss + torch.tensor(eps, dtype=torch.float32, device=x.device))
    if out is not None:
        y = quantize(y, out).to(y.dtype)
    return y


# --- the whole input stage ---------------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """Inputs in the core's layout: sequences × value heads × time × features.

    ``q, k [N, HV, T, K]``, ``v [N, HV, T, V]``, ``log_decay [N, HV, T, K]`` (base 2 where the
    recipe computes in base 2), ``beta [N, HV, T]``, ``state [N, HV, K, V]`` or None;
    ``lengths`` the true length of each sequence (padded with zeros to T).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    log_decay: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor | None
    lengths: tuple[int, ...]
    offsets: tuple[int, ...] | None  # cu_seqlens, or None for a fixed-length batch
    scale: float
    base2: bool

    def unpack(self, o: torch.Tensor) -> torch.Tensor:
        """``o [N, HV, T, V]`` back to the caller's layout ``[B, T, HV, V]`` (``B = 1`` packed)."""
        o = o.movedim(2, 1)  # [N, T, HV, V]
        if self.offsets is None:
            return o
        return torch.cat([o[i, :n] for i, n in enumerate(self.lengths)], dim=0).unsqueeze(0)

    @staticmethod
    def state_out(state: torch.Tensor, layout: str) -> torch.Tensor:
        return state.transpose(-1, -2) if layout == "VK" else state


def prepare_inputs(
    q, k, v, g, beta, *, scale=None, A_log=None, dt_bias=None, lower_bound=-5.0,
    gate="lower_bound", beta_is_logits=True, use_qk_l2norm=True, initial_state=None,
    cu_seqlens=None, state_layout="KV", input_format: Format | None = None,
    gate_format: Format | str = FP64, base2: bool = False, ftz: bool = True,
    l2norm_lanes: int | None = None, scalar_ops: ScalarOps = TORCH_OPS,
) -> Prepared:
    """Check every argument (ValueError naming it), activate gate and β, normalize q/k, expand
    grouped heads and pack variable-length sequences into a zero-padded batch."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_float(name, t)
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    b, t, h, kd = q.shape
    if v.dim() != 4 or v.shape[:2] != (b, t):
        raise ValueError(f"v must be [B, T, HV, V] with B={b}, T={t}, got {tuple(v.shape)}")
    hv, vd = v.shape[2], v.shape[3]
    if hv % h != 0:
        raise ValueError(f"v: value heads HV={hv} must be a multiple of H={h}")
    if g.dim() != 4 or g.shape[:2] != (b, t) or g.shape[3] != kd or g.shape[2] not in (h, hv):
        raise ValueError(f"g must be [B, T, H, K] or [B, T, HV, K] = [{b}, {t}, {h} or {hv}, "
                         f"{kd}], got {tuple(g.shape)}")
    if beta.shape != (b, t, hv):
        raise ValueError(f"beta must be [B, T, HV] = {(b, t, hv)}, got {tuple(beta.shape)}")
    gate, lower_bound, gfmt = _gate_options(gate, lower_bound, gate_format)
    if state_layout not in ("KV", "VK"):
        raise ValueError(f"state_layout must be 'KV' or 'VK', got {state_layout!r}")
    if scale is None:
        scale = kd ** -0.5
    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    for name, t_ in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_finite(name, t_)
    for name, p in (("A_log", A_log), ("dt_bias", dt_bias)):
        if p is not None:
            check_float(name, p)
            check_finite(name, p)
    if gate == "log_decay" and bool((g > 0).any()):
        raise ValueError("g: a log-decay (gate='log_decay') must be <= 0")

    if cu_seqlens is not None:
        offs = check_cu_seqlens(cu_seqlens, t, b)
        n = len(offs) - 1
    else:
        offs, n = None, b
    if initial_state is not None:
        check_float("initial_state", initial_state)
        want = (n, hv, kd, vd) if state_layout == "KV" else (n, hv, vd, kd)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must have shape {want} (state_layout="
                             f"{state_layout!r}), got {tuple(initial_state.shape)}")
        check_finite("initial_state", initial_state)

    # Arithmetic.
    if input_format is not None:
        q, k, v = (quantize(x, input_format) for x in (q, k, v))
    ld = _log_decay(g, gate, A_log, dt_bias, lower_bound, gfmt, base2, ftz, scalar_ops)
    bt = beta_activation(beta, is_logits=beta_is_logits, fmt=gfmt, ops=scalar_ops)
    if use_qk_l2norm:
        back = input_format if input_format is not None else None
        q = l2_normalize(q, fmt=gfmt, lanes=l2norm_lanes, out=back, ops=scalar_ops)
        k = l2_normalize(k, fmt=gfmt, lanes=l2norm_lanes, out=back, ops=scalar_ops)
    group = hv // h
    q, k = (x.repeat_interleave(group, dim=2) for x in (q, k))
    if ld.shape[2] != hv:
        ld = ld.repeat_interleave(group, dim=2)
    state = initial_state
    if state is not None and state_layout == "VK":
        state = state.transpose(-1, -2)

    def heads_first(x):  # [B, T, HV, ...] -> [B, HV, T, ...]
        return x.movedim(1, 2)

    q, k, v, ld = (heads_first(x) for x in (q, k, v, ld))
    bt = bt.movedim(1, 2)
    if offs is None:
        lengths = (t,) * b
    else:  # pack: one row per sequence, zero-padded at the end (zeros are inert, see chunk.py)
        lengths = tuple(e - s for s, e in zip(offs, offs[1:]))
        tmax = max(lengths)

        def pack(x):
            out = x.new_zeros((n,) + x.shape[1:2] + (tmax,) + x.shape[3:])
            for i, (s, e) in enumerate(zip(offs, offs[1:])):
                out[i, :, : e - s] = x[0, :, s:e]
            return out

        q, k, v, ld, bt = (pack(x) for x in (q, k, v, ld, bt))
    return Prepared(q=q, k=k, v=v, log_decay=ld, beta=bt, state=state, lengths=lengths,
                    offsets=tuple(offs) if offs is not None else None, scale=float(scale),
                    base2=base2)
