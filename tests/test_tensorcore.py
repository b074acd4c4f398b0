"""The CPU models of the H200's matrix arithmetic against the H200's own outputs, bit for bit.

The vectors under tests/data/tensorcore/ were run on an NVIDIA H200 (torch 2.11+cu130, cuBLAS 13.1,
2026-11-29) by scripts/device/tensorcore_characterize.py and tensorcore_verify.py and packed by
tensorcore_pack.py (all three in git at commit 386f211): inputs and outputs as raw bits.
Comparisons are on bits (NaN payloads aside: the GPU's canonical NaN is 0x7fff / 0x7fffffff). GPU
tests at the end skip without CUDA.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from kdalab.arith import get_accumulation
from kdalab.arith.formats import BF16, FP16, FP32
from kdalab.arith.tensorcore import gemmex_algorithm, tc_block

pytestmark = pytest.mark.exact  # the H200's outputs, bit for bit

DATA = Path(__file__).parent / "data" / "tensorcore"


def _load(name: str):
    return np.load(DATA / name)


def f16(x) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.float16)


def bf16(x) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)


def f32(x) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int32)).view(torch.float32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal bits, or both NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape
    iv = torch.int16 if a.element_size() == 2 else torch.int32
    return (a.view(iv) == b.view(iv)) | (torch.isnan(a) & torch.isnan(b))


def assert_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    ok = same_bits(a, b)
    assert bool(ok.all()), f"{what}: {int((~ok).sum())} of {ok.numel()} outputs differ"


# --- one Tensor-Core block and its chains (mma.sync.m16n8k16) ----------------------------------

def test_fp16_block_with_accumulator_matches_mma_sync():
    d = _load("f16_tiles.npz")
    a, b, c = f16(d["a"]), f16(d["b"]), f16(d["c"])
    assert a.shape[0] * 256 >= 100_000  # >= 10^5 dot products
    out = tc_block(a.double(), b.double(), c.double(), FP16, FP16)
    assert_bits(out, f16(d["mma_c"]), "mma.sync f16 with C")


def test_fp16_gemm_matches_cublas_batched_mma_and_triton():
    d = _load("f16_tiles.npz")
    a, b = f16(d["a"]), f16(d["b"])
    # cuBLAS strided-batched, mma.sync and Triton tl.dot gave identical bits on the device
    assert_bits(get_accumulation("h200-mma").matmul(a, b), f16(d["cublas"]), "h200-mma")
    assert_bits(get_accumulation("h200").matmul(a, b), f16(d["cublas"]), "h200 (K = 16)")


def test_fp16_inputs_fp32_accumulation_match_mma_sync():
    d = _load("f16_tiles.npz")
    a, b, c = f16(d["a"]), f16(d["b"]), f16(d["c"])
    out = tc_block(a.double(), b.double(), c.float().double(), FP16, FP32)
    assert_bits(out, f32(d["mma_f32_c"]), "mma.sync f32.f16.f16.f32")


def test_bf16_fp32_block_and_chain_match_mma_sync():
    d = _load("bf16_tiles.npz")
    a, b, c = bf16(d["a"]), bf16(d["b"]), f32(d["c"])
    assert_bits(tc_block(a.double(), b.double(), c.double(), BF16, FP32), f32(d["mma_c"]),
                "mma.sync f32.bf16.bf16.f32 with C")
    assert_bits(get_accumulation("h200-bf16-fp32").matmul(a, b), f32(d["mma"]), "h200-bf16-fp32")


def test_bf16_model_rejects_non_bf16_values():
    with pytest.raises(ValueError, match="bf16"):
        get_accumulation("h200-bf16-fp32").matmul(torch.full((2, 2), 1 + 2.0**-10),
                                                  torch.ones(2, 2))


def test_simple_features():
    """The model's features, each on one hand-made product (values verified on the device)."""
    col = lambda v: torch.tensor(v, dtype=torch.float64).reshape(16, 1)  # noqa: E731
    # 1 + 2^-11 + 2^-26: the 2^-26 product is cut at 2^(0-25), leaving a tie -> even -> 1.0
    # (the exact sum would round up to 1 + 2^-10)
    x = torch.tensor([[1.0, 2.0**-6, 2.0**-13] + [0.0] * 13], dtype=torch.float64)
    y = col([1.0, 2.0**-5, 2.0**-13] + [0.0] * 13)
    assert tc_block(x, y, None, FP16, FP16).item() == 1.0
    # fp32 output truncates: 1 - 2^-25 -> the float32 below 1 (nearest-even would give 1.0)
    x = torch.tensor([[1.0, -(2.0**-13)] + [0.0] * 14], dtype=torch.float64)
    y = col([1.0, 2.0**-12] + [0.0] * 14)
    assert tc_block(x, y, None, FP16, FP32).item() == 1.0 - 2.0**-24
    # a negative result that rounds to zero is +0
    x = torch.tensor([[-(2.0**-14)] + [0.0] * 15], dtype=torch.float64)
    y = col([2.0**-12] + [0.0] * 15)
    r = tc_block(x, y, None, FP16, FP16)
    assert r.item() == 0.0 and not torch.signbit(r).item()


