"""Backward of stage 1: from the gradients of the chunk operands (``chunk_recurrent_bwd.py``)
to those of the inputs, one program per 16-token chunk and head, recomputing what stage 1
formed (``chunk_prepare.py``) in fp32, over blocks of 32 key columns.

With G the in-chunk cumulative log-decay (base 2 here: G₂; ∂2^x/∂x = ln 2 · 2^x), Γ = 2^G₂,
k̂, q̂ the normalized rows, qs = scale · q̂, and T = (I + L)^-1:

    W = A Kd,  A = T diag(β),  Kd = Γ ⊙ k̂           dA += dW Kd^T,   dKd = A^T dW
                                                    dβ_j += Σ_i T_ij dA_ij,   dT = dA diag(β)
    T = (I + L)^-1                                  dL = -T^T dT T^T   (strictly lower)
    L_ij = β_i P_ij,  P_ij = Σ_c k̂_ic k̂_jc 2^(G_ic - G_jc)      dβ_i += Σ_j dL_ij P_ij
    MQK_ij = Σ_c qs_ic k̂_jc 2^(G_ic - G_jc)  (i >= j)
    QG = Γ ⊙ qs,  KEND = 2^(G_last - G) ⊙ k̂,  GAMMA = 2^G_last

P and MQK's gradients reach k̂ (as a row and as a column), qs and G through the same pairwise
decay the forward used: split (2^G_i · 2^-G_j, dense products, scaled by a fixed power of two:
``ANCHOR``) for the rows before the first whose decay leaves the split's range, per pair for the
rest (``gate.py``), so that no row's gradient depends on a later row's decay. Their G-gradient
is ln 2 · (k̂ ⊙ dk̂_row + qs ⊙ dqs_pair - k̂ ⊙ dk̂_col). G's gradient then goes back through the
cumulative sum (a reverse sum over the chunk's rows), the gate (``gate.log2_decay_grads``: dg,
and per chunk the sums for dA_log and ddt_bias), β's sigmoid and the L2 norms
(dx = r (dy - y (y · dy)), y = x r). Outputs are per value head (GVA's heads: summed on the host).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_prepare import (
    AUX_RK,
    AUX_RQ,
    AUX_SIZE,
    _mm3,
    _split,
    beta_of,
    inverse16,
    pairwise_tiles,
    substitution,
)
from .contract import Problem
from .gate import LN2, SPLIT_SPAN2, gate_params, log2_decay, log2_decay_grads
from .indexing import chunk_of_program

CHUNK = 16
#: the split exponent's fixed anchor, 2^57 (G = -57, about half the split's range): the two
#: factors 2^G_i · 2^57 and 2^-G_j · 2^-57 are the forward's (anchored at 0) scaled exactly,
#: within 2^±59 like a midpoint anchor's, yet the same bits whatever the later rows' decay
ANCHOR = tl.constexpr(2.0 ** 57)


@triton.jit
def pairwise_grads(dP, dM, kv, qs, g2, o_r, BT: tl.constexpr):
    """(dk̂ as a row, dqs, dk̂ as a column, the steps' G-gradient) of Σ dP_ij P_ij + Σ dM_ij
    MQK_ij over the strictly lower pairs, each pair's decay formed per pair
    (``chunk_prepare.pairwise_tiles``). A pair (i, j) depends on the steps r in (j, i]: their
    gradient is summed straddling, Σ_{i >= r > j}, never as a row's share minus a column's
    (that difference loses a strong channel's small gradient to the rounding of large
    terms)."""
    drow = tl.zeros(kv.shape, dtype=tl.float32)
    dqs = tl.zeros(kv.shape, dtype=tl.float32)
    dcol = tl.zeros(kv.shape, dtype=tl.float32)
    dstep = tl.zeros(kv.shape, dtype=tl.float32)
    for j in range(0, BT):  # not unrolled: 16 bodies would spill
        sel = (o_r == j)[:, None]
        kj = tl.sum(tl.where(sel, kv, 0.0), axis=0)
        gj = tl.sum(tl.where(sel, g2, 0.0), axis=0)
        e = tl.exp2(tl.minimum(g2 - gj[None, :], 0.0))
        ke = kj[None, :] * e
        cp = tl.sum(tl.where((o_r == j)[None, :], dP, 0.0), axis=1)  # column j of dP
        cm = tl.sum(tl.where((o_r == j)[None, :], dM, 0.0), axis=1)
        drow += cp[:, None] * ke
        dqs += cm[:, None] * ke
        x = (cp[:, None] * kv + cm[:, None] * qs) * e  # rows i: pair (i, j) without k̂_j
        dcol += tl.where(sel, tl.sum(x, axis=0)[None, :], 0.0)
        dstep += tl.where((o_r > j)[:, None], tl.cumsum(x * kj[None, :], axis=0, reverse=True),
                          0.0)
    return drow, dqs, dcol, dstep


@triton.jit
def _dot3(a_hi, a_lo, b):
    """a @ b as ``_mm3`` with ``a`` split once by the caller, ``b`` here."""
    b_hi, b_lo = _split(b)
    return _mm3(a_hi, a_lo, b_hi, b_lo)


@triton.jit
def _load_block(ptr, rows, i_h, o_k, H, K: tl.constexpr, G: tl.constexpr, m2):
    """A chunk's rows of head ``i_h // G`` (of H // G heads), columns ``o_k``, in fp32."""
    offs = (rows[:, None] * (H // G) + i_h // G) * K + o_k[None, :]
    return tl.load(ptr + offs, mask=m2, other=0.0).to(tl.float32)


@triton.jit
def _norms_and_spans(q_ptr, k_ptr, g_ptr, a_log_ptr, dt_bias_ptr, a, lower_bound, rows, i_h,
                     i_g, m2, H, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     GATE: tl.constexpr, SPAN_CHECK: tl.constexpr, HAS_A_LOG: tl.constexpr,
                     HAS_DT_BIAS: tl.constexpr, USE_L2NORM: tl.constexpr, GQ: tl.constexpr,
                     GG: tl.constexpr):
    """Sweep (A) of ``chunk_kda_prepare_bwd_kernel`` without the recompute's ``AUX``: the
    rows' norm factors of k and q and, with ``SPAN_CHECK``, their decay's span (the split's
    choice, row by row, as stage 1's)."""
    ssk = tl.zeros([BT], dtype=tl.float32)
    ssq = tl.zeros([BT], dtype=tl.float32)
    rspan = tl.zeros([BT], dtype=tl.float32)
    for kb in range(0, K, BK):
        o_k = kb + tl.arange(0, BK)
        k_raw = _load_block(k_ptr, rows, i_h, o_k, H, K, GQ, m2)
        q_raw = _load_block(q_ptr, rows, i_h, o_k, H, K, GQ, m2)
        ssk += tl.sum(k_raw * k_raw, axis=1)
        ssq += tl.sum(q_raw * q_raw, axis=1)
        if SPAN_CHECK:
            _, bias = gate_params(a_log_ptr, dt_bias_ptr, i_g, o_k, K, HAS_A_LOG, HAS_DT_BIAS)
            g_raw = _load_block(g_ptr, rows, i_h, o_k, H, K, GG, m2)
            g2 = tl.cumsum(log2_decay(g_raw, a, bias[None, :], lower_bound, m2, GATE), axis=0)
            rspan = tl.maximum(rspan, tl.max(tl.abs(g2), axis=1))
    if USE_L2NORM:
        rk = tl.rsqrt(ssk + 1e-6)
        rq = tl.rsqrt(ssq + 1e-6)
    else:
        rk = tl.full([BT], 1.0, tl.float32)
        rq = tl.full([BT], 1.0, tl.float32)
    return rk, rq, rspan


@triton.jit
def chunk_kda_prepare_bwd_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
    dqg_ptr, dw_ptr, dkend_ptr, dgam_ptr, dmqk_ptr, dainv_ptr,
    dq_ptr, dk_ptr, dg_ptr, db_ptr, dalog_ptr, ddt_ptr,
    chunk_table_ptr, aux_ptr, T, scale, lower_bound,
    H, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr,
    SPAN_CHECK: tl.constexpr, HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    USE_L2NORM: tl.constexpr, BETA_LOGITS: tl.constexpr, IS_VARLEN: tl.constexpr,
    GQ: tl.constexpr = 1, GG: tl.constexpr = 1, SUBST: tl.constexpr = False,
    AUX: tl.constexpr = False,
):
    """One chunk and head, over blocks of BK key columns, so that a program holds [BT, BK]
    tiles, not [BT, K] ones: every operand but the L2 norms and the pairwise tiles is
    column-local (the gate, its cumulative sum, the decays, each column's G-gradient). Four
    sweeps: (A) the rows' norms and spans; (B) P and dW·Kd^T, summed over the
    blocks; then the [BT, BT] algebra once; (C) each block's gradients, dg stored, dk̂ and dqs
    parked in place of the block's dW and dQG (every stored value depends on the loaded one,
    so no thread overwrites an operand before it is read: dW reaches dk̂ through A^T·dW, dQG
    reaches dqs elementwise), the rows' y·dy summed for the norms; (D) the norms' gradient,
    dq and dk stored. Against the kernel over whole rows (H200, train_h200's config rows):
    0.568 against 0.664 ms at T 4096 H 16, 4.41 against 5.13 at T 8192 H 64, 8.73 against
    9.88 at B 8 T 4096 H 32 (sm_90a: 28 bytes of spills a thread against 2120).

    ``AUX`` (a gate without a span check): the norm factors, P and (I + L)^-1 are the
    recompute's (``chunk_prepare``'s ``AUX``: fp32, its 3xTF32 products), read instead of
    formed: no sweep (A), no P in (B), no inverse."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    o_r = tl.arange(0, BT)
    row0, eos = chunk_of_program(i_c, chunk_table_ptr, T, BT, IS_VARLEN)
    rows = row0 + o_r
    r_ok = rows < eos
    m2 = r_ok[:, None]
    i_g = i_h // GG
    b_in = tl.load(beta_ptr + rows * H + i_h, mask=r_ok, other=0.0).to(tl.float32)
    b = beta_of(b_in, r_ok, BETA_LOGITS)
    cc = i_c.to(tl.int64) * H + i_h
    o_cc = cc * BT * BT + o_r[:, None] * BT + o_r[None, :]
    last = (o_r == BT - 1)[:, None]
    strict = o_r[:, None] > o_r[None, :]
    if HAS_A_LOG:
        a = tl.exp(tl.load(a_log_ptr + i_g).to(tl.float32))
    else:
        a = 1.0

    if AUX:  # the recompute's P, (I + L)^-1 and norm factors (chunk_prepare's AUX)
        aux = aux_ptr + cc * AUX_SIZE
        rk = tl.load(aux + AUX_RK + o_r)
        rq = tl.load(aux + AUX_RQ + o_r)
        n_fit = BT  # no span check: every pair takes the split
    else:
        rk, rq, rspan = _norms_and_spans(q_ptr, k_ptr, g_ptr, a_log_ptr, dt_bias_ptr, a,
                                         lower_bound, rows, i_h, i_g, m2, H, K, BT, BK,
                                         GATE, SPAN_CHECK, HAS_A_LOG, HAS_DT_BIAS,
                                         USE_L2NORM, GQ, GG)
        # the rows before the first whose decay leaves the split's range take the split,
        # the rest per pair: a row's path never depends on later rows (check's causal
        # gradient contract)
        n_fit = tl.min(tl.where(rspan > SPLIT_SPAN2, o_r, BT), axis=0)
    wide = n_fit < BT
    fit = (o_r[:, None] < n_fit) & (o_r[None, :] >= 0)

    # (B) P = K̂ K̂^T with the pairwise decay (AUX: the recompute's), and dW·Kd^T, over the
    # blocks
    P = tl.zeros([BT, BT], dtype=tl.float32)
    dwkd = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, K, BK):
        o_k = kb + tl.arange(0, BK)
        _, bias = gate_params(a_log_ptr, dt_bias_ptr, i_g, o_k, K, HAS_A_LOG, HAS_DT_BIAS)
        g_raw = _load_block(g_ptr, rows, i_h, o_k, H, K, GG, m2)
        k_raw = _load_block(k_ptr, rows, i_h, o_k, H, K, GQ, m2)
        dw = _load_block(dw_ptr, rows, i_h, o_k, H, K, 1, m2)
        g2 = tl.cumsum(log2_decay(g_raw, a, bias[None, :], lower_bound, m2, GATE), axis=0)
        kv = tl.where(m2, k_raw * rk[:, None], 0.0)
        if not AUX:
            up = tl.exp2(tl.maximum(g2, -126.0)) * ANCHOR  # (ANCHOR)
            dn = tl.exp2(tl.minimum(-g2, 126.0)) * (1.0 / ANCHOR)
            ku = kv * up
            ku_hi, ku_lo = _split(ku)
            Ps = _dot3(ku_hi, ku_lo, tl.trans(kv * dn))
            if wide:
                _m, Pb = pairwise_tiles(kv, kv, g2, o_r, BT, False)
                P += tl.where(fit, Ps, Pb)
            else:
                P += Ps
        dw_hi, dw_lo = _split(dw)
        dwkd += _dot3(dw_hi, dw_lo, tl.trans(kv * tl.exp2(g2)))

    # the [BT, BT] algebra: T = (I + L)^-1, A = T diag(β), and their gradients
    if AUX:
        rec = tl.load(aux + o_r[:, None] * BT + o_r[None, :])
        P = tl.where(strict, rec, 0.0)
        Tinv = tl.where(o_r[:, None] >= o_r[None, :], tl.trans(rec), 0.0)
    else:
        P = tl.where(strict, P, 0.0)
        Tinv = inverse16(P * b[:, None], BT, SUBST)  # as the forward formed it
    A = Tinv * b[None, :]
    dA = tl.where(o_r[:, None] >= o_r[None, :], tl.load(dainv_ptr + o_cc) + dwkd, 0.0)
    db = tl.sum(Tinv * dA, axis=0)
    TiT = tl.trans(Tinv)
    tit_hi, tit_lo = _split(TiT)
    x_hi, x_lo = _split(_dot3(tit_hi, tit_lo, dA * b[None, :]))
    dL = -_mm3(x_hi, x_lo, tit_hi, tit_lo)
    dL = tl.where(strict, dL, 0.0)
    db += tl.sum(dL * P, axis=1)
    dP = dL * b[:, None]
    dM = tl.load(dmqk_ptr + o_cc)
    diag = tl.sum(tl.where(o_r[:, None] == o_r[None, :], dM, 0.0), axis=1)
    dM = tl.where(strict, dM, 0.0)
    before = tl.where(o_r[:, None] > o_r[None, :], 1.0, 0.0)
    # the key blocks' [16, 16] operands
    At = tl.trans(A)
    # the split's pairs (rows that fit) and, in a wide chunk, the per-pair path's (the rest)
    dPw = tl.where(fit, 0.0, dP)
    dMw = tl.where(fit, 0.0, dM)
    dPs = tl.where(fit, dP, 0.0)
    dMs = tl.where(fit, dM, 0.0)

    # (C) each block's gradients
    # Σ_c k̂ dk̂, Σ_c q̂ d(q̂) of the rows and dA_log's terms, summed elementwise over the
    # blocks and across the tile once, after them
    ysk = tl.zeros([BT, BK], dtype=tl.float32)
    ysq = tl.zeros([BT, BK], dtype=tl.float32)
    dalog = tl.zeros([BT, BK], dtype=tl.float32)
    for kb in range(0, K, BK):
        o_k = kb + tl.arange(0, BK)
        offs = (rows[:, None] * H + i_h) * K + o_k[None, :]
        _, bias = gate_params(a_log_ptr, dt_bias_ptr, i_g, o_k, K, HAS_A_LOG, HAS_DT_BIAS)
        g_raw = _load_block(g_ptr, rows, i_h, o_k, H, K, GG, m2)
        k_raw = _load_block(k_ptr, rows, i_h, o_k, H, K, GQ, m2)
        q_raw = _load_block(q_ptr, rows, i_h, o_k, H, K, GQ, m2)
        dqg = tl.load(dqg_ptr + offs, mask=m2, other=0.0)
        dw = tl.load(dw_ptr + offs, mask=m2, other=0.0)
        dkend = tl.load(dkend_ptr + offs, mask=m2, other=0.0)
        dgam = tl.load(dgam_ptr + cc * K + o_k)
        g2 = tl.cumsum(log2_decay(g_raw, a, bias[None, :], lower_bound, m2, GATE), axis=0)
        g2_last = tl.sum(tl.where(last, g2, 0.0), axis=0)
        kv = tl.where(m2, k_raw * rk[:, None], 0.0)
        qn = q_raw * rq[:, None]
        qs = tl.where(m2, qn * scale, 0.0)
        decay = tl.exp2(g2)
        kd = kv * decay
        ekend = tl.exp2(g2_last[None, :] - g2)
        up = tl.exp2(tl.maximum(g2, -126.0)) * ANCHOR
        dn = tl.exp2(tl.minimum(-g2, 126.0)) * (1.0 / ANCHOR)
        ki = kv * dn
        # the [16, 16] operands' products on fp32 FMAs (tl.dot "ieee"), each a sum over the
        # chunk's 16 rows: the kernel in 0.80-0.83x its time with them as 3xTF32 tensor-core
        # products (an H100, with AUX; docs/training.md)
        dkd = tl.dot(At, dw, input_precision="ieee")
        drow = up * tl.dot(dPs, ki, input_precision="ieee")
        dqs = up * tl.dot(dMs, ki, input_precision="ieee")
        dcol = dn * (tl.dot(tl.trans(dPs), kv * up, input_precision="ieee")
                     + tl.dot(tl.trans(dMs), qs * up, input_precision="ieee"))
        # the split pairs' step gradient joins the steps' own in one reverse sum (below)
        pair = kv * (drow - dcol) + qs * dqs
        if wide:
            drow_w, dqs_w, dcol_w, dpair = pairwise_grads(dPw, dMw, kv, qs, g2, o_r, BT)
            drow += drow_w
            dqs += dqs_w
            dcol += dcol_w
        else:
            dpair = tl.zeros(kv.shape, dtype=tl.float32)
        dqs += diag[:, None] * kv
        dcol += diag[:, None] * qs
        dkv = drow + dcol + decay * dkd + ekend * dkend
        dqs += decay * dqg
        # each step's gradient (base 2): the whole-row kernel's terms (its comment)
        dstep = LN2 * (tl.cumsum(kd * dkd + qs * decay * dqg + pair, axis=0, reverse=True) + dpair
                       + tl.dot(before, kv * ekend * dkend, input_precision="ieee")
                       + (tl.exp2(g2_last) * dgam)[None, :])
        dx, da = log2_decay_grads(g_raw, a, bias[None, :], lower_bound, GATE)
        dgate = tl.where(m2, dstep * dx, 0.0)
        tl.store(dg_ptr + offs, dgate.to(dg_ptr.dtype.element_ty), mask=m2)
        if HAS_DT_BIAS:
            tl.store(ddt_ptr + cc * K + o_k, tl.sum(dgate, axis=0))
        if HAS_A_LOG:
            dalog += tl.where(m2, dstep * da, 0.0)
        ysk += kv * dkv
        ysq += qn * dqs
        tl.store(dw_ptr + offs, dkv, mask=m2)   # parked: dk̂
        tl.store(dqg_ptr + offs, dqs, mask=m2)  # parked: dqs
    if HAS_A_LOG:
        tl.store(dalog_ptr + cc, tl.sum(tl.sum(dalog, axis=1), axis=0))
    ysk = tl.sum(ysk, axis=1)
    ysq = tl.sum(ysq, axis=1)
    if BETA_LOGITS:  # σ'(x) = σ(x) σ(-x): σ(1 - σ) rounds to 0 where σ saturates
        db = db * (tl.sigmoid(b_in) * tl.sigmoid(-b_in))
    tl.store(db_ptr + rows * H + i_h, db.to(db_ptr.dtype.element_ty), mask=r_ok)

    # (D) through the L2 norms: dx = r (dy - y (y · dy)), y = x r
    for kb in range(0, K, BK):
        o_k = kb + tl.arange(0, BK)
        offs = (rows[:, None] * H + i_h) * K + o_k[None, :]
        dkv = tl.load(dw_ptr + offs, mask=m2, other=0.0)
        dqs = tl.load(dqg_ptr + offs, mask=m2, other=0.0)
        if USE_L2NORM:
            kv = _load_block(k_ptr, rows, i_h, o_k, H, K, GQ, m2) * rk[:, None]
            qn = _load_block(q_ptr, rows, i_h, o_k, H, K, GQ, m2) * rq[:, None]
            dk = rk[:, None] * (dkv - kv * ysk[:, None])
            dq = rq[:, None] * scale * (dqs - qn * ysq[:, None])
        else:
            dk = dkv
            dq = dqs * scale
        tl.store(dk_ptr + offs, dk.to(dk_ptr.dtype.element_ty), mask=m2)
        tl.store(dq_ptr + offs, dq.to(dq_ptr.dtype.element_ty), mask=m2)


def chunk_kda_prepare_bwd(q, k, g, beta, A_log, dt_bias, p: Problem, seqs, grads, *,
                          num_warps=4, block_k=32, maxnreg=None, num_stages=None,
                          inverse="neumann", aux=None):
    """Launch stage 1's backward (4 warps: 5.06 against 5.21 ms on 8 at T 8192 H 64, 10.14
    against 10.39 at B 8 T 4096 H 32, 0.660 against 0.655 at T 4096 H 16; train_h200's
    config rows, pw=4). ``grads``: the reverse pass's dict (its partial sums over value
    blocks already added). Returns (dq, dk, dg, dbeta, dA_log, ddt_bias) per value head:
    dq, dk, dg [B, T, H, K] and dbeta [B, T, H] in their inputs' dtypes where no GVA sum
    follows (rounded once, in the kernel; fp32 where the host sums value heads), dA_log
    [chunks, H] and ddt_bias [chunks, H, K] per chunk, fp32 (None without A_log / dt_bias).
    ``maxnreg``, ``num_stages``: a register cap and pipeline stages (None: Triton's);
    ``inverse``: the forward's ("neumann", or "substitution" for config.dot "fp32");
    ``aux``: the recompute's record for this backward (``chunk_kda_prepare``'s ``aux``), or
    None to form those products here."""
    subst = substitution(inverse)
    if aux is not None and p.gate.span_checked:
        raise ValueError("aux: not for a gate with a span check (its wide chunks' products "
                         "are formed per pair here)")
    B, T, H, K = p.B, p.T, p.H, p.K
    dev = q.device
    f32 = dict(device=dev, dtype=torch.float32)

    def out(like, summed):  # fp32 rows for the host's sum over a group's heads
        return torch.empty((B, T, H, K), device=dev,
                           dtype=torch.float32 if summed else like.dtype)

    dq, dk = out(q, p.HQ != H), out(k, p.HQ != H)
    dg = out(g, p.HG != H)
    db = torch.empty((B, T, H), device=dev, dtype=beta.dtype)
    nc = seqs.num_chunks
    dalog = torch.empty((nc, H), **f32) if A_log is not None else None
    ddt = torch.empty((nc, H, K), **f32) if dt_bias is not None else None
    if nc == 0:
        return dq, dk, dg, db, dalog, ddt
    dummy = db
    chunk_kda_prepare_bwd_kernel[(nc, H)](
        q, k, g, beta, A_log if A_log is not None else dummy,
        dt_bias if dt_bias is not None else dummy,
        grads["dqg"], grads["dw"], grads["dkend"], grads["dgam"], grads["dmqk"],
        grads["dainv"], dq, dk, dg, db, dalog if dalog is not None else dummy,
        ddt if ddt is not None else dummy,
        seqs.chunk_table if seqs.chunk_table is not None else dummy,
        aux if aux is not None else dummy, T, p.scale, p.gate.kernel_bound,
        H=H, K=K, BT=CHUNK, BK=min(block_k, K),
        GATE=p.gate.code, SPAN_CHECK=p.gate.span_checked,
        HAS_A_LOG=A_log is not None, HAS_DT_BIAS=dt_bias is not None,
        USE_L2NORM=p.use_qk_l2norm, BETA_LOGITS=p.beta_is_logits,
        IS_VARLEN=seqs.chunk_table is not None, GQ=H // p.HQ, GG=H // p.HG,
        SUBST=subst, AUX=aux is not None, num_warps=num_warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
        **({"num_stages": num_stages} if num_stages else {}))
    return dq, dk, dg, db, dalog, ddt
