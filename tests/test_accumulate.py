"""Accumulation models: bit-exact against their definitions."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdalab.arith import available_accumulations, get_accumulation, matmul
from tests.seed_oracle import seed_fp16_accum_mm  # the seed's CPU fallback: the oracle

pytestmark = pytest.mark.exact  # accumulation models and batching, bit for bit


def _random_fp16(shape, gen, spread=8):
    x = torch.randn(shape, generator=gen) * torch.exp2(
        torch.randint(-spread, spread, shape, generator=gen).float())
    return x.half()


def test_fp16_seq_equals_seed_fallback_batched():
    gen = torch.Generator().manual_seed(0)
    a = _random_fp16((6, 17, 23), gen)
    b = _random_fp16((6, 23, 9), gen)
    out = matmul(a, b, "fp16-seq")
    assert out.dtype == torch.float16
    for i in range(6):
        ref = seed_fp16_accum_mm(a[i], b[i])
        assert torch.equal(out[i].view(torch.int16), ref.view(torch.int16))


def test_fp16_seq_broadcasts_leading_dims():
    gen = torch.Generator().manual_seed(1)
    a = _random_fp16((3, 1, 4, 5), gen)
    b = _random_fp16((2, 5, 4), gen)
    out = matmul(a, b, "fp16-seq")
    assert out.shape == (3, 2, 4, 4)
    assert torch.equal(out[1, 0], seed_fp16_accum_mm(a[1, 0], b[0]))


def _exact_fp16(products: list[Fraction]) -> float:
    s = sum(products, Fraction(0))
    near = np.float16(float(s))  # within one fp16 step of the answer
    cands = [np.nextafter(near, np.float16(-np.inf)), near, np.nextafter(near, np.float16(np.inf))]
    cands = [c for c in cands if np.isfinite(c)]

    def key(c):
        return (abs(Fraction(float(c)) - s), int(np.array(c, dtype=np.float16).view(np.uint16)) & 1)

    best = min(cands, key=key)
    if abs(s) >= Fraction(65520):
        return math.copysign(math.inf, s)
    return float(best)


def _check_once(a: torch.Tensor, b: torch.Tensor) -> None:
    out = matmul(a, b, "fp16-once")
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            prods = [Fraction(float(a[i, k])) * Fraction(float(b[k, j])) for k in range(a.shape[1])]
            assert float(out[i, j]) == _exact_fp16(prods), (i, j)


def test_fp16_once_is_the_exact_sum_rounded_once():
    gen = torch.Generator().manual_seed(2)
    _check_once(_random_fp16((12, 40), gen, spread=12), _random_fp16((40, 12), gen, spread=12))


def test_fp16_once_adversarial_ties_and_cancellation():
    # 1 + 2^-11 is a tie between 1 and 1 + 2^-10; a tiny extra product decides it.
    one, half_ulp, tiny = 1.0, 2.0**-11, 2.0**-24
    a = torch.tensor([[one, half_ulp, tiny], [one, half_ulp, -tiny], [one, half_ulp, 0.0],
                      [60000.0, -60000.0, 1.0], [2.0**-24, 2.0**-24, 0.0]], dtype=torch.float16)
    b = torch.tensor([[1.0], [1.0], [2.0**-10]], dtype=torch.float16)
    out = matmul(a, b, "fp16-once")[:, 0].tolist()
    assert out[0] == 1 + 2.0**-10  # above the tie
    assert out[1] == 1.0  # below the tie
    assert out[2] == 1.0  # exact tie: to even
    assert out[3] == 2.0**-10  # 60000 − 60000 cancels exactly, the small product survives
    assert out[4] == 2.0**-23  # two smallest subnormals add exactly
    _check_once(a, b)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 24), st.integers(0, 2**31 - 1))
def test_fp16_once_property(k, seed):
    gen = torch.Generator().manual_seed(seed)
    _check_once(_random_fp16((3, k), gen, spread=14), _random_fp16((k, 3), gen, spread=14))


def test_fp16_once_fast_and_limb_paths_agree():
    # small entries take the single-GEMM path, large ones the limb path; both are exact
    gen = torch.Generator().manual_seed(11)
    small = _random_fp16((4, 24, 24), gen, spread=3) * 0.01
    big = small.clone()
    big[0, 0, 0] = 3000.0  # pushes Σ|a·b| past 32 for the whole batch: limb path
    out_small = matmul(small, small, "fp16-once")
    out_big = matmul(big, small, "fp16-once")
    assert torch.equal(out_small[1:], out_big[1:])  # runs 1..3 are the same products
    _check_once(small[2], small[2])
    _check_once(big[0], small[0])


def test_fp16_once_rejects_non_fp16_operands():
    with pytest.raises(ValueError, match="float16"):
        matmul(torch.ones(2, 2), torch.ones(2, 2), "fp16-once")


def test_fp16_once_propagates_inf_and_nan():
    a = torch.tensor([[math.inf, 1.0], [1.0, 1.0]], dtype=torch.float16)
    b = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float16)
    out = matmul(a, b, "fp16-once")
    ref = (a.double() @ b.double()).half()
    assert torch.equal(out.isnan(), ref.isnan()) and out[0, 0].item() == math.inf


def test_fp32_model_is_batch_invariant():
    # Records must not depend on how many runs share a batch.
    gen = torch.Generator().manual_seed(3)
    for c in (4, 16, 17, 48, 64):
        a = torch.randn(40, c, 128, generator=gen).bfloat16()
        b = torch.randn(40, 128, c, generator=gen).bfloat16()
        whole = matmul(a, b, "fp32")
        for i in (0, 7, 39):
            assert torch.equal(whole[i], matmul(a[i], b[i], "fp32"))
            assert torch.equal(whole[i : i + 1], matmul(a[i : i + 1], b[i : i + 1], "fp32"))


def test_registry_and_errors():
    assert {"fp64", "fp32", "fp16-seq", "fp16-once"} <= set(available_accumulations())
    with pytest.raises(ValueError, match="unknown accumulation"):
        get_accumulation("fp12")
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul(torch.ones(2, 3), torch.ones(2, 3), "fp64")


def test_hardware_companions_and_device_mapping():
    from kdalab.arith import fp32_companion, on_device

    m = get_accumulation
    assert fp32_companion(m("h200"), m("fp32")) is m("h200-sgemm")
    assert fp32_companion(m("fp16-seq"), m("fp32")) is m("fp32")  # no hardware: the default
    assert fp32_companion(m("gpu-h200"), m("fp32")) is m("gpu-h200-sgemm")
    assert on_device(m("h200"), "cpu") is m("h200")
    assert on_device(m("h200"), "cuda") is m("gpu-h200")  # attributes only: needs no GPU
    assert on_device(m("fp16-seq"), "cuda") is m("fp16-seq")
    # every twin is registered, needs CUDA and names its CPU model back
    for name in available_accumulations():
        twin = m(name).gpu_twin
        if twin is not None:
            assert m(twin).needs_cuda and m(twin).cpu_twin == name and not m(name).needs_cuda


def test_registry_refuses_a_second_model_under_a_taken_name():
    from kdalab.arith import register
    from kdalab.arith.accumulate import Fp32Accumulation

    register(m := get_accumulation("fp32"))  # the same value again: harmless
    with pytest.raises(ValueError, match="already registered"):
        register(Fp32Accumulation(name="fp64"))
    assert get_accumulation("fp64") is not m


def test_fp16_seq_on_sparse_rectangles_equals_the_seed_loop():
    """Above SPARSE_MIN outputs fp16-seq computes each step only where some product is non-zero;
    triangular operands with tiny entries (sums that round to −0, then meet a skipped +0) and
    an inf in one matrix must still give the seed loop's bits in every matrix."""
    from kdalab.arith.accumulate import SPARSE_MIN

    gen = torch.Generator().manual_seed(7)
    batch, c = 72, 64
    assert batch * c * c >= SPARSE_MIN
    scale = torch.exp2(torch.randint(-30, 2, (batch, c, c), generator=gen).float())
    l = torch.tril(torch.randn(batch, c, c, generator=gen) * scale, -1).half()
    inv = torch.tril(torch.randn(batch, c, c, generator=gen) * scale.flip(-1), 0).half()
    l[3, 40, 7] = float("inf")
    for a, b in ((l, l), (inv, l)):
        out = matmul(a, b, "fp16-seq")
        negative_zeros = 0
        for i in range(batch):
            ref = seed_fp16_accum_mm(a[i], b[i])
            assert torch.equal(out[i].view(torch.int16), ref.view(torch.int16)), i
            negative_zeros += int(((ref == 0) & torch.signbit(ref)).sum())
        assert negative_zeros > 0  # the −0 repair was exercised


