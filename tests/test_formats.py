"""Formats and rounding: bit-for-bit against torch's own casts, and properties."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdalab.arith import (
    BF16,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    FP64,
    get_format,
    quantize,
    round_to,
    torch_cast,
)
from kdalab.arith.formats import round_to_generic

pytestmark = pytest.mark.exact  # rounding, bit for bit


def _all_values(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 16-bit dtype, as float64 values (NaNs included)."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).double()


def _probe_points(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value, every midpoint between neighbours, the float32 neighbours of each
    midpoint, and values past the largest finite."""
    v = _all_values(dtype)
    fin = torch.sort(v[torch.isfinite(v)].unique()).values
    mids = (fin[:-1] + fin[1:]) / 2  # exact in float64 (and float32: 12 or 9 significant bits)
    m32 = mids.float()
    up = torch.nextafter(m32, torch.tensor(math.inf)).double()
    down = torch.nextafter(m32, torch.tensor(-math.inf)).double()
    extra = torch.tensor([math.inf, -math.inf, math.nan, 1e30, -1e30, 3e38, 1e-30, -1e-30, 0.0,
                          -0.0], dtype=torch.float64)
    return torch.cat([v, mids, up, down, extra])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    assert a.dtype == b.dtype
    ia = a.view(torch.int16) if a.element_size() == 2 else a.view(torch.uint8)
    ib = b.view(torch.int16) if b.element_size() == 2 else b.view(torch.uint8)
    nan = torch.isnan(a.float()) & torch.isnan(b.float())  # any NaN payload is a NaN
    return bool(((ia == ib) | nan).all())


@pytest.mark.parametrize("fmt,dtype", [(FP16, torch.float16), (BF16, torch.bfloat16)])
@pytest.mark.parametrize("src", [torch.float32, torch.float64])
def test_exhaustive_16bit_matches_torch_cast(fmt, dtype, src):
    x = _probe_points(dtype).to(src)
    mine = round_to_generic(x, fmt).to(dtype)
    assert _same_bits(mine, x.to(dtype))
    assert _same_bits(round_to(x, fmt).to(dtype), x.to(dtype))
    assert _same_bits(quantize(x, fmt), x.to(dtype))


@pytest.mark.parametrize("fmt,dtype", [(FP16, torch.float16), (BF16, torch.bfloat16)])
def test_generic_bit_widths_equal_named_formats(fmt, dtype):
    x = _probe_points(dtype)
    twin = get_format((fmt.exp_bits, fmt.man_bits))  # no torch dtype: always the generic path
    assert twin.torch_dtype is None
    x32 = x.float()
    assert _same_bits(round_to(x32, twin).to(dtype), x32.to(dtype))
    assert torch.equal(round_to(x, twin).nan_to_num(7.0), round_to(x, fmt).nan_to_num(7.0))


@pytest.mark.parametrize("fmt", [FP16, BF16])
def test_torch_double_rounds_from_float64_and_round_to_does_not(fmt):
    # 1 + half an ulp + a hair: the nearest value is 1 + ulp; torch's float64 cast goes through
    # float32, loses the hair, and rounds the tie to even (1.0).
    x = torch.tensor([1 + fmt.eps / 2 + 2.0**-40], dtype=torch.float64)
    assert round_to(x, fmt).item() == 1 + fmt.eps
    assert x.to(fmt.torch_dtype).item() == 1.0
    assert torch_cast(x, fmt).item() == 1.0


@pytest.mark.parametrize("fmt,dtype", [(FP16, torch.float16), (BF16, torch.bfloat16)])
def test_torch_cast_equals_torch_from_float64_random(fmt, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200_000, dtype=torch.float64, generator=g)
    x = x * torch.exp2(torch.randint(-30, 18, x.shape, generator=g).double())
    assert _same_bits(torch_cast(x, fmt).to(dtype), x.to(dtype))


@pytest.mark.parametrize("fmt", [FP8_E4M3, FP8_E5M2])
def test_fp8_random_sample_matches_torch(fmt):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1_000_000, dtype=torch.float32, generator=g)
    x = x * torch.exp2(torch.randint(-22, 20, x.shape, generator=g).float())
    extra = torch.tensor([math.inf, -math.inf, math.nan, 448.0, 464.0, 465.0, 480.0, 57344.0,
                          61440.0, 61439.0, -0.0, 2.0**-9, 2.0**-10, 2.0**-17, 2.0**-18])
    x = torch.cat([x, extra])
    assert _same_bits(round_to_generic(x, fmt).to(fmt.torch_dtype), x.to(fmt.torch_dtype))


