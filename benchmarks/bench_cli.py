#!/usr/bin/env python3
"""How fast the command line answers what needs no computation: --help, --version, python -m
kdalab, a subcommand's help and a mistake, against starting Python and importing torch, timed in
the same run (each a fresh process, median of --repeats).

    python benchmarks/bench_cli.py [--repeats 7]

The target (issue 13): --version, python -m kdalab and --help in <= 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(__file__), "..")
CASES = [
    ("python -c pass (baseline)", ["-c", "pass"]),
    ("python -c 'import torch' (baseline)", ["-c", "import torch"]),
    ("kdalab --version", ["-m", "kdalab", "--version"]),
    ("python -m kdalab (help)", ["-m", "kdalab"]),
    ("kdalab --help", ["-m", "kdalab", "--help"]),
    ("kdalab sweep --help", ["-m", "kdalab", "sweep", "--help"]),
    ("kdalab reproduce --seeds -1 (a mistake)", ["-m", "kdalab", "reproduce", "--seeds", "-1"]),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    times: dict[str, list[float]] = {name: [] for name, _ in CASES}
    for _ in range(args.repeats):  # interleaved, so that a busy moment hits every case alike
        for name, argv in CASES:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, *argv], env=env, capture_output=True, check=False)
            times[name].append(time.perf_counter() - t0)
    torch_s = statistics.median(times[CASES[1][0]])
    print(f"{'command':<42} {'median s':>9} {'min s':>7} {'/ import torch':>15}")
    for name, _ in CASES:
        med = statistics.median(times[name])
        print(f"{name:<42} {med:>9.3f} {min(times[name]):>7.3f} {med / torch_s:>15.2f}")
    print(f"(load average at the end: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
