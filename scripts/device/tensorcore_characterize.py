#!/usr/bin/env python3
"""Characterize the H200's matrix arithmetic: run on the device, analyse on the CPU.

    PYTHONPATH=$PWD/src python3 scripts/device/tensorcore_characterize.py $OUT

Runs the same fp16/bf16 test vectors through every engine that the seed and FlashKDA use and saves
inputs and outputs as raw bits (``.npz``), so the model in :mod:`kdalab.arith.tensorcore` can be
fitted and checked offline, bit for bit (Khattak & Mikaitis, arXiv 2512.07004, section 3.3: test
vectors, then semi-exhaustive random comparison, repeated until bit-accurate).

Engines: ``mma.sync.m16n8k16`` with f16 accumulation (FlashKDA's Neumann inverse), with f32
accumulation for bf16 and f16 operands (the kernel's L), cuBLAS ``CUBLAS_COMPUTE_16F`` batched
and one call per matrix (the seed's), Triton ``tl.dot(out_dtype=float16)``, and cuBLAS fp32 for
the seed's L (whose summation order is probed with FPRev-style vectors: M, -M and ones).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from kdalab.arith.gpu.cublas import cublas_gemm, cublas_gemm_single, cublas_version  # noqa: E402
from kdalab.arith.gpu.mma import mma_gemm  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/tc_out")
os.makedirs(OUT, exist_ok=True)
DEV = torch.device("cuda")
T16 = int(os.environ.get("TC_T16", 500))  # tiles per fp16 class
TBF = int(os.environ.get("TC_TBF", 300))  # tiles per bf16 class
SUMMARY: dict = {}


def section(fn):
    def wrapped(*a, **k):
        t0 = time.time()
        print(f"== {fn.__name__}", flush=True)
        try:
            return fn(*a, **k)
        except Exception:
            traceback.print_exc()
            SUMMARY[fn.__name__] = "FAILED"
        finally:
            print(f"   {fn.__name__}: {time.time() - t0:.1f}s", flush=True)
    return wrapped


# --- value generators (float64 arrays of values exactly representable in the target format) ---

def fp16_vals(rng, shape, emin, emax, sub_frac=0.0, mant_bits=10):
    sign = rng.choice([-1.0, 1.0], size=shape)
    e = rng.integers(emin, emax + 1, size=shape)
    m = rng.integers(0, 1 << mant_bits, size=shape) * 2.0 ** (10 - mant_bits)
    v = sign * (1 + m / 1024.0) * np.exp2(e)
    if sub_frac:
        sub = rng.random(shape) < sub_frac
        v = np.where(sub, sign * rng.integers(1, 1024, size=shape) * 2.0 ** -24, v)
    return v


def bf16_vals(rng, shape, emin, emax, mant_bits=7):
    sign = rng.choice([-1.0, 1.0], size=shape)
    e = rng.integers(emin, emax + 1, size=shape)
    m = rng.integers(0, 1 << mant_bits, size=shape) * 2.0 ** (7 - mant_bits)
    return sign * (1 + m / 128.0) * np.exp2(e)


def f32_vals(rng, shape, emin, emax):
    sign = rng.choice([-1.0, 1.0], size=shape)
    e = rng.integers(emin, emax + 1, size=shape)
    m = rng.integers(0, 1 << 23, size=shape)
    return sign * (1 + m / 2.0**23) * np.exp2(e)


def fp16_classes(rng, T):
    """(name, A[T,16,16], B[T,16,16], C[T,16,16]) float64 values, all fp16-representable."""
    s = (T, 16, 16)
    z = np.zeros(s)
    out = []
    out.append(("normal", rng.standard_normal(s), rng.standard_normal(s), z))
    out.append(("wide", fp16_vals(rng, s, -12, 3), fp16_vals(rng, s, -12, 3), z))
    out.append(("wideC", fp16_vals(rng, s, -12, 3), fp16_vals(rng, s, -12, 3),
                fp16_vals(rng, s, -14, 9)))
    a = fp16_vals(rng, s, -10, 0)
    b = fp16_vals(rng, s, -10, 0)
    kbig = rng.integers(0, 16, size=(T, 16))
    a[np.arange(T)[:, None], np.arange(16)[None, :], kbig] = fp16_vals(rng, (T, 16), 4, 6)
    out.append(("onebig", a, b, z))
    # pairwise cancellation of large products, plus small ones
    a = fp16_vals(rng, s, -2, 2)
    b = fp16_vals(rng, s, -2, 2)
    delta = fp16_vals(rng, (T, 16, 8), -10, -4)
    a[:, :, 1:16:2] = a[:, :, 0:16:2] * (1 + delta)
    b[:, 1:16:2, :] = -b[:, 0:16:2, :]
    small = rng.random(s) < 0.3
    a = np.where(small, fp16_vals(rng, s, -12, -6), a)
    out.append(("cancel", a, b, z))
    # few significant bits: exact sums land on fp16 ties and near-ties
    out.append(("ties", fp16_vals(rng, s, -3, 5, mant_bits=2), fp16_vals(rng, s, -3, 5, mant_bits=2),
                fp16_vals(rng, s, 0, 8, mant_bits=3) * (rng.random(s) < 0.5)))
    out.append(("bigC", fp16_vals(rng, s, -10, 0), fp16_vals(rng, s, -10, 0),
                fp16_vals(rng, s, 4, 12)))
    out.append(("subnormal", fp16_vals(rng, s, -14, -6, sub_frac=0.2),
                fp16_vals(rng, s, -8, -2), fp16_vals(rng, s, -15, -12, sub_frac=0.5) *
                (rng.random(s) < 0.5)))
    r16 = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    return [(name, r16(a), r16(b), r16(c)) for name, a, b, c in out]


def bf16_classes(rng, T):
    s = (T, 16, 16)
    z = np.zeros(s)
    bf = lambda x: torch.tensor(x).to(torch.bfloat16).double().numpy()  # noqa: E731
    out = []
    out.append(("normal", bf(rng.standard_normal(s)), bf(rng.standard_normal(s)), z))
    out.append(("wide", bf16_vals(rng, s, -30, 10), bf16_vals(rng, s, -30, 10), z))
    out.append(("wideC", bf16_vals(rng, s, -20, 5), bf16_vals(rng, s, -20, 5),
                f32_vals(rng, s, -40, 12)))
    a = bf16_vals(rng, s, -20, 0)
    b = bf16_vals(rng, s, -20, 0)
    kbig = rng.integers(0, 16, size=(T, 16))
    a[np.arange(T)[:, None], np.arange(16)[None, :], kbig] = bf16_vals(rng, (T, 16), 8, 12)
    out.append(("onebig", a, b, z))
    a = bf16_vals(rng, s, -2, 2)
    b = bf16_vals(rng, s, -2, 2)
    delta = bf16_vals(rng, (T, 16, 8), -7, -3)
    a[:, :, 1:16:2] = bf(a[:, :, 0:16:2] * (1 + delta))
    b[:, 1:16:2, :] = -b[:, 0:16:2, :]
    small = rng.random(s) < 0.3
    a = np.where(small, bf16_vals(rng, s, -30, -10), a)
    out.append(("cancel", a, b, z))
    out.append(("ties", bf16_vals(rng, s, -12, 12, mant_bits=3),
                bf16_vals(rng, s, -12, 12, mant_bits=3), z))
    out.append(("bigC", bf16_vals(rng, s, -20, 0), bf16_vals(rng, s, -20, 0),
                f32_vals(rng, s, 10, 24)))
    out.append(("tiny", bf16_vals(rng, s, -70, -60), bf16_vals(rng, s, -70, -60),
                f32_vals(rng, s, -135, -120) * (rng.random(s) < 0.5)))
    return [(name, bf(a), bf(b), c) for name, a, b, c in out]


def bits16(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def bits32(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)


def exact_once_f16(a64, b64, c64):
    """Nearest fp16 to the exact a@b+c (via float64 on the CPU; a summary statistic only)."""
    return torch.tensor(np.einsum("tik,tkj->tij", a64, b64) + c64).float().half()


# ------------------------------------------------------------------------------------------

@section
def env():
    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0),
            "capability": torch.cuda.get_device_capability(0)}
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        info["triton"] = repr(e)
    try:
        import cupy
        info["cupy"] = cupy.__version__
    except Exception as e:  # noqa: BLE001
        info["cupy"] = repr(e)
    info["cublas"] = cublas_version()
    print(info)
    SUMMARY["env"] = info


_TRITON = None


def triton_dot16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[T,16,K] @ [T,K,16] with tl.dot(out_dtype=float16), accumulator chained over K by 16."""
    global _TRITON
    import triton
    import triton.language as tl

    if _TRITON is None:
        @triton.jit
        def kern(A, B, D, K: tl.constexpr):
            pid = tl.program_id(0)
            om = tl.arange(0, 16)
            ok = tl.arange(0, 16)
            acc = tl.zeros((16, 16), dtype=tl.float16)
            for k0 in tl.static_range(0, K, 16):
                x = tl.load(A + pid * 16 * K + om[:, None] * K + (k0 + ok)[None, :])
                y = tl.load(B + pid * K * 16 + (k0 + ok)[:, None] * 16 + om[None, :])
                acc = tl.dot(x, y, acc, out_dtype=tl.float16)
            tl.store(D + pid * 256 + om[:, None] * 16 + om[None, :], acc)
        _TRITON = kern
    T, _, K = a.shape
    out = torch.empty(T, 16, 16, dtype=torch.float16, device=a.device)
    _TRITON[(T,)](a.contiguous(), b.contiguous(), out, K=K, num_warps=1)
    return out


