"""The 64-token dS pass (``kernels/chunk_recurrent64_bwd.py``, ``BWD_MODE["ds64"]``), measured
against the backward's 16-token dS pass and fla's 64-token one
(``chunk_gated_delta_rule_bwd_dhu``) at the same shapes, in one process (issue 40;
docs/training.md "A 64-token reverse pass").

    python benchmarks/bench_ds64.py [--shapes T1024_H16,T4096_H16] [--launches 0,3] [--json F]
    TRITON_INTERPRET=1 python benchmarks/bench_ds64.py --check   (CPU: correctness only)
    python benchmarks/bench_ds64.py --sm90 F   (no GPU: each launch compiled for sm_90a)
    python benchmarks/bench_ds64.py --page RAW PAGE   (a device run's JSON as a results page)

The question: the 64-token form takes the serial dependency from four 16-token steps a block
to one step of [BV, K] x [K, 64] products, but its operands (W₆₄ from a 64 x 64 solve, KEND₆₄
and QG₆₄ scaled by in-block decays) are fp32 values, not the fp16 ones whose tf32 products are
exact, so its products need more than one tf32 product each to keep this backward's accuracy,
where fla's runs bf16; and it writes its operands in fp32 and reads them back. Does it, in
plain Triton, run near fla's pass, and below the chain's time, within the chain's error?

Rows: each pass's GPU time (``triton.testing.do_bench``, median): the 64-token pass whole at
each of ``LAUNCHES`` and its three kernels alone, the 16-token pass (serial and
``plan_reverse``'s split), fla's; each pass's block-end gradients and dU against the fp64 16-token
chain on the same stage-1 operands, two input families; the byte floors beside them. Fixed-length
shapes (the 64-token pass takes T % 64 == 0 only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import triton

from kdalab.inputs.sequences import draw, preset
from kdalab.kernels import autograd as kernel_autograd
from kdalab.kernels.api import _sm_count, prepare
from kdalab.kernels.chunk_recurrent64_bwd import (
    BB,
    chunk_kda_bwd_recurrent64,
    ds64,
    ds64_kernel,
    prep64,
    prep64_kernel,
    solve64,
    solve64_kernel,
)
from kdalab.kernels.chunk_recurrent_bwd import CKC
from kdalab.kernels.config import DOT_PRECISION, KernelConfig
from kdalab.kernels.contract import prefill_problem

BT = 16  # the chain's chunk
#: name -> (B, T, H); K = V = 128
SHAPES = {"T1024_H16": (1, 1024, 16), "T4096_H16": (1, 4096, 16),
          "T8192_H64": (1, 8192, 64), "B8_T4096_H32": (8, 4096, 32)}
#: input families: model_like's own gate averages -3.2 a step (a block's decay e^-200: the
#: gradient after a block hardly reaches the one before, and the two forms agree whatever
#: their cross-block terms); its raw gate at N(-6, 1) decays -0.004 to -0.03 a step, so the
#: cross-block terms carry the result; collinear keys with β near 1 are the accuracy corner
FAMILIES = {"weak": ("model_like", dict(g_mean=-6.0)), "collinear": ("collinear", {})}
#: the launches timed: (precision, BV, warps, stages) of the serial kernel, chosen by their
#: sm_90a compiles (``--sm90``: the fewest spills of each precision; stages 2, Triton's
#: software pipeline fetching the next block's operands, which do not depend on dS, during this
#: one); tf32 is the precision's price. The serial kernel with the operands formed in it
#: (fused64_kernel, in this script at 2858fc5, deleted) spilled 5,876 bytes a thread in tf32
#: and 15,784 in 3xTF32 on sm_90a: not timed
LAUNCHES = (("mixed", 64, 8, 1), ("mixed", 128, 8, 1), ("mixed", 32, 4, 1),
            ("split", 64, 8, 1), ("split", 128, 8, 1), ("split", 32, 4, 1),
            ("tf32x3", 128, 8, 1), ("tf32x3", 64, 4, 2),
            ("tf32", 128, 8, 1), ("tf32", 64, 8, 1))


def path64(c, do, dht, B, T, H, *, block_v, num_warps, num_stages=1, precision="mixed"):
    """The whole 64-token pass: (the chain's dU, the block-end gradients), as the 16-token
    pass."""
    return chunk_kda_bwd_recurrent64(do, c.ops, dht=dht, state_vk=False, block_v=block_v,
                                     num_warps=num_warps, precision=precision,
                                     num_stages=num_stages)


def stage1(B, T, H, K, V, device, family="weak", seed=0):
    """Inputs of ``FAMILIES[family]`` (bf16 on the GPU, fp32 in the interpreter; the
    lower-bounded gate) and stage 1's recompute as the backward makes it
    (``autograd.backward``: 3xTF32 products), with dO and dHT drawn."""
    name, changes = FAMILIES[family]
    spec = preset(name, T=T, batch=B, seqlens=None, heads=H, K=K, V=V, lower_bound=-5.0,
                  initial_state="none", **changes)
    x = draw(spec, seed, device)
    if device == "cpu":
        x = {n: t.float() if torch.is_tensor(t) and t.is_floating_point() else t
             for n, t in x.items()}
    q, k, v, g, beta = (x[n].contiguous() for n in ("q", "k", "v", "g", "beta"))
    A_log, dt_bias = x["A_log"], x["dt_bias"].reshape(-1).contiguous()
    config = KernelConfig()
    p = prefill_problem(q, k, v, g, beta, scale=None, initial_state=None, A_log=A_log,
                        dt_bias=dt_bias, gate="raw", lower_bound=-5.0, cu_seqlens=None,
                        use_qk_l2norm=True, beta_is_logits=True, state_layout="KV",
                        config=config)
    c = prepare(q, k, g, beta, A_log, dt_bias, p, None, config, precision="tf32x3")
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(B, T, H, V, generator=gen).to(device, v.dtype)
    dht = torch.randn(B, H, K, V, generator=gen).to(device)
    return c, do, dht


def operands64(ops, B, T, H, dtype=torch.float32):
    """The 64-token operands from stage 1's 16-token ones (training.md), fp64 then fp32:
    W₆₄, QG₆₄, KEND₆₄ token-major like q; MQK₆₄ [blocks, H, 64, 64]; γ₆₄ [blocks, H, K]."""
    w, qg, kend, klo, _, mqk, gamma = ops
    K, nb, C = w.shape[-1], T // BB, BB // BT
    f = dict(dtype=torch.float64)

    def tok(x):  # [B, T, H, K] -> [B, nb, H, C, 16, K]
        return x.to(**f).view(B, nb, C, BT, H, K).permute(0, 1, 4, 2, 3, 5)

    W, QG, KE = tok(w), tok(qg), tok(kend.to(**f) + klo.to(**f))
    G = gamma.to(**f).view(B, nb, C, H, K).permute(0, 1, 3, 2, 4)        # [B, nb, H, C, K]
    M16 = mqk.to(**f).view(B, nb, C, H, BT, BT).permute(0, 1, 3, 2, 4, 5)
    one = torch.ones_like(G[..., 0, :])

    def decay(lo, hi):  # Π_{lo <= j < hi} γ_j
        out = one
        for j in range(lo, hi):
            out = out * G[..., j, :]
        return out

    X = torch.zeros(B, nb, H, BB, BB, device=w.device, **f)
    M = torch.zeros_like(X)
    for c in range(C):
        rc = slice(c * BT, (c + 1) * BT)
        M[..., rc, rc] = M16[..., c, :, :]
        for cp in range(c):
            e = decay(cp + 1, c)[..., None, :]
            rp = slice(cp * BT, (cp + 1) * BT)
            X[..., rc, rp] = (W[..., c, :, :] * e) @ KE[..., cp, :, :].transpose(-1, -2)
            M[..., rc, rp] = (QG[..., c, :, :] * e) @ KE[..., cp, :, :].transpose(-1, -2)
    eye = torch.eye(BB, device=w.device, **f)
    rhs = torch.cat([W[..., c, :, :] * decay(0, c)[..., None, :] for c in range(C)], -2)
    W64 = torch.linalg.solve_triangular(eye + X, rhs, upper=False, unitriangular=True)
    QG64 = torch.cat([QG[..., c, :, :] * decay(0, c)[..., None, :] for c in range(C)], -2)
    KE64 = torch.cat([KE[..., c, :, :] * decay(c + 1, C)[..., None, :] for c in range(C)], -2)

    def rows(x):  # [B, nb, H, 64, K] -> [B, T, H, K]
        return x.permute(0, 1, 3, 2, 4).reshape(B, T, H, K).to(dtype).contiguous()

    return (rows(W64), rows(QG64), rows(KE64),
            M.reshape(B * nb, H, BB, BB).to(dtype).contiguous(),
            decay(0, C).reshape(B * nb, H, K).to(dtype).contiguous())


def chain_ends64(ops, do, dht, B, T, H):
    """The 16-token chain in fp64 on the same operands: (the gradient after every block,
    [blocks, H, V, K] (transposed as ``ends``); each chunk's dU, like dO)."""
    w, qg, kend, klo, _, mqk, gamma = ops
    K, V, nc = w.shape[-1], do.shape[-1], T // BT
    f = dict(dtype=torch.float64)
    W, QG = (x.to(**f).view(B, nc, BT, H, K).permute(0, 1, 3, 2, 4) for x in (w, qg))
    KE = (kend.to(**f) + klo.to(**f)).view(B, nc, BT, H, K).permute(0, 1, 3, 2, 4)
    M16 = mqk.to(**f).view(B, nc, H, BT, BT)
    G = gamma.to(**f).view(B, nc, H, K)
    dO = do.to(**f).view(B, nc, BT, H, V).permute(0, 1, 3, 2, 4)
    dS = dht.to(**f)                                                      # [B, H, K, V]
    ends = torch.empty(B, T // BB, H, V, K, device=do.device, **f)
    dUs = torch.empty(B, nc, H, BT, V, device=do.device, **f)
    for c in reversed(range(nc)):
        if (c + 1) % (BB // BT) == 0:
            ends[:, c // (BB // BT)] = dS.transpose(-1, -2)
        dU = KE[:, c] @ dS + M16[:, c].transpose(-1, -2) @ dO[:, c]    # [B, H, 16, V]
        dUs[:, c] = dU
        dS = G[:, c][..., None] * dS + QG[:, c].transpose(-1, -2) @ dO[:, c] \
            - W[:, c].transpose(-1, -2) @ dU
    return (ends.reshape(B * (T // BB), H, V, K),
            dUs.permute(0, 1, 3, 2, 4).reshape(B, T, H, V))


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def chain_pass(c, do, dht, sms, split):
    """This backward's 16-token dS pass, launched by ``autograd._ds_pass`` with the tile
    ``autograd.backward`` gives it: ``plan_reverse``'s split, or (``split`` False) serial."""
    tile = dict(state_vk=False, block_v=min(128, c.p.V), num_warps=8, sms=sms,
                ds_dtype=kernel_autograd.BWD_PRODUCTS["ds_dtype"],
                precision=DOT_PRECISION[c.dot])
    config = KernelConfig()
    if not split:  # a given serial split: the plan's, which _ds_pass then keeps
        config = KernelConfig(segment_chunks=0)
        c = c._replace(plan=dataclasses.replace(c.plan, segment_chunks=0))
    blocks, block_offsets, _ = c.seqs.segments(CKC)
    return lambda: kernel_autograd._ds_pass(do, dht, c, config, tile, blocks.shape[0],
                                            block_offsets)


def fla_pass(B, T, H, K, V):
    """fla's 64-token dS pass (bf16 operands) on random inputs of the shape."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu

    gen = torch.Generator().manual_seed(1)
    r = lambda *s: (torch.randn(*s, generator=gen) * 0.1).cuda()  # noqa: E731
    q, k, w = (r(B, T, H, K).bfloat16() for _ in range(3))
    do, dv = (r(B, T, H, V).bfloat16() for _ in range(2))
    gk = -torch.rand(B, T, H, K, generator=gen).cuda().cumsum(1) * 0.01
    gk = gk.view(B, T // BB, BB, H, K)
    gk = (gk - gk[:, :, :1]).view(B, T, H, K).float().contiguous()
    dht = r(B, H, K, V).float()
    return lambda: chunk_gated_delta_rule_bwd_dhu(q=q, k=k, w=w, do=do, dv=dv, gk=gk,
                                                  dht=dht, scale=K ** -0.5, chunk_size=BB)


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def floors(B, T, H, K, V, bw):
    """Byte floors (ms at ``bw`` B/s) of each kernel: the serial one's (W₆₄, QG₆₄, KEND₆₄ fp32
    and MQK₆₄ read, dO bf16, dU₆₄ written fp32, the block-end gradients), the operands'
    (stage 1's W, QG, KEND, KLO fp16, MQK and γ read; W₆₄, QG₆₄, KEND₆₄, MQK₆₄, X, γ₆₄
    written), the solve's (dU₆₄ and X read, dU written); and the 16-token pass's, once over
    the tokens (its split reads them twice: summaries, then the pass)."""
    th = B * T * H
    ends = th // BB * V * K * 4
    serial = th * (3 * K * 4 + BB * 4 + V * 2 + V * 4) + ends
    prep = th * (4 * K * 2 + BT * 2 + K * 4 / BT) + th * (3 * K * 4 + 2 * BB * 4 + K * 4 / BB)
    solve = th * (2 * V * 4 + BB * 4)
    chain = th * (4 * K * 2 + BT * 2 + V * 2 + V * 4) + ends
    return {n: b / bw * 1e3 for n, b in (("serial64", serial), ("prep64", prep),
                                         ("solve64", solve), ("chain", chain))}


def check_cpu():
    """The interpreter (which multiplies fp32 exactly, 3xTF32 too): on stage 1's real operands
    (T 192, H 2, K 64: two passes of ``prep64_kernel``'s key columns; V 16), each family,
    ``prep64_kernel``'s operands against ``operands64``'s (fp64), and the block-end gradients
    and dU of the whole 64-token pass (operands, serial pass, solve; each precision) and of
    the 16-token pass against the fp64 chain's; then the device run's rows (``family_rows``,
    untimed: every launch) at T 128, K = V = 128, so that a device call does not find a
    broken launch."""
    B, T, H, K, V = 1, 192, 2, 64, 16
    errs = {}
    for family in FAMILIES:
        c, do, dht = stage1(B, T, H, K, V, "cpu", family)
        want_ends, want_du = chain_ends64(c.ops, do, dht, B, T, H)
        ref = operands64(c.ops, B, T, H, torch.float64)
        for name, got, r in zip(("W64", "QG64", "KEND64", "MQK64", "gamma64"),
                                prep64(c.ops, B, T, H)[0], ref):
            errs[f"{family} {name}"] = rel(got, r)
        for prec in ("tf32x3", "ieee", "split", "mixed"):
            du, ends = path64(c, do, dht, B, T, H, block_v=16, num_warps=4, precision=prec)
            errs[f"{family} ds64 {prec} ends"] = rel(ends, want_ends)
            errs[f"{family} ds64 {prec} dU"] = rel(du, want_du)
        du, ends = chain_pass(c, do, dht, _sm_count(do.device), False)()
        errs[f"{family} chain ends"] = rel(ends, want_ends)
        errs[f"{family} chain dU"] = rel(du, want_du)
    # the device run's own rows, untimed, at a small shape with every launch (K = V = 128)
    for key, fig in family_rows(1, 128, 1, 128, 128, "weak", _sm_count(torch.device("cpu")),
                                timed=False, device="cpu").items():
        errs[f"run {key} ends"], errs[f"run {key} dU"] = fig["err_weak"], fig["du_err_weak"]
    print(json.dumps(errs))
    # fp32 rounding of the formed operands and of the sums is what is left (measured 2.6e-8 to
    # 5.3e-7); a wrong operand (KEND₆₄ 10 % off, the tests' probe) gives 8e-3 to 0.13
    bad = {n: e for n, e in errs.items() if not e < 1e-5}
    if bad:
        sys.exit(f"bench_ds64 --check: off the fp64 chain: {bad}")


def copy_bandwidth():
    src = torch.empty(2 ** 28, device="cuda")
    dst = torch.empty_like(src)
    return 2 * 2 ** 30 / (ms(lambda: dst.copy_(src)) * 1e-3)


def _launch(form, prec, bv, nw, st):
    return f"{form}_{prec}_bv{bv}_w{nw}_s{st}"


def family_rows(B, T, H, K, V, family, sms, timed, device="cuda"):
    """{pass: {err_<family>: its block-end gradients' error against the fp64 chain's,
    du_err_<family>: its dU's, ms: its time where ``timed``}} on one family's inputs. The
    passes: the 16-token one (serial, split); the 64-token one at each of ``LAUNCHES``; where
    timed, its three kernels alone too (the serial one at each path launch)."""
    c, do, dht = stage1(B, T, H, K, V, device, family)
    want_ends, want_du = chain_ends64(c.ops, do, dht, B, T, H)
    passes = {("chain_split" if split else "chain_serial"): chain_pass(c, do, dht, sms, split)
              for split in (False, True)}
    for prec, bv, nw, st in LAUNCHES:
        passes[_launch("path64", prec, bv, nw, st)] = (
            lambda bv=bv, nw=nw, st=st, prec=prec: path64(
                c, do, dht, B, T, H, block_v=bv, num_warps=nw, num_stages=st, precision=prec))
    out = {}
    for key, fn in passes.items():
        du, ends = fn()
        out[key] = {f"err_{family}": rel(ends, want_ends), f"du_err_{family}": rel(du, want_du)}
        if timed:
            out[key]["ms"] = ms(fn)
    if timed:  # the path's kernels alone
        ops64, x64 = prep64(c.ops, B, T, H)
        out["prep64"] = dict(ms=ms(lambda: prep64(c.ops, B, T, H)))
        for prec, bv, nw, st in LAUNCHES:
            out[_launch("serial64", prec, bv, nw, st)] = dict(ms=ms(
                lambda bv=bv, nw=nw, st=st, prec=prec: ds64(
                    do, *ops64, dht, block_v=bv, num_warps=nw, precision=prec,
                    num_stages=st)))
        du64 = ds64(do, *ops64, dht, block_v=64, num_warps=8, precision="mixed")[1]
        out["solve64"] = dict(ms=ms(lambda: solve64(du64, x64)))
    return out


def sm90_rows(commit):
    """The prototypes' sm_90a compiles (``scripts/sm90_report.py``: registers, spills, shared
    memory, tensor-core instructions), each of ``LAUNCHES`` and the operand and solve kernels,
    beside the 16-token pass's kernel: page rows (value: bytes of spill stores a thread)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "scripts"))
    from sm90_report import report

    from kdalab.kernels.chunk_recurrent_bwd import chunk_kda_bwd_recurrent_kernel

    f16, f32 = "*fp16", "*fp32"
    stage = dict(w_ptr=f16, qg_ptr=f16, kend_ptr=f16, klo_ptr=f16, mqk_ptr=f16, gamma_ptr=f32,
                 T="i32", H="i32")
    out = dict(ends_ptr=f32, du_ptr=f32, dht_ptr=f32, do_ptr="*bf16")
    chain = dict(stage, **out, sum_ptr=f32, cu_seqlens_ptr="*i32", chunk_offsets_ptr="*i32",
                 seq_order_ptr="*i32", seg_ptr="*i32", seg_off_ptr="*i32")
    serial = dict(out, w_ptr=f32, qg_ptr=f32, ke_ptr=f32, mqk_ptr=f32, g_ptr=f32, T="i32",
                  H="i32")
    jobs = [("the 16-token pass (pass 3, serial) BV128 w8", chunk_kda_bwd_recurrent_kernel,
             chain, dict(K=128, V=128, BT=16, BV=128, CKC=4, HAS_DHT=True, STATE_VK=False,
                         IS_VARLEN=False, PASS=3, SEG=False), 8, 1)]
    for prec, bv, nw, st in LAUNCHES:
        jobs.append((f"serial 64-token pass {prec} BV{bv} w{nw} s{st}", ds64_kernel, serial,
                     dict(K=128, V=128, BV=bv, HAS_DHT=True, STATE_VK=False, PREC=prec), nw,
                     st))
    for bk in (16, 32):
        jobs.append((f"operands (prep64) tf32x3 BK{bk} w4", prep64_kernel,
                     dict(stage, w64_ptr=f32, qg64_ptr=f32, ke64_ptr=f32, mqk64_ptr=f32,
                          g64_ptr=f32, x64_ptr=f32), dict(K=128, BK=bk, PREC="tf32x3"), 4, 1))
    jobs.append(("solve64 tf32x3 BV64 w4", solve64_kernel,
                 dict(du64_ptr=f32, x64_ptr=f32, du_ptr=f32, H="i32"),
                 dict(V=128, BV=64, PREC="tf32x3"), 4, 1))
    rows = []
    for label, fn, sig, ce, nw, st in jobs:
        r = report(fn, sig, ce, num_warps=nw, num_stages=st, label=label)
        rows.append(dict(target=f"sm_90a {label} (K = V = 128): spill stores", unit="B/thread",
                         value=r["spill_st"],
                         note=f"{r['regs']} registers, spill loads {r['spill_ld']} B, shared "
                              f"{r['smem']} B, wgmma {r['wgmma']}, mma {r['mma']}, "
                              f"SASS {r['sass']} instructions"))
        print(json.dumps(rows[-1]), flush=True)
    return dict(benchmark="ds64_sm90", device=f"none (ptxas of triton {triton.__version__}, "
                "sm_90a)", date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                commit=commit, command="python benchmarks/bench_ds64.py --sm90 "
                "benchmarks/results/ds64_sm90.json", rows=rows)


def page_of(raw, command):
    """A device run's JSON (``--json``) as a results page: per shape the backward's 16-token
    pass, the 64-token pass's fastest launch of the precisions that keep the collinear
    gradients (mixed, split: training.md), and the fastest of any precision (tf32 too)."""
    rows = []
    for r in raw["rows"]:
        name, fl = r["shape"], r["floors_ms"]
        paths = {k: v for k, v in r.items() if k.startswith("path64_") and "ms" in v}
        chain = r["chain_split"]
        fla = r.get("fla_dhu", {}).get("ms")
        rows.append(dict(
            target=f"ds64 {name}: the backward's 16-token dS pass (plan_reverse's split)",
            unit="ms", value=round(chain["ms"], 4),
            note=f"floor {fl['chain']:.3f} ms; its serial form {r['chain_serial']['ms']:.3f} ms; "
                 f"block-end gradients vs the fp64 chain {chain['err_weak']:.2g} (weak decay), "
                 f"{chain['err_collinear']:.2g} (collinear); fla's dS pass "
                 + (f"{fla:.3f} ms" if fla else "not run")))
        best = min((k for k in paths if k.split("_")[1] in ("mixed", "split")),
                   key=lambda k: paths[k]["ms"])
        v, launch = paths[best], best.removeprefix("path64_")
        rows.append(dict(
            target=f"ds64 {name}: the 64-token pass, fastest launch ({launch})", unit="ms",
            value=round(v["ms"], 4),
            note=f"{v['ms'] / chain['ms']:.2f}x the 16-token pass; its kernels alone: operands "
                 f"{r['prep64']['ms']:.3f} ms (floor {fl['prep64']:.3f}), serial "
                 f"{r['serial64_' + launch]['ms']:.3f} (floor {fl['serial64']:.3f}), solve "
                 f"{r['solve64']['ms']:.3f} (floor {fl['solve64']:.3f}); block-end gradients "
                 f"{v['err_weak']:.2g} (weak), {v['err_collinear']:.2g} (collinear)"))
        per = {}
        for k, fig in paths.items():
            prec = k.split("_")[1]
            if prec not in per or fig["ms"] < paths[per[prec]]["ms"]:
                per[prec] = k
        fastest = min(per.values(), key=lambda k: paths[k]["ms"])
        rows.append(dict(
            target=f"ds64 {name}: the 64-token pass over the 16-token one, fastest launch of "
                   "any precision", unit="x", value=round(paths[fastest]["ms"] / chain["ms"], 3),
            note=", ".join(f"{p} {paths[k]['ms']:.3f} ms ({k.removeprefix('path64_' + p + '_')}"
                           f", collinear {paths[k]['err_collinear']:.2g})"
                           for p, k in per.items())))
    return dict(benchmark="ds64_" + ("h100" if "H100" in raw["device"] else "h200"),
                device=f"{raw['device']}, copy {raw['copy_bw_tbs']:.2f} TB/s",
                date=raw["date"], commit=raw["commit"], command=command, rows=rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="T1024_H16,T4096_H16,T8192_H64")
    ap.add_argument("--json", default=None)
    ap.add_argument("--check", action="store_true", help="CPU interpreter correctness only")
    ap.add_argument("--launches", default=None, metavar="N,N,...",
                    help="some of LAUNCHES, by index (default: all)")
    ap.add_argument("--sm90", default=None, metavar="JSON",
                    help="no GPU: compile the prototypes for sm_90a and write their page here")
    ap.add_argument("--page", nargs=2, default=None, metavar=("RAW", "PAGE"),
                    help="no GPU: a device run's --json as a results page")
    a = ap.parse_args()
    if a.page:
        with open(a.page[0]) as fh:
            out = page_of(json.load(fh), "python benchmarks/bench_ds64.py --page "
                          + " ".join(a.page))
        with open(a.page[1], "w") as fh:
            json.dump(out, fh, indent=1)
        return
    if a.check:
        check_cpu()
        return
    if a.sm90:
        page = sm90_rows(os.environ.get("KDALAB_COMMIT", "unknown"))
        with open(a.sm90, "w") as fh:
            json.dump(page, fh, indent=1)
        return
    global LAUNCHES
    if a.launches:
        try:
            LAUNCHES = tuple(LAUNCHES[int(i)] for i in a.launches.split(","))
        except (ValueError, IndexError):
            ap.error(f"--launches: indices of LAUNCHES (0-{len(LAUNCHES) - 1}), got "
                     f"{a.launches!r}")
    unknown = [s for s in a.shapes.split(",") if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; known: {', '.join(SHAPES)}")
    bw = copy_bandwidth()
    rows, K, V = [], 128, 128
    sms = _sm_count(torch.device("cuda"))
    print(json.dumps(dict(copy_bw_tbs=bw / 1e12, device=torch.cuda.get_device_name())),
          flush=True)
    for name in a.shapes.split(","):
        B, T, H = SHAPES[name]
        row = dict(shape=name, floors_ms=floors(B, T, H, K, V, bw))
        for i, family in enumerate(FAMILIES):  # the first family's passes timed too
            for key, fig in family_rows(B, T, H, K, V, family, sms, timed=i == 0).items():
                row.setdefault(key, {}).update(fig)
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)  # before fla's, which may autotune for minutes
        try:
            row["fla_dhu"] = dict(ms=ms(fla_pass(B, T, H, K, V)))
        except Exception as e:  # noqa: BLE001 - fla absent or changed: the row says so
            row["fla_dhu"] = dict(error=f"{type(e).__name__}: {e}"[:200])
        print(json.dumps(dict(shape=name, fla_dhu=row["fla_dhu"])), flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(benchmark="ds64", device=torch.cuda.get_device_name(),
                           date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                           commit=os.environ.get("KDALAB_COMMIT", "unknown"),
                           copy_bw_tbs=bw / 1e12, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