@pytest.mark.parametrize("c", [16, 17, 19, 33])
def test_float64_products_and_inverses_do_not_depend_on_the_batch(c):
    """Every matrix of a batch gets the bits of the same call on that matrix alone (MKL's float64
    paths depend on a matrix's alignment, and half the matrices of an odd-sized batch are
    misaligned), whatever the batch size or the slice taken."""
    from kdalab.arith.linalg import inv64, matmul64

    gen = torch.Generator().manual_seed(c)
    a = torch.randn(24, c, c, generator=gen, dtype=torch.float64)
    b = torch.randn(24, c, 7 if c == 19 else c, generator=gen, dtype=torch.float64)
    x = torch.eye(c, dtype=torch.float64) + 0.2 * torch.tril(a, -1)
    alone_mm = [a[i].clone() @ b[i].clone() for i in range(24)]
    alone_inv = [torch.linalg.inv(x[i].clone()) for i in range(24)]
    for lo, hi in ((0, 24), (1, 24), (3, 8), (5, 6)):
        mm, inv = matmul64(a[lo:hi], b[lo:hi]), inv64(x[lo:hi])
        for i in range(lo, hi):
            assert torch.equal(mm[i - lo], alone_mm[i]) and torch.equal(inv[i - lo], alone_inv[i])
    assert torch.equal(matmul64(a[:6].view(2, 3, c, c), b[:6].view(2, 3, *b.shape[1:]))[1, 2],
                       alone_mm[5])
