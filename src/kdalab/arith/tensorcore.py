"""Bit-exact CPU models of the H200's matrix arithmetic (Tensor Cores, cuBLAS) as accumulation
models.

How the H200 computes (established on the device with
``scripts/device/tensorcore_characterize.py`` at commit 386f211, the method of Khattak &
Mikaitis, *Accurate Models of NVIDIA Tensor Cores*, arXiv 2512.07004; details and numbers in
``docs/tensor-cores.md``):

**One Tensor-Core block** (``mma.sync.m16n8k16``; :func:`tc_block`) computes ``c + Σ a_k·b_k`` over
up to 16 products at once:

1. every product is exact; its exponent is taken *before normalization*, ``e(a) + e(b)`` with
   ``e(x)`` the operand's encoded exponent (subnormals: the format's minimum exponent), so the
   product's significand lies in [0, 4);
2. the largest exponent ``E`` over the non-zero products and the accumulator ``c`` is found;
3. every term (products and ``c``) is *truncated* toward zero to a multiple of ``2^(E − 25)``:
   25 fraction bits below the alignment point survive (the two bits above it hold the product's
   integer part);
4. the truncated terms are added exactly (no rounding inside the block) and normalized once at the
   end: fp16 output is rounded to nearest-even, fp32 output is truncated (round toward zero).
   A result that is zero (or rounds to zero) is +0.

**A chain of blocks**: the result of one block is the ``c`` of the next (the accumulator is held
in the output format between instructions).

Models (each registers itself in :mod:`kdalab.arith.registry`; ``gpu_twin``: the model of
:mod:`kdalab.arith.gpu.models` that computes the same bits on CUDA tensors; the fp16 models carry
``fp32_companion="h200-sgemm"``, the fp32 GEMM the seed's H200 run built L with):

=====================  =========================================================================
``h200``               cuBLAS ``cublasGemmEx`` with ``CUBLAS_COMPUTE_16F``, one matrix per call,
                       as the seed calls it. cuBLAS picks its algorithm by shape
                       (:func:`gemmex_algorithm`); for the seed's C×C×C products K ≤ 16 is one
                       block, C = 64 a chain of k16 blocks (``h200-mma``), other K > 16 slices
                       of 8 products, each a block with c = 0 rounded to fp16, added in fp16.
``h200-mma``           chained ``mma.sync.m16n8k16.f16.f16.f16.f16`` over K-blocks of 16, the
                       accumulator in fp16 (FlashKDA's Neumann inverse). cuBLAS
                       ``cublasGemmStridedBatchedEx`` with COMPUTE_16F and Triton's
                       ``tl.dot(out_dtype=float16)`` compute exactly this.
``h200-bf16-fp32``     chained ``mma.sync…f32.bf16.bf16.f32`` (how the kernel builds L).
``h200-fp16-fp32``     chained ``mma.sync…f32.f16.f16.f32``.
``h200-sgemm``         cuBLAS fp32 GEMM (``a.float() @ b.float()`` in torch, tf32 off) for the
                       seed's L shapes (K = 128): K in slices of 32, each an fp32 FMA chain in k
                       order, the slice sums added left to right in fp32.
=====================  =========================================================================

All are batched over leading dimensions: a Python loop runs over k, each step one tensor
operation on the [batch, M, N] outputs, restricted to the rows and columns where that step's
products are non-zero in some matrix of the batch (a Neumann product of lower-triangular
matrices has about a sixth of its M·K·N products non-zero). fp16 operands are multiplied and
scaled in float32 and the truncated terms summed in int32, both exact. The cuBLAS fp32 model
adds in float32 every step whose products are provably exact and takes a correctly rounded
FMA for the others (that stage, with its exactness argument: :mod:`kdalab.arith.sgemm`).
Operands may be any float dtype whose values the operand format represents (checked).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdalab.arith.accumulate import check_operands
from kdalab.arith.formats import BF16, FP16, FP32, Format, pow2
from kdalab.arith.linalg import lead_shape
from kdalab.arith.registry import register
from kdalab.arith.sgemm import sgemm_h200

__all__ = [
    "FRACTION_BITS",
    "BLOCK_K",
    "tc_block",
    "tc_chain",
    "gemmex_16f",
    "gemmex_algorithm",
    "sgemm_h200",
    "TensorCoreAccumulation",
    "CublasGemmExAccumulation",
    "CublasSgemmAccumulation",
]

#: bits kept below the alignment point (the largest product exponent e(a)+e(b), or c's exponent)
FRACTION_BITS = 25
#: products summed at once by one mma.sync.m16n8k16
BLOCK_K = 16
#: cuBLAS COMPUTE_16F (cublasGemmEx, one matrix per call) for K > 16: slices of this many products
GEMMEX_SLICE = 8

_NO_EXP = -100000  # exponent of a zero term: never the maximum


def _exponent(x: torch.Tensor, emin: int) -> torch.Tensor:
    """Encoded exponent of each value: floor(log2|x|), at least ``emin``; zeros get
    ``_NO_EXP``."""
    _, e = torch.frexp(x)
    e = torch.clamp(e.to(torch.int32) - 1, min=emin)
    return torch.where(x == 0, torch.full_like(e, _NO_EXP), e)


def _as_values(x: torch.Tensor, fmt: Format, what: str) -> torch.Tensor:
    """``x`` as float64, after checking that every value is one of ``fmt``'s."""
    if fmt.torch_dtype is not None and x.dtype == fmt.torch_dtype:
        return x.double()
    x64 = x.double()
    back = x64.to(fmt.torch_dtype).double()
    same = (back == x64) | (torch.isnan(back) & torch.isnan(x64))
    if not bool(same.all()):
        raise ValueError(f"{what}: operands must hold {fmt.name} values (got {x.dtype} values "
                         f"that {fmt.name} does not represent)")
    return x64


