"""The H200's own matrix arithmetic as accumulation models (CUDA tensors only).

These models run the hardware instead of emulating it; :mod:`kdalab.arith.tensorcore` emulates
the same arithmetic bit for bit on the CPU (``gpu_twin("h200") == "gpu-h200"``). Every model is
batched over leading dimensions: one launch (or two) computes the products of a group of runs.

=====================  ==========================================================================
``gpu-h200``           cublasGemmEx COMPUTE_16F's per-call algorithm (as the seed calls cuBLAS),
                       batched: kdalab's mma.sync kernels (== CPU ``h200``)
``gpu-h200-mma``       chained ``mma.sync.m16n8k16.f16.f16.f16.f16`` (FlashKDA's inverse; == CPU
                       ``h200-mma``)
``gpu-h200-bf16-fp32`` chained ``mma.sync…f32.bf16.bf16.f32`` (kernel's L; == ``h200-bf16-fp32``)
``gpu-h200-fp16-fp32`` chained ``mma.sync…f32.f16.f16.f32`` (== ``h200-fp16-fp32``)
``gpu-h200-sgemm``     cuBLAS fp32 GEMM's measured order for the seed's L (== ``h200-sgemm``)
``cublas-16f``         ``cublasGemmStridedBatchedEx`` COMPUTE_16F itself (its bits: ``h200-mma``)
``cublas-16f-loop``    one ``cublasGemmEx`` per matrix, the seed's way (its bits: ``h200``)
``cublas-32f``         ``cublasGemmStridedBatchedEx`` fp32 (a different order from per-call SGEMM)
=====================  ==========================================================================

The mma kernels are inline PTX compiled with NVRTC through CuPy. CuPy always adds ``-ftz=true``;
the fp32 arithmetic outside the mma instructions is therefore written as PTX without ``.ftz``.

On CPU tensors, or without CUDA, a model raises :class:`GpuUnavailable` with a message that says
so. Nothing here is imported by the CPU code paths: importing this module needs only torch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "GpuUnavailable",
    "cuda_available",
    "require_cuda",
    "cublas_gemm",
    "mma_gemm",
    "gemmex_16f_gpu",
    "sgemm_gpu",
    "GpuAccumulation",
    "gpu_twin",
]


class GpuUnavailable(RuntimeError):
    """A hardware model was asked to run without CUDA (or on CPU tensors)."""


def cuda_available() -> bool:
    return torch.cuda.is_available()


def require_cuda(what: str = "this operation") -> None:
    """Raise :class:`GpuUnavailable` with a clear message when there is no CUDA device."""
    if not torch.cuda.is_available():
        raise GpuUnavailable(
            f"{what} needs a CUDA device, and none is available here "
            f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda}). "
            "Use the CPU emulation instead (accumulation 'h200' / 'h200-bf16-fp32').")


def _check_cuda_operands(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    require_cuda(f"accumulation model {name!r}")
    if not (a.is_cuda and b.is_cuda):
        raise GpuUnavailable(f"accumulation model {name!r} runs on CUDA tensors only; got "
                             f"{a.device} and {b.device} (use the CPU emulation there)")
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"{name}: operands must have at least 2 dimensions")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{name}: inner dimensions differ: a is {tuple(a.shape)}, "
                         f"b is {tuple(b.shape)}")


def _broadcast(a: torch.Tensor, b: torch.Tensor):
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(lead + a.shape[-2:]).reshape((-1,) + a.shape[-2:]).contiguous()
    b = b.expand(lead + b.shape[-2:]).reshape((-1,) + b.shape[-2:]).contiguous()
    return lead, a, b


# --- cuBLAS through ctypes -----------------------------------------------------------------

_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
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
    if a.dtype != dtype or b.dtype != dtype:
        raise ValueError(f"cublas {compute}: operands must be {dtype}, got {a.dtype}, {b.dtype}")
    lead, a3, b3 = _broadcast(a, b)
    batch, m, k = a3.shape
    n = b3.shape[-1]
    out = torch.empty((batch, m, n), dtype=dtype, device=a.device)
    if batch == 0 or m == 0 or n == 0:
        return out.reshape(lead + (m, n))
    if k == 0:
        return out.zero_().reshape(lead + (m, n))
    lib = _libcublas()
    h = _handle(a.device)
    lib.cublasSetStream_v2(h, ctypes.c_void_p(torch.cuda.current_stream(a.device).cuda_stream))
    # Row-major C = A B is column-major C^T = B^T A^T: pass b as the first operand.
    status = lib.cublasGemmStridedBatchedEx(
        h, 0, 0, ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k), ctypes.byref(one),
        ctypes.c_void_p(b3.data_ptr()), ctypes.c_int(cuda_type), ctypes.c_int(n),
        ctypes.c_longlong(k * n),
        ctypes.c_void_p(a3.data_ptr()), ctypes.c_int(cuda_type), ctypes.c_int(k),
        ctypes.c_longlong(m * k),
        ctypes.byref(zero), ctypes.c_void_p(out.data_ptr()), ctypes.c_int(cuda_type),
        ctypes.c_int(n), ctypes.c_longlong(m * n), ctypes.c_int(batch), ctypes.c_int(comp),
        ctypes.c_int(0))  # CUBLAS_GEMM_DEFAULT
    if status != 0:
        raise RuntimeError(f"cublasGemmStridedBatchedEx failed with status {status}")
    return out.reshape(lead + (m, n))


def cublas_gemm_single(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One 2-D ``cublasGemmEx`` with ``CUBLAS_COMPUTE_16F``: the seed's own call, unsynchronized."""
    assert a.dim() == 2 and b.dim() == 2 and a.dtype == b.dtype == torch.float16
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


