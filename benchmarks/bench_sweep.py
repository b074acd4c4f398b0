"""Batched sweep vs a per-run loop over the same code, per accumulation model.

3 families × C = 2, 4, …, 64 × 32 seeds (3,072 runs), dim 128, on the CPU. Both variants call
``kdalab.studies.sweep.run_sweep``: once with every run (batched by chunk size), and once per
run. Prints runs/s of each and their ratio; also checks that both give identical records.

    python benchmarks/bench_sweep.py [--models fp16-seq,fp16-once,fp32,fp64] [--seeds 32]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from kdalab.arith import available_accumulations
from kdalab.inputs.families import FAMILIES
from kdalab.studies.sweep import plan_runs, run_sweep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="fp16-seq,fp16-once,fp32,fp64")
    p.add_argument("--seeds", type=int, default=32)
    p.add_argument("--max-chunk", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: on a shared 2-core machine OpenMP "
                        "threads oversubscribe and elementwise ops slow down 15-30x)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(available_accumulations())
    if unknown:
        raise SystemExit(f"unknown models: {sorted(unknown)}")
    runs = plan_runs(FAMILIES, range(2, args.max_chunk + 1, 2), range(args.seeds), [args.dim],
                     [-5.0])
    print(f"{len(runs)} runs; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'model':<10} {'batched s':>10} {'per-run s':>10} {'batched runs/s':>15} "
          f"{'per-run runs/s':>15} {'ratio':>7}")
    for model in models:
        # warm-up: one run of every shape through both paths (first calls pay one-time setup)
        warm = {(r.chunk, r.dim): r for r in runs}
        for spec in warm.values():
            run_sweep([spec], [model])
        t0 = time.perf_counter()
        batched = run_sweep(runs, [model])
        tb = time.perf_counter() - t0
        t0 = time.perf_counter()
        single = []
        for spec in runs:
            single += run_sweep([spec], [model])
        ts = time.perf_counter() - t0
        same = json.dumps(sorted(batched, key=str)) == json.dumps(sorted(single, key=str))
        print(f"{model:<10} {tb:>10.2f} {ts:>10.2f} {len(runs) / tb:>15.1f} "
              f"{len(runs) / ts:>15.1f} {ts / tb:>6.1f}x  identical records: {same}", flush=True)


if __name__ == "__main__":
    main()
