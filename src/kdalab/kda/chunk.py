"""The chunked KDA forward: one algorithm, parameterized by chunk size, tile scaling, inverse and
precision recipe.

Per sequence and value head, the sequence is cut into chunks of C tokens (the last one padded with
inert zeros). Within a chunk, with G the cumulative log-decay from the chunk's start, the state S
``[K, V]`` at its start and Γ_i = exp(G_i):

    L    = tril₋₁(β_i · k_i·k_j · exp(G_i − G_j))             (tiles → recipe.l_format)
    Mqk  = tril₀(scale · q_i·k_j · exp(G_i − G_j))            (tiles → recipe.mqk_format)
    INV  = (I + L)⁻¹                                          (inverse → recipe.inv_format)
    U    = INV · (β ⊙ (V − (Γ⊙K) S))
    O    = (scale · Γ⊙Q) S + Mqk · U
    S'   = exp(G_C) ⊙ S + (exp(G_C − G)⊙K)ᵀ U

This is FlashKDA's form (its ``tests/torch_ref.py``, Neumann version), step for step: the
``flashkda`` recipe with ``tiles="chunk_start"``, ``inverse="neumann"`` and C = 16 performs the same
roundings in the same order (bf16 products in fp32 rounded once, fp16 L and β, fp16 Neumann,
bf16 INV/Mqk/U/outputs, bf16 state updated by an fp32 FMA). Two things differ from the GPU:
FlashKDA's ``tanh.approx`` sigmoid (kdalab: float32 sigmoid) and the order in which cuBLAS /
Tensor Cores sum (kdalab: the recipe's accumulation models; ``h200`` when registered).

All chunks' intra-chunk work (scores, inverses, scaled operands) is one batch of tensor
operations; only the state recurrence walks the chunks in order.
"""

from __future__ import annotations

import math

import torch

from kdalab import params
from kdalab.arith import FP32, FP64, Format, get_format, quantize
from kdalab.kda.gate import Prepared, prepare_inputs
from kdalab.kda.inverse import (
    INVERSES,
    block_substitution,
    exact_inverse,
    forward_substitution,
    neumann_inverse,
)
from kdalab.kda.recipe import Recipe, get_recipe
from kdalab.kda.tiles import TileScaling, decay_factor, decayed_scores, get_tiles, operand

__all__ = ["forward", "forward_prepared", "chunk_core", "prepare_for_recipe", "INVERSES"]


def _cdt(fmt: Format) -> torch.dtype:
    """The dtype an elementwise operation on values of ``fmt`` is computed in (torch computes
    bf16/fp16 elementwise operations in float32 and rounds once)."""
    return torch.float64 if fmt == FP64 else torch.float32


