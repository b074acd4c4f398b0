"""Serving-path speed of kdalab's kernels against their peers, in one process (H200).

    python benchmarks/bench_decode.py [--json PATH] [--quick] [--parts decode,pool,short]
        [--rounds 5] [--candidates default,kend_single,...]

1. Decode (``kda_decode``, one token a sequence, K = V = 128, fp32 state pool, random rows)
   against fla's ``fused_recurrent_kda_fwd`` with the same pool (``ssm_state_indices``,
   ``inplace_final_state``), over N in {1, 8, 64, 128, 256, 512} (``--ns``; 128 and 512 are
   issue 43's decode target's ends) x H in {12, 24, 48, 96}: eager
   (``do_bench``) and under CUDA-graph replay (``do_bench_cudagraph``), with the memory floor:
   the bytes a step must move (the state read and written once, plus q, k, g, v, β, o) over
   the copy bandwidth measured in this run (a 1 GiB device-to-device copy).
2. Prefill through the pool, and with checkpoints every 64 tokens, against the plain prefill
   (initial and final state tensors) on four shapes (serial and split passes), in
   interleaved rounds.
3. Many short sequences: kdalab's prefill under each candidate (``CANDIDATES``)
   against FlashKDA and fla on the four batch shapes of issue 24 (varlen 1024 x 8 H 64; 37
   random lengths in [16, 512] H 32; B 128 T 64 H 16; B 8 T 4096 H 32), in interleaved
   rounds, and stage 1 alone with and without KEND's split; kdalab's default also under
   CUDA-graph replay (the GPU's time alone), and the host's time to issue one call of kdalab
   and of FlashKDA (these calls are short enough for the host to bound them).

Rows go to stdout as JSON lines and, with ``--json PATH``, into the BENCHMARKS.md JSON file
(every measured field also into PATH's stem + ``.raw.json``). fla's
decode kernel has no autotuning; its prefill autotunes each new head count (30-90 s) in the
first call of part 3, outside the timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the peers' loaders and the prefill's inputs, imported here only: bench_kernel.py's (its
# peer loaders may move to kdalab.peers; then those are taken from there, same names)
import bench_kernel  # noqa: E402
from bench_kernel import SHAPES, make_inputs, run_kdalab  # noqa: E402


def _peer_loader(name):
    fn = getattr(bench_kernel, name, None)
    if fn is None:
        try:
            import kdalab.peers as peers  # noqa: PLC0415
            fn = getattr(peers, name, None)
        except ImportError:
            fn = None
    if fn is None:
        print(json.dumps(dict(peer=name, skipped="no loader in bench_kernel or kdalab.peers")))
        return lambda: None
    return fn


load_fla, load_flashkda = _peer_loader("load_fla"), _peer_loader("load_flashkda")

from kdalab.inputs.sequences import draw, preset  # noqa: E402
from kdalab.kernels import KernelConfig, chunk_kda_fwd, kda_decode  # noqa: E402

D = 128
LOWER_BOUND = -5.0
NS, HS = (1, 8, 64, 128, 256, 512), (12, 24, 48, 96)
POOL_SEED = 1 << 20
OVERHEAD_SHAPES = ("T1024_H16", "B8_T4096_H32_state", "varlen1024x8_H64", "T131072_H8")


def _lens37():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(16, 513, (37,), generator=gen).tolist()


#: issue 24's four batch shapes, then the grid's shortest call (T 1024, H 16: about 0.1 ms of
#: GPU work, where the host's time a call decides the eager figure)
SHORT = [
    SHAPES["varlen1024x8_H64"],
    ("varlen37_H32", 1, sum(_lens37()), 32, _lens37(), False),
    ("B128_T64_H16", 128, 64, 16, None, False),
    SHAPES["B8_T4096_H32_state"],
    SHAPES["T1024_H16"],
]


#: kdalab's candidates for many short sequences (KernelConfig fields): value blocks of 128 on
#: 8 warps (the plan's other program shape) and the fp16 guard's redo in a second launch or
#: inline. Variants measured slower or no faster were deleted (docs/kernels.md, "Decisions").
CANDIDATES = {
    "default": KernelConfig(),
    "bv128_w8": KernelConfig(block_v=128, num_warps=8),
    "guard_launch": KernelConfig(fp16_guard="launch"),
    "guard_inline": KernelConfig(fp16_guard="inline"),
    # the serial pass by the warp-specialized Gluon prototype (kernels/chunk_recurrent_ws.py)
    "gluon": KernelConfig(stage2="gluon"),
}
ROUNDS = 5
GLUON = CANDIDATES["gluon"]
#: decode launch shapes (value block, warps) timed under graph replay beside the default's
#: (``decode_launch_shape``: BV 32 on 4 warps below DECODE_WIDE_FROM programs, BV 64 from it;
#: BV 128, one program a state-head, for N 128 H 12 at 1.14x the floor: fewer, even waves?)
LAUNCH_SHAPES = ((16, 2), (16, 4), (32, 2), (32, 4), (64, 4), (64, 8), (128, 8), (128, 16))


def bench(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def bench_graph(fn, rep=100):
    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")


def host_us(fn, n=100):
    """Microseconds of host time to issue one call of ``fn``: ``n`` calls back to back, not
    synchronized (the launch queue holds them all)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def host_note(r):
    """The note of a many-short shape's host time and graph replay (fields of a short row),
    or "" when the row has none."""
    if not isinstance(r.get("kdalab_graph_ms"), float) or "flashkda_ms" not in r:
        return ""
    return (f"host {r['kdalab_host_us']:.0f} us a call against FlashKDA's "
            f"{r['flashkda_host_us']:.0f}; CUDA-graph replay {r['kdalab_graph_ms']:.3f} ms, "
            f"{r['flashkda_ms'] / r['kdalab_graph_ms']:.3f}x FlashKDA's eager "
            f"{r['flashkda_ms']:.3f}")