def _rz_fp32(v: torch.Tensor) -> torch.Tensor:
    """Round float64 ``v`` toward zero to float32."""
    r = v.float()
    over = r.double().abs() > v.abs()
    return torch.where(over, torch.nextafter(r, torch.zeros_like(r)), r)


def _rn_fp16(v: torch.Tensor) -> torch.Tensor:
    """Round float64 ``v`` (finite, below 2^40 in magnitude, zero or above 2^-60) to nearest-even
    fp16, correctly, with +0 for zero: ``(v + M) − M`` rounds at M's last place, and M = 1.5·2^52
    times v's fp16 quantum. The quantum comes from v's float32 exponent, which exceeds
    floor(log2|v|) only where v rounds up to a power of two in float32, and there both quanta
    give that power of two. (torch's own float64 → fp16 cast rounds twice, through float32.)"""
    e = ((v.float().view(torch.int32) >> 23) & 0xFF) - 127
    magic = pow2(torch.clamp(e, min=FP16.emin) + (52 - FP16.man_bits), check=False) * 1.5
    return ((v + magic) - magic).half()


def _spans(a: torch.Tensor, b: torch.Tensor) -> list[tuple[int, int, int, int, int]]:
    """For each k whose products are not all zero: (k, first row, end row, first column,
    end column) of the rectangle holding every non-zero ``a[..., i, k] * b[..., k, j]`` of the
    whole batch. Products outside it are zero in every matrix: they neither set a block's
    exponent nor add to its sum, so the block is computed on these rectangles only (for the
    lower-triangular operands of a Neumann product, about a sixth of the M·K·N triples)."""
    rows = (a != 0).reshape((-1,) + a.shape[-2:]).any(0).T  # [K, M]
    cols = (b != 0).reshape((-1,) + b.shape[-2:]).any(0)  # [K, N]

    def bounds(nz: torch.Tensor) -> tuple[list, list, list]:
        n = nz.shape[-1]
        first = nz.to(torch.uint8).argmax(-1)
        last = n - nz.flip(-1).to(torch.uint8).argmax(-1)
        return nz.any(-1).tolist(), first.tolist(), last.tolist()

    (ra, r0, r1), (cb, c0, c1) = bounds(rows), bounds(cols)
    return [(k, r0[k], r1[k], c0[k], c1[k]) for k in range(len(ra)) if ra[k] and cb[k]]