def _reference_block(a, b, c, in_fmt, out_fmt):
    """The block model of the module doc, step by step on every (i, k, j) in float64: the
    readable definition that tc_block's restricted, float32/int32 evaluation must equal."""
    from kdalab.arith.formats import pow2, round_to

    def exponent(x, emin):
        e = torch.clamp(torch.frexp(x)[1].to(torch.int32) - 1, min=emin)
        return torch.where(x == 0, torch.full_like(e, -100000), e)

    big = (exponent(a, in_fmt.emin).unsqueeze(-1) + exponent(b, in_fmt.emin).unsqueeze(-3))
    big = big.amax(dim=-2)
    if c is not None:
        big = torch.maximum(big, exponent(c, out_fmt.emin))
    big = torch.where(big < -50000, torch.zeros_like(big), big)
    scale = pow2(25 - big)
    total = torch.trunc(a.unsqueeze(-1) * b.unsqueeze(-3) * scale.unsqueeze(-2)).sum(-2)
    if c is not None:
        total = total + torch.trunc(c * scale)
    value = total / scale
    if out_fmt == FP16:
        r = round_to(value, FP16).half()
    else:
        r = value.float()
        r = torch.where(r.double().abs() > value.abs(), torch.nextafter(r, torch.zeros_like(r)),
                        r)
    return torch.where(r == 0, torch.zeros_like(r), r)  # a zero result is +0


def _structured(gen, shape, dtype, spread, zeros, tri):
    """Random values over 2^±spread, a fraction of zeros, optionally lower triangular (the
    Neumann products' operands): zero patterns shared by the batch let tc_block skip work."""
    x = torch.randn(shape, generator=gen) * torch.exp2(
        torch.randint(-spread, spread + 1, shape, generator=gen).float())
    x = torch.where(torch.rand(shape, generator=gen) < zeros, 0.0, x)
    if tri is not None:
        x = torch.tril(x, tri)
    return x.to(dtype).double()


@pytest.mark.parametrize("seed", range(6))
def test_block_equals_its_definition_on_structured_operands(seed):
    """tc_block computes only where products are non-zero, in float32/int32 for fp16 operands:
    the same bits as the element-wise definition, for fp16 and bf16 operands, fp16 and fp32
    accumulators, subnormals, zero rows and columns and triangular operands."""
    gen = torch.Generator().manual_seed(seed)
    for case in range(40):
        in_fmt = (FP16, BF16)[case % 2]
        out_fmt = FP16 if in_fmt == FP16 and case % 4 == 0 else FP32
        spread = (2, 12, 24, 60)[case % 4] if in_fmt == BF16 else (2, 8, 14, 20)[case % 4]
        m, k, n = (int(v) for v in torch.randint(1, 17, (3,), generator=gen))
        tri = (None, -1, 0)[case % 3]
        a = _structured(gen, (3, m, k), in_fmt.torch_dtype, spread, (0, .3, .7)[case % 3], tri)
        b = _structured(gen, (3, k, n), in_fmt.torch_dtype, spread, (0, .4)[case % 2], tri)
        c = None if case % 3 == 1 else _structured(gen, (3, m, n), out_fmt.torch_dtype,
                                                    spread, .2, None)
        assert_bits(tc_block(a, b, c, in_fmt, out_fmt), _reference_block(a, b, c, in_fmt, out_fmt),
                    f"seed {seed} case {case}")


