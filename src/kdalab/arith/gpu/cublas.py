"""cuBLAS through ctypes: the library torch's CUDA build ships, called directly so that the
compute type (``CUBLAS_COMPUTE_16F``: fp16 accumulation) is ours to choose.

``cublas_gemm_single`` is the seed document's own call (one ``cublasGemmEx`` per matrix);
``cublas_gemm`` batches a whole group of matrices in one ``cublasGemmStridedBatchedEx``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kdalab.arith.gpu import GpuUnavailable, product

__all__ = ["cublas_gemm", "cublas_gemm_single", "cublas_version"]

_CUDA_R_32F, _CUDA_R_16F = 0, 2
_COMPUTE_16F, _COMPUTE_32F = 64, 68
_CUBLAS = None
_HANDLES: dict[int, ctypes.c_void_p] = {}


def _libcublas():
    global _CUBLAS
    if _CUBLAS is None:
        candidates = []
        try:
            import nvidia.cublas  # the pip wheel that torch's CUDA build depends on

            for root in list(getattr(nvidia.cublas, "__path__", [])):
                candidates += sorted((Path(root) / "lib").glob("libcublas.so.*"))
        except ImportError:
            pass
        candidates += ["libcublas.so", "libcublas.so.13", "libcublas.so.12"]
        last = None
        for c in candidates:
            try:
                _CUBLAS = ctypes.CDLL(str(c))
                break
            except OSError as e:  # try the next one
                last = e
        if _CUBLAS is None:
            raise GpuUnavailable(f"libcublas could not be loaded: {last}")
    return _CUBLAS


def cublas_version() -> str:
    """cuBLAS's major.minor version, as the library reports it."""
    lib = _libcublas()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.cublasGetProperty(0, ctypes.byref(major))
    lib.cublasGetProperty(1, ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def _handle(device: torch.device) -> ctypes.c_void_p:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _HANDLES:
        lib = _libcublas()
        h = ctypes.c_void_p()
        with torch.cuda.device(idx):
            status = lib.cublasCreate_v2(ctypes.byref(h))
        if status != 0:
            raise RuntimeError(f"cublasCreate failed: {status}")
        _HANDLES[idx] = h
    return _HANDLES[idx]


def cublas_gemm(a: torch.Tensor, b: torch.Tensor, compute: str = "16f") -> torch.Tensor:
    """``a @ b`` batched, one ``cublasGemmStridedBatchedEx`` call for all leading dimensions.

    ``compute="16f"``: fp16 operands, fp16 output, ``CUBLAS_COMPUTE_16F`` (alpha 1, beta 0 in fp16).
    ``compute="32f"``: fp32 operands and output, ``CUBLAS_COMPUTE_32F`` (plain fp32, no tf32).
    """
    if compute == "16f":
        dtype, cuda_type, comp = torch.float16, _CUDA_R_16F, _COMPUTE_16F
        one, zero = ctypes.c_ushort(0x3C00), ctypes.c_ushort(0)
    elif compute == "32f":
        dtype, cuda_type, comp = torch.float32, _CUDA_R_32F, _COMPUTE_32F
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    else:
        raise ValueError(f"compute must be '16f' or '32f', got {compute!r}")
    p = product(a, b, dtype, f"cublas {compute}", dtype)
    batch, m, k = p.a.shape
    n = p.b.shape[-1]
    if p.out.numel() == 0 or k == 0:
        return p.result()
    lib = _libcublas()
    h = _handle(a.device)
    lib.cublasSetStream_v2(h, ctypes.c_void_p(torch.cuda.current_stream(a.device).cuda_stream))
    # Row-major C = A B is column-major C^T = B^T A^T: pass b as the first operand.
    status = lib.cublasGemmStridedBatchedEx(
        h, 0, 0, ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k), ctypes.byref(one),
        ctypes.c_void_p(p.b.data_ptr()), ctypes.c_int(cuda_type), ctypes.c_int(n),
        ctypes.c_longlong(k * n),
        ctypes.c_void_p(p.a.data_ptr()), ctypes.c_int(cuda_type), ctypes.c_int(k),
        ctypes.c_longlong(m * k),
        ctypes.byref(zero), ctypes.c_void_p(p.out.data_ptr()), ctypes.c_int(cuda_type),
        ctypes.c_int(n), ctypes.c_longlong(m * n), ctypes.c_int(batch), ctypes.c_int(comp),
        ctypes.c_int(0))  # CUBLAS_GEMM_DEFAULT
    if status != 0:
        raise RuntimeError(f"cublasGemmStridedBatchedEx failed with status {status}")
    return p.result()


def cublas_gemm_single(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One 2-D ``cublasGemmEx`` with ``CUBLAS_COMPUTE_16F``: the seed's own call, unsynchronized."""
    if a.dim() != 2 or b.dim() != 2 or a.dtype != torch.float16 or b.dtype != torch.float16:
        raise ValueError("cublas_gemm_single: two 2-D float16 matrices expected")
    a, b = a.contiguous(), b.contiguous()
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty(m, n, dtype=torch.float16, device=a.device)
    lib = _libcublas()
    h = _handle(a.device)
    lib.cublasSetStream_v2(h, ctypes.c_void_p(torch.cuda.current_stream(a.device).cuda_stream))
    one, zero = ctypes.c_ushort(0x3C00), ctypes.c_ushort(0)
    status = lib.cublasGemmEx(
        h, 0, 0, ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k), ctypes.byref(one),
        ctypes.c_void_p(b.data_ptr()), ctypes.c_int(_CUDA_R_16F), ctypes.c_int(n),
        ctypes.c_void_p(a.data_ptr()), ctypes.c_int(_CUDA_R_16F), ctypes.c_int(k),
        ctypes.byref(zero), ctypes.c_void_p(out.data_ptr()), ctypes.c_int(_CUDA_R_16F),
        ctypes.c_int(n), ctypes.c_int(_COMPUTE_16F), ctypes.c_int(0))
    if status != 0:
        raise RuntimeError(f"cublasGemmEx failed with status {status}")
    return out