def _nonfinite_outputs(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None,
                       check_operands: bool = True) -> torch.Tensor | None:
    """Outputs touched by an inf/nan operand ([..., M, N] bool), or None if there are none."""
    bad = None
    if check_operands:
        bad = ~torch.isfinite(a).all(-1, keepdim=True) | ~torch.isfinite(b).all(-2, keepdim=True)
    if c is not None:
        bad = ~torch.isfinite(c) if bad is None else bad | ~torch.isfinite(c)
    return bad if bad is not None and bool(bad.any()) else None


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def tc_block(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, in_fmt: Format,
             out_fmt: Format, *, check_operands: bool = True) -> torch.Tensor:
    """One Tensor-Core block ``c + a @ b`` (K ≤ 16): operand values in, ``out_fmt`` out.

    ``a`` is ``[..., M, K]``, ``b`` ``[..., K, N]`` (finite ``in_fmt`` values in any float
    dtype), ``c`` ``[..., M, N]`` (``out_fmt`` values) or None. fp16 output: round to
    nearest-even; fp32 output: round toward zero (see module doc). inf/nan propagate as in
    IEEE arithmetic; ``check_operands=False``: ``a`` and ``b`` are known to be finite (``c`` is
    always checked: a chain's accumulator may overflow).

    The steps of the module doc, vectorized over the batch and looped over k (one M×N slice per
    product index, restricted to the rectangle of non-zero products, see :func:`_spans`). All of
    it is exact integer arithmetic until the final rounding: each truncated term is an integer
    below 2^27 in units of 2^(E − 25), so 16 of them sum exactly in int32.
    """
    k_dim = a.shape[-1]
    if k_dim > BLOCK_K:
        raise ValueError(f"tc_block: K must be <= {BLOCK_K}, got {k_dim}")
    if out_fmt not in (FP16, FP32):
        raise ValueError(f"tc_block: output format must be fp16 or fp32, got {out_fmt.name}")
    lead = lead_shape(a.shape[:-2], b.shape[:-2],
                      c.shape[:-2] if c is not None else ())
    m, n = a.shape[-2], b.shape[-1]
    a, b = a.expand(lead + a.shape[-2:]), b.expand(lead + b.shape[-2:])
    if c is not None:
        c = c.double().expand(lead + (m, n))
    bad = _nonfinite_outputs(a, b, c, check_operands)
    if bad is not None:  # inf/nan propagate as in IEEE (the adversarial vectors agree)
        ieee = (a.double().unsqueeze(-1) * b.double().unsqueeze(-3)).sum(-2)
        if c is not None:
            ieee = ieee + c
        a, b = _finite(a), _finite(b)
        c = None if c is None else _finite(c)
        out = tc_block(a, b, c, in_fmt, out_fmt, check_operands=False)
        return torch.where(bad, ieee.to(out.dtype), out)
    spans = _spans(a, b)
    out = torch.zeros(lead + (m, n), dtype=out_fmt.torch_dtype, device=a.device)
    if c is not None:  # where every product is zero the block returns c (a zero as +0)
        out.copy_(c + 0.0)
    if not spans:
        return out
    # every non-zero product lies in one box of rows × columns: compute there only
    r_lo, r_hi = min(sp[1] for sp in spans), max(sp[2] for sp in spans)
    c_lo, c_hi = min(sp[3] for sp in spans), max(sp[4] for sp in spans)
    box = (..., slice(r_lo, r_hi), slice(c_lo, c_hi))
    spans = [(k, r0 - r_lo, r1 - r_lo, c0 - c_lo, c1 - c_lo) for k, r0, r1, c0, c1 in spans]
    out[box] = _block_sums(a[..., r_lo:r_hi, :], b[..., c_lo:c_hi],
                           None if c is None else c[box], spans, in_fmt, out_fmt)
    return out