def test_chains_equal_blocks_of_the_definition():
    """h200 (cuBLAS's split and chain algorithms) and h200-mma on lower-triangular fp16
    operands of the Neumann sizes, against chains of the definition's blocks."""
    gen = torch.Generator().manual_seed(11)
    for chunk in (5, 16, 24, 40, 64):
        a = _structured(gen, (4, chunk, chunk), torch.float16, 10, .1, -1)
        b = _structured(gen, (4, chunk, chunk), torch.float16, 10, .1, 0)
        acc = None
        for k0 in range(0, chunk, 16):
            acc = _reference_block(a[..., k0:k0 + 16], b[..., k0:k0 + 16, :],
                                   None if acc is None else acc.double(), FP16, FP16)
        assert_bits(get_accumulation("h200-mma").matmul(a.half(), b.half()), acc, f"mma {chunk}")
        kind, size = gemmex_algorithm(chunk, chunk, chunk)
        if kind == "split":
            ref = None
            for k0 in range(0, chunk, size):
                part = _reference_block(a[..., k0:k0 + size], b[..., k0:k0 + size, :], None,
                                        FP16, FP16)
                ref = part if ref is None else (ref.float() + part.float()).half()
            assert_bits(get_accumulation("h200").matmul(a.half(), b.half()), ref, f"h200 {chunk}")


def test_sgemm_exact_steps_are_never_claimed_wrongly():
    """sgemm_h200 adds a step in float32 when _exact_steps proves every product exact; the
    proof must never hold where a product is inexact (operands spanning fp32's subnormals)."""
    from kdalab.arith.sgemm import _exact_steps, _fma_fp32

    gen = torch.Generator().manual_seed(3)
    claimed = 0
    for spread in (4, 60, 75, 100):
        a = _structured(gen, (6, 12, 32), torch.bfloat16, spread, .2, None).float()
        b = _structured(gen, (6, 32, 12), torch.bfloat16, spread, .2, None).float()
        exact = _exact_steps(a, b)
        for k, ok in enumerate(exact):
            p64 = a[..., :, k, None].double() * b[..., None, k, :].double()
            truly = bool(((p64.float().double() == p64) | ~torch.isfinite(p64)).all())
            assert truly or not ok, (spread, k)
            claimed += ok
    assert claimed > 0  # the test exercises both outcomes
    # and the fma itself: correct rounding of acc + x·y against round_to with a residual
    from kdalab.arith.formats import round_to

    x = _structured(gen, (4096,), torch.float32, 70, 0, None)
    y = _structured(gen, (4096,), torch.float32, 70, 0, None)
    acc = _structured(gen, (4096,), torch.float32, 70, 0, None)
    y[:1024] = acc[:1024].float().double() * 2.0**-24  # acc + x·y exactly a float32 midpoint
    x[:1024] = 1.0
    p = x * y
    s = acc + p
    e = (acc - (s - (s - acc))) + (p - (s - acc))
    assert_bits(_fma_fp32(x, y, acc), round_to(s, FP32, residual=e).float(), "fma")


# --- cuBLAS cublasGemmEx (one matrix per call), the seed's GEMM ------------------------------

@pytest.mark.parametrize("chunk", [8, 16, 17, 18, 19, 24, 32, 48])
def test_h200_matches_cublas_gemmex_at_seed_shapes(chunk):
    d = _load("gemm_shapes.npz")
    a, b = f16(d[f"a{chunk}"]), f16(d[f"b{chunk}"])
    assert_bits(get_accumulation("h200").matmul(a, b), f16(d[f"single{chunk}"]),
                f"cublasGemmEx {chunk}^3")
    assert_bits(get_accumulation("h200-mma").matmul(a, b), f16(d[f"batched{chunk}"]),
                f"cublasGemmStridedBatchedEx {chunk}^3")


def test_h200_matches_cublas_gemmex_at_other_shapes():
    d = _load("v2_shapes.npz")
    tags = sorted({k.split("|")[0] for k in d.files})
    assert len(tags) >= 8
    for tag in tags:
        a, b = f16(d[f"{tag}|a"]), f16(d[f"{tag}|b"])
        assert_bits(get_accumulation("h200").matmul(a, b), f16(d[f"{tag}|single"]), tag)
        assert_bits(get_accumulation("h200-mma").matmul(a, b), f16(d[f"{tag}|batched"]), tag)


