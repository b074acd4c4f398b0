"""(I + L)⁻¹ for strictly lower-triangular L: exact, Neumann by repeated squaring, forward
substitution. Batched over leading dimensions.

Because L is strictly lower triangular it is nilpotent (L^C = 0 for a C×C matrix), so the Neumann
series terminates and factors by repeated squaring:

    (I + L)⁻¹ = (I − L)(I + L²)(I + L⁴)···(I + L^(2^j)),  for every j ≥ 1 with 2^j < C,

i.e. ⌈log₂ C⌉ factors. FlashKDA runs this for C = 16 ((I−L)(I+L²)(I+L⁴)(I+L⁸)) in fp16 with fp16
accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdalab.arith import AccumulationModel, Format, get_accumulation, get_format, quantize
from kdalab.arith.linalg import inv64

__all__ = ["exact_inverse", "neumann_inverse", "NeumannResult", "forward_substitution",
           "neumann_factor_count", "INVERSES"]

INVERSES = ("neumann", "forward_substitution", "exact")


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
