"""Precision recipes: which format and which accumulation model at each stage, as values.

A recipe never changes *what* is computed, only the arithmetic each stage is computed in. The
chunked algorithm reads these fields; FlashKDA's path, fla's path, fp32 and fp64 are presets.

Fields used by the intra-chunk stages (``kdalab.kda.intra``, ``kdalab.kda.inverse``):

``scale_format``        format of the decay factors exp(±(G - G_b)) (FlashKDA: bf16)
``exp2_ftz``            scales computed as exp2 of the base-2 log-decay with flush-to-zero
``operand_format``      format of the scaled GEMM operands k·exp(G), k·exp(-G) (bf16)
``l_accumulation``      accumulation model of the GEMM that builds L (fp32 on the Tensor Cores)
``l_format``            storage format of L (fp16)
``beta_format``         format β is applied in (fp16)
``inverse_accumulation`` accumulation model of the Neumann products (fp16 accumulate), or of
                        the block merge's products for ``block_substitution``
``inverse_format``      storage format of the inverse and its powers (fp16), or of the block
                        merge's operands for ``block_substitution`` (bf16)
``inverse``             the inverse the recipe's kernel runs in place of the Neumann product
                        (None: the Neumann product; FlashKDA v2: ``"block_substitution"``): the
                        chunked forward's ``inverse="neumann"`` (its default) then means this one;
                        ``exact`` and ``forward_substitution`` still replace it

Fields used by the whole chunked forward (``kdalab.kda.chunk``; defaults are FlashKDA v1's):

``input_format``        q, k, v are rounded to it on entry (bf16); None keeps the caller's values
``gate_format``         arithmetic of gate, β, q/k normalization and the cumulative log-decay (fp32)
``l2norm_lanes``        FlashKDA's reduction order for Σx² (16 lanes, butterfly); None: torch's sum
``mqk_format``          storage of the causal q·k score matrix Mqk (bf16)
``inv_format``          storage of (I + L)⁻¹ as the WY products use it (bf16)
``matmul_accumulation`` accumulation model of every other product (K̃S, INV·V, q̃S, Mqk·U, K̂ᵀU)
``work_format``         storage of the chunk's intermediates (K̃S, V − K̃S, β·V, U, outputs) (bf16)
``state_format``        storage of the recurrent state between chunks (bf16)
``state_operand_format`` format the state is rounded to when it enters a product (bf16)
``state_update``        ``"fma"``: S ← fl(ΔS + S·exp(g_C)) in fp32, one rounding (FlashKDA);
                        ``"mul_add"``: S·exp(g_C) rounded, then + ΔS rounded (fla)
``scalar_ops``          how the gate's float32 sigmoid, exp2 (the scales too), the normalization's
                        rsqrt and the log-decay's running sum are computed
                        (:class:`~kdalab.arith.scalar.ScalarOps`: ``torch``, ``sm90``); a name
                        or the value
``output_format``       format of o (bf16); None: the input's dtype

A recipe is a typed value: formats are :class:`~kdalab.arith.Format` values and accumulations
:class:`~kdalab.arith.AccumulationModel` values (given by name, they are looked up once, when the
recipe is made).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from kdalab import params
from kdalab.arith import (
    BF16,
    FP16,
    FP32,
    FP64,
    TF32,
    AccumulationModel,
    Format,
    get_accumulation,
    get_format,
)
from kdalab.arith.scalar import SM90_OPS, TORCH_OPS, ScalarOps, get_scalar_ops
from kdalab.kda.inverse import INVERSES

__all__ = ["Recipe", "SEED", "FLASHKDA", "FLASHKDA_H200", "FLASHKDA_V2", "FLASHKDA_V2_H200", "FLA",
           "FP32_RECIPE", "FP64_RECIPE", "RECIPES", "get_recipe"]


@dataclass(frozen=True)
class Recipe:
    name: str
    scale_format: Format = BF16
    exp2_ftz: bool = True
    operand_format: Format = BF16
    l_accumulation: AccumulationModel = "fp32"
    l_format: Format = FP16
    beta_format: Format = FP16
    inverse_accumulation: AccumulationModel = "fp16-seq"
    inverse_format: Format = FP16
    input_format: Format | None = BF16
    gate_format: Format = FP32
    l2norm_lanes: int | None = 16
    mqk_format: Format = BF16
    inv_format: Format = BF16
    matmul_accumulation: AccumulationModel = "fp32"
    work_format: Format = BF16
    state_format: Format = BF16
    state_operand_format: Format = BF16
    state_update: str = "fma"
    output_format: Format | None = BF16
    scalar_ops: ScalarOps = TORCH_OPS
    inverse: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_format") and value is not None:
                value = get_format(value)
            elif f.name.endswith("_accumulation"):
                try:  # looked up only: a GPU model is checked for its device when it runs
                    value = get_accumulation(value)
                except ValueError as exc:
                    raise ValueError(f"{f.name}: {exc}") from None
            elif f.name == "scalar_ops":
                value = get_scalar_ops(value)
            object.__setattr__(self, f.name, value)
        params.choice(self.state_update, "state_update", ("fma", "mul_add"))
        if self.inverse is not None:
            params.choice(self.inverse, "inverse", INVERSES)

    def emulated(self) -> list[str]:
        """The roundings this recipe emulates: formats other than fp32 and fp64, accumulation
        models other than theirs, scalar ops other than torch's. None: its every rounding is a
        float cast, which torch's autograd differentiates in the same arithmetic (an emulated
        one it takes as the identity or as zero: the recipe then has no backward to offer)."""
        out = {getattr(self, f.name).name for f in fields(self)
               if f.name.endswith(("_format", "_accumulation")) and getattr(self, f.name)
               is not None and getattr(self, f.name).name not in (FP32.name, FP64.name)}
        return sorted(out) + ([f"{self.scalar_ops.name} scalar ops"]
                              if self.scalar_ops != TORCH_OPS else [])

    def with_(self, **changes) -> Recipe:
        """A copy with some fields changed (formats, accumulations and scalar ops may be given
        by name)."""
        return replace(self, **changes)


#: The seed document's emulation of FlashKDA's K1 path for L and its inverse.
SEED = Recipe("seed")
#: FlashKDA v1's precision path (docs/flashkda.md), operation by operation: base-2 gate in fp32,
#: bf16 q/k/v and scaled operands, L accumulated in fp32 and stored fp16, β in fp16 for L,
#: Neumann in fp16 (each product one Tensor-Core block, ``h200``), INV and Mqk in bf16, bf16
#: intermediates, state kept in bf16 and updated by an fp32 FMA, bf16 output; its scalar
#: arithmetic the H200's (``sm90``: ``tanh.approx`` sigmoid, ``ex2.approx.ftz``,
#: ``rsqrt.approx.ftz``, the chunk's log-decay summed row by row). Its bf16 products in torch's
#: float32 order (fast; FlashKDA's own order is ``flashkda-h200``).
FLASHKDA = Recipe("flashkda", scalar_ops=SM90_OPS, inverse_accumulation="h200")
#: FlashKDA on the H200, bit for bit (its CUDA kernel; its torch reference gives the same bits
#: there): flashkda with every bf16 product as the kernel's chain of ``mma.sync`` bf16→fp32
#: blocks in k order and the Neumann products as ``mma.sync`` fp16 blocks (bit-exact models from
#: ``kdalab.arith.tensorcore``).
FLASHKDA_H200 = FLASHKDA.with_(name="flashkda-h200", l_accumulation="h200-bf16-fp32",
                               inverse_accumulation="h200-mma",
                               matmul_accumulation="h200-bf16-fp32")
#: FlashKDA v2 (vllm-project/FlashKDA 3b225bf, its torch reference ``tests/torch_ref.py``): v1 but
#: for the inverse, which the Neumann series lost when |L| → 1 (near-collinear keys). L stays in
#: fp32 (the bf16 GEMM's fp32 result), β multiplies it in fp32, (I + L)⁻¹ is
#: ``block_substitution``: the two 8×8 diagonal blocks by an fp32 FMA chain in the reference's
#: order, joined by two bf16 products accumulated in fp32, bf16 out (docs/flashkda.md). Its bf16
#: products in torch's float32 order (fast; the H200's order is ``flashkda-v2-h200``).
FLASHKDA_V2 = FLASHKDA.with_(name="flashkda-v2", l_format=FP32, beta_format=FP32,
                             inverse="block_substitution", inverse_accumulation="fp32",
                             inverse_format=BF16)
#: FlashKDA v2's reference on the H200, bit for bit: flashkda-v2 with every bf16 product (L, the
#: merge's two, the chunk's) as chained ``mma.sync`` bf16→fp32 blocks (``h200-bf16-fp32``), the
#: H200's tanh.approx / ex2.approx / rsqrt.approx as flashkda-h200.
FLASHKDA_V2_H200 = FLASHKDA_V2.with_(name="flashkda-v2-h200", l_accumulation="h200-bf16-fp32",
                                     inverse_accumulation="h200-bf16-fp32",
                                     matmul_accumulation="h200-bf16-fp32")
#: fla's ``chunk_kda`` (chunk 64): fp32 gate and decay scales (exp2, no FTZ), tf32 operands for the
#: intra-chunk scores (tl.dot of fp32 tiles), L in fp32 solved in fp32, the inverse and Aqk stored
#: in bf16, bf16 intermediates, state kept in fp32 (rounded to bf16 inside products), bf16 output.
FLA = Recipe(
    "fla", scale_format=FP32, exp2_ftz=False, operand_format=TF32, l_accumulation="fp32",
    l_format=FP32, beta_format=FP32, inverse_accumulation="fp32", inverse_format=FP32,
    input_format=None, l2norm_lanes=None, state_format=FP32, state_update="mul_add",
    output_format=None,
)


def _throughout(fmt: Format) -> Recipe:
    """Every stage in ``fmt``, every product by its plain GEMM (named as the format), no FTZ, the
    state update's product and sum rounded apart; q, k, v kept as the caller gives them."""
    formats = {f.name: fmt for f in fields(Recipe) if f.name.endswith("_format")}
    models = {f.name: fmt.name for f in fields(Recipe) if f.name.endswith("_accumulation")}
    return Recipe(fmt.name, **{**formats, **models, "input_format": None}, exp2_ftz=False,
                  l2norm_lanes=None, state_update="mul_add")


FP32_RECIPE = _throughout(FP32)
FP64_RECIPE = _throughout(FP64)

RECIPES: dict[str, Recipe] = {
    r.name: r for r in (SEED, FLASHKDA, FLASHKDA_H200, FLASHKDA_V2, FLASHKDA_V2_H200, FLA,
                        FP32_RECIPE, FP64_RECIPE)}


def get_recipe(spec: str | Recipe) -> Recipe:
    if isinstance(spec, Recipe):
        return spec
    try:
        return RECIPES[spec]
    except KeyError:
        raise ValueError(
            f"unknown recipe {spec!r}; expected one of {', '.join(RECIPES)}") from None