@section
def fp16_tiles():
    rng = np.random.default_rng(1601)
    classes = fp16_classes(rng, T16)
    names = [c[0] for c in classes]
    a64 = np.concatenate([c[1] for c in classes])
    b64 = np.concatenate([c[2] for c in classes])
    c64 = np.concatenate([c[3] for c in classes])
    a = torch.tensor(a64).half().to(DEV)
    b = torch.tensor(b64).half().to(DEV)
    c = torch.tensor(c64).half().to(DEV)
    res = {}
    res["mma_c"] = mma_gemm(a, b, "f16", c)
    res["mma"] = mma_gemm(a, b, "f16")
    res["mma_f32_c"] = mma_gemm(a, b, "f16-f32", c.float())
    res["cublas"] = cublas_gemm(a, b, "16f")
    try:
        res["triton"] = triton_dot16(a, b)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    single = []
    nsingle = min(400, a.shape[0])
    idx = np.linspace(0, a.shape[0] - 1, nsingle).astype(int)
    for i in idx:
        single.append(cublas_gemm_single(a[i], b[i]))
    res["cublas_single"] = torch.stack(single)
    torch.cuda.synchronize()
    once = exact_once_f16(a64, b64, np.zeros_like(c64))
    once_c = exact_once_f16(a64, b64, c64)
    summ = {}
    cls = np.repeat(np.arange(len(names)), T16)
    for k in ("mma", "cublas", "triton"):
        if k not in res:
            continue
        eq = (res[k].cpu().view(torch.int16) == once.view(torch.int16)).numpy()
        summ[f"{k}==exact_once"] = {n: float(eq[cls == i].mean()) for i, n in enumerate(names)}
    eq = (res["mma_c"].cpu().view(torch.int16) == once_c.view(torch.int16)).numpy()
    summ["mma_c==exact_once"] = {n: float(eq[cls == i].mean()) for i, n in enumerate(names)}
    for k in ("cublas", "triton"):
        if k in res:
            summ[f"{k}==mma"] = bool(torch.equal(res[k].view(torch.int16),
                                                 res["mma"].view(torch.int16)))
            summ[f"{k}==mma frac"] = float((res[k].view(torch.int16) ==
                                            res["mma"].view(torch.int16)).float().mean())
    summ["cublas_single==cublas"] = bool(torch.equal(res["cublas_single"].view(torch.int16),
                                                     res["cublas"][idx].view(torch.int16)))
    print(json.dumps(summ, indent=1))
    SUMMARY["fp16_tiles"] = summ
    np.savez_compressed(os.path.join(OUT, "f16_in.npz"), names=np.array(names), a=bits16(a),
                        b=bits16(b), c=bits16(c), single_idx=idx)
    np.savez_compressed(os.path.join(OUT, "f16_out.npz"),
                        **{k: (bits32(v) if v.dtype == torch.float32 else bits16(v))
                           for k, v in res.items()})


