"""Arithmetic layer: floating-point formats, rounding, exp2, accumulation models, error measures.

Knows nothing of KDA.
"""

from kdalab.arith.accumulate import (
    AccumulationModel,
    available_accumulations,
    get_accumulation,
    matmul,
    register,
)
from kdalab.arith.error import rel_rmse
from kdalab.arith.exp2 import exp2_f32, exp2_ftz
from kdalab.arith.formats import (
    BF16,
    FORMATS,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    FP64,
    TF32,
    Format,
    get_format,
    quantize,
    round_to,
    torch_cast,
)

__all__ = [
    "AccumulationModel", "available_accumulations", "get_accumulation", "matmul", "register",
    "rel_rmse", "exp2_f32", "exp2_ftz", "BF16", "FORMATS", "FP8_E4M3", "FP8_E5M2", "FP16", "FP32",
    "FP64", "TF32", "Format", "get_format", "quantize", "round_to", "torch_cast",
]
