"""Matrix products under a chosen accumulation model, batched over leading dimensions.

An accumulation model says how the products ``a[..., i, k] * b[..., k, j]`` are summed and rounded.
Models are values: look one up with :func:`kdalab.arith.get_accumulation` and call
``model.matmul(a, b)``.

=============  ==============================================================================
``fp64``       float64 GEMM; the reference ("exact" for every purpose here).
``fp32``       float32 GEMM as torch runs it (summation order is the BLAS library's; on CPU the
               result does not depend on how many matrices are batched together — tested).
``fp16-seq``   the seed document's CPU fallback: for k = 0, 1, …: product in fp32 (exact for fp16
               operands), added to the fp32 value of the fp16 accumulator in fp32, rounded to fp16.
``fp16-once``  the exact sum of all products, rounded once to fp16 (operands must be fp16).
=============  ==============================================================================

Each registers itself in :mod:`kdalab.arith.registry`; the H200's models live in
:mod:`kdalab.arith.tensorcore` and :mod:`kdalab.arith.gpu`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kdalab.arith.formats import FP16, round_to
from kdalab.arith.linalg import lead_shape, matmul64
from kdalab.arith.registry import register

__all__ = ["TensorOps", "Fp64Accumulation", "Fp32Accumulation", "Fp16SequentialAccumulation",
           "Fp16OnceAccumulation", "check_operands"]


class TensorOps:
    """A model made of plain tensor operations: it runs on any device and has no twin."""

    needs_cuda: ClassVar[bool] = False
    gpu_twin: ClassVar[str | None] = None
    fp32_companion: ClassVar[str | None] = None


def check_operands(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"{name}: operands must have at least 2 dimensions, got {a.dim()} and "
                         f"{b.dim()}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{name}: inner dimensions differ: a is {tuple(a.shape)}, "
                         f"b is {tuple(b.shape)}")


@dataclass(frozen=True)
class Fp64Accumulation(TensorOps):
    name: str = "fp64"
    out_dtype: torch.dtype = torch.float64

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_operands(a, b, self.name)
        return matmul64(a, b)


@dataclass(frozen=True)
class Fp32Accumulation(TensorOps):
    name: str = "fp32"
    out_dtype: torch.dtype = torch.float32

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_operands(a, b, self.name)
        return torch.matmul(a.float(), b.float())


#: fp16-seq computes only the non-zero rectangle of each step from this many outputs on: for
#: lower-triangular operands that skips about two thirds of the work (3x faster at 512 matrices
#: of 24×24, 4x at C = 48); below about 2^18 outputs the plain loop was as fast or faster.
SPARSE_MIN = 1 << 18


def _fp16_seq_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The sequential fp16 accumulation as plain tensor ops (any device): for each k, the
    float32 product (exact for fp16 operands) is added to the float32 value of the fp16
    accumulator and rounded to fp16.

    On the CPU, for outputs of at least :data:`SPARSE_MIN` values, each step is computed only
    on the rows and columns where some matrix of the batch has a non-zero product (a Neumann
    product of lower-triangular matrices: about a sixth of the M·K·N steps). Elsewhere the
    product is ±0, which leaves the accumulator as it is, except that −0 + (+0) is +0: the
    outputs that end as −0 are computed again with every step."""
    a32, b32 = a.float(), b.float()
    lead = lead_shape(a.shape[:-2], b.shape[:-2])
    a32, b32 = a32.expand(lead + a32.shape[-2:]), b32.expand(lead + b32.shape[-2:])
    m, k, n = a32.shape[-2], a32.shape[-1], b32.shape[-1]
    out = torch.zeros(lead + (m, n), dtype=torch.float16, device=a.device)
    # the spans read the data (on CUDA, a wait for the GPU) and cost a few Python steps per k
    sparse = a.device.type == "cpu" and out.numel() >= SPARSE_MIN
    steps = _active_steps(a32, b32) if sparse else [(kk, 0, m, 0, n) for kk in range(k)]
    for kk, r0, r1, c0, c1 in steps:
        acc = out[..., r0:r1, c0:c1]
        # the fp16 accumulator's value + the product, in float32 (the product of two fp16
        # values is exact in float32, fused or not), then rounded to fp16
        acc.copy_(torch.addcmul(acc, a32[..., r0:r1, kk, None], b32[..., None, kk, c0:c1]))
    if sparse:
        negative_zero = (out == 0) & torch.signbit(out)
        if bool(negative_zero.any()):
            where = negative_zero.nonzero(as_tuple=True)
            batch, i, j = where[:-2], where[-2], where[-1]
            out[where] = _fp16_seq_rows(a32[batch + (i,)],
                                        b32.transpose(-1, -2)[batch + (j,)])
    return out


