#!/usr/bin/env python3
"""A prototype for issue 43: stage 1 computed inside stage 2's serial pass (one launch, no
stage-1 operands through memory), measured against the two stages in the same process.

Scope of the prototype: fixed-length or varlen batches (rows clamped as stage 1 clamps them),
the lower-bounded gate, L2-normed q and k, fp16 products (the forward's default path), no
checkpoints, no guard (a program whose end state is not finite sets a flag; the caller would
fall back to the two stages). It
reuses stage 1's and stage 2's own device functions, so its arithmetic is theirs; only the
layouts of the [16, K] tiles differ (a program of 4 or 8 warps instead of stage 1's 2), which
may change the order of fp32 sums on the GPU. In the interpreter it gives the two stages' bits.

    TRITON_INTERPRET=1 python benchmarks/proto_fused.py --check        # CPU: bits vs two stages
    python benchmarks/proto_fused.py --json out.json                   # GPU: timing A/B

Chunk i's stage 1 is formed while chunk i - 1's state update runs (``PIPE`` 1: its inputs are
independent of the state), or just before its own step (``PIPE`` 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

from kdalab.kernels import KernelConfig
from kdalab.kernels.chunk_prepare import (
    beta_of,
    l2_normalize,
    load_inputs,
    neumann_inverse16,
    split_operand,
    tf32_nearest,
)
from kdalab.kernels.chunk_recurrent import chunk_step, not_finite, store_outputs, user_state_ptrs
from kdalab.kernels.gate import GATE_LOWER_BOUND, exp2_ftz, gate_params, log2_decay
from kdalab.kernels.indexing import program_rows
from kdalab.kernels.tables import fixed_sequences, varlen_sequences


@triton.jit
def _chunk_ops(q_ptr, k_ptr, g_ptr, beta_ptr, v_ptr, a, bias, row0, eos, i_h, o_r, o_k, o_v,
               v_ok, H, scale, lower_bound, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
               GATE: tl.constexpr, BETA_LOGITS: tl.constexpr, CLAMP_ROWS: tl.constexpr):
    """Stage 1's operands of the chunk from row ``row0`` (``_prepare_chunk``'s arithmetic on
    the split path, fp16 storage; rows from ``eos`` on zero), as stage 2's ``load_chunk``
    returns them."""
    rows = row0 + o_r
    r_ok = rows < eos
    m2 = r_ok[:, None]
    lrows = rows
    if CLAMP_ROWS:
        lrows = tl.minimum(rows, eos - 1)
    g_raw, k_raw, q_raw, b_in = load_inputs(q_ptr, k_ptr, g_ptr, beta_ptr, lrows, r_ok, i_h,
                                            o_k, H, K, 1, 1, CLAMP_ROWS)
    vt = tl.load(v_ptr + (rows[None, :] * H + i_h) * V + o_v[:, None],
                 mask=v_ok[:, None] & r_ok[None, :], other=0.0)
    b = beta_of(b_in, r_ok, BETA_LOGITS)
    g2 = tl.cumsum(log2_decay(g_raw, a, bias[None, :], lower_bound, m2, GATE), axis=0)
    g2_last = tl.sum(tl.where((o_r == BT - 1)[:, None], g2, 0.0), axis=0)
    gamma = exp2_ftz(g2_last)
    kv = l2_normalize(k_raw, True)
    kend, klo = split_operand(kv * exp2_ftz(g2_last[None, :] - g2), tl.float16)
    decay = exp2_ftz(g2)
    qs = l2_normalize(q_raw, True) * scale
    if CLAMP_ROWS:  # MQK's rows past the end zero, as masked loads leave them
        qs = tl.where(m2, qs, 0.0)
    qd = qs * decay
    kd = kv * decay
    kit = tf32_nearest(tl.trans(kv * exp2_ftz(-g2)), "tf32")
    mqk = tl.dot(tf32_nearest(qd, "tf32"), kit, input_precision="tf32")
    L = tl.dot(tf32_nearest(kd, "tf32"), kit, input_precision="tf32")
    mqk = tl.where(o_r[:, None] >= o_r[None, :], mqk, 0.0)
    L = tl.where(o_r[:, None] > o_r[None, :], L * b[:, None], 0.0)
    ainv = neumann_inverse16(L, BT) * b[None, :]
    w = tl.dot(tf32_nearest(ainv, "tf32"), tf32_nearest(kd, "tf32"), input_precision="tf32")
    # as stage 1 stores them (rows past the end: zero, as stage 2's masked loads read them)
    w = tl.where(m2, w, 0.0)
    qd = tl.where(m2, qd, 0.0)
    kend = tl.where(m2, kend, 0.0)
    klo = tl.where(m2, klo, 0.0)
    c_ok = (row0 + o_r * 0) < eos
    m_cc = c_ok[:, None] & c_ok[None, :]
    ainv = tl.where(m_cc, ainv, 0.0)
    mqk = tl.where(m_cc, mqk, 0.0)
    gamma = tl.where((row0 + o_k * 0) < eos, gamma, 0.0)
    return (tl.trans(w.to(tl.float16)), tl.trans(qd.to(tl.float16)), kend.to(tl.float16),
            klo.to(tl.float16), vt, tl.trans(ainv.to(tl.float16)),
            tl.trans(mqk.to(tl.float16)), gamma)


@triton.jit
def fused_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, h0_ptr, ht_ptr,
                 o_ptr, flag_ptr, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, T, scale,
                 lower_bound, H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                 BV: tl.constexpr, GATE: tl.constexpr, BETA_LOGITS: tl.constexpr,
                 HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
                 CLAMP_ROWS: tl.constexpr, PIPE: tl.constexpr):
    i_sh = tl.program_id(0)
    i_v = tl.program_id(1)
    i_n, i_h, _, bos, eos, _, _, _, _ = program_rows(
        i_sh, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seq_order_ptr, T, H, BT,
        IS_VARLEN, False)
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    v_ok = o_v < V
    a, bias = gate_params(a_log_ptr, dt_bias_ptr, i_h, o_k, K, True, True)
    if HAS_H0:
        St = tl.load(user_state_ptrs(h0_ptr, i_n, i_h, o_v, H, K, V, BV, True),
                     mask=v_ok[:, None], other=0.0).to(tl.float32)
    else:
        St = tl.zeros([BV, K], dtype=tl.float32)
    n_chunks = tl.cdiv(eos - bos, BT)
    if PIPE:
        wt, qgt, kend, klo, vt, ainvt, mqkt, gamma = _chunk_ops(
            q_ptr, k_ptr, g_ptr, beta_ptr, v_ptr, a, bias, bos, eos, i_h, o_r, o_k, o_v, v_ok,
            H, scale, lower_bound, K, V, BT, GATE, BETA_LOGITS, CLAMP_ROWS)
        for i_t in range(0, n_chunks):
            nxt = bos + tl.minimum(i_t + 1, n_chunks - 1) * BT
            if PIPE == 2:  # the last chunk forms no next one
                if i_t + 1 < n_chunks:
                    nwt, nqgt, nkend, nklo, nvt, nainvt, nmqkt, ngamma = _chunk_ops(
                        q_ptr, k_ptr, g_ptr, beta_ptr, v_ptr, a, bias, nxt, eos, i_h, o_r, o_k,
                        o_v, v_ok, H, scale, lower_bound, K, V, BT, GATE, BETA_LOGITS,
                        CLAMP_ROWS)
                else:
                    nwt, nqgt, nkend, nklo, nvt, nainvt, nmqkt, ngamma = (
                        wt, qgt, kend, klo, vt, ainvt, mqkt, gamma)
            else:
                nwt, nqgt, nkend, nklo, nvt, nainvt, nmqkt, ngamma = _chunk_ops(
                    q_ptr, k_ptr, g_ptr, beta_ptr, v_ptr, a, bias, nxt, eos, i_h, o_r, o_k, o_v,
                    v_ok, H, scale, lower_bound, K, V, BT, GATE, BETA_LOGITS, CLAMP_ROWS)
            St, ot = chunk_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma, tl.float16,
                                True, "tf32")
            store_outputs(o_ptr, ot, bos + i_t * BT + o_r, eos, i_h, o_v, v_ok, H, V)
            wt, qgt, kend, klo, vt, ainvt, mqkt, gamma = (nwt, nqgt, nkend, nklo, nvt, nainvt,
                                                          nmqkt, ngamma)
    else:
        for i_t in range(0, n_chunks):
            wt, qgt, kend, klo, vt, ainvt, mqkt, gamma = _chunk_ops(
                q_ptr, k_ptr, g_ptr, beta_ptr, v_ptr, a, bias, bos + i_t * BT, eos, i_h, o_r,
                o_k, o_v, v_ok, H, scale, lower_bound, K, V, BT, GATE, BETA_LOGITS, CLAMP_ROWS)
            St, ot = chunk_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma, tl.float16,
                                True, "tf32")
            store_outputs(o_ptr, ot, bos + i_t * BT + o_r, eos, i_h, o_v, v_ok, H, V)
    tl.store(flag_ptr + i_sh * tl.num_programs(1) + i_v, not_finite(St))
    if STORE_HT:
        tl.store(user_state_ptrs(ht_ptr, i_n, i_h, o_v, H, K, V, BV, True), St,
                 mask=v_ok[:, None])


def fused_fwd(x, *, block_v=128, num_warps=8, pipe=1, lower_bound=-5.0, _seqs={}):
    """The prototype on ``x`` (bench_kernel.make_inputs' dict: states [N, H, V, K]); returns
    (o, final state or None, flags)."""
    q, k, v, cu = x["q"], x["k"], x["v"], x["cu"]
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert q.shape[2] == v.shape[2] == x["g"].shape[2]
    key = (id(cu), B, T)
    if key not in _seqs:  # the call's tables, once (as the API caches them)
        _seqs[key] = (fixed_sequences(v.device, B, T) if cu is None
                      else varlen_sequences(cu, T))
    seqs = _seqs[key]
    n = B if cu is None else cu.numel() - 1
    o = torch.empty_like(v)
    ht = (torch.empty((n, H, V, K), device=v.device, dtype=torch.float32) if x["state"]
          else None)
    nv = -(-V // block_v)
    flags = torch.empty((n * H * nv,), device=v.device, dtype=torch.int32)
    h0 = x["h0"]
    opt = lambda t: t if t is not None else flags  # noqa: E731
    fused_kernel[(n * H, nv)](
        q, k, v, x["g"], x["beta"], x["A_log"], x["dt_bias"], opt(h0), opt(ht), o, flags,
        opt(cu), opt(seqs.chunk_offsets), opt(seqs.seq_order),
        T, K ** -0.5, lower_bound, H, K=K, V=V, BT=16, BV=block_v, GATE=GATE_LOWER_BOUND,
        BETA_LOGITS=True, HAS_H0=h0 is not None, STORE_HT=ht is not None,
        IS_VARLEN=cu is not None, CLAMP_ROWS=cu is not None or T % 16 != 0, PIPE=pipe,
        num_warps=num_warps)
    return o, ht, flags


def two_stage(x, config=KernelConfig()):
    from bench_kernel import run_kdalab

    return run_kdalab(x, config)


def _inputs(name, B, T, H, state, device, d=128):
    from bench_kernel import make_inputs

    x = make_inputs((name, B, T, H, None, state), device=device)
    if d != 128:
        raise ValueError("d")
    return x


def check(args):
    """Interpreter (or GPU): the prototype's outputs against the two stages', bit for bit."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    import bench_kernel

    old = bench_kernel.D
    try:
        bench_kernel.D = 32
        cases = [("B2_T48_H2_state", 2, 48, 2, None, True), ("B3_T32_H1", 3, 32, 1, None, False),
                 ("B2_T37_H2_state", 2, 37, 2, None, True),
                 ("varlen_H2_state", 1, 75, 2, (20, 0, 33, 5, 17), True)]
        for name, B, T, H, lens, state in cases:
            x = bench_kernel.make_inputs((name, B, T, H, lens, state), device=dev)
            ref = two_stage(x, KernelConfig(stage2="triton"))
            ro, rs = (ref if isinstance(ref, tuple) else (ref, None))[:2]
            for bv, nw, pipe in ((32, 4, 1), (16, 4, 0), (32, 4, 2)):
                o, ht, flags = fused_fwd(x, block_v=bv, num_warps=nw, pipe=pipe)
                res = dict(case=name, block_v=bv, pipe=pipe,
                           o_equal=bool(torch.equal(o, ro)),
                           o_maxdiff=float((o.float() - ro.float()).abs().max()),
                           flags=int(flags.sum()))
                if ht is not None:
                    res["state_equal"] = bool(torch.equal(ht, rs))
                print(json.dumps(res), flush=True)
    finally:
        bench_kernel.D = old


def _shapes():
    """(name, B, T, H, varlen lengths, state): the serving and grid shapes the prototype is for,
    then two it is not (few long sequences), for the record."""
    from bench_decode import _lens37

    lens37 = _lens37()
    return [("B128_T64_H16_state", 128, 64, 16, None, True),
            ("varlen37_H32", 1, sum(lens37), 32, lens37, False),
            ("varlen1024x8_H64", 1, 8192, 64, [1024] * 8, False),
            ("B8_T4096_H32_state", 8, 4096, 32, None, True),
            ("varlen512x16_H64", 1, 8192, 64, [512] * 16, False),
            ("B16_T1024_H32", 16, 1024, 32, None, False),
            ("T1024_H16", 1, 1024, 16, None, False),
            ("T8192_H64", 1, 8192, 64, None, False)]


def timing(args):
    from bench_kernel import bench, captured, make_inputs

    rows = []
    variants = [(128, 8, 2), (128, 8, 1), (128, 8, 0), (64, 4, 2), (64, 4, 0)]
    for name, B, T, H, lens, state in _shapes():
        if args.shapes and name not in args.shapes.split(","):
            continue
        x = make_inputs((name, B, T, H, lens, state))
        ref = two_stage(x)
        ro = ref[0] if isinstance(ref, tuple) else ref
        fns = {"two_stage": lambda: two_stage(x)}
        for bv, nw, pipe in variants:
            fns[f"fused_bv{bv}_w{nw}_p{pipe}"] = (
                lambda bv=bv, nw=nw, pipe=pipe: fused_fwd(x, block_v=bv, num_warps=nw,
                                                          pipe=pipe))
        row = dict(shape=name)
        t0 = time.time()
        for key, fn in fns.items():
            fn()
            torch.cuda.synchronize()
        for key, fn in fns.items():
            if key != "two_stage":
                o, ht, flags = fn()
                row[f"{key}_maxdiff"] = float((o.float() - ro.float()).abs().max())
                row[f"{key}_equal"] = float((o == ro).float().mean())
                row[f"{key}_flags"] = int(flags.sum())
        for r in range(args.rounds):  # interleaved rounds, CUDA-graph replay (GPU time)
            for key, fn in fns.items():
                row.setdefault(key, []).append(bench(captured(fn)))
        for key in fns:
            row[key] = sorted(row[key])[len(row[key]) // 2]
        base = row["two_stage"]
        for key in fns:
            if key != "two_stage":
                row[f"{key}_over_two_stage"] = row[key] / base
        row["seconds"] = time.time() - t0
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), commit=os.environ.get("COMMIT"),
                           rows=rows), fh, indent=1)


def main():
    sys.path.insert(0, os.path.dirname(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--shapes")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.check:
        check(args)
    else:
        timing(args)


if __name__ == "__main__":
    main()
