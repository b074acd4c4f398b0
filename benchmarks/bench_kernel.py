"""Speed and accuracy of kdalab.kernels.chunk_kda_fwd against its peers, in one process.

Peers: fla's ``chunk_kda`` (fla-core; its own Triton path through ``kdalab.peers``, so it never
hands the call to FlashKDA) with the safe gate, lower bound -5, the gate (A_log, dt_bias),
L2 norm and β sigmoid in its kernel; FlashKDA's ``flash_kda.fwd`` (built from its source, see
scripts/device/peers.sh). A missing peer is reported as skipped. Every shape is bf16, K = V
= 128, the ``model_like`` preset of kdalab.inputs.sequences (normal q, k, v, g, β logits;
A_log, dt_bias uniform), drawn on the CPU and moved to the GPU.

    python benchmarks/bench_kernel.py --grid [--shapes a,b | --extra] [--json out.json]
        the issue's grid (or, with --extra, the shapes beyond it): median ms
        (triton.testing.do_bench) of kdalab, fla, FlashKDA, each ratio against the best peer,
        the geometric mean
    python benchmarks/bench_kernel.py --explore [--shapes a,b]
        kdalab's launch choices per shape (the plan, serial, segment lengths, stage-1 and
        stage-2 launch shapes), and the parts (stage 1, the passes, the combine) to calibrate
        the plan's cost model (kernels/plan.py)
    python benchmarks/bench_kernel.py --overhead
        host time per call, GPU time per call (CUDA graph replay), and do_bench, at short
        shapes: where a short call's time goes
    python benchmarks/bench_kernel.py --accuracy
        output and final-state error against the fp64 token recurrence, serial and
        sequence-parallel paths, and fla's, on model-like and weak-decay correlated inputs
    python benchmarks/bench_kernel.py --warm-peers
        run each peer once per grid shape (fla autotunes each new head count for 30-90 s)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch
import triton

from kdalab import peers
from kdalab.arith import rel_rmse
from kdalab.inputs.sequences import draw, preset
from kdalab.kernels import KernelConfig, chunk_kda_fwd

LOWER_BOUND = -5.0
D = 128

# (name, B, T, H, varlen lengths or None, with initial and final state)
GRID = [
    ("T1024_H16", 1, 1024, 16, None, False),
    ("B8_T4096_H32_state", 8, 4096, 32, None, True),
    ("T8192_H64", 1, 8192, 64, None, False),
    ("T8192_H96", 1, 8192, 96, None, False),
    ("varlen6_H64", 1, 8192, 64, [1300, 547, 2048, 963, 271, 3063], False),
    ("varlen1024x8_H64", 1, 8192, 64, [1024] * 8, False),
    ("T32768_H32", 1, 32768, 32, None, False),
    ("T65536_H16", 1, 65536, 16, None, False),
    ("T131072_H8", 1, 131072, 8, None, False),
    ("T524288_H4", 1, 524288, 4, None, False),
]
#: beyond the grid (``--extra``): shapes the plan's constants were not measured on — short
#: prompts with few heads, many short sequences, a mixed varlen batch, longer prompts
EXTRA = [
    ("T2048_H32", 1, 2048, 32, None, False),
    ("T4096_H8_state", 1, 4096, 8, None, True),
    ("B16_T1024_H32", 16, 1024, 32, None, False),
    ("B2_T16384_H16", 2, 16384, 16, None, False),
    ("varlen512x16_H64", 1, 8192, 64, [512] * 16, False),
    ("varlen_mixed_H16", 1, 36638, 16, [37, 8000, 1, 600, 25000, 3000], False),
    ("T262144_H8", 1, 262144, 8, None, False),
]
SHAPES = {s[0]: s for s in GRID + EXTRA}


def make_inputs(shape, seed=0, device="cuda"):
    """The ``model_like`` preset of kdalab.inputs.sequences at ``shape``, drawn on the CPU and
    moved to ``device``. These inputs changed from the earlier draws on the CUDA generator: same
    distribution, other bits, so timings from before are comparable but not of the same
    inputs. The state is N(0, 1) in [N, H, V, K] (every kernel's VK layout; K = V here)."""
    name, B, T, H, lens, state = shape
    spec = preset("model_like", T=T, batch=B, seqlens=None if lens is None else tuple(lens),
                  heads=H, K=D, V=D, lower_bound=LOWER_BOUND,
                  initial_state="fp32" if state else "none")
    x = draw(spec, seed, device)
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
                dt_bias=x["dt_bias"], cu=x["cu_seqlens"], h0=x["initial_state"], state=state)


