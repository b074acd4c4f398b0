"""The combine of the sequence-parallel state pass: each segment's true start state.

Segment p of a sequence maps its start state to its end state affinely, S_end = M_p S_start +
R_p (pass 1 of ``chunk_recurrent.py`` stores R_p^T and M_p^T in slot p). Starting from the
initial state, in the transposed form the kernels use (rows of S^T = value columns of S),

    S^T_start(0) = initial state^T,   S^T_start(p + 1) = S^T_start(p) M_p^T + R_p^T,

a short serial chain per sequence, parallel over heads and blocks of value rows. Each start
state is left in its slot's rows of S (over R_p, read just before), where pass 2 reads it.
The products run in 3xTF32 (three tf32 tensor-core products: near-fp32), fp32 accumulation.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_recurrent import user_state_ptrs


@triton.jit
def chunk_kda_combine_kernel(sum_ptr, seg_offsets_ptr, h0_ptr, H, K: tl.constexpr,
                             V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                             STATE_VK: tl.constexpr, HAS_IDX: tl.constexpr = False,
                             idx_ptr=None, REVERSE: tl.constexpr = False):
    """``REVERSE``: the backward's combine (``chunk_recurrent_bwd.py``): from the final
    state's gradient (``h0_ptr``), the segments from the last to the second, each slot left
    with its segment's gradient at its end."""
    i_nh = tl.program_id(0)
    i_v = tl.program_id(1)
    i_n = (i_nh // H).to(tl.int64)
    i_h = i_nh % H
    s0 = tl.load(seg_offsets_ptr + i_n).to(tl.int64)
    s1 = tl.load(seg_offsets_ptr + i_n + 1).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    v_ok = o_v < V
    o_k = tl.arange(0, K)
    if HAS_H0:
        row = i_n
        if HAS_IDX:  # a pool row (negative: a zero start)
            row = tl.load(idx_ptr + i_n).to(tl.int64)
        S = tl.load(user_state_ptrs(h0_ptr, row, i_h, o_v, H, K, V, BV, STATE_VK),
                    mask=(v_ok & (o_v * 0 + row >= 0))[:, None], other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BV, K], dtype=tl.float32)
    for i in range(0, s1 - 1 - s0):  # the segments with a summary
        if REVERSE:
            s = s1 - 1 - i
        else:
            s = s0 + i
        slot = sum_ptr + (s * H + i_h) * (V + K) * K  # R^T rows, then M^T rows
        rows = slot + o_v[:, None] * K + o_k[None, :]
        r = tl.load(rows, mask=v_ok[:, None], other=0.0)
        m = tl.load(slot + (V + o_k)[:, None] * K + o_k[None, :])  # M^T [K, K]
        tl.debug_barrier()  # every thread has read R's rows before any overwrites them
        tl.store(rows, S, mask=v_ok[:, None])
        S = tl.dot(S, m, r, input_precision="tf32x3")
    # the segment without a summary: only its start state (gradient at its end) is written
    if REVERSE:
        edge = s0
    else:
        edge = s1 - 1
    tail = sum_ptr + (edge * H + i_h) * (V + K) * K
    tl.store(tail + o_v[:, None] * K + o_k[None, :], S, mask=v_ok[:, None])


def chunk_kda_combine(summary, seg_offsets, initial_state, *, num_seqs, state_vk, H, K, V,
                      block_v=16, num_warps=8, state_indices=None, reverse=False):
    """Turn pass 1's summaries into each segment's start state, in place (see above).

    Blocks of 16 value rows on 8 warps by default: the whole M^T in registers, one product per
    segment, 200 registers and no spills on sm_90a (``scripts/sm90_report.py``; larger
    blocks spill). A first form that re-read S^T from memory in K-slices took 8.5 µs per
    segment on the H200 (docs/kernels.md)."""
    grid = (num_seqs * H, -(-V // block_v))
    chunk_kda_combine_kernel[grid](
        summary, seg_offsets, initial_state if initial_state is not None else summary,
        idx_ptr=state_indices, H=H, K=K, V=V, BV=block_v, HAS_H0=initial_state is not None,
        STATE_VK=state_vk, HAS_IDX=state_indices is not None, REVERSE=reverse,
        num_warps=num_warps)
