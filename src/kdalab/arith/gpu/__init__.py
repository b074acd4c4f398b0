"""The H200's own matrix arithmetic, run on the GPU: the hardware that
:mod:`kdalab.arith.tensorcore` emulates on the CPU.

============  ==================================================================================
``cublas``    a ctypes binding of cuBLAS (``cublasGemmEx``, ``cublasGemmStridedBatchedEx``)
``mma.cu``    the CUDA source of kdalab's kernels (inline PTX ``mma.sync``, fp32 FMA chains),
              shipped with the package and compiled by NVRTC through CuPy (the ``gpu`` extra)
``mma``       the launchers of those kernels
``models``    the accumulation models ``gpu-h200``… (each the GPU twin of a CPU model)
============  ==================================================================================

Importing any of it needs torch only; CUDA, cuBLAS and CuPy are looked for when a product runs,
and their absence raises :class:`GpuUnavailable` with a message that says what is missing.
"""

from __future__ import annotations

import torch

from kdalab.arith.linalg import lead_shape
from kdalab.errors import Unavailable

__all__ = ["GpuUnavailable", "require_cuda", "batched"]


class GpuUnavailable(Unavailable):
    """A hardware model was asked to run without CUDA (or on CPU tensors, or without CuPy)."""


def require_cuda(what: str = "this operation") -> None:
    """Raise :class:`GpuUnavailable` with a clear message when there is no CUDA device."""
    if not torch.cuda.is_available():
        raise GpuUnavailable(
            f"{what} needs a CUDA device, and none is available here "
            f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda})")


def batched(a: torch.Tensor, b: torch.Tensor):
    """The leading shape, and ``a`` and ``b`` broadcast and flattened to contiguous
    ``[batch, M, K]`` and ``[batch, K, N]``."""
    lead = lead_shape(a.shape[:-2], b.shape[:-2])
    a = a.expand(lead + a.shape[-2:]).reshape((-1,) + a.shape[-2:]).contiguous()
    b = b.expand(lead + b.shape[-2:]).reshape((-1,) + b.shape[-2:]).contiguous()
    return lead, a, b
