"""Stage 2, transposed: the recurrence over chunks on S^T [BV, K] (value rows first).

Same algebra as ``chunk_recurrent.py``, transposed so that every product has the value
block BV as its M dimension (Hopper's warpgroup MMA needs M = 64 per warpgroup; the
untransposed products have M = 16, the chunk):

    U^T = V^T AINV^T - S^T W^T             [BV, 16]
    O^T = S^T QG^T + U^T MQK^T             [BV, 16]
    S^T = S^T diag(GAMMA) + U^T KEND       [BV, K]

``DT`` = bf16 selects bf16 products (S and U rounded to bf16, stage-1 operands stored in bf16),
fp16 fp16 products (S and U rounded to fp16: 3 more bits than bf16, but finite only below
65504), instead of tf32 ones (stage-1 operands in fp16, exact in tf32; S and U rounded to tf32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .indexing import sequence_of_program

CHUNK = 16


@triton.jit
def _load_chunk_t(v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
                  bos, eos, c0, i_t, i_h, o_r, o_k, o_v, v_ok, o_cc_t,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                  DT: tl.constexpr):
    """Operands of chunk i_t in the transposed form (zeros past the sequence's end)."""
    rows = bos + i_t * BT + o_r
    r_ok = rows < eos
    # tensor masks built from tensors: the interpreter rejects scalar ones
    c_ok = (bos + i_t * BT + o_r * 0) < eos
    m_cc = c_ok[:, None] & c_ok[None, :]
    m_g = (bos + i_t * BT + o_k * 0) < eos
    offs_kt = (rows[None, :] * H + i_h) * K + o_k[:, None]      # [K, 16]
    offs_k = (rows[:, None] * H + i_h) * K + o_k[None, :]       # [16, K]
    offs_vt = (rows[None, :] * H + i_h) * V + o_v[:, None]      # [BV, 16]
    cc = (c0 + i_t) * H + i_h
    wt = tl.load(w_ptr + offs_kt, mask=r_ok[None, :], other=0.0).to(DT)
    qgt = tl.load(qg_ptr + offs_kt, mask=r_ok[None, :], other=0.0).to(DT)
    kend = tl.load(kend_ptr + offs_k, mask=r_ok[:, None], other=0.0).to(DT)
    vt = tl.load(v_ptr + offs_vt, mask=v_ok[:, None] & r_ok[None, :], other=0.0).to(DT)
    ainvt = tl.load(ainv_ptr + cc * BT * BT + o_cc_t, mask=m_cc, other=0.0).to(DT)
    mqkt = tl.load(mqk_ptr + cc * BT * BT + o_cc_t, mask=m_cc, other=0.0).to(DT)
    gamma = tl.load(gamma_ptr + cc * K + o_k, mask=m_g, other=0.0)
    return wt, qgt, kend, vt, ainvt, mqkt, gamma


@triton.jit
def step_output_t(St, vt, wt, qgt, ainvt, mqkt, DT: tl.constexpr):
    """A 16-token step on S^T [BV, K], first half: (O^T [BV, 16], U^T rounded to DT), S and U
    rounded to DT as product operands, accumulated in fp32."""
    Sd = St.to(DT)
    ut = tl.dot(vt, ainvt, input_precision="tf32") - tl.dot(Sd, wt, input_precision="tf32")
    ud = ut.to(DT)
    ot = tl.dot(Sd, qgt, input_precision="tf32") + tl.dot(ud, mqkt, input_precision="tf32")
    return ot, ud


@triton.jit
def step_state_t(St, ud, kend, gamma):
    """The step's second half: the next S^T (callers store O^T first: fewer registers)."""
    return St * gamma[None, :] + tl.dot(ud, kend, input_precision="tf32")


@triton.jit
def initial_state_t(h0_ptr, i_n, i_h, o_k, o_v, v_ok, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                    STATE_VK: tl.constexpr):
    """The program's S^T [BV, K] (value rows ``o_v`` of head ``i_h`` of sequence ``i_n``) from
    the initial state, zeros without one; with the state's base and offsets for the store."""
    if STATE_VK:
        s_offs = o_v[:, None] * K + o_k[None, :]
    else:
        s_offs = o_k[None, :] * V + o_v[:, None]
    s_base = (i_n * H + i_h) * K * V
    if HAS_H0:
        St = tl.load(h0_ptr + s_base + s_offs, mask=v_ok[:, None], other=0.0).to(tl.float32)
    else:
        St = tl.zeros([BV, K], dtype=tl.float32)
    return St, s_base, s_offs


@triton.jit
def final_state_t(St, ht_ptr, flag_ptr, s_base, s_offs, v_ok, i_prog, STORE_HT: tl.constexpr,
                  FLAG: tl.constexpr):
    """Store the final S^T; with FLAG 1 (the guarded fp16 pass) flag the program if S^T is
    not finite: a value past fp16's range (v, S or U rounded to inf) leaves S^T non-finite for
    good — inf propagates through every later product and decay (inf·0 = NaN) — so the final
    S^T is finite exactly when no rounding overflowed (or the input was not finite)."""
    if STORE_HT:
        tl.store(ht_ptr + s_base + s_offs, St.to(ht_ptr.dtype.element_ty), mask=v_ok[:, None])
    if FLAG == 1:
        bad = ((St != St) | (tl.abs(St) == float("inf"))).to(tl.int32)
        tl.store(flag_ptr + i_prog, tl.max(tl.max(bad, 1), 0))


@triton.jit
def chunk_kda_recurrent_t_kernel(
    v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
    h0_ptr, ht_ptr, o_ptr,
    cu_seqlens_ptr, chunk_offsets_ptr, flag_ptr,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STATE_VK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DT: tl.constexpr, PREFETCH: tl.constexpr, FLAG: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_prog = i_nh * tl.num_programs(0) + i_v
    if FLAG == 2:  # the fallback pass: only the programs the fp16 pass flagged
        if tl.load(flag_ptr + i_prog) == 0:
            return
    i_n, i_h, bos, eos, c0 = sequence_of_program(i_nh, cu_seqlens_ptr, chunk_offsets_ptr, T, H,
                                                 BT, IS_VARLEN)
    n_chunks = tl.cdiv(eos - bos, BT)

    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    v_ok = o_v < V
    St, s_base, s_offs = initial_state_t(h0_ptr, i_n, i_h, o_k, o_v, v_ok, H, K, V, BV, HAS_H0,
                                         STATE_VK)

    # transposed views: element (c, r) of X^T is X[r, c]
    o_cc_t = o_r[None, :] * BT + o_r[:, None]
    if PREFETCH:
        # Hand-pipelined: chunk i+1's operands are loaded before chunk i is computed, so their
        # global-memory latency hides behind the serial chain S^T W^T -> U^T -> U^T KEND -> S^T
        # (triton does not turn these loads into asynchronous copies: no cp.async in the TTGIR).
        wt, qgt, kend, vt, ainvt, mqkt, gamma = _load_chunk_t(
            v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr, bos, eos, c0, 0, i_h,
            o_r, o_k, o_v, v_ok, o_cc_t, H, K, V, BT, DT)
    for i_t in range(0, n_chunks):
        if PREFETCH:
            nwt, nqgt, nkend, nvt, nainvt, nmqkt, ngamma = _load_chunk_t(
                v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr, bos, eos, c0,
                i_t + 1, i_h, o_r, o_k, o_v, v_ok, o_cc_t, H, K, V, BT, DT)
        else:
            wt, qgt, kend, vt, ainvt, mqkt, gamma = _load_chunk_t(
                v_ptr, w_ptr, qg_ptr, kend_ptr, ainv_ptr, mqk_ptr, gamma_ptr, bos, eos, c0,
                i_t, i_h, o_r, o_k, o_v, v_ok, o_cc_t, H, K, V, BT, DT)
        rows = bos + i_t * BT + o_r
        offs_vt = (rows[None, :] * H + i_h) * V + o_v[:, None]      # [BV, 16]
        m_vt = v_ok[:, None] & (rows < eos)[None, :]

        ot, ud = step_output_t(St, vt, wt, qgt, ainvt, mqkt, DT)
        tl.store(o_ptr + offs_vt, ot.to(o_ptr.dtype.element_ty), mask=m_vt)
        St = step_state_t(St, ud, kend, gamma)
        if PREFETCH:
            wt, qgt, kend, vt, ainvt, mqkt, gamma = nwt, nqgt, nkend, nvt, nainvt, nmqkt, ngamma

    final_state_t(St, ht_ptr, flag_ptr, s_base, s_offs, v_ok, i_prog, STORE_HT, FLAG)


def chunk_kda_recurrent_t(
    v, w, qg, kend, ainv, mqk, gamma, *, initial_state, final_state, state_vk,
    cu_seqlens, chunk_offsets, num_seqs, block_v=64, num_warps=4, num_stages=2, dot="tf32",
    chunk=CHUNK, prefetch=True, fp16_fallback=True,
):
    """Launch the transposed stage 2; same contract as ``chunk_kda_recurrent``.

    With ``dot="fp16"`` and ``fp16_fallback``, every program also records whether its state
    left fp16's range (see the kernel), and a second launch of the tf32 form (the same
    stage-1 operands: fp16 storage) recomputes o and the final state of exactly those
    programs; the others return at once. No host synchronization.
    """
    import torch

    B, T, H, V = v.shape
    K = w.shape[-1]
    o = torch.empty_like(v)
    bv = min(block_v, triton.next_power_of_2(V))
    dummy = gamma
    grid = (triton.cdiv(V, bv), num_seqs * H)

    def launch(dt, flag_mode, flags):
        chunk_kda_recurrent_t_kernel[grid](
            v, w, qg, kend, ainv, mqk, gamma,
            initial_state if initial_state is not None else dummy,
            final_state if final_state is not None else dummy,
            o,
            cu_seqlens if cu_seqlens is not None else dummy,
            chunk_offsets if chunk_offsets is not None else dummy,
            flags if flags is not None else dummy,
            T,
            H=H, K=K, V=V, BT=chunk, BV=bv,
            HAS_H0=initial_state is not None, STORE_HT=final_state is not None,
            STATE_VK=state_vk, IS_VARLEN=cu_seqlens is not None,
            DT=DOT_TYPES[dt], PREFETCH=prefetch, FLAG=flag_mode,
            num_warps=num_warps, num_stages=num_stages,
        )

    launch_guarded(launch, grid, dot, fp16_fallback, v.device)
    return o


DOT_TYPES = {"tf32": tl.float32, "bf16": tl.bfloat16, "fp16": tl.float16}


def launch_guarded(launch, grid, dot, fp16_fallback, device):
    """Run a recurrent kernel's ``launch(dot, flag_mode, flags)`` over ``grid``: once (FLAG 0),
    or, for fp16 products with ``fp16_fallback``, the fp16 pass that flags programs whose
    state left fp16's range (FLAG 1) and then the tf32 pass over exactly those (FLAG 2, the
    others return at once). No host synchronization."""
    import torch

    if dot != "fp16" or not fp16_fallback:
        launch(dot, 0, None)
        return
    flags = torch.empty(grid[0] * grid[1], dtype=torch.int32, device=device)
    launch("fp16", 1, flags)
    launch("tf32", 2, flags)