def _block_sums(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, spans: list,
                in_fmt: Format, out_fmt: Format) -> torch.Tensor:
    """:func:`tc_block` on finite operands whose non-zero products lie in ``spans``."""
    shape = a.shape[:-1] + b.shape[-1:]
    ea = _exponent(a.double(), in_fmt.emin)
    eb = _exponent(b.double(), in_fmt.emin)
    big = torch.full(shape, _NO_EXP, dtype=torch.int32, device=a.device)
    for k, r0, r1, c0, c1 in spans:
        view = big[..., r0:r1, c0:c1]
        torch.maximum(view, ea[..., r0:r1, k, None] + eb[..., None, k, c0:c1], out=view)
    if c is not None:
        big = torch.maximum(big, _exponent(c, out_fmt.emin))
    big = torch.where(big < _NO_EXP // 2, torch.zeros_like(big), big)  # all-zero outputs
    # fp16 products (22 bits, exponents -48…31) are exact in float32, and so is their scaling
    # by 2^(25 − E) (E ≥ -28 wherever a product is non-zero): cheaper than float64 for the
    # M·K·N work
    if in_fmt == FP16:
        work = torch.float32
        scale_w = ((127 + FRACTION_BITS - big.clamp(min=2 * in_fmt.emin)) << 23).view(work)
    else:
        work = torch.float64
        scale_w = pow2(FRACTION_BITS - big, check=False)
    aw, bw = a.to(work), b.to(work)
    total = torch.zeros(shape, dtype=torch.int32, device=a.device)
    for k, r0, r1, c0, c1 in spans:
        term = aw[..., r0:r1, k, None] * bw[..., None, k, c0:c1]  # exact
        term *= scale_w[..., r0:r1, c0:c1]  # |term| < 2^27: an exact int32 after truncation
        total[..., r0:r1, c0:c1] += term.to(torch.int32)  # the conversion truncates toward 0
    # 2^(25 − E), exact; multiplying by it is an exact scaling (no overflow or underflow here)
    scale = pow2(FRACTION_BITS - big, check=False)
    value = total.double()
    if c is not None:
        value += torch.trunc(c * scale)
    value = value / scale + 0.0  # exact; + 0.0: a zero result is +0
    if out_fmt == FP16:
        return _rn_fp16(value)
    out = _rz_fp32(value)
    return torch.where(out == 0, torch.zeros_like(out), out)


def _nonfinite_fallback(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Where a row of ``a`` or a column of ``b`` holds inf/nan, IEEE propagation (unverified)."""
    bad_a = ~torch.isfinite(a).all(-1, keepdim=True)
    bad_b = ~torch.isfinite(b).all(-2, keepdim=True)
    if not bool(bad_a.any() or bad_b.any()):
        return out
    naive = torch.matmul(a, b).to(out.dtype)
    return torch.where(bad_a | bad_b, naive, out)


def tc_chain(a: torch.Tensor, b: torch.Tensor, in_fmt: Format, out_fmt: Format,
             block: int = BLOCK_K) -> torch.Tensor:
    """Chained blocks over K (zero-padded), the accumulator in ``out_fmt`` between blocks."""
    lead = lead_shape(a.shape[:-2], b.shape[:-2])
    a = a.expand(lead + a.shape[-2:])
    b = b.expand(lead + b.shape[-2:])
    af, bf = _finite(a), _finite(b)
    k = a.shape[-1]
    if k == 0:
        return torch.zeros(lead + (a.shape[-2], b.shape[-1]), dtype=out_fmt.torch_dtype,
                           device=a.device)
    acc = None
    for k0 in range(0, k, block):
        acc_in = None if acc is None else acc.double()
        acc = tc_block(af[..., k0:k0 + block], bf[..., k0:k0 + block, :], acc_in, in_fmt,
                       out_fmt, check_operands=False)
    return _nonfinite_fallback(a, b, acc)


def gemmex_algorithm(m: int, k: int, n: int) -> tuple[str, int]:
    """Which algorithm cuBLAS's ``cublasGemmEx`` (COMPUTE_16F, one matrix) runs for ``m×k @ k×n``.

    cuBLAS picks a kernel per shape; these rules reproduce every shape measured on the H200
    (docs/tensor-cores.md lists them; ``benchmarks/cublas_shapes.py`` measures them):

    * ``("block", 16)``: k ≤ 16, one Tensor-Core block;
    * ``("chain", 16)``: m, n ≤ 16 (measured 16×32×16, 8×64×8), or n a multiple of 32 from 64
      on (measured 64×64×64, 96×96×96, 1×k×64 for k = 17…63): k16 blocks chained through the fp16
      accumulator (as ``mma.sync``);
    * ``("split-chain", 64)``: k ≥ 128: K in halves of 64, each a k16 chain, the halves added in
      fp16 (measured 32×128×32);
    * ``("split", 8)`` otherwise: slices of 8 products, each one block with c = 0, rounded to fp16,
      added left to right in fp16 (measured m = n = k = 17, 18, 19, 24, 32, 48, 56, 80;
      24×40×24; 64×24×40).
    """
    if k <= BLOCK_K:
        return ("block", BLOCK_K)
    if m <= 16 and n <= 16:
        return ("chain", BLOCK_K)
    if k >= 128:
        return ("split-chain", 64)
    if n >= 64 and n % 32 == 0:
        return ("chain", BLOCK_K)
    return ("split", GEMMEX_SLICE)


def _fp16_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """IEEE fp16 x + y, correctly rounded: torch adds two fp16 values in float32 and rounds once
    more to fp16, which is exact rounding (float32 has more than 2·11 + 2 bits)."""
    return (x.float() + y.float()).half()


def gemmex_16f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cublasGemmEx COMPUTE_16F, one matrix per call (the seed's GEMM); float64 fp16 values in."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    kind, size = gemmex_algorithm(m, k, n)
    if kind in ("block", "chain"):
        return tc_chain(a, b, FP16, FP16)
    lead = lead_shape(a.shape[:-2], b.shape[:-2])
    a = a.expand(lead + a.shape[-2:])
    b = b.expand(lead + b.shape[-2:])
    af, bf = _finite(a), _finite(b)
    acc = None
    for k0 in range(0, k, size):
        if kind == "split":
            part = tc_block(af[..., k0:k0 + size], bf[..., k0:k0 + size, :], None, FP16, FP16,
                            check_operands=False)
        else:
            part = tc_chain(af[..., k0:k0 + size], bf[..., k0:k0 + size, :], FP16, FP16)
        acc = part if acc is None else _fp16_add(acc, part)
    return _nonfinite_fallback(a, b, acc)


@dataclass(frozen=True)
class TensorCoreAccumulation:
    """Chained ``mma.sync.m16n8k16`` blocks: operands in ``in_fmt``, accumulator in ``out_fmt``."""

    name: str
    in_fmt: Format
    out_fmt: Format
    gpu_twin: str | None = None
    fp32_companion: str | None = None
    needs_cuda: bool = False

    @property
    def out_dtype(self) -> torch.dtype:
        return self.out_fmt.torch_dtype

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_operands(a, b, self.name)
        a64 = _as_values(a, self.in_fmt, self.name)
        b64 = _as_values(b, self.in_fmt, self.name)
        return tc_chain(a64, b64, self.in_fmt, self.out_fmt)


@dataclass(frozen=True)
class CublasGemmExAccumulation:
    """``cublasGemmEx`` with CUBLAS_COMPUTE_16F, one matrix per call (see :func:`gemmex_16f`)."""

    name: str = "h200"
    out_dtype: torch.dtype = torch.float16
    gpu_twin: str | None = "gpu-h200"
    fp32_companion: str | None = "h200-sgemm"
    needs_cuda: bool = False

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_operands(a, b, self.name)
        return gemmex_16f(_as_values(a, FP16, self.name), _as_values(b, FP16, self.name))


@dataclass(frozen=True)
class CublasSgemmAccumulation:
    """cuBLAS fp32 GEMM on the H200 (see :func:`sgemm_h200`); operands rounded to fp32 first."""

    name: str = "h200-sgemm"
    out_dtype: torch.dtype = torch.float32
    gpu_twin: str | None = "gpu-h200-sgemm"
    fp32_companion: str | None = None
    needs_cuda: bool = False

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check_operands(a, b, self.name)
        return sgemm_h200(a, b)


MODELS = (
    CublasGemmExAccumulation(),
    TensorCoreAccumulation("h200-mma", FP16, FP16, gpu_twin="gpu-h200-mma",
                           fp32_companion="h200-sgemm"),
    TensorCoreAccumulation("h200-bf16-fp32", BF16, FP32, gpu_twin="gpu-h200-bf16-fp32"),
    TensorCoreAccumulation("h200-fp16-fp32", FP16, FP32, gpu_twin="gpu-h200-fp16-fp32"),
    CublasSgemmAccumulation(),
)
for _m in MODELS:
    register(_m)
