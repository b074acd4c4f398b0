#!/usr/bin/env python3
"""Where a large CUDA sweep's time goes, phase by phase, in one process (run on a GPU).

    PYTHONPATH=$PWD/src python3 benchmarks/bench_sweep_phases.py \\
        [--chunks 2-64] [--seeds 0-499] [--accumulation h200]

The plan is ``kdalab sweep``'s (3 families × chunks × seeds, dim 128, by default the issue's
94,500 runs). The helpers are started first and torch imported, as the command does; then:

* the sweep into a fresh store, **cold** (the first kernels of each shape), with the draw
  servers, as the command runs it, and its views (the views worker);
* the same **warm**, drawn in this process, then warm with new draw servers (ready before it
  starts), their blocks page-locked and not (``drawserver.PAGE_LOCK``), then under cProfile;
* each sweep's time split by where the driver spends it (waiting for the servers, draws on
  the helper thread, GPU work queued, records with the wait for the GPU, store appends);
* **draws alone** and **GPU and records alone** (inputs drawn beforehand).

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


def _timed(owner, name: str, label: str, spent: dict) -> None:
    """Wrap ``owner.name`` to add its time to ``spent[label]`` (any thread)."""
    inner = getattr(owner, name)

    def wrapper(*args, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kw)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

    setattr(owner, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", default="2-64")
    p.add_argument("--seeds", default="0-499")
    p.add_argument("--accumulation", default="h200")
    args = p.parse_args()

    from kdalab.cli.common import start_helpers

    t_start = time.perf_counter()
    start_helpers(draw_servers=True)  # as `kdalab sweep --device cuda` does, before torch
    import torch

    t_torch = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t_cuda = time.perf_counter()

    from kdalab.cli.common import draw_views
    from kdalab.experiments import draw, drawserver, helper, inverse, runstore
    from kdalab.experiments import sweep as sweep_module
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
          f"{len(os.sched_getaffinity(0))} cores; import torch {t_torch - t_start:.2f} s, "
          f"CUDA init {t_cuda - t_torch:.2f} s", flush=True)

    def line(name: str, seconds: float) -> None:
        print(f"  {name}: {seconds:.3f} s = {1e3 * seconds / n:.4f} ms/run", flush=True)

    spent: dict = {}
    _timed(drawserver.DrawServers, "submit", "sending batches to the draw servers", spent)
    _timed(drawserver.DrawServers, "result", "waiting for the draw servers", spent)
    _timed(sweep_module, "make_inputs_batch", "draws here (helper thread)", spent)
    _timed(sweep_module, "launch_group", "GPU work queued", spent)
    _timed(inverse.PendingGroup, "table", "records (with the wait for the GPU)", spent)
    _timed(runstore.RunStore, "append", "store appends", spent)
    _timed(runstore.RunStore, "flush", "store flush (the last parts on disk)", spent)
    _timed(runstore, "_write_part", "parts written (writer thread)", spent)

    def sweep_into(folder: Path, name: str, profile: bool = False) -> None:
        import cProfile
        import pstats

        spent.clear()
        prof = cProfile.Profile() if profile else None
        with open_store(plan, folder) as store:
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            run_into_store(plan, store)
            store.flush()
            if prof:
                prof.disable()
            line(name, time.perf_counter() - t0)
            for label, seconds in spent.items():
                print(f"      {label}: {seconds:.3f} s", flush=True)
            t0 = time.perf_counter()
            draw_views(store, show=False)
            line("    then its views", time.perf_counter() - t0)
        if prof:
            stats = pstats.Stats(prof)
            stats.sort_stats("tottime").print_stats(18)
            stats.sort_stats("cumulative").print_stats(30)

    root = Path(tempfile.mkdtemp(prefix="bench_phases_"))
    sweep_into(root / "cold", "sweep into a store, cold (as the command: draw servers)")
    sweep_into(root / "warm", "the same again, warm, drawn in this process")
    def servers_ready() -> None:  # started, and awaited: they import torch
        helper.start_early(helper.DRAW_SERVER, helper.draw_servers())
        servers = drawserver.take(True)
        while not servers.ready():
            time.sleep(0.05)
        helper._EARLY[helper.DRAW_SERVER] = servers._helpers  # as the command leaves them

    for lock in (True, False):
        drawserver.PAGE_LOCK = lock
        servers_ready()
        sweep_into(root / f"warm-lock{lock}", "the same again, warm, draw servers ready, "
                   + ("blocks page-locked" if lock else "copied into page-locked memory"))
    drawserver.PAGE_LOCK = True
    servers_ready()
    sweep_into(root / "warm2", "the same again, warm, draw servers (under cProfile)",
               profile=True)

    torch.set_num_threads(1)
    _fresh_draws()
    t0 = time.perf_counter()
    for b in batches:
        draw.make_inputs_batch(b.runs, device)
    torch.cuda.synchronize()
    line("draws alone, key streams started afresh", time.perf_counter() - t0)

    inputs = [draw.make_inputs_batch(b.runs, device) for b in batches]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b, x in zip(batches, inputs):
        launch_group(b.runs, plan.accumulations, recipe=plan.recipe, device=device,
                     inputs=x).table(b.index)
    line("GPU and records alone, inputs drawn beforehand", time.perf_counter() - t0)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
