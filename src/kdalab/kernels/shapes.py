"""The argument checks the prefill and the decode share: a tensor's kind, rank and dtype, and the
shapes of q, k, v, g and beta (GVA: v and beta with HV value heads, a multiple of q's H)."""

from __future__ import annotations

import torch

__all__ = ["FLOATS", "check_tensor", "head_shapes"]

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
