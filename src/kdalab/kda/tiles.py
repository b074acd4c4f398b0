"""Tile scaling: where the exponent exp(G_i − G_j) is split so that a decayed score matrix becomes
dense products. Strategies are values (:class:`TileScaling`); one function,
:func:`decayed_scores`, builds any of them under any precision recipe.

Inside a chunk, with cumulative log-decay G (per key channel, G_0 = 0 before the first token), the
intra-chunk score matrices are

    P_ij = Σ_d a_id · b_jd · exp(G_id − G_jd)      (i ≥ j; a = β-free keys for L, queries for Mqk)

=============  ==================================================================================
``chunk_start``  one boundary at the chunk's start (FlashKDA): a·exp(G) times b·exp(−G), one GEMM.
                 exp(−G) grows like exp(C·|g|): finite only while C·|g| stays inside the format.
``midpoint``     one boundary at token ⌊C/2⌋ (fla's sub-chunk offset): exponents at most half as
                 large on either side.
``per_pair``     exp(G_i − G_j) ≤ 1 formed for every pair (the position-pair diagonal path; no
                 overflow possible, no GEMM either).
``secondary``    the chunk cut into 16-token tiles; an off-diagonal tile (r > c) uses the shared
                 boundary G at the first token of row tile r (both factors ≤ 1, fla's ``b_gn``);
                 a diagonal tile is formed per pair (``secondary``) or with a fixed boundary inside
                 the tile (``secondary-start``, ``secondary-midpoint`` = fla's ``safe_gate`` M=16).
=============  ==================================================================================

Every factor is computed from G in the recipe's gate format, as ``exp2`` with FTZ when the recipe
says so (G is then base 2), rounded to ``scale_format``; an operand is the exact product rounded
once to ``operand_format``; products run under ``l_accumulation``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdalab.arith import Format, quantize
from kdalab.kda.recipe import Recipe

__all__ = ["TileScaling", "TILES", "get_tiles", "decay_factor", "operand", "decayed_scores"]


@dataclass(frozen=True)
class TileScaling:
    """A tile-scaling strategy.

    ``boundary``: ``"start"`` | ``"midpoint"`` | ``"pair"`` for the whole chunk, or ``"tiles"``:
    cut into ``sub_tile``-token tiles, off-diagonal tiles through a shared boundary and diagonal
    tiles by ``diagonal`` (``"pair"``, ``"start"``, ``"midpoint"``, ``"end"``).
    ``reuse_inverse_scale``: the state update's keys k·exp(G_C − G_j) are formed as
    (k·exp(−G_j))·exp(G_C) from the operand already built (FlashKDA), instead of directly.
    """

    name: str
    boundary: str
    sub_tile: int = 16
    diagonal: str = "pair"
    reuse_inverse_scale: bool = False

    def __post_init__(self) -> None:
        if self.boundary not in ("start", "midpoint", "pair", "tiles"):
            raise ValueError(f"tiles: unknown boundary {self.boundary!r}")
        if self.diagonal not in ("pair", "start", "midpoint", "end"):
            raise ValueError(f"tiles: unknown diagonal {self.diagonal!r}")
        if self.sub_tile < 1:
            raise ValueError(f"tiles: sub_tile must be >= 1, got {self.sub_tile}")


CHUNK_START = TileScaling("chunk_start", "start", reuse_inverse_scale=True)
MIDPOINT = TileScaling("midpoint", "midpoint")
PER_PAIR = TileScaling("per_pair", "pair")
SECONDARY = TileScaling("secondary", "tiles", diagonal="pair")
SECONDARY_START = TileScaling("secondary-start", "tiles", diagonal="start")
SECONDARY_MIDPOINT = TileScaling("secondary-midpoint", "tiles", diagonal="midpoint")

TILES: dict[str, TileScaling] = {t.name: t for t in (
    CHUNK_START, MIDPOINT, PER_PAIR, SECONDARY, SECONDARY_START, SECONDARY_MIDPOINT)}


def get_tiles(spec: str | TileScaling) -> TileScaling:
    if isinstance(spec, TileScaling):
        return spec
    try:
        return TILES[spec]
    except KeyError:
        raise ValueError(f"tiles must be one of {', '.join(TILES)}, got {spec!r}") from None


# --- factors and operands -------------------------------------------------------------------

_HALF = (torch.bfloat16, torch.float16)

def decay_factor(rel: torch.Tensor, recipe: Recipe, fmt: Format | None = None) -> torch.Tensor:
    """exp(rel) as the recipe computes it: exp2 with FTZ of a base-2 exponent in float32 (by the
    recipe's scalar ops), or the correctly rounded exp; rounded to ``fmt`` (default
    ``scale_format``)."""
    fmt = recipe.scale_format if fmt is None else fmt
    if recipe.exp2_ftz:
        y = recipe.scalar_ops.exp2_f32(rel)  # rel is base 2 (the gate folded log2 e in)
    else:
        y = torch.exp(rel.double())
    return quantize(y, fmt)


def operand(x: torch.Tensor, factor: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The exact product x·factor rounded once to ``fmt`` (a bf16×bf16 product in torch)."""
    if x.dtype in _HALF and factor.dtype in _HALF:  # ≤ 22 significant bits: exact in float32
        return quantize(x.float() * factor.float(), fmt)  # (torch's own 16-bit product)
    return quantize(x.double() * factor.double(), fmt)