def decode_host_note(r):
    """A decode row's host time a call: kdalab (the default, replayed), launched direct and
    through Triton's launch path (and those forms' eager times), fla."""
    fla = f", fla {r['fla_host_us']:.0f}" if "fla_host_us" in r else ""
    forms = "".join(f", {r[f'kdalab_{form}_host_us']:.0f} {what} (eager "
                    f"{r[f'kdalab_{form}_ms'] * 1e3:.2f} us)"
                    for form, what in (("direct", "launched direct"),
                                       ("triton_launch", "through Triton's launch path"))
                    if f"kdalab_{form}_host_us" in r)
    return f"host {r['kdalab_host_us']:.0f} us a call{forms}{fla}"


def launch_shape_note(r):
    """A decode row's other launch shapes and its bf16 pool (fla's too), under graph replay,
    in microseconds (none timed: empty)."""
    found = [f"{bv}/{w} {r[f'kdalab_graph_ms_bv{bv}_w{w}'] * 1e3:.2f}" for bv, w in LAUNCH_SHAPES
             if f"kdalab_graph_ms_bv{bv}_w{w}" in r]
    note = f"; graph us at BV/warps {', '.join(found)}" if found else ""
    if "kdalab_graph_ms_bf16_pool" in r:
        note += f"; bf16 pool graph {r['kdalab_graph_ms_bf16_pool'] * 1e3:.2f} us" + (
            f" (fla {r['fla_graph_ms_bf16_pool'] * 1e3:.2f})" if "fla_graph_ms_bf16_pool" in r
            else "")
    return note


def interleaved(fns, rounds, rep=40):
    """Median ms of each function over ``rounds`` rounds, each round timing every function once
    (``do_bench``, median of ``rep`` ms) in turn: drifts of clock and temperature fall on all of
    them alike, and the first-timed one gets no advantage. A function that raises gets its
    error instead."""
    out, times = {}, {}
    for name, fn in fns.items():
        try:
            fn()  # compile, plan, autotune outside the timing
            torch.cuda.synchronize()
            times[name] = []
        except Exception as exc:  # noqa: BLE001 - a peer or launch shape that fails
            out[name] = f"{type(exc).__name__}: {exc}"[:200]
    for _ in range(rounds):
        for name in times:
            times[name].append(triton.testing.do_bench(fns[name], warmup=5, rep=rep,
                                                       return_mode="median"))
    for name, ts in times.items():
        out[name] = sorted(ts)[len(ts) // 2]
    return out


def copy_bandwidth():
    """Bytes a second of a 1 GiB device-to-device copy (read + write), measured here."""
    src = torch.empty(2 ** 28, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), rep=200)
    return 2 * 2 ** 30 / (ms * 1e-3)


