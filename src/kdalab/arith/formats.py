"""Floating-point formats as values, and one function that rounds to any of them.

A :class:`Format` is data — exponent bits, significand bits, whether subnormals are kept, what
happens on overflow — in the manner of Higham's *chop*. :func:`round_to` rounds a float32/float64
tensor to the nearest value of the format (round-to-nearest, ties to even) and returns it in the
input's dtype, so formats torch lacks (say e3m4, or fp16 without subnormals) work like the ones
it has.

Notes on torch's own casts, which the tests pin down bit for bit:

* float32 → fp16/bf16/fp8 and float64 → float32 are correctly rounded; :func:`round_to` equals them.
* float64 → fp16/bf16 in torch goes *through float32* (two roundings), which differs from a correct
  rounding near ties (e.g. 1 + 2⁻¹¹ + 2⁻⁴⁰ → torch gives 1.0, the nearest fp16 is 1 + 2⁻¹⁰).
  :func:`torch_cast` reproduces torch's behaviour where that is what an experiment did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "Format",
    "FP64",
    "FP32",
    "TF32",
    "BF16",
    "FP16",
    "FP8_E4M3",
    "FP8_E5M2",
    "FORMATS",
    "get_format",
    "round_to",
    "round_to_generic",
    "torch_cast",
    "quantize",
]


@dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    ``exp_bits``/``man_bits`` are the stored exponent and fraction widths (fp16: 5/10).
    ``finite_only`` is the OCP "fn" encoding of fp8 e4m3: no infinities, the all-ones exponent
    holds finite values and only all-ones there is NaN (largest finite 448).
    ``overflow`` says what a rounded value past the largest finite becomes: ``"inf"`` (IEEE),
    ``"saturate"`` (±largest finite; what torch's e4m3fn cast and NVIDIA's ``cvt.satfinite`` do,
    infinities included) or ``"nan"``.
    ``subnormals=False`` flushes results below the smallest normal to a signed zero (after
    rounding).
    """

    name: str
    exp_bits: int
    man_bits: int
    subnormals: bool = True
    overflow: str = "inf"
    finite_only: bool = False
    torch_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if not (2 <= self.exp_bits <= 11):
            raise ValueError(f"exp_bits must be in 2..11, got {self.exp_bits}")
        if not (0 <= self.man_bits <= 52):
            raise ValueError(f"man_bits must be in 0..52, got {self.man_bits}")
        if self.overflow not in ("inf", "saturate", "nan"):
            raise ValueError(
                f"overflow must be 'inf', 'saturate' or 'nan', got {self.overflow!r}")
        if self.finite_only and self.overflow == "inf":
            raise ValueError("a finite_only format has no infinities: overflow can't be 'inf'")

    # --- derived constants -------------------------------------------------------------
    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        return self.bias + 1 if self.finite_only else self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.finite_only:  # all-ones exponent with all-ones fraction is NaN
            frac = 2.0 - 2.0 ** (1 - self.man_bits)
        else:
            frac = 2.0 - 2.0 ** (-self.man_bits)
        return math.ldexp(frac, self.emax)

    @property
    def tiny(self) -> float:
        """Smallest positive normal value."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.man_bits)

    @property
    def eps(self) -> float:
        """Distance from 1 to the next larger value."""
        return math.ldexp(1.0, -self.man_bits)

    @property
    def precision(self) -> int:
        """Significand bits including the implicit one."""
        return self.man_bits + 1

    def with_subnormals(self, keep: bool) -> Format:
        suffix = "" if keep else "-ftz"
        base = self.name.removesuffix("-ftz")
        return Format(base + suffix, self.exp_bits, self.man_bits, keep, self.overflow,
                      self.finite_only, self.torch_dtype if keep else None)

    def with_overflow(self, overflow: str) -> Format:
        """This format with another overflow rule, rounded by :func:`round_to_generic` (no torch
        dtype). ``with_overflow("nan")`` of a saturating format makes every value that would be
        clamped NaN, so that saturation can be counted."""
        if overflow == self.overflow:
            return self
        return Format(f"{self.name}-{overflow}", self.exp_bits, self.man_bits, self.subnormals,
                      overflow, self.finite_only)

    def round(self, x: torch.Tensor) -> torch.Tensor:
        return round_to(x, self)

    def __str__(self) -> str:
        return self.name


FP64 = Format("fp64", 11, 52, torch_dtype=torch.float64)
FP32 = Format("fp32", 8, 23, torch_dtype=torch.float32)
TF32 = Format("tf32", 8, 10)
BF16 = Format("bf16", 8, 7, torch_dtype=torch.bfloat16)
FP16 = Format("fp16", 5, 10, torch_dtype=torch.float16)
FP8_E4M3 = Format("fp8_e4m3", 4, 3, overflow="saturate", finite_only=True,
                  torch_dtype=torch.float8_e4m3fn)
FP8_E5M2 = Format("fp8_e5m2", 5, 2, torch_dtype=torch.float8_e5m2)

FORMATS: dict[str, Format] = {
    f.name: f for f in (FP64, FP32, TF32, BF16, FP16, FP8_E4M3, FP8_E5M2)
}
_ALIASES = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32",
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "e4m3": "fp8_e4m3", "fp8-e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "fp8-e5m2": "fp8_e5m2",
}


def get_format(spec: str | Format | tuple[int, int]) -> Format:
    """Look a format up by name (``bf16``, ``fp8_e4m3``, ``e3m4``, ``fp16-ftz``) or bit widths.

    ``eXmY`` names any IEEE-style format with X exponent and Y fraction bits; a ``-ftz`` suffix
    flushes subnormals.
    """
    if isinstance(spec, Format):
        return spec
    if isinstance(spec, tuple):
        e, m = spec
        return Format(f"e{e}m{m}", int(e), int(m))
    if not isinstance(spec, str):
        raise ValueError(f"format must be a name, a Format or (exp_bits, man_bits), got {spec!r}")
    name = spec.strip().lower()
    ftz = name.endswith("-ftz")
    base = name.removesuffix("-ftz")
    base = _ALIASES.get(base, base)
    if base in FORMATS:
        fmt = FORMATS[base]
    elif len(base) >= 4 and base[0] == "e" and "m" in base[1:]:
        e, _, m = base[1:].partition("m")
        if not (e.isdigit() and m.isdigit()):
            raise ValueError(f"unknown format {spec!r}")
        fmt = Format(base, int(e), int(m))
    else:
        known = ", ".join(sorted(FORMATS))
        raise ValueError(f"unknown format {spec!r}; expected one of {known}, or eXmY")
    return fmt.with_subnormals(False) if ftz else fmt


def pow2(n: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """2**n as float64 for integer n in [-1022, 1023], built from its bit pattern: exact on every
    device (torch.ldexp on CUDA goes through pow and is not). ``check=False`` skips the range
    check (it reads the data: on CUDA, a wait for the GPU) where the range is certain."""
    n = n.to(torch.int64)
    if check and bool(((n < -1022) | (n > 1023)).any()):
        raise ValueError("pow2: exponent outside the normal float64 range")
    return ((n + 1023) << 52).view(torch.float64)


def _binade(x: torch.Tensor) -> torch.Tensor:
    """floor(log2|x|) for finite non-zero x (exact, via frexp); 0 where x == 0."""
    _, e = torch.frexp(x)
    return e.to(torch.int32) - 1


def _torch_cast_is_exact(x: torch.Tensor, fmt: Format) -> bool:
    """Where torch's own cast is the correct rounding (proven bit for bit by the tests against
    :func:`round_to_generic`): float32 → any narrower torch format, float64 → float32."""
    if fmt.torch_dtype is None:
        return False
    return x.dtype == torch.float32 or fmt.torch_dtype == torch.float32


def round_to(
    x: torch.Tensor, fmt: Format | str, *, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """Round ``x`` to the nearest value of ``fmt`` (ties to even); same dtype as ``x``.

    Uses torch's cast where that is proven identical (it is faster), else
    :func:`round_to_generic`, which works for any format.
    """
    fmt = get_format(fmt)
    if residual is None and x.dtype in (torch.float32, torch.float64):
        if _torch_cast_is_exact(x, fmt):
            return x.to(fmt.torch_dtype).to(x.dtype)
        if x.dtype == torch.float64 and fmt.torch_dtype is not None and \
                fmt.torch_dtype not in (torch.float32, torch.float64):
            # float64 → a 16- or 8-bit torch format: round to float32 *to odd*, then let torch
            # round to nearest. Round-to-odd keeps a sticky bit, so with float32's 24 bits ≥ the
            # target's precision + 2 the second rounding is the correct one (Boldo & Melquiond,
            # "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to
            # odd", IEEE TC 2008). Float32's exponent range covers every such format.
            return _to_float32_round_to_odd(x).to(fmt.torch_dtype).double()
    return round_to_generic(x, fmt, residual=residual)


def _to_float32_round_to_odd(x: torch.Tensor) -> torch.Tensor:
    """float64 → float32 rounded to odd: truncate toward zero, set the last bit if inexact."""
    t = x.float()
    back = t.double()
    over = back.abs() > x.abs()  # RNE went away from zero (or overflowed to inf): step back
    t = torch.where(over, torch.nextafter(t, torch.zeros_like(t)), t)
    inexact = t.double() != x
    bits = t.view(torch.int32) | inexact.to(torch.int32)
    t = bits.view(torch.float32)
    return torch.where(torch.isnan(x), x.float(), t)


def round_to_generic(
    x: torch.Tensor, fmt: Format | str, *, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """Round ``x`` to the nearest value of ``fmt`` (ties to even); same dtype as ``x``.

    ``x`` must be float32 or float64 and ``fmt`` no wider than it. ``residual`` (same shape, tiny
    compared with one unit in the last place of ``fmt``) says on which side of ``x`` the exact value
    lies: ``x + residual`` is rounded, where ``residual`` only matters when ``x`` is exactly halfway
    between two values of ``fmt``. Accumulation models use it to round an exact sum kept as two
    float64 numbers.
    """
    fmt = get_format(fmt)
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"x must be float32 or float64, got {x.dtype}")
    wide = FP64 if x.dtype == torch.float64 else FP32
    if fmt.exp_bits > wide.exp_bits or fmt.man_bits > wide.man_bits:
        raise ValueError(f"cannot round {x.dtype} to the wider format {fmt.name}")
    if fmt.exp_bits == wide.exp_bits and fmt.man_bits == wide.man_bits and fmt.subnormals:
        return x.clone()

    # Work in float64: every float32 value and every intermediate below is exact there.
    xd = x.double()
    finite = torch.isfinite(xd)
    xs = torch.where(finite, xd, torch.zeros_like(xd))
    e = torch.clamp(_binade(xs), min=fmt.emin)
    quantum_exp = (e - fmt.man_bits).clamp(min=-1022)  # fp64 targets never get here
    # e <= 1023 (xs finite): ±quantum_exp lie in pow2's range unless man_bits == 0
    check = fmt.man_bits == 0
    y = xs * pow2(-quantum_exp, check=check)  # exact: scaling by a power of two
    r = torch.round(y)  # half to even
    if residual is not None:
        fl = torch.floor(y)
        tie = (y - fl) == 0.5
        res = residual.double().expand_as(y)
        r = torch.where(tie & (res > 0), fl + 1, r)
        r = torch.where(tie & (res < 0), fl, r)
    out = r * pow2(quantum_exp, check=check)
    if not fmt.subnormals:
        out = torch.where(out.abs() < fmt.tiny, torch.copysign(torch.zeros_like(out), xs), out)
    out = torch.where(finite, out, xd)  # inf and nan pass through, then overflow rules apply
    big = out.abs() > fmt.max  # false for nan
    over = {"inf": math.inf, "saturate": fmt.max, "nan": math.nan}[fmt.overflow]
    out = torch.where(big, torch.copysign(torch.full_like(out, over), out), out)
    return out.to(x.dtype)


def torch_cast(x: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """``round_to`` as torch's own ``.to(dtype)`` does it, returned in ``x``'s dtype.

    Identical to :func:`round_to` except that float64 → fp16/bf16 rounds through float32 first,
    as torch does. Used where kdalab reproduces code that called ``.half()`` on float64 data.
    """
    fmt = get_format(fmt)
    if x.dtype == torch.float64 and fmt.exp_bits <= 8 and fmt.man_bits < 23:
        return round_to(x.float(), fmt).double()  # torch's float64 → float32 is exact rounding
    return round_to(x, fmt)


def quantize(x: torch.Tensor, fmt: Format | str) -> torch.Tensor:
    """Round ``x`` to ``fmt`` and return it in the format's own torch dtype where torch has one
    (float16, bfloat16, float8…), else as rounded values in float32/float64.

    Correctly rounded (from float64 too, unlike ``x.to(dtype)``); uses torch's cast directly where
    that is proven identical (float32 → narrower formats, float64 → float32).
    """
    fmt = get_format(fmt)
    if fmt.torch_dtype is not None:
        if x.dtype == fmt.torch_dtype:
            return x
        if x.dtype == torch.float32 or (x.dtype == torch.float64 and fmt.torch_dtype in (
                torch.float32, torch.float64)):
            return x.to(fmt.torch_dtype)
        if x.dtype not in (torch.float32, torch.float64):
            x = x.double()
        return round_to(x, fmt).to(fmt.torch_dtype)
    if x.dtype not in (torch.float32, torch.float64):
        x = x.double()
    return round_to(x, fmt)