@section
def bf16_tiles():
    rng = np.random.default_rng(1602)
    classes = bf16_classes(rng, TBF)
    names = [c[0] for c in classes]
    a = torch.tensor(np.concatenate([c[1] for c in classes])).to(torch.bfloat16).to(DEV)
    b = torch.tensor(np.concatenate([c[2] for c in classes])).to(torch.bfloat16).to(DEV)
    c = torch.tensor(np.concatenate([c[3] for c in classes])).float().to(DEV)
    d_c = mma_gemm(a, b, "bf16-f32", c)
    d0 = mma_gemm(a, b, "bf16-f32")
    # the same products in K=32 and K=48 chains (the accumulator between instructions)
    a48 = torch.cat([a, a.roll(1, 0), a.roll(2, 0)], dim=-1)
    b48 = torch.cat([b, b.roll(1, 0), b.roll(2, 0)], dim=-2)
    d48 = mma_gemm(a48, b48, "bf16-f32")
    torch.cuda.synchronize()
    ref = torch.matmul(a.double(), b.double()) + c.double()
    summ = {"mma_c==fp32(exact) frac": float((d_c == ref.float()).float().mean()),
            "mma_c rz-vs-rn hint": float((d_c.double().abs() <= ref.abs()).float().mean())}
    print(summ)
    SUMMARY["bf16_tiles"] = summ
    np.savez_compressed(os.path.join(OUT, "bf16.npz"), names=np.array(names), a=bits16(a),
                        b=bits16(b), c=bits32(c), mma_c=bits32(d_c), mma=bits32(d0),
                        mma_k48=bits32(d48))


