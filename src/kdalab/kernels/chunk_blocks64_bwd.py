"""Backward of stage 2, the blocks' products without a walk (``autograd.BWD_MODE["blocks64"]``):
every 64-token block and head from its checkpoint S_0 and pass 3's gradient G_3 after it, the
block's state-sized products with its 64 rows at once (docs/training.md, "The next form of the
blocks kernel"). Token-major, per block of 4 chunks c (rows t), with D_c, F_c, E(c', c) the
products of the chunk decays γ_j over j < c, j > c and c' < j < c:

    U = blockdiag(AINV) V - (W ⊙ D) S_0ᵀ - Σ_{c'} ((W ⊙ E(c', ·)) KEND_{c'}ᵀ) U_{c'}
    dQG = (dO S_0) ⊙ D + Σ_{c' < c} ((dO U_{c'}ᵀ) KEND_{c'}) ⊙ E(c', c)     (dW: dU, negated)
    dKEND = (U G_3) ⊙ F + Σ_{c'' > c} ((U dO_{c''}ᵀ) QG_{c''} - (U dU_{c''}ᵀ) W_{c''}) ⊙ E(c, c'')
    dγ_c = Σ_v S_c ⊙ G_c from the same products' chunk sums

(S_0 here [V, K] as the state pass keeps Sᵀ, G_3 likewise.) The outputs are the walk's
(``chunk_blocks_bwd.chunk_kda_bwd_blocks_kernel``) with one value block; U goes through a
buffer like dU (the solve's rows, then the block's [64, V] operand)."""

from __future__ import annotations

import triton
import triton.language as tl

from .indexing import segment_of_program


@triton.jit
def _dot(a, b):
    """a @ b, tf32 products (as the walk's), fp32 accumulation."""
    return tl.dot(a, b, input_precision="tf32")


@triton.jit
def _rows4(ct, a0, a1, a2, a3):
    """[64, BK]: row t takes a_c of its chunk c = ``ct``[t] (four [BK] vectors)."""
    c = ct[:, None]
    return tl.where(c == 0, a0[None, :], tl.where(c == 1, a1[None, :],
                    tl.where(c == 2, a2[None, :], a3[None, :])))


@triton.jit
def _sum4(x, BT: tl.constexpr):
    """[4, BK]: the sums of a [64, BK] tile's rows over each chunk."""
    return tl.sum(tl.reshape(x, [4, BT, x.shape[1]]), axis=1)


@triton.jit
def _row(x4, c: tl.constexpr):
    """Row ``c`` of a [4, BK] tile, as a [BK] vector."""
    return tl.sum(tl.where((tl.arange(0, 4) == c)[:, None], x4, 0.0), axis=0)


@triton.jit
def _tok(ptr, rows, r_ok, i_h, H, o_c, C: tl.constexpr):
    """Rows ``rows`` of a token-major [T, H, C] tensor, columns ``o_c``, fp32."""
    return tl.load(ptr + (rows[:, None] * H + i_h) * C + o_c[None, :], mask=r_ok[:, None],
                   other=0.0).to(tl.float32)


@triton.jit
def _kend(kend_ptr, klo_ptr, rows, r_ok, i_h, H, o_k, K: tl.constexpr):
    """KEND's rows, its two parts (KEND_hi + KLO) added in fp32."""
    return (_tok(kend_ptr, rows, r_ok, i_h, H, o_k, K)
            + _tok(klo_ptr, rows, r_ok, i_h, H, o_k, K))


@triton.jit
def _state_cols(ptr, row, i_h, o_v, o_k, H, K: tl.constexpr, V: tl.constexpr,
                STATE_VK: tl.constexpr):
    """Pointers to columns ``o_k`` of Sᵀ [V, ·] of state ``row`` of a [N, H, K, V] (VK:
    [N, H, V, K]) tensor."""
    base = ptr + (row * H + i_h) * K * V
    if STATE_VK:
        return base + o_v[:, None] * K + o_k[None, :]
    return base + o_k[None, :] * V + o_v[:, None]