def _ew(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    return quantize(x, fmt)


_INVERT = {
    "neumann": lambda l, r: neumann_inverse(l, r.inverse_accumulation, r.inverse_format).inverse,
    "forward_substitution": lambda l, r: forward_substitution(l, r.inverse_accumulation,
                                                              r.inverse_format),
    "block_substitution": lambda l, r: block_substitution(l, r.inverse_accumulation,
                                                          r.inverse_format),
    "exact": lambda l, r: exact_inverse(l),
}


def _invert(l: torch.Tensor, inverse: str, recipe: Recipe) -> torch.Tensor:
    return quantize(_INVERT[inverse](l, recipe), recipe.inv_format)


_INTRA_ELEMENTS = 1 << 23  # elements of a [.., C, C, K] per-pair block processed at once


def _intra(qc, kc, g, bc, scale_t, tiles, inverse, recipe):
    """Mqk and (I + L)⁻¹ of a batch of chunks."""
    l = decayed_scores(kc, kc, g, tiles, recipe, strict=True)
    l = quantize(l, recipe.l_format)
    beta_l = quantize(bc, recipe.beta_format)
    l = operand(l, beta_l.unsqueeze(-1), recipe.l_format)
    mqk = quantize(decayed_scores(qc, kc, g, tiles, recipe, strict=False, post_scale=scale_t),
                   recipe.mqk_format)
    return mqk, _invert(l, inverse, recipe)


def chunk_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state: torch.Tensor | None,
    *,
    chunk_size: int,
    tiles: TileScaling,
    inverse: str,
    recipe: Recipe,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked forward on core-layout tensors ``[N, HV, T, ·]`` (see :class:`Prepared`), with
    typed options (as :func:`forward_prepared` checks them).

    ``log_decay`` is base 2 when ``recipe.exp2_ftz``. Returns ``o [N, HV, T, V]`` (work format
    values) and the final state ``[N, HV, K, V]`` in the state format.
    """
    c = int(chunk_size)
    if inverse == "neumann" and recipe.inverse is not None:  # the recipe's kernel's own inverse
        inverse = recipe.inverse
    if inverse == "block_substitution" and c % 8:
        raise ValueError(f"chunk_size must be a multiple of 8 for the block_substitution "
                         f"inverse (8×8 diagonal blocks), got {c}")
    n, hv, t, kd = q.shape
    vd = v.shape[-1]
    nc = max(1, math.ceil(t / c))
    pad = nc * c - t
    gdt = _cdt(recipe.gate_format)

    def chunks(x, width=True):
        if pad:
            shape = list(x.shape)
            shape[2] = pad
            x = torch.cat([x, x.new_zeros(shape)], dim=2)
        return x.reshape(n, hv, nc, c, *x.shape[3:]) if width else x.reshape(n, hv, nc, c)

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    # G from each chunk's start, in the gate format, summed as the recipe's kernel sums it
    g = recipe.scalar_ops.cumsum_along(chunks(log_decay.to(gdt)), -2)
    bc = chunks(beta.to(gdt), width=False)
    acc = recipe.matmul_accumulation
    op_fmt, work = recipe.operand_format, recipe.work_format
    scale_t = torch.tensor(scale, dtype=torch.float64, device=q.device)

    # Intra-chunk, every chunk at once (in slices of chunks where per-pair factors [C, C, K]
    # would not fit in memory otherwise: the results do not depend on the slicing).
    pairs = tiles.boundary == "pair" or (tiles.boundary == "tiles" and tiles.diagonal == "pair")
    per_chunk = n * hv * c * (c if pairs else 1) * kd
    step = max(1, _INTRA_ELEMENTS // max(per_chunk, 1))
    parts = [_intra(qc[:, :, j:j + step], kc[:, :, j:j + step], g[:, :, j:j + step],
                    bc[:, :, j:j + step], scale_t, tiles, inverse, recipe)
             for j in range(0, nc, step)]
    mqk = torch.cat([p[0] for p in parts], dim=2)
    inv = torch.cat([p[1] for p in parts], dim=2)

    gamma = decay_factor(g, recipe)  # exp(G_i), ≤ 1
    q_dec = operand(operand(qc, gamma, op_fmt), quantize(scale_t, op_fmt), op_fmt)
    k_dec = operand(kc, gamma, op_fmt)
    g_last = g[..., -1:, :]
    if tiles.reuse_inverse_scale:  # FlashKDA: k_restored = (k·exp(−G))·exp(G_C)
        k_inv = operand(kc, decay_factor(-g, recipe), op_fmt)
        k_upd = operand(k_inv, decay_factor(g_last, recipe), op_fmt)
    else:
        k_upd = operand(kc, decay_factor(g_last - g, recipe), op_fmt)
    decay_state = decay_factor(g_last, recipe, recipe.gate_format)  # exp(G_C) for S, [.., 1, K]
    decay_state = decay_state.transpose(-1, -2)  # [..., K, 1]
    beta_w = quantize(bc, work).to(_cdt(work)).unsqueeze(-1)

    # The recurrence over chunks.
    sfmt = recipe.state_format
    s = (torch.zeros(n, hv, kd, vd, dtype=torch.float64, device=q.device) if state is None
         else state.double())
    s = quantize(s, sfmt)
    outs = []
    cw = _cdt(work)
    for i in range(nc):
        s_op = quantize(s, recipe.state_operand_format)
        w = quantize(acc.matmul(k_dec[:, :, i], s_op), work)
        vn = _ew(vc[:, :, i].to(cw) - w.to(cw), work)
        vn = _ew(vn.to(cw) * beta_w[:, :, i], work)
        u = quantize(acc.matmul(inv[:, :, i], vn), work)
        o = quantize(acc.matmul(q_dec[:, :, i], s_op), work)
        o = _ew(o.to(cw) + quantize(acc.matmul(mqk[:, :, i], u), work).to(cw), work)
        outs.append(o)
        ds = acc.matmul(k_upd[:, :, i].transpose(-1, -2), u)  # [N, HV, K, V]
        dec = decay_state[:, :, i]
        if recipe.state_update == "fma":  # one fp32 rounding of ds + s·dec, then the state format
            s = quantize(quantize(ds.double() + s.double() * dec.double(), FP32), sfmt)
        else:  # "mul_add"
            sd = _cdt(sfmt)
            s = _ew(_ew(s.to(sd) * dec.to(sd), sfmt).to(sd) + ds.to(sd), sfmt)
    o = torch.stack(outs, dim=2).reshape(n, hv, nc * c, vd)[:, :, :t]
    return o, s


def prepare_for_recipe(q, k, v, g, beta, *, recipe: Recipe | str = "flashkda",
                       **kwargs) -> Prepared:
    """:func:`kdalab.kda.gate.prepare_inputs` in the recipe's arithmetic (gate format, base-2
    gate with FTZ, input rounding, FlashKDA's normalization order)."""
    recipe = get_recipe(recipe)
    return prepare_inputs(
        q, k, v, g, beta, input_format=recipe.input_format, gate_format=recipe.gate_format,
        base2=recipe.exp2_ftz, ftz=recipe.exp2_ftz, l2norm_lanes=recipe.l2norm_lanes,
        scalar_ops=recipe.scalar_ops, **kwargs)


def _options(chunk_size, tiles, inverse, recipe):
    """The chunked forward's options, parsed once (ValueError naming the argument)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    return (params.integer(chunk_size, "chunk_size", 1), get_tiles(tiles),
            params.choice(inverse, "inverse", INVERSES), get_recipe(recipe))


def forward_prepared(prep: Prepared, *, chunk_size: int = 16, tiles="chunk_start",
                     inverse: str = "neumann", recipe: Recipe | str = "flashkda"):
    """The chunked forward on prepared inputs; ``(o [N, HV, T, V], S [N, HV, K, V])`` raw."""
    chunk_size, tiles, inverse, recipe = _options(chunk_size, tiles, inverse, recipe)
    return chunk_core(prep.q, prep.k, prep.v, prep.log_decay, prep.beta, prep.scale, prep.state,
                      chunk_size=chunk_size, tiles=tiles, inverse=inverse, recipe=recipe)


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = -5.0,
    gate: str = "lower_bound",
    beta_is_logits: bool = True,
    use_qk_l2norm: bool = True,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 16,
    tiles: str | TileScaling = "chunk_start",
    inverse: str = "neumann",
    recipe: str | Recipe = "flashkda",
    state_layout: str = "KV",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked KDA forward. Returns ``(o, final_state)``.

    Layouts as fla and FlashKDA: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]`` (HV a multiple of H),
    ``g [B, T, H or HV, K]`` (gate input; the log-decay itself with ``gate="log_decay"``),
    ``beta [B, T, HV]`` (logits unless ``beta_is_logits=False``), ``A_log [H]``, ``dt_bias [H*K]``
    or ``[H, K]``, ``initial_state`` and ``final_state [N, HV, K, V]`` (``state_layout="VK"``:
    ``[N, HV, V, K]``, FlashKDA's), N = B or the number of ``cu_seqlens`` sequences (B = 1).
    ``o`` is in the recipe's output format (its torch dtype; the input's dtype for recipes without
    one), the final state in the recipe's state format; the fp64 recipe returns float64.
    Bad arguments raise ``ValueError`` naming the argument.
    """
    chunk_size, tiles, inverse, recipe = _options(chunk_size, tiles, inverse, recipe)
    prep = prepare_for_recipe(
        q, k, v, g, beta, recipe=recipe, scale=scale, A_log=A_log, dt_bias=dt_bias,
        lower_bound=lower_bound, gate=gate, beta_is_logits=beta_is_logits,
        use_qk_l2norm=use_qk_l2norm, initial_state=initial_state, cu_seqlens=cu_seqlens,
        state_layout=state_layout)
    o, s = chunk_core(prep.q, prep.k, prep.v, prep.log_decay, prep.beta, prep.scale, prep.state,
                      chunk_size=chunk_size, tiles=tiles, inverse=inverse, recipe=recipe)
    out_fmt = recipe.output_format if recipe.output_format is not None else _format_of(v.dtype)
    o = quantize(prep.unpack(o), out_fmt)
    s = quantize(s, recipe.state_format)
    return o, (Prepared.state_out(s, state_layout) if output_final_state else None)


def _format_of(dtype: torch.dtype) -> Format:
    return get_format({torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                       torch.float64: "fp64"}[dtype])