@section
def fp16_shapes():
    """The seed's shapes: C x C @ C x C, cuBLAS batched vs one call per matrix vs chained mma."""
    rng = np.random.default_rng(1603)
    out = {}
    summ = {}
    for C in (8, 16, 17, 18, 19, 24, 32, 48):
        n = 100
        a = np.concatenate([rng.standard_normal((n, C, C)) * 0.3,
                            fp16_vals(rng, (n, C, C), -10, 1)])
        b = np.concatenate([rng.standard_normal((n, C, C)) * 0.3,
                            fp16_vals(rng, (n, C, C), -10, 1)])
        a = torch.tensor(a).half().to(DEV)
        b = torch.tensor(b).half().to(DEV)
        bat = cublas_gemm(a, b, "16f")
        sing = torch.stack([cublas_gemm_single(a[i], b[i]) for i in range(a.shape[0])])
        mma = mma_gemm(a, b, "f16")
        torch.cuda.synchronize()
        summ[C] = {"batched==single": float((bat.view(torch.int16) ==
                                             sing.view(torch.int16)).float().mean()),
                   "mma==single": float((mma.view(torch.int16) ==
                                         sing.view(torch.int16)).float().mean())}
        out[f"a{C}"], out[f"b{C}"] = bits16(a), bits16(b)
        out[f"batched{C}"], out[f"single{C}"], out[f"mma{C}"] = bits16(bat), bits16(sing), bits16(mma)
    print(json.dumps(summ))
    SUMMARY["fp16_shapes"] = summ
    np.savez_compressed(os.path.join(OUT, "f16_shapes.npz"), **out)


# --- the seed's own run_one on the GPU, with its intermediates kept --------------------------

LOG2E = math.log2(math.e)


def seed_make_inputs(case, chunk, dim, seed, device):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    if case == "weak_decay_correlated":
        key = torch.randn(1, dim, dtype=torch.float64, generator=generator)
        key = key / key.norm(dim=-1, keepdim=True)
        keys = key.expand(chunk, -1)
        log_decay = torch.full((chunk,), -0.01, dtype=torch.float64)
        beta = torch.full((chunk,), 0.5, dtype=torch.float64)
    else:
        keys = torch.randn(chunk, dim, dtype=torch.float64, generator=generator)
        keys = keys / keys.norm(dim=-1, keepdim=True)
        if case == "floor_e-5":
            log_decay = torch.full((chunk,), -5.0, dtype=torch.float64)
        else:
            random_gate = torch.randn(chunk, dtype=torch.float64, generator=generator)
            log_decay = -5.0 * torch.sigmoid(random_gate)
        beta = torch.sigmoid(torch.randn(chunk, dtype=torch.float64, generator=generator))
    return keys.to(device=device, dtype=torch.bfloat16), log_decay.to(device), beta.to(device)


def exp2_ftz_f32(x):
    y = torch.exp2(x.float())
    return torch.where(y < torch.finfo(torch.float32).tiny, 0.0, y)


def seed_kernel_l_parts(keys, log_decay, beta):
    cumsum_log2 = log_decay.cumsum(0) * LOG2E
    decay = exp2_ftz_f32(cumsum_log2).bfloat16()
    inv_decay = exp2_ftz_f32(-cumsum_log2).bfloat16()
    k_decayed = keys * decay[:, None]
    k_inverse = keys * inv_decay[:, None]
    l32 = k_decayed.float() @ k_inverse.float().t()
    return k_decayed, k_inverse, l32


