#!/usr/bin/env python3
"""``kdalab sweep`` as a whole process (start-up, sweep, store, views) against the seed's own
per-run loop timed in this process, and the Ray backend's throughput on 1, 2, … GPUs.

Whole process (prints per-run times and their ratio to the seed loop)::

    python benchmarks/bench_sweep_whole.py whole --device cpu --accumulation fp16-seq \\
        --chunks 2-64:2 --seeds 0-31                   # CPU target: >= 5x the seed loop
    python benchmarks/bench_sweep_whole.py whole --device cpu --accumulation h200 \\
        --chunks 2-64:2 --seeds 0-7                    # target: <= 10x the seed loop's time
    python3 benchmarks/bench_sweep_whole.py whole --device cuda --accumulation h200 \\
        --chunks 2-64 --seeds 0-499                    # H200: >= 60x, <= 8 s (94,500 runs)

The command runs as a subprocess (``python -c 'from kdalab.cli import run; run()' sweep …``,
what the ``kdalab`` script runs), timed from its start to its exit, into fresh folders, over
``--rounds`` rounds (the first also pays cold caches: the page cache, CUDA's kernels). Each
round runs every one of ``--variants`` once, their order rotated from round to round, then the
seed loop (``tests/seed_oracle.py``: ``seed_make_inputs`` + ``seed_run_one``, its CPU
fallback on the CPU, one ``cublasGemmEx`` per product on CUDA) on ``--seed-sample`` seeds
of every (family, chunk) cell, one intra-op thread on the CPU as the command uses, so its mean
is the per-run time of the same mix of chunk sizes; each variant's time is divided into that
round's seed loop. The command's ``KDALAB_TIMELINE`` phases are printed with each time.
``--breakdown`` also times the phases in this process (imports, sweep into the store, views);
``--prelude CODE`` runs CODE in the command's process first.
``--json PATH`` writes the result (docs/BENCHMARKS.md's schema): each variant's best time and
best speed-up over the seed loop (every round's in the note), and the seed loop's ms per run.

The variants (:data:`VARIANTS`; docs/sweeps.md, "Start-up", says what was measured and why
the command stays plain): ``plain`` (the default command). ``views-ahead`` (the views'
imports on a thread started with the command) and ``--backend drawer`` (the inputs drawn in a
second process) were measured on the H200 and deleted (code at ad611c1 and 3ba48b3); a new
candidate joins :data:`VARIANTS` for its A/B. The run on an H200 (about 2 minutes)::

    python3 benchmarks/bench_sweep_whole.py whole --device cuda --accumulation h200 \\
        --chunks 2-64 --seeds 0-499 --rounds 3 --variants plain \\
        --json $OUT/sweep_ab_h200.json

Ray (``pip install 'kdalab[ray]'``)::

    python3 benchmarks/bench_sweep_whole.py ray --device cuda --accumulation h200 \\
        --chunks 2-64 --seeds 0-1999 --gpus 1,2

runs the sweep in this process on the local backend, then on a local Ray cluster limited to
each number of GPUs, each into its own store (a warm-up sweep first starts the workers, one
per GPU, which the timed sweep then reuses; its time is printed too); prints runs/s and the
speed-up over 1 GPU, and checks that every store holds the local backend's records bit for
bit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the seed's code: tests/seed_oracle.py
CLI = "import sys; from kdalab.cli import run; sys.argv[0] = 'kdalab'; run()"


def _axes(args) -> list[str]:
    return ["--families", args.families, "--chunks", args.chunks, "--seeds", args.seeds,
            "--dims", str(args.dim), "--accumulation", args.accumulation,
            "--device", args.device]


def _plan(args):
    from kdalab.studies.sweep import SweepConfig, SweepPlan

    return SweepPlan.of(SweepConfig.parse({
        "families": args.families, "chunks": args.chunks, "seeds": args.seeds,
        "dims": args.dim, "accumulations": args.accumulation, "device": args.device}))


def seed_loop_ms(args) -> tuple[float, int]:
    """Mean ms per run of the seed's own loop over ``--seed-sample`` seeds of every cell."""
    import torch
    from tests.seed_oracle import seed_make_inputs, seed_run_one

    from kdalab import params

    device = torch.device(args.device)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    plan = _plan(args)
    seeds = params.int_list(args.seeds, "seeds")[: args.seed_sample]
    cells = [(c, d, fam) for c, d, pairs in plan.cells for fam, _ in pairs]

    def one(chunk, dim, family, seed):
        keys, g, beta = seed_make_inputs(family, chunk, dim, seed)
        seed_run_one(keys.to(device), g.to(device), beta.to(device))

    one(*cells[0], seeds[0])  # warm-up (cuBLAS handle, first kernels)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for cell in cells:
        for s in seeds:
            one(*cell, s)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    torch.set_num_threads(before)
    n = len(cells) * len(seeds)
    return 1e3 * elapsed / n, n