def test_gemmex_algorithm_choices():
    assert gemmex_algorithm(16, 16, 16) == ("block", 16)
    assert gemmex_algorithm(48, 48, 48) == ("split", 8)
    assert gemmex_algorithm(16, 32, 16) == ("chain", 16)
    assert gemmex_algorithm(32, 128, 32) == ("split-chain", 64)


def test_adversarial_vectors():
    d = _load("v2_adversarial.npz")
    names = list(d["names"])
    assert len(names) >= 20
    h200, mma = get_accumulation("h200"), get_accumulation("h200-mma")
    bfm = get_accumulation("h200-bf16-fp32")
    for name in names:
        a, b, c = f16(d[f"{name}|a"]), f16(d[f"{name}|b"]), f16(d[f"{name}|c"])
        assert_bits(h200.matmul(a, b), f16(d[f"{name}|single"]), f"{name} cublasGemmEx")
        assert_bits(mma.matmul(a, b), f16(d[f"{name}|mma"]), f"{name} mma chain")
        assert_bits(mma.matmul(a, b), f16(d[f"{name}|cublas"]), f"{name} cublas batched")
        acc = c.double()
        for k0 in range(0, a.shape[-1], 16):
            acc = tc_block(a[..., k0:k0 + 16].double(), b[..., k0:k0 + 16, :].double(), acc,
                           FP16, FP16).double()
        assert_bits(acc.half(), f16(d[f"{name}|mma_c"]), f"{name} mma chain with C")
        assert_bits(bfm.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16)),
                    f32(d[f"{name}|mma_bf16"]), f"{name} bf16 mma")


# --- cuBLAS fp32 GEMM (the seed's L) -------------------------------------------------------