CONFIGS = ([("floor_e-5", c) for c in (8, 16, 17, 18, 19, 32)]
           + [("weak_decay_correlated", c) for c in (8, 16, 17, 24, 32, 48)]
           + [("model_like", c) for c in (8, 16, 32, 48)])


@section
def seed_runs():
    out = {}
    for case, chunk in CONFIGS:
        for seed in (0, 1, 2):
            keys, log_decay, beta = seed_make_inputs(case, chunk, 128, seed, DEV)
            kd, ki, l32 = seed_kernel_l_parts(keys, log_decay, beta)
            tag = f"{case}|{chunk}|{seed}"
            out[f"kd|{tag}"] = bits16(kd)
            out[f"ki|{tag}"] = bits16(ki)
            out[f"l32|{tag}"] = bits32(l32)
            # the rest of the seed's kernel path, its fp16 GEMMs one cublasGemmEx each
            l16 = torch.tril(l32.half(), diagonal=-1)
            l16 = (l16 * beta.half()[:, None]).half()
            inv = (torch.eye(chunk, dtype=torch.float16, device=DEV) - l16).half()
            power, exponent = l16, 1
            while exponent * 2 < chunk:
                power = cublas_gemm_single(power, power)
                exponent *= 2
                inv = (inv + cublas_gemm_single(inv, power)).half()
            out[f"inv|{tag}"] = bits16(inv)
    rng = np.random.default_rng(1604)
    for chunk in (8, 16, 17, 18, 19, 24, 32, 48):
        x = torch.tensor(rng.standard_normal((40, chunk, 128))).to(torch.bfloat16).to(DEV)
        y = torch.tensor(rng.standard_normal((40, chunk, 128)) *
                         np.exp2(rng.integers(-8, 8, (40, chunk, 1)))).to(torch.bfloat16).to(DEV)
        res = torch.stack([x[i].float() @ y[i].float().t() for i in range(40)])
        out[f"rx|{chunk}"], out[f"ry|{chunk}"], out[f"rl32|{chunk}"] = bits16(x), bits16(y), bits32(res)
    torch.cuda.synchronize()
    np.savez_compressed(os.path.join(OUT, "seed_l32.npz"), **out)
    SUMMARY["seed_runs"] = len(out)


@section
def sgemm_order_probes():
    """FPRev-style probes of cuBLAS fp32's summation order for the seed's L GEMM shapes.

    Row vector v: v_i = 2^34, v_j = -2^34, ones elsewhere, times a column of ones: the result
    counts the ones that were not absorbed, which identifies the summation tree.
    """
    K = 128
    ii, jj = np.triu_indices(K, 1)
    P = len(ii)
    probes = np.ones((P, K), dtype=np.float32)
    probes[np.arange(P), ii] = 2.0**34
    probes[np.arange(P), jj] = -(2.0**34)
    probes_t = torch.tensor(probes, device=DEV)
    out = {"i": ii.astype(np.int16), "j": jj.astype(np.int16)}
    for chunk in (8, 16, 17, 18, 19, 24, 32, 48):
        ones = torch.ones(chunk, K, device=DEV)
        pad = (-P) % chunk
        pr = torch.cat([probes_t, torch.ones(pad, K, device=DEV)])
        res = []
        for r0 in range(0, pr.shape[0], chunk):
            res.append((pr[r0:r0 + chunk] @ ones.t()))
        res = torch.cat(res)[:P]
        torch.cuda.synchronize()
        col_same = bool((res == res[:, :1]).all())
        out[f"r{chunk}"] = (res[:, 0] if col_same else res).cpu().numpy().astype(np.float32)
        print(chunk, "columns identical:", col_same, "distinct counts:",
              int(torch.unique(res).numel()))
    np.savez_compressed(os.path.join(OUT, "sgemm_probes.npz"), **out)


if __name__ == "__main__":
    t0 = time.time()
    env()
    fp16_tiles()
    bf16_tiles()
    fp16_shapes()
    seed_runs()
    sgemm_order_probes()
    print("SUMMARY", json.dumps(SUMMARY, default=str))
    print(f"total {time.time() - t0:.1f}s")