#: The start-up variants of ``whole --variants`` (docs/sweeps.md, "Start-up"): the command's
#: extra options and Python run in its process before it starts (an A/B switch, no house code)
VARIANTS = {
    "plain": ([], ""),  # the default: one process, the draws on the draw-ahead thread
}


def _command(args, name: str, out: Path, env: dict) -> tuple[float, list[str]]:
    """One whole ``kdalab sweep`` of variant ``name`` into ``out``: its wall time and its
    timeline marks."""
    extra, prelude = VARIANTS[name]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", "\n".join([prelude, args.prelude, CLI]),
                          "sweep", *_axes(args), *extra, "--out", str(out), "--quiet"],
                         env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:  # said, and timed as NaN: the other variants' rounds still count
        print(f"  kdalab sweep ({name}) failed ({res.returncode}):\n{res.stderr[-3000:]}",
              flush=True)
        wall = math.nan
    return wall, [line for line in res.stderr.splitlines() if line.startswith("timeline")]


def whole(args) -> None:
    """Every variant once per round (their order rotated from round to round), then the seed
    loop: per-round times and speed-ups over that round's seed loop."""
    n_runs = len(_plan(args))
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    print(f"whole process: {n_runs} runs ({args.families}; chunks {args.chunks}; seeds "
          f"{args.seeds}; dim {args.dim}), {args.accumulation} on {args.device}; variants "
          f"{', '.join(names)} over {args.rounds} round(s); python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    env = dict(os.environ)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env["KDALAB_TIMELINE"] = "1"  # the command's phases on stderr (docs/sweeps.md)
    root = Path(args.out or tempfile.mkdtemp(prefix="bench_sweep_"))
    walls: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    seeds: list[float] = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            wall, marks = _command(args, name, root / f"{name}-{r}", env)
            walls[name].append(wall)
            print(f"== round {r + 1}, {name}: {wall:.2f} s = {1e3 * wall / n_runs:.4f} ms per "
                  "run\n    " + "\n    ".join(marks), flush=True)
        seed_ms, sampled = seed_loop_ms(args)
        seeds.append(seed_ms)
        for name in names:
            ratios[name].append(seed_ms * n_runs / (1e3 * walls[name][r]))
        print(f"round {r + 1}: seed loop {seed_ms:.4f} ms per run ({sampled} runs sampled, "
              "same cells); " + "; ".join(f"{name} {walls[name][r]:.2f} s = "
                                          f"{ratios[name][r]:.1f}x" for name in names),
              flush=True)
    rows = []
    for name in names:
        if all(math.isnan(w) for w in walls[name]):
            print(f"RESULT whole {args.accumulation} {args.device} {name}: failed every round")
            continue
        best = min(w for w in walls[name] if not math.isnan(w))
        print(f"RESULT whole {args.accumulation} {args.device} {name}: best {best:.2f} s for "
              f"{n_runs} runs ({1e3 * best / n_runs:.4f} ms/run); per round "
              f"{' / '.join(f'{w:.2f}' for w in walls[name])} s = "
              f"{' / '.join(f'{x:.1f}' for x in ratios[name])}x the seed loop")
        rounds = f"rounds: {' / '.join(f'{w:.2f}' for w in walls[name])} s"
        rows += [
            {"target": f"kdalab sweep ({n_runs} runs, {args.accumulation}), whole process, "
                       f"{name}", "value": round(best, 3), "unit": "s",
             "note": f"best of {len(walls[name])}; {rounds}"},
            {"target": f"speed-up of the whole command over the seed loop, {name}",
             "value": round(max(x for x in ratios[name] if not math.isnan(x)), 2), "unit": "x",
             "note": "best round; rounds: " + " / ".join(f"{x:.1f}" for x in ratios[name])}]
    rows.append({"target": "seed loop, per run (same cells)", "value": round(min(seeds), 5),
                 "unit": "ms", "note": "rounds: " + " / ".join(f"{x:.4f}" for x in seeds)})
    if args.json:
        write_json(args, rows)
    if args.breakdown:
        breakdown(args, root / "breakdown")
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)


