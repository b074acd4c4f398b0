"""Stage 1 of the Triton KDA forward: everything that is parallel over tokens.

One program handles one 16-token chunk of one head. It fuses the gate
(``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``), the within-chunk cumulative sum,
the L2 normalization of q and k, the β sigmoid, the scaled-operand GEMMs for ``L`` and the
causal q·k scores, and the Neumann inverse (fp32-accurate 3xTF32 products)
``(I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8)``. It writes the per-chunk operands
that the recurrent stage (``chunk_recurrent.py``) needs and nothing it can rebuild:

    W    = (I + L)^-1 diag(β) (Γ ⊙ K)       [16, K]  token rows   (state correction)
    QG   = scale · Γ ⊙ Q                     [16, K]  token rows   (inter-chunk output)
    KEND = exp(G_last - G) ⊙ K               [16, K]  token rows   (state update)
    KLO  = KEND - KEND rounded               [16, K]  token rows   (its rounding error)
    AINV = (I + L)^-1 diag(β)                [16, 16] per chunk
    MQK  = tril(scale · (Γ⊙Q)(K/Γ)^T)        [16, 16] per chunk
    GAMMA = exp(G_last)                      [K]      per chunk    (state decay)

where G is the in-chunk cumulative log-decay and Γ = exp(G). Because the gate is
bounded below by ``lower_bound >= -5``, |G| <= 80 inside a chunk, so exp(±G) stays
finite in fp32 (limit e^88.7) and the diagonal tile is one dense GEMM.

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

from .indexing import chunk_of_program
from .launch import launch
from .replay import new_buffer

CHUNK = 16


@triton.jit
def gate_log2(x, a_log_ptr, dt_bias_ptr, r_ok, i_h, o_k, lower_bound,
              HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr):
    """Base-2 log-decay ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) * log2(e)`` of
    the gate tile ``x`` (token rows, key columns ``o_k``) of head ``i_h``, zero in padded rows
    (``r_ok`` false), so that a cumulative sum ends at the last real row's.

    The select stays where every row is real too: it keeps the product by log2(e) apart from
    the cumulative sum's first addition, which the compiler would otherwise contract into an
    FMA (other bits: a whole-chunk copy of stage 1 without it, since deleted, "Pruned" in
    docs/kernels.md)."""
    x = x.to(tl.float32)
    if HAS_DT_BIAS:
        x += tl.load(dt_bias_ptr + i_h * o_k.shape[0] + o_k).to(tl.float32)[None, :]
    if HAS_A_LOG:
        x *= tl.exp(tl.load(a_log_ptr + i_h).to(tl.float32))
    gate = tl.where(r_ok[:, None], lower_bound * tl.sigmoid(x), 0.0)
    return gate * 1.4426950408889634


@triton.jit
def l2_normalize(x, USE_L2NORM: tl.constexpr):
    """Rows of ``x`` in fp32, times ``rsqrt(sum x^2 + 1e-6)`` with ``USE_L2NORM``."""
    x = x.to(tl.float32)
    if USE_L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


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
def neumann_inverse16(L, BT: tl.constexpr):
    """(I + L)^-1 of a strictly lower BT×BT block by the Neumann product
    (I - L)(I + L^2)(I + L^4)(I + L^8): L is nilpotent of order 16, so four factors are exact.
    Products as accurate as fp32, each three tf32 tensor-core products (3xTF32; fp32 on FMA
    units measured 1-3 % slower on the H200: more shared-memory traffic). FlashKDA's fp16
    operands raised the weak-decay family's final-state error from 2.0e-3 to 1.2e-2
    (docs/kernels.md)."""
    o_r = tl.arange(0, BT)
    eye = tl.where(o_r[:, None] == o_r[None, :], 1.0, 0.0)
    p = L
    inv = eye - L
    for _ in tl.static_range(3):
        p = tl.dot(p, p, input_precision="tf32x3")  # L^2, L^4, L^8
        inv = inv + tl.dot(inv, p, input_precision="tf32x3")
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
def chunk_kda_prepare_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
    w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
    chunk_table_ptr,
    T, scale, lower_bound,
    H, K: tl.constexpr, BT: tl.constexpr,
    HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    USE_L2NORM: tl.constexpr, BETA_LOGITS: tl.constexpr, IS_VARLEN: tl.constexpr,
    GQ: tl.constexpr = 1, GG: tl.constexpr = 1, KSPLIT: tl.constexpr = True,
    CLAMP_ROWS: tl.constexpr = False,
):
    """Stage 1 of global chunk ``program_id(0)``, head ``program_id(1)``: token rows past
    the sequence's end are zero in every product, and not stored. Where rows are not known
    to come in whole chunks (varlen, or T not a multiple of 16: ``CLAMP_ROWS``), the loads
    read row min(row, end - 1), always one of the sequence's, so that none is masked; the
    stores, β, the gate and q·Γ stay masked by row. Otherwise every load is masked by row.
    Both give the same bits; clamped, the varlen kernel takes 168 registers where masked
    loads took 175 (6 programs an SM against 4, docs/kernels.md).

    Every load is issued first, so that their latencies overlap, and each operand is stored
    as soon as it is formed, so that few [BT, K] tiles are live at once (KEND and QG are gone
    before the inverse)."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
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
    # GVA: GQ value heads share a q/k head, GG a gate head (1: one each)
    i_g = i_h // GG
    offs_q = (lrows[:, None] * (H // GQ) + i_h // GQ) * K + o_k[None, :]
    g_raw = load_rows(g_ptr + (lrows[:, None] * (H // GG) + i_g) * K + o_k[None, :], m2,
                      CLAMP_ROWS)
    k_raw = load_rows(k_ptr + offs_q, m2, CLAMP_ROWS)
    q_raw = load_rows(q_ptr + offs_q, m2, CLAMP_ROWS)
    b = load_rows(beta_ptr + lrows * H + i_h, r_ok, CLAMP_ROWS).to(tl.float32)
    if BETA_LOGITS:
        b = tl.sigmoid(b)
    b = tl.where(r_ok, b, 0.0)

    g2 = tl.cumsum(gate_log2(g_raw, a_log_ptr, dt_bias_ptr, r_ok, i_g, o_k, lower_bound,
                             HAS_A_LOG, HAS_DT_BIAS), axis=0)  # base-2 cumulative log-decay
    g2_last = tl.sum(tl.where((o_r == BT - 1)[:, None], g2, 0.0), axis=0)
    tl.store(gamma_ptr + (i_c.to(tl.int64) * H + i_h) * K + o_k, tl.exp2(g2_last))
    kv = l2_normalize(k_raw, USE_L2NORM)
    kend, klo = split_operand(kv * tl.exp2(g2_last[None, :] - g2), kend_ptr.dtype.element_ty)
    tl.store(kend_ptr + offs, kend.to(kend_ptr.dtype.element_ty), mask=m2)
    if KSPLIT:
        tl.store(klo_ptr + offs, klo.to(klo_ptr.dtype.element_ty), mask=m2)

    # scaled operands: exp(G_i - G_j) = exp(G_i) * exp(-G_j), each finite in fp32
    decay = tl.exp2(g2)
    kit = tl.trans(kv * tl.exp2(-g2))
    qd = l2_normalize(q_raw, USE_L2NORM) * decay * scale
    if CLAMP_ROWS:  # MQK's rows past the end zero, as masked loads leave them
        qd = tl.where(m2, qd, 0.0)
    tl.store(qg_ptr + offs, qd.to(qg_ptr.dtype.element_ty), mask=m2)
    base_cc = (i_c.to(tl.int64) * H + i_h) * BT * BT
    o_cc = o_r[:, None] * BT + o_r[None, :]
    mqk = tl.where(o_r[:, None] >= o_r[None, :], tl.dot(qd, kit, input_precision="tf32"), 0.0)
    tl.store(mqk_ptr + base_cc + o_cc, mqk.to(mqk_ptr.dtype.element_ty))
    kd = kv * decay
    L = tl.dot(kd, kit, input_precision="tf32")
    L = tl.where(o_r[:, None] > o_r[None, :], L * b[:, None], 0.0)

    ainv = neumann_inverse16(L, BT) * b[None, :]
    tl.store(ainv_ptr + base_cc + o_cc, ainv.to(ainv_ptr.dtype.element_ty))
    w = tl.dot(ainv, kd, input_precision="tf32")
    tl.store(w_ptr + offs, w.to(w_ptr.dtype.element_ty), mask=m2)


def chunk_kda_prepare(
    q, k, g, beta, A_log, dt_bias, *, scale, lower_bound, use_qk_l2norm, beta_is_logits,
    chunk_table, num_chunks, operand_dtype, num_warps, kend_split=True, clamp_rows=None,
    direct=True,
):
    """Launch stage 1. Returns (w, qg, kend, klo, ainv, mqk, gamma): W, QG, KEND, KLO like
    q, AINV and MQK [num_chunks, H, 16, 16] (``operand_dtype``: fp16 when q and k are
    normalized, else fp32), GAMMA [num_chunks, H, K] fp32.

    ``chunk_table`` is an int32 [num_chunks, 2] table of (the chunk's first row, its
    sequence's end row) for variable-length input (None for fixed length).
    ``kend_split=False``: KEND not split (KLO None; a measurement candidate). ``clamp_rows``:
    clamp the loads' rows to the sequence (the kernel's ``CLAMP_ROWS``; None: where rows are
    not known to come in whole chunks, i.e. varlen or T % 16 != 0; the tests compare both
    forms). ``direct``: launch through ``launch.py`` (False: ``kernel[grid]`` every call).
    """
    B, T, HQ, K = q.shape
    if clamp_rows is None:
        clamp_rows = chunk_table is not None or T % CHUNK != 0
    H, HG = beta.shape[2], g.shape[2]  # value heads (the operands' heads), gate heads
    # one allocation per kind (a host-side cost per call: short inputs are bound by it)
    w, qg, kend, *klo = new_buffer((4 if kend_split else 3, B, T, H, K), device=q.device,
                                   dtype=operand_dtype).unbind(0)
    klo = klo[0] if kend_split else None
    ainv, mqk = new_buffer((2, num_chunks, H, CHUNK, CHUNK), device=q.device,
                           dtype=operand_dtype).unbind(0)
    gamma = new_buffer((num_chunks, H, K), device=q.device, dtype=torch.float32)
    if num_chunks == 0:
        return w, qg, kend, klo, ainv, mqk, gamma
    dummy = gamma  # stands in for absent optional pointers; never read
    launch(chunk_kda_prepare_kernel, (num_chunks, H), (
        q, k, g, beta,
        A_log if A_log is not None else dummy,
        dt_bias if dt_bias is not None else dummy,
        w, qg, kend, klo if kend_split else dummy, ainv, mqk, gamma,
        chunk_table if chunk_table is not None else dummy,
        T, float(scale), float(lower_bound),
    ), dict(
        H=H, GQ=H // HQ, GG=H // HG, K=K, BT=CHUNK,
        HAS_A_LOG=A_log is not None, HAS_DT_BIAS=dt_bias is not None,
        USE_L2NORM=use_qk_l2norm, BETA_LOGITS=beta_is_logits,
        IS_VARLEN=chunk_table is not None, KSPLIT=kend_split,
        CLAMP_ROWS=clamp_rows, num_warps=num_warps,
    ), direct=direct)
    return w, qg, kend, klo, ainv, mqk, gamma
