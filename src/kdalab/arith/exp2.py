"""exp2 as the kernels compute their decay scales.

FlashKDA evaluates the gate in base 2 (log-decay pre-multiplied by log2 e) and takes ``exp2`` with
the PTX instruction ``ex2.approx.ftz.f32``. kdalab models it as the seed document does: the input is
rounded to float32, ``2**x`` is computed exactly and rounded to float32, and results below float32's
smallest normal (2⁻¹²⁶) are flushed to +0 (FTZ).

How this differs from the hardware: ``ex2.approx`` is an approximation (the PTX ISA documents a
maximum relative error of about 2⁻²² over its range, i.e. a couple of float32 ulps), and ``.ftz``
also flushes *subnormal inputs* to zero (2**±0 = 1, harmless). The approximation error is far below
the bf16 rounding (2⁻⁹ relative) that follows in every recipe, so the model and the hardware agree
after the cast except for values within ~2⁻²² of a bf16 rounding boundary. See docs/arithmetic.md.
"""

from __future__ import annotations

import torch

from kdalab.arith.formats import FP32, round_to

__all__ = ["exp2_ftz", "exp2_f32"]


def exp2_f32(x: torch.Tensor) -> torch.Tensor:
    """2**x for float32 x, correctly rounded to float32 (computed in float64)."""
    x32 = x.float()
    return round_to(torch.exp2(x32.double()), FP32).float()


def exp2_ftz(x: torch.Tensor, *, ftz: bool = True) -> torch.Tensor:
    """``exp2`` in float32 with results below 2⁻¹²⁶ flushed to zero (the kernels' ``ex2.ftz``).

    ``x`` is first rounded to float32, as the kernels hold the gate in float32 registers.
    Returns float32.
    """
    y = exp2_f32(x)
    if ftz:
        y = torch.where(y < FP32.tiny, torch.zeros_like(y), y)
    return y
