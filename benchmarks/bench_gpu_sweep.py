#!/usr/bin/env python3
"""kdalab's batched GPU sweep vs the seed's per-run loop, same runs, same process (run on a GPU).

    PYTHONPATH=$PWD/src python3 benchmarks/bench_gpu_sweep.py \\
        [--seeds 256] [--loop-runs 96] [--max-batch 512] [--profile] [--out DIR]
    python benchmarks/bench_gpu_sweep.py --cpu [--seeds 16]     # CPU models' sweep speed, no GPU

Runs: the seed document's table configurations (3 families, their chunk sizes), seeds 0..S−1,
dim 128. *Batched*: kdalab's own ``run_sweep(device="cuda")`` — inputs drawn on the CPU (each
seed's keys once for every chunk size, kdalab.inputs.keystream), every stage one launch per
batch, batches pipelined, records built — timed whole, median of 3 after a warm-up, for the
Neumann models ``gpu-h200`` (== CPU ``h200``), ``gpu-h200-mma`` and ``cublas-16f``, each with
its own hardware's L (``gpu-h200-sgemm``; ``cublas-32f`` for ``cublas-16f``). *Per-run loop*: the
seed's own ``run_one`` (tests/seed_oracle.py), one ``cublasGemmEx`` call per product with a
device synchronization before and after, as the seed
does, on a spread subset of the runs. Speed-ups are against that loop, measured in the same run.
Also checks that kdalab's batched ``kernel_l`` + ``neumann_inverse`` give the loop's kernel
inverse bit for bit, and writes every run's L and inverse bits with the records' metrics
(``gpu_sweep_bits.npz``; tests/test_tensorcore.py reads a subset).

``--profile`` splits ``run_sweep``'s time on the device: input draws alone, the queued GPU
work alone with the inputs drawn beforehand (CPU queueing time, and the GPU's own time
measured behind a sleep kernel), record building, and lists the host synchronizations of one
short sweep (``torch.cuda.set_sync_debug_mode("warn")``).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time
import traceback
import warnings

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(ROOT, "src"), ROOT]  # kdalab, and the seed's code in tests/

import cublas_models  # noqa: E402,F401  (registers cublas-16f, cublas-32f: benchmarks/)
from tests.seed_oracle import seed_make_inputs, seed_run_one  # noqa: E402

from kdalab.arith.gpu import require_cuda  # noqa: E402
from kdalab.inputs.draw import make_inputs_batch  # noqa: E402
from kdalab.kda.intra import kernel_l  # noqa: E402
from kdalab.kda.inverse import neumann_inverse  # noqa: E402
from kdalab.kda.recipe import SEED  # noqa: E402
from kdalab.studies.inverse import launch_group  # noqa: E402
from kdalab.studies.sweep import (  # noqa: E402
    DEFAULT_MAX_BATCH,
    SEED_TABLE_CHUNKS,
    plan_batches,
    plan_runs,
    run_sweep,
)

DEVICE = "cuda"
GPU_RECIPE = SEED.with_(name="seed-h200-gpu", l_accumulation="gpu-h200-sgemm")
#: (label, accumulation name) of the batched paths; the first is the headline.
MODELS = (("gpu-h200 (= h200)", "gpu-h200"),
          ("gpu-h200-mma (FlashKDA mma.sync)", "gpu-h200-mma"),
          ("cublas-16f (strided batched; L by cublas-32f)", "cublas-16f"))

def batched_inverses(specs, device):
    """Kernel L and its Neumann inverse for runs of one chunk size, via kdalab on ``device``
    (L by h200-sgemm, Neumann by h200, or their GPU twins)."""
    inp = make_inputs_batch(specs, device)
    cpu = torch.device(device).type == "cpu"
    recipe = SEED.with_(name="seed-h200", l_accumulation="h200-sgemm") if cpu else GPU_RECIPE
    kl = kernel_l(inp.keys, inp.log_decay, inp.beta, recipe)
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
    """run_sweep on the CPU: the H200 models against fp16-seq and fp16-once, 1 thread, best of
    4."""
    from kdalab.studies.sweep import seed_reproduction_runs

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


def sweep(runs, model, args):
    return run_sweep(runs, [model], recipe=GPU_RECIPE, device=DEVICE,
                     max_batch=args.max_batch)


def profile(runs, model, args, result):
    """Where ``run_sweep``'s time goes on this device, and which steps wait for the GPU."""
    dev = DEVICE
    n = len(runs)
    batches = plan_batches(runs, args.max_batch)
    prof = {"batches": len(batches), "max_batch": args.max_batch}
    print(f"\nprofile of run_sweep, {model}: {n} runs in {len(batches)} batches "
          f"(max_batch {args.max_batch}), {os.cpu_count()} CPUs")

    def line(label, seconds, note=""):
        prof[label] = seconds
        print(f"  {label:<52} {seconds:8.3f} s {1e3 * seconds / n:8.4f} ms/run {note}")

    def draws():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = [make_inputs_batch(b, dev) for b in batches]
        torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    draws_label = "input draws alone (key streams kept from a first pass)"
    draws()
    inputs, t = draws()
    line(draws_label, t)

    def launch_all():
        return [launch_group(b, [model], recipe=GPU_RECIPE, device=dev, inputs=i)
                for b, i in zip(batches, inputs)]

    launch_all()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pending = launch_all()
    line("GPU work, inputs drawn before: queueing (CPU)", time.perf_counter() - t0)
    torch.cuda.synchronize()
    t_done = time.perf_counter() - t0
    line("GPU work, inputs drawn before: queued and done", t_done)
    try:  # the GPU's own time: each batch queued behind a sleep kernel, timed with events
        sleep = int(3 * t_done / len(batches) * 2.0e9) + 10**7  # 3x a batch's queueing, 2 GHz
        t_gpu = 0.0
        for b, i in zip(batches, inputs):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            torch.cuda._sleep(sleep)
            start.record()
            launch_group(b, [model], recipe=GPU_RECIPE, device=dev, inputs=i)
            end.record()
            end.synchronize()
            t_gpu += start.elapsed_time(end) / 1e3
        line("GPU's own time (each batch queued behind a sleep)", t_gpu)
    except Exception as e:  # noqa: BLE001
        print("  GPU's own time: not measured:", repr(e))
    t0 = time.perf_counter()
    records = [p.collect() for p in pending]
    line("record building (with the copies back)", time.perf_counter() - t0,
         f"({sum(map(len, records))} records)")
    line("sum: draws + GPU work + records",
         prof[draws_label] + t_done + prof["record building (with the copies back)"])

    # run_sweep whole, by batch size (fewer batches: less queueing; more: more overlap)
    for mb in (256, 512, 1024, 4096):
        timed = argparse.Namespace(**{**vars(args), "max_batch": mb})
        sweep(runs, model, timed)
        t, _ = _time(lambda: sweep(runs, model, timed))
        line(f"run_sweep whole, max_batch={mb}", t)

    try:  # the kernels and CPU-side operations that take the time (torch.profiler)
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            launch_all()
            torch.cuda.synchronize()
        table = tp.key_averages()
        for key in ("self_device_time_total", "self_cuda_time_total"):
            try:
                print(table.table(sort_by=key, row_limit=15, max_name_column_width=60))
                break
            except Exception:  # noqa: BLE001 (the key's name differs between torch versions)
                continue
        print(table.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    except Exception as e:  # noqa: BLE001
        print("  torch.profiler tables: not available:", repr(e))

    # host synchronizations of a short sweep (a few batches, pipelined)
    short = [r for r in runs if r.chunk == runs[0].chunk][: 3 * 64]
    sweep(short, model, args)  # warm
    torch.cuda.synchronize()
    syncs: collections.Counter = collections.Counter()

    def note(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        ours = (f"{os.sep}kdalab{os.sep}", "bench_gpu_sweep")
        frames = [f for f in traceback.extract_stack()[:-1]
                  if any(o in f.filename for o in ours)][-3:]
        where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                            for f in reversed(frames)) or f"{filename}:{lineno}"
        syncs[f"{str(message).splitlines()[0][:80]} at {where}"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_sweep(short, [model], recipe=GPU_RECIPE, device=dev,
                      max_batch=64)  # returns after its last copy back: nothing left running
        finally:
            torch.cuda.set_sync_debug_mode(0)
    n_short = len(plan_batches(short, 64))
    prof[f"host syncs ({n_short} batches)"] = dict(syncs)
    print(f"  host syncs of run_sweep over {len(short)} runs in {n_short} batches "
          f"(set_sync_debug_mode('warn')): {sum(syncs.values())}")
    for where, count in syncs.most_common():
        print(f"    {count:4d} x {where}")
    result["profile"] = prof


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=256)
    p.add_argument("--loop-runs", type=int, default=96)
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH[True],
                   help="run_sweep's max_batch (default: its CUDA default)")
    p.add_argument("--profile", action="store_true", help="also split run_sweep's time")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--cpu", action="store_true", help="time the CPU models' sweeps instead")
    args = p.parse_args()
    if args.cpu:
        cpu_models(args.seeds if args.seeds != 256 else 16)
        return
    require_cuda("benchmarks/bench_gpu_sweep.py")
    dev = DEVICE
    runs = []
    for fam, chunks in SEED_TABLE_CHUNKS.items():
        runs += plan_runs([fam], chunks, range(args.seeds), [128], [-5.0])
    print(f"{len(runs)} runs ({len(SEED_TABLE_CHUNKS)} families, seed-table chunks, "
          f"{args.seeds} seeds); {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")
    result = {"runs": len(runs), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "max_batch": args.max_batch}

    # warm-up: every chunk size through every path (first calls compile and allocate)
    warm = list({r.chunk: r for r in runs}.values())
    for s in warm:
        seed_run_one(*(t.to(dev) for t in seed_make_inputs(s.family, s.chunk, s.dim, s.seed)))

    rows = []
    records = None
    for label, model in MODELS:
        sweep(runs, model, args)  # warm at full size
        out = []
        tb, times = _time(lambda: out.append(sweep(runs, model, args)))
        rows.append((f"kdalab run_sweep, {label}", len(runs), tb))
        result[f"run_sweep {model}"] = times
        if records is None:
            records = out[-1]

    # the seed's loop, inputs drawn per run as its run_one does, on a spread subset of the runs
    step = max(1, len(runs) // args.loop_runs)
    loop_runs = runs[::step][: args.loop_runs]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loop_invs = []
    for s in loop_runs:
        keys, log_decay, beta = seed_make_inputs(s.family, s.chunk, s.dim, s.seed)
        loop_invs.append(seed_run_one(keys.to(dev), log_decay.to(dev), beta.to(dev))[0])
    torch.cuda.synchronize()
    tl = time.perf_counter() - t0
    rows.append(("seed per-run loop (cublasGemmEx + sync)", len(loop_runs), tl))
    result["loop_runs"], result["loop_s"] = len(loop_runs), tl

    print(f"\n{'path':<64} {'runs':>6} {'seconds':>9} {'runs/s':>10} {'ms/run':>8}")
    for name, n, t in rows:
        print(f"{name:<64} {n:>6} {t:>9.3f} {n / t:>10.1f} {1e3 * t / n:>8.4f}")
    loop_rate = len(loop_runs) / tl
    for name, n, t in rows[:-1]:
        result[f"speedup {name}"] = (n / t) / loop_rate
        print(f"speed-up vs seed loop (same process): {(n / t) / loop_rate:7.1f}x  {name}")

    # L and inverse bits of every run (kdalab's kernel_l + neumann_inverse, batched on CUDA)
    by_chunk: dict = {}
    for s in runs:
        by_chunk.setdefault(s.chunk, []).append(s)
    bits = {c: (specs, batched_inverses(specs, dev))
            for c, specs in sorted(by_chunk.items())}
    index = {s: inv[i] for specs, (_, inv) in bits.values() for i, s in enumerate(specs)}
    same = sum(_bits_equal(index[s], inv) for s, inv in zip(loop_runs, loop_invs))
    result["loop_vs_batched_inverse_bit_identical"] = f"{same}/{len(loop_runs)}"
    print(f"kernel inverse, batched gpu-h200 vs seed loop: bit-identical on "
          f"{result['loop_vs_batched_inverse_bit_identical']} runs")

    if args.profile:
        profile(runs, MODELS[0][1], args, result)

    # bits of every run for the CPU comparison (tests/test_tensorcore.py reads a subset)
    import numpy as np

    from kdalab.studies.inverse import METRIC_KEYS

    metrics = {(r["family"], r["chunk"], r["seed"]): r for r in records}
    skip = ("highest_power", "stable_l_highest_power")
    save = {}
    for chunk, (specs, (l, inv)) in bits.items():
        for fam in SEED_TABLE_CHUNKS:
            idx = [i for i, s in enumerate(specs) if s.family == fam]
            if not idx:
                continue
            save[f"{fam}|{chunk}|seeds"] = np.array([specs[i].seed for i in idx])
            save[f"{fam}|{chunk}|l"] = l[idx].view(torch.int16).cpu().numpy()
            save[f"{fam}|{chunk}|inv"] = inv[idx].view(torch.int16).cpu().numpy()
            for k in METRIC_KEYS:
                if k not in skip:
                    save[f"{fam}|{chunk}|m|{k}"] = np.array(
                        [metrics[(fam, chunk, specs[i].seed)][k] for i in idx])
    os.makedirs(args.out, exist_ok=True)
    np.savez_compressed(os.path.join(args.out, "gpu_sweep_bits.npz"), **save)
    with open(os.path.join(args.out, "bench_gpu_sweep.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