# --- mma.sync through inline PTX (NVRTC via CuPy) ------------------------------------------

_MMA_SOURCE = r"""
// One warp computes one 16x8 tile of D = A B (+ C0) for one batch element, looping over K in
// blocks of 16 (zero-padded), the accumulator chained from one mma.sync to the next.
// A [batch, M, K], B [batch, K, N], C0/D [batch, M, N], all row-major and contiguous.

__device__ __forceinline__ unsigned short ld16(const unsigned short* p, int r, int c, int R, int C) {
    return (r < R && c < C) ? p[(long long)r * C + c] : (unsigned short)0;
}
__device__ __forceinline__ unsigned pack(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

extern "C" __global__ void mma_f16_acc(
    const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
    const unsigned short* __restrict__ C0, unsigned short* __restrict__ D,
    int M, int N, int K, long long batch)
{
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int tm = (M + 15) / 16, tn = (N + 7) / 8;
    if (warp >= batch * tm * tn) return;
    long long bi = warp / (tm * tn);
    int rem = (int)(warp % (tm * tn));
    int r0 = (rem / tn) * 16, c0 = (rem % tn) * 8;
    const unsigned short* a = A + bi * (long long)M * K;
    const unsigned short* b = B + bi * (long long)K * N;
    int g = lane >> 2, t = lane & 3;
    unsigned acc0 = 0u, acc1 = 0u;
    if (C0 != nullptr) {
        const unsigned short* c = C0 + bi * (long long)M * N;
        acc0 = pack(ld16(c, r0 + g, c0 + 2 * t, M, N), ld16(c, r0 + g, c0 + 2 * t + 1, M, N));
        acc1 = pack(ld16(c, r0 + g + 8, c0 + 2 * t, M, N), ld16(c, r0 + g + 8, c0 + 2 * t + 1, M, N));
    }
    for (int k0 = 0; k0 < K; k0 += 16) {
        unsigned a0 = pack(ld16(a, r0 + g, k0 + 2 * t, M, K), ld16(a, r0 + g, k0 + 2 * t + 1, M, K));
        unsigned a1 = pack(ld16(a, r0 + g + 8, k0 + 2 * t, M, K), ld16(a, r0 + g + 8, k0 + 2 * t + 1, M, K));
        unsigned a2 = pack(ld16(a, r0 + g, k0 + 2 * t + 8, M, K), ld16(a, r0 + g, k0 + 2 * t + 9, M, K));
        unsigned a3 = pack(ld16(a, r0 + g + 8, k0 + 2 * t + 8, M, K), ld16(a, r0 + g + 8, k0 + 2 * t + 9, M, K));
        unsigned b0 = pack(ld16(b, k0 + 2 * t, c0 + g, K, N), ld16(b, k0 + 2 * t + 1, c0 + g, K, N));
        unsigned b1 = pack(ld16(b, k0 + 2 * t + 8, c0 + g, K, N), ld16(b, k0 + 2 * t + 9, c0 + g, K, N));
        unsigned d0, d1;
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
            : "=r"(d0), "=r"(d1)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(acc0), "r"(acc1));
        acc0 = d0; acc1 = d1;
    }
    unsigned short* d = D + bi * (long long)M * N;
    int rr[2] = {r0 + g, r0 + g + 8};
    unsigned accs[2] = {acc0, acc1};
    for (int i = 0; i < 2; ++i) {
        int c = c0 + 2 * t;
        if (rr[i] < M && c < N) d[(long long)rr[i] * N + c] = (unsigned short)(accs[i] & 0xFFFF);
        if (rr[i] < M && c + 1 < N) d[(long long)rr[i] * N + c + 1] = (unsigned short)(accs[i] >> 16);
    }
}

// f32 accumulation; IN_BF16 selects bf16 or f16 operands.
template <bool IN_BF16>
__device__ void mma_f32_acc_impl(
    const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
    const float* __restrict__ C0, float* __restrict__ D, int M, int N, int K, long long batch)
{
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int tm = (M + 15) / 16, tn = (N + 7) / 8;
    if (warp >= batch * tm * tn) return;
    long long bi = warp / (tm * tn);
    int rem = (int)(warp % (tm * tn));
    int r0 = (rem / tn) * 16, c0 = (rem % tn) * 8;
    const unsigned short* a = A + bi * (long long)M * K;
    const unsigned short* b = B + bi * (long long)K * N;
    int g = lane >> 2, t = lane & 3;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int ar[4] = {r0 + g, r0 + g, r0 + g + 8, r0 + g + 8};
    int ac[4] = {c0 + 2 * t, c0 + 2 * t + 1, c0 + 2 * t, c0 + 2 * t + 1};
    if (C0 != nullptr) {
        const float* c = C0 + bi * (long long)M * N;
        for (int i = 0; i < 4; ++i)
            acc[i] = (ar[i] < M && ac[i] < N) ? c[(long long)ar[i] * N + ac[i]] : 0.f;
    }
    for (int k0 = 0; k0 < K; k0 += 16) {
        unsigned a0 = pack(ld16(a, r0 + g, k0 + 2 * t, M, K), ld16(a, r0 + g, k0 + 2 * t + 1, M, K));
        unsigned a1 = pack(ld16(a, r0 + g + 8, k0 + 2 * t, M, K), ld16(a, r0 + g + 8, k0 + 2 * t + 1, M, K));
        unsigned a2 = pack(ld16(a, r0 + g, k0 + 2 * t + 8, M, K), ld16(a, r0 + g, k0 + 2 * t + 9, M, K));
        unsigned a3 = pack(ld16(a, r0 + g + 8, k0 + 2 * t + 8, M, K), ld16(a, r0 + g + 8, k0 + 2 * t + 9, M, K));
        unsigned b0 = pack(ld16(b, k0 + 2 * t, c0 + g, K, N), ld16(b, k0 + 2 * t + 1, c0 + g, K, N));
        unsigned b1 = pack(ld16(b, k0 + 2 * t + 8, c0 + g, K, N), ld16(b, k0 + 2 * t + 9, c0 + g, K, N));
        float d0, d1, d2, d3;
        if (IN_BF16) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1),
                  "f"(acc[0]), "f"(acc[1]), "f"(acc[2]), "f"(acc[3]));
        } else {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1),
                  "f"(acc[0]), "f"(acc[1]), "f"(acc[2]), "f"(acc[3]));
        }
        acc[0] = d0; acc[1] = d1; acc[2] = d2; acc[3] = d3;
    }
    float* d = D + bi * (long long)M * N;
    for (int i = 0; i < 4; ++i)
        if (ar[i] < M && ac[i] < N) d[(long long)ar[i] * N + ac[i]] = acc[i];
}

// cublasGemmEx COMPUTE_16F as measured (one matrix per call): K <= 16 is one k16 instruction;
// K > 16 is slices of 8 products, each one instruction with C = 0, added left to right in fp16.
// K8 selects m16n8k8 for the slices, else m16n8k16 with the upper 8 products zero.
template <bool K8>
__device__ void gemmex_f16_impl(
    const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
    unsigned short* __restrict__ D, int M, int N, int K, long long batch)
{
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int tm = (M + 15) / 16, tn = (N + 7) / 8;
    if (warp >= batch * tm * tn) return;
    long long bi = warp / (tm * tn);
    int rem = (int)(warp % (tm * tn));
    int r0 = (rem / tn) * 16, c0 = (rem % tn) * 8;
    const unsigned short* a = A + bi * (long long)M * K;
    const unsigned short* b = B + bi * (long long)K * N;
    int g = lane >> 2, t = lane & 3;
    unsigned acc0 = 0u, acc1 = 0u;
    const unsigned zero = 0u;
    int step = (K <= 16) ? 16 : 8;
    for (int k0 = 0; k0 < K; k0 += step) {
        unsigned a0 = pack(ld16(a, r0 + g, k0 + 2 * t, M, K), ld16(a, r0 + g, k0 + 2 * t + 1, M, K));
        unsigned a1 = pack(ld16(a, r0 + g + 8, k0 + 2 * t, M, K), ld16(a, r0 + g + 8, k0 + 2 * t + 1, M, K));
        unsigned b0 = pack(ld16(b, k0 + 2 * t, c0 + g, K, N), ld16(b, k0 + 2 * t + 1, c0 + g, K, N));
        unsigned d0, d1;
        if (step == 16) {
            unsigned a2 = pack(ld16(a, r0 + g, k0 + 2 * t + 8, M, K), ld16(a, r0 + g, k0 + 2 * t + 9, M, K));
            unsigned a3 = pack(ld16(a, r0 + g + 8, k0 + 2 * t + 8, M, K), ld16(a, r0 + g + 8, k0 + 2 * t + 9, M, K));
            unsigned b1 = pack(ld16(b, k0 + 2 * t + 8, c0 + g, K, N), ld16(b, k0 + 2 * t + 9, c0 + g, K, N));
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
                : "=r"(d0), "=r"(d1)
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(zero), "r"(zero));
        } else if (K8) {
            asm volatile(
                "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3}, {%4}, {%5,%6};\n"
                : "=r"(d0), "=r"(d1)
                : "r"(a0), "r"(a1), "r"(b0), "r"(zero), "r"(zero));
        } else {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
                : "=r"(d0), "=r"(d1)
                : "r"(a0), "r"(a1), "r"(zero), "r"(zero), "r"(b0), "r"(zero), "r"(zero), "r"(zero));
        }
        if (k0 == 0) {
            acc0 = d0; acc1 = d1;
        } else {
            asm volatile("add.rn.f16x2 %0, %1, %2;\n" : "=r"(acc0) : "r"(acc0), "r"(d0));
            asm volatile("add.rn.f16x2 %0, %1, %2;\n" : "=r"(acc1) : "r"(acc1), "r"(d1));
        }
    }
    unsigned short* d = D + bi * (long long)M * N;
    int rr[2] = {r0 + g, r0 + g + 8};
    unsigned accs[2] = {acc0, acc1};
    for (int i = 0; i < 2; ++i) {
        int c = c0 + 2 * t;
        if (rr[i] < M && c < N) d[(long long)rr[i] * N + c] = (unsigned short)(accs[i] & 0xFFFF);
        if (rr[i] < M && c + 1 < N) d[(long long)rr[i] * N + c + 1] = (unsigned short)(accs[i] >> 16);
    }
}

extern "C" __global__ void gemmex_f16_k8(const unsigned short* A, const unsigned short* B,
    unsigned short* D, int M, int N, int K, long long batch) {
    gemmex_f16_impl<true>(A, B, D, M, N, K, batch);
}
extern "C" __global__ void gemmex_f16_k16(const unsigned short* A, const unsigned short* B,
    unsigned short* D, int M, int N, int K, long long batch) {
    gemmex_f16_impl<false>(A, B, D, M, N, K, batch);
}

// cuBLAS fp32 GEMM's order for the seed's L (K = 128) as measured: K in slices of SLICE, each
// an fp32 FMA chain in k order from 0, the slice sums added left to right. One thread an output.
extern "C" __global__ void sgemm_slices(const float* __restrict__ A, const float* __restrict__ B,
    float* __restrict__ D, int M, int N, int K, long long batch, int slice)
{
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * M * N) return;
    long long bi = idx / ((long long)M * N);
    int rem = (int)(idx % ((long long)M * N));
    int r = rem / N, c = rem % N;
    const float* a = A + bi * (long long)M * K + (long long)r * K;
    const float* b = B + bi * (long long)K * N + c;
    float total = 0.f;
    for (int s0 = 0; s0 < K; s0 += slice) {
        float acc = 0.f;
        int e = min(s0 + slice, K);
        // Inline PTX without .ftz: CuPy compiles with -ftz=true, which would flush subnormal
        // operands and results of __fmaf_rn / __fadd_rn (cuBLAS keeps them).
        for (int k = s0; k < e; ++k)
            asm("fma.rn.f32 %0, %1, %2, %0;" : "+f"(acc) : "f"(a[k]), "f"(b[(long long)k * N]));
        if (s0 == 0) total = acc;
        else asm("add.rn.f32 %0, %0, %1;" : "+f"(total) : "f"(acc));
    }
    D[idx] = total;
}

extern "C" __global__ void mma_bf16_f32_acc(const unsigned short* A, const unsigned short* B,
    const float* C0, float* D, int M, int N, int K, long long batch) {
    mma_f32_acc_impl<true>(A, B, C0, D, M, N, K, batch);
}
extern "C" __global__ void mma_f16_f32_acc(const unsigned short* A, const unsigned short* B,
    const float* C0, float* D, int M, int N, int K, long long batch) {
    mma_f32_acc_impl<false>(A, B, C0, D, M, N, K, batch);
}
"""

