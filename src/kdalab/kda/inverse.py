"""(I + L)⁻¹ for strictly lower-triangular L: exact, Neumann by repeated squaring, forward
substitution. Batched over leading dimensions.

Because L is strictly lower triangular it is nilpotent (L^C = 0 for a C×C matrix), so the Neumann
series terminates and factors by repeated squaring:

    (I + L)⁻¹ = (I − L)(I + L²)(I + L⁴)···(I + L^(2^j)),  for every j ≥ 1 with 2^j < C,

i.e. ⌈log₂ C⌉ factors. FlashKDA v1 runs this for C = 16 ((I−L)(I+L²)(I+L⁴)(I+L⁸)) in fp16 with
fp16 accumulation.

FlashKDA v2 (vllm-project/FlashKDA 3b225bf) replaced it by a blocked forward substitution
(:func:`block_substitution`): the diagonal 8×8 blocks inverted by an fp32 FMA chain, joined by two
bf16 products; fla's ``solve_tril`` is the same scheme with 16×16 blocks in fp32 (chunks of 16, 32,
64). Neither forms a power of L, so neither meets the Neumann product's growth (docs/inverse-
stability.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdalab.arith import (
    BF16,
    FP32,
    AccumulationModel,
    Format,
    get_accumulation,
    get_format,
    quantize,
)
from kdalab.arith.linalg import inv64

__all__ = ["exact_inverse", "neumann_inverse", "NeumannResult", "forward_substitution",
           "neumann_factor_count", "block_substitution", "substitute_fma32", "INVERSES"]

INVERSES = ("neumann", "forward_substitution", "block_substitution", "exact")


def _check_square(l: torch.Tensor) -> None:
    if l.dim() < 2 or l.shape[-1] != l.shape[-2]:
        raise ValueError(f"L must be [..., C, C], got shape {tuple(l.shape)}")


def exact_inverse(l: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.inv(I + L)`` in float64 (LAPACK), as the seed's gold result."""
    _check_square(l)
    eye = torch.eye(l.shape[-1], dtype=torch.float64, device=l.device)
    return inv64(eye + l.double())


