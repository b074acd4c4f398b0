"""Training speed, memory and gradient accuracy of kdalab.kernels.chunk_kda against fla's
chunk_kda (its own Triton forward and backward), in one process (H200).

    python benchmarks/bench_train.py [--shapes a,b] [--rounds 3] [--json out.json]
        [--accuracy] [--variants] [--quick]

1. Speed (the issue-11 grid of bench_kernel.py, bf16, K = V = 128, model-like inputs, the
   lower-bounded gate): forward + backward (``torch.autograd.grad`` of o and the final state
   with dO, dHT drawn once) and the backward alone (of a forward kept), median of
   ``triton.testing.do_bench`` over interleaved rounds, kdalab against fla, with the floor
   beside each figure: the bytes a training step must move (the inputs read twice, dO, the
   gradients written, the forward's kept states) at the copy bandwidth measured in this run,
   and the products' FLOPs (counted below) at the bf16 rate measured in this run.
2. Memory: the peak allocated during one forward + backward above what the inputs hold
   (``torch.cuda.max_memory_allocated``), each.
3. Accuracy (``--accuracy``): each gradient's relative RMS error against autograd through the
   fp64 token recurrence (kdalab.kda.reference_forward), T = 1024, H = 16, on model-like,
   collinear and weak-decay inputs and the three gates, kdalab's and fla's on the same inputs.
4. ``--variants``: the reverse pass's product operand types (``autograd.BWD_PRODUCTS``), speed
   at two shapes and accuracy at T = 1024: one page row a shape and variant, its step time over
   the default variant's, its worst gradient a case in the note.

Rows go to stdout as JSON lines and with ``--json`` into the BENCHMARKS.md JSON (every figure
into ``raw/`` beside it). fla autotunes each new shape (30-90 s, forward and backward):
its first call per shape is outside the timing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernel import (  # noqa: E402
    GRID,
    SHAPES,
    geomean,
    kernel_time,
    load_baseline,
    make_inputs,
    parse_config,
    write_raw,
)
from train_rows import LEAVES, grad_names, worst_grad, worst_leaf  # noqa: E402

from kdalab.arith import rel_rmse  # noqa: E402
from kdalab.inputs.sequences import draw, preset  # noqa: E402
from kdalab.kda import reference_forward  # noqa: E402
from kdalab.kernels import autograd as kernel_autograd  # noqa: E402
from kdalab.kernels import chunk_kda  # noqa: E402

LOWER_BOUND = -5.0
D = 128
#: the backward target's shape (issue 40: the backward alone at B 1, T 4096, H 16)
SHAPES = dict(SHAPES, T4096_H16=("T4096_H16", 1, 4096, 16, None, False))


#: called after every row (main: the JSON rewritten, so a call cut short keeps its rows)
ON_ROW = []


def emit(row, rows):
    print(json.dumps(row), flush=True)
    rows.append(row)
    for hook in ON_ROW:
        hook()


def _fla():
    os.environ["FLA_FLASH_KDA"] = "0"  # grads are on anyway: fla's own Triton path
    try:
        from fla.ops.kda import chunk_kda as fla
    except Exception as exc:  # noqa: BLE001 - a missing peer is reported and skipped
        print(json.dumps(dict(peer="fla", skipped=repr(exc)[:200])), flush=True)
        return None
    return fla


def _runners(fla, gate="lower_bound", config=None, op=chunk_kda):
    """(kdalab, fla) forward functions on a dict of leaves (states VK: every kernel's);
    ``op``: kdalab's ``chunk_kda`` or an earlier commit's (``--baseline``)."""
    lb = LOWER_BOUND if gate == "lower_bound" else None

    def mine(x):
        kw = dict(gate="log_decay") if gate == "log_decay" else dict(
            A_log=x["A_log"], dt_bias=x["dt_bias"])
        return op(x["q"], x["k"], x["v"], x["g"], x["beta"], lower_bound=lb,
                         initial_state=x.get("h0"), output_final_state=True,
                         cu_seqlens=x.get("cu"), state_layout="VK",
                         **(dict(config=config) if config is not None else {}), **kw)

    def theirs(x):
        return fla(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x.get("A_log"),
                   dt_bias=None if x.get("dt_bias") is None else x["dt_bias"].reshape(-1),
                   lower_bound=lb, initial_state=x.get("h0"), output_final_state=True,
                   cu_seqlens=x.get("cu"), state_v_first=True, use_qk_l2norm_in_kernel=True,
                   use_gate_in_kernel=gate != "log_decay", use_beta_sigmoid_in_kernel=True,
                   safe_gate=lb is not None)
    return mine, (theirs if fla is not None else None)


def _leaves(x, gate="lower_bound"):
    out = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    if gate == "log_decay":
        out["g"] = out["g"].float().neg().abs().neg() * 0.1  # a log-decay <= 0
    else:
        out.update(A_log=x["A_log"], dt_bias=x["dt_bias"])
    if x.get("h0") is not None:
        out["h0"] = x["h0"]
    out = {n: t.detach().clone().requires_grad_(True) for n, t in out.items()}
    if x.get("cu") is not None:
        out["cu"] = x["cu"]
    return out


def _step(fn, x, do, dht):
    """forward + backward: the gradients of every leaf."""
    leaves = [x[n] for n in LEAVES if n in x]
    o, s = fn(x)
    return torch.autograd.grad((o, s), leaves, (do, dht.to(s.dtype)))


def copy_bandwidth():
    src = torch.empty(2 ** 28, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200, return_mode="median")
    return 2 * 2 ** 30 / (ms * 1e-3)


def matmul_rate():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, rep=200, return_mode="median")
    return 2 * 8192 ** 3 / (ms * 1e-3)


def floor_ms(tokens, H, bw, rate, chunks, state):
    """The floor of a training step: bytes (read q, k, v, g twice, β, dO; write o, the four
    gradients and dβ; the forward's states every 64 tokens written and read, fp32) over the
    copy bandwidth, and FLOPs over the bf16 rate: the forward's products per chunk and head
    (stage 1: Q·K^T, K·K^T, W at 16 x 16 x K; stage 2: U, O and the state update in two parts
    at 16 x K x V, and the 16 x 16 x V ones), the backward's (the forward again, and 10
    products at 16 x K x V: dU, dV, dS (two), dQG, dW, dKEND, dMQK, dAINV, the block's
    state), taken as the larger."""
    K = V = D
    tok = tokens * H
    nbytes = tok * (4 * K * 2 * 2 + 2 * 2 + V * 2 * 2 + 4 * K * 2 + 2) + \
        (tokens // 64) * H * K * V * 4 * 2 + (2 * H * K * V * 4 if state else 0)
    fwd = chunks * H * (3 * 2 * 16 * 16 * K + 4 * 2 * 16 * K * V + 2 * 2 * 16 * 16 * V)
    bwd = fwd + chunks * H * 10 * 2 * 16 * K * V
    return max(nbytes / bw, (fwd + bwd) / rate) * 1e3, nbytes, fwd + bwd


def interleaved(fns, rounds, rep=40):
    times = {n: [] for n in fns}
    for _ in range(rounds):
        for n, fn in fns.items():
            if fn is None:
                continue
            try:
                times[n].append(triton.testing.do_bench(fn, rep=rep, return_mode="median"))
            except Exception as exc:  # noqa: BLE001 - keep the other contenders' rows
                times[n] = f"{type(exc).__name__}: {exc}"[:200]
                continue
    return {n: (sorted(t)[len(t) // 2] if isinstance(t, list) and t else t)
            for n, t in times.items()}


def graph_time(fn, rep=40):
    """ms per replay of fn captured in a CUDA graph (the host's overhead removed), or the
    reason capture failed. Every capture at a process's first shape has failed ("operation
    failed due to a previous error during capture", kdalab's and fla's steps and backwards
    alike, at 0d3e4cf, 9bbff03, 4426214, 5784e74, a798f1d on an H100 and b02b3af on an H200)
    and none at a later shape. Not the profiler (pytorch issue 75504): since a798f1d the
    captures come before the process's first profiler session and still fail. Not cured by a
    small autograd step captured first (9bbff03), nor by a second capture from a fresh warm-up
    right after the first failed (b02b3af; removed). A later shape's captures succeed."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return triton.testing.do_bench(graph.replay, rep=rep, return_mode="median")
    except Exception as exc:  # noqa: BLE001 - reported in the row
        torch.cuda.synchronize()
        return f"{type(exc).__name__}: {exc}"[:160]


def peak_mb(fn, x, do, dht):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = _step(fn, x, do, dht)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del grads
    return peak / 2 ** 20


def speed_rows(names, rounds, bw, rate, fla, rows=None):
    rows = [] if rows is None else rows
    for name in names:
        shape = SHAPES[name]
        x = _leaves(make_inputs(shape))
        mine, theirs = _runners(fla)
        o, s = mine(x)
        gen = torch.Generator().manual_seed(5)
        do = torch.randn(o.shape, generator=gen).to(o.device, o.dtype)
        dht = torch.randn(s.shape, generator=gen).cuda()
        del o, s
        row = dict(shape=name)
        t0 = time.time()
        for fn in (mine, theirs):  # compile / autotune outside the timing
            if fn is not None:
                try:
                    _step(fn, x, do, dht)
                except Exception as exc:  # noqa: BLE001
                    row[f"{'kdalab' if fn is mine else 'fla'}_error"] = repr(exc)[:200]
        row["warm_s"] = round(time.time() - t0, 1)
        fns = {"kdalab": lambda x=x: _step(mine, x, do, dht)}
        if theirs is not None and "fla_error" not in row:
            fns["fla"] = lambda x=x: _step(theirs, x, do, dht)
        # the backward alone: of one forward kept (retain_graph)
        kept = {}
        for n, fn in (("kdalab", mine), ("fla", theirs if "fla" in fns else None)):
            if fn is None:
                continue
            o, s = fn(x)
            leaves = [x[m] for m in LEAVES if m in x]
            kept[n] = (o, s, leaves)
            fns[f"{n}_bwd"] = (lambda o=o, s=s, leaves=leaves: torch.autograd.grad(
                (o, s), leaves, (do, dht.to(s.dtype)), retain_graph=True))
        ms = interleaved(fns, rounds)
        for n, v in ms.items():
            row[f"{n}_ms"] = v
        # the GPU's own time: CUDA-graph replay, every capture before the shape's first
        # profiler session (graph_time's docstring), then the profiler
        for n, fn in fns.items():
            row[f"{n}_graph_ms"] = graph_time(fn)
        for n, fn in fns.items():
            try:
                row[f"{n}_gpu_ms"], top = kernel_time(fn)
                row[f"{n}_kernels"] = {k: round(v, 4) for k, v in top.items()}
            except Exception as exc:  # noqa: BLE001
                row[f"{n}_gpu_ms"] = repr(exc)[:160]
        kept.clear()
        for n in ("kdalab", "fla"):
            if n in fns:
                try:
                    row[f"{n}_peak_mb"] = peak_mb(mine if n == "kdalab" else theirs, x, do, dht)
                except Exception as exc:  # noqa: BLE001 - keep the row's other figures
                    row[f"{n}_peak_error"] = repr(exc)[:200]
        _, B, T, H, lens, state = shape
        tokens = B * T
        chunks = sum(-(-L // 16) for L in lens) if lens else B * -(-T // 16)
        row["floor_ms"], row["bytes"], row["flops"] = floor_ms(tokens, H, bw, rate, chunks,
                                                               state)
        if isinstance(row.get("fla_ms"), float) and isinstance(row.get("kdalab_ms"), float):
            row["speedup"] = row["fla_ms"] / row["kdalab_ms"]
        if isinstance(row.get("fla_bwd_ms"), float) and isinstance(row.get("kdalab_bwd_ms"),
                                                                   float):
            row["speedup_bwd"] = row["fla_bwd_ms"] / row["kdalab_bwd_ms"]
        for kind in ("gpu", "graph"):
            a, b = row.get(f"kdalab_{kind}_ms"), row.get(f"fla_{kind}_ms")
            if isinstance(a, float) and isinstance(b, float):
                row[f"speedup_{kind}"] = b / a
        emit(row, rows)
        del x
        torch.cuda.empty_cache()
    return rows


FAMILIES = ("model_like", "collinear", "weak_decay_correlated")


def accuracy_rows(fla, gates=("lower_bound", "unbounded", "log_decay"), T=1024, H=16,
                  rows=None, variant=None):
    """One row a case; ``variant``: the product variant they ran under, named in each row (a
    log's rows then say which)."""
    rows = [] if rows is None else rows
    for family in FAMILIES:
        for gate in gates:
            if family != "model_like" and gate != "lower_bound":
                continue
            spec = preset(family, T=T, batch=1, heads=H, K=D, V=D,
                          lower_bound=LOWER_BOUND if gate == "lower_bound" else None,
                          initial_state="fp32")
            d = draw(spec, 0, "cuda")
            base = dict(q=d["q"], k=d["k"], v=d["v"], g=d["g"], beta=d["beta"],
                        A_log=d["A_log"], dt_bias=d["dt_bias"], h0=d["initial_state"])
            x = _leaves(base, gate)
            mine, theirs = _runners(fla, gate)
            o, s = mine(x)
            gen = torch.Generator().manual_seed(11)
            do = torch.randn(o.shape, generator=gen).to(o.device, o.dtype)
            dht = torch.randn(s.shape, generator=gen).cuda()
            ref_x = {n: (t.detach().double().requires_grad_(True) if torch.is_tensor(t)
                         and n != "cu" else t) for n, t in x.items()}
            mode = "log_decay" if gate == "log_decay" else gate
            ro, rs = reference_forward(
                ref_x["q"], ref_x["k"], ref_x["v"], ref_x["g"], ref_x["beta"],
                A_log=ref_x.get("A_log"), dt_bias=ref_x.get("dt_bias"),
                lower_bound=LOWER_BOUND if gate == "lower_bound" else None, gate=mode,
                initial_state=ref_x["h0"], output_final_state=True, state_layout="VK")
            leaves = [ref_x[n] for n in LEAVES if n in ref_x]
            want = torch.autograd.grad((ro, rs), leaves, (do.double(), dht.double()))
            row = dict(family=family, gate=gate, T=T, H=H)
            # the exact gradient rounded to the dtype a kernel returns it in (its input's):
            # no kernel's error is below it (bf16: about 1.7e-3)
            names = [n for n in LEAVES if n in x]
            for n, b in zip(names, want, strict=True):
                row[f"round_d{n}"] = float(rel_rmse(b.to(x[n].dtype).double(), b, b.dim()))
            for who, fn in (("kdalab", mine), ("fla", theirs)):
                if fn is None:
                    continue
                try:
                    got = _step(fn, x, do, dht)
                except Exception as exc:  # noqa: BLE001
                    row[f"{who}_error"] = repr(exc)[:200]
                    continue
                for n, a, b in zip(names, got, want, strict=True):
                    row[f"{who}_d{n}"] = float(rel_rmse(a.double(), b, a.dim()))
            if variant is not None:
                row["variant"] = variant
            emit(row, rows)
    return rows


#: the reverse pass's product operand types (``autograd.BWD_PRODUCTS``: S's, dS's), the
#: default first: the other variants' step times are taken over its
PRODUCT_VARIANTS = {"s_fp32_ds_fp32": (torch.float32, torch.float32),
                    "s_bf16_ds_fp32": (torch.bfloat16, torch.float32),
                    "s_bf16_ds_bf16": (torch.bfloat16, torch.bfloat16),
                    "s_fp16_ds_bf16": (torch.float16, torch.bfloat16)}
DEFAULT_VARIANT = next(iter(PRODUCT_VARIANTS))


def variant_rows(fla, names, rounds, rows=None):
    """Each product variant's eager step time at ``names`` and its accuracy rows (lower-bounded
    gate), every row naming its variant."""
    rows = [] if rows is None else rows
    saved = dict(kernel_autograd.BWD_PRODUCTS)
    try:
        for vname, (sd, dd) in PRODUCT_VARIANTS.items():
            kernel_autograd.BWD_PRODUCTS.update(s_dtype=sd, ds_dtype=dd)
            for name in names:
                x = _leaves(make_inputs(SHAPES[name]))
                mine, _ = _runners(None)
                o, s = mine(x)
                do = torch.randn_like(o)
                dht = torch.randn(s.shape, device="cuda")
                del o, s
                _step(mine, x, do, dht)
                ms = interleaved({"k": lambda: _step(mine, x, do, dht)}, rounds)["k"]
                row = dict(variant=vname, shape=name, kdalab_ms=ms)
                emit(row, rows)
            accuracy_rows(None, gates=("lower_bound",), rows=rows, variant=vname)
    finally:
        kernel_autograd.BWD_PRODUCTS.clear()
        kernel_autograd.BWD_PRODUCTS.update(saved)
    return rows


def config_rows(names, configs, rows=None, baseline=None):
    """kdalab's GPU time (profiler) of forward+backward and of the backward alone under other
    KernelConfigs (``field=value,...`` each; the reverse pass takes block_v and num_warps,
    the plan segment_chunks; ``bwd.KEY=INT`` sets one of ``autograd.BWD_MODE``'s keys, e.g.
    ``bwd.prep_block_k=64``). The config ``baseline``: ``baseline`` = (an earlier commit's
    ``chunk_kda``, that commit), at its own defaults (``--baseline``): a kernel change timed
    against the kernels before it in one process."""
    rows = [] if rows is None else rows
    for name in names:
        x = _leaves(make_inputs(SHAPES[name]))
        first = None  # the first config's gradients: each other's distance from them
        for text in configs:
            row = dict(shape=name, config=text)
            items = [t for t in text.split(",") if t]
            saved = dict(kernel_autograd.BWD_MODE)
            try:
                kernel_autograd.BWD_MODE.update(kernel_autograd.bwd_mode_settings(
                    ",".join(t[4:] for t in items if t.startswith("bwd."))))  # bwd.KEY=INT
                if text == "baseline":
                    if baseline is None:
                        raise ValueError("the config 'baseline' needs --baseline DIR")
                    row["config"] = f"baseline {baseline[1]}"
                    mine, _ = _runners(None, op=baseline[0])
                else:
                    mine, _ = _runners(None, config=parse_config(",".join(
                        t for t in items if not t.startswith("bwd."))))
                o, s = mine(x)
                # the same probes for every config (a seeded draw), so that their gradients
                # can be compared
                gen = torch.Generator(device="cuda").manual_seed(0)
                do = torch.randn(o.shape, device="cuda", generator=gen).to(o.dtype)
                dht = torch.randn(s.shape, device="cuda", generator=gen)
                row["step_gpu_ms"], row["kernels"] = kernel_time(
                    lambda x=x, mine=mine, do=do, dht=dht: _step(mine, x, do, dht))
                leaves = [x[m] for m in LEAVES if m in x]
                row["bwd_gpu_ms"], _ = kernel_time(lambda: torch.autograd.grad(
                    (o, s), leaves, (do, dht), retain_graph=True))
                # a variant is the same function: its gradients' relative RMS distance from
                # the first config's (same inputs and probes), the largest over the leaves
                grads = torch.autograd.grad((o, s), leaves, (do, dht), retain_graph=True)
                if first is None:
                    first = grads
                else:
                    row["grad_vs_first"] = max(
                        ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)
                         ).item() for a, b in zip(grads, first))
                del grads
                row["peak_mb"] = peak_mb(mine, x, do, dht)
            except Exception as exc:  # noqa: BLE001 - the next config still runs
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            kernel_autograd.BWD_MODE.clear()
            kernel_autograd.BWD_MODE.update(saved)
            emit(row, rows)
        torch.cuda.empty_cache()
    return rows


def reverse_ms(kernels: dict) -> float:
    """The reverse pass's GPU time from a row's per-kernel times: the dS pass (the Triton
    kernel or, from 32214f4 on, the Gluon one), the blocks kernel (Triton, or Gluon from
    35d5b54 on) and the dV kernel (one kernel before the split at 667450a, two from 4b44358 on
    (the dV kernel); the combine's share left out, as before)."""
    return (kernels.get("chunk_kda_bwd_recurrent_kernel", 0.0)
            + kernels.get("chunk_kda_bwd_recurrent_ws_kernel", 0.0)
            + kernels.get("chunk_kda_bwd_blocks_kernel", 0.0)
            + kernels.get("chunk_kda_bwd_blocks_ws_kernel", 0.0)
            + kernels.get("chunk_kda_bwd_dv_kernel", 0.0))


def variant_json_rows(var) -> list[dict]:
    """The product variants' page rows (``--variants``): one a shape and variant, its eager
    step time over the default variant's (the shape's first variant's where the default was
    not timed), its worst kdalab gradient a case in the note."""
    steps, cases = {}, {}
    for r in var:
        if "variant" not in r or "config" in r:
            continue
        if "family" in r:
            cases.setdefault(r["variant"], []).append(r)
        elif isinstance(r.get("kdalab_ms"), (int, float)):
            steps.setdefault(r["shape"], {})[r["variant"]] = r["kdalab_ms"]
    out = []
    for shape, times in steps.items():
        base = DEFAULT_VARIANT if DEFAULT_VARIANT in times else next(iter(times))
        for name, ms in times.items():
            worst = []
            for a in cases.get(name, []):
                grad = worst_grad(a)
                case = f"{a['family']} {a['gate']} T {a['T']} H {a['H']}"
                worst.append(f"{case} {grad} {a[f'kdalab_{grad}']:.2g}" if grad
                             else f"{case} {a.get('kdalab_error', 'no gradients')}")
            out.append(dict(
                target=f"train {shape}: kdalab step, the reverse pass's products {name} over "
                       f"{base} (autograd.BWD_PRODUCTS)",
                unit="x", value=round(ms / times[base], 3),
                note=f"eager step time {ms:.3f} vs {times[base]:.3f} ms (interleaved rounds); "
                     "worst kdalab gradient a case, rel RMS vs fp64: "
                     + ("; ".join(worst) or "not measured")))
    return out


def to_json_rows(bw, rate, speed, acc, var=(), card="H200"):
    out = [dict(target=f"{card} copy bandwidth (1 GiB d2d)", value=round(bw / 1e12, 2),
                unit="TB/s"),
           dict(target=f"{card} bf16 matmul rate (8192^3)", value=round(rate / 1e12, 1),
                unit="TFLOP/s")]
    nan = float("nan")
    ratios, eager = [], []
    for r in speed:  # one row a shape: GPU time where the profiler gave it, eager wall time
        if "speedup" in r:  # in the note (fla's eager step is host-bound at small shapes)
            ratios.append(r["speedup"])
            eager.append(f"{r['shape']} {r['speedup']:.2f}x")
        mem = (f"peak memory {r.get('kdalab_peak_mb', nan):.0f} vs "
               f"{r.get('fla_peak_mb', nan):.0f} MiB")
        wall = (f"eager wall time {r['kdalab_ms']:.3f} vs {r['fla_ms']:.3f} ms "
                f"({r['speedup']:.2f}x)" if "speedup" in r else "")
        if isinstance(r.get("speedup_gpu"), float):
            out.append(dict(
                target=f"train {r['shape']}: GPU time (profiler) kdalab vs fla fwd+bwd",
                unit="x", value=round(r["speedup_gpu"], 3),
                note=(f"kdalab {r['kdalab_gpu_ms']:.3f} ms, fla {r['fla_gpu_ms']:.3f} ms, floor "
                      f"{r['floor_ms']:.3f} ms ({r['kdalab_gpu_ms'] / r['floor_ms']:.1f}x it); "
                      f"backward alone {r.get('kdalab_bwd_gpu_ms', nan):.3f} vs "
                      f"{r.get('fla_bwd_gpu_ms', nan):.3f} ms; kdalab's reverse "
                      f"pass {reverse_ms(r['kdalab_kernels']):.3f}"
                      f" ms, stage 1's backward "
                      f"{r['kdalab_kernels'].get('chunk_kda_prepare_bwd_kernel', 0):.3f} ms; "
                      f"{mem}" + (f"; {wall}" if wall else ""))))
        elif "speedup" in r:
            out.append(dict(
                target=f"train {r['shape']}: kdalab vs fla forward+backward", unit="x",
                value=round(r["speedup"], 3),
                note=(f"{wall}, floor {r['floor_ms']:.3f} ms "
                      f"({r['kdalab_ms'] / r['floor_ms']:.1f}x it); backward alone "
                      f"{r.get('kdalab_bwd_ms', nan):.3f} vs {r.get('fla_bwd_ms', nan):.3f} ms; "
                      f"{mem}")))
    gpu = [r["speedup_gpu"] for r in speed if isinstance(r.get("speedup_gpu"), float)]
    for values, timing, each in ((gpu, "GPU time (profiler)", None),
                                 (ratios, "eager wall time", eager)):
        if values:
            out.append(dict(target=f"train: geometric mean, kdalab vs fla, {timing}", unit="x",
                            value=round(geomean(values), 3),
                            note=f"{len(values)} shapes; slowest {min(values):.3f}x"
                                 + (": " + ", ".join(each) if each else "")))
    by_shape = {}  # the configs' rows: one page row a shape, the fastest backward first
    for r in var:
        if "config" in r and "bwd_gpu_ms" in r:
            by_shape.setdefault(r["shape"], []).append(r)
    for shape, rs in by_shape.items():
        rs = sorted(rs, key=lambda r: r["bwd_gpu_ms"])
        parts = []
        for r in rs:
            k = r["kernels"]
            prep = sum(t for name, t in k.items()  # (d687608's A/B named two kernels)
                       if name.startswith("chunk_kda_prepare_bwd"))
            # the log's commit (what a config leaves unset is that commit's default) and
            # whether the config's gradients are the run's first config's bits
            at = f" at {r['at']}" if r.get("at") else ""
            same = ""
            if "grad_vs_first" in r:
                same = (", the same bits" if r["grad_vs_first"] == 0
                        else f", gradients {r['grad_vs_first']:.1e} from the first's")
            parts.append(f"{r['config'] or 'default'}{at} {r['bwd_gpu_ms']:.2f} (reverse "
                         f"{reverse_ms(k):.2f}, stage 1's "
                         f"{prep:.2f}, {r['peak_mb']:.0f} MiB{same})")
        out.append(dict(
            target=f"train {shape}: kdalab backward GPU time, fastest config "
                   f"({rs[0]['config'] or 'default'})",
            unit="ms", value=round(rs[0]["bwd_gpu_ms"], 3),
            note="backward ms under each config (reverse pass, stage 1's backward, peak): "
                 + "; ".join(parts)))
    out += variant_json_rows(var)
    for r in acc:  # one row a case: kdalab's worst gradient, each gradient's pair in the note
        names = grad_names(r)
        if not names:
            continue
        worst = worst_leaf(r)
        pairs = ", ".join(f"d{n} {r[f'kdalab_d{n}']:.2g}/{r.get(f'fla_d{n}', float('nan')):.2g}"
                          + (f"/{r[f'round_d{n}']:.2g}" if f"round_d{n}" in r else "")
                          for n in names)
        head = ("kdalab/fla/rounded (rounded: the exact gradient in its input's dtype, below "
                "which no kernel returning that dtype can be)"
                if any(f"round_d{n}" in r for n in names) else "kdalab/fla")
        out.append(dict(
            target=f"grad {r['family']} {r['gate']} T {r['T']} H {r['H']}: worst kdalab "
                   f"gradient (d{worst}), rel RMS vs fp64", unit="rel",
            value=float(f"{r[f'kdalab_d{worst}']:.3g}"), note=f"{head}: {pairs}"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help="comma-separated grid shape names")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--variants", default=None,
                    help="comma-separated shapes at which to time the product variants")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--configs", default=None, metavar="CFG;CFG",
                    help="';'-separated KernelConfigs (field=value,...) to time kdalab under, "
                         "at --shapes (GPU time)")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="an earlier commit's kernels (scripts/baseline_kernels.sh COMMIT DIR), "
                         "timed as the config 'baseline' of --configs")
    ap.add_argument("--device", default=None,
                    help="the card the logs ran on, for --from-log's page (default: H200)")
    ap.add_argument("--from-log", nargs="+", default=None, metavar="LOG",
                    help="write --json from the JSON lines of earlier runs' logs (a later log's "
                         "row replaces an earlier one of the same shape, case, config or "
                         "variant)")
    args = ap.parse_args()
    names = args.shapes.split(",") if args.shapes else [s[0] for s in GRID]
    res = dict(bw=None, rate=None, speed=[], acc=[], var=[])

    def save():
        if not args.json or res["bw"] is None:
            return
        stem = os.path.splitext(os.path.basename(args.json))[0]
        doc_device = args.device or ("NVIDIA H200 (from logs)" if args.from_log
                                     else torch.cuda.get_device_name())
        doc = dict(benchmark=stem if stem.startswith("train_") else "train_h200",
                   device=doc_device,
                   date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   commit=os.environ.get("KDALAB_COMMIT", "unknown"),
                   command="python benchmarks/bench_train.py " + " ".join(sys.argv[1:]),
                   rows=to_json_rows(res["bw"], res["rate"], res["speed"], res["acc"],
                                     res["var"],
                                     card="H100" if "H100" in doc_device else "H200"))
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
        write_raw(args.json, dict(rates=dict(copy_bw_tbs=res["bw"] / 1e12,
                                             bf16_tflops=res["rate"] / 1e12),
                                  speed=res["speed"], accuracy=res["acc"], variants=res["var"]))

    if args.from_log:
        for kind, row in read_logs(args.from_log):
            if kind == "rates":
                res["bw"], res["rate"] = row["copy_bw_tbs"] * 1e12, row["bf16_tflops"] * 1e12
            else:
                res[kind].append(row)
        save()
        return
    ON_ROW.append(save)
    fla = _fla()
    res["bw"], res["rate"] = copy_bandwidth(), matmul_rate()
    print(json.dumps(dict(copy_bw_tbs=res["bw"] / 1e12, bf16_tflops=res["rate"] / 1e12)),
          flush=True)
    if args.accuracy:  # first: short, fla's tunings cached
        accuracy_rows(fla, rows=res["acc"])
    if not args.no_speed:
        speed_rows(names, args.rounds, res["bw"], res["rate"], fla, rows=res["speed"])
    if args.variants:
        variant_rows(fla, args.variants.split(","), args.rounds, rows=res["var"])
    if args.configs:
        config_rows(names, args.configs.split(";"), rows=res["var"],
                    baseline=load_baseline(args.baseline, "chunk_kda") if args.baseline
                    else None)
    save()


