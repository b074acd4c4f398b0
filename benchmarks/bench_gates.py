"""The gate modes' prices on the issue-11 grid (H200, one process, interleaved rounds):
kdalab's prefill with the lower-bounded gate (the baseline), the unbounded softplus gate
(``lower_bound=None``) on the same raw inputs (model-like: K3-like decay), a precomputed
log-decay (``gate="log_decay"``, the bounded gate's g formed once outside the timing, in fp32
and in bf16), and
fla's ``chunk_kda`` on the same unbounded inputs (its own Triton path, no safe gate).

    python benchmarks/bench_gates.py [--shapes a,b] [--fla-shapes a,b] [--rounds 3]
        [--json out.json]

fla autotunes each new shape and gate (30-90 s, outside the timing): ``--fla-shapes`` limits
it to some shapes. Rows go to stdout as JSON lines; ``--json`` writes the BENCHMARKS.md rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel import (  # noqa: E402
    GRID,
    LOWER_BOUND,
    SHAPES,
    geomean,
    info,
    kernel_time,
    make_inputs,
)

from kdalab import peers  # noqa: E402
from kdalab.kernels import KernelConfig, chunk_kda_fwd, chunk_prepare  # noqa: E402

D = 128


def bounded_log_decay(x):
    """The lower-bounded gate's log-decay per channel, fp32: lb·sigmoid(exp(A_log)·(g + dt))."""
    H, K = x["g"].shape[-2:]
    pre = torch.exp(x["A_log"].float()).view(H, 1) * (
        x["g"].float() + x["dt_bias"].float().view(H, K))
    return LOWER_BOUND * torch.sigmoid(pre)


def runners(x):
    common = dict(cu_seqlens=x["cu"], initial_state=x["h0"], output_final_state=x["state"],
                  state_layout="VK")
    gd = bounded_log_decay(x)
    gd16 = gd.to(torch.bfloat16)

    def kd(lb, **kw):
        return lambda: chunk_kda_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                     lower_bound=lb, **common, **kw)

    return {"bounded": kd(LOWER_BOUND, A_log=x["A_log"], dt_bias=x["dt_bias"]),
            "unbounded": kd(None, A_log=x["A_log"], dt_bias=x["dt_bias"]),
            # stage 1's wide chunks: per pair in a branch of the one launch, as before
            "unbounded_inline": wide_path(kd(None, A_log=x["A_log"], dt_bias=x["dt_bias"]),
                                          mode="inline"),
            "unbounded_nocap": wide_path(kd(None, A_log=x["A_log"], dt_bias=x["dt_bias"]),
                                         cap=False),
            "log_decay": lambda: chunk_kda_fwd(x["q"], x["k"], x["v"], gd, x["beta"],
                                               gate="log_decay", lower_bound=LOWER_BOUND,
                                               **common),
            # the same g in bf16: the fp32 one reads 256 more bytes a token-head (K 128)
            "log_decay_bf16": lambda: chunk_kda_fwd(x["q"], x["k"], x["v"], gd16, x["beta"],
                                                    gate="log_decay", lower_bound=LOWER_BOUND,
                                                    **common),
            "fla_unbounded": lambda: peers.fla_chunk_kda(
                x["q"], x["k"], x["v"], x["g"], x["beta"], scale=D ** -0.5,
                initial_state=x["h0"], output_final_state=x["state"], A_log=x["A_log"],
                dt_bias=x["dt_bias"], lower_bound=None, cu_seqlens=x["cu"],
                state_v_first=True)}


def wide_path(fn, **mode):
    """``fn`` with stage 1's wide-chunk path set (``chunk_prepare.WIDE_PATH``) for the call."""
    def run():
        saved = dict(chunk_prepare.WIDE_PATH)
        chunk_prepare.WIDE_PATH.update(mode)
        try:
            return fn()
        finally:
            chunk_prepare.WIDE_PATH.update(saved)
    return run


def breakdown(x, row):
    """Each kdalab prefill's GPU time by kernel (torch.profiler), and the bounded and the
    unbounded one's with tf32 recurrent products (no fp16 guard): where a gate's price is
    paid (the eager times of short calls are the host's)."""
    common = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu"],
                  initial_state=x["h0"], output_final_state=x["state"], state_layout="VK")
    fns = {n: fn for n, fn in runners(x).items() if not n.startswith("fla")}
    for n, lb in (("bounded", LOWER_BOUND), ("unbounded", None)):
        fns[f"{n}_tf32"] = lambda lb=lb: chunk_kda_fwd(
            x["q"], x["k"], x["v"], x["g"], x["beta"], lower_bound=lb,
            config=KernelConfig(dot="tf32"), **common)
    for n, fn in fns.items():
        total, per = kernel_time(fn)
        row[f"{n}_gpu_ms"] = round(total, 4)
        row[f"{n}_kernels"] = {k: round(v, 4) for k, v in per.items()}


