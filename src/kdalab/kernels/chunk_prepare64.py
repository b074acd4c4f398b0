"""Stage 1 for a 64-token recurrent step built from four 16-token blocks (experimental).

Same outputs as ``chunk_prepare.py`` (W, QG, KEND token rows; AINV, MQK, GAMMA per step) but
for steps of 64 tokens, so the recurrent stage runs a quarter of the serial steps. The 64×64
system (I + L) is block lower-triangular with 16×16 blocks:

* diagonal blocks: the lower-bound scheme, one dense product of (Γ⊙K) and (K/Γ) with Γ taken
  from the block's start (|G| <= 80, finite in fp32);
* off-diagonal blocks (r > c): split at the boundary between blocks r-1 and r, where both
  factors exp(G_i − G_b) and exp(G_b − G_j) are <= 1 — always safe (seed document);
* inverse: fp32 Neumann product for each diagonal block, then block forward substitution
  X_rc = −X_rr Σ_{c<=m<r} L_rm X_mc.

Γ over 64 tokens may underflow to 0 in fp32 (G down to −320): it only enters quantities whose
true size is that small (QG, W), never as a divisor. Not yet timed on a GPU (docs/kernels.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_prepare import load_gate, load_qkb, neumann_inverse16, stage1_outputs
from .indexing import chunk_of_program

BLOCK = 16
STEP = 64


@triton.jit
def _load_block(q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, row0, eos, i_h,
                lower_bound, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_L2NORM: tl.constexpr,
                BETA_LOGITS: tl.constexpr):
    """One 16-row block: local base-2 cumulative log-decay, its total, q, k, β (zero past eos)."""
    rows = row0 + tl.arange(0, BT)
    r_ok = rows < eos
    gate2 = load_gate(g_ptr, a_log_ptr, dt_bias_ptr, rows, r_ok, i_h, lower_bound, H, K,
                      HAS_A_LOG, HAS_DT_BIAS)
    g2 = tl.cumsum(gate2, axis=0)
    total = tl.sum(gate2, axis=0)
    qv, kv, b = load_qkb(q_ptr, k_ptr, beta_ptr, rows, r_ok, i_h, H, K, USE_L2NORM, BETA_LOGITS)
    return g2, total, qv, kv, b


@triton.jit
def _diag(kv, qd, g2, b, BT: tl.constexpr):
    """Diagonal block: strict-lower L (β rows) and causal MQK by the split-exponent product."""
    o_r = tl.arange(0, BT)
    kd = kv * tl.exp2(g2)
    kit = tl.trans(kv * tl.exp2(-g2))
    L = tl.where(o_r[:, None] > o_r[None, :], tl.dot(kd, kit, input_precision="tf32"), 0.0)
    M = tl.where(o_r[:, None] >= o_r[None, :], tl.dot(qd, kit, input_precision="tf32"), 0.0)
    return L * b[:, None], M


@triton.jit
def _offdiag(kd_r, qd_r, b_r, k_c, g2_c, delta):
    """Block (r, c), r > c, split at the start of block r: delta = off_r − off_c <= 0."""
    bt = tl.trans(k_c * tl.exp2(delta[None, :] - g2_c))  # exp(G_b − G_j) <= 1
    L = tl.dot(kd_r, bt, input_precision="tf32") * b_r[:, None]
    M = tl.dot(qd_r, bt, input_precision="tf32")
    return L, M


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _store_block(ptr, base, r: tl.constexpr, c: tl.constexpr, x, BT: tl.constexpr,
                 ST: tl.constexpr):
    o_r = tl.arange(0, BT)
    offs = (r * BT + o_r)[:, None] * ST + (c * BT + o_r)[None, :]
    tl.store(ptr + base + offs, x.to(ptr.dtype.element_ty))


@triton.jit
def _store_rows(w_ptr, qg_ptr, kend_ptr, row0, eos, i_h, w, qg, kend,
                H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr):
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    rows = row0 + o_r
    offs = (rows[:, None] * H + i_h) * K + o_k[None, :]
    m2 = (rows < eos)[:, None]
    tl.store(w_ptr + offs, w.to(w_ptr.dtype.element_ty), mask=m2)
    tl.store(qg_ptr + offs, qg.to(qg_ptr.dtype.element_ty), mask=m2)
    tl.store(kend_ptr + offs, kend.to(kend_ptr.dtype.element_ty), mask=m2)


@triton.jit
def chunk_kda_prepare64_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
    w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
    chunk_table_ptr, cu_seqlens_ptr,
    T, scale, lower_bound,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, ST: tl.constexpr,
    HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    USE_L2NORM: tl.constexpr, BETA_LOGITS: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_c = tl.program_id(0)  # global step index
    i_h = tl.program_id(1)
    i_n, i_t, bos, eos = chunk_of_program(i_c, chunk_table_ptr, cu_seqlens_ptr, T, ST, IS_VARLEN)
    row0 = bos + i_t * ST
    g0, t0, q0, k0, b0 = _load_block(q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
                                     row0, eos, i_h, lower_bound, H, K, BT,
                                     HAS_A_LOG, HAS_DT_BIAS, USE_L2NORM, BETA_LOGITS)
    g1, t1, q1, k1, b1 = _load_block(q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
                                     row0 + BT, eos, i_h, lower_bound, H, K, BT,
                                     HAS_A_LOG, HAS_DT_BIAS, USE_L2NORM, BETA_LOGITS)
    g2, t2, q2, k2, b2 = _load_block(q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
                                     row0 + 2 * BT, eos, i_h, lower_bound, H, K, BT,
                                     HAS_A_LOG, HAS_DT_BIAS, USE_L2NORM, BETA_LOGITS)
    g3, t3, q3, k3, b3 = _load_block(q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
                                     row0 + 3 * BT, eos, i_h, lower_bound, H, K, BT,
                                     HAS_A_LOG, HAS_DT_BIAS, USE_L2NORM, BETA_LOGITS)
    # block offsets of the global (in-step) cumulative log-decay G = g_local + off
    off1 = t0
    off2 = off1 + t1
    off3 = off2 + t2
    glast = off3 + t3

    kd1 = k1 * tl.exp2(g1)
    kd2 = k2 * tl.exp2(g2)
    kd3 = k3 * tl.exp2(g3)
    qd0 = q0 * tl.exp2(g0) * scale
    qd1 = q1 * tl.exp2(g1) * scale
    qd2 = q2 * tl.exp2(g2) * scale
    qd3 = q3 * tl.exp2(g3) * scale

    L00, M00 = _diag(k0, qd0, g0, b0, BT)
    L11, M11 = _diag(k1, qd1, g1, b1, BT)
    L22, M22 = _diag(k2, qd2, g2, b2, BT)
    L33, M33 = _diag(k3, qd3, g3, b3, BT)
    L10, M10 = _offdiag(kd1, qd1, b1, k0, g0, off1)
    L20, M20 = _offdiag(kd2, qd2, b2, k0, g0, off2)
    L21, M21 = _offdiag(kd2, qd2, b2, k1, g1, off2 - off1)
    L30, M30 = _offdiag(kd3, qd3, b3, k0, g0, off3)
    L31, M31 = _offdiag(kd3, qd3, b3, k1, g1, off3 - off1)
    L32, M32 = _offdiag(kd3, qd3, b3, k2, g2, off3 - off2)

    X00 = neumann_inverse16(L00, BT, False, "ieee")
    X11 = neumann_inverse16(L11, BT, False, "ieee")
    X22 = neumann_inverse16(L22, BT, False, "ieee")
    X33 = neumann_inverse16(L33, BT, False, "ieee")
    X10 = -_mm(X11, _mm(L10, X00))
    X21 = -_mm(X22, _mm(L21, X11))
    X20 = -_mm(X22, _mm(L20, X00) + _mm(L21, X10))
    X32 = -_mm(X33, _mm(L32, X22))
    X31 = -_mm(X33, _mm(L31, X11) + _mm(L32, X21))
    X30 = -_mm(X33, _mm(L30, X00) + _mm(L31, X10) + _mm(L32, X20))

    # AINV = X diag(β): column blocks scaled by their β
    A00 = X00 * b0[None, :]
    A10 = X10 * b0[None, :]
    A11 = X11 * b1[None, :]
    A20 = X20 * b0[None, :]
    A21 = X21 * b1[None, :]
    A22 = X22 * b2[None, :]
    A30 = X30 * b0[None, :]
    A31 = X31 * b1[None, :]
    A32 = X32 * b2[None, :]
    A33 = X33 * b3[None, :]

    # Γ over the whole step (may underflow to 0, harmlessly: see module docstring)
    kg0 = k0 * tl.exp2(g0)
    kg1 = k1 * tl.exp2(g1 + off1[None, :])
    kg2 = k2 * tl.exp2(g2 + off2[None, :])
    kg3 = k3 * tl.exp2(g3 + off3[None, :])

    w0 = tl.dot(A00, kg0, input_precision="tf32")
    w1 = tl.dot(A10, kg0, input_precision="tf32") + tl.dot(A11, kg1, input_precision="tf32")
    w2 = (tl.dot(A20, kg0, input_precision="tf32") + tl.dot(A21, kg1, input_precision="tf32")
          + tl.dot(A22, kg2, input_precision="tf32"))
    w3 = (tl.dot(A30, kg0, input_precision="tf32") + tl.dot(A31, kg1, input_precision="tf32")
          + tl.dot(A32, kg2, input_precision="tf32") + tl.dot(A33, kg3, input_precision="tf32"))

    _store_rows(w_ptr, qg_ptr, kend_ptr, row0, eos, i_h, w0, qd0,
                k0 * tl.exp2(glast[None, :] - g0), H, K, BT)
    _store_rows(w_ptr, qg_ptr, kend_ptr, row0 + BT, eos, i_h, w1,
                q1 * tl.exp2(g1 + off1[None, :]) * scale,
                k1 * tl.exp2(glast[None, :] - off1[None, :] - g1), H, K, BT)
    _store_rows(w_ptr, qg_ptr, kend_ptr, row0 + 2 * BT, eos, i_h, w2,
                q2 * tl.exp2(g2 + off2[None, :]) * scale,
                k2 * tl.exp2(glast[None, :] - off2[None, :] - g2), H, K, BT)
    _store_rows(w_ptr, qg_ptr, kend_ptr, row0 + 3 * BT, eos, i_h, w3,
                q3 * tl.exp2(g3 + off3[None, :]) * scale,
                k3 * tl.exp2(glast[None, :] - off3[None, :] - g3), H, K, BT)

    base = (i_c.to(tl.int64) * H + i_h) * ST * ST
    zero = tl.zeros([BT, BT], dtype=tl.float32)
    _store_block(ainv_ptr, base, 0, 0, A00, BT, ST)
    _store_block(ainv_ptr, base, 0, 1, zero, BT, ST)
    _store_block(ainv_ptr, base, 0, 2, zero, BT, ST)
    _store_block(ainv_ptr, base, 0, 3, zero, BT, ST)
    _store_block(ainv_ptr, base, 1, 0, A10, BT, ST)
    _store_block(ainv_ptr, base, 1, 1, A11, BT, ST)
    _store_block(ainv_ptr, base, 1, 2, zero, BT, ST)
    _store_block(ainv_ptr, base, 1, 3, zero, BT, ST)
    _store_block(ainv_ptr, base, 2, 0, A20, BT, ST)
    _store_block(ainv_ptr, base, 2, 1, A21, BT, ST)
    _store_block(ainv_ptr, base, 2, 2, A22, BT, ST)
    _store_block(ainv_ptr, base, 2, 3, zero, BT, ST)
    _store_block(ainv_ptr, base, 3, 0, A30, BT, ST)
    _store_block(ainv_ptr, base, 3, 1, A31, BT, ST)
    _store_block(ainv_ptr, base, 3, 2, A32, BT, ST)
    _store_block(ainv_ptr, base, 3, 3, A33, BT, ST)
    _store_block(mqk_ptr, base, 0, 0, M00, BT, ST)
    _store_block(mqk_ptr, base, 0, 1, zero, BT, ST)
    _store_block(mqk_ptr, base, 0, 2, zero, BT, ST)
    _store_block(mqk_ptr, base, 0, 3, zero, BT, ST)
    _store_block(mqk_ptr, base, 1, 0, M10, BT, ST)
    _store_block(mqk_ptr, base, 1, 1, M11, BT, ST)
    _store_block(mqk_ptr, base, 1, 2, zero, BT, ST)
    _store_block(mqk_ptr, base, 1, 3, zero, BT, ST)
    _store_block(mqk_ptr, base, 2, 0, M20, BT, ST)
    _store_block(mqk_ptr, base, 2, 1, M21, BT, ST)
    _store_block(mqk_ptr, base, 2, 2, M22, BT, ST)
    _store_block(mqk_ptr, base, 2, 3, zero, BT, ST)
    _store_block(mqk_ptr, base, 3, 0, M30, BT, ST)
    _store_block(mqk_ptr, base, 3, 1, M31, BT, ST)
    _store_block(mqk_ptr, base, 3, 2, M32, BT, ST)
    _store_block(mqk_ptr, base, 3, 3, M33, BT, ST)
    o_k = tl.arange(0, K)
    tl.store(gamma_ptr + (i_c.to(tl.int64) * H + i_h) * K + o_k, tl.exp2(glast))


def chunk_kda_prepare64(
    q, k, g, beta, A_log, dt_bias, *, scale, lower_bound, use_qk_l2norm, beta_is_logits,
    cu_seqlens, chunk_table, num_chunks, operand_dtype,
):
    """Launch stage 1 for 64-token steps; same outputs as ``chunk_kda_prepare`` with 64×64
    AINV / MQK per step."""
    B, T, H, K = q.shape
    w, qg, kend, ainv, mqk, gamma = stage1_outputs(q, num_chunks, STEP, operand_dtype)
    if num_chunks == 0:
        return w, qg, kend, ainv, mqk, gamma
    dummy = gamma
    chunk_kda_prepare64_kernel[(num_chunks, H)](
        q, k, g, beta,
        A_log if A_log is not None else dummy,
        dt_bias if dt_bias is not None else dummy,
        w, qg, kend, ainv, mqk, gamma,
        chunk_table if chunk_table is not None else dummy,
        cu_seqlens if cu_seqlens is not None else dummy,
        T, float(scale), float(lower_bound),
        H=H, K=K, BT=BLOCK, ST=STEP,
        HAS_A_LOG=A_log is not None, HAS_DT_BIAS=dt_bias is not None,
        USE_L2NORM=use_qk_l2norm, BETA_LOGITS=beta_is_logits,
        IS_VARLEN=cu_seqlens is not None,
        num_warps=8,
    )
    return w, qg, kend, ainv, mqk, gamma
