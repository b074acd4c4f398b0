"""The forward in one pass: each recurrent program computes its chunks' stage-1 operands itself.

Same algebra and precision as the two-stage path (``chunk_prepare.py`` then
``chunk_recurrent_t.py``): the stage-1 operands are rounded to their storage type in
registers instead of being written and read back, so the results are the same up to the
summation order of fp32 products (tested in the interpreter). What changes is where the work
runs: no intermediate tensors and one launch, but the token-parallel work moves onto the
serial chain over chunks, and each value block of a head repeats it. The issue asked whether
this pays for short sequences; docs/BENCHMARKS.md has the measurement.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_prepare import prepare_chunk
from .chunk_recurrent_t import (
    DOT_TYPES,
    final_state_t,
    initial_state_t,
    launch_guarded,
    step_output_t,
    step_state_t,
)
from .indexing import sequence_of_program

CHUNK = 16


@triton.jit
def chunk_kda_fused_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, v_ptr,
    h0_ptr, ht_ptr, o_ptr, cu_seqlens_ptr, flag_ptr,
    T, scale, lower_bound,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_L2NORM: tl.constexpr,
    BETA_LOGITS: tl.constexpr, FP16_INVERSE: tl.constexpr, INV_PRECISION: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STATE_VK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DT: tl.constexpr, OPD: tl.constexpr, FLAG: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_prog = i_nh * tl.num_programs(0) + i_v
    if FLAG == 2:  # the fallback pass: only the programs the fp16 pass flagged
        if tl.load(flag_ptr + i_prog) == 0:
            return
    # (the chunk offsets are not needed here: cu_seqlens stands in for them)
    i_n, i_h, bos, eos, c0 = sequence_of_program(i_nh, cu_seqlens_ptr, cu_seqlens_ptr, T, H,
                                                 BT, IS_VARLEN)
    n_chunks = tl.cdiv(eos - bos, BT)

    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    v_ok = o_v < V
    St, s_base, s_offs = initial_state_t(h0_ptr, i_n, i_h, o_k, o_v, v_ok, H, K, V, BV, HAS_H0,
                                         STATE_VK)

    for i_t in range(0, n_chunks):
        rows = bos + i_t * BT + o_r
        r_ok = rows < eos
        w, qd, kend, ainv, mqk, gamma = prepare_chunk(
            q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, rows, r_ok, i_h, scale,
            lower_bound, H, K, BT, HAS_A_LOG, HAS_DT_BIAS, USE_L2NORM, BETA_LOGITS,
            FP16_INVERSE, INV_PRECISION)
        # rounded to the two-stage path's storage type, then to the product type, as its
        # loads do
        wt = tl.trans(w.to(OPD)).to(DT)
        qgt = tl.trans(qd.to(OPD)).to(DT)
        kend = kend.to(OPD).to(DT)
        ainvt = tl.trans(ainv.to(OPD)).to(DT)
        mqkt = tl.trans(mqk.to(OPD)).to(DT)
        offs_vt = (rows[None, :] * H + i_h) * V + o_v[:, None]      # [BV, 16]
        m_vt = v_ok[:, None] & r_ok[None, :]
        vt = tl.load(v_ptr + offs_vt, mask=m_vt, other=0.0).to(DT)

        ot, ud = step_output_t(St, vt, wt, qgt, ainvt, mqkt, DT)
        tl.store(o_ptr + offs_vt, ot.to(o_ptr.dtype.element_ty), mask=m_vt)
        St = step_state_t(St, ud, kend, gamma)

    final_state_t(St, ht_ptr, flag_ptr, s_base, s_offs, v_ok, i_prog, STORE_HT, FLAG)


def chunk_kda_fused(
    q, k, g, beta, A_log, dt_bias, v, *, scale, lower_bound, use_qk_l2norm, beta_is_logits,
    cu_seqlens, num_seqs, initial_state, final_state, state_vk, operand_dtype,
    fp16_inverse=False, inv_precision="ieee", dot="fp16", fp16_fallback=True, block_v=64,
    num_warps=4, num_stages=2,
):
    """Launch the one-pass forward; returns o. Arguments as the two stages' launchers
    (``chunk_kda_prepare``, ``chunk_kda_recurrent_t``) take them; ``operand_dtype`` is the
    two-stage path's storage type, kept here only as a rounding."""
    import torch

    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty_like(v)
    bv = min(block_v, triton.next_power_of_2(V))
    grid = (triton.cdiv(V, bv), num_seqs * H)
    dummy = o
    opd = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
           torch.float32: tl.float32}[operand_dtype]

    def launch(dt, flag_mode, flags):
        chunk_kda_fused_kernel[grid](
            q, k, g, beta,
            A_log if A_log is not None else dummy,
            dt_bias if dt_bias is not None else dummy,
            v,
            initial_state if initial_state is not None else dummy,
            final_state if final_state is not None else dummy,
            o,
            cu_seqlens if cu_seqlens is not None else dummy,
            flags if flags is not None else dummy,
            T, float(scale), float(lower_bound),
            H=H, K=K, V=V, BT=CHUNK, BV=bv,
            HAS_A_LOG=A_log is not None, HAS_DT_BIAS=dt_bias is not None,
            USE_L2NORM=use_qk_l2norm, BETA_LOGITS=beta_is_logits, FP16_INVERSE=fp16_inverse,
            INV_PRECISION=inv_precision, HAS_H0=initial_state is not None,
            STORE_HT=final_state is not None, STATE_VK=state_vk,
            IS_VARLEN=cu_seqlens is not None, DT=DOT_TYPES[dt], OPD=opd, FLAG=flag_mode,
            num_warps=num_warps, num_stages=num_stages,
        )

    launch_guarded(launch, grid, dot, fp16_fallback, v.device)
    return o