def run_kdalab(x, config=KernelConfig(), fwd=chunk_kda_fwd):
    """``fwd`` (kdalab's, or an earlier commit's: ``load_baseline``, with its own default
    config when ``config`` is None) on this benchmark's inputs."""
    extra = {} if config is None else dict(config=config)
    return fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
               dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND, cu_seqlens=x["cu"],
               initial_state=x["h0"], output_final_state=x["state"], state_layout="VK",
               **extra)


def _load(name):
    """A peer's call on this benchmark's inputs (``kdalab.peers``: one home and one set of
    guards for fla and FlashKDA), or None with a line saying why it is skipped."""
    why = peers.available(name)
    if why is not None:
        print(json.dumps(dict(peer=name, skipped=why[:200])), flush=True)
        return None

    def run(x):
        kw = dict(scale=D ** -0.5, initial_state=x["h0"], output_final_state=x["state"],
                  A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
                  cu_seqlens=x["cu"])
        if name == "fla":  # states [N, H, V, K], as every kernel here takes them
            return peers.fla_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                       state_v_first=True, **kw)
        return peers.flashkda_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    return run


def load_fla():
    return _load("fla")


def load_flashkda():
    return _load("flashkda")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=300, return_mode="median")


def graph_ms(fn):
    """do_bench of ``fn`` captured in a CUDA graph (warmed on a side stream first)."""
    return bench(captured(fn))


def captured(fn):
    """``fn`` captured in a CUDA graph (warmed on a side stream first): the graph's replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_time(fn, iters=5):
    """(GPU busy ms per call, {kernel: ms per call}): the kernels' and copies' durations from
    torch.profiler (one stream: they do not overlap), so the host's launch overhead, which
    eager timing of these short steps measures instead (both contenders ran host-bound at
    T = 1024-4096, H = 16), is left out."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:60]] = per.get(e.name[:60], 0.0) + e.time_range.elapsed_us() / 1e3 / iters
    return sum(per.values()), dict(sorted(per.items(), key=lambda kv: -kv[1])[:8])


def write_raw(json_path, doc):
    """``doc`` (every figure behind a page file) in ``raw/`` beside the page's JSON file, under
    its name: not beside it, as results/*.json are the page's files."""
    raw = os.path.join(os.path.dirname(json_path) or ".", "raw")
    os.makedirs(raw, exist_ok=True)
    with open(os.path.join(raw, os.path.basename(json_path)), "w") as fh:
        json.dump(doc, fh, indent=1)


def info():
    props = torch.cuda.get_device_properties(0)
    out = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
               triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    try:
        import fla
        out["fla"] = fla.__version__
    except Exception:  # noqa: BLE001
        pass
    return out


def emit(row):
    print(json.dumps(row), flush=True)
    return row


def geomean(values):
    """The geometric mean of positive ratios."""
    return math.exp(sum(map(math.log, values)) / len(values))


def parse_config(text):
    """``--alt``'s ``field=value,...`` as a KernelConfig (ints, True/False, else strings)."""
    fields = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        fields[key] = (int(value) if value.lstrip("-").isdigit()
                       else {"True": True, "False": False}.get(value, value))
    return KernelConfig(**fields)


