#!/usr/bin/env python3
"""kdalab's batched GPU sweep vs the seed's per-run loop, same runs, same process (run on a GPU).

    PYTHONPATH=$PWD/src python3 benchmarks/bench_gpu_sweep.py \
        [--seeds 256] [--loop-runs 96] [--out DIR]
    python benchmarks/bench_gpu_sweep.py --cpu [--seeds 16]     # CPU models' sweep speed, no GPU

Runs: the seed document's table configurations (3 families, their chunk sizes), seeds 0..S−1,
dim 128. *Batched*: ``run_sweep`` on CUDA, every stage one launch per chunk group, the L GEMM on
``gpu-h200-sgemm`` and the Neumann products on ``gpu-h200`` (equal bit for bit to the CPU models
``h200-sgemm`` / ``h200``). *Per-run loop*: the seed's own ``run_one`` (its code, copied below),
one ``cublasGemmEx`` call per product with a device synchronization before and after, as the seed
does. Also checks that both give the same kernel inverse, bit for bit, on the looped runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from kdalab.arith import gpu  # noqa: E402
from kdalab.experiments.families import make_inputs  # noqa: E402
from kdalab.experiments.sweep import SEED_TABLE_CHUNKS, plan_runs, run_sweep  # noqa: E402
from kdalab.kda.intra import kernel_l  # noqa: E402
from kdalab.kda.inverse import neumann_inverse  # noqa: E402
from kdalab.kda.recipe import SEED  # noqa: E402

GPU_RECIPE = SEED.with_(name="seed-h200-gpu", l_accumulation="gpu-h200-sgemm")

# --- the seed's run_one, verbatim in its arithmetic (CUDA path) -------------------------------
LOG2E = math.log2(math.e)


def _seed_mm(a, b):
    torch.cuda.synchronize(a.device)
    out = gpu.cublas_gemm_single(a, b)
    torch.cuda.synchronize(a.device)
    return out


def _seed_neumann(l):
    n = l.shape[0]
    inv = (torch.eye(n, dtype=torch.float16, device=l.device) - l).half()
    power, exponent, max_power = l, 1, float(l.abs().max())
    while exponent * 2 < n:
        power = _seed_mm(power, power)
        exponent *= 2
        max_power = max(max_power, float(power.abs().max()))
        inv = (inv + _seed_mm(inv, power)).half()
    return inv, exponent, max_power


def _exp2_ftz_f32(x):
    y = torch.exp2(x.float())
    return torch.where(y < torch.finfo(torch.float32).tiny, 0.0, y)


def _rel_rmse(actual, expected):
    if not torch.isfinite(actual).all():
        return math.inf
    error = (actual.double() - expected.double()).square().mean().sqrt()
    scale = expected.double().square().mean().sqrt()
    return float(error / (scale + 1e-30))


def seed_run_one(keys, log_decay, beta):
    chunk = keys.shape[0]
    device = keys.device
    keys64 = keys.double()
    cumsum = log_decay.cumsum(0)
    dots = keys64 @ keys64.t()
    decay_ratio = torch.exp((cumsum[:, None] - cumsum[None, :]).clamp(max=0.0))
    l_ref = torch.tril(dots * decay_ratio * beta[:, None], diagonal=-1)
    identity = torch.eye(chunk, dtype=torch.float64, device=device)
    inv_ref = torch.linalg.inv(identity + l_ref)
    cumsum_log2 = log_decay.cumsum(0) * LOG2E
    decay = _exp2_ftz_f32(cumsum_log2).bfloat16()
    inv_decay = _exp2_ftz_f32(-cumsum_log2).bfloat16()
    l_kernel = (keys * decay[:, None]).float() @ (keys * inv_decay[:, None]).float().t()
    l_kernel = torch.tril(l_kernel.half(), diagonal=-1)
    l_kernel = (l_kernel * beta.half()[:, None]).half()
    stable_inv, _, stable_max = _seed_neumann(l_ref.half())
    kernel_inv, kernel_power, kernel_max = _seed_neumann(l_kernel)
    residual = _rel_rmse((identity + l_ref) @ kernel_inv.double(), identity)
    if torch.isfinite(l_kernel).all():
        neumann_only = _rel_rmse(kernel_inv, torch.linalg.inv(identity + l_kernel.double()))
    else:
        neumann_only = math.inf
    return kernel_inv, {
        "l_rel_rmse": _rel_rmse(l_kernel, l_ref),
        "inv_total_rel_rmse": _rel_rmse(kernel_inv, inv_ref),
        "inv_neumann_only_rel_rmse": neumann_only,
        "inv_stable_l_rel_rmse": _rel_rmse(stable_inv, inv_ref),
        "inverse_residual": residual,
        "highest_power": kernel_power, "kernel_power_max": kernel_max,
    }


# --- the seed's experiment, batched: per-run RNG draws only, every other op one tensor op -----

def draw_inputs(specs):
    """The seed's ``make_inputs`` for runs of one chunk size: keys bf16 [B, C, D], log_decay and
    beta float64 [B, C], on the CPU. Only the random draws are per run (each run has its own
    generator); normalization and casts are batched (bit-identical to the per-run code: tested)."""
    chunk, dim = specs[0].chunk, specs[0].dim
    raw_keys, raw_gate, raw_beta = [], [], []
    for s in specs:
        gen = torch.Generator(device="cpu").manual_seed(int(s.seed))
        if s.family == "weak_decay_correlated":
            raw_keys.append(torch.randn(1, dim, dtype=torch.float64, generator=gen)
                            .expand(chunk, dim))
            raw_gate.append(torch.zeros(chunk, dtype=torch.float64))
            raw_beta.append(torch.zeros(chunk, dtype=torch.float64))
        else:
            raw_keys.append(torch.randn(chunk, dim, dtype=torch.float64, generator=gen))
            # sigmoid per run: torch's CPU sigmoid rounds differently on short and long tensors
            if s.family == "model_like":
                raw_gate.append(torch.sigmoid(torch.randn(chunk, dtype=torch.float64,
                                                          generator=gen)))
            else:
                raw_gate.append(torch.zeros(chunk, dtype=torch.float64))
            raw_beta.append(torch.sigmoid(torch.randn(chunk, dtype=torch.float64,
                                                      generator=gen)))
    keys = torch.stack(raw_keys)
    keys = keys / keys.norm(dim=-1, keepdim=True)
    keys = keys.to(torch.float32).to(torch.bfloat16)  # torch's float64 -> bf16 goes via float32
    fam = [s.family for s in specs]
    weak = torch.tensor([f == "weak_decay_correlated" for f in fam])[:, None]
    model = torch.tensor([f == "model_like" for f in fam])[:, None]
    lb = torch.tensor([s.lower_bound if s.lower_bound is not None else -5.0 for s in specs],
                      dtype=torch.float64)[:, None]
    gate = torch.stack(raw_gate)
    log_decay = torch.where(weak, torch.full_like(gate, -0.01),
                            torch.where(model, lb * gate, lb.expand_as(gate)))
    beta = torch.where(weak, torch.full_like(gate, 0.5), torch.stack(raw_beta))
    return keys, log_decay, beta


def _rel_rmse_b(actual, expected):
    finite = torch.isfinite(actual).flatten(1).all(-1)
    a = torch.where(torch.isfinite(actual), actual.double(), torch.zeros_like(expected))
    error = (a - expected.double()).square().mean(dim=(-2, -1)).sqrt()
    scale = expected.double().square().mean(dim=(-2, -1)).sqrt()
    return torch.where(finite, error / (scale + 1e-30), torch.full_like(error, math.inf))


def seed_sweep_batched(keys, log_decay, beta, inverse_model="gpu-h200",
                       l_model="gpu-h200-sgemm"):
    """The seed's run_one for a batch of runs of one chunk size, every stage one batched op.

    Arithmetic operation for operation the seed's (float32 exp2 of the float64 exponent, rounded
    once; bf16 scales and operands; L by ``l_model``; fp16 L times fp16 beta; Neumann by
    ``inverse_model``), with only correctly rounded casts, so it equals the CPU emulation.
    """
    from kdalab.arith import get_accumulation

    lm, im = get_accumulation(l_model), get_accumulation(inverse_model)
    b, chunk, _ = keys.shape
    dev = keys.device
    eye = torch.eye(chunk, dtype=torch.float64, device=dev)
    keys64 = keys.double()
    cumsum = log_decay.cumsum(-1)
    decay_ratio = torch.exp((cumsum[:, :, None] - cumsum[:, None, :]).clamp(max=0.0))
    l_ref = torch.tril(keys64 @ keys64.transpose(-1, -2) * decay_ratio * beta[:, :, None], -1)
    inv_ref = torch.linalg.inv(eye + l_ref)
    c2 = (cumsum * LOG2E).float().double()
    decay = torch.exp2(c2).float()  # float64 exp2, one rounding to float32
    inv_decay = torch.exp2(-c2).float()
    tiny = torch.finfo(torch.float32).tiny
    decay = torch.where(decay < tiny, 0.0, decay).bfloat16()
    inv_decay = torch.where(inv_decay < tiny, 0.0, inv_decay).bfloat16()
    kd = keys * decay[:, :, None]
    ki = keys * inv_decay[:, :, None]
    l32 = lm.matmul(kd.float(), ki.float().transpose(-1, -2))
    l_kernel = torch.tril(l32.half(), -1)
    l_kernel = (l_kernel * beta.half()[:, :, None]).half()

    def neumann(l):
        inv = (torch.eye(chunk, dtype=torch.float16, device=dev) - l).half()
        power, exponent = l, 1
        pmax = l.abs().amax(dim=(-2, -1)).float()
        while exponent * 2 < chunk:
            power = im.matmul(power, power)
            exponent *= 2
            pmax = torch.maximum(pmax, power.abs().amax(dim=(-2, -1)).float())
            inv = (inv + im.matmul(inv, power)).half()
        return inv, exponent, pmax

    stable_inv, _, stable_max = neumann(l_ref.half())
    kernel_inv, power, kernel_max = neumann(l_kernel)
    l_finite = torch.isfinite(l_kernel).flatten(1).all(-1)
    safe = torch.where(l_finite[:, None, None], l_kernel.double(), torch.zeros_like(l_ref))
    metrics = {
        "decay_zeros": (decay == 0).sum(-1),
        "inv_decay_nonfinite": (~torch.isfinite(inv_decay)).sum(-1),
        "l_finite": l_finite.long(),
        "inv_finite": torch.isfinite(kernel_inv).flatten(1).all(-1).long(),
        "l_rel_rmse": _rel_rmse_b(l_kernel, l_ref),
        "inv_total_rel_rmse": _rel_rmse_b(kernel_inv, inv_ref),
        "inv_neumann_only_rel_rmse": torch.where(
            l_finite, _rel_rmse_b(kernel_inv, torch.linalg.inv(eye + safe)),
            torch.full_like(l_finite, math.inf, dtype=torch.float64)),
        "inv_stable_l_rel_rmse": _rel_rmse_b(stable_inv, inv_ref),
        "inverse_residual": _rel_rmse_b((eye + l_ref) @ kernel_inv.double(), eye.expand_as(l_ref)),
        "kernel_power_max": kernel_max,
        "stable_l_power_max": stable_max,
    }
    return l_kernel, kernel_inv, power, metrics


def fast_sweep(runs, device, **models):
    """All runs through :func:`seed_sweep_batched`, grouped by chunk size; inverse bits back."""
    groups = {}
    for s in runs:
        groups.setdefault(s.chunk, []).append(s)
    out = {}
    for chunk, specs in sorted(groups.items()):
        keys, log_decay, beta = draw_inputs(specs)
        keys, log_decay, beta = (t.to(device, non_blocking=True) for t in (keys, log_decay, beta))
        out[chunk] = (specs, seed_sweep_batched(keys, log_decay, beta, **models))
    return out


def batched_inverses(specs, device):
    """Kernel L and its Neumann inverse for runs of one chunk size, via kdalab on ``device``."""
    inputs = [make_inputs(s.family, s.chunk, s.dim, s.seed, -5.0, device) for s in specs]
    keys = torch.stack([i.keys for i in inputs])
    log_decay = torch.stack([i.log_decay for i in inputs])
    beta = torch.stack([i.beta for i in inputs])
    cpu = device == "cpu"
    recipe = SEED.with_(name="seed-h200", l_accumulation="h200-sgemm") if cpu else GPU_RECIPE
    kl = kernel_l(keys, log_decay, beta, recipe)
    inv = neumann_inverse(kl.l, "h200" if cpu else "gpu-h200", recipe.inverse_format).inverse
    return kl.l, inv


def _bits_equal(a, b):
    """Same values bit for bit, NaN payloads aside."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        torch.where(torch.isnan(a), 0, a.float()).view(torch.int32),
        torch.where(torch.isnan(b), 0, b.float()).view(torch.int32))