def read_logs(paths):
    """(kind, row) from logs' JSON lines (or an earlier raw ``.json``): "rates", or the row's
    list (speed, acc, var), the later of two rows with the same key kept in the first one's
    place. An accuracy row is keyed by its case and its product variant: a variant's rows go
    to var beside its step times, the rows without one (``--accuracy``'s) keep their own."""
    keyed = {}

    def rows_of(path):
        with open(path) as fh:
            text = fh.read()
        if path.endswith(".json"):  # an earlier raw file: its rows, in a log's order
            raw = json.loads(text)
            return ([raw["rates"]] if "rates" in raw else []) + [
                r for part in ("accuracy", "speed", "variants") for r in raw.get(part, [])]
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    for path in paths:
        # a log named for its commit (train_<sha>[_x].log): its config rows say which
        at = re.fullmatch(r"train_([0-9a-f]{7})(?:_[a-z][a-z0-9]*)?\.(?:log|json)",
                          os.path.basename(path))
        variant = None  # the run's latest variant timed (a run's rows start at its rates)
        for row in rows_of(path):
            if at and "config" in row:
                row = dict(row, at=at.group(1))
            if "copy_bw_tbs" in row:
                variant = None
            elif "variant" in row and "family" not in row:
                variant = row["variant"]
            elif "family" in row and "variant" not in row and variant is not None:
                # a variant's accuracy rows after its step times (logs before they named it)
                row = dict(row, variant=variant)
            if "copy_bw_tbs" in row:
                keyed[("rates",)] = ("rates", row)
            elif "family" in row and "variant" in row:
                keyed[("var", "acc", row["family"], row["gate"], row["variant"])] = ("var", row)
            elif "family" in row:
                keyed[("acc", row["family"], row["gate"])] = ("acc", row)
            elif "config" in row or "variant" in row:
                key = ("var", row["shape"], row.get("config", row.get("variant")))
                keyed[key] = ("var", row)
            elif "shape" in row and "kdalab_ms" in row:
                keyed[("speed", row["shape"])] = ("speed", row)
    return list(keyed.values())


if __name__ == "__main__":
    main()
