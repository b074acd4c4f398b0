#!/usr/bin/env python3
"""Where a large CUDA sweep's time goes, phase by phase, in one process (run on a GPU).

    PYTHONPATH=$PWD/src python3 benchmarks/bench_sweep_phases.py \\
        [--chunks 2-64] [--seeds 0-499] [--accumulation h200]

The plan is ``kdalab sweep``'s (3 families × chunks × seeds, dim 128, by default the issue's
94,500 runs). Each phase is timed on its own, after a warm-up sweep of a few seeds:

* **draws**: every batch's inputs (``make_inputs_batch`` onto the GPU), the key streams
  started afresh;
* **GPU and records**: every batch launched and its records built from inputs drawn
  beforehand (kept on the GPU), i.e. the sweep without its draws;
* **sweep into a store**: ``run_into_store`` as the command runs it (draws, GPU, records,
  Parquet parts), into a fresh folder, then the store's **views**.

Prints one line per phase, in seconds and ms per run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path


def _fresh_draws() -> None:
    """No key streams: the next draw starts as a new process's does."""
    from kdalab.experiments.keystream import STREAMS

    STREAMS.clear()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", default="2-64")
    p.add_argument("--seeds", default="0-499")
    p.add_argument("--accumulation", default="h200")
    args = p.parse_args()

    import torch

    from kdalab.cli.common import draw_views
    from kdalab.experiments import draw
    from kdalab.experiments.backends import open_store, run_into_store
    from kdalab.experiments.inverse import launch_group
    from kdalab.experiments.sweep import DEFAULT_MAX_BATCH, SweepConfig, SweepPlan

    def plan_of(seeds: str) -> SweepPlan:
        return SweepPlan.of(SweepConfig.parse({
            "families": "floor,weak_decay_correlated,model_like", "chunks": args.chunks,
            "seeds": seeds, "dims": 128, "accumulations": args.accumulation,
            "device": "cuda"}))

    plan = plan_of(args.seeds)
    n = len(plan)
    batches = list(plan.batches(DEFAULT_MAX_BATCH[True]))
    device = torch.device("cuda", 0)
    print(f"{n} runs in {len(batches)} batches, {args.accumulation}; torch {torch.__version__}, "
          f"{len(os.sched_getaffinity(0))} cores", flush=True)

    def line(name: str, seconds: float) -> None:
        print(f"  {name}: {seconds:.3f} s = {1e3 * seconds / n:.4f} ms/run", flush=True)

    root = Path(tempfile.mkdtemp(prefix="bench_phases_"))
    with open_store(plan_of("0-1"), root / "warm") as store:  # CUDA, cuBLAS, kernels
        run_into_store(plan_of("0-1"), store)
    torch.set_num_threads(1)

    _fresh_draws()
    t0 = time.perf_counter()
    for b in batches:
        draw.make_inputs_batch(b.runs, device)
    torch.cuda.synchronize()
    line("draws, key streams started afresh", time.perf_counter() - t0)

    _fresh_draws()
    inputs = [draw.make_inputs_batch(b.runs, device) for b in batches]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b, x in zip(batches, inputs):
        launch_group(b.runs, plan.accumulations, recipe=plan.recipe, device=device,
                     inputs=x).table(b.index)
    line("GPU and records, inputs drawn beforehand", time.perf_counter() - t0)
    del inputs

    _fresh_draws()
    folder = root / "sweep"
    with open_store(plan, folder) as store:
        t0 = time.perf_counter()
        run_into_store(plan, store)
        store.flush()
        line("sweep into a store (the command's default)", time.perf_counter() - t0)
        t0 = time.perf_counter()
        draw_views(store, show=False)
        line("views", time.perf_counter() - t0)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
