"""The H200's own matrix arithmetic as accumulation models (CUDA tensors only).

Each model runs the hardware instead of emulating it and is the GPU twin of a CPU model of
:mod:`kdalab.arith.tensorcore` (``cpu_twin``), bit for bit; each is batched over leading
dimensions (one launch, or two, for a whole group of runs).

=====================  ==========================================================================
``gpu-h200``           cublasGemmEx COMPUTE_16F's per-call algorithm (as the seed calls cuBLAS),
                       batched: kdalab's mma.sync kernels (== CPU ``h200``)
``gpu-h200-mma``       chained ``mma.sync.m16n8k16.f16.f16.f16.f16`` (FlashKDA's inverse; == CPU
                       ``h200-mma``)
``gpu-h200-bf16-fp32`` chained ``mma.sync…f32.bf16.bf16.f32`` (kernel's L; == ``h200-bf16-fp32``)
``gpu-h200-fp16-fp32`` chained ``mma.sync…f32.f16.f16.f32`` (== ``h200-fp16-fp32``)
``gpu-h200-sgemm``     cuBLAS fp32 GEMM's measured order for the seed's L (== ``h200-sgemm``)
=====================  ==========================================================================

On CPU tensors, or without CUDA, a model raises :class:`~kdalab.arith.gpu.GpuUnavailable`.
(cuBLAS's own batched and per-call GEMMs, which kdalab's benchmark compares against, are models
of ``benchmarks/cublas_models.py``, not of the library.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kdalab.arith.accumulate import check_operands
from kdalab.arith.gpu import GpuUnavailable, require_cuda
from kdalab.arith.gpu.mma import gemmex_16f_dispatch, mma_gemm, sgemm_gpu
from kdalab.arith.registry import register

__all__ = ["GpuAccumulation", "MODELS"]

#: Casts that are exact for every value (no check needed, so no wait for the GPU).
_WIDENING = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
             (torch.float16, torch.float64), (torch.bfloat16, torch.float64),
             (torch.float32, torch.float64)}


def _to(x: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """``x`` in ``dtype``; float64/float32 holders must hold exactly representable values (that
    check reads the data back: it waits for the GPU)."""
    if x.dtype == dtype:
        return x
    if (x.dtype, dtype) in _WIDENING:
        return x.to(dtype)
    y = x.to(dtype)
    back = y.to(x.dtype)
    if not bool(((back == x) | (torch.isnan(back) & torch.isnan(x))).all()):
        raise ValueError(f"{name}: operands must hold {dtype} values")
    return y


@dataclass(frozen=True)
class GpuAccumulation:
    """A hardware GEMM on CUDA tensors: ``fn(a, b)`` on operands cast to ``in_dtype``.
    ``cpu_twin`` names the CPU model it equals bit for bit."""

    name: str
    out_dtype: torch.dtype
    in_dtype: torch.dtype
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    cpu_twin: str | None = None
    fp32_companion: str | None = None
    gpu_twin: str | None = None
    needs_cuda: bool = True

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        also = f" (its CPU emulation: {self.cpu_twin!r})" if self.cpu_twin else ""
        require_cuda(f"accumulation model {self.name!r}{also}")
        if not (a.is_cuda and b.is_cuda):
            raise GpuUnavailable(f"accumulation model {self.name!r} runs on CUDA tensors only; "
                                 f"got {a.device} and {b.device}{also}")
        check_operands(a, b, self.name)
        return self.fn(_to(a, self.in_dtype, self.name), _to(b, self.in_dtype, self.name))


def _mma(variant: str):
    return lambda a, b: mma_gemm(a, b, variant)


MODELS = (
    GpuAccumulation("gpu-h200", torch.float16, torch.float16, gemmex_16f_dispatch, "h200",
                    fp32_companion="gpu-h200-sgemm"),
    GpuAccumulation("gpu-h200-mma", torch.float16, torch.float16, _mma("f16"), "h200-mma",
                    fp32_companion="gpu-h200-sgemm"),
    GpuAccumulation("gpu-h200-bf16-fp32", torch.float32, torch.bfloat16, _mma("bf16-f32"),
                    "h200-bf16-fp32"),
    GpuAccumulation("gpu-h200-fp16-fp32", torch.float32, torch.float16, _mma("f16-f32"),
                    "h200-fp16-fp32"),
    GpuAccumulation("gpu-h200-sgemm", torch.float32, torch.float32, sgemm_gpu, "h200-sgemm"),
)
for _m in MODELS:
    register(_m)