def load_baseline_commit(folder):
    """The commit of the earlier kernels in ``folder`` (scripts/baseline_kernels.sh)."""
    with open(os.path.join(folder, "kdalab_baseline", "COMMIT")) as fh:
        return fh.read().strip()


def load_baseline(folder, name="chunk_kda_fwd"):
    """``name`` (``chunk_kda_fwd``; ``chunk_kda``, its differentiable call, for
    bench_train.py) of an earlier commit's kernels: the package ``kdalab_baseline`` in
    ``folder`` (scripts/baseline_kernels.sh builds it from a commit), and that commit."""
    import importlib
    import sys

    sys.path.insert(0, os.path.abspath(folder))
    mod = importlib.import_module("kdalab_baseline")
    return getattr(mod, name), load_baseline_commit(folder)


def baseline_rounds(x, old_fwd, rounds=3, config=KernelConfig(), graph=False):
    """kdalab (under ``config``) and the baseline kernel on the same inputs, in ``rounds``
    rounds (each round both, which one first alternating): the medians of each one's do_bench
    medians, and the largest output difference; with ``graph``, also each captured in a CUDA
    graph, the replays so (what a caller who captures sees: no host time, e.g. a plan that
    differs under capture)."""
    def old():
        return run_kdalab(x, None, old_fwd)

    def new():
        return run_kdalab(x, config)
    a, b = new()[0], old()[0]  # compiled outside the timing
    out = dict(baseline_max_abs_diff=float((a.float() - b.float()).abs().max()))
    fns = {"": (new, old)}
    if graph:
        fns["_graph"] = (captured(new), captured(old))
    for form, (f_new, f_old) in fns.items():
        new_ms, old_ms = [], []
        for i in range(rounds):  # the order alternates: neither is always timed first
            for f, ms in ((f_new, new_ms), (f_old, old_ms))[:: 1 if i % 2 == 0 else -1]:
                ms.append(bench(f))
        out.update({f"kdalab{form}_rounds_ms": new_ms, f"baseline{form}_rounds_ms": old_ms,
                    f"baseline{form}_ms": statistics.median(old_ms),
                    f"kdalab_over_baseline{form}":
                        statistics.median(new_ms) / statistics.median(old_ms)})
    return out


