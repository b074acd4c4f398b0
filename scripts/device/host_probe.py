#!/usr/bin/env python3
"""One-off (session of 2026-12-01, 22:53-): is kdalab's prefill on many short sequences bound
by the host when it reads slow? For each of bench_decode's many-short shapes, in 3
interleaved rounds: the eager call (do_bench, median), the host's time to issue one call
(100 calls back to back, no synchronization, the queue never full), and the same call
replayed from a CUDA graph (the GPU's time alone); FlashKDA's eager call beside them.

    python scripts/device/host_probe.py --json $OUT/host_probe.json
    python scripts/device/host_probe.py --profile   # where kdalab's host time goes (cProfile)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks"))
import bench_decode  # noqa: E402
from bench_decode import SHORT, make_inputs, run_kdalab  # noqa: E402


def host_us(fn, n=100):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def profile(n=300):
    """cProfile of ``n`` kdalab calls on each many-short shape (after warm-up): the functions
    with the most time of their own, and with the most time under them."""
    import cProfile
    import pstats

    for shape in SHORT:
        x = make_inputs(shape)
        run_kdalab(x)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(n):
            run_kdalab(x)
        prof.disable()
        host = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"== {shape[0]}: {host:.0f} us a call under cProfile", flush=True)
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(14)
        st.sort_stats("cumulative").print_stats(22)
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.profile:
        return profile()
    flashkda = bench_decode.load_flashkda()
    rows = []
    for shape in SHORT:
        x = make_inputs(shape)
        fns = {"kdalab": lambda: run_kdalab(x), "flashkda": lambda: flashkda(x)}
        try:
            fns["kdalab_graph"] = graphed(fns["kdalab"])
        except Exception as exc:  # noqa: BLE001 - report it and time the rest
            print(json.dumps(dict(shape=shape[0], graph_error=str(exc)[:200])), flush=True)
        for fn in fns.values():
            fn()
        ms = {k: [] for k in fns}
        host = {"kdalab": [], "flashkda": []}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                ms[k].append(triton.testing.do_bench(fn, warmup=5, rep=40,
                                                     return_mode="median"))
            for k in host:
                host[k].append(host_us(fns[k]))
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        row = dict(shape=shape[0], **{f"{k}_ms": med(v) for k, v in ms.items()},
                   **{f"{k}_host_us": med(v) for k, v in host.items()},
                   all_ms=ms, all_host_us=host)
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    with open(args.json, "w") as fh:
        json.dump(dict(rows=rows, date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())), fh,
                  indent=1)


if __name__ == "__main__":
    main()