def load_fla_decode():
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception as exc:  # noqa: BLE001 - a missing peer is skipped
        print(json.dumps(dict(peer="fla decode", skipped=repr(exc)[:200])), flush=True)
        return None
    return fused_recurrent_kda_fwd


def decode_inputs(N, H, seed=0):
    """One decode step of N sequences: the ``model_like`` preset of kdalab.inputs.sequences at
    T = 1 (dt_bias flat, [H·K], as fla's decode takes it), and a pool of max(2N, 8) states
    ~ N(0, 0.1²) of which N distinct random rows are read, all drawn on the CPU and moved to
    the GPU. These inputs changed from earlier draws on the CUDA generator: same
    distributions, other bits, so timings from before are comparable but not of the same
    inputs."""
    x = draw(preset("model_like", T=1, batch=N, heads=H, K=D, V=D, lower_bound=LOWER_BOUND),
             seed, "cuda")
    gen = torch.Generator().manual_seed(POOL_SEED + seed)  # not the stream of q, k, ...
    P = max(2 * N, 8)
    pool = torch.randn(P, H, D, D, generator=gen) * 0.1
    idx = torch.randperm(P, generator=gen)[:N].to(torch.int32)
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], pool=pool.cuda(),
                idx=idx.cuda(), A_log=x["A_log"], dt_bias=x["dt_bias"].reshape(-1))