def test_sgemm_summation_tree_matches_probes():
    """FPRev probes (M, −M, ones): slices of 32 in k order, the slice sums added left to right."""
    d = _load("sgemm_probes.npz")
    i, j = d["i"].astype(np.int64), d["j"].astype(np.int64)
    lca = np.where(i // 32 == j // 32, j + 1 - (j // 32) * 32, 32 * (j // 32 + 1))
    lca = np.where(i // 32 == j // 32, lca, np.maximum(lca, 64))
    expected = 128 - lca
    for key in ("r16", "r48"):
        assert np.array_equal(d[key].astype(np.int64), expected), key
    # and the model gives the same counts on the same probes
    probes = torch.ones(len(i), 128, dtype=torch.float64)
    probes[torch.arange(len(i)), torch.from_numpy(i)] = 2.0**34
    probes[torch.arange(len(i)), torch.from_numpy(j)] = -(2.0**34)
    got = get_accumulation("h200-sgemm").matmul(probes[:512], torch.ones(128, 1))
    assert np.array_equal(got[:, 0].numpy().astype(np.int64), expected[:512])


def test_sgemm_matches_cublas_fp32():
    d = _load("v2_sgemm.npz")
    m = get_accumulation("h200-sgemm")
    for chunk in (8, 16, 17, 18, 19, 24, 32, 48):
        x, y = bf16(d[f"x{chunk}"]), bf16(d[f"y{chunk}"])
        assert_bits(m.matmul(x.float(), y.float().transpose(-1, -2)), f32(d[f"per_run{chunk}"]),
                    f"sgemm {chunk}")


# --- the seed's experiment with the H200's arithmetic -------------------------------------

GOLDEN = json.loads((Path(__file__).parent / "data" / "seed_runs.json").read_text())["h200"]


@pytest.fixture(scope="module")
def h200_records():
    """The runs exactly as `kdalab reproduce --accumulation h200` makes them: the pipeline builds
    L with the H200's SGEMM order (`fp32_companion`) because the inverse runs on an H200 model."""
    from kdalab.studies.sweep import run_sweep, seed_reproduction_runs

    recs = run_sweep(seed_reproduction_runs(), ["h200"])
    assert {r["l_accumulation"] for r in recs} == {"h200-sgemm"}
    return recs


#: the metrics that are integers or fp16 values read off fp16 matrices: equal on every CPU
EXACT_KEYS = ("decay_zeros", "inv_decay_nonfinite", "l_finite", "inv_finite", "highest_power",
              "kernel_power_max", "stable_l_highest_power", "stable_l_power_max")


def _golden(rec):
    case = "floor_e-5" if rec["family"] == "floor" else rec["family"]
    return next(g for g in GOLDEN if (g["case"], g["chunk"], g["seed"]) ==
                (case, rec["chunk"], rec["seed"]))


def test_golden_h200_runs_reproduced(h200_records):
    """Every metric of the 48 golden H200 runs. Integer and fp16-derived metrics are equal; the
    float64 metrics differ only by the GPU's float64 summation order in the reference (stable L,
    its inverse, the RMS sums): relative differences below 1e-10 (measured: 7e-12 at most)."""
    from kdalab.studies.inverse import METRIC_KEYS

    assert len(h200_records) == len(GOLDEN) == 48
    for rec in h200_records:
        g = _golden(rec)
        for key in METRIC_KEYS:
            a, b = float(g[key]), float(rec[key])
            if math.isnan(a) or math.isinf(a) or key in EXACT_KEYS:
                assert (math.isnan(a) and math.isnan(b)) or a == b, (rec, key)
            else:
                assert abs(a - b) <= 1e-10 * abs(a), (rec, key, a, b)


def test_the_seed_documents_76_printed_values(h200_records):
    """`kdalab reproduce` (its default, the H200 emulated) prints every cell of the seed
    document's three tables as the document prints them (kdalab/data/seed_tables.json: the 76
    values, transcribed); the seed code's CPU fallback (fp16-seq) does not (the document's
    numbers were measured on an H200)."""
    from kdalab.studies.aggregate import summarize
    from kdalab.studies.sweep import run_sweep, seed_reproduction_runs
    from kdalab.views.tables import published_seed_tables, seed_tables

    published = published_seed_tables()

    def printed(records) -> dict:
        out = {}
        for t in seed_tables(summarize(records)):
            cols = list(t.frame.columns)
            out[t.name] = {"columns": cols,
                           "rows": [[t.formatters[c](row[c]) for c in cols]
                                    for row in t.frame.to_dict("records")]}
        return out

    mine = printed(h200_records)
    assert mine == published
    assert sum(len(r) - 1 for t in mine.values() for r in t["rows"]) == 76
    # the printed digits do not hang on the float64 metrics' last bits, which another CPU
    # rounds otherwise (within 1e-10 relative: test_golden_h200_runs_reproduced)
    from kdalab.studies.inverse import METRIC_KEYS

    for step in (1e-10, -1e-10):
        moved = [{k: v * (1 + step) if k in METRIC_KEYS and k not in EXACT_KEYS
                  and isinstance(v, float) and math.isfinite(v) else v for k, v in r.items()}
                 for r in h200_records]
        assert printed(moved) == published, step
    seq = printed(run_sweep(seed_reproduction_runs(), ["fp16-seq"]))
    same = sum(a == b for name in published
               for pr, sr in zip(published[name]["rows"], seq[name]["rows"])
               for a, b in zip(pr[1:], sr[1:]))
    assert same == 65 and seq["high_power_stress"]["rows"][1][3] == "6.06e-3"  # not 3.27e-3


def test_golden_h200_kernel_inverse_bits():
    """The kernel's fp16 L and Neumann inverse, CPU emulation vs the H200 (seed code on the GPU)."""
    from kdalab.inputs.draw import make_inputs
    from kdalab.kda.intra import kernel_l
    from kdalab.kda.inverse import neumann_inverse
    from kdalab.kda.recipe import SEED
    from kdalab.studies.sweep import seed_reproduction_runs

    d = _load("seed_runs_h200.npz")
    recipe = SEED.with_(name="seed-h200", l_accumulation="h200-sgemm")
    for s in seed_reproduction_runs():
        case = "floor_e-5" if s.family == "floor" else s.family
        tag = f"{case}|{s.chunk}|{s.seed}"
        inp = make_inputs(s.family, s.chunk, s.dim, s.seed, -5.0)
        kl = kernel_l(inp.keys, inp.log_decay, inp.beta, recipe)
        l32_dev = f32(d[f"l32|{tag}"])
        l_dev = (torch.tril(l32_dev.half(), -1) * inp.beta.half()[:, None]).half()
        assert_bits(kl.l, l_dev, f"L {tag}")
        inv = neumann_inverse(kl.l, "h200", recipe.inverse_format).inverse
        assert_bits(inv, f16(d[f"inv|{tag}"]), f"INV {tag}")


def _has_subnormal_operands(keys, log_decay):
    """Runs whose scaled bf16 L operands k·exp(±G) include fp32 subnormals."""
    from kdalab.kda.intra import LOG2E

    tiny = torch.finfo(torch.float32).tiny
    c2 = (log_decay.cumsum(-1) * LOG2E).float().double()
    out = torch.zeros(keys.shape[0], dtype=torch.bool)
    for sign in (1.0, -1.0):
        s = torch.exp2(sign * c2).float()
        s = torch.where(s < tiny, 0.0, s).bfloat16()
        x = (keys * s[:, :, None]).float()
        out |= ((x.abs() < tiny) & (x != 0)).flatten(1).any(-1)
    return out


def test_gpu_sweep_bits_equal_cpu_emulation():
    """kdalab's batched GPU sweep (benchmarks/bench_gpu_sweep.py on the H200) vs the CPU models.

    Recorded 2026-11-29 (session 2, docs/BENCHMARKS.md) with the fp32 L kernel in inline PTX
    ``fma.rn.f32`` (no flush to zero): 8 seeds of each of the seed tables' 16 configurations,
    bit-identical here on every run, the runs whose L operands include fp32 subnormals too
    (an earlier recording, made with a kernel that CuPy compiled with ``-ftz=true``, differed on
    exactly those). The CPU side is the library's path, as the benchmark's ``batched_inverses``
    runs it: batched draws, ``kernel_l`` with L by ``h200-sgemm``, Neumann by ``h200``.
    """
    from kdalab.inputs.draw import make_inputs_batch
    from kdalab.kda.intra import kernel_l
    from kdalab.kda.inverse import neumann_inverse
    from kdalab.kda.recipe import SEED
    from kdalab.studies.sweep import plan_runs

    recipe = SEED.with_(name="seed-h200", l_accumulation="h200-sgemm")
    d = _load("v4_gpu_sweep_bits.npz")
    tags = sorted({k.rsplit("|", 1)[0] for k in d.files if k.endswith("|l")})
    compared = subnormal = 0
    for tag in tags:
        fam, chunk = tag.split("|")
        seeds = [int(x) for x in d[f"{tag}|seeds"]]
        inp = make_inputs_batch(plan_runs([fam], [int(chunk)], seeds, [128], [-5.0]))
        kl = kernel_l(inp.keys, inp.log_decay, inp.beta, recipe)
        inv = neumann_inverse(kl.l, "h200", recipe.inverse_format).inverse
        assert_bits(kl.l, f16(d[f"{tag}|l"]), f"L {tag}")
        assert_bits(inv, f16(d[f"{tag}|inv"]), f"INV {tag}")
        subnormal += int(_has_subnormal_operands(inp.keys, inp.log_decay).sum())
        compared += len(seeds)
    assert compared == 128 and subnormal >= 10, (compared, subnormal)


# --- the GPU models (CUDA only) -------------------------------------------------------------

def test_gpu_models_say_clearly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from kdalab.arith.gpu import GpuUnavailable

    with pytest.raises(GpuUnavailable, match="CUDA"):
        get_accumulation("gpu-h200").matmul(torch.ones(2, 2).half(), torch.ones(2, 2).half())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cpu_name", ["h200", "h200-mma", "h200-bf16-fp32", "h200-sgemm"])
def test_gpu_twin_equals_cpu_model(cpu_name):
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if "bf16" in cpu_name or "sgemm" in cpu_name else torch.float16
    for m, k, n in ((16, 16, 16), (17, 17, 17), (48, 48, 48), (16, 32, 16), (32, 128, 32)):
        a = torch.randn(8, m, k, generator=gen).to(dtype)
        b = torch.randn(8, k, n, generator=gen).to(dtype)
        if "sgemm" in cpu_name:
            a, b = a.float(), b.float()
            # operands far below 2^-126 too: the GPU kernel must not flush subnormals
            a = torch.cat([a, a * 2.0**-130])
            b = torch.cat([b, b])
        cpu = get_accumulation(cpu_name).matmul(a, b)
        twin = get_accumulation(get_accumulation(cpu_name).gpu_twin)
        dev = twin.matmul(a.cuda(), b.cuda()).cpu()
        assert_bits(dev, cpu, f"{cpu_name} {m}x{k}x{n}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pipeline_equals_cpu_emulation():
    """The seed experiment's fp16 arithmetic on CUDA (the GPU's own Tensor Cores: gpu-h200,
    gpu-h200-sgemm) against the CPU emulation (h200, h200-sgemm) on the 48 runs of the seed's
    tables: the kernel's L, its Neumann inverse and the stable L's inverse bit for bit; in the
    records every integer and fp16-derived metric equal, the float64 error metrics within 1e-10
    relative (their fp64 references sum in each device's own order; measured on the H200 at
    most 1.6e-11)."""
    from kdalab.arith import FP16, torch_cast
    from kdalab.inputs.draw import make_inputs_batch
    from kdalab.kda.intra import kernel_l, stable_l
    from kdalab.kda.inverse import neumann_inverse
    from kdalab.kda.recipe import SEED
    from kdalab.studies.inverse import METRIC_KEYS
    from kdalab.studies.sweep import run_sweep, seed_reproduction_runs

    runs = seed_reproduction_runs()
    for chunk in sorted({r.chunk for r in runs}):
        inp = make_inputs_batch([r for r in runs if r.chunk == chunk])
        keys, g, beta = inp.keys, inp.log_decay, inp.beta
        l_cpu = kernel_l(keys, g, beta, SEED.with_(l_accumulation="h200-sgemm")).l
        l_gpu = kernel_l(keys.cuda(), g.cuda(), beta.cuda(),
                         SEED.with_(l_accumulation="gpu-h200-sgemm")).l.cpu()
        assert_bits(l_gpu, l_cpu, f"L, C = {chunk}")
        stable16 = torch_cast(stable_l(keys, g, beta), FP16).half()
        for name, l in (("kernel", l_cpu), ("stable", stable16)):
            cpu = neumann_inverse(l, "h200", FP16).inverse
            gpu = neumann_inverse(l.cuda(), "gpu-h200", FP16).inverse.cpu()
            assert_bits(gpu, cpu, f"{name} L's inverse, C = {chunk}")
    exact = ("decay_zeros", "inv_decay_nonfinite", "l_finite", "inv_finite", "highest_power",
             "kernel_power_max", "stable_l_highest_power", "stable_l_power_max")
    cpu = run_sweep(runs, ["h200"], device="cpu")
    gpu = run_sweep(runs, ["h200"], device="cuda")
    assert len(cpu) == len(gpu) == 48
    for a, b in zip(cpu, gpu):
        assert {k: a[k] for k in ("family", "chunk", "seed")} == \
            {k: b[k] for k in ("family", "chunk", "seed")}
        assert b["l_accumulation"] == "gpu-h200-sgemm"
        for key in METRIC_KEYS:
            x, y = float(a[key]), float(b[key])
            if key in exact or not (math.isfinite(x) and math.isfinite(y)):
                assert x == y or (math.isnan(x) and math.isnan(y)), (a, key, y)
            else:
                assert abs(x - y) <= 1e-10 * abs(x), (a, key, y)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rounding_on_cuda_equals_the_cpu():
    """round_to to fp16, bf16 and fp32 on CUDA equals the CPU bit for bit (they scale by powers of
    two built from their bit pattern: torch.ldexp on CUDA goes through pow and was found inexact
    for 157,555 of 10^6 scalings, scripts/device/tensorcore_diag.py
    at commit 386f211)."""
    from kdalab.arith import BF16, FP16, FP32, round_to

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1 << 20, generator=gen, dtype=torch.float64) * torch.exp2(
        torch.randint(-30, 30, (1 << 20,), generator=gen).double())
    for fmt in (FP16, BF16, FP32):
        assert torch.equal(round_to(x.cuda(), fmt).cpu(), round_to(x, fmt)), fmt.name
