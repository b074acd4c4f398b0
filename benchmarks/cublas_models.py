"""cuBLAS itself as accumulation models, for comparison only (benchmarks/bench_gpu_sweep.py): the
library's models (``gpu-h200``…) are kdalab's own kernels, and these show what cuBLAS gives when
called directly. Importing this module registers them.

=====================  ==========================================================================
``cublas-16f``         ``cublasGemmStridedBatchedEx`` COMPUTE_16F (its bits: CPU ``h200-mma``)
``cublas-16f-loop``    one ``cublasGemmEx`` per matrix, the seed's way (its bits: CPU ``h200``)
``cublas-32f``         ``cublasGemmStridedBatchedEx`` fp32 (another order than per-call SGEMM)
=====================  ==========================================================================
"""

from __future__ import annotations

import torch

from kdalab.arith import register
from kdalab.arith.gpu import batched
from kdalab.arith.gpu.cublas import cublas_gemm, cublas_gemm_single
from kdalab.arith.gpu.models import GpuAccumulation

__all__ = ["MODELS"]


def cublas_loop_16f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One cublasGemmEx per matrix, in a Python loop (the seed's way; slow)."""
    lead, a3, b3 = batched(a, b)
    out = torch.stack([cublas_gemm_single(a3[i], b3[i]) for i in range(a3.shape[0])])
    return out.reshape(lead + out.shape[-2:])


MODELS = (
    GpuAccumulation("cublas-16f", torch.float16, torch.float16,
                    lambda a, b: cublas_gemm(a, b, "16f"), "h200-mma",
                    fp32_companion="cublas-32f"),
    GpuAccumulation("cublas-16f-loop", torch.float16, torch.float16, cublas_loop_16f, "h200",
                    fp32_companion="cublas-32f"),
    GpuAccumulation("cublas-32f", torch.float32, torch.float32,
                    lambda a, b: cublas_gemm(a, b, "32f")),
)
for _m in MODELS:
    register(_m)
