"""The gate modes' prices on the issue-11 grid (H200, one process, interleaved rounds):
kdalab's prefill with the lower-bounded gate (the baseline), the unbounded softplus gate
(``lower_bound=None``) on the same raw inputs (model-like: K3-like decay), a precomputed
log-decay (``gate="log_decay"``, the bounded gate's g formed once outside the timing, in fp32
and in bf16), and
fla's ``chunk_kda`` on the same unbounded inputs (its own Triton path, no safe gate).

    python benchmarks/bench_gates.py [--shapes a,b] [--fla-shapes a,b] [--rounds 3]
        [--kernels] [--json out.json]
    python benchmarks/bench_gates.py --from-log LOG[:fla|:before]... --json out.json \
        --device D --date T --commit C

fla autotunes each new shape and gate (30-90 s, outside the timing): ``--fla-shapes`` limits
it to some shapes. ``--kernels``: each kdalab variant's GPU time by kernel as well. Rows go to
stdout as JSON lines; ``--json`` writes the BENCHMARKS.md rows (geometric means) and every
shape's figures to ``raw/`` beside it; ``--from-log`` writes them from earlier runs' logs.
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
    write_raw,
)

from kdalab import peers  # noqa: E402
from kdalab.kernels import KernelConfig, chunk_kda_fwd  # noqa: E402

D = 128


def bounded_log_decay(x):
    """The lower-bounded gate's log-decay per channel, fp32: lb·sigmoid(exp(A_log)·(g + dt))."""
    H, K = x["g"].shape[-2:]
    pre = torch.exp(x["A_log"].float()).view(H, 1) * (
        x["g"].float() + x["dt_bias"].float().view(H, K))
    return LOWER_BOUND * torch.sigmoid(pre)