def grid(names, alt=None, baseline=None, with_peers=True, base=KernelConfig(),
         baseline_graph=False):
    """kdalab (the ``base`` config, the default's, and ``alt`` after it when given) and the
    peers per shape; ``baseline`` (a folder, ``load_baseline``): an earlier commit's kernel in
    alternating rounds too (``baseline_graph``: and under CUDA-graph replay)."""
    peers = ({"fla": load_fla(), "flashkda": load_flashkda()} if with_peers else {})
    old_fwd = None
    if baseline is not None:
        old_fwd, commit = load_baseline(baseline)
        emit(dict(baseline=commit))
    rows = []
    for name in names:
        x = make_inputs(SHAPES[name])
        row = dict(shape=name)
        t0 = time.perf_counter()
        run_kdalab(x, base)  # compile / plan outside the timing
        row["kdalab_first_call_s"] = time.perf_counter() - t0
        row["kdalab_ms"] = bench(lambda: run_kdalab(x, base))
        if old_fwd is not None:
            row.update(baseline_rounds(x, old_fwd, config=base, graph=baseline_graph))
        if alt is not None:
            run_kdalab(x, alt)
            row["kdalab_alt_ms"] = bench(lambda: run_kdalab(x, alt))
            row["alt_over_default"] = row["kdalab_ms"] / row["kdalab_alt_ms"]
            # and under CUDA-graph replay (no host time between the launches of a call)
            row["kdalab_graph_ms"] = graph_ms(lambda: run_kdalab(x, base))
            row["kdalab_alt_graph_ms"] = graph_ms(lambda: run_kdalab(x, alt))
            row["alt_over_default_graph"] = row["kdalab_graph_ms"] / row["kdalab_alt_graph_ms"]
        for peer, fn in peers.items():
            if fn is None:
                continue
            try:
                t0 = time.perf_counter()
                fn(x)  # fla autotunes a new head count here
                torch.cuda.synchronize()
                row[f"{peer}_first_call_s"] = time.perf_counter() - t0
                row[f"{peer}_ms"] = bench(lambda fn=fn: fn(x))
            except Exception as exc:  # noqa: BLE001 - e.g. a peer that rejects the shape
                row[f"{peer}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        best = [row[f"{p}_ms"] for p in peers if f"{p}_ms" in row]
        if best:
            row["best_peer_ms"] = min(best)
            row["ratio"] = row["best_peer_ms"] / row["kdalab_ms"]
        rows.append(emit(row))
        torch.cuda.empty_cache()
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    print(f"\n{'shape':22s} {'kdalab':>8s} {'fla':>8s} {'flashkda':>9s}  ratio vs best peer")
    for r in rows:
        cells = [f"{r.get(k, float('nan')):8.3f}" for k in ("kdalab_ms", "fla_ms")]
        cells.append(f"{r.get('flashkda_ms', float('nan')):9.3f}")
        print(f"{r['shape']:22s} {' '.join(cells)}  {r.get('ratio', float('nan')):5.2f}x"
              + (f"  alt {r['alt_over_default']:.3f}x the default (graph "
                 f"{r['alt_over_default_graph']:.3f}x)" if "alt_over_default" in r else "")
              + (f"  {r['kdalab_over_baseline']:.3f}x the baseline's time"
                 if "kdalab_over_baseline" in r else "")
              + (f" (graph {r['kdalab_over_baseline_graph']:.3f}x)"
                 if "kdalab_over_baseline_graph" in r else ""))
    if old_fwd is not None:
        over = [r["kdalab_over_baseline"] for r in rows]
        print(f"kdalab's time over the baseline's: geometric mean {geomean(over):.3f} over "
              f"{len(over)} shapes (range {min(over):.3f}-{max(over):.3f})")
        over = [r["kdalab_over_baseline_graph"] for r in rows
                if "kdalab_over_baseline_graph" in r]
        if over:
            print(f"  under CUDA-graph replay: geometric mean {geomean(over):.3f} "
                  f"(range {min(over):.3f}-{max(over):.3f})")
    if ratios:
        geo = geomean(ratios)
        print(f"geometric mean of the ratios: {geo:.2f}x over {len(ratios)} shapes; "
              f"slowest ratio {min(ratios):.2f}x")
        return rows, geo
    return rows, None


def explore_configs(shape):
    name, B, T, H, lens, state = shape
    n_chunks = max(lens or [T]) // 16
    configs = {"plan": KernelConfig(), "plan_triton": KernelConfig(stage2="triton"),
               "serial": KernelConfig(segment_chunks=0, stage2="triton")}
    for L in (8, 16, 32, 64, 128, 256, 512):
        if 2 * L <= n_chunks:
            configs[f"L{L}"] = KernelConfig(segment_chunks=L, stage2="triton")
    configs.update({
        "prep_w4": KernelConfig(prepare_warps=4),
        "bv128_w8": KernelConfig(block_v=128, num_warps=8, stage2="triton"),
        # the serial pass in the Triton kernel's BV 64 form and by the Gluon kernel
        # (kernels/chunk_recurrent_ws.py; Triton's where it does not apply)
        "serial_bv64": KernelConfig(segment_chunks=0, block_v=64, num_warps=4,
                                    stage2="triton"),
        "serial_gluon": KernelConfig(segment_chunks=0, block_v=64, num_warps=4,
                                     stage2="gluon"),
        "plan_gluon": KernelConfig(stage2="gluon"),
    })
    for L in (64, 256, 1024):  # the Gluon kernel's passes may want other segment lengths
        if 2 * L <= n_chunks:
            configs[f"L{L}_gluon"] = KernelConfig(segment_chunks=L, stage2="gluon")
    return configs


def _stage1_fn(x, config):
    """Stage 1 alone for inputs ``x`` under ``config``: (its function, the sequences, plan)."""
    from kdalab.kernels import api
    from kdalab.kernels.chunk_prepare import chunk_kda_prepare
    from kdalab.kernels.contract import prefill_problem

    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    p = prefill_problem(q, k, v, g, beta, scale=None, initial_state=None, A_log=x["A_log"],
                        dt_bias=x["dt_bias"], gate="raw", lower_bound=LOWER_BOUND,
                        cu_seqlens=x["cu"], use_qk_l2norm=True, beta_is_logits=True,
                        state_layout="KV", config=config)
    seqs = api.sequences_for(p, x["cu"], q.device)
    plan = api.plan_for(seqs, p, config)
    dt_bias = x["dt_bias"].reshape(-1)

    def s1():
        return chunk_kda_prepare(q, k, g, beta, x["A_log"], dt_bias, p, seqs,
                                 num_warps=plan.prepare_warps)
    return s1, seqs, plan


def parts(x, config):
    """Stage 1, and each pass of stage 2, timed alone (the plan's chosen path and config)."""
    from kdalab.kernels.chunk_combine import chunk_kda_combine
    from kdalab.kernels.chunk_recurrent import chunk_kda_recurrent

    q, v = x["q"], x["v"]
    H, K, V = q.shape[2], q.shape[3], v.shape[-1]
    s1, seqs, plan = _stage1_fn(x, config)
    ops = s1()
    ht = torch.empty_like(x["h0"]) if x["state"] else None
    launch = dict(initial_state=x["h0"], final_state=ht, state_vk=True, cu_seqlens=seqs.cu32,
                  chunk_offsets=seqs.chunk_offsets, num_seqs=seqs.num_seqs,
                  block_v=plan.block_v, num_warps=plan.num_warps, dot="fp16", guard=True)
    out = dict(stage1_ms=bench(s1), plan=plan.__dict__)
    if plan.segment_chunks <= 0:
        out["pass0_ms"] = bench(lambda: chunk_kda_recurrent(v, *ops, **launch))
        out["pass0_us_per_step"] = 1e3 * out["pass0_ms"] / max(seqs.n_chunks)
        return out
    table, offs, n_segs = seqs.segments(plan.segment_chunks)
    summary = torch.empty(n_segs, H, V + K, K, device=q.device)
    o = torch.empty_like(v)
    st = dict(launch, segments=table, summary=summary, o=o)
    out["pass1_ms"] = bench(lambda: chunk_kda_recurrent(v, *ops, **st, passes=(1,)))
    out["combine_ms"] = bench(lambda: chunk_kda_combine(summary, offs, x["h0"],
                                                        num_seqs=seqs.num_seqs, state_vk=True,
                                                        H=H, K=K, V=V))
    out["pass2_ms"] = bench(lambda: chunk_kda_recurrent(v, *ops, **st, passes=(2,)))
    out["segments"] = n_segs
    return out


def explore(names):
    rows = []
    for name in names:
        shape = SHAPES[name]
        x = make_inputs(shape)
        row = dict(shape=name, ms={})
        row["stage1_ms"] = {}
        for cname, cfg in explore_configs(shape).items():
            try:
                run_kdalab(x, cfg)
                row["ms"][cname] = bench(lambda cfg=cfg: run_kdalab(x, cfg))
                if cname == "plan" or cname.startswith("prep"):
                    row["stage1_ms"][cname] = bench(_stage1_fn(x, cfg)[0])
            except Exception as exc:  # noqa: BLE001 - e.g. a launch shape out of resources
                row["ms"][cname] = f"{type(exc).__name__}: {exc}"[:200]
        try:
            row["parts"] = parts(x, KernelConfig(stage2="triton"))
        except Exception as exc:  # noqa: BLE001
            row["parts"] = f"{type(exc).__name__}: {exc}"[:300]
        times = {k: v for k, v in row["ms"].items() if isinstance(v, float)}
        row["best"] = min(times, key=times.get) if times else None
        rows.append(emit(row))
        torch.cuda.empty_cache()
    for r in rows:
        cells = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}=ERR"
                         for k, v in r["ms"].items())
        print(f"{r['shape']:22s} best={r['best']}: {cells}")
        print(f"{'':22s} stage 1: " + " ".join(f"{k}={v:.3f}"
                                                for k, v in r["stage1_ms"].items()))
    return rows