def _fp16_seq_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dot products of the rows of ``a`` and ``b`` ([P, K] float32), accumulated in fp16."""
    out = torch.zeros(a.shape[0], dtype=torch.float16, device=a.device)
    for kk in range(a.shape[-1]):
        out = (out.float() + a[:, kk] * b[:, kk]).half()
    return out


def _active_steps(a: torch.Tensor, b: torch.Tensor) -> list[tuple[int, int, int, int, int]]:
    """For each k: (k, rows r0:r1, columns c0:c1) holding every product of step k that is not
    ±0 in some matrix of the batch; a non-finite operand makes its step's rows or columns whole
    (0·inf is nan)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a_nz = (a != 0).reshape(-1, m, k).any(0)  # [M, K]; nan != 0 too
    b_nz = (b != 0).reshape(-1, k, n).any(0)  # [K, N]
    a_bad = (~torch.isfinite(a)).reshape(-1, m, k).any(0).any(0)  # [K]
    b_bad = (~torch.isfinite(b)).reshape(-1, k, n).any(0).any(1)  # [K]
    rows = a_nz.T | b_bad[:, None]  # [K, M]
    cols = b_nz | a_bad[:, None]  # [K, N]

    def bounds(nz: torch.Tensor):
        size = nz.shape[-1]
        first = nz.to(torch.uint8).argmax(-1)
        last = size - nz.flip(-1).to(torch.uint8).argmax(-1)
        return nz.any(-1).tolist(), first.tolist(), last.tolist()

    (ra, r0, r1), (ca, c0, c1) = bounds(rows), bounds(cols)
    return [(kk, r0[kk], r1[kk], c0[kk], c1[kk]) for kk in range(k) if ra[kk] and ca[kk]]


@dataclass(frozen=True)
class Fp16SequentialAccumulation(TensorOps):
    """fp16 accumulator rounded after every product, in k order (the seed's CPU fallback).

    The k-loop is K batched tensor operations, so one call serves a whole batch of runs; a numba
    kernel of the same loop was measured slower than this at batch sizes of a sweep (6 ns per
    multiply-add against 3 ns), so plain tensor operations it is.
    """

    name: str = "fp16-seq"
    out_dtype: torch.dtype = torch.float16

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_operands(a, b, self.name)
        return _fp16_seq_torch(a, b)


_SPLIT = 2.0**20  # limb size for the exact fp16-product sums below


