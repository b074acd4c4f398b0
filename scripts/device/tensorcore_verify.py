#!/usr/bin/env python3
"""Second device pass: adversarial vectors, cuBLAS's per-call algorithm, and the GPU sweep's bits.

    PYTHONPATH=$PWD/src python3 scripts/device/tensorcore_verify.py $OUT

Everything is saved as raw bits so the CPU models can be checked offline:

* ``adversarial.npz``: test vectors that isolate single features (zero operands beside huge
  partners, signed zeros, the truncation frontier 2^(E−25), carries, overflow inside and across
  blocks, inf/nan) through mma.sync chains, cuBLAS batched, cuBLAS per call, and kdalab's
  ``gpu-h200`` kernels (m16n8k8 and m16n8k16 slices).
* ``shapes.npz``: random products of other shapes (K < 16, K = 40, 64, 128, M ≠ N) per call
  vs ``gpu-h200`` (scope beyond the seed's square shapes).
* ``sgemm.npz``: kdalab's ``gpu-h200-sgemm`` kernel vs torch's fp32 matmul per run and batched.
* ``sweep.npz``: kernel L and Neumann inverse of the seed-table runs (seeds 0..19) through the
  batched GPU sweep (``gpu-h200-sgemm`` + ``gpu-h200``).
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
from kdalab.arith.gpu.cublas import cublas_gemm, cublas_gemm_single  # noqa: E402
from kdalab.arith.gpu.mma import gemmex_16f_gpu, mma_gemm, sgemm_gpu  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/tc_verify")
os.makedirs(OUT, exist_ok=True)
DEV = torch.device("cuda")
SUMMARY: dict = {}


def section(fn):
    def wrapped(*a, **k):
        t0 = time.time()
        print(f"== {fn.__name__}", flush=True)
        try:
            return fn(*a, **k)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            SUMMARY[fn.__name__] = "FAILED"
        finally:
            print(f"   {fn.__name__}: {time.time() - t0:.1f}s", flush=True)
    return wrapped


def bits16(t):
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def bits32(t):
    return t.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)


def r16(x):
    return x.astype(np.float16).astype(np.float64)


def fp16_vals(rng, shape, emin, emax):
    sign = rng.choice([-1.0, 1.0], size=shape)
    e = rng.integers(emin, emax + 1, size=shape)
    m = rng.integers(0, 1024, size=shape)
    return sign * (1 + m / 1024.0) * np.exp2(e)


def adversarial_sets(rng):
    """(name, A[T,16,K], B[T,K,16], C[T,16,16]) float64 fp16 values."""
    sets = []
    T = 64
    for K in (16, 32):
        s_a, s_b, s_c = (T, 16, K), (T, K, 16), (T, 16, 16)
        z = np.zeros(s_c)
        # zero operands beside huge partners: does a zero product take part in the alignment?
        a = fp16_vals(rng, s_a, -12, -8)
        b = fp16_vals(rng, s_b, -2, 0)
        a[:, :, 0:4] = 0.0
        b[:, 0:4, :] = 65504.0
        sets.append((f"zero_a_big_b_k{K}", a, b, z))
        a = fp16_vals(rng, s_a, -12, -8)
        b = fp16_vals(rng, s_b, -2, 0)
        a[:, :, 0:4] = 65504.0
        b[:, 0:4, :] = 0.0
        sets.append((f"big_a_zero_b_k{K}", a, b, z))
        a = fp16_vals(rng, s_a, -12, -8)
        b = fp16_vals(rng, s_b, -2, 0)
        a[:, :, 4:8] = -0.0
        b[:, 4:8, :] = -65504.0
        sets.append((f"negzero_a_k{K}", a, b, z))
        # the truncation frontier: one product 1, one ±2^-j (1 + f), j = 18..31
        a = np.zeros(s_a)
        b = np.zeros(s_b)
        a[:, :, 0] = 1.0
        b[:, 0, :] = 1.0
        sgn = lambda shape: rng.choice([-1.0, 1.0], size=shape)  # noqa: E731
        a[:, :, 1:3] = sgn((T, 16, 2)) * (1 + rng.integers(0, 1024, size=(T, 16, 2)) / 1024) * \
            np.exp2(rng.integers(-14, -3, size=(T, 16, 2)))
        b[:, 1:3, :] = sgn((T, 2, 16)) * (1 + rng.integers(0, 1024, size=(T, 2, 16)) / 1024) * \
            np.exp2(rng.integers(-14, -3, size=(T, 2, 16)))
        sets.append((f"frontier_k{K}", a, b, z))
        # carries: 16 products of nearly 4 * 2^6 each, plus tiny terms
        a = np.full(s_a, 1.9990234375 * 8)
        b = np.full(s_b, 1.9990234375 * 8)
        a[:, :, K - 4:] = fp16_vals(rng, (T, 16, 4), -14, -10)
        b[:, K - 4:, :] = fp16_vals(rng, (T, 4, 16), -4, 0)
        sets.append((f"carry_k{K}", a, b, z))
        # overflow: inside one block (cancelling) and across blocks
        a = np.zeros(s_a)
        b = np.zeros(s_b)
        a[:, :, 0:3] = [60000.0, 60000.0, -60000.0]
        b[:, 0:3, :] = 1.0
        a[:, :, 3:6] = fp16_vals(rng, (T, 16, 3), -4, 4)
        b[:, 3:6, :] = fp16_vals(rng, (T, 3, 16), -4, 4)
        sets.append((f"overflow_cancel_k{K}", a, b, z))
        a = fp16_vals(rng, s_a, 7, 8)
        b = np.abs(fp16_vals(rng, s_b, 7, 8)) * np.sign(a[:, 0:1, :].transpose(0, 2, 1))
        sets.append((f"overflow_k{K}", a, b, z))
        # signed zeros and underflow to zero
        a = np.zeros(s_a)
        b = np.zeros(s_b)
        x = fp16_vals(rng, (T, 16, 1), -4, 4)
        y = fp16_vals(rng, (T, 1, 16), -4, 4)
        a[:, :, 0:1] = x
        a[:, :, 1:2] = x
        b[:, 0:1, :] = y
        b[:, 1:2, :] = -y
        c = np.where(rng.random(s_c) < 0.5, -0.0, 0.0)
        sets.append((f"exact_cancel_k{K}", a, b, c))
        a = np.zeros(s_a)
        b = np.zeros(s_b)
        mags = np.array([2.0**-26, 2.0**-25, 3 * 2.0**-26, 2.0**-27, 5 * 2.0**-27, 2.0**-24])
        pick = mags[rng.integers(0, len(mags), size=(T, 16, 1))]
        a[:, :, 0:1] = r16(-pick / 2.0**-12)
        b[:, 0:1, :] = 2.0**-12
        c = np.where(rng.random(s_c) < 0.5, -0.0, 0.0)
        sets.append((f"underflow_k{K}", a, b, c))
        a = np.where(rng.random(s_a) < 0.5, -0.0, 0.0)
        b = fp16_vals(rng, s_b, -4, 4)
        c = np.where(rng.random(s_c) < 0.5, -0.0, 0.0)
        sets.append((f"all_zero_k{K}", a, b, c))
        # inf / nan operands (recorded; IEEE propagation expected)
        a = fp16_vals(rng, s_a, -4, 4)
        b = fp16_vals(rng, s_b, -4, 4)
        a[:, 0, 0] = np.inf
        a[:, 1, 0] = -np.inf
        b[:, 0, 1] = 0.0
        a[:, 2, 1] = np.nan
        sets.append((f"inf_nan_k{K}", a, b, z))
        # fp16 subnormal inputs and results, with C
        a = fp16_vals(rng, s_a, -14, -10)
        a = np.where(rng.random(s_a) < 0.3, rng.integers(1, 1024, size=s_a) * 2.0**-24, a)
        b = fp16_vals(rng, s_b, -6, -1)
        c = np.where(rng.random(s_c) < 0.5, rng.integers(-1023, 1024, size=s_c) * 2.0**-24, 0.0)
        sets.append((f"subnormal_k{K}", a, b, c))
    out = []
    for name, a, b, c in sets:
        out.append((name, r16(a), r16(b), r16(c)))
    return out


@section
def adversarial():
    rng = np.random.default_rng(2911)
    save = {}
    summ = {}
    names = []
    for name, a64, b64, c64 in adversarial_sets(rng):
        names.append(name)
        a = torch.tensor(a64).half().to(DEV)
        b = torch.tensor(b64).half().to(DEV)
        c = torch.tensor(c64).half().to(DEV)
        res = {
            "mma": mma_gemm(a, b, "f16"),
            "mma_c": mma_gemm(a, b, "f16", c),
            "cublas": cublas_gemm(a, b, "16f"),
            "single": torch.stack([cublas_gemm_single(a[i], b[i]) for i in range(a.shape[0])]),
            "gemmex_k8": gemmex_16f_gpu(a, b, "k8"),
            "gemmex_k16": gemmex_16f_gpu(a, b, "k16"),
            "mma_bf16": mma_gemm(a.to(torch.bfloat16), b.to(torch.bfloat16), "bf16-f32"),
        }
        torch.cuda.synchronize()
        eq = lambda x, y: bool(torch.equal(x.view(torch.int16), y.view(torch.int16)))  # noqa: E731
        summ[name] = {"k8==single": eq(res["gemmex_k8"], res["single"]),
                      "k16==single": eq(res["gemmex_k16"], res["single"]),
                      "cublas==mma": eq(res["cublas"], res["mma"])}
        save[f"{name}|a"], save[f"{name}|b"], save[f"{name}|c"] = bits16(a), bits16(b), bits16(c)
        for k, v in res.items():
            save[f"{name}|{k}"] = bits32(v) if v.dtype == torch.float32 else bits16(v)
    save["names"] = np.array(names)
    print(json.dumps(summ))
    SUMMARY["adversarial"] = summ
    np.savez_compressed(os.path.join(OUT, "adversarial.npz"), **save)


@section
def shapes():
    rng = np.random.default_rng(2912)
    save = {}
    summ = {}
    for (m, k, n) in ((16, 12, 16), (16, 32, 16), (17, 17, 17), (24, 40, 24), (8, 64, 8),
                      (32, 128, 32), (48, 48, 48), (64, 24, 40)):
        T = 64
        a = np.concatenate([rng.standard_normal((T, m, k)) * 0.5,
                            fp16_vals(rng, (T, m, k), -10, 1)])
        b = np.concatenate([rng.standard_normal((T, k, n)) * 0.5,
                            fp16_vals(rng, (T, k, n), -10, 1)])
        a = torch.tensor(a).half().to(DEV)
        b = torch.tensor(b).half().to(DEV)
        single = torch.stack([cublas_gemm_single(a[i], b[i]) for i in range(a.shape[0])])
        k8 = gemmex_16f_gpu(a, b, "k8")
        k16 = gemmex_16f_gpu(a, b, "k16")
        bat = cublas_gemm(a, b, "16f")
        mma = mma_gemm(a, b, "f16")
        torch.cuda.synchronize()
        fr = lambda x, y: float((x.view(torch.int16) == y.view(torch.int16)).float().mean())  # noqa
        tag = f"{m}x{k}x{n}"
        summ[tag] = {"k8==single": fr(k8, single), "k16==single": fr(k16, single),
                     "batched==mma": fr(bat, mma)}
        save[f"{tag}|a"], save[f"{tag}|b"] = bits16(a), bits16(b)
        save[f"{tag}|single"], save[f"{tag}|batched"] = bits16(single), bits16(bat)
    print(json.dumps(summ))
    SUMMARY["shapes"] = summ
    np.savez_compressed(os.path.join(OUT, "shapes.npz"), **save)


@section
def sgemm():
    rng = np.random.default_rng(2913)
    save = {}
    summ = {}
    for chunk in (8, 16, 17, 18, 19, 24, 32, 48):
        T = 32
        x = torch.tensor(rng.standard_normal((T, chunk, 128))).to(torch.bfloat16).to(DEV)
        y = torch.tensor(rng.standard_normal((T, chunk, 128)) *
                         np.exp2(rng.integers(-20, 20, (T, chunk, 1)))).to(torch.bfloat16).to(DEV)
        per_run = torch.stack([x[i].float() @ y[i].float().t() for i in range(T)])
        batched = x.float() @ y.float().transpose(-1, -2)
        mine = sgemm_gpu(x.float(), y.float().transpose(-1, -2))
        torch.cuda.synchronize()
        eq = lambda p, q: float((p.view(torch.int32) == q.view(torch.int32)).float().mean())  # noqa
        summ[chunk] = {"kdalab==per_run": eq(mine, per_run), "torch_batched==per_run":
                       eq(batched, per_run)}
        save[f"x{chunk}"], save[f"y{chunk}"] = bits16(x), bits16(y)
        save[f"per_run{chunk}"] = bits32(per_run)
    print(json.dumps(summ))
    SUMMARY["sgemm"] = summ
    np.savez_compressed(os.path.join(OUT, "sgemm.npz"), **save)


@section
def sweep_bits():
    from kdalab.studies.sweep import SEED_TABLE_CHUNKS, plan_runs
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from bench_gpu_sweep import batched_inverses

    save = {}
    for fam, chunks in SEED_TABLE_CHUNKS.items():
        for chunk in chunks:
            specs = plan_runs([fam], [chunk], range(20), [128], [-5.0])
            l, inv = batched_inverses(specs, "cuda")
            save[f"{fam}|{chunk}|l"] = bits16(l)
            save[f"{fam}|{chunk}|inv"] = bits16(inv)
    torch.cuda.synchronize()
    np.savez_compressed(os.path.join(OUT, "sweep.npz"), **save)
    SUMMARY["sweep_bits"] = len(save)


@section
def golden_on_gpu():
    """The lead's run_group on CUDA with the GPU twins, against the golden h200 records."""
    from kdalab.studies.inverse import METRIC_KEYS, run_group
    from kdalab.studies.sweep import seed_reproduction_runs
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from bench_gpu_sweep import GPU_RECIPE

    gold_path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data",
                             "seed_runs.json")
    runs = seed_reproduction_runs()
    recs = []
    by_chunk: dict = {}
    for s in runs:
        by_chunk.setdefault(s.chunk, []).append(s)
    for chunk, specs in sorted(by_chunk.items()):
        recs += run_group(specs, ["gpu-h200"], recipe=GPU_RECIPE, device="cuda")
    with open(os.path.join(OUT, "gpu_records.json"), "w") as f:
        json.dump(recs, f, default=str)
    if os.path.exists(gold_path):
        gold = {(g["case"], g["chunk"], g["seed"]): g for g in json.load(open(gold_path))["h200"]}
        worst, exact = {}, 0
        for r in recs:
            case = "floor_e-5" if r["family"] == "floor" else r["family"]
            g = gold[(case, r["chunk"], r["seed"])]
            same = True
            for k in METRIC_KEYS:
                a, b = float(g[k]), float(r[k])
                if a == b or (math.isnan(a) and math.isnan(b)):
                    continue
                same = False
                worst[k] = max(worst.get(k, 0.0), abs(a - b) / max(abs(a), 1e-300))
            exact += same
        SUMMARY["golden_on_gpu"] = {"runs_all_metrics_identical": f"{exact}/{len(recs)}",
                                    "max_rel_diff": worst}
        print(SUMMARY["golden_on_gpu"])


if __name__ == "__main__":
    t0 = time.time()
    adversarial()
    shapes()
    sgemm()
    sweep_bits()
    golden_on_gpu()
    print("SUMMARY", json.dumps(SUMMARY, default=str))
    print(f"total {time.time() - t0:.1f}s")