_MMA_MODULE = None


def _mma_module():
    global _MMA_MODULE
    if _MMA_MODULE is None:
        try:
            import cupy
        except ImportError as e:  # pragma: no cover - only on CUDA machines
            raise GpuUnavailable("the mma models need CuPy (NVRTC) to compile inline PTX") from e
        # CuPy picks the device's architecture itself (sm_90 on the H200; mma.sync needs sm_80+).
        _MMA_MODULE = cupy.RawModule(code=_MMA_SOURCE, options=("-std=c++17",))
    return _MMA_MODULE


_MMA_KERNELS = {
    # variant: (kernel, operand dtype, accumulator dtype)
    "f16": ("mma_f16_acc", torch.float16, torch.float16),
    "bf16-f32": ("mma_bf16_f32_acc", torch.bfloat16, torch.float32),
    "f16-f32": ("mma_f16_f32_acc", torch.float16, torch.float32),
}


def mma_gemm(a: torch.Tensor, b: torch.Tensor, variant: str = "f16",
             c: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ c)`` with chained ``mma.sync.m16n8k16`` instructions, one launch for the batch.

    K is processed in blocks of 16 (the last one zero-padded), the accumulator passed from one
    instruction to the next; ``c`` (accumulator dtype) is the first instruction's C operand.
    """
    import cupy

    kname, in_dtype, acc_dtype = _MMA_KERNELS[variant]
    if a.dtype != in_dtype or b.dtype != in_dtype:
        raise ValueError(f"mma {variant}: operands must be {in_dtype}, got {a.dtype}, {b.dtype}")
    lead, a3, b3 = _broadcast(a, b)
    batch, m, k = a3.shape
    n = b3.shape[-1]
    out = torch.empty((batch, m, n), dtype=acc_dtype, device=a.device)
    if c is not None:
        c3 = c.to(acc_dtype).expand(lead + (m, n)).reshape(batch, m, n).contiguous()
    if batch == 0 or m == 0 or n == 0:
        return out.reshape(lead + (m, n))
    kern = _mma_module().get_function(kname)
    warps = batch * ((m + 15) // 16) * ((n + 7) // 8)
    threads = 128
    blocks = (warps * 32 + threads - 1) // threads
    ptr = lambda t: cupy.uint64(t.data_ptr())  # noqa: E731
    cptr = ptr(c3) if c is not None else cupy.uint64(0)
    stream = torch.cuda.current_stream(a.device).cuda_stream
    with cupy.cuda.ExternalStream(stream):
        kern((blocks,), (threads,), (ptr(a3), ptr(b3), cptr, ptr(out), cupy.int32(m),
                                     cupy.int32(n), cupy.int32(k), cupy.int64(batch)))
    return out.reshape(lead + (m, n))


def _launch(kname: str, grid_threads: int, args: tuple, device: torch.device) -> None:
    import cupy

    kern = _mma_module().get_function(kname)
    threads = 128
    blocks = (grid_threads + threads - 1) // threads
    stream = torch.cuda.current_stream(device).cuda_stream
    with cupy.cuda.ExternalStream(stream):
        kern((blocks,), (threads,), args)


def gemmex_16f_gpu(a: torch.Tensor, b: torch.Tensor, slice_instruction: str = "k8") -> torch.Tensor:
    """cublasGemmEx COMPUTE_16F's K ≤ 16 and 8-slice algorithms, batched in one launch
    (see tensorcore.gemmex_16f)."""
    import cupy

    if a.dtype != torch.float16 or b.dtype != torch.float16:
        raise ValueError(f"gemmex 16f: operands must be float16, got {a.dtype}, {b.dtype}")
    lead, a3, b3 = _broadcast(a, b)
    batch, m, k = a3.shape
    n = b3.shape[-1]
    out = torch.empty((batch, m, n), dtype=torch.float16, device=a.device)
    if batch == 0 or m == 0 or n == 0:
        return out.reshape(lead + (m, n))
    if k == 0:
        return out.zero_().reshape(lead + (m, n))
    warps = batch * ((m + 15) // 16) * ((n + 7) // 8)
    u = cupy.uint64
    _launch("gemmex_f16_k8" if slice_instruction == "k8" else "gemmex_f16_k16", warps * 32,
            (u(a3.data_ptr()), u(b3.data_ptr()), u(out.data_ptr()), cupy.int32(m),
             cupy.int32(n), cupy.int32(k), cupy.int64(batch)), a.device)
    return out.reshape(lead + (m, n))


def gemmex_16f_dispatch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cublasGemmEx COMPUTE_16F's per-call algorithm for this shape (tensorcore.gemmex_algorithm),
    batched: one or two launches for all leading dimensions."""
    from kdalab.arith.tensorcore import gemmex_algorithm

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
    """cuBLAS fp32 GEMM's measured summation order (see tensorcore.sgemm_h200), one launch."""
    import cupy

    lead, a3, b3 = _broadcast(a.float(), b.float())
    batch, m, k = a3.shape
    n = b3.shape[-1]
    out = torch.empty((batch, m, n), dtype=torch.float32, device=a.device)
    if batch * m * n == 0:
        return out.reshape(lead + (m, n))
    u = cupy.uint64
    _launch("sgemm_slices", batch * m * n,
            (u(a3.data_ptr()), u(b3.data_ptr()), u(out.data_ptr()), cupy.int32(m),
             cupy.int32(n), cupy.int32(k), cupy.int64(batch), cupy.int32(slice_)), a.device)
    return out.reshape(lead + (m, n))


