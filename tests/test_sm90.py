"""The H200 instruction models read measured tables the way the device script writes them.

The tables here are made from known stand-in functions in the device script's format (a tanh
that ignores the low 12 input bits, an exp2 and an rsqrt off the correctly rounded one by an ulp
in a pattern), so the models must return the stand-ins bit for bit on any input; without tables
they are the correctly rounded functions. With the package's tables (the H200's, 2026-11-30) they
must return what the H200 returned on the inputs of ``tests/data/flashkda/sm90_checks.npz``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kdalab.arith import sm90
from kdalab.arith.scalar import SM90_OPS, TORCH_OPS, get_scalar_ops, sequential_cumsum

pytestmark = pytest.mark.exact  # the H200's instruction outputs, bit for bit

FRAC = 1 << 23
CHECKS = Path(__file__).parent / "data" / "flashkda" / "sm90_checks.npz"


def _bits(x):
    return x.contiguous().view(torch.int32).to(torch.int64)


def _floats(b):
    return ((b + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.float32)


def _summary(obj):
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)


def fake_tanh(x):
    ax = x.abs()
    trunc = _floats(_bits(ax) & ~((1 << 12) - 1))
    y = torch.tanh(trunc.double()).float()
    y = torch.where(ax < 2.0**-12, ax, y)
    y = torch.where(ax >= 16, torch.ones_like(y), y)
    return torch.copysign(y, x)


def fake_ex2(x):
    """The H200's rule (docs/flashkda.md) on a fraction table one ulp up at odd j."""
    def table(j):
        y = torch.exp2(j.double() * 2.0**-23).float()
        return _floats(_bits(y) + (j % 2))

    t = torch.trunc(x.double().abs() * 2.0**23)
    i = torch.floor(t / FRAC)
    f = (t - i * FRAC).long()
    neg = x < 0
    w = torch.where(neg, torch.where(f == 0, -i, -i - 1), i)
    j = torch.where(neg & (f != 0), FRAC - 1 - f, torch.where(neg, torch.zeros_like(f), f))
    y = (table(j).double() * torch.exp2(w)).float()
    return torch.where(y < 2.0**-126, torch.zeros_like(y), y)


def fake_rsqrt_base(par):
    m = torch.arange(FRAC, dtype=torch.int64)
    x = _floats(((par + 127) << 23) + m)
    return x, _floats(_bits(torch.rsqrt(x.double()).float()) - (m % 3 == 0).long())


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sm90")
    binades = {}
    arrays = {}
    for e in range(-40, 9):
        info = {"odd": True, "all_equal_x": e < -12, "all_one": e >= 4,
                "invariant_low_bits": 12, "stored": None}
        if -12 <= e < 4:
            j = torch.arange(FRAC >> 12, dtype=torch.int64) << 12
            arrays[f"e{e}"] = fake_tanh(_floats(((e + 127) << 23) + j)).numpy()
            info["stored"] = "table"
        binades[e] = info
    arrays["summary_json"] = _summary({"binades": binades})
    np.savez(tmp_path / "sm90_tanh.npz", **arrays)
    j = torch.arange(FRAC, dtype=torch.float64)
    xf = (j * 2.0**-23).float()
    ulp = _bits(fake_ex2(xf)) - _bits(torch.exp2(xf.double()).float())
    ex = {"ex2__frac_ulp": ulp.numpy().astype(np.int8),
          "ex2__summary_json": _summary({"binades": {
              f"{s}{e}": {"floor": 0, "round": 7, "trunc": 0 if s == "+" else 9}
              for s in "+-" for e in range(-30, 7)}})}
    for par in (0, 1):
        x, y = fake_rsqrt_base(par)
        ex[f"rsqrt__e{par}_ulp"] = (_bits(y) - _bits(torch.rsqrt(x.double()).float())
                                    ).numpy().astype(np.int8)
    ex["rsqrt__summary_json"] = _summary({"binades": {e: 0 for e in range(-40, 41)}})
    np.savez(tmp_path / "sm90_ex2_rsqrt.npz", **ex)
    return tmp_path


@pytest.fixture()
def with_tables(tables, monkeypatch):
    monkeypatch.setenv("KDALAB_SM90_DATA", str(tables))
    sm90.reload()
    yield
    monkeypatch.undo()
    sm90.reload()


def _random_floats(n, lo_exp, hi_exp, seed=0, signed=True):
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(lo_exp, hi_exp + 1, (n,), generator=g)
    m = torch.randint(0, FRAC, (n,), generator=g)
    x = _floats(((e + 127) << 23) + m)
    if signed:
        x = torch.where(torch.rand(n, generator=g) < 0.5, -x, x)
    return x


def test_tanh_reads_the_measured_tables(with_tables):
    x = torch.cat([_random_floats(20000, -45, 10), torch.tensor([0.0, -0.0, 1e-30, 3e38])])
    assert torch.equal(_bits(sm90.tanh_approx(x)), _bits(fake_tanh(x)))
    assert sm90.measured()["tanh.approx.f32"] == "measured"


def test_ex2_reads_the_measured_fraction_table(with_tables):
    x = torch.cat([_random_floats(20000, -35, 6), torch.tensor([0.0, -126.5, 127.9, 130.0])])
    want = fake_ex2(x)
    got = sm90.ex2_approx_ftz(x)
    assert torch.equal(_bits(got), _bits(want))
    assert sm90.measured()["ex2.approx.ftz.f32"] == "measured"


