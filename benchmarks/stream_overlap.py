"""Stage 1 streamed beside the Gluon stage 2 (KernelConfig.stage1, chunk_prepare's STREAM).

Measured: the streamed call against stage 1 first under CUDA-graph replay, with optional lag bounds
(chunk_prepare.STREAM_LAG), and one replay of each under torch.profiler (each kernel's start and
duration); ``--check``: the streamed call's outputs against stage 1 first, bit for bit, with stage
1 launched before, and after a host delay. ``--page``: the BENCHMARKS page from the raw logs.

    PYTHONPATH=src:. python benchmarks/stream_overlap.py [--check]      # on the GPU
    python benchmarks/stream_overlap.py --page benchmarks/results/stream_h100.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

RAW = Path(__file__).parent / "results" / "raw" / "logs"


def _graph(fn):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _timeline(prof):
    import torch

    ev = sorted([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA],
                key=lambda e: e.time_range.start)
    t0 = ev[0].time_range.start
    return "; ".join(f"{e.name[:26]} @{(e.time_range.start - t0) / 1e3:.3f}"
                     f"+{e.time_range.elapsed_us() / 1e3:.3f}" for e in ev)


def measure():
    import dataclasses

    import torch
    import triton
    from tests.test_kernels import _inputs
    from torch.profiler import ProfilerActivity, profile

    from kdalab.kernels import KernelConfig, chunk_kda_fwd, chunk_prepare

    G = KernelConfig(dot="fp16", segment_chunks=0, block_v=64, num_warps=4, stage2="gluon")
    F = dataclasses.replace(G, stage1="first")
    for B, T, H in [(1, 8192, 64), (2, 16384, 16), (1, 8192, 32)]:
        q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", B, T, H, 128, device="cuda")
        args = dict(A_log=A_log, dt_bias=dt_bias, output_final_state=True)
        res, outs = {}, {}
        for name, cfg, lag in [("first", F, 0), ("lag0", G, 0), ("lag4", G, 4), ("lag8", G, 8),
                               ("lag16", G, 16), ("lag32", G, 32), ("first2", F, 0)]:
            chunk_prepare.STREAM_LAG = lag
            gr, out = _graph(lambda cfg=cfg: chunk_kda_fwd(q, k, v, g, beta, **args, config=cfg))
            res[name] = triton.testing.do_bench(gr.replay, warmup=25, rep=300,
                                                return_mode="median")
            gr.replay()
            torch.cuda.synchronize()
            outs[name] = out[0].clone()
            if name in ("first", "lag0", "lag16"):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    gr.replay()
                    torch.cuda.synchronize()
                print(f"  T{T} B{B} H{H} {name}: {_timeline(prof)}", flush=True)
        same = {n: bool(torch.equal(o, outs["first"])) for n, o in outs.items()}
        print(f"B{B} T{T} H{H} graph ms:", {n: round(v, 4) for n, v in res.items()},
              "same bits:", same, flush=True)
    chunk_prepare.STREAM_LAG = 0


def _geomean(xs):
    import math

    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def page(path):
    """The page: one row a shape, streamed over first under graph replay, the profile's
    stage times and the lag bounds' times beside (raw logs of 603e656, d3d1d77, d0d6ab7)."""
    log = (RAW / "stream_overlap_603e656_h100.log").read_text()
    prof = {}
    for m in re.finditer(r"T(\d+) B(\d+) H(\d+) (first|lag0|lag16): (.*)", log):
        parts = dict((n.split()[0], float(d)) for n, d in
                     re.findall(r"(chunk_kda_\w+) @[\d.]+\+([\d.]+)", m.group(5)))
        prof[(m.group(1), m.group(2), m.group(3), m.group(4))] = parts
    rows = []
    for m in re.finditer(r"B(\d+) T(\d+) H(\d+) graph ms: (\{.*?\}) same bits: (\{.*?\})", log):
        B, T, H = m.group(1), m.group(2), m.group(3)
        ms, same = ast.literal_eval(m.group(4)), ast.literal_eval(m.group(5))
        p_first, p_lag0 = prof[(T, B, H, "first")], prof[(T, B, H, "lag0")]
        s1, s2 = "chunk_kda_prepare_kernel", "chunk_kda_recurrent_ws_ker"
        rows.append(dict(
            target=f"B{B}_T{T}_H{H}: stage 1 beside the Gluon stage 2 / stage 1 first, GPU time "
                   f"(CUDA-graph replay)", value=round(ms["lag0"] / ms["first"], 3), unit="x",
            note=(f"streamed {ms['lag0']:.3f} ms, first {ms['first']:.3f} (again "
                  f"{ms['first2']:.3f}); one replay profiled: stage 1 {p_lag0[s1]:.3f} ms "
                  f"beside stage 2 against {p_first[s1]:.3f} alone, stage 2 {p_lag0[s2]:.3f} "
                  f"against {p_first[s2]:.3f}; stage 1 held at most 4, 8, 16, 32 chunks ahead of "
                  f"stage 2 (STREAM_LAG, to keep its products in L2): {ms['lag4']:.3f}, "
                  f"{ms['lag8']:.3f}, {ms['lag16']:.3f}, {ms['lag32']:.3f} ms; outputs the "
                  f"same bits in all {len(same)}: {all(same.values())}")))
    grid = json.loads((RAW / "grid_stream_d3d1d77_h100_b.json").read_text())["grid"]
    ratios = [r["kdalab_graph_ms"] / r["kdalab_alt_graph_ms"] for r in grid]
    rows.append(dict(
        target=f"Gluon serial pass, stage 1 beside / first, GPU time (graph replay): geometric "
               f"mean over {len(grid)} shapes", value=round(_geomean(ratios), 3), unit="x",
        note="; ".join(f"{r['shape']} {r['kdalab_graph_ms']:.3f} against "
                       f"{r['kdalab_alt_graph_ms']:.3f} ms (eager, host time included, "
                       f"{r['kdalab_ms']:.3f} against {r['kdalab_alt_ms']:.3f})" for r in grid)))
    dbg = (RAW / "stream_dbg_d3d1d77_h100.log").read_text()
    pat = r"(chunk_kda_\w+) @[\d.]+ \+([\d.]+)"
    t = {n: {k.split()[0]: float(d) for k, d in re.findall(pat, line)}
         for n, line in re.findall(r"T8192 H96 (streamed|first): (.*)", dbg)}
    ex = json.loads((RAW / "explore_stream_d0d6ab7_h100.json").read_text())
    h96 = next(r for r in ex["explore"] if r["shape"] == "T8192_H96")["ms"]
    rows.append(dict(
        target="T8192_H96 (192 programs: two an SM on some): stage 1 beside / first, eager",
        value=round(h96["serial_gluon"] / h96["serial_gluon_first"], 3), unit="x",
        note=(f"{h96['serial_gluon']:.3f} against {h96['serial_gluon_first']:.3f} ms (explore at "
              f"d0d6ab7); one call profiled (d3d1d77): stage 1 "
              f"{t['streamed']['chunk_kda_prepare_kernel']:.3f} ms beside against "
              f"{t['first']['chunk_kda_prepare_kernel']:.3f} alone, stage 2 "
              f"{t['streamed']['chunk_kda_recurrent_ws_kerne']:.3f} against "
              f"{t['first']['chunk_kda_recurrent_ws_kerne']:.3f}")))
    doc = dict(benchmark="stream_h100", date="2026-12-05T15:45Z",
               device="NVIDIA H100 80GB HBM3 (lent for nvidia-h200)", commit="603e656",
               command=("PYTHONPATH=src:. python benchmarks/stream_overlap.py (run as "
                        "dbg/lag.py at 603e656; raw/logs/stream_overlap_603e656_h100.log), "
                        "python benchmarks/bench_kernel.py --grid --no-peers --shapes "
                        "T8192_H64,T2048_H32,T1024_H16,B2_T16384_H16,T4096_H8_state --base "
                        "stage2=gluon,segment_chunks=0,block_v=64,num_warps=4 --alt stage1=first "
                        "at d3d1d77 (raw/logs/grid_stream_d3d1d77_h100_b.json), --explore at "
                        "d0d6ab7 (raw/logs/explore_stream_d0d6ab7_h100.json) and the --check "
                        "part's profile at d3d1d77 (raw/logs/stream_dbg_d3d1d77_h100.log); this "
                        "page by python benchmarks/stream_overlap.py --page PATH"),
               rows=rows)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", default=None, metavar="PATH")
    args = ap.parse_args()
    if args.page:
        page(args.page)
    else:
        measure()


if __name__ == "__main__":
    main()
