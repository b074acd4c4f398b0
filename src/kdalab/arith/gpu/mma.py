"""Launchers of kdalab's GPU kernels (``mma.cu``, shipped beside this file): Tensor-Core
``mma.sync`` chains, cuBLAS COMPUTE_16F's per-call algorithms rebuilt from those instructions, and
cuBLAS fp32 GEMM's measured summation order. One launch per call covers every leading dimension.

The kernels are compiled by NVRTC through CuPy (the ``gpu`` extra). CuPy always adds
``-ftz=true``; the fp32 arithmetic outside the mma instructions is therefore written as PTX
without ``.ftz`` (cuBLAS keeps subnormals).
"""

from __future__ import annotations

from importlib import resources

import torch

from kdalab.arith.gpu import GpuUnavailable, product
from kdalab.arith.tensorcore import gemmex_algorithm

__all__ = ["mma_gemm", "gemmex_16f_gpu", "gemmex_16f_dispatch", "sgemm_gpu"]

_MODULE = None
_THREADS = 128


def _module():
    global _MODULE
    if _MODULE is None:
        try:
            import cupy
        except ImportError as e:  # pragma: no cover - only on CUDA machines
            raise GpuUnavailable("the GPU models need CuPy (NVRTC) to compile their kernels: "
                                 "pip install 'kdalab[gpu-models]'") from e
        source = resources.files("kdalab.arith.gpu").joinpath("mma.cu").read_text()
        # CuPy picks the device's architecture itself (sm_90 on the H200; mma.sync needs sm_80+).
        _MODULE = cupy.RawModule(code=source, options=("-std=c++17",))
    return _MODULE


def _launch(kernel: str, threads: int, args: tuple, device: torch.device) -> None:
    import cupy

    blocks = (threads + _THREADS - 1) // _THREADS
    stream = torch.cuda.current_stream(device).cuda_stream
    with cupy.cuda.ExternalStream(stream):
        _module().get_function(kernel)((blocks,), (_THREADS,), args)


def _ptr(t: torch.Tensor):
    import cupy

    return cupy.uint64(t.data_ptr())


_MMA_KERNELS = {
    # variant: (kernel, operand dtype, accumulator dtype)
    "f16": ("mma_f16_acc", torch.float16, torch.float16),
    "bf16-f32": ("mma_bf16_f32_acc", torch.bfloat16, torch.float32),
    "f16-f32": ("mma_f16_f32_acc", torch.float16, torch.float32),
}


def _warps(batch: int, m: int, n: int) -> int:
    """One warp per 16×8 output tile."""
    return batch * ((m + 15) // 16) * ((n + 7) // 8)


def mma_gemm(a: torch.Tensor, b: torch.Tensor, variant: str = "f16",
             c: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ c)`` with chained ``mma.sync.m16n8k16`` instructions, one launch for the batch.

    K is processed in blocks of 16 (the last one zero-padded), the accumulator passed from one
    instruction to the next; ``c`` (accumulator dtype) is the first instruction's C operand.
    """
    import cupy

    kname, in_dtype, acc_dtype = _MMA_KERNELS[variant]
    p = product(a, b, acc_dtype, f"mma {variant}", in_dtype)
    batch, m, k = p.a.shape
    n = p.b.shape[-1]
    if p.out.numel() == 0:
        return p.result()
    c_ptr = cupy.uint64(0)
    if c is not None:
        c3 = c.to(acc_dtype).expand(p.lead + (m, n)).reshape(batch, m, n).contiguous()
        c_ptr = _ptr(c3)
    _launch(kname, _warps(batch, m, n) * 32,
            (_ptr(p.a), _ptr(p.b), c_ptr, _ptr(p.out), cupy.int32(m), cupy.int32(n),
             cupy.int32(k), cupy.int64(batch)), a.device)
    return p.result()


def gemmex_16f_gpu(a: torch.Tensor, b: torch.Tensor, slice_instruction: str = "k8") -> torch.Tensor:
    """cublasGemmEx COMPUTE_16F's K ≤ 16 and 8-slice algorithms, batched in one launch
    (see :func:`kdalab.arith.tensorcore.gemmex_16f`); ``slice_instruction``: ``"k8"`` runs each
    slice as one ``m16n8k8``, ``"k16"`` as an ``m16n8k16`` with the upper 8 products zero."""
    import cupy

    p = product(a, b, torch.float16, "gemmex 16f", torch.float16)
    batch, m, k = p.a.shape
    n = p.b.shape[-1]
    if p.out.numel() == 0 or k == 0:
        return p.result()
    _launch("gemmex_f16_k8" if slice_instruction == "k8" else "gemmex_f16_k16",
            _warps(batch, m, n) * 32,
            (_ptr(p.a), _ptr(p.b), _ptr(p.out), cupy.int32(m), cupy.int32(n), cupy.int32(k),
             cupy.int64(batch)), a.device)
    return p.result()


def gemmex_16f_dispatch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cublasGemmEx COMPUTE_16F's per-call algorithm for this shape
    (:func:`kdalab.arith.tensorcore.gemmex_algorithm`), batched: one or two launches for all
    leading dimensions."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    kind, size = gemmex_algorithm(m, k, n)
    if kind in ("block", "split"):
        return gemmex_16f_gpu(a, b)
    if kind == "chain":
        return mma_gemm(a, b, "f16")
    acc = None
    for k0 in range(0, k, size):  # split-chain: halves chained on the Tensor Cores, fp16 adds
        part = mma_gemm(a[..., k0:k0 + size], b[..., k0:k0 + size, :], "f16")
        acc = part if acc is None else acc + part  # fp16 + fp16 in torch: correctly rounded
    return acc


def sgemm_gpu(a: torch.Tensor, b: torch.Tensor, slice_: int = 32) -> torch.Tensor:
    """cuBLAS fp32 GEMM's measured summation order (see
    :func:`kdalab.arith.sgemm.sgemm_h200`), one launch."""
    import cupy

    p = product(a.float(), b.float(), torch.float32, "sgemm")
    batch, m, k = p.a.shape
    n = p.b.shape[-1]
    if p.out.numel() == 0:
        return p.result()
    _launch("sgemm_slices", batch * m * n,
            (_ptr(p.a), _ptr(p.b), _ptr(p.out), cupy.int32(m), cupy.int32(n), cupy.int32(k),
             cupy.int64(batch), cupy.int32(slice_)), a.device)
    return p.result()