def write_json(args, rows: list[dict]) -> None:
    """The result as docs/BENCHMARKS.md's JSON: benchmark, device, date, commit, command, rows."""
    device = platform.processor() or platform.machine()
    if args.device.startswith("cuda"):
        import torch

        device = torch.cuda.get_device_name(torch.device(args.device))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                                capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    result = {"benchmark": "bench_sweep_whole", "device": device,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit, "command": " ".join(["python3", *sys.argv]), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


def breakdown(args, out: Path) -> None:
    """The command's phases, timed in this process (imports are already warm here: only the
    kdalab CLI modules' own first import is measured)."""
    t0 = time.perf_counter()
    from kdalab.cli.stored import draw_views, sweep_views
    from kdalab.runner import open_store, run_into_store
    t1 = time.perf_counter()
    plan = _plan(args)
    shutil.rmtree(out, ignore_errors=True)
    with open_store(plan, out) as store:
        t2 = time.perf_counter()
        run_into_store(plan, store)
        store.flush()
        t3 = time.perf_counter()
        draw_views(store, sweep_views, show=False)
        t4 = time.perf_counter()
    print(f"  breakdown: imports {t1 - t0:.2f} s, open store {t2 - t1:.2f} s, sweep into the "
          f"store {t3 - t2:.2f} s ({1e3 * (t3 - t2) / len(plan):.4f} ms/run), views "
          f"{t4 - t3:.2f} s", flush=True)


def ray_throughput(args) -> None:
    import ray

    from kdalab.records import RunStore, identical
    from kdalab.runner import open_store, run_into_store
    from kdalab.studies.sweep import SweepConfig, SweepPlan

    plan = _plan(args)
    gpu = args.device.startswith("cuda")
    # on CUDA, enough runs for two shards in every worker's hands: all of them warm up
    warm = SweepPlan.of(SweepConfig.parse({
        "families": args.families, "chunks": args.chunks, "seeds": "0-99" if gpu else "0-1",
        "dims": args.dim, "accumulations": args.accumulation, "device": args.device}))
    root = Path(args.out or tempfile.mkdtemp(prefix="bench_ray_"))
    print(f"ray: {len(plan)} runs, {args.accumulation} on {args.device}; ray "
          f"{ray.__version__}; {os.cpu_count()} CPUs", flush=True)

    def timed(name: str, backend: str) -> float:
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(root / "warm", ignore_errors=True)
        t0 = time.perf_counter()
        with open_store(warm, root / "warm") as store:  # start the workers, warm them up
            run_into_store(warm, store, backend=backend)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        with open_store(plan, folder) as store:
            run_into_store(plan, store, backend=backend)
        elapsed = time.perf_counter() - t0
        print(f"  {name}: {elapsed:.2f} s, {len(plan) / elapsed:,.0f} runs/s (start and "
              f"warm-up sweep of {len(warm)} runs before it: {cold:.2f} s)", flush=True)
        return elapsed

    times = {"local": timed("local", "local")}
    for n in [int(g) for g in args.gpus.split(",")]:
        t0 = time.perf_counter()
        ray.init(num_gpus=n if gpu else 0, num_cpus=None if gpu else n,
                 include_dashboard=False, configure_logging=False)
        print(f"  ray cluster with {n} {'GPU' if gpu else 'CPU'}(s) up in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        times[f"ray{n}"] = timed(f"ray{n}", "ray")
        ray.shutdown()
    local = RunStore.read_only(root / "local").read()
    same = {name: identical(RunStore.read_only(root / name).read(), local)
            for name in times if name != "local"}
    base = next((times[k] for k in times if k.startswith("ray")), None)
    print("RESULT ray: " + "; ".join(
        f"{k} {len(plan) / v:,.0f} runs/s" + (f" ({base / v:.2f}x ray 1)" if base else "")
        for k, v in times.items()) + f"; records identical to local: {same}")
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["whole", "ray"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--accumulation", default="fp16-seq")
    p.add_argument("--families", default="floor,weak_decay_correlated,model_like")
    p.add_argument("--chunks", default="2-64:2")
    p.add_argument("--seeds", default="0-31")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seed-sample", type=int, default=4,
                   help="seeds of each cell timed in the seed loop (default 4)")
    p.add_argument("--rounds", "--repeat", type=int, default=2,
                   help="whole: rounds, each running every variant once (default 2)")
    p.add_argument("--variants", default="plain", help="whole: start-up variants to time "
                   f"against each other, interleaved ({', '.join(VARIANTS)}; default plain)")
    p.add_argument("--breakdown", action="store_true", help="also time the phases")
    p.add_argument("--prelude", default="", help="whole: Python run in the command's process "
                   "before it starts (an A/B switch, e.g. 'from kdalab.studies import plan; "
                   "plan.DEFAULT_MAX_BATCH[True] = 1024')")
    p.add_argument("--json", help="whole: write the result as JSON (docs/BENCHMARKS.md)")
    p.add_argument("--gpus", default="1,2", help="ray: cluster sizes to time (GPUs, or CPUs "
                   "with --device cpu)")
    p.add_argument("--out", help="keep the stores here (default: a temporary folder)")
    args = p.parse_args()
    whole(args) if args.mode == "whole" else ray_throughput(args)


if __name__ == "__main__":
    main()
