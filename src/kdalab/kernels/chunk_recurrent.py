"""Stage 2 of the Triton KDA forward: the recurrence over chunks.

One program owns one sequence, one head and a block of ``BV`` value columns of the
state S [K, V] (fp32, in registers). The columns of S evolve independently (every
operand of the update, W, KEND, GAMMA, acts on the key side), so splitting V over
programs is exact and multiplies the parallelism of the serial stage by V / BV.

Per 16-token chunk, with the operands of stage 1:

    U = AINV @ V - W @ S          (corrected, β-weighted values)
    O = QG @ S + MQK @ U          (inter-chunk + intra-chunk output)
    S = diag(GAMMA) S + KEND^T @ U

All products use fp32 operands with tf32 tensor-core inputs; the stored fp16 operands
and the bf16 values are exact in tf32, so only S and U are rounded (to 10 bits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .indexing import sequence_of_program

CHUNK = 16


@triton.jit
def _load_chunk(v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
                bos, eos, c0, i_t, i_h, o_r, o_k, o_v, v_ok, o_cc,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr):
    """Operands of chunk i_t (zeros past the sequence's end), as fp32 tiles."""
    rows = bos + i_t * BT + o_r
    r_ok = rows < eos
    # tensor masks built from tensors: the interpreter rejects scalar ones
    m_cc = (bos + i_t * BT + o_cc * 0) < eos
    m_g = (bos + i_t * BT + o_k * 0) < eos
    offs_k = (rows[:, None] * H + i_h) * K + o_k[None, :]
    offs_v = (rows[:, None] * H + i_h) * V + o_v[None, :]
    cc = (c0 + i_t) * H + i_h
    w = tl.load(w_ptr + offs_k, mask=r_ok[:, None], other=0.0).to(tl.float32)
    qg = tl.load(qg_ptr + offs_k, mask=r_ok[:, None], other=0.0).to(tl.float32)
    kend = tl.load(kend_ptr + offs_k, mask=r_ok[:, None], other=0.0).to(tl.float32)
    vv = tl.load(v_ptr + offs_v, mask=r_ok[:, None] & v_ok[None, :], other=0.0).to(tl.float32)
    ainv = tl.load(ainv_ptr + cc * BT * BT + o_cc, mask=m_cc, other=0.0).to(tl.float32)
    mqk = tl.load(mqk_ptr + cc * BT * BT + o_cc, mask=m_cc, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + cc * K + o_k, mask=m_g, other=0.0)
    return w, qg, kend, vv, ainv, mqk, gamma


@triton.jit
def chunk_kda_recurrent_kernel(
    v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
    h0_ptr, ht_ptr, o_ptr,
    cu_seqlens_ptr, chunk_offsets_ptr,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STATE_VK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n, i_h, bos, eos, c0 = sequence_of_program(i_nh, cu_seqlens_ptr, chunk_offsets_ptr, T, H,
                                                 BT, IS_VARLEN)
    n_chunks = tl.cdiv(eos - bos, BT)

    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    v_ok = o_v < V
    if STATE_VK:
        s_offs = o_v[None, :] * K + o_k[:, None]
    else:
        s_offs = o_k[:, None] * V + o_v[None, :]
    s_base = (i_n * H + i_h) * K * V
    if HAS_H0:
        S = tl.load(h0_ptr + s_base + s_offs, mask=v_ok[None, :], other=0.0).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)

    o_cc = o_r[:, None] * BT + o_r[None, :]
    # Hand-pipelined: the operands of chunk i+1 are loaded before chunk i is computed, so
    # their global-memory latency hides behind the serial chain W@S -> U -> KEND^T@U -> S.
    w, qg, kend, vv, ainv, mqk, gamma = _load_chunk(
        v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
        bos, eos, c0, 0, i_h, o_r, o_k, o_v, v_ok, o_cc, H, K, V, BT)
    for i_t in range(0, n_chunks):
        nw, nqg, nkend, nvv, nainv, nmqk, ngamma = _load_chunk(
            v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
            bos, eos, c0, i_t + 1, i_h, o_r, o_k, o_v, v_ok, o_cc, H, K, V, BT)
        rows = bos + i_t * BT + o_r
        offs_v = (rows[:, None] * H + i_h) * V + o_v[None, :]
        m_v = (rows < eos)[:, None] & v_ok[None, :]

        u = tl.dot(ainv, vv, input_precision="tf32") - tl.dot(w, S, input_precision="tf32")
        o = tl.dot(qg, S, input_precision="tf32") + tl.dot(mqk, u, input_precision="tf32")
        tl.store(o_ptr + offs_v, o.to(o_ptr.dtype.element_ty), mask=m_v)
        S = S * gamma[:, None] + tl.dot(tl.trans(kend), u, input_precision="tf32")
        w, qg, kend, vv, ainv, mqk, gamma = nw, nqg, nkend, nvv, nainv, nmqk, ngamma

    if STORE_HT:
        tl.store(ht_ptr + s_base + s_offs, S.to(ht_ptr.dtype.element_ty), mask=v_ok[None, :])


def chunk_kda_recurrent(
    v, w, qg, kend, ainv, mqk, gamma, *, initial_state, final_state, state_vk,
    cu_seqlens, chunk_offsets, num_seqs, block_v=32, num_warps=4, num_stages=2, chunk=CHUNK,
):
    """Launch stage 2; writes ``o`` (dtype of v) and, if given, ``final_state`` in place."""
    B, T, H, V = v.shape
    K = w.shape[-1]
    o = torch.empty_like(v)
    bv = min(block_v, triton.next_power_of_2(V))
    dummy = gamma
    chunk_kda_recurrent_kernel[(triton.cdiv(V, bv), num_seqs * H)](
        v, w, qg, kend, ainv, mqk, gamma,
        initial_state if initial_state is not None else dummy,
        final_state if final_state is not None else dummy,
        o,
        cu_seqlens if cu_seqlens is not None else dummy,
        chunk_offsets if chunk_offsets is not None else dummy,
        T,
        H=H, K=K, V=V, BT=chunk, BV=bv,
        HAS_H0=initial_state is not None, STORE_HT=final_state is not None,
        STATE_VK=state_vk, IS_VARLEN=cu_seqlens is not None,
        num_warps=num_warps, num_stages=num_stages,
    )
    return o