def runners(x, config=KernelConfig()):
    """Each variant's call on the inputs ``x``; kdalab's under ``config``."""
    common = dict(cu_seqlens=x["cu"], initial_state=x["h0"], output_final_state=x["state"],
                  state_layout="VK", config=config)
    gd = bounded_log_decay(x)
    gd16 = gd.to(torch.bfloat16)

    def kd(lb, **kw):
        return lambda: chunk_kda_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                     lower_bound=lb, **common, **kw)

    return {"bounded": kd(LOWER_BOUND, A_log=x["A_log"], dt_bias=x["dt_bias"]),
            "unbounded": kd(None, A_log=x["A_log"], dt_bias=x["dt_bias"]),
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


def breakdown(x, row):
    """Each kdalab prefill's GPU time by kernel (torch.profiler), and the bounded and the
    unbounded one's with tf32 recurrent products (no fp16 guard): where a gate's price is
    paid (the eager times of short calls are the host's)."""
    fns = {n: fn for n, fn in runners(x).items() if not n.startswith("fla")}
    tf32 = runners(x, KernelConfig(dot="tf32"))
    fns.update({f"{n}_tf32": tf32[n] for n in ("bounded", "unbounded")})
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
    for n in ("unbounded", "log_decay", "log_decay_bf16"):
        if b and f"{n}_ms" in row:
            row[f"{n}_over_bounded"] = row[f"{n}_ms"] / b
    if "fla_unbounded_ms" in row and "unbounded_ms" in row:
        row["vs_fla_unbounded"] = row["fla_unbounded_ms"] / row["unbounded_ms"]
    if kernels:
        breakdown(x, row)
    print(json.dumps(row), flush=True)
    return row


#: the kernels whose GPU time the page splits out: stage 1 and stage 2
PREP = "chunk_kda_prepare_kernel"
REC = "chunk_kda_recurrent_kernel"
#: the page's ratios (eager wall time, interleaved rounds): key, label
RATIOS = (("unbounded_over_bounded", "unbounded gate / bounded gate"),
          ("unbounded_inline_over_bounded", "unbounded gate, wide chunks in a branch of the one "
           "launch (removed) / bounded gate"),
          ("unbounded_capped_over_bounded", "unbounded gate, two launches capped at 168 "
           "registers (removed) / bounded gate"),
          ("log_decay_over_bounded", "precomputed log-decay (fp32) / fused gate"),
          ("log_decay_bf16_over_bounded", "precomputed log-decay (bf16) / fused gate"),
          ("vs_fla_unbounded", "fla / kdalab on unbounded inputs"))
#: stage 1's variants measured against the two launches and removed (0a42f8f's log): the
#: wide chunks' per-pair path in a branch of one launch; the two launches under a register
#: cap of 168
REMOVED = ("unbounded_inline", "unbounded_capped")
#: the GPU-time ratios to the bounded gate (``--kernels``), and stage 1's alone
GPU_RATIOS = ("unbounded", "unbounded_inline", "unbounded_capped", "log_decay",
              "log_decay_bf16")


def _range(vals, names):
    lo, hi = min(range(len(vals)), key=vals.__getitem__), max(range(len(vals)),
                                                              key=vals.__getitem__)
    return (f"{len(vals)} shapes; range {vals[lo]:.3f} ({names[lo]}) - {vals[hi]:.3f} "
            f"({names[hi]})")


def to_json_rows(rows):
    """The page's rows: geometric means over the shapes (each with its range); every shape's
    figures go to the raw file (``shape_rows``)."""
    out = []
    for key, label in RATIOS:
        got = [(r[key], r["shape"]) for r in rows if key in r]
        if got:
            vals, names = zip(*got, strict=True)
            out.append(dict(target=f"gates: {label}, geometric mean", unit="x",
                            value=round(geomean(vals), 3), note=_range(vals, names)))
    for n in GPU_RATIOS:
        got = [(r[f"{n}_gpu_ms"] / r["bounded_gpu_ms"], r["shape"]) for r in rows
               if f"{n}_gpu_ms" in r and "bounded_gpu_ms" in r]
        if got:
            vals, names = zip(*got, strict=True)
            note = _range(vals, names)
            prep = [r[f"{n}_kernels"].get(PREP, 0) / r["bounded_kernels"][PREP]
                    for r in rows if f"{n}_kernels" in r and PREP in r["bounded_kernels"]]
            if prep:
                note += f"; stage 1 alone {geomean(prep):.3f}x ({min(prep):.3f}-{max(prep):.3f})"
            gone = " (removed)" if n in REMOVED else ""
            out.append(dict(target=f"gates: {n}{gone} / bounded, GPU time (profiler), "
                            "geometric mean", unit="x", value=round(geomean(vals), 3),
                            note=note))
    # an earlier kernel's split by kernel (LOG:before): where the unbounded gate's price was
    got = [r for r in rows if "before_unbounded_inline_kernels" in r
           and "before_bounded_kernels" in r]
    if got:
        b, u = "before_bounded", "before_unbounded_inline"
        whole = [r[f"{u}_gpu_ms"] / r[f"{b}_gpu_ms"] for r in got]
        parts = {k: [r[f"{u}_kernels"].get(k, 0) / r[f"{b}_kernels"][k] for r in got]
                 for k in (PREP, REC)}
        out.append(dict(
            target="gates: unbounded / bounded before the softplus change (one launch, fp32 "
                   "log), GPU time, geometric mean", unit="x", value=round(geomean(whole), 3),
            note=(f"{len(got)} shapes; stage 1 alone {geomean(parts[PREP]):.3f}x "
                  f"({min(parts[PREP]):.3f}-{max(parts[PREP]):.3f}), stage 2 alone "
                  f"{geomean(parts[REC]):.3f}x ({min(parts[REC]):.3f}-{max(parts[REC]):.3f})")))
    return out



def shape_rows(rows):
    """Every shape's figures (the raw file): eager ms of each variant, and with --kernels
    each one's GPU time by kernel."""
    out = []
    for r in rows:
        out.append(dict(target=f"gates {r['shape']}: prefill times", unit="ms",
                        value=round(r.get("bounded_ms", float("nan")), 4),
                        note=", ".join(f"{k[:-3]} {v:.4f}" for k, v in r.items()
                                       if k.endswith("_ms") and not k.endswith("_gpu_ms"))))
        if "bounded_kernels" in r:
            parts = []
            for n in [k[:-len("_kernels")] for k in r if k.endswith("_kernels")]:
                ks = ", ".join(f"{k.split('(')[0].replace('_kernel', '')} {v:.3f}"
                               for k, v in r[f"{n}_kernels"].items() if v >= 0.001)
                parts.append(f"{n} {r[f'{n}_gpu_ms']:.3f} ({ks})")
            out.append(dict(target=f"gates {r['shape']}: GPU time by kernel (profiler)",
                            unit="x", value=round(r["unbounded_gpu_ms"] / r["bounded_gpu_ms"], 3),
                            note="; ".join(parts)))
    return out


def read_logs(paths):
    """The shape rows of earlier runs' logs (their JSON lines), merged by shape in order: a
    later run's figures replace an earlier one's, its other figures stay. ``LOG:fla`` takes
    only fla's figures from LOG (its ms and its ratio to kdalab in that run); ``LOG:before``
    takes kdalab's as an earlier kernel's, each key prefixed ``before_``."""
    merged = {}
    for path in paths:
        path, _, only = path.partition(":")
        with open(path) as fh:
            for line in fh:
                if line.startswith('{"shape"'):
                    r = json.loads(line)
                    if only == "fla":
                        r = {k: v for k, v in r.items()
                             if k == "shape" or k.startswith(("fla", "vs_fla"))}
                    elif only == "before":
                        r = {"shape": r["shape"], **{f"before_{k}": v for k, v in r.items()
                                                     if not k.startswith(("shape", "fla",
                                                                          "vs_fla"))}}
                    merged.setdefault(r["shape"], {}).update(r)
    return list(merged.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--fla-shapes", default=None, help="shapes that also time fla (all: every)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernels", action="store_true",
                    help="also each prefill's GPU time by kernel (bounded, unbounded; fp16 "
                         "and tf32 products)")
    ap.add_argument("--from-log", nargs="+", default=None, metavar="LOG",
                    help="no run: the JSON from earlier runs' logs (a later log's figures "
                         "replace an earlier one's; with --device, --date, --commit)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--date", default=None)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    if args.from_log:
        if not (args.json and args.device and args.date and args.commit):
            ap.error("--from-log needs --json, --device, --date and --commit")
        rows = read_logs(args.from_log)
        write(args.json, rows, args.device, args.date, args.commit,
              "python benchmarks/bench_gates.py " + " ".join(sys.argv[1:]))
        return
    names = args.shapes.split(",") if args.shapes else [s[0] for s in GRID]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}")
    fla_ok = peers.available("fla") is None
    fla_names = set(names if args.fla_shapes in (None, "all") else args.fla_shapes.split(","))
    rows = [rows_for(n, args.rounds, fla_ok and n in fla_names, args.kernels) for n in names]
    for row in to_json_rows(rows):
        print(f"{row['target']}: {row['value']} ({row['note']})")
    if args.json:
        i = info()
        write(args.json, rows, f"{i['device']}, torch {i['torch']}, triton {i['triton']}, "
                               f"fla {i.get('fla', 'n/a')}", i["date"],
              os.environ.get("KDALAB_COMMIT", "unknown"),
              "python benchmarks/bench_gates.py " + " ".join(sys.argv[1:]))


def write(path, rows, device, date, commit, command):
    """The page's JSON at ``path`` and every shape's figures in ``raw/`` beside it."""
    doc = dict(benchmark="gates_h200", device=device, date=date, commit=commit,
               command=command, rows=to_json_rows(rows))
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    write_raw(path, dict(doc, rows=shape_rows(rows), measured=rows))


if __name__ == "__main__":
    main()
