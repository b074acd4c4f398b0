"""The intra-chunk matrix L of the delta rule: the stable fp64 form and the kernels' form.

Inside a chunk of C tokens with keys k_i, per-step log-decay g_t < 0 (G_i = Σ_{t≤i} g_t) and
write strengths β_i, the delta-rule system is (I + L) with the strictly lower-triangular

    L_ij = β_i · (k_i · k_j) · exp(G_i − G_j),   i > j.

The *stable* form computes exp(G_i − G_j) ≤ 1 per pair in float64. The *kernel* form splits it
around a boundary G_b — exp(G_i − G_b) on the rows, exp(G_b − G_j) on the columns — so that L is
one dense GEMM of scaled keys, in the formats and accumulation a :class:`~kdalab.kda.recipe.Recipe`
names. Everything is batched: leading dimensions are runs.

Shapes: ``keys [..., C, D]``, ``log_decay [..., C]`` (or per channel ``[..., C, D]``),
``beta [..., C]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kdalab.arith import FP32, exp2_ftz, quantize, torch_cast
from kdalab.arith.linalg import matmul64
from kdalab.kda.recipe import Recipe, get_recipe
from kdalab.kda.tiles import decay_factor, operand

__all__ = ["LOG2E", "BOUNDARIES", "stable_l", "kernel_l", "KernelL", "boundary_log_decay",
           "split_factors", "per_pair_l", "PerPairL"]

LOG2E = math.log2(math.e)
BOUNDARIES = ("start", "midpoint", "end")


def _check(keys: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor) -> None:
    if keys.dim() < 2:
        raise ValueError(f"keys must be [..., C, D], got shape {tuple(keys.shape)}")
    c = keys.shape[-2]
    if log_decay.shape[-1] != c and not (log_decay.dim() >= 2 and log_decay.shape[-2:] ==
                                          keys.shape[-2:]):
        raise ValueError(f"log_decay must be [..., C] or [..., C, D] with C={c}, got "
                         f"{tuple(log_decay.shape)}")
    if beta.shape[-1] != c:
        raise ValueError(f"beta must be [..., C] with C={c}, got {tuple(beta.shape)}")


def _cumulative(log_decay: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """G as [..., C, 1] (scalar decay per step) or [..., C, D] (per channel), float64."""
    if log_decay.shape[-2:] == keys.shape[-2:] and log_decay.dim() == keys.dim():
        return log_decay.double().cumsum(-2)
    return log_decay.double().cumsum(-1).unsqueeze(-1)


def stable_l(keys: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """L in float64 with exp(G_i − G_j) formed per pair (never above 1). ``[..., C, C]``."""
    _check(keys, log_decay, beta)
    k = keys.double()
    g = _cumulative(log_decay, keys)
    if g.shape[-1] == 1:
        dots = matmul64(k, k.transpose(-1, -2))
        ratio = torch.exp((g - g.transpose(-1, -2)).clamp(max=0.0))
        l = dots * ratio * beta.double().unsqueeze(-1)
    else:  # per-channel decay: Σ_d k_id k_jd exp(G_id − G_jd)
        diff = (g.unsqueeze(-2) - g.unsqueeze(-3)).clamp(max=0.0)  # [..., C, C, D]
        l = (k.unsqueeze(-2) * k.unsqueeze(-3) * torch.exp(diff)).sum(-1)
        l = l * beta.double().unsqueeze(-1)
    return torch.tril(l, diagonal=-1)


def boundary_log_decay(g: torch.Tensor, boundary: str) -> torch.Tensor:
    """G_b for cumulative log-decay ``g`` [..., C, X]: ``start`` (G before the first token, 0),
    ``midpoint`` (G at token ⌊C/2⌋, 0-based: fla's sub-chunk offset), ``end`` (G at the last token).
    Returns [..., 1, X]."""
    if boundary == "start":
        return torch.zeros_like(g[..., :1, :])
    if boundary == "midpoint":
        c = g.shape[-2]
        return g[..., c // 2 : c // 2 + 1, :]
    if boundary == "end":
        return g[..., -1:, :]
    raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}, got {boundary!r}")


def split_factors(rel: torch.Tensor, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(G_i − G_b) and exp(G_b − G_i) for ``rel`` = G_i − G_b (natural log, float64), along the
    recipe's scale path: the base-2 exponent rel·log₂e with exp2 and FTZ in float32, or exp
    rounded once; rounded to ``scale_format``. The factors the kernels' L is built from."""
    if recipe.exp2_ftz:
        rel = rel * LOG2E  # the kernels' base-2 exponent
    return decay_factor(rel, recipe), decay_factor(-rel, recipe)


@dataclass(frozen=True)
class KernelL:
    """The kernel's L and the scale factors it was built from."""

    l: torch.Tensor  # [..., C, C] in recipe.l_format (β applied, strictly lower)
    decay: torch.Tensor  # exp(G_i − G_b) in recipe.scale_format, [..., C, X]
    inv_decay: torch.Tensor  # exp(G_b − G_j) in recipe.scale_format, [..., C, X]


def kernel_l(
    keys: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    recipe: Recipe | str = "seed",
    boundary: str = "start",
) -> KernelL:
    """L as the kernels build it: split exponent scales, dense GEMM, recipe formats.

    With the ``seed`` recipe and ``boundary="start"`` this is, operation for operation, the seed
    document's ``kernel_l`` (FlashKDA K1): base-2 scales exp2(±G·log2 e) in float32 with FTZ, cast
    to bf16; bf16 scaled keys; fp32-accumulated GEMM stored fp16; strict lower triangle; times
    β in fp16.
    """
    _check(keys, log_decay, beta)
    recipe = get_recipe(recipe)
    g = _cumulative(log_decay, keys)
    decay, inv_decay = split_factors(g - boundary_log_decay(g, boundary), recipe)
    # The scaled operands: one rounding of the exact product to the operand format.
    k_decayed = operand(keys, decay, recipe.operand_format)
    k_inverse = operand(keys, inv_decay, recipe.operand_format)
    acc = recipe.l_accumulation
    l = quantize(acc.matmul(k_decayed, k_inverse.transpose(-1, -2)), recipe.l_format)
    l = torch.tril(l, diagonal=-1)
    b = torch_cast(beta.double(), recipe.beta_format)  # the seed's beta.half() on float64
    l = quantize(l.double() * b.unsqueeze(-1), recipe.l_format)
    return KernelL(l=l, decay=decay, inv_decay=inv_decay)


@dataclass(frozen=True)
class PerPairL:
    """L built with the decay formed per pair, and the factors it used."""

    l: torch.Tensor  # [..., C, C] in recipe.l_format (β applied, strictly lower)
    scales: torch.Tensor  # exp(G_i − G_j) in recipe.scale_format, [..., C, C, X]; 1 for i < j


def per_pair_l(keys: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor,
               recipe: Recipe | str = "seed") -> PerPairL:
    """L with exp(G_i − G_j) (i ≥ j, never above 1) formed for every pair: no split exponent.

    Each factor follows the recipe's scale path (exp2 in float32 with FTZ, cast to
    ``scale_format``), so its only failure is underflow. Scalar decay (``log_decay [..., C]``):
    k_i·k_j by the recipe's GEMM accumulation, times the factor in float32. Per-channel decay
    (``[..., C, D]``): Σ_d k_id·k_jd·s_ijd in float32 (no GEMM possible). Then stored in
    ``l_format``, strict lower triangle, times β as :func:`kdalab.kda.intra.kernel_l` does.
    """
    recipe = get_recipe(recipe)
    if keys.dim() < 2:
        raise ValueError(f"keys must be [..., C, D], got shape {tuple(keys.shape)}")
    per_channel = log_decay.dim() == keys.dim() and log_decay.shape[-2:] == keys.shape[-2:]
    if not per_channel and log_decay.shape[-1] != keys.shape[-2]:
        raise ValueError(f"log_decay must be [..., C] or [..., C, D], got {tuple(log_decay.shape)}")
    g = log_decay.double().cumsum(-2) if per_channel else log_decay.double().cumsum(-1)[..., None]
    diff = (g.unsqueeze(-2) - g.unsqueeze(-3)).clamp(max=0.0)  # [..., i, j, X] = G_i − G_j
    if recipe.exp2_ftz:
        s = exp2_ftz(diff * LOG2E)
    else:
        s = torch.exp(diff)
    s = quantize(s, recipe.scale_format)
    k = keys.float()
    if per_channel:
        l = (k.unsqueeze(-2) * k.unsqueeze(-3) * s.float()).sum(-1)  # float32
    else:
        dots = recipe.l_accumulation.matmul(keys, keys.transpose(-1, -2))
        l = quantize(dots.double() * s[..., 0].double(), FP32)  # one float32 multiply
    l = torch.tril(quantize(l, recipe.l_format), diagonal=-1)
    b = torch_cast(beta.double(), recipe.beta_format)
    l = quantize(l.double() * b.unsqueeze(-1), recipe.l_format)
    return PerPairL(l=l, scales=s)