def _left(a, factor, recipe: Recipe, post_scale):
    left = operand(a, factor, recipe.operand_format)
    if post_scale is not None:  # FlashKDA: bf16(bf16(q·exp G) · bf16(scale))
        left = operand(left, quantize(post_scale.to(torch.float64), recipe.operand_format),
                       recipe.operand_format)
    return left


def _split_gram(a, b, g, gb, recipe: Recipe, post_scale):
    """[..., R, K] × [..., S, K] through one boundary gb [..., 1, K]."""
    acc = recipe.l_accumulation
    left = _left(a, decay_factor(g[0] - gb, recipe), recipe, post_scale)
    right = operand(b, decay_factor(gb - g[1], recipe), recipe.operand_format)
    return acc.matmul(left, right.transpose(-1, -2))


def _pair_gram(a, b, ga, gb, recipe: Recipe, post_scale):
    """Every pair with its own factor exp(min(G_i − G_j, 0)): [..., R, S]."""
    acc = recipe.l_accumulation
    rel = (ga.unsqueeze(-2) - gb.unsqueeze(-3)).clamp(max=0)  # [..., R, S, K]
    left = _left(a.unsqueeze(-2), decay_factor(rel, recipe), recipe, post_scale)
    right = quantize(b, recipe.operand_format).unsqueeze(-3)  # [..., 1, S, K]
    out = acc.matmul(left.unsqueeze(-2), right.unsqueeze(-1))  # [..., R, S, 1, 1]
    return out[..., 0, 0]


def _boundary(g: torch.Tensor, lo: int, hi: int, where: str) -> torch.Tensor:
    """G_b for the token range [lo, hi) of a chunk: ``start`` = G before token lo (0 at the
    chunk's start), ``midpoint`` = G at token lo + ⌊(hi−lo)/2⌋, ``end`` = G at token hi − 1."""
    if where == "start":
        return torch.zeros_like(g[..., :1, :]) if lo == 0 else g[..., lo - 1 : lo, :]
    if where == "midpoint":
        m = lo + (hi - lo) // 2
        return g[..., m : m + 1, :]
    return g[..., hi - 1 : hi, :]


def decayed_scores(
    a: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor,
    tiles: TileScaling | str,
    recipe: Recipe,
    *,
    strict: bool,
    post_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """P_ij = Σ_d a_id b_jd exp(G_id − G_jd) over the causal part of each chunk.

    ``a, b [..., C, K]``, ``g [..., C, K]`` the cumulative log-decay from the chunk's start.
    ``strict``: keep i > j (L) or i ≥ j (Mqk). ``post_scale`` multiplies the left operand after
    its decay (the attention scale on q). Returns ``[..., C, C]`` in the accumulation's dtype,
    zero outside the causal part.
    """
    tiles = get_tiles(tiles)
    c = a.shape[-2]
    if tiles.boundary in ("start", "midpoint"):
        gb = _boundary(g, 0, c, tiles.boundary)
        p = _split_gram(a, b, (g, g), gb, recipe, post_scale)
    elif tiles.boundary == "pair":
        p = _pair_gram(a, b, g, g, recipe, post_scale)
    else:
        size = min(tiles.sub_tile, c)
        edges = list(range(0, c, size)) + [c]
        rows = []
        for r in range(len(edges) - 1):
            r0, r1 = edges[r], edges[r + 1]
            blocks = []
            for cc in range(len(edges) - 1):
                c0, c1 = edges[cc], edges[cc + 1]
                ar, gr = a[..., r0:r1, :], g[..., r0:r1, :]
                bc, gc = b[..., c0:c1, :], g[..., c0:c1, :]
                if cc < r:
                    gb = g[..., r0 : r0 + 1, :]  # first token of the row tile
                    blk = _split_gram(ar, bc, (gr, gc), gb, recipe, post_scale)
                elif cc == r and tiles.diagonal == "pair":
                    blk = _pair_gram(ar, bc, gr, gc, recipe, post_scale)
                elif cc == r:
                    gb = _boundary(g, r0, r1, tiles.diagonal)
                    blk = _split_gram(ar, bc, (gr, gc), gb, recipe, post_scale)
                else:
                    blk = None
                blocks.append(blk)
            ref = next(x for x in blocks if x is not None)
            blocks = [x if x is not None else ref.new_zeros(ref.shape[:-1] + (edges[i + 1] -
                      edges[i],)) for i, x in enumerate(blocks)]
            rows.append(torch.cat(blocks, dim=-1))
        p = torch.cat(rows, dim=-2)
    return torch.tril(p, diagonal=-1 if strict else 0)
