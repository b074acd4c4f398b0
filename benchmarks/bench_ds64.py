"""The 64-token dS pass, measured before it is built (issue 40; docs/training.md "A 64-token
reverse pass"): its serial kernel alone, against this backward's 16-token dS pass and fla's
64-token one (``chunk_gated_delta_rule_bwd_dhu``) at the same shapes, in one process.

    python benchmarks/bench_ds64.py [--shapes T1024_H16,T4096_H16] [--json out.json]
    TRITON_INTERPRET=1 python benchmarks/bench_ds64.py --check   (CPU: correctness only)

The question it answers: the 64-token form takes the serial dependency from four 16-token steps
a block to one step of [BV, K] x [K, 64] products, but its operands (W₆₄ from a 64 x 64 solve,
KEND₆₄ and QG₆₄ scaled by in-block decays) are fp32 values, not the fp16 ones whose tf32
products are exact, so it needs 3xTF32 products to keep this backward's accuracy, where fla's
runs bf16. Does such a serial pass, in plain Triton, run near fla's, and how far below the
chain's time? The operands are formed here in torch (fp64, from stage 1's real 16-token
operands, as ``tests/test_kernels_backward.py`` ``test_64_token_reverse_step_algebra`` checks
the algebra); the kernels that would form them (a chunk-parallel pass over 64-token blocks)
and turn dU₆₄ into the chain's dU (a block-triangular solve) are not built: their byte floors
are printed beside the figures.

Per 64-token block, in the transposed form of ``kernels/chunk_recurrent_bwd.py`` (dS^T: [BV, K]),
from the gradient dS'^T after the block:

    dU₆₄^T = dS'^T KEND₆₄^T + dO^T MQK₆₄                 [BV, 64]
    dS^T   = dS'^T diag(γ₆₄) + dO^T QG₆₄ - dU₆₄^T W₆₄     [BV, K]

Rows: the kernel's GPU time (``triton.testing.do_bench``, median) for each tile and precision,
the 16-token pass (serial and ``plan_reverse``'s split), fla's pass, and the error of each
pass's block-end gradients (``ends``) against the fp64 chain on the same operands.
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

from kdalab.inputs.sequences import draw, preset
from kdalab.kernels.api import _sm_count, prepare
from kdalab.kernels.chunk_recurrent_bwd import CKC, chunk_kda_bwd_recurrent
from kdalab.kernels.config import KernelConfig
from kdalab.kernels.contract import prefill_problem
from kdalab.kernels.launch_plan import ds_value_block, plan_reverse

BT, BB = 16, 64  # the chain's chunk, the block
#: name -> (B, T, H); K = V = 128
SHAPES = {"T1024_H16": (1, 1024, 16), "T4096_H16": (1, 4096, 16),
          "T8192_H64": (1, 8192, 64), "B8_T4096_H32": (8, 4096, 32)}
#: input families: model_like's own gate averages -3.2 a step (a block's decay e^-200: the
#: gradient after a block hardly reaches the one before, and the two forms agree whatever
#: their cross-block terms); its raw gate at N(-6, 1) decays -0.004 to -0.03 a step, so the
#: cross-block terms carry the result; collinear keys with β near 1 are the accuracy corner
FAMILIES = {"weak": ("model_like", dict(g_mean=-6.0)), "collinear": ("collinear", {})}
#: (BV, warps, stages) launches of the serial kernel in 3xTF32 (stages 2: Triton's software
#: pipeline may fetch the next block's operands, which do not depend on dS, during this one)
#: and the first two in plain tf32 too (the precision's price)
TILES = ((64, 4, 1), (128, 8, 1), (32, 4, 1), (64, 8, 1), (64, 4, 2), (128, 8, 2))


@triton.jit
def ds64_kernel(do_ptr, w_ptr, qg_ptr, ke_ptr, mqk_ptr, g_ptr, dht_ptr, ends_ptr, du_ptr,
                T, H, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                HAS_DHT: tl.constexpr, PREC: tl.constexpr):
    """The serial 64-token dS pass over one (sequence, head, value block) of fixed-length
    input (T % 64 == 0): the gradient after every block to ``ends`` ([blocks, H, V, K]),
    each block's dU₆₄^T to ``du`` (like dO, fp32)."""
    i_nh = tl.program_id(0)
    i_v = tl.program_id(1)
    i_n = (i_nh // H).to(tl.int64)
    i_h = i_nh % H
    o_r = tl.arange(0, 64)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    nb = T // 64
    if HAS_DHT:  # [N, H, K, V]
        dSt = tl.load(dht_ptr + ((i_n * H + i_h) * K + o_k[None, :]) * V + o_v[:, None])
    else:
        dSt = tl.zeros([BV, K], dtype=tl.float32)
    for ib in range(0, nb):
        b = nb - 1 - ib
        gb = (i_n * nb + b) * H + i_h
        tl.store(ends_ptr + gb * V * K + o_v[:, None] * K + o_k[None, :], dSt)
        rows = i_n * T + b * 64 + o_r
        tok = (rows[None, :] * H + i_h) * V + o_v[:, None]
        dot_ = tl.load(do_ptr + tok).to(tl.float32)
        kofs = (rows[:, None] * H + i_h) * K + o_k[None, :]
        ke = tl.load(ke_ptr + kofs)
        qg = tl.load(qg_ptr + kofs)
        w = tl.load(w_ptr + kofs)
        mqk = tl.load(mqk_ptr + gb * 4096 + o_r[:, None] * 64 + o_r[None, :])
        gam = tl.load(g_ptr + gb * K + o_k)
        dut = (tl.dot(dSt, tl.trans(ke), input_precision=PREC)
               + tl.dot(dot_, mqk, input_precision=PREC))
        tl.store(du_ptr + tok, dut)
        dSt = (dSt * gam[None, :] + tl.dot(dot_, qg, input_precision=PREC)
               - tl.dot(dut, w, input_precision=PREC))


def ds64(do, w64, qg64, ke64, mqk64, g64, dht, *, block_v, num_warps, precision,
         num_stages=1):
    B, T, H, V = do.shape
    K = w64.shape[-1]
    ends = torch.empty((B * (T // BB), H, V, K), device=do.device, dtype=torch.float32)
    du = torch.empty(do.shape, device=do.device, dtype=torch.float32)
    ds64_kernel[(B * H, V // block_v)](
        do, w64, qg64, ke64, mqk64, g64, dht if dht is not None else g64, ends, du, T, H,
        K=K, V=V, BV=block_v, HAS_DHT=dht is not None, PREC=precision, num_warps=num_warps,
        num_stages=num_stages)
    return ends, du


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


def operands64(ops, B, T, H):
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

    def rows(x):  # [B, nb, H, 64, K] -> [B, T, H, K] fp32
        return x.permute(0, 1, 3, 2, 4).reshape(B, T, H, K).float().contiguous()

    return (rows(W64), rows(QG64), rows(KE64),
            M.reshape(B * nb, H, BB, BB).float().contiguous(),
            decay(0, C).reshape(B * nb, H, K).float().contiguous())


def chain_ends64(ops, do, dht, B, T, H):
    """The 16-token chain in fp64 on the same operands: the gradient after every block,
    [blocks, H, V, K] (transposed as ``ends``)."""
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
    for c in reversed(range(nc)):
        if (c + 1) % (BB // BT) == 0:
            ends[:, c // (BB // BT)] = dS.transpose(-1, -2)
        dU = KE[:, c] @ dS + M16[:, c].transpose(-1, -2) @ dO[:, c]    # [B, H, 16, V]
        dS = G[:, c][..., None] * dS + QG[:, c].transpose(-1, -2) @ dO[:, c] \
            - W[:, c].transpose(-1, -2) @ dU
    return ends.reshape(B * (T // BB), H, V, K)


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def chain_pass(c, do, dht, sms, split):
    """This backward's 16-token dS pass as ``autograd.backward`` launches it (serial, or
    ``plan_reverse``'s split)."""
    p, seqs = c.p, c.seqs
    H, K, V = p.H, p.K, p.V
    block_v, warps = min(128, V), 8
    serial_bv = ds_value_block(p.num_seqs * H, V, block_v, warps, sms, None)
    blocks, block_offsets, _ = seqs.segments(CKC)
    segments = None
    if split:
        L = plan_reverse(seqs.n_chunks, H, K, V, sms, block_v, serial_bv)
        if L > 0:
            segments = seqs.segments(-(-L // CKC) * CKC)
    return lambda: chunk_kda_bwd_recurrent(
        do, c.ops, dht=dht, state_vk=False, cu_seqlens=None, chunk_offsets=None,
        num_seqs=p.num_seqs, seq_order=None, n_blocks=blocks.shape[0],
        block_offsets=block_offsets, segments=segments, ds_block_v=serial_bv,
        block_v=block_v, num_warps=warps, sms=sms, ds_dtype=torch.float32, precision="tf32")


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
    """Byte floors (ms at ``bw`` B/s): the serial kernel's (W₆₄, QG₆₄, KEND₆₄ fp32 read,
    dO bf16, MQK₆₄, dU₆₄ written fp32, the block-end gradients), the operand pass's (stage
    1's W, QG, KEND, KLO fp16 and γ read; W₆₄, QG₆₄, KEND₆₄, MQK₆₄, γ₆₄ written), the
    solve's (dU₆₄ read, dU written; X's blocks)."""
    th = B * T * H
    serial = th * (3 * K * 4 + V * 2 + BB * 4 + V * 4) + th // BB * V * K * 4
    prep = th * (4 * K * 2 + K * 4 / BT) + th * (3 * K * 4 + BB * 4) + th // BB * K * 4
    solve = th * (V * 4 * 2 + BB * 4)
    return {n: b / bw * 1e3 for n, b in (("serial", serial), ("prep", prep),
                                         ("solve", solve))}


def check_cpu():
    """The interpreter: the kernel's block-end gradients (exact fp32 products, and the 3xTF32
    path, which the interpreter also multiplies exactly) and the 16-token pass's against the
    fp64 chain on stage 1's real operands (T 192, H 2, K = V = 16), each family."""
    B, T, H, K, V = 1, 192, 2, 16, 16
    errs = {}
    for family in FAMILIES:
        c, do, dht = stage1(B, T, H, K, V, "cpu", family)
        want = chain_ends64(c.ops, do, dht, B, T, H)
        ops64 = operands64(c.ops, B, T, H)
        for prec in ("tf32x3", "ieee"):
            ends, _ = ds64(do, *ops64, dht, block_v=16, num_warps=4, precision=prec)
            errs[f"{family} ds64 {prec}"] = rel(ends, want)
        _, ends = chain_pass(c, do, dht, _sm_count(do.device), False)()
        errs[f"{family} chain"] = rel(ends, want)
    print(json.dumps(errs))
    # fp32 rounding of the formed operands and of the sums is what is left (measured 1e-7 to
    # 3e-7 a pass); a wrong term (a decay off by a chunk, a transposed block) gives 1e-2 and up
    bad = {n: e for n, e in errs.items() if not e < 1e-5}
    if bad:
        sys.exit(f"bench_ds64 --check: block-end gradients off the fp64 chain: {bad}")


def copy_bandwidth():
    src = torch.empty(2 ** 28, device="cuda")
    dst = torch.empty_like(src)
    return 2 * 2 ** 30 / (ms(lambda: dst.copy_(src)) * 1e-3)


def family_rows(B, T, H, K, V, family, sms, timed):
    """{pass: {err_<family>: the block-end gradients' error against the fp64 chain, ms: its
    time where ``timed``}} on one family's inputs."""
    c, do, dht = stage1(B, T, H, K, V, "cuda", family)
    want = chain_ends64(c.ops, do, dht, B, T, H)
    ops64 = operands64(c.ops, B, T, H)
    passes = {("chain_split" if split else "chain_serial"): chain_pass(c, do, dht, sms, split)
              for split in (False, True)}
    for prec, tiles in (("tf32x3", TILES), ("tf32", TILES[:2])):
        for bv, nw, st in tiles:
            passes[f"ds64_{prec}_bv{bv}_w{nw}_s{st}"] = (
                lambda bv=bv, nw=nw, st=st, prec=prec: ds64(
                    do, *ops64, dht, block_v=bv, num_warps=nw, precision=prec,
                    num_stages=st)[::-1])
    out = {}
    for key, fn in passes.items():
        _, ends = fn()  # (dU, ends), as the 16-token pass returns them
        out[key] = {f"err_{family}": rel(ends, want)}
        if timed:
            out[key]["ms"] = ms(fn)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="T1024_H16,T4096_H16,T8192_H64")
    ap.add_argument("--json", default=None)
    ap.add_argument("--check", action="store_true", help="CPU interpreter correctness only")
    ap.add_argument("--tiles", default=None, metavar="BVxWARPSxSTAGES,...",
                    help="some of the serial kernel's launches (default: TILES)")
    a = ap.parse_args()
    if a.check:
        check_cpu()
        return
    global TILES
    if a.tiles:
        try:
            TILES = tuple(tuple(int(n) for n in t.split("x")) for t in a.tiles.split(","))
        except ValueError:
            ap.error(f"--tiles: expected BVxWARPSxSTAGES,..., got {a.tiles!r}")
        if any(len(t) != 3 for t in TILES):
            ap.error(f"--tiles: expected BVxWARPSxSTAGES,..., got {a.tiles!r}")
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
