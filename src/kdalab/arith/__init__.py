"""Arithmetic layer: floating-point formats, rounding, exp2, accumulation models, error measures.

Knows nothing of KDA. Importing it registers every accumulation model (the CPU models, the
H200's emulation and the GPU's own arithmetic) in :mod:`kdalab.arith.registry`.
"""

from kdalab.arith import accumulate, tensorcore  # noqa: F401  (models register on import)
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
from kdalab.arith.gpu import models as _gpu_models  # noqa: F401  (registers the GPU models)
from kdalab.arith.registry import (
    AccumulationModel,
    available_accumulations,
    fp32_companion,
    get_accumulation,
    matmul,
    on_device,
    register,
)

__all__ = [
    "AccumulationModel", "available_accumulations", "fp32_companion", "get_accumulation",
    "matmul", "on_device", "register", "rel_rmse", "exp2_f32", "exp2_ftz", "BF16", "FORMATS",
    "FP8_E4M3", "FP8_E5M2", "FP16", "FP32", "FP64", "TF32", "Format", "get_format", "quantize",
    "round_to", "torch_cast",
]