def rows_for(name, rounds, with_fla, kernels=False):
    x = make_inputs(SHAPES[name])
    fns = runners(x)
    if not with_fla:
        fns.pop("fla_unbounded")
    row = dict(shape=name)
    t0 = time.time()
    for n, fn in list(fns.items()):  # compile / autotune outside the timing
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported, the others still timed
            row[f"{n}_error"] = f"{type(exc).__name__}: {exc}"[:200]
            fns.pop(n)
    row["warm_s"] = round(time.time() - t0, 1)
    times = {n: [] for n in fns}
    for _ in range(rounds):
        for n, fn in fns.items():
            times[n].append(triton.testing.do_bench(fn, warmup=25, rep=200,
                                                    return_mode="median"))
    for n, t in times.items():
        row[f"{n}_ms"] = sorted(t)[len(t) // 2]
    b = row.get("bounded_ms")
    for n in ("unbounded", "unbounded_inline", "unbounded_nocap", "log_decay",
              "log_decay_bf16"):
        if b and f"{n}_ms" in row:
            row[f"{n}_over_bounded"] = row[f"{n}_ms"] / b
    if "fla_unbounded_ms" in row and "unbounded_ms" in row:
        row["vs_fla_unbounded"] = row["fla_unbounded_ms"] / row["unbounded_ms"]
    if kernels:
        breakdown(x, row)
    print(json.dumps(row), flush=True)
    return row


def to_json_rows(rows):
    out = []
    for key, label in (("unbounded_over_bounded", "unbounded gate / bounded gate"),
                       ("unbounded_inline_over_bounded", "unbounded gate, wide chunks in a "
                        "branch (before) / bounded gate"),
                       ("unbounded_nocap_over_bounded", "unbounded gate, stage 1 uncapped / "
                        "bounded gate"),
                       ("log_decay_over_bounded", "precomputed log-decay (fp32) / fused gate"),
                       ("log_decay_bf16_over_bounded", "precomputed log-decay (bf16) / fused gate"),
                       ("vs_fla_unbounded", "fla / kdalab on unbounded inputs")):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out.append(dict(target=f"gates: {label}, geometric mean", unit="x",
                            value=round(geomean(vals), 3),
                            note=f"{len(vals)} shapes; range {min(vals):.3f}-{max(vals):.3f}"))
    for n in ("unbounded", "unbounded_inline", "unbounded_nocap", "log_decay",
              "log_decay_bf16"):
        vals = [r[f"{n}_gpu_ms"] / r["bounded_gpu_ms"] for r in rows
                if f"{n}_gpu_ms" in r and "bounded_gpu_ms" in r]
        if vals:
            out.append(dict(target=f"gates: {n} / bounded, GPU time (profiler), geometric mean",
                            unit="x", value=round(geomean(vals), 3),
                            note=f"{len(vals)} shapes; range {min(vals):.3f}-{max(vals):.3f}"))
    for r in rows:
        if "bounded_kernels" in r:  # the price by kernel: where the unbounded gate pays it
            parts = []
            for n in [k[:-len("_kernels")] for k in r if k.endswith("_kernels")]:
                ks = ", ".join(f"{k.split('(')[0].replace('_kernel', '')} {v:.3f}"
                               for k, v in r[f"{n}_kernels"].items() if v >= 0.001)
                parts.append(f"{n} {r[f'{n}_gpu_ms']:.3f} ({ks})")
            out.append(dict(target=f"gates {r['shape']}: unbounded / bounded GPU time "
                            "(profiler)", unit="x",
                            value=round(r["unbounded_gpu_ms"] / r["bounded_gpu_ms"], 3),
                            note="; ".join(parts)))
        out.append(dict(target=f"gates {r['shape']}: bounded / unbounded / log_decay / fla "
                        "unbounded", unit="ms", value=round(r.get("bounded_ms", float("nan")), 4),
                        note=", ".join(f"{n} {r[f'{n}_ms']:.4f}" for n in
                                       ("unbounded", "unbounded_inline", "unbounded_nocap",
                                        "log_decay", "log_decay_bf16", "fla_unbounded")
                                       if f"{n}_ms" in r)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--fla-shapes", default=None, help="shapes that also time fla (all: every)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernels", action="store_true",
                    help="also each prefill's GPU time by kernel (bounded, unbounded; fp16 "
                         "and tf32 products)")
    args = ap.parse_args()
    names = args.shapes.split(",") if args.shapes else [s[0] for s in GRID]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}")
    fla_ok = peers.available("fla") is None
    fla_names = set(names if args.fla_shapes in (None, "all") else args.fla_shapes.split(","))
    rows = [rows_for(n, args.rounds, fla_ok and n in fla_names, args.kernels) for n in names]
    for key in ("unbounded_over_bounded", "unbounded_inline_over_bounded",
                "unbounded_nocap_over_bounded", "log_decay_over_bounded",
                "log_decay_bf16_over_bounded", "vs_fla_unbounded"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            print(f"{key}: geometric mean {geomean(vals):.3f} over {len(vals)} shapes "
                  f"(range {min(vals):.3f}-{max(vals):.3f})")
    if args.json:
        i = info()
        doc = dict(benchmark="gates_h200",
                   device=f"{i['device']}, torch {i['torch']}, triton {i['triton']}, "
                          f"fla {i.get('fla', 'n/a')}",
                   date=i["date"], commit=os.environ.get("KDALAB_COMMIT", "unknown"),
                   command="python benchmarks/bench_gates.py " + " ".join(sys.argv[1:]),
                   rows=to_json_rows(rows))
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