def cublas_loop_16f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One cublasGemmEx per matrix, in a Python loop (the seed's way; slow, for comparison)."""
    lead, a3, b3 = _broadcast(a, b)
    out = torch.stack([cublas_gemm_single(a3[i], b3[i]) for i in range(a3.shape[0])])
    return out.reshape(lead + out.shape[-2:])


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


# --- the models --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuAccumulation:
    """A hardware GEMM on CUDA tensors. ``twin`` names the CPU model it equals bit for bit."""

    name: str
    out_dtype: torch.dtype
    in_dtype: torch.dtype
    fn: object = None
    twin: str = ""

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        _check_cuda_operands(a, b, self.name)
        a = _to(a, self.in_dtype, self.name)
        b = _to(b, self.in_dtype, self.name)
        return self.fn(a, b)


MODELS = (
    # batched kernels of kdalab's own: hardware instructions, cuBLAS's measured algorithms
    GpuAccumulation("gpu-h200", torch.float16, torch.float16, gemmex_16f_dispatch, "h200"),
    GpuAccumulation("gpu-h200-mma", torch.float16, torch.float16,
                    lambda a, b: mma_gemm(a, b, "f16"), "h200-mma"),
    GpuAccumulation("gpu-h200-bf16-fp32", torch.float32, torch.bfloat16,
                    lambda a, b: mma_gemm(a, b, "bf16-f32"), "h200-bf16-fp32"),
    GpuAccumulation("gpu-h200-fp16-fp32", torch.float32, torch.float16,
                    lambda a, b: mma_gemm(a, b, "f16-f32"), "h200-fp16-fp32"),
    GpuAccumulation("gpu-h200-sgemm", torch.float32, torch.float32, sgemm_gpu, "h200-sgemm"),
    # cuBLAS itself
    GpuAccumulation("cublas-16f", torch.float16, torch.float16,
                    lambda a, b: cublas_gemm(a, b, "16f"), "h200-mma"),
    GpuAccumulation("cublas-16f-loop", torch.float16, torch.float16, cublas_loop_16f, "h200"),
    GpuAccumulation("cublas-32f", torch.float32, torch.float32,
                    lambda a, b: cublas_gemm(a, b, "32f"), ""),
)

#: CPU model name -> the GPU model that computes the same bits on CUDA tensors
GPU_TWINS = {m.twin: m.name for m in MODELS[:5]}


def gpu_twin(name: str) -> str:
    """The GPU model equal to CPU model ``name`` (``"h200"`` -> ``"gpu-h200"``); names of GPU
    models and of models without a twin come back unchanged."""
    return GPU_TWINS.get(name, name)