@dataclass(frozen=True)
class Fp16OnceAccumulation(TensorOps):
    """The exact sum of the products, rounded once to fp16 (round to nearest even).

    Exact for fp16 operands and K ≤ 4096: every fp16 value is an integer multiple of 2⁻²⁴ below
    2⁴⁰ in those units; each operand is cut into two 20-bit limbs, so each of the four limb GEMMs
    sums integers below 2⁴⁰·K < 2⁵² — exact in float64 whatever the summation order. The three
    partial sums are combined with an error-free transformation and rounded once
    (:func:`~kdalab.arith.formats.round_to` with a residual).
    """

    name: str = "fp16-once"
    out_dtype: torch.dtype = torch.float16

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_operands(a, b, self.name)
        if a.dtype != torch.float16 or b.dtype != torch.float16:
            raise ValueError(f"fp16-once: operands must be float16, got {a.dtype} and {b.dtype}")
        if a.shape[-1] > 4096:
            raise ValueError(f"fp16-once: K must be <= 4096 for an exact sum, got {a.shape[-1]}")
        ad, bd = a.double(), b.double()
        # Fast path: every product is a multiple of 2^-48, so when Σ|a_ik·b_kj| < 2^5 every
        # partial sum, in any order (and with FMA), is a multiple of 2^-48 below 2^5: exact in
        # float64. One float64 GEMM and one correct rounding then give the exact answer. Matrices
        # of the batch that miss the bound (or hold inf/nan) take the limb path.
        out = round_to(torch.matmul(ad, bd), FP16).half()
        bound = torch.matmul(ad.abs(), bd.abs())  # nan/inf where an operand is
        ok = (bound < 32.0).flatten(-2).all(-1)
        if out.is_cuda:  # no branch on the data (reading ok back would wait for the GPU)
            return torch.where(ok[..., None, None], out, _fp16_once_limbs(a, b))
        if bool(ok.all()):
            return out
        batch = out.shape[:-2]
        a3 = a.expand(batch + a.shape[-2:]).reshape((-1,) + a.shape[-2:])
        b3 = b.expand(batch + b.shape[-2:]).reshape((-1,) + b.shape[-2:])
        out3 = out.reshape((-1,) + out.shape[-2:]).clone()
        idx = (~ok).reshape(-1).nonzero().squeeze(-1)
        out3[idx] = _fp16_once_limbs(a3[idx], b3[idx])
        return out3.reshape(out.shape)


def _fp16_once_limbs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The exact fp16-once product by 20-bit limbs (any magnitudes, inf/nan propagated)."""
    # scaling by Python-float powers of two is exact on every device (torch.ldexp is not on
    # CUDA, where it goes through pow)
    ai = a.double() * 2.0**24  # integers
    bi = b.double() * 2.0**24
    finite = torch.isfinite(ai).all(-1, keepdim=True) & torch.isfinite(bi).all(-2, keepdim=True)
    ai = torch.where(torch.isfinite(ai), ai, torch.zeros_like(ai))
    bi = torch.where(torch.isfinite(bi), bi, torch.zeros_like(bi))
    a1 = torch.trunc(ai / _SPLIT)
    a0 = ai - a1 * _SPLIT
    b1 = torch.trunc(bi / _SPLIT)
    b0 = bi - b1 * _SPLIT
    high = torch.matmul(a1, b1)  # units of 2^40 · 2^-48
    mid = torch.matmul(a1, b0) + torch.matmul(a0, b1)  # units of 2^20 · 2^-48
    low = torch.matmul(a0, b0)  # units of 2^-48
    # Each of high, mid, low is an exact integer below 2^53. Scale (exact) and add with TwoSum.
    h = high * 2.0**-8
    m = mid * 2.0**-28
    lo = low * 2.0**-48
    s1, e1 = _two_sum(h, m)
    s2, e2 = _two_sum(s1, lo)
    # e1 and e2 are small multiples of 2^-48, so e1 + e2 is exact; after this TwoSum, s is the
    # float64 nearest the exact sum and r the exact remainder, which breaks fp16 ties.
    s, r = _two_sum(s2, e1 + e2)
    exact = round_to(s, FP16, residual=r).half()
    naive = torch.matmul(a.double(), b.double()).half()  # propagates inf/nan like IEEE
    return torch.where(finite, exact, naive)


def _two_sum(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knuth's TwoSum: s + e == x + y exactly, s = fl(x + y)."""
    s = x + y
    yy = s - x
    e = (x - (s - yy)) + (y - yy)
    return s, e


for _m in (Fp64Accumulation(), Fp32Accumulation(), Fp16SequentialAccumulation(),
           Fp16OnceAccumulation()):
    register(_m)
