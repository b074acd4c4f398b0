"""The argument checks the prefill and the decode share: a tensor's kind, rank and dtype, the
shapes of q, k, v, g and beta (GVA: v and beta with HV value heads, a multiple of q's H), the
gate's parameters, the state layout, the scale and flags, and a state pool."""

from __future__ import annotations

import math

import torch

__all__ = ["FLOATS", "check_tensor", "head_shapes", "check_gate", "check_options",
           "check_state_pool"]

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def check_tensor(name: str, x, ndim: int | tuple[int, ...], dtypes=FLOATS) -> None:
    """ValueError naming ``name`` unless ``x`` is a tensor of ``ndim`` dimensions (or one of
    them) in one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {x.dtype}; expected one of {dtypes}")


def head_shapes(q, k, v, g, beta) -> tuple[int, int, int, int, int, int]:
    """``(B, T, H, HV, K, V)`` of q, k, g ``[B, T, H, K]`` (g may carry HV heads, fla's layout),
    v ``[B, T, HV, V]`` and beta ``[B, T, HV]``; ValueError naming the argument otherwise."""
    for name, x, ndim in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("g", g, 4), ("beta", beta, 3)):
        check_tensor(name, x, ndim)
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:2] != (B, T) or HV % H != 0:
        raise ValueError(f"v must have shape [{B}, {T}, HV, V] with HV a multiple of q's "
                         f"{H} heads, got {tuple(v.shape)}")
    if g.shape not in ((B, T, H, K), (B, T, HV, K)):
        raise ValueError(f"g must have shape [{B}, {T}, {H} or {HV}, {K}], "
                         f"got {tuple(g.shape)}")
    if beta.shape != (B, T, HV):
        raise ValueError(f"beta must have shape {(B, T, HV)}, got {tuple(beta.shape)}")
    return B, T, H, HV, K, V


def check_gate(A_log, dt_bias, lower_bound, state_layout, *, HG: int, K: int) -> None:
    """``lower_bound`` in [-5, 0), ``A_log`` [HG] and ``dt_bias`` [HG * K] or [HG, K] (one per
    gate head), ``state_layout`` KV or VK; ValueError naming the argument otherwise."""
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)) \
            or not (-5.0 <= float(lower_bound) < 0.0):
        raise ValueError(f"lower_bound must be a number in [-5, 0), got {lower_bound!r}")
    if state_layout not in ("KV", "VK"):
        raise ValueError(f"state_layout must be 'KV' or 'VK', got {state_layout!r}")
    for name, p, shapes in (("A_log", A_log, ((HG,),)),
                            ("dt_bias", dt_bias, ((HG * K,), (HG, K)))):
        if p is not None:
            check_tensor(name, p, (1, 2))
            if tuple(p.shape) not in shapes:
                raise ValueError(f"{name} must have shape {' or '.join(map(str, shapes))} "
                                 f"(per gate head), got {tuple(p.shape)}")


def check_options(scale, **flags) -> None:
    """``scale`` None or a finite real number, each flag a bool; ValueError naming the
    argument otherwise (the kernels take them as a float and as compile-time switches)."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"scale must be None or a finite number, got {scale!r}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def check_state_pool(state_pool, *, HV: int, K: int, V: int, state_layout: str) -> None:
    """A pool ``[P, HV, K, V]`` (``"VK"``: ``[P, HV, V, K]``), fp32 or bf16, contiguous (it is
    updated in place); ValueError naming ``state_pool`` otherwise."""
    check_tensor("state_pool", state_pool, 4, (torch.float32, torch.bfloat16))
    want = (HV, V, K) if state_layout == "VK" else (HV, K, V)
    if tuple(state_pool.shape[1:]) != want:
        raise ValueError(f"state_pool must have shape [P, {', '.join(map(str, want))}] "
                         f"({state_layout}), got {tuple(state_pool.shape)}")
    if not state_pool.is_contiguous():
        raise ValueError("state_pool must be contiguous (it is updated in place)")
