"""Stage 1 of the Triton KDA forward: everything that is parallel over tokens.

One program handles one 16-token chunk of one head. It fuses the gate (any of the three,
``gate.py``), the within-chunk cumulative sum, the L2 normalization of q and k, the β sigmoid,
the scaled-operand GEMMs for ``L`` and the causal q·k scores, and the Neumann inverse
(fp32-accurate 3xTF32 products) ``(I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8)``. It
writes the per-chunk operands that the recurrent stage (``chunk_recurrent.py``) needs and
nothing it can rebuild:

    W    = (I + L)^-1 diag(β) (Γ ⊙ K)       [16, K]  token rows   (state correction)
    QG   = scale · Γ ⊙ Q                     [16, K]  token rows   (inter-chunk output)
    KEND = exp(G_last - G) ⊙ K               [16, K]  token rows   (state update)
    KLO  = KEND - KEND rounded               [16, K]  token rows   (its rounding error)
    AINV = (I + L)^-1 diag(β)                [16, 16] per chunk
    MQK  = tril(scale · Q K^T ⊙ exp(G_i - G_j))  [16, 16] per chunk
    GAMMA = exp(G_last)                      [K]      per chunk    (state decay)

where G is the in-chunk cumulative log-decay and Γ = exp(G). Every factor but the pairwise
decay of L and MQK is <= 1. The pairwise decay is split, exp(G_i) · exp(-G_j), so that both
tiles are one dense product each; that needs |G| within the split's range (80, natural log)
inside the chunk. A bounded gate with ``lower_bound >= -5`` always fits (16 · 5 = 80); for
any other gate each chunk checks its span and a wider chunk forms the two tiles per pair
(``pairwise_tiles``: every exponent G_i - G_j <= 0), in a second launch that only the flagged
chunks run, so bounded inputs pay nothing, the first launch carries no per-pair code, and
strong decay costs only its own chunks.

KEND goes to the state as two operands, its rounding to the products' 10-bit significand
(fp16, or tf32 for fp32 operands) and what that rounding lost (KLO), so that the state update
U^T KEND is as exact as its fp32 accumulation. One rounded KEND is not enough: the update
writes along KEND's rows and the delta rule erases only along the keys, so KEND's rounding
error, orthogonal to the keys, stays in the state and adds up over chunks where the decay is
near 1: with collinear keys, β ≈ 1 and decay ≈ 1 it took the output error past check's
threshold (docs/hunt.md has the figures).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import Problem
from .gate import SPLIT_SPAN2, exp2_ftz, gate_params, log2_decay
from .indexing import chunk_of_program

CHUNK = 16
#: ``AUX``'s record of a chunk and head (fp32): [16, 16] at 0, P below the diagonal and
#: (I + L)^-1 transposed on and above it, then the rows' norm factors of k and q [16] each at
#: these offsets; its size
AUX_RK, AUX_RQ, AUX_SIZE = (tl.constexpr(n * CHUNK) for n in (CHUNK, CHUNK + 1, CHUNK + 2))
#: the register cap of the forward's 2-warp stage-1 program on a ragged fixed length
#: (``chunk_kda_prepare``)
PREPARE_MAXNREG = 168


@triton.jit
def l2_normalize(x, USE_L2NORM: tl.constexpr):
    """(rows of ``x`` in fp32 times their factors, the factors: ``rsqrt(sum x^2 + 1e-6)``
    with ``USE_L2NORM``, else ones)."""
    x = x.to(tl.float32)
    if USE_L2NORM:
        r = tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)
    else:
        r = tl.full([x.shape[0]], 1.0, tl.float32)
    return x * r[:, None], r


@triton.jit
def split_operand(x, DT: tl.constexpr):
    """``x`` (fp32) as ``hi + lo`` with ``hi`` exact in a 10-bit significand: fp16 (``DT``
    fp16), or x's fp32 bits with the low 13 of its significand cleared (tf32) — a tf32 product
    then reads ``hi`` and ``lo`` without rounding ``hi``, and ``lo`` loses only 2^-11 of
    itself."""
    if DT == tl.float16:
        hi = x.to(tl.float16).to(tl.float32)
    else:
        hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _hi(x):
    """x rounded to 10 significand bits (half away from zero, on the bits): exact in tf32, the
    big part of a 3xTF32 split; x - _hi(x) is exact in fp32 and at most 2^-11 |x|. Splitting
    by hand lets a loop-invariant operand be split once, where tl.dot's "tf32x3" splits both
    operands at every product (and, measured on the sm_90a compile, takes more instructions
    even where nothing is hoisted)."""
    return ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def tf32_nearest(x, PRECISION: tl.constexpr):
    """A tf32 product's fp32 operand rounded to nearest at tf32's 10 significand bits
    (``_hi``); other precisions' operands as they are. The H200's tf32 products truncate
    their operands (tests/h200_arith.py), an error of up to 2^-10 of each, all of one sign:
    on a long sequence with strong decay and β near 1 that bias accumulated to an output error
    of 5.4e-3 (the hunt, docs/hunt.md); rounded first, the error is half and unbiased."""
    if PRECISION == "tf32":
        x = _hi(x)
    return x


@triton.jit
def as_operand(x, DT: tl.constexpr, PREC: tl.constexpr):
    """Stage 2's U (fp32 accumulators) as the next products' operand: fp16, or for tf32
    products rounded to nearest at tf32's 10 significand bits (``tf32_nearest``: the H200's
    tf32 products truncate, a bias of one sign that U carries into every later state), or
    for 3xTF32 products (``PREC``) as it is."""
    if DT == tl.float16:
        y = x.to(DT)
    elif PREC == "tf32":
        y = _hi(x)
    else:
        y = x
    return y


@triton.jit
def _split(x):
    """(hi, lo): x = hi + lo exactly, hi = ``_hi(x)``."""
    hi = _hi(x)
    return hi, x - hi


@triton.jit
def _mm3(a_hi, a_lo, b_hi, b_lo):
    """a @ b as three tf32 products (3xTF32) of operands split by the caller (``_split``)."""
    return (tl.dot(a_hi, b_hi, input_precision="tf32")
            + tl.dot(a_hi, b_lo, input_precision="tf32")
            + tl.dot(a_lo, b_hi, input_precision="tf32"))


@triton.jit
def neumann_inverse16(L, BT: tl.constexpr):
    """(I + L)^-1 of a strictly lower BT×BT block by the Neumann product
    (I - L)(I + L^2)(I + L^4)(I + L^8): L is nilpotent of order 16, so four factors are exact.
    Products as accurate as fp32, each three tf32 tensor-core products (3xTF32) of operands
    split by hand, each factor once (L^2k serves two products; tl.dot's "tf32x3" splits both
    operands at every product). fp32 on FMA units measured 1-3 % slower on the H200 (more
    shared-memory traffic). FlashKDA's fp16 operands raised the weak-decay family's
    final-state error from 2.0e-3 to 1.2e-2 (docs/kernels.md). Forward and backward."""
    o_r = tl.arange(0, BT)
    p = L
    inv = tl.where(o_r[:, None] == o_r[None, :], 1.0, 0.0) - L
    p_hi, p_lo = _split(p)
    for _ in tl.static_range(3):
        p = _mm3(p_hi, p_lo, p_hi, p_lo)  # L^2, L^4, L^8
        p_hi, p_lo = _split(p)
        inv_hi, inv_lo = _split(inv)
        inv = inv + _mm3(inv_hi, inv_lo, p_hi, p_lo)
    return inv


@triton.jit
def substitution_inverse16(L, BT: tl.constexpr):
    """(I + L)^-1 of a strictly lower BT×BT block by forward substitution (fla's inverse), in
    fp32: row i = e_i - Σ_{j<i} L_ij · row j, rows in order. The Neumann product's factors
    reach C(14, 7) = 3,432 times the inverse's entries where L is near all-β (one cluster of
    keys, no decay) and cancel; substitution forms no such terms (docs/training.md "The fp32
    path": recipe:fp32 7.4e-3 against 1.49e-3, the floor, on such a hunt case)."""
    o_r = tl.arange(0, BT)
    inv = tl.where(o_r[:, None] == o_r[None, :], 1.0, 0.0)
    for i in tl.static_range(1, BT):
        li = tl.sum(tl.where(o_r[:, None] == i, L, 0.0), axis=0)  # row i of L, by column
        row = tl.sum(li[:, None] * inv, axis=0)  # Σ_j L_ij · (row j of the inverse)
        inv = tl.where(o_r[:, None] == i, inv - row[None, :], inv)
    return inv


#: how stage 1 forms (I + L)^-1 (``inverse16``): the Neumann product, or forward substitution
INVERSES = ("neumann", "substitution")


def substitution(inverse: str) -> bool:
    """The kernels' ``SUBST`` for a launcher's ``inverse`` (one of :data:`INVERSES`); any
    other value is refused, not read as the Neumann product."""
    if inverse not in INVERSES:
        raise ValueError(f"inverse must be one of {', '.join(INVERSES)}, got {inverse!r}")
    return inverse == "substitution"


@triton.jit
def inverse16(L, BT: tl.constexpr, SUBST: tl.constexpr):
    """(I + L)^-1: by forward substitution with ``SUBST`` (config.dot "fp32"), else by the
    Neumann product."""
    if SUBST:
        inv = substitution_inverse16(L, BT)
    else:
        inv = neumann_inverse16(L, BT)
    return inv


@triton.jit
def load_rows(ptrs, mask, CLAMP_ROWS: tl.constexpr):
    """``tl.load`` of a chunk's rows: zero where ``mask`` is false, or unmasked where the
    rows are clamped (every row read is one of the sequence's)."""
    if CLAMP_ROWS:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def load_inputs(q_ptr, k_ptr, g_ptr, beta_ptr, lrows, r_ok, i_h, o_k, H, K: tl.constexpr,
                GQ: tl.constexpr, GG: tl.constexpr, CLAMP_ROWS: tl.constexpr):
    """The gate input, k, q and β (fp32) of a chunk's rows ``lrows`` for value head ``i_h``, in
    that order (every load issued before any use): GVA, GQ value heads share a q/k head and
    GG a gate head (1: one each)."""
    m2 = r_ok[:, None]
    offs_q = (lrows[:, None] * (H // GQ) + i_h // GQ) * K + o_k[None, :]
    g_raw = load_rows(g_ptr + (lrows[:, None] * (H // GG) + i_h // GG) * K + o_k[None, :], m2,
                      CLAMP_ROWS)
    k_raw = load_rows(k_ptr + offs_q, m2, CLAMP_ROWS)
    q_raw = load_rows(q_ptr + offs_q, m2, CLAMP_ROWS)
    b_in = load_rows(beta_ptr + lrows * H + i_h, r_ok, CLAMP_ROWS).to(tl.float32)
    return g_raw, k_raw, q_raw, b_in


@triton.jit
def beta_of(b_in, r_ok, BETA_LOGITS: tl.constexpr):
    """β from its input (a logit's sigmoid with ``BETA_LOGITS``), zero past the rows."""
    b = b_in
    if BETA_LOGITS:
        b = tl.sigmoid(b)
    return tl.where(r_ok, b, 0.0)


@triton.jit
def pairwise_tiles(qd, kv, g2, o_r, BT: tl.constexpr, WITH_M: tl.constexpr = True):
    """(Q·K^T, K·K^T) with the pairwise decay, entry (i, j) = Σ_c x_ic k_jc 2^(G_ic - G_jc),
    one column j at a time, the exponent formed per pair: 2^(G_i - G_j) <= 1 for i >= j
    (clamped there for i < j, which the caller masks), so no factor can overflow or flush
    however wide the chunk's decay. ``qd`` is q already scaled (not decayed)."""
    L = tl.zeros([BT, BT], dtype=tl.float32)
    M = tl.zeros([BT, BT], dtype=tl.float32)
    for j in range(0, BT):  # not unrolled: 16 bodies would spill
        sel = (o_r == j)[:, None]
        kj = tl.sum(tl.where(sel, kv, 0.0), axis=0)
        gj = tl.sum(tl.where(sel, g2, 0.0), axis=0)
        ke = kj[None, :] * tl.exp2(tl.minimum(g2 - gj[None, :], 0.0))
        col = (o_r == j)[None, :]
        L += tl.where(col, tl.sum(kv * ke, axis=1)[:, None], 0.0)
        if WITH_M:  # (the backward asks for L alone)
            M += tl.where(col, tl.sum(qd * ke, axis=1)[:, None], 0.0)
    return M, L


@triton.jit
def chunk_kda_prepare_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
    w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
    chunk_table_ptr, wide_ptr, aux_ptr,
    T, scale, lower_bound,
    H, K: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr, SPAN_CHECK: tl.constexpr,
    HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    USE_L2NORM: tl.constexpr, BETA_LOGITS: tl.constexpr, IS_VARLEN: tl.constexpr,
    GQ: tl.constexpr = 1, GG: tl.constexpr = 1, CLAMP_ROWS: tl.constexpr = False,
    PRECISION: tl.constexpr = "tf32", REDO: tl.constexpr = False, SUBST: tl.constexpr = False,
    AUX: tl.constexpr = False,
):
    """Stage 1 of global chunk ``program_id(0)``, head ``program_id(1)``: token rows past
    the sequence's end are zero in every product, and not stored. Where rows are not known
    to come in whole chunks (varlen, or T not a multiple of 16: ``CLAMP_ROWS``), the loads
    read row min(row, end - 1), always one of the sequence's, so that none is masked; the
    stores, β, the gate and q·Γ stay masked by row. Otherwise every load is masked by row.
    Both give the same bits; clamped, the varlen kernel takes fewer registers.

    ``SPAN_CHECK``: the chunk's cumulative log-decay is checked against the split's range
    (``gate.py``); a wider chunk forms its tiles per pair (``pairwise_tiles``). Without it (a
    bounded gate whose 16 steps fit) every chunk takes the split. With it a wide chunk writes
    its flag in ``wide_ptr`` and MQK, AINV and W only for its rows before the first that
    leaves the range (every program writes its flag), and a second launch (``REDO``) runs
    only the flagged programs, the per-pair path alone, and stores those rows from that one
    on (the rest the first launch stored).

    Every load is issued first, so that their latencies overlap, and each operand is stored
    as soon as it is formed, so that few [BT, K] tiles are live at once.

    ``AUX`` (the backward's recompute, no ``SPAN_CHECK``): also what stage 1's backward would
    form again, fp32 in ``aux_ptr`` [chunks, H, AUX_SIZE]: P (L before β), (I + L)^-1, norms."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    cc = i_c.to(tl.int64) * H + i_h
    run = 1
    if REDO:
        run = tl.load(wide_ptr + cc)
    if run != 0:
        _prepare_chunk(q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, w_ptr, qg_ptr,
                       kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr, chunk_table_ptr,
                       wide_ptr, aux_ptr, T, scale, lower_bound, i_c, i_h, cc, H, K, BT, GATE,
                       SPAN_CHECK, HAS_A_LOG, HAS_DT_BIAS, USE_L2NORM, BETA_LOGITS,
                       IS_VARLEN, GQ, GG, CLAMP_ROWS, PRECISION, REDO, SUBST, AUX)


@triton.jit
def _prepare_chunk(q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, w_ptr, qg_ptr,
                   kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr, chunk_table_ptr,
                   wide_ptr, aux_ptr, T, scale, lower_bound, i_c, i_h, cc, H, K: tl.constexpr,
                   BT: tl.constexpr, GATE: tl.constexpr, SPAN_CHECK: tl.constexpr,
                   HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
                   USE_L2NORM: tl.constexpr, BETA_LOGITS: tl.constexpr,
                   IS_VARLEN: tl.constexpr, GQ: tl.constexpr, GG: tl.constexpr,
                   CLAMP_ROWS: tl.constexpr, PRECISION: tl.constexpr, REDO: tl.constexpr,
                   SUBST: tl.constexpr, AUX: tl.constexpr):
    """The body of ``chunk_kda_prepare_kernel`` for chunk ``i_c``, head ``i_h``."""
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    row0, eos = chunk_of_program(i_c, chunk_table_ptr, T, BT, IS_VARLEN)
    rows = row0 + o_r
    r_ok = rows < eos
    m2 = r_ok[:, None]
    lrows = rows  # the rows the loads read
    if CLAMP_ROWS:
        lrows = tl.minimum(rows, eos - 1)
    offs = (rows[:, None] * H + i_h) * K + o_k[None, :]
    i_g = i_h // GG
    g_raw, k_raw, q_raw, b_in = load_inputs(q_ptr, k_ptr, g_ptr, beta_ptr, lrows, r_ok, i_h,
                                            o_k, H, K, GQ, GG, CLAMP_ROWS)
    b = beta_of(b_in, r_ok, BETA_LOGITS)

    a, bias = gate_params(a_log_ptr, dt_bias_ptr, i_g, o_k, K, HAS_A_LOG, HAS_DT_BIAS)
    g2 = tl.cumsum(log2_decay(g_raw, a, bias[None, :], lower_bound, m2, GATE), axis=0)
    g2_last = tl.sum(tl.where((o_r == BT - 1)[:, None], g2, 0.0), axis=0)
    FIRST: tl.constexpr = not REDO  # the redo stores only what the per-pair path forms
    if FIRST:
        tl.store(gamma_ptr + cc * K + o_k, exp2_ftz(g2_last))
    kv, rk = l2_normalize(k_raw, USE_L2NORM)
    if AUX:  # and the rows' norm factors (rows past the end: not read)
        aux = aux_ptr + cc * AUX_SIZE
        tl.store(aux + AUX_RK + o_r, rk)
    kend, klo = split_operand(kv * exp2_ftz(g2_last[None, :] - g2), kend_ptr.dtype.element_ty)
    if FIRST:
        tl.store(kend_ptr + offs, kend.to(kend_ptr.dtype.element_ty), mask=m2)
        tl.store(klo_ptr + offs, klo.to(klo_ptr.dtype.element_ty), mask=m2)

    decay = exp2_ftz(g2)
    qs, rq = l2_normalize(q_raw, USE_L2NORM)
    qs = qs * scale
    if AUX:
        tl.store(aux + AUX_RQ + o_r, rq)
    if CLAMP_ROWS:  # MQK's rows past the end zero, as masked loads leave them
        qs = tl.where(m2, qs, 0.0)
    qd = qs * decay
    if FIRST:
        tl.store(qg_ptr + offs, qd.to(qg_ptr.dtype.element_ty), mask=m2)
    kd = kv * decay
    # MQK, AINV and W are stored whole, but with the span check only the rows before the
    # first whose decay leaves the split's range (n_fit), and the redo only the rest: a row's
    # tiles take the split in both launches while its own decay fits, so that a later row's
    # decay never changes an earlier row's bits (check's */causal_wide; masks from a row
    # count, not a scalar, which the interpreter cannot combine with a tile's)
    keep_cc = None
    keep_w = m2
    if SPAN_CHECK:
        n_fit = tl.min(tl.where(tl.max(tl.abs(g2), axis=1) > SPLIT_SPAN2, o_r, BT), axis=0)
        if REDO:
            keep_cc = (o_r[:, None] >= n_fit) & (o_r[None, :] >= 0)
            keep_w = m2 & (o_r >= n_fit)[:, None]
        else:
            tl.store(wide_ptr + cc, (n_fit < BT).to(tl.int32))
            keep_cc = (o_r[:, None] < n_fit) & (o_r[None, :] >= 0)
            keep_w = m2 & (o_r < n_fit)[:, None]
    if REDO:
        mqk, L = pairwise_tiles(qs, kv, g2, o_r, BT)
    else:
        # the split exponent: exp(G_i - G_j) = exp(G_i) * exp(-G_j), each finite in fp32
        kit = tf32_nearest(tl.trans(kv * exp2_ftz(-g2)), PRECISION)
        mqk = tl.dot(tf32_nearest(qd, PRECISION), kit, input_precision=PRECISION)
        L = tl.dot(tf32_nearest(kd, PRECISION), kit, input_precision=PRECISION)
    base_cc = cc * BT * BT
    o_cc = o_r[:, None] * BT + o_r[None, :]
    mqk = tl.where(o_r[:, None] >= o_r[None, :], mqk, 0.0)
    tl.store(mqk_ptr + base_cc + o_cc, mqk.to(mqk_ptr.dtype.element_ty), mask=keep_cc)
    if AUX:  # P: the sequence's strictly lower pairs (clamped rows past the end: zero)
        p_rec = tl.where((o_r[:, None] > o_r[None, :]) & m2, L, 0.0)
    L = tl.where(o_r[:, None] > o_r[None, :], L * b[:, None], 0.0)
    if SPAN_CHECK and not REDO:  # rows past the range (inf, NaN) kept out of the inverse
        L = tl.where((o_r < n_fit)[:, None], L, 0.0)

    tinv = inverse16(L, BT, SUBST)
    if AUX:  # (I + L)^-1 is lower triangular: with P, one [16, 16]
        tl.store(aux + o_cc, tl.where(o_r[:, None] > o_r[None, :], p_rec, tl.trans(tinv)))
    ainv = tinv * b[None, :]
    tl.store(ainv_ptr + base_cc + o_cc, ainv.to(ainv_ptr.dtype.element_ty), mask=keep_cc)
    w = tl.dot(tf32_nearest(ainv, PRECISION), tf32_nearest(kd, PRECISION),
               input_precision=PRECISION)
    tl.store(w_ptr + offs, w.to(w_ptr.dtype.element_ty), mask=keep_w)


def chunk_kda_prepare(q, k, g, beta, A_log, dt_bias, p: Problem, seqs, *, num_warps,
                      clamp_rows=None, dtype=None, precision="tf32", inverse="neumann",
                      aux=None):
    """Launch stage 1. Returns (w, qg, kend, klo, ainv, mqk, gamma): W, QG, KEND, KLO like
    q with the value heads, AINV and MQK [num_chunks, H, 16, 16] (fp16 when q and k are
    normalized: every operand is then <= 1 in size, AINV's entries bounded by the Neumann
    terms; fp32 otherwise), GAMMA [num_chunks, H, K] fp32. Inputs contiguous; ``seqs`` the
    call's tables (``tables.py``). ``clamp_rows``: clamp the loads' rows to the sequence
    (the kernel's ``CLAMP_ROWS``; None: where rows are not known to come in whole chunks,
    i.e. varlen or T % 16 != 0; the tests compare both forms). ``dtype``: the products'
    storage instead (the backward's recompute asks fp32 where fp16 would flush QG and W).
    ``precision``: the pairwise products (MQK, L) and W = AINV·Kd, "tf32" (the forward) or
    "tf32x3" (the backward's recompute: on the H200 a tf32 product truncates its operands to
    10 bits, and on clustered keys with β near 1 the gradients amplify L's and W's errors
    through (I + L)^-1; docs/training.md "Precision"). ``inverse``: "neumann" or
    "substitution" (config.dot "fp32": ``substitution_inverse16``). ``aux``: an fp32
    [num_chunks, H, AUX_SIZE] tensor to fill for stage 1's backward (the kernel's ``AUX``;
    not with a span-checked gate, whose wide chunks the backward forms per pair)."""
    subst = substitution(inverse)
    want = (seqs.num_chunks, p.H, AUX_SIZE.value)
    if aux is not None and (p.gate.span_checked or aux.shape != want or aux.dtype != torch.float32):
        raise ValueError(f"aux: fp32 {list(want)} for a gate without a span check, not "
                         f"{list(aux.shape)} {aux.dtype} (span checked: {p.gate.span_checked})")
    B, T, H, K = p.B, p.T, p.H, p.K
    if clamp_rows is None:
        clamp_rows = p.varlen or T % CHUNK != 0
    if dtype is None:
        dtype = torch.float16 if p.use_qk_l2norm else torch.float32
    # one allocation per kind (a host-side cost per call: short inputs are bound by it)
    w, qg, kend, klo = torch.empty((4, B, T, H, K), device=q.device, dtype=dtype).unbind(0)
    ainv, mqk = torch.empty((2, seqs.num_chunks, H, CHUNK, CHUNK), device=q.device,
                            dtype=dtype).unbind(0)
    gamma = torch.empty((seqs.num_chunks, H, K), device=q.device, dtype=torch.float32)
    if seqs.num_chunks == 0:
        return w, qg, kend, klo, ainv, mqk, gamma
    dummy = gamma  # stands in for absent optional pointers; never read
    two = p.gate.span_checked
    flags = (torch.empty((seqs.num_chunks, H), device=q.device, dtype=torch.int32) if two
             else dummy)
    args = (q, k, g, beta, A_log if A_log is not None else dummy,
            dt_bias if dt_bias is not None else dummy, w, qg, kend, klo, ainv, mqk, gamma,
            seqs.chunk_table if seqs.chunk_table is not None else dummy, flags,
            aux if aux is not None else dummy, T, p.scale, p.gate.kernel_bound)
    kw = dict(H=H, GQ=H // p.HQ, GG=H // p.HG, K=K, BT=CHUNK, GATE=p.gate.code,
              SPAN_CHECK=p.gate.span_checked,
              HAS_A_LOG=A_log is not None, HAS_DT_BIAS=dt_bias is not None,
              USE_L2NORM=p.use_qk_l2norm, BETA_LOGITS=p.beta_is_logits,
              IS_VARLEN=seqs.chunk_table is not None, CLAMP_ROWS=clamp_rows,
              PRECISION=precision, SUBST=subst, AUX=aux is not None, num_warps=num_warps)
    # the clamped fixed-length form (T % 16 != 0) of the forward's 2-warp program took 172
    # registers on sm_90a, five programs an SM: capped at 168, six, no spills. Not the other
    # forms: under the same cap the aligned one (136 without) spilled 20 bytes and the varlen
    # one (168 without) took 48 instructions more; the recompute's tf32x3 (254) would spill
    ragged = clamp_rows and seqs.chunk_table is None
    cap = (dict(maxnreg=PREPARE_MAXNREG) if ragged and precision == "tf32" and num_warps == 2
           else {})
    chunk_kda_prepare_kernel[(seqs.num_chunks, H)](*args, **kw, **cap)
    if two:  # the flagged (wide) chunks' tiles per pair
        chunk_kda_prepare_kernel[(seqs.num_chunks, H)](*args, **kw, REDO=True)
    return w, qg, kend, klo, ainv, mqk, gamma