def test_fp32_from_float64_matches_torch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(500_000, dtype=torch.float64, generator=g)
    x = x * torch.exp2(torch.randint(-160, 130, x.shape, generator=g).double())
    a, b = round_to_generic(x, FP32).float(), x.float()
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_flush_to_zero_and_overflow_modes():
    f = get_format("fp16-ftz")
    x = torch.tensor([2.0**-15, -(2.0**-15), 2.0**-14, 65519.0, 65520.0, -70000.0])
    out = round_to(x, f)
    assert out[0].item() == 0.0 and math.copysign(1, out[1].item()) == -1 and out[1] == 0
    assert out[2].item() == 2.0**-14
    assert out[3].item() == 65504.0 and out[4].item() == math.inf and out[5].item() == -math.inf
    e4m3 = round_to(torch.tensor([1e6, -math.inf]), FP8_E4M3)
    assert e4m3.tolist() == [448.0, -448.0]


def test_format_constants():
    assert FP16.max == 65504.0 and FP16.tiny == 2.0**-14 and FP16.smallest_subnormal == 2.0**-24
    assert BF16.max == torch.finfo(torch.bfloat16).max and BF16.tiny == 2.0**-126
    assert FP8_E4M3.max == 448.0 and FP8_E5M2.max == 57344.0
    assert FP32.max == torch.finfo(torch.float32).max
    assert get_format("e3m4").max == 15.5


@pytest.mark.parametrize("bad", ["fp7", "e0m3", "exm2", 3.5])
def test_unknown_format_is_a_clear_error(bad):
    with pytest.raises(ValueError):
        get_format(bad)


def _exact_nearest(exact: Fraction, fmt) -> float:
    """Reference rounding with fractions: nearest representable, ties to even significand."""
    if exact == 0:
        return 0.0
    e = max(math.floor(math.log2(abs(float(exact)))), fmt.emin)
    if Fraction(2) ** e > abs(exact):  # log2 rounding at binade edges
        e = max(e - 1, fmt.emin)
    q = Fraction(2) ** (e - fmt.man_bits)
    n = exact / q
    lo = math.floor(n)
    r = n - lo
    k = lo + 1 if (r > Fraction(1, 2) or (r == Fraction(1, 2) and lo % 2 == 1)) else lo
    val = k * q
    return math.copysign(math.inf, exact) if abs(val) > fmt.max else float(val)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, width=64),
       st.sampled_from(["fp16", "bf16", "e3m4", "e4m3", "e5m2", "e6m5", "fp32"]))
def test_round_to_is_correct_rounding(x, name):
    fmt = get_format(name)
    if fmt.overflow != "inf":
        fmt = get_format((fmt.exp_bits, fmt.man_bits))  # IEEE-style twin for the reference
    got = round_to(torch.tensor([x], dtype=torch.float64), fmt).item()
    assert got == _exact_nearest(Fraction(x), fmt)
    if fmt.torch_dtype is not None:
        assert round_to_generic(torch.tensor([x], dtype=torch.float64), fmt).item() == got


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=2, max_size=50),
       st.sampled_from(["fp16", "bf16", "e5m2", "e3m4"]))
def test_rounding_is_monotone_idempotent_and_odd(xs, name):
    fmt = get_format(name)
    x = torch.tensor(sorted(xs), dtype=torch.float32)
    r = round_to(x, fmt)
    assert bool((r[1:] >= r[:-1]).all())  # monotone
    assert torch.equal(round_to(r, fmt), r)  # idempotent
    assert torch.equal(round_to(-x, fmt), -r)  # symmetric


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e4, 1e4, width=64), st.sampled_from([-1.0, 1.0]))
def test_residual_breaks_ties_only(x, sign):
    fmt = FP16
    r = round_to(torch.tensor([x], dtype=torch.float64), fmt,
                 residual=torch.tensor([sign * 2.0**-60], dtype=torch.float64)).item()
    assert r == _exact_nearest(Fraction(x) + Fraction(sign * 2.0**-60), fmt)


def test_fp64_format_is_identity():
    x = torch.randn(100, dtype=torch.float64)
    assert torch.equal(round_to(x, FP64), x)


@pytest.mark.parametrize("fmt", [FP16, BF16, FP8_E4M3, FP8_E5M2])
def test_float64_fast_path_equals_generic(fmt):
    """round_to's round-to-odd path (float64 → narrow torch formats) equals the generic rounding,
    on random values over the whole range, on every midpoint, and on values a hair off them."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(300_000, dtype=torch.float64, generator=g)
    x = x * torch.exp2(torch.randint(-160, 140, x.shape, generator=g).double())
    if fmt.torch_dtype in (torch.float16, torch.bfloat16):
        pts = _probe_points(fmt.torch_dtype)
        pts = pts[torch.isfinite(pts)]
        hair = pts.abs() * 2.0**-40 + 2.0**-1070
        x = torch.cat([x, pts, pts + hair, pts - hair])
    x = torch.cat([x, torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, 1e300, -1e-300])])
    a = round_to(x, fmt)
    b = round_to_generic(x, fmt)
    assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    assert torch.equal(torch.signbit(a[a == 0]), torch.signbit(b[b == 0]))