@triton.jit
def _start_cols(h0_ptr, ck_ptr, i_n, st_row, jb, i_h, o_v, o_k, H, K: tl.constexpr,
                V: tl.constexpr, HAS_H0: tl.constexpr, STATE_VK: tl.constexpr):
    """Columns ``o_k`` of S_0ᵀ [V, BK] fp32: the checkpoint before block ``jb``, the initial
    state (or zero) before a sequence's first block."""
    if jb == 0:
        if HAS_H0:
            x = tl.load(_state_cols(h0_ptr, i_n, i_h, o_v, o_k, H, K, V, STATE_VK))
            x = x.to(tl.float32)
        else:
            x = tl.zeros([V, o_k.shape[0]], dtype=tl.float32)
    else:
        x = tl.load(_state_cols(ck_ptr, st_row, i_h, o_v, o_k, H, K, V, STATE_VK))
    return x


@triton.jit
def chunk_kda_bwd_blocks64_kernel(
    v_ptr, do_ptr, du_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, gamma_ptr,
    h0_ptr, ck_ptr, ck_offsets_ptr, ends_ptr, u_ptr,
    dqg_ptr, dw_ptr, dkend_ptr, dgam_ptr, dmqk_ptr, dh0_ptr, seg_ptr,
    H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_DH0: tl.constexpr, STATE_VK: tl.constexpr,
):
    """One (64-token block, head). ``u_ptr``: a [T, H, V] fp32 buffer for U."""
    item = tl.program_id(0)
    i_s = (item // H).to(tl.int64)
    i_h = item % H
    i_n, jb, bos, eos, c0, last = segment_of_program(i_s, seg_ptr)
    n_ch = tl.cdiv(eos - bos, BT)
    BB: tl.constexpr = 4 * BT
    o_t = tl.arange(0, BB)
    o_r = tl.arange(0, BT)
    o_v = tl.arange(0, V)
    ct = o_t // BT
    rows = bos + o_t
    r_ok = rows < eos
    st_row = tl.load(ck_offsets_ptr + i_n).to(tl.int64) + jb - 1  # the checkpoint (jb > 0)
    cg = (c0 * H + i_h) * K  # chunk c's decay: gamma_ptr + cg + c * H * K
    f32 = tl.float32

    # U = blockdiag(AINV) V - (W ⊙ D) S_0ᵀ - the earlier chunks' rows (a chunk at a time)
    same = (ct[:, None] == ct[None, :]) & r_ok[:, None] & r_ok[None, :]
    a_offs = (((c0 + ct[:, None]) * H + i_h) * BT + o_t[:, None] % BT) * BT + o_t[None, :] % BT
    ablk = tl.load(ainv_ptr + a_offs, mask=same, other=0.0).to(f32)
    u = _dot(ablk, _tok(v_ptr, rows, r_ok, i_h, H, o_v, V))
    m0 = tl.zeros([BB, BT], dtype=f32)  # (W ⊙ E(c', ·)) KEND_{c'}ᵀ, rows after chunk c'
    m1 = tl.zeros([BB, BT], dtype=f32)
    m2 = tl.zeros([BB, BT], dtype=f32)
    for kb in range(0, K, BK):
        o_k = kb + tl.arange(0, BK)
        one = tl.full([BK], 1.0, f32)
        nil = tl.zeros([BK], dtype=f32)
        g0 = tl.load(gamma_ptr + cg + o_k, mask=(o_k * 0 + 0) < n_ch, other=1.0)
        g1 = tl.load(gamma_ptr + cg + H * K + o_k, mask=(o_k * 0 + 1) < n_ch, other=1.0)
        g2 = tl.load(gamma_ptr + cg + 2 * H * K + o_k, mask=(o_k * 0 + 2) < n_ch, other=1.0)
        w = _tok(w_ptr, rows, r_ok, i_h, H, o_k, K)
        st = _start_cols(h0_ptr, ck_ptr, i_n, st_row, jb, i_h, o_v, o_k, H, K, V, HAS_H0,
                         STATE_VK)
        u -= tl.dot(w * _rows4(ct, one, g0, g0 * g1, g0 * g1 * g2), tl.trans(st),
                    input_precision="tf32")
        for cp in tl.static_range(3):
            rc = bos + cp * BT + o_r
            ke = _kend(kend_ptr, klo_ptr, rc, rc < eos, i_h, H, o_k, K)
            if cp == 0:
                m0 += tl.dot(w * _rows4(ct, nil, one, g1, g1 * g2), tl.trans(ke),
                             input_precision="tf32")
            elif cp == 1:
                m1 += tl.dot(w * _rows4(ct, nil, nil, one, g2), tl.trans(ke),
                             input_precision="tf32")
            else:
                m2 += tl.dot(w * _rows4(ct, nil, nil, nil, one), tl.trans(ke),
                             input_precision="tf32")
    u_offs = (rows[:, None] * H + i_h) * V + o_v[None, :]
    for cp in tl.static_range(3):  # chunk cp's rows are final: the later rows take them
        tl.store(u_ptr + u_offs, u, mask=(r_ok & (ct == cp))[:, None])
        tl.debug_barrier()
        rc = bos + cp * BT + o_r
        uc = _tok(u_ptr, rc, rc < eos, i_h, H, o_v, V)
        if cp == 0:
            u -= _dot(m0, uc)
        elif cp == 1:
            u -= _dot(m1, uc)
        else:
            u -= _dot(m2, uc)
    tl.store(u_ptr + u_offs, u, mask=(r_ok & (ct == 3))[:, None])
    tl.debug_barrier()  # U's rows are read by other threads below

    # the pairs: dO U_{c'}ᵀ and dU U_{c'}ᵀ (rows after c'), U dO_{c''}ᵀ and U dU_{c''}ᵀ
    # (rows before c''): dO Uᵀ and dU Uᵀ over the block, [64, 64], masked by chunk
    do = _tok(do_ptr, rows, r_ok, i_h, H, o_v, V)
    du = _tok(du_ptr, rows, r_ok, i_h, H, o_v, V)
    u = _tok(u_ptr, rows, r_ok, i_h, H, o_v, V)
    p1 = _dot(do, tl.trans(u))  # [64, 64]: dO_t · U_s
    p2 = _dot(du, tl.trans(u))
    cs = ct[None, :]  # the pair tile's column chunk
    # dMQK = tril(dO_c U_cᵀ): p1's diagonal blocks
    blk = (ct[:, None] == cs) & (ct[:, None] < n_ch)
    tl.store(dmqk_ptr + (((c0 + ct[:, None]) * H + i_h) * BT + o_t[:, None] % BT) * BT
             + o_t[None, :] % BT, tl.where(o_t[:, None] >= o_t[None, :], p1, 0.0), mask=blk)

    for kb in range(0, K, BK):  # the key columns are independent from here on
        o_k = kb + tl.arange(0, BK)
        one = tl.full([BK], 1.0, f32)
        nil = tl.zeros([BK], dtype=f32)
        g0 = tl.load(gamma_ptr + cg + o_k, mask=(o_k * 0 + 0) < n_ch, other=1.0)
        g1 = tl.load(gamma_ptr + cg + H * K + o_k, mask=(o_k * 0 + 1) < n_ch, other=1.0)
        g2 = tl.load(gamma_ptr + cg + 2 * H * K + o_k, mask=(o_k * 0 + 2) < n_ch, other=1.0)
        g3 = tl.load(gamma_ptr + cg + 3 * H * K + o_k, mask=(o_k * 0 + 3) < n_ch, other=1.0)
        dd = _rows4(ct, one, g0, g0 * g1, g0 * g1 * g2)          # D_c
        offs = (rows[:, None] * H + i_h) * K + o_k[None, :]
        st = _start_cols(h0_ptr, ck_ptr, i_n, st_row, jb, i_h, o_v, o_k, H, K, V, HAS_H0,
                         STATE_VK)
        ke = _kend(kend_ptr, klo_ptr, rows, r_ok, i_h, H, o_k, K)
        e0 = _rows4(ct, nil, one, g1, g1 * g2)   # E(0, c), rows after chunk 0
        e1 = _rows4(ct, nil, nil, one, g2)
        e2 = _rows4(ct, nil, nil, nil, one)
        # dQG, dW: through S_0 (the state before the block) and the earlier chunks' U
        y = _dot(_tok(do_ptr, rows, r_ok, i_h, H, o_v, V), st)
        tl.store(dqg_ptr + offs, y * dd + _dot(tl.where(cs == 0, p1, 0.0), ke) * e0
                 + _dot(tl.where(cs == 1, p1, 0.0), ke) * e1
                 + _dot(tl.where(cs == 2, p1, 0.0), ke) * e2, mask=r_ok[:, None])
        qg = _tok(qg_ptr, rows, r_ok, i_h, H, o_k, K)
        w = _tok(w_ptr, rows, r_ok, i_h, H, o_k, K)
        qy = _sum4(qg * y, BT)
        z = _dot(_tok(du_ptr, rows, r_ok, i_h, H, o_v, V), st)
        tl.store(dw_ptr + offs, -(z * dd + _dot(tl.where(cs == 0, p2, 0.0), ke) * e0
                                  + _dot(tl.where(cs == 1, p2, 0.0), ke) * e1
                                  + _dot(tl.where(cs == 2, p2, 0.0), ke) * e2),
                 mask=r_ok[:, None])
        qy -= _sum4(w * z, BT)
        # dKEND: through G_3 (the gradient after the block) and the later chunks' dO, dU
        g_end = tl.load(ends_ptr + (i_s * H + i_h) * V * K + o_v[:, None] * K + o_k[None, :])
        sig = tl.sum(st * g_end, axis=0)
        ug = _dot(_tok(u_ptr, rows, r_ok, i_h, H, o_v, V), g_end)
        x2 = (_dot(tl.where(cs == 2, tl.trans(p1), 0.0), qg)
              - _dot(tl.where(cs == 2, tl.trans(p2), 0.0), w))
        x3 = (_dot(tl.where(cs == 3, tl.trans(p1), 0.0), qg)
              - _dot(tl.where(cs == 3, tl.trans(p2), 0.0), w))
        x1 = (_dot(tl.where(cs == 1, tl.trans(p1), 0.0), qg)
              - _dot(tl.where(cs == 1, tl.trans(p2), 0.0), w))
        dke = (ug * _rows4(ct, g1 * g2 * g3, g2 * g3, g3, one) + x1 * _rows4(ct, one, nil, nil, nil)
               + x2 * _rows4(ct, g1, one, nil, nil) + x3 * _rows4(ct, g1 * g2, g2, one, nil))
        tl.store(dkend_ptr + offs, dke, mask=r_ok[:, None])
        # dγ_c = Σ_v S_c ⊙ G_c, S_c and G_c as above: per chunk, [4, BK]
        kug = _sum4(ke * ug, BT)
        kx2 = _sum4(ke * x2, BT)
        kx3 = _sum4(ke * x3, BT)
        o4 = tl.arange(0, 4)[:, None]
        t0 = sig * g1 * g2 * g3 + _row(qy, 1) + g1 * _row(qy, 2) + g1 * g2 * _row(qy, 3)
        t1 = (g0 * (g2 * g3 * sig + _row(qy, 2) + g2 * _row(qy, 3))
              + g2 * g3 * _row(kug, 0) + _row(kx2, 0) + g2 * _row(kx3, 0))
        t2 = (g0 * g1 * (g3 * sig + _row(qy, 3))
              + g3 * (g1 * _row(kug, 0) + _row(kug, 1)) + g1 * _row(kx3, 0) + _row(kx3, 1))
        t3 = g0 * g1 * g2 * sig + g1 * g2 * _row(kug, 0) + g2 * _row(kug, 1) + _row(kug, 2)
        gam = tl.where(o4 == 0, t0[None, :], tl.where(o4 == 1, t1[None, :],
                       tl.where(o4 == 2, t2[None, :], t3[None, :])))
        tl.store(dgam_ptr + ((c0 + o4) * H + i_h) * K + o_k[None, :], gam, mask=o4 < n_ch)
        if STORE_DH0:
            if jb == 0:  # the gradient before the block: G_3 D_4 + Σ_c R_c D_c
                do = _tok(do_ptr, rows, r_ok, i_h, H, o_v, V)
                du = _tok(du_ptr, rows, r_ok, i_h, H, o_v, V)
                dh = (g_end * (g0 * g1 * g2 * g3)[None, :]
                      + _dot(tl.trans(do), qg * dd)
                      - _dot(tl.trans(du), w * dd))
                tl.store(_state_cols(dh0_ptr, i_n, i_h, o_v, o_k, H, K, V, STATE_VK),
                         dh.to(dh0_ptr.dtype.element_ty))