def test_rsqrt_scales_the_measured_base_table(with_tables):
    x = _random_floats(20000, -40, 40, signed=False)
    e = (_bits(x) >> 23) - 127
    par = e % 2
    base = torch.stack([fake_rsqrt_base(p)[1] for p in (0, 1)])
    want = (base[par, _bits(x) & (FRAC - 1)].double() * torch.exp2(-((e - par) // 2).double()))
    assert torch.equal(_bits(sm90.rsqrt_approx_ftz(x)), _bits(want.float()))
    assert torch.isinf(sm90.rsqrt_approx_ftz(torch.tensor([0.0, 1e-40]))).all()


def test_without_tables_the_models_are_correctly_rounded(tmp_path, monkeypatch):
    monkeypatch.setenv("KDALAB_SM90_DATA", str(tmp_path))
    sm90.reload()
    try:
        x = _random_floats(5000, -20, 4)
        assert torch.equal(sm90.tanh_approx(x), torch.tanh(x.double()).float())
        assert torch.equal(sm90.rsqrt_approx_ftz(x.abs()), torch.rsqrt(x.abs().double()).float())
        assert "no measurement" in sm90.measured()["ex2.approx.ftz.f32"]
    finally:
        monkeypatch.undo()
        sm90.reload()


def test_flashkda_sigmoid_form(with_tables):
    """FlashKDA's sigmoid: fma(tanh.approx(x·½), ½, ½) (utils.cuh:50-53): on the stand-in tanh,
    exactly that; near −∞ it reaches 0, where torch's sigmoid stays positive."""
    x = _random_floats(5000, -10, 6)
    th = fake_tanh(x * 0.5)
    want = (th.double() * 0.5 + 0.5).float()
    assert torch.equal(SM90_OPS.sigmoid_f32(x), want)
    assert SM90_OPS.sigmoid_f32(torch.tensor([-40.0])).item() == 0.0
    assert TORCH_OPS.sigmoid_f32(torch.tensor([-40.0])).item() > 0.0


def test_scalar_ops_values():
    assert get_scalar_ops("sm90") is SM90_OPS
    with pytest.raises(ValueError, match="unknown scalar ops"):
        get_scalar_ops("nope")
    with pytest.raises(ValueError, match="sigmoid must be one of"):
        type(SM90_OPS)("bad", sigmoid="exact")
    x = torch.tensor([[1.0, 2.0**-24, 2.0**-24, 2.0**-24]])
    seq = sequential_cumsum(x, -1)
    assert seq[0, -1].item() == 1.0  # each 2^-24 is lost to rounding at 1
    assert x.cumsum(-1)[0, -1].item() > 1.0  # torch's CPU cumsum carries them in float64


def test_tanh_tables_as_bit_differences(tables, tmp_path, monkeypatch):
    """The device script stores each binade as its first output's bits and the differences of
    consecutive outputs' bits; the model reads that form the same."""
    with np.load(tables / "sm90_tanh.npz") as z:
        arrays = {k: z[k] for k in z.files}
    for key in [k for k in arrays if k.startswith("e")]:
        b = torch.from_numpy(arrays.pop(key)).view(torch.int32).long()
        arrays["b" + key[1:]] = b[:1].numpy()
        arrays["d" + key[1:]] = (b[1:] - b[:-1]).numpy().astype(np.int16)
    np.savez_compressed(tmp_path / "sm90_tanh.npz", **arrays)
    monkeypatch.setenv("KDALAB_SM90_DATA", str(tmp_path))
    sm90.reload()
    try:
        x = _random_floats(20000, -14, 5, seed=3)
        assert torch.equal(_bits(sm90.tanh_approx(x)), _bits(fake_tanh(x)))
    finally:
        monkeypatch.undo()
        sm90.reload()


@pytest.fixture()
def package_tables(monkeypatch):
    monkeypatch.delenv("KDALAB_SM90_DATA", raising=False)
    sm90.reload()
    yield
    monkeypatch.undo()
    sm90.reload()


def _same(got, want):
    """Bit for bit, NaN for NaN (whatever its payload)."""
    nan = torch.isnan(want)
    return torch.equal(torch.isnan(got), nan) and torch.equal(_bits(got[~nan]), _bits(want[~nan]))


def test_package_tables_are_the_h200s(package_tables):
    """The package's tables cover every input (tanh on whole binades 2⁻⁴⁰ ≤ |x| < 2⁹, beyond that
    x or 1 as measured at its ends), and reproduce the run's own outputs elsewhere: tanh.approx
    and FlashKDA's sigmoid on every bf16 input (all exponents, subnormals — not flushed —, inf,
    NaN), ex2.approx on 4,097 inputs in [−130, −120] (its flush to zero)."""
    assert set(sm90.measured().values()) == {"measured"}, sm90.measured()
    with np.load(CHECKS) as z:
        c = {k: torch.from_numpy(z[k]) for k in z.files}
    x = c["bf16_in"]
    b = _bits(x) & 0xFFFFFFFF
    assert bool((b & 0xFFFF == 0).all()) and len((b >> 16).unique()) == 65536  # every bf16
    assert (x.abs() < 2.0**-126).sum() > 200 and torch.isinf(x).sum() == 2  # the hard ones
    assert _same(sm90.tanh_approx(x), c["bf16_tanh"])
    assert _same(sm90.sigmoid_tanh(x), c["bf16_sigmoid"])
    assert _same(sm90.ex2_approx_ftz(c["ex2_edge_in"]), c["ex2_edge_out"])
    tiny = (x.abs() < 2.0**-126) & (x != 0)
    assert torch.equal(c["bf16_tanh"][tiny], x[tiny])  # why the model does not flush them