def decode_rows(bw, quick, rounds=ROUNDS, ns=NS):
    fla = load_fla_decode()
    rows = []
    for N in ns[:2] if quick else ns:
        for H in HS[:2] if quick else HS:
            x = decode_inputs(N, H)
            gate = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND)

            def step(x=x, gate=gate):  # one decode step (Triton's launch path)
                return lambda: kda_decode(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                          state_pool=x["pool"], state_indices=x["idx"],
                                          **gate)

            forms = {"": step()}  # row keys kdalab_ms, kdalab_host_us
            mine = forms[""]
            row = dict(N=N, H=H)
            theirs = None if fla is None else (
                lambda x=x, gate=gate: fla(  # noqa: E731
                    x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["pool"],
                    ssm_state_indices=x["idx"], inplace_final_state=True,
                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                    use_beta_sigmoid_in_kernel=True, **gate))
            # eager: interleaved rounds, the median (one do_bench a function varied by 2-3x
            # between neighbouring shapes at N <= 8, where the host's time a call is longer
            # than the kernel: docs/kernels.md)
            eager = interleaved({**{f"kdalab{f}": fn for f, fn in forms.items()}, **(
                {"fla": theirs} if theirs is not None else {})}, rounds)
            for form, fn in forms.items():
                row[f"kdalab{form}_ms"] = eager[f"kdalab{form}"]
                row[f"kdalab{form}_host_us"] = host_us(fn)
            row["kdalab_graph_ms"] = bench_graph(mine)
            # the state read and written (fp32), q, k, g, v read and o written (bf16), beta
            moved = N * H * (2 * D * D * 4 + 4 * D * 2 + D * 2 + 2)
            row["floor_ms"] = moved / bw * 1e3
            if theirs is not None and isinstance(eager["fla"], float):
                row["fla_ms"] = eager["fla"]
                row["fla_graph_ms"] = bench_graph(theirs)
                row["fla_host_us"] = host_us(theirs)
                row["speedup"] = row["fla_ms"] / row["kdalab_ms"]
                row["speedup_graph"] = row["fla_graph_ms"] / row["kdalab_graph_ms"]
            row["over_floor_graph"] = row["kdalab_graph_ms"] / row["floor_ms"]
            # the floor is the state's bytes at a 1 GiB copy's bandwidth; a copy of just these
            # bytes (one fp32 state a sequence-head, contiguous, read and written) under graph
            # replay says what its launch, ramp and tail cost at this size
            src = torch.empty(N * H * D * D, device="cuda", dtype=torch.float32)
            dst = torch.empty_like(src)
            row["copy_graph_ms"] = bench_graph(lambda s=src, d=dst: d.copy_(s))
            row["copy_over_floor"] = row["copy_graph_ms"] / row["floor_ms"]
            row["over_copy_graph"] = row["kdalab_graph_ms"] / row["copy_graph_ms"]
            del src, dst
            # the launch shapes, measured at every shape: the default's rule
            # (decode_launch_shape) came from them (docs/kernels.md), and they keep checking it
            for bv, warps in LAUNCH_SHAPES:
                fn = lambda x=x, gate=gate, bv=bv, w=warps: kda_decode(  # noqa: E731
                    x["q"], x["k"], x["v"], x["g"], x["beta"], state_pool=x["pool"],
                    state_indices=x["idx"], config=KernelConfig(block_v=bv, num_warps=w),
                    **gate)
                fn()
                row[f"kdalab_graph_ms_bv{bv}_w{warps}"] = bench_graph(fn)
            if (N, H) in ((256, 96), (1, 12), (64, 48)):
                # a bf16 pool (half the bytes; both kernels keep the state fp32 in registers)
                xb = dict(x, pool=x["pool"].bfloat16())
                fb = lambda xb=xb, gate=gate: kda_decode(  # noqa: E731
                    xb["q"], xb["k"], xb["v"], xb["g"], xb["beta"], state_pool=xb["pool"],
                    state_indices=xb["idx"], **gate)
                fb()
                row["kdalab_graph_ms_bf16_pool"] = bench_graph(fb)
                if fla is not None:
                    tb = lambda xb=xb, gate=gate: fla(  # noqa: E731
                        xb["q"], xb["k"], xb["v"], xb["g"], xb["beta"],
                        initial_state=xb["pool"], ssm_state_indices=xb["idx"],
                        inplace_final_state=True, use_qk_l2norm_in_kernel=True,
                        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, **gate)
                    tb()
                    row["fla_graph_ms_bf16_pool"] = bench_graph(tb)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def pool_rows(quick, rounds):
    """Plain prefill (initial and final state tensors), the pool, and the pool with checkpoints
    every 64 tokens (fp32: the pool's dtype), timed in interleaved rounds; ratios over plain."""
    rows = []
    for name in OVERHEAD_SHAPES[:2] if quick else OVERHEAD_SHAPES:
        x = make_inputs(SHAPES[name])
        n = x["q"].shape[0] if x["cu"] is None else x["cu"].numel() - 1
        H = x["q"].shape[2]
        h0 = torch.randn(n, H, D, D, device="cuda") * 0.1
        pool = torch.randn(2 * n, H, D, D, device="cuda") * 0.1
        idx = torch.randperm(2 * n, device="cuda")[:n]
        h0b, poolb = h0.bfloat16(), pool.bfloat16()
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        # the VK layout, as bench_kernel's grid (FlashKDA's)
        gate = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
                    cu_seqlens=x["cu"], state_layout="VK")
        fns = {
            "plain": lambda: chunk_kda_fwd(*args, initial_state=h0, output_final_state=True,
                                           **gate),
            "pool": lambda: chunk_kda_fwd(*args, state_pool=pool, state_indices=idx, **gate),
            "pool_ck64": lambda: chunk_kda_fwd(*args, state_pool=pool, state_indices=idx,
                                               checkpoint_every=64, **gate),
            # a bf16 pool: its checkpoints are bf16 too (half the bytes)
            "plain_bf16": lambda: chunk_kda_fwd(*args, initial_state=h0b,
                                                output_final_state=True, **gate),
            "pool_bf16_ck64": lambda: chunk_kda_fwd(*args, state_pool=poolb, state_indices=idx,
                                                    checkpoint_every=64, **gate),
            # the Gluon prototype's serial pass, its checkpoints stored by TMA as it runs
            "plain_gluon": lambda: chunk_kda_fwd(*args, initial_state=h0, output_final_state=True,
                                                 config=GLUON, **gate),
            "pool_ck64_gluon": lambda: chunk_kda_fwd(*args, state_pool=pool, state_indices=idx,
                                                     checkpoint_every=64, config=GLUON, **gate),
        }
        row = dict(shape=name)
        ms = interleaved(fns, rounds, rep=60)
        for key, value in ms.items():
            row[f"{key}_ms"] = value
        for key, base, label in (("pool", "plain", "pool"), ("pool_ck64", "plain", "ck64"),
                                 ("pool_bf16_ck64", "plain_bf16", "ck64_bf16"),
                                 ("pool_ck64_gluon", "plain_gluon", "gluon_ck64"),
                                 ("plain_gluon", "plain", "gluon_plain")):
            if isinstance(ms.get(key), float) and isinstance(ms.get(base), float):
                row[f"{label}_over_plain"] = ms[key] / ms[base]
        # the checkpoints' bytes (fp32) over the plain call's time: the floor a store that
        # does not overlap would add
        T = x["q"].shape[1] * x["q"].shape[0]
        row["ck64_GB"] = (T // 64) * H * D * D * 4 / 1e9
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def _outputs(result):
    """A forward's output tensors (o, or o and the final state) as a tuple."""
    out = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    return tuple(x for x in out if x is not None)


def short_rows(quick, rounds, candidates=None):
    """kdalab (each candidate of CANDIDATES, or those named), FlashKDA and fla on the
    many-short shapes, in interleaved rounds; stage 1 alone with and without KEND's split;
    the default under CUDA-graph replay, and kdalab's and FlashKDA's host time a call."""
    peers = {"fla": load_fla(), "flashkda": load_flashkda()}
    chosen = {c: CANDIDATES[c] for c in (candidates or CANDIDATES)}
    chosen.setdefault("default", CANDIDATES["default"])
    rows = []
    for shape in SHORT[:2] if quick else SHORT:
        x = make_inputs(shape)
        row = dict(shape=shape[0])
        fns = {f"kdalab_{c}": (lambda cfg=cfg: run_kdalab(x, cfg)) for c, cfg in chosen.items()}
        fns.update({p: (lambda fn=fn: fn(x)) for p, fn in peers.items() if fn is not None})
        s1 = {"stage1_default": bench_kernel._stage1_fn(x, CANDIDATES["default"])[0]}
        ms = interleaved({**fns, **s1}, rounds)
        ref = _outputs(run_kdalab(x, chosen["default"]))
        for c, cfg in chosen.items():  # does each candidate give the default's bits?
            if c != "default" and not isinstance(ms.get(f"kdalab_{c}"), str):
                row[f"{c}_same_bits"] = all(torch.equal(a, b) for a, b in zip(
                    ref, _outputs(run_kdalab(x, cfg)), strict=True))
        for key, value in ms.items():
            row[f"{key}_ms" if isinstance(value, float) else f"{key}_error"] = value
        for c in chosen:
            mine = ms.get(f"kdalab_{c}")
            for p in peers:
                if isinstance(mine, float) and isinstance(ms.get(p), float):
                    row[f"{c}_vs_{p}"] = ms[p] / mine
        if isinstance(ms.get("kdalab_default"), float):
            for c in chosen:  # each candidate's speed-up over the default (same run)
                if isinstance(ms.get(f"kdalab_{c}"), float):
                    row[f"{c}_over_default"] = ms["kdalab_default"] / ms[f"kdalab_{c}"]
            row["kdalab_ms"] = ms["kdalab_default"]
            for p in peers:
                if f"default_vs_{p}" in row:
                    row[f"vs_{p}"] = row[f"default_vs_{p}"]
        if "flashkda" in fns and isinstance(ms.get("kdalab_default"), float):
            try:  # the GPU's time alone, and what the host takes to issue a call
                row["kdalab_graph_ms"] = bench_graph(fns["kdalab_default"], rep=40)
                row["kdalab_host_us"] = host_us(fns["kdalab_default"])
                row["flashkda_host_us"] = host_us(fns["flashkda"])
                for c in chosen:
                    if c != "default":
                        row[f"{c}_host_us"] = host_us(fns[f"kdalab_{c}"])
            except Exception as exc:  # noqa: BLE001 - keep the row's other figures
                row["kdalab_graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def to_json_rows(bw, dec, pools, short, card="H200"):
    out = [dict(target=f"{card} copy bandwidth (1 GiB d2d)", value=round(bw / 1e12, 3),
                unit="TB/s")]
    for r in dec:
        tag = f"decode N={r['N']} H={r['H']}"
        out.append(dict(target=f"{tag}: kdalab", value=round(r["kdalab_ms"] * 1e3, 2),
                        unit="us", note=f"graph {r['kdalab_graph_ms'] * 1e3:.2f} us, floor "
                                        f"{r['floor_ms'] * 1e3:.2f} us"
                                        + (f"; {decode_host_note(r)}" if "kdalab_host_us" in r
                                           else "") + launch_shape_note(r)))
        if "speedup" in r:
            out.append(dict(target=f"{tag}: vs fla fused_recurrent_kda", value=round(
                r["speedup"], 3), unit="x", note=f"graph replay {r['speedup_graph']:.3f}x"))
        out.append(dict(target=f"{tag}: graph time over memory floor",
                        value=round(r["over_floor_graph"], 3), unit="x", **(
                            {"note": f"a copy of the state's bytes alone (graph) "
                                     f"{r['copy_graph_ms'] * 1e3:.2f} us, "
                                     f"{r['copy_over_floor']:.3f}x the floor; kdalab "
                                     f"{r['over_copy_graph']:.3f}x that copy"}
                            if "copy_graph_ms" in r else {})))
    for r in pools:
        for key in ("pool_over_plain", "ck64_over_plain", "ck64_bf16_over_plain",
                    "gluon_ck64_over_plain", "gluon_plain_over_plain"):
            if key in r:
                out.append(dict(target=f"prefill {r['shape']}: {key}", value=round(r[key], 4),
                                unit="x", note=f"plain {r['plain_ms']:.3f} ms; checkpoints "
                                               f"{r['ck64_GB']:.2f} GB"))
    for r in short:
        for peer in ("flashkda", "fla"):
            if f"vs_{peer}" in r:
                host = host_note(r) if peer == "flashkda" else ""
                out.append(dict(target=f"prefill {r['shape']}: kdalab vs {peer}",
                                value=round(r[f"vs_{peer}"], 3), unit="x",
                                note=f"kdalab {r['kdalab_ms']:.3f} ms"
                                     + (f"; [{host}]" if host else "")))
        for c in CANDIDATES:
            if c != "default" and f"{c}_over_default" in r:
                same = r.get(f"{c}_same_bits")
                note = [] if same is None else ["the same bits" if same else "other bits"]
                if f"{c}_host_us" in r:
                    note.append(f"host {r[f'{c}_host_us']:.0f} us a call against the "
                                f"default's {r['kdalab_host_us']:.0f}")
                out.append(dict(target=f"prefill {r['shape']}: kdalab [{c}] speed-up over "
                                       f"the default", value=round(r[f"{c}_over_default"], 3),
                                unit="x", **({"note": "; ".join(note)} if note else {})))
            if c != "default" and f"{c}_vs_flashkda" in r:
                out.append(dict(target=f"prefill {r['shape']}: kdalab [{c}] vs flashkda",
                                value=round(r[f"{c}_vs_flashkda"], 3), unit="x",
                                note=f"kdalab [{c}] {r[f'kdalab_{c}_ms']:.3f} ms"))
        for c in ("default", "kend_single"):
            if f"stage1_{c}_ms" in r:
                out.append(dict(target=f"prefill {r['shape']}: stage 1 [{c}]",
                                value=round(r[f"stage1_{c}_ms"], 4), unit="ms"))
    return out


def from_log(log, path, date, card="H200"):
    """The --json file of a run that printed its rows and was stopped before writing it: the
    copy bandwidth and the rows of the log each part finished (each a complete JSON line:
    decode shapes, pool shapes, short-batch shapes); the command names the log, the commit is
    KDALAB_COMMIT's."""
    bw, dec, pools, short = None, [], [], []
    with open(log, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            if "copy_bandwidth_TBps" in row:
                bw = row["copy_bandwidth_TBps"] * 1e12
            elif "over_floor_graph" in row:
                dec.append(row)
            elif "ck64_GB" in row:
                pools.append(row)
            elif "shape" in row and "kdalab_ms" in row:
                short.append(row)
    if bw is None or not (dec or pools or short):
        raise SystemExit(f"error: --from-log: {log} holds no copy bandwidth or no decode, "
                         "pool or short-batch row")
    parts = ", ".join(f"{len(rows)} {name}" for name, rows in (
        ("decode", dec), ("pool", pools), ("short-batch", short)) if rows)
    doc = dict(benchmark="decode_and_serving", device="", date=date,
               commit=os.environ.get("KDALAB_COMMIT", ""),
               command=f"python benchmarks/bench_decode.py (from its log {os.path.basename(log)}"
                       f", the call's time limit reached: {parts} rows)",
               rows=to_json_rows(bw, dec, pools, short, card))
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="a corner of each grid (a smoke run)")
    ap.add_argument("--parts", default="decode,pool,short")
    ap.add_argument("--ns", default=",".join(map(str, NS)),
                    help="decode: comma-separated sequence counts N (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help="interleaved rounds of every part's eager timings (median over them)")
    ap.add_argument("--candidates", default=None,
                    help=f"short part: comma-separated names of {', '.join(CANDIDATES)} "
                         "(default: all; 'default' is always timed)")
    ap.add_argument("--from-log", default=None, metavar="LOG",
                    help="--json from a log of this script's JSON lines (a call cut by its time "
                         "limit writes no --json): the decode rows it holds; with --date")
    ap.add_argument("--date", default=None, help="--from-log: the run's date (ISO, UTC)")
    ap.add_argument("--card", default="H200", choices=("H200", "H100"),
                    help="--from-log: the card the log ran on (default: %(default)s)")
    args = ap.parse_args()
    if args.from_log:
        if not (args.json and args.date):
            ap.error("--from-log needs --json and --date")
        if not os.path.isfile(args.from_log):
            ap.error(f"--from-log: {args.from_log} does not exist")
        return from_log(args.from_log, args.json, args.date, args.card)
    names = args.candidates.split(",") if args.candidates else None
    if names and any(n not in CANDIDATES for n in names):
        ap.error(f"unknown candidates {[n for n in names if n not in CANDIDATES]}")
    try:
        ns = tuple(int(n) for n in args.ns.split(","))
        if min(ns) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--ns: comma-separated positive integers, not {args.ns!r}")
    parts = set(args.parts.split(","))
    t0 = time.perf_counter()
    bw = copy_bandwidth()
    print(json.dumps(dict(copy_bandwidth_TBps=bw / 1e12)), flush=True)
    dec = decode_rows(bw, args.quick, args.rounds, ns) if "decode" in parts else []
    pools = pool_rows(args.quick, args.rounds) if "pool" in parts else []
    short = short_rows(args.quick, args.rounds, names) if "short" in parts else []
    print(f"total {time.perf_counter() - t0:.1f} s", flush=True)
    if args.json:
        commit = os.environ.get("KDALAB_COMMIT", "")  # the device's .git is not the checkout's
        if not commit:
            try:
                commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()
            except OSError:
                commit = ""
        doc = dict(benchmark="decode_and_serving", device=torch.cuda.get_device_name(0),
                   date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), commit=commit,
                   command="python " + " ".join(sys.argv), rows=to_json_rows(
                       bw, dec, pools, short,
                       "H100" if "H100" in torch.cuda.get_device_name(0) else "H200"))
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
        # every measured field (profiles, launch-shape sweeps) beside it, for docs/kernels.md
        with open(os.path.splitext(args.json)[0] + ".raw.json", "w") as fh:
            json.dump(dict(decode=dec, pool=pools, short=short), fh, indent=1)
    if dec:
        geo = math.exp(sum(math.log(r["speedup"]) for r in dec if "speedup" in r)
                       / max(1, sum("speedup" in r for r in dec)))
        print(f"decode: geometric mean speed-up over fla {geo:.2f}x (eager)")


if __name__ == "__main__":
    main()