def _time(fn, reps=3):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], times


def cpu_models(seeds: int) -> None:
    """run_sweep on the CPU: the H200 models against fp16-seq and fp16-once, 1 thread, best of 4."""
    from kdalab.experiments.sweep import seed_reproduction_runs

    torch.set_num_threads(1)
    runs = seed_reproduction_runs(seeds=range(seeds))
    h200_l = SEED.with_(name="seed-h200", l_accumulation="h200-sgemm")
    cfg = [("fp16-seq", "seed"), ("fp16-once", "seed"), ("h200", "seed"), ("h200-mma", "seed"),
           ("h200", h200_l)]
    for m, r in cfg:
        run_sweep(runs[:16], [m], recipe=r)
    best: dict = {}
    for _ in range(4):
        for m, r in cfg:
            t0 = time.perf_counter()
            run_sweep(runs, [m], recipe=r)
            key = m + ("" if r == "seed" else " + L by h200-sgemm")
            best[key] = min(best.get(key, math.inf), time.perf_counter() - t0)
    print(f"{len(runs)} runs (seed tables, {seeds} seeds), CPU, 1 thread, best of 4")
    for k, t in best.items():
        print(f"{k:<28} {t:7.2f} s {len(runs) / t:8.1f} runs/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=256)
    p.add_argument("--loop-runs", type=int, default=96)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--cpu", action="store_true", help="time the CPU models' sweeps instead")
    args = p.parse_args()
    if args.cpu:
        cpu_models(args.seeds if args.seeds != 256 else 16)
        return
    gpu.require_cuda("benchmarks/bench_gpu_sweep.py")
    dev = "cuda"
    runs = []
    for fam, chunks in SEED_TABLE_CHUNKS.items():
        runs += plan_runs([fam], chunks, range(args.seeds), [128], [-5.0])
    print(f"{len(runs)} runs ({len(SEED_TABLE_CHUNKS)} families, seed-table chunks, "
          f"{args.seeds} seeds); {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    result = {"runs": len(runs), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}

    warm = list({r.chunk: r for r in runs}.values())
    fast_sweep(warm, dev)
    for spec in warm:
        inp = make_inputs(spec.family, spec.chunk, spec.dim, spec.seed, -5.0, "cpu")
        seed_run_one(inp.keys.to(dev), inp.log_decay.to(dev), inp.beta.to(dev))

    rows = []
    for label, models in (("gpu-h200 (= h200)", {}),
                          ("gpu-h200-mma (FlashKDA mma.sync)", {"inverse_model": "gpu-h200-mma"}),
                          ("cublas-16f (strided batched)", {"inverse_model": "cublas-16f"})):
        fast_sweep(warm, dev, **models)
        tb, times = _time(lambda: fast_sweep(runs, dev, **models))
        rows.append((f"batched sweep, {label}", len(runs), tb))
        result[f"batched {label}"] = times
    res_fast = fast_sweep(runs, dev)
    torch.cuda.synchronize()

    try:  # the lead's pipeline on CUDA (run_sweep), for comparison
        run_sweep(warm, ["gpu-h200"], recipe=GPU_RECIPE, device=dev)
        tr, times = _time(lambda: run_sweep(runs, ["gpu-h200"], recipe=GPU_RECIPE, device=dev,
                                            max_batch=1 << 16), reps=1)
        rows.append(("kdalab run_sweep on cuda, gpu-h200", len(runs), tr))
        result["run_sweep cuda"] = times
    except Exception as e:  # noqa: BLE001
        print("run_sweep on cuda failed:", repr(e))

    # the seed's loop, inputs drawn per run as its run_one does, on a spread subset of the runs
    step = max(1, len(runs) // args.loop_runs)
    loop_runs = runs[::step][: args.loop_runs]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loop_invs = []
    for s in loop_runs:
        inp = make_inputs(s.family, s.chunk, s.dim, s.seed, -5.0, "cpu")
        loop_invs.append(seed_run_one(inp.keys.to(dev), inp.log_decay.to(dev),
                                      inp.beta.to(dev))[0])
    torch.cuda.synchronize()
    tl = time.perf_counter() - t0
    rows.append(("seed per-run loop (cublasGemmEx + sync)", len(loop_runs), tl))
    result["loop_runs"], result["loop_s"] = len(loop_runs), tl

    index = {}
    for chunk, (specs, (l, inv, _, _)) in res_fast.items():
        for i, s in enumerate(specs):
            index[s] = inv[i]
    same = sum(_bits_equal(index[s], inv) for s, inv in zip(loop_runs, loop_invs))
    result["loop_vs_batched_inverse_bit_identical"] = f"{same}/{len(loop_runs)}"

    print(f"{'path':<48} {'runs':>6} {'seconds':>9} {'runs/s':>10} {'ms/run':>8}")
    for name, n, t in rows:
        print(f"{name:<48} {n:>6} {t:>9.3f} {n / t:>10.1f} {1e3 * t / n:>8.4f}")
    loop_rate = len(loop_runs) / tl
    for name, n, t in rows[:-1]:
        result[f"speedup {name}"] = (n / t) / loop_rate
        print(f"speed-up vs seed loop: {(n / t) / loop_rate:7.1f}x  {name}")
    print(f"kernel inverse, batched gpu-h200 vs seed loop: bit-identical on "
          f"{result['loop_vs_batched_inverse_bit_identical']} runs")

    # bits of every run for the CPU comparison (tests/test_tensorcore.py reads a subset)
    import numpy as np

    save = {}
    for chunk, (specs, (l, inv, power, metrics)) in res_fast.items():
        for fam in SEED_TABLE_CHUNKS:
            idx = [i for i, s in enumerate(specs) if s.family == fam]
            if not idx:
                continue
            seeds = np.array([specs[i].seed for i in idx])
            save[f"{fam}|{chunk}|seeds"] = seeds
            save[f"{fam}|{chunk}|l"] = l[idx].view(torch.int16).cpu().numpy()
            save[f"{fam}|{chunk}|inv"] = inv[idx].view(torch.int16).cpu().numpy()
            for k, v in metrics.items():
                save[f"{fam}|{chunk}|m|{k}"] = v[idx].cpu().numpy()
    np.savez_compressed(os.path.join(args.out, "gpu_sweep_bits.npz"), **save)
    with open(os.path.join(args.out, "bench_gpu_sweep.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
