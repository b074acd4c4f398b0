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
``inverse_accumulation`` accumulation model of the Neumann products (fp16 accumulate)
``inverse_format``      storage format of the inverse and its powers (fp16)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kdalab.arith.formats import BF16, FP16, FP32, FP64, Format, get_format

__all__ = ["Recipe", "SEED", "FP32_RECIPE", "FP64_RECIPE", "RECIPES", "get_recipe"]


@dataclass(frozen=True)
class Recipe:
    name: str
    scale_format: Format = BF16
    exp2_ftz: bool = True
    operand_format: Format = BF16
    l_accumulation: str = "fp32"
    l_format: Format = FP16
    beta_format: Format = FP16
    inverse_accumulation: str = "fp16-seq"
    inverse_format: Format = FP16
    extras: dict = field(default_factory=dict, compare=False, hash=False)

    def with_(self, **changes) -> Recipe:
        """A copy with some fields changed (formats may be given by name)."""
        for key, value in list(changes.items()):
            if key.endswith("_format") and isinstance(value, str):
                changes[key] = get_format(value)
        return replace(self, **changes)


#: The seed document's emulation of FlashKDA's K1 path for L and its inverse.
SEED = Recipe("seed")
FP32_RECIPE = Recipe(
    "fp32", scale_format=FP32, exp2_ftz=False, operand_format=FP32, l_accumulation="fp32",
    l_format=FP32, beta_format=FP32, inverse_accumulation="fp32", inverse_format=FP32,
)
FP64_RECIPE = Recipe(
    "fp64", scale_format=FP64, exp2_ftz=False, operand_format=FP64, l_accumulation="fp64",
    l_format=FP64, beta_format=FP64, inverse_accumulation="fp64", inverse_format=FP64,
)

RECIPES: dict[str, Recipe] = {r.name: r for r in (SEED, FP32_RECIPE, FP64_RECIPE)}


def get_recipe(spec: str | Recipe) -> Recipe:
    if isinstance(spec, Recipe):
        return spec
    try:
        return RECIPES[spec]
    except KeyError:
        raise ValueError(
            f"unknown recipe {spec!r}; expected one of {', '.join(RECIPES)}") from None
