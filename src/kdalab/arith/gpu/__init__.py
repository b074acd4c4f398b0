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

import math
from typing import NamedTuple

import torch

from kdalab.arith.linalg import lead_shape
from kdalab.errors import Unavailable

__all__ = ["GpuUnavailable", "require_cuda", "batched", "Product", "product"]


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
    batch = math.prod(lead)  # not -1: a reshape of zero elements could not infer it
    a = a.expand(lead + a.shape[-2:]).reshape((batch,) + a.shape[-2:]).contiguous()
    b = b.expand(lead + b.shape[-2:]).reshape((batch,) + b.shape[-2:]).contiguous()
    return lead, a, b


class Product(NamedTuple):
    """A batched product ready for one launch: ``a`` and ``b`` as :func:`batched` gives them, the
    output ``[batch, M, N]`` (zeros where K = 0) and the leading shape the result takes."""

    lead: tuple
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor

    def result(self) -> torch.Tensor:
        return self.out.reshape(self.lead + self.out.shape[-2:])


def product(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, what: str,
            operand_dtype: torch.dtype | None = None) -> Product:
    """``a @ b``'s operands and output for a launch, after checking the operands' dtype."""
    if operand_dtype is not None and (a.dtype != operand_dtype or b.dtype != operand_dtype):
        raise ValueError(f"{what}: operands must be {operand_dtype}, got {a.dtype}, {b.dtype}")
    lead, a3, b3 = batched(a, b)
    new = torch.zeros if a3.shape[-1] == 0 else torch.empty
    out = new((a3.shape[0], a3.shape[1], b3.shape[-1]), dtype=out_dtype, device=a.device)
    return Product(lead, a3, b3, out)