def neumann_factor_count(chunk: int) -> int:
    """Number of factors (I − L), (I + L²), … for a C-token chunk: ⌈log₂ C⌉ (1 for C ≤ 2)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    count, exponent = 1, 1
    while exponent * 2 < chunk:
        exponent *= 2
        count += 1
    return count


@dataclass(frozen=True)
class NeumannResult:
    inverse: torch.Tensor  # [..., C, C] in the storage format
    highest_power: int  # the largest 2^j formed (L^highest_power)
    power_max: torch.Tensor  # [...] max |entry| over L and every power formed (float64)


def neumann_inverse(
    l: torch.Tensor,
    accumulation: str | AccumulationModel = "fp64",
    fmt: Format | str | None = None,
) -> NeumannResult:
    """(I + L)⁻¹ by repeated squaring, every product under ``accumulation``.

    ``fmt`` is the storage format of the running inverse and the powers (default: L's own dtype).
    The update ``inv ← inv + inv·L^(2^j)`` adds two stored values and rounds once to ``fmt``
    (as the seed's ``(inv + mm(inv, power)).half()``: for fp16 storage, torch adds in float32 and
    rounds to fp16).
    """
    l, model, fmt = _setup(l, accumulation, fmt)
    n = l.shape[-1]
    eye = torch.eye(n, dtype=l.dtype, device=l.device)
    inv = quantize(eye - l, fmt)  # exact: 1 − 0 on the diagonal, 0 − L_ij below it
    power = l
    exponent = 1
    power_max = l.abs().amax(dim=(-2, -1)).double()
    while exponent * 2 < n:
        power = quantize(model.matmul(power, power), fmt)
        exponent *= 2
        pm = power.abs().amax(dim=(-2, -1)).double()
        power_max = torch.where(pm > power_max, pm, power_max)  # Python's max(): NaN-sticky
        inv = _add(inv, quantize(model.matmul(inv, power), fmt), fmt)
    return NeumannResult(inverse=inv, highest_power=exponent, power_max=power_max)


def _setup(l: torch.Tensor, accumulation, fmt) -> tuple[torch.Tensor, AccumulationModel, Format]:
    """Check L, resolve the model and the storage format (default: L's own), store L in it."""
    _check_square(l)
    fmt = get_format(fmt) if fmt is not None else _format_of(l)
    return quantize(l, fmt), get_accumulation(accumulation), fmt


def _format_of(t: torch.Tensor) -> Format:
    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
             torch.float64: "fp64"}
    if t.dtype not in names:
        raise ValueError(f"L must be a floating tensor, got {t.dtype}")
    return get_format(names[t.dtype])


def _add(x: torch.Tensor, y: torch.Tensor, fmt: Format) -> torch.Tensor:
    """x + y rounded to fmt. For native 16-bit formats this is torch's own add (float32 sum, one
    rounding to the format), the operation the seed's code performs."""
    if fmt.torch_dtype is not None and x.dtype == fmt.torch_dtype == y.dtype:
        return x + y
    return quantize(x.double() + y.double(), fmt)


def forward_substitution(
    l: torch.Tensor,
    accumulation: str | AccumulationModel = "fp64",
    fmt: Format | str | None = None,
) -> torch.Tensor:
    """(I + L)⁻¹ row by row: X_i = e_i − Σ_{j<i} L_ij X_j (the sequential form; C steps).

    Each row's dot products run under ``accumulation``; rows are stored in ``fmt``.
    """
    l, model, fmt = _setup(l, accumulation, fmt)
    n = l.shape[-1]
    eye = torch.eye(n, dtype=torch.float64, device=l.device)
    rows = [quantize(eye[0].expand(l.shape[:-2] + (n,)).clone(), fmt)]
    for i in range(1, n):
        x = torch.stack(rows, dim=-2)  # [..., i, n]
        s = model.matmul(l[..., i : i + 1, :i], x)[..., 0, :]  # [..., n]
        rows.append(quantize(eye[i] - s.double(), fmt))
    return torch.stack(rows, dim=-2)


def _fma32(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fl32(c + a·b) of float32 values as FlashKDA v2's reference forms it: the product exactly in
    float64 (24 + 24 bits), the sum rounded to float64, then to float32. This double rounding is
    the reference's (a hardware FMA rounds once; the two differ only when the float64 sum lands
    exactly halfway between float32 values after its own rounding)."""
    return (c.double() + a.double() * b.double()).float()


def substitute_fma32(l: torch.Tensor) -> torch.Tensor:
    """(I + L)⁻¹ of strictly lower float32 ``L [..., B, B]`` by forward substitution in float32,
    each entry one FMA chain in a fixed order (FlashKDA v2's for B = 8):

        Y_rp = fl(…fl(fl(−L_rp + (−L_r,p+1)·Y_p+1,p) + (−L_r,p+2)·Y_p+2,p)… + (−L_r,r−1)·Y_r−1,p)

    i.e. rank-one updates below each pivot s = p+1, …, r−1 with Y's row s final. float32 out."""
    l = l.float()
    b = l.shape[-1]
    y = torch.zeros_like(l)
    y[..., 0, 0] = 1.0
    for r in range(1, b):
        acc = -l[..., r, :r]  # [..., r]: Y_rp before any update (p < r)
        for s in range(1, r):  # pivot s updates the entries p < s
            acc[..., :s] = _fma32(acc[..., :s], -l[..., r, s:s + 1], y[..., s, :s])
        y[..., r, :r] = acc
        y[..., r, r] = 1.0
    return y


def block_substitution(
    l: torch.Tensor,
    accumulation: str | AccumulationModel = "fp32",
    fmt: Format | str | None = BF16,
    block: int = 8,
) -> torch.Tensor:
    """(I + L)⁻¹ by blocks: each diagonal ``block``×``block`` inverse by :func:`substitute_fma32`,
    the blocks below the diagonal from them (X_ij: block (i, j) of the inverse, A_ij of L):

        X_i,i−1 = −(X_ii·A_i,i−1)·X_i−1,i−1
        X_ij    = −X_ii·(Σ_{j≤k<i} A_ik·X_kj)        (i − j ≥ 2, fla's 64-chunk merge)

    Every product under ``accumulation``; its operands (the diagonal inverses, L's blocks and the
    intermediate results) stored in ``fmt``; the result is the diagonal blocks plus the merged
    ones added in ``fmt``. FlashKDA v2 (C = 16): ``block=8``, bf16 operands, fp32 accumulation
    (``h200-bf16-fp32`` on the H200), bf16 out: P = diag(bf16 X_11, bf16 X_22),
    dc = P·bf16(A_21), o = bf16(−dc)·P, INV = P + bf16(o). fla's ``solve_tril`` (C = 16, 32, 64):
    ``block=16``, fp32 throughout (the diagonal's sums in another order than fla's, which does
    not change its stability). ``fmt=None`` keeps fp32.
    """
    _check_square(l)
    c = l.shape[-1]
    if block < 1 or c % block:
        raise ValueError(f"block_substitution: C = {c} is not a multiple of block = {block}")
    model = get_accumulation(accumulation)
    fmt = get_format(fmt) if fmt is not None else FP32
    l32 = quantize(l, FP32)
    if c == block:
        return quantize(substitute_fma32(l32), fmt)
    nb = c // block

    def blk(t, i, j):
        return t[..., i * block:(i + 1) * block, j * block:(j + 1) * block]

    def st(t):  # a stored operand: in fmt (its dtype where torch has one)
        return quantize(t, fmt)

    diag = [st(substitute_fma32(blk(l32, i, i))) for i in range(nb)]
    blocks = {(i, i): diag[i] for i in range(nb)}
    merged = {}
    for d in range(1, nb):
        for i in range(d, nb):
            j = i - d
            if d == 1:
                t = st(-model.matmul(diag[i], st(blk(l32, i, j))))
                x = model.matmul(t, diag[j])
            else:
                acc = None
                for k in range(j, i):
                    term = model.matmul(st(blk(l32, i, k)), blocks[(k, j)])
                    acc = term if acc is None else acc + term
                x = -model.matmul(diag[i], st(acc))
            blocks[(i, j)] = merged[(i, j)] = st(x)
    zero = torch.zeros_like(diag[0])
    p = torch.cat([torch.cat([diag[i] if i == j else zero for j in range(nb)], dim=-1)
                   for i in range(nb)], dim=-2)
    o = torch.cat([torch.cat([merged.get((i, j), zero) for j in range(nb)], dim=-1)
                   for i in range(nb)], dim=-2)
    return p + o  # disjoint blocks: the add only places them (and settles zeros' signs)