def overhead(names=("T1024_H16", "varlen1024x8_H64")):
    """Host time per call (queued back to back), GPU time per call (graph replay), do_bench."""
    rows = []
    peers = {"fla": load_fla(), "flashkda": load_flashkda()}
    for name in names:
        x = make_inputs(SHAPES[name])
        fns = {"kdalab": lambda: run_kdalab(x)}
        fns.update({p: (lambda fn=fn: fn(x)) for p, fn in peers.items() if fn is not None})
        for kname, fn in fns.items():
            row = dict(shape=name, kernel=kname)
            try:
                fn()
                torch.cuda.synchronize()
                n = 50
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                row["host_us_per_call"] = 1e6 * (time.perf_counter() - t0) / n
                torch.cuda.synchronize()
                row["do_bench_ms"] = bench(fn)
                row["graph_replay_ms"] = graph_ms(fn)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(emit(row))
    return rows


def accuracy():
    """o and final-state error vs the fp64 token recurrence (T = 8192, H = 16, random state),
    serial and sequence-parallel paths, fla alongside."""
    from kdalab.kda import reference_forward

    fla = load_fla()
    rows = []
    for family in ("model_like", "saturated", "weak_decay_correlated"):
        # the family's preset with a random initial state: q ... dt_bias are the end-to-end
        # study's draw for seed 1; the state (drawn last) changed from an earlier draw on the
        # CUDA generator (same distribution, other bits)
        kw = draw(preset(family, T=8192, heads=16, K=D, V=D, lower_bound=LOWER_BOUND,
                         initial_state="fp32"), 1, "cuda")
        x = {n: kw[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")}
        x.update(cu=None, state=True, h0=kw["initial_state"])
        ref_o, ref_s = reference_forward(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                         A_log=x["A_log"], dt_bias=x["dt_bias"],
                                         lower_bound=LOWER_BOUND,
                                         initial_state=x["h0"].transpose(-1, -2),
                                         output_final_state=True)
        row = dict(family=family, T=8192, H=16,
                   bf16_floor=float(rel_rmse(ref_o.bfloat16(), ref_o, 4)))
        for cname, cfg in (("serial", KernelConfig(segment_chunks=0)),
                           ("segments64", KernelConfig(segment_chunks=64)),
                           ("segments16", KernelConfig(segment_chunks=16)),
                           ("tf32", KernelConfig(dot="tf32"))):
            o, s = run_kdalab(x, cfg)
            row[f"{cname}_o"] = float(rel_rmse(o, ref_o, 4))
            row[f"{cname}_S"] = float(rel_rmse(s.transpose(-1, -2), ref_s, 4))
        if fla is not None:
            o, s = fla(x)
            row["fla_o"] = float(rel_rmse(o, ref_o, 4))
            row["fla_S"] = float(rel_rmse(s.transpose(-1, -2), ref_s, 4))
        rows.append(emit(row))
    return rows


def warm_peers(names, jobs=1, compile_only=False):
    """Run each peer once per shape (fla autotunes each new head count). With ``jobs`` > 1,
    fla's configurations are first compiled in that many processes at once, one shape each,
    with its autotuning results not kept (``FLA_CACHE_RESULTS=0``: their timings overlap on
    the GPU); the compiled kernels land in Triton's cache, and the autotuning proper then runs
    here, one shape after another on an otherwise idle GPU, from that cache."""
    if jobs > 1 and not compile_only:
        import subprocess
        import sys
        env = dict(os.environ, FLA_CACHE_RESULTS="0")
        t0 = time.perf_counter()
        procs = []
        for i in range(0, len(names), max(1, -(-len(names) // jobs))):
            part = names[i:i + max(1, -(-len(names) // jobs))]
            procs.append(subprocess.Popen([sys.executable, __file__, "--warm-peers",
                                           "--compile-only", "--shapes", ",".join(part)],
                                          env=env, stdout=subprocess.DEVNULL))
        codes = [p.wait() for p in procs]
        emit(dict(parallel_compile_s=time.perf_counter() - t0, jobs=len(procs), codes=codes))
    peers = {"fla": load_fla()} if compile_only else {"fla": load_fla(),
                                                      "flashkda": load_flashkda()}
    for name in names:
        x = make_inputs(SHAPES[name])
        for peer, fn in peers.items():
            if fn is None:
                continue
            t0 = time.perf_counter()
            try:
                fn(x)
                torch.cuda.synchronize()
                if compile_only:
                    continue
                emit(dict(shape=name, peer=peer, warm_s=time.perf_counter() - t0,
                          ms=bench(lambda fn=fn: fn(x))))
            except Exception as exc:  # noqa: BLE001
                emit(dict(shape=name, peer=peer, error=f"{type(exc).__name__}: {exc}"[:300]))
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--explore", action="store_true")
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--warm-peers", action="store_true")
    ap.add_argument("--jobs", type=int, default=1,
                    help="--warm-peers: compile fla's configurations in this many processes")
    ap.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default=None,
                    help="comma-separated shape names (default: the grid; with --extra, the "
                         "shapes beyond it)")
    ap.add_argument("--extra", action="store_true",
                    help="the shapes beyond the grid (EXTRA) instead of the grid")
    ap.add_argument("--alt", default=None, metavar="FIELD=VALUE,...",
                    help="--grid: also time kdalab under this KernelConfig (e.g. "
                         "fp16_guard=launch), after the default on each shape")
    ap.add_argument("--base", default=None, metavar="FIELD=VALUE,...",
                    help="--grid: kdalab's config in place of the default (e.g. "
                         "stage2=gluon,segment_chunks=0), --alt's too")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="--grid: also time an earlier commit's kernel (the package "
                         "kdalab_baseline in DIR: scripts/baseline_kernels.sh), alternating")
    ap.add_argument("--baseline-graph", action="store_true",
                    help="--baseline: also both under CUDA-graph replay, alternating")
    ap.add_argument("--no-peers", action="store_true", help="--grid: kdalab (and the "
                    "baseline) only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    names = (args.shapes.split(",") if args.shapes
             else [e[0] for e in (EXTRA if args.extra else GRID)])
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    try:  # a field or value KernelConfig refuses: one line, exit 2, before any GPU work
        base = parse_config(args.base) if args.base else KernelConfig()
        alt = parse_config(",".join(filter(None, (args.base, args.alt)))) if args.alt else None
    except (TypeError, ValueError) as exc:
        ap.error(f"--base/--alt: {exc}")
    if args.compile_only:
        warm_peers(names, compile_only=True)
        return
    result = dict(info=emit(info()))
    if args.warm_peers:
        warm_peers(names, args.jobs)
    if args.overhead:
        result["overhead"] = overhead()
    if args.explore:
        result["explore"] = explore(names)
    if args.accuracy:
        result["accuracy"] = accuracy()
    if args.grid:
        result["grid"], result["geomean"] = grid(names, alt, args.baseline,
                                                 with_peers=not args.no_peers, base=base,
                                                 baseline_graph=args.baseline_graph)
        if alt is not None:
            result["alt"] = args.alt
        if args.base:
            result["base"] = args.base
        if args.baseline:
            result["baseline_commit"] = load_baseline_commit(args.baseline)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
