"""The H200's cuBLAS fp32 GEMM (``h200-sgemm``, the seed's L on the device) emulated bit for bit
on the CPU: its summation order, and the correctly rounded fp32 FMA it is built from.

How the order was found and verified on the device: docs/tensor-cores.md; the model that uses
it: :class:`kdalab.arith.tensorcore.CublasSgemmAccumulation`.
"""

from __future__ import annotations

import math

import torch

from kdalab.arith.accumulate import _two_sum
from kdalab.arith.linalg import lead_shape

__all__ = ["SGEMM_SLICE", "sgemm_h200"]

#: cuBLAS fp32 GEMM: K-slices summed as sequential FMA chains
SGEMM_SLICE = 32


def _fma_fp32(x: torch.Tensor, y: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """fp32 fma(x, y, acc), correctly rounded, as float32; float64 holders of fp32 values.

    acc + x·y is exactly s + e (TwoSum of the exact float64 product); rounding it to odd in
    float64 and then to nearest in float32 is the correct rounding (Boldo & Melquiond, IEEE TC
    2008: 53 bits ≥ 24 + 2)."""
    s, e = _two_sum(acc, x * y)  # x·y: at most 48 bits, exact
    odd = (s.view(torch.int64) & 1) == 1
    toward = torch.nextafter(s, torch.where(e > 0, math.inf, -math.inf))
    rounded = torch.where((e != 0) & ~odd, toward, s).float()
    return torch.where(torch.isfinite(s), rounded, s.float())


def _lowest_bit_exponent(x: torch.Tensor) -> torch.Tensor:
    """For float32 ``x``: the exponent of its lowest set bit (x = m·2^q with odd m); 0 → 0."""
    bits = x.view(torch.int32) & 0x7FFFFFFF
    field = bits >> 23
    normal = field > 0
    mant = torch.where(normal, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
    low = (mant & -mant).float()  # 2^t, t ≤ 23: exact
    t = (low.view(torch.int32) >> 23) - 127
    return t + torch.where(normal, field - 150, -149)


def _exact_steps(a32: torch.Tensor, b32: torch.Tensor) -> list[bool]:
    """For each k: whether every product ``a[..., i, k] * b[..., k, j]`` is exact in float32 (or
    not finite), by a sufficient test that reads the operands only (per matrix and k).

    Operands with at most 12 significant bits (their low 12 float32 fraction bits clear; bf16
    values have 8) give products of at most 24 bits, exact in float32 unless they overflow or
    have a set bit below 2^-149. The first is ruled out by the largest magnitudes; the second by
    the smallest magnitudes (a product ≥ 2^-126 is a normal float32) or by the operands' lowest
    set bits (their exponents add up to the product's).
    """
    k = a32.shape[-1]
    for x in (a32, b32):
        if not bool((((x.view(torch.int32) & 0xFFF) == 0) | ~torch.isfinite(x)).all()):
            return [False] * k

    def bounds(x: torch.Tensor, dim: int):
        mag = x.abs().double()
        live = torch.isfinite(mag) & (mag != 0)
        lo = torch.where(live, mag, math.inf).amin(dim)
        hi = torch.where(live, mag, 0.0).amax(dim)
        low_bit = torch.where(live, _lowest_bit_exponent(x), 1000).amin(dim)
        return lo, hi, low_bit

    a_lo, a_hi, a_bit = bounds(a32, -2)
    b_lo, b_hi, b_bit = bounds(b32, -1)
    ok = ((a_lo * b_lo >= 2.0**-126) | (a_bit + b_bit >= -149)) & (a_hi * b_hi < 2.0**127)
    return ok.reshape(-1, k).all(0).tolist()


def sgemm_h200(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cuBLAS fp32 GEMM's summation order on the H200 for the seed's L shapes (K = 128).

    K is cut into slices of 32; each slice is an fp32 FMA chain in k order starting from 0, and
    the slice sums are added left to right. Where a step's products are exact in fp32 (bf16-valued
    operands, as in the seed, unless a product leaves float32's normal range) the FMA is a
    float32 add, so that step runs in float32.
    """
    a32 = a.float()
    b32 = b.float()
    lead = lead_shape(a32.shape[:-2], b32.shape[:-2])
    a32 = a32.expand(lead + a32.shape[-2:])
    b32 = b32.expand(lead + b32.shape[-2:])
    m, k, n = a32.shape[-2], a32.shape[-1], b32.shape[-1]
    exact = _exact_steps(a32, b32)
    total = None
    for s0 in range(0, k, SGEMM_SLICE):
        acc = torch.zeros(lead + (m, n), dtype=torch.float32, device=a32.device)
        for kk in range(s0, min(s0 + SGEMM_SLICE, k)):
            x, y = a32[..., :, kk:kk + 1], b32[..., kk:kk + 1, :]
            if exact[kk]:
                acc += x * y
                continue
            p32 = x * y
            p64 = x.double() * y.double()
            if bool(((p32.double() == p64) | ~torch.isfinite(p64)).all()):
                acc += p32
            else:
                acc = _fma_fp32(x.double(), y.double(), acc.double())
        total = acc if total is None else total + acc
    if total is None:
        return torch.zeros(lead + (m, n), dtype=torch.float32, device=a32.device)
    return total
