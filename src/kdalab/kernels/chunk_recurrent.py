"""Stage 2: the recurrence over chunks, on S^T [BV, K] (value rows first).

Per 16-token chunk, with stage 1's operands (``chunk_prepare.py``) and every product
transposed so that its M dimension is the value block BV (Hopper's warpgroup MMA wants M = 64
per warpgroup; the untransposed products would have M = 16, the chunk):

    U^T = V^T AINV^T - S^T W^T             [BV, 16]
    O^T = S^T QG^T + U^T MQK^T             [BV, 16]
    S^T = S^T diag(GAMMA) + U^T KEND       [BV, K]   (KEND in two parts: U^T KEND + U^T KLO)

The columns of S (rows of S^T) are independent, so a program owns BV of them. ``DT``: the
products' operands, fp16 (S, U rounded; fp32 accumulation) or fp32 (tf32 products, or
3xTF32 ones with ``PREC`` "tf32x3": config.dot "fp32").

The fp16 guard (``GUARD``). An fp16 product overflows only where S, U or v leaves fp16's
range; inf then reaches every later product (inf·0 = NaN), so a program whose end state is not
finite had one. Its redo (``redo_chunks``) repeats the fp16 steps from the start state, writing
nothing (the same bits as before), up to the first that is not finite; there the tokens before
the first non-finite value or column of U keep the fp16 step's outputs (the non-finite entries
zeroed: they reach earlier outputs only through MQK's and AINV's zeros), the rest take tf32's,
and every later step is tf32. So an output depends only on its own and earlier tokens, bit for
bit, whatever overflows later (docs/kernels.md).

Three passes share the kernel (``PASS``):

* 0 — serial: one program runs a whole sequence (rows ``o_v`` of one head);
* 1 — segment summaries (sequence parallelism, docs/kernels.md): the chunk update is affine
  in the state, S_end = M S_start + R, so each segment of a sequence (but the last, with
  ``SKIP_LAST``) computes R (its end state from a zero start: rows 0..V-1 of its summary
  slot) and M^T (rows V..V+K-1: the same recurrence from an identity start with v = 0), no
  outputs; its guard redoes the whole segment with tf32 products (a summary reaches only
  later segments' start states);
* 2 — segment outputs: every segment restarts from its true start state, which the combine
  (``chunk_combine.py``) left in its slot, writes o, and a sequence's last segment the final
  state.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .chunk_prepare import as_operand
from .config import DOT_PRECISION
from .indexing import program_rows

CHUNK = 16


@triton.jit
def load_chunk(v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
               bos, eos, c0, i_t, i_h, o_r, o_k, o_v, v_ok, o_cc_t,
               H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr):
    """Operands of chunk ``i_t`` (from row ``bos``, global chunk ``c0 + i_t``) in their
    stored types, transposed where the products need it; zeros past ``eos`` and in rows
    without a value (``v_ok``)."""
    rows = bos + i_t * BT + o_r
    r_ok = rows < eos
    c_ok = (bos + i_t * BT + o_r * 0) < eos
    m_cc = c_ok[:, None] & c_ok[None, :]
    m_g = (bos + i_t * BT + o_k * 0) < eos
    offs_kt = (rows[None, :] * H + i_h) * K + o_k[:, None]      # [K, 16]
    offs_k = (rows[:, None] * H + i_h) * K + o_k[None, :]       # [16, K]
    offs_vt = (rows[None, :] * H + i_h) * V + o_v[:, None]      # [BV, 16]
    cc = (c0 + i_t) * H + i_h
    wt = tl.load(w_ptr + offs_kt, mask=r_ok[None, :], other=0.0)
    qgt = tl.load(qg_ptr + offs_kt, mask=r_ok[None, :], other=0.0)
    kend = tl.load(kend_ptr + offs_k, mask=r_ok[:, None], other=0.0)
    klo = tl.load(klo_ptr + offs_k, mask=r_ok[:, None], other=0.0)
    vt = tl.load(v_ptr + offs_vt, mask=v_ok[:, None] & r_ok[None, :], other=0.0)
    ainvt = tl.load(ainv_ptr + cc * BT * BT + o_cc_t, mask=m_cc, other=0.0)
    mqkt = tl.load(mqk_ptr + cc * BT * BT + o_cc_t, mask=m_cc, other=0.0)
    gamma = tl.load(gamma_ptr + cc * K + o_k, mask=m_g, other=0.0)
    return wt, qgt, kend, klo, vt, ainvt, mqkt, gamma


@triton.jit
def chunk_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma, DT: tl.constexpr,
               WRITE_O: tl.constexpr, PREC: tl.constexpr):
    """One chunk with ``DT`` operands and fp32 operands' products in ``PREC`` ("tf32", or
    "tf32x3" for config.dot "fp32"): (S^T after it, O^T; without ``WRITE_O`` a placeholder)."""
    Sd = St.to(DT)
    ud = (tl.dot(vt.to(DT), ainvt.to(DT), input_precision=PREC)
          - tl.dot(Sd, wt.to(DT), input_precision=PREC))
    ud = as_operand(ud, DT, PREC)
    ot = St  # a placeholder: without outputs nothing reads it
    if WRITE_O:
        ot = (tl.dot(Sd, qgt.to(DT), input_precision=PREC)
              + tl.dot(ud, mqkt.to(DT), input_precision=PREC))
    St = St * gamma[None, :] + tl.dot(ud, kend.to(DT), input_precision=PREC)
    St += tl.dot(ud, klo.to(DT), input_precision=PREC)
    return St, ot


@triton.jit
def not_finite(x):
    """1 if any entry of ``x`` is inf or NaN."""
    return tl.max(tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), 1), 0)


@triton.jit
def switch_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma):
    """The redo's chunk whose fp16 step is not finite (module docstring): (S^T after it by
    tf32 products, O^T with the fp16 step's outputs before the first token whose value or
    column of U is not finite in fp16, and tf32's from it on). U is formed as ``chunk_step``
    forms it, so the columns before that token have the first pass's bits."""
    Sd = St.to(tl.float16)
    # a value past fp16's range is inf as an operand, and inf·0 = NaN would reach the earlier
    # columns through AINV's zeros: such values are zeroed, and their columns marked bad
    v16 = vt.to(tl.float16)
    v_fin = (v16 == v16) & (tl.abs(v16) != float("inf"))
    ud = (tl.dot(tl.where(v_fin, v16, 0.0).to(tl.float16), ainvt.to(tl.float16),
                 input_precision="tf32")
          - tl.dot(Sd, wt.to(tl.float16), input_precision="tf32")).to(tl.float16)
    fin = (ud == ud) & (tl.abs(ud) != float("inf"))
    col_bad = (tl.max(1 - fin.to(tl.int32), axis=0) | tl.max(1 - v_fin.to(tl.int32), axis=0)
               | not_finite(Sd))  # [16] by token
    keep = tl.cumsum(col_bad, axis=0) == 0                            # before the first bad
    o16 = (tl.dot(Sd, qgt.to(tl.float16), input_precision="tf32")
           + tl.dot(tl.where(fin, ud, 0.0).to(tl.float16), mqkt.to(tl.float16),
                    input_precision="tf32"))
    St32, o32 = chunk_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma, tl.float32, True,
                           "tf32")
    return St32, tl.where(keep[None, :], o16, o32)


@triton.jit
def store_outputs(o_ptr, ot, rows, eos, i_h, o_v, v_ok, H, V: tl.constexpr):
    """O^T of the token ``rows`` (those before ``eos``)."""
    offs_vt = (rows[None, :] * H + i_h) * V + o_v[:, None]
    tl.store(o_ptr + offs_vt, ot.to(o_ptr.dtype.element_ty),
             mask=v_ok[:, None] & (rows < eos)[None, :])


@triton.jit
def store_checkpoint(ck, row, i_h, v0, St, H, K: tl.constexpr, STATE_VK: tl.constexpr):
    """Checkpoint row ``row`` of head ``i_h`` from S^T (value rows from ``v0``) by the tensor
    descriptor ``ck`` ([rows * H, V, K] VK, [rows * H, K, V] KV): one bulk copy, no tile of
    addresses in registers (through pointers it spilled and measured slower; docs/kernels.md)."""
    r = (row * H + i_h).to(tl.int32)
    BV: tl.constexpr = St.shape[0]
    if STATE_VK:
        ck.store([r, v0, 0], St.to(ck.dtype).reshape(1, BV, K))
    else:
        ck.store([r, 0, v0], tl.trans(St).to(ck.dtype).reshape(1, K, BV))


@triton.jit
def run_chunks(St, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr, o_ptr,
               bos, eos, c0, i_h, o_v, v_ok, H, K: tl.constexpr,
               V: tl.constexpr, BT: tl.constexpr, DT: tl.constexpr, WRITE_O: tl.constexpr,
               ck_ptr, ck_base, j0, v0, CKC: tl.constexpr, STATE_VK: tl.constexpr,
               PREC: tl.constexpr):
    """Run S^T (rows ``o_v``) through the chunks of rows [bos, eos) (first global chunk
    ``c0``), writing O^T when ``WRITE_O``; returns the end state. With ``CKC`` > 0 (and
    ``WRITE_O``) the state after every full chunk whose index in the sequence (``j0`` + i) + 1
    is a multiple of ``CKC`` goes to checkpoint row ``ck_base`` + (j0 + i + 1) / CKC - 1 of
    ``ck_ptr`` (prefix caching). Chunk i+1's operands are loaded while chunk i computes
    (hand-pipelined: their latency hides behind the serial chain S^T W^T -> U^T -> U^T KEND
    -> S^T)."""
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_cc_t = o_r[None, :] * BT + o_r[:, None]  # element (c, r) of X^T is X[r, c]
    n_chunks = tl.cdiv(eos - bos, BT)
    # the checkpoints: chunks since the last one (a counter, not a division in the loop) and
    # the next one's row
    ck_count = j0 * 0
    ck_row = ck_base
    if CKC > 0:
        ck_count = j0 % CKC
        ck_row = ck_base + j0 // CKC
    ck_due = 0  # 1: St is a checkpoint not yet stored
    wt, qgt, kend, klo, vt, ainvt, mqkt, gamma = load_chunk(
        v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr, bos, eos, c0, 0,
        i_h, o_r, o_k, o_v, v_ok, o_cc_t, H, K, V, BT)
    for i_t in range(0, n_chunks):
        if CKC > 0:
            if WRITE_O:
                # the checkpoint of the chunk before, stored before the next chunk's operands
                # are loaded (fewer registers live than after)
                if ck_due != 0:
                    store_checkpoint(ck_ptr, ck_row, i_h, v0, St, H, K, STATE_VK)
                    ck_row += 1
        nwt, nqgt, nkend, nklo, nvt, nainvt, nmqkt, ngamma = load_chunk(
            v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr, bos, eos,
            c0, i_t + 1, i_h, o_r, o_k, o_v, v_ok, o_cc_t, H, K, V, BT)
        St, ot = chunk_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma, DT, WRITE_O,
                            PREC)
        if WRITE_O:
            store_outputs(o_ptr, ot, bos + i_t * BT + o_r, eos, i_h, o_v, v_ok, H, V)
        if CKC > 0:
            if WRITE_O:
                ck_count += 1
                # a full chunk that ends a checkpoint interval: a scalar flag (a [BV, K] tile
                # of masks and pointers formed here spilled: scripts/sm90_report.py)
                ck_due = ((ck_count == CKC) & (bos + (i_t + 1) * BT <= eos)).to(tl.int32)
                if ck_count == CKC:
                    ck_count -= CKC
        wt, qgt, kend, klo, vt, ainvt, mqkt, gamma = (nwt, nqgt, nkend, nklo, nvt, nainvt,
                                                      nmqkt, ngamma)
    if CKC > 0:
        if WRITE_O:
            if ck_due != 0:  # the last chunk's
                store_checkpoint(ck_ptr, ck_row, i_h, v0, St, H, K, STATE_VK)
    return St


@triton.jit
def redo_chunks(St, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
                o_ptr, bos, eos, c0, i_h, o_v, v_ok, H, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, ck_ptr, ck_base, j0, v0, CKC: tl.constexpr,
                STATE_VK: tl.constexpr):
    """The fp16 guard's redo of a program from its start state (module docstring), in three
    phases: the fp16 steps (``run_chunks``' arithmetic) up to the first that is not finite,
    writing nothing (they gave the same bits before); that chunk by ``switch_step``; the rest
    with tf32 products. Outputs and checkpoints are written from the switch on. No prefetch:
    the redo runs only where the guard tripped."""
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_cc_t = o_r[None, :] * BT + o_r[:, None]
    n_chunks = tl.cdiv(eos - bos, BT)
    i_sw = n_chunks  # the switch chunk (none: n_chunks)
    for i_t in range(0, n_chunks):
        if i_sw == n_chunks:
            wt, qgt, kend, klo, vt, ainvt, mqkt, gamma = load_chunk(
                v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr, bos, eos,
                c0, i_t, i_h, o_r, o_k, o_v, v_ok, o_cc_t, H, K, V, BT)
            S16, _ = chunk_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma, tl.float16,
                                False, "tf32")
            if not_finite(S16) == 0:
                St = S16
            else:
                i_sw = i_t
    for i_t in range(i_sw, n_chunks):
        wt, qgt, kend, klo, vt, ainvt, mqkt, gamma = load_chunk(
            v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr, bos, eos,
            c0, i_t, i_h, o_r, o_k, o_v, v_ok, o_cc_t, H, K, V, BT)
        if i_t == i_sw:
            St, ot = switch_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma)
        else:
            St, ot = chunk_step(St, wt, qgt, kend, klo, vt, ainvt, mqkt, gamma, tl.float32,
                                True, "tf32")
        store_outputs(o_ptr, ot, bos + i_t * BT + o_r, eos, i_h, o_v, v_ok, H, V)
        if CKC > 0:
            j = j0 + i_t + 1  # chunks of the sequence done
            if (j % CKC == 0) & (bos + (i_t + 1) * BT <= eos):
                store_checkpoint(ck_ptr, ck_base + j // CKC - 1, i_h, v0, St, H, K, STATE_VK)
    return St


@triton.jit
def user_state_ptrs(ptr, i_n, i_h, o_v, H, K: tl.constexpr, V: tl.constexpr,
                    BV: tl.constexpr, STATE_VK: tl.constexpr):
    """Pointers to S^T's rows ``o_v`` in a user state tensor [N, H, K, V] (or [N, H, V, K])."""
    o_k = tl.arange(0, K)
    base = ptr + (i_n * H + i_h) * K * V
    if STATE_VK:
        return base + (o_v[:, None] * K + o_k[None, :])
    return base + (o_k[None, :] * V + o_v[:, None])


@triton.jit
def start_and_run(h0_ptr, slot_ptrs, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr,
                  mqk_ptr, gamma_ptr, o_ptr, bos, eos, c0, i_n, i_h, o_v, v_ok, H,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                  HAS_H0: tl.constexpr, STATE_VK: tl.constexpr, PASS: tl.constexpr,
                  DT: tl.constexpr, ck_ptr, ck_base, j0, v0, CKC: tl.constexpr,
                  REDO: tl.constexpr, PREC: tl.constexpr):
    """Load the program's start state and run its chunks: from the initial state (pass 0;
    zeros without one), from zero rows of S and identity rows of M^T (pass 1), or from the
    true start the combine left in the slot's rows of S (pass 2). ``i_n``: the state's row
    in ``h0_ptr`` (a pool row; negative: a zero start)."""
    o_k = tl.arange(0, K)
    if PASS == 0:
        if HAS_H0:
            St0 = tl.load(user_state_ptrs(h0_ptr, i_n, i_h, o_v, H, K, V, BV, STATE_VK),
                          mask=(v_ok & (o_v * 0 + i_n >= 0))[:, None],
                          other=0.0).to(tl.float32)
        else:
            St0 = tl.zeros([BV, K], dtype=tl.float32)
    elif PASS == 1:
        St0 = tl.where(o_v[:, None] - V == o_k[None, :], 1.0, 0.0)
    else:
        St0 = tl.load(slot_ptrs, mask=v_ok[:, None], other=0.0)
    if REDO:
        return redo_chunks(St0, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr,
                           gamma_ptr, o_ptr, bos, eos, c0, i_h, o_v, v_ok, H, K, V, BT, ck_ptr,
                           ck_base, j0, v0, CKC, STATE_VK)
    return run_chunks(St0, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
                      o_ptr, bos, eos, c0, i_h, o_v, v_ok, H, K, V, BT, DT, PASS != 1,
                      ck_ptr, ck_base, j0, v0, CKC, STATE_VK, PREC)


@triton.jit
def chunk_kda_recurrent_kernel(
    v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, mqk_ptr, gamma_ptr,
    h0_ptr, ht_ptr, o_ptr, sum_ptr,
    cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr,
    T,
    H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STATE_VK: tl.constexpr,
    IS_VARLEN: tl.constexpr, PASS: tl.constexpr, SKIP_LAST: tl.constexpr,
    DT: tl.constexpr, GUARD: tl.constexpr, HAS_IDX: tl.constexpr = False,
    CKC: tl.constexpr = 0, idx_ptr=None, ck_ptr=None, ck_offsets_ptr=None,
    FLAG: tl.constexpr = 0, flag_ptr=None, PREC: tl.constexpr = "tf32",
):
    # the guard in two launches (FLAG 1: every program writes its flag, 1 when its state is
    # not finite, and then writes no final state; FLAG 2: the redo, only the flagged
    # programs). Every program of the first launch writes its flag, so the flags need no
    # zeroing (a memset launch less)
    lin = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if FLAG == 2:
        if tl.load(flag_ptr + lin) == 0:
            return
    i_sh = tl.program_id(0)   # sequence (PASS 0) or segment (PASS 1, 2), times H, + head
    i_v = tl.program_id(1)    # block of BV state rows
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    v_ok = o_v < V
    i_n, i_h, i_s, bos, eos, c0, j0, p, last = program_rows(
        i_sh, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr, T, H, BT, IS_VARLEN,
        PASS != 0)
    if PASS != 0:
        if PASS == 1:
            if SKIP_LAST:  # nothing after a sequence's last segment needs its summary
                if last != 0:
                    if FLAG == 1:
                        tl.store(flag_ptr + lin, 0)
                    return
        slot = sum_ptr + (i_s * H + i_h) * (V + K) * K  # summaries: [segments, H, V + K, K]
        slot_ptrs = slot + o_v[:, None] * K + o_k[None, :]
    if PASS == 0:
        slot_ptrs = sum_ptr  # unused
    # the sequence's first checkpoint row
    ck_base = 0
    if CKC > 0:
        ck_base = tl.load(ck_offsets_ptr + i_n).to(tl.int64)
    # the state's row: the sequence's, or the pool row its index names (negative: none)
    i_row = i_n
    if HAS_IDX:
        i_row = tl.load(idx_ptr + i_n).to(tl.int64)

    # pass 1's redo is the whole segment in tf32; passes 0 and 2 resume (module docstring)
    redo_dt: tl.constexpr = tl.float32 if PASS == 1 else DT
    redo: tl.constexpr = PASS != 1
    if FLAG == 2:
        St = start_and_run(h0_ptr, slot_ptrs, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr,
                           ainv_ptr, mqk_ptr, gamma_ptr, o_ptr, bos, eos, c0, i_row, i_h, o_v,
                           v_ok, H, K, V, BT, BV, HAS_H0, STATE_VK, PASS, redo_dt, ck_ptr,
                           ck_base, j0, i_v * BV, CKC, redo, PREC)
    else:
        St = start_and_run(h0_ptr, slot_ptrs, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr,
                           ainv_ptr, mqk_ptr, gamma_ptr, o_ptr, bos, eos, c0, i_row, i_h, o_v,
                           v_ok, H, K, V, BT, BV, HAS_H0, STATE_VK, PASS, DT, ck_ptr, ck_base,
                           j0, i_v * BV, CKC, False, PREC)
        if GUARD:
            # the fp16 products overflowed (or the input was not finite): redo (the start
            # state loaded again: kept, it would cost 64 registers in the loop)
            if not_finite(St) != 0:
                St = start_and_run(h0_ptr, slot_ptrs, v_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr,
                                   ainv_ptr, mqk_ptr, gamma_ptr, o_ptr, bos, eos, c0, i_row,
                                   i_h, o_v, v_ok, H, K, V, BT, BV, HAS_H0, STATE_VK, PASS,
                                   redo_dt, ck_ptr, ck_base, j0, i_v * BV, CKC, redo, PREC)

    ok = 1
    if FLAG == 1:
        bad = not_finite(St)
        tl.store(flag_ptr + lin, bad)
        ok = 1 - bad  # a pool row keeps its start state for the redo

    if PASS == 1:
        tl.store(slot_ptrs, St, mask=o_v[:, None] < V + K)
    elif STORE_HT:
        ht_ptrs = user_state_ptrs(ht_ptr, i_row, i_h, o_v, H, K, V, BV, STATE_VK)
        row_ok = ((o_k[None, :] * 0 + i_row) >= 0) & ((o_k[None, :] * 0 + ok) != 0)
        if PASS == 0:
            tl.store(ht_ptrs, St.to(ht_ptr.dtype.element_ty), mask=v_ok[:, None] & row_ok)
        else:  # the final state from a sequence's last segment
            ht_ok = v_ok[:, None] & ((o_k[None, :] * 0 + last) != 0) & row_ok
            tl.store(ht_ptrs, St.to(ht_ptr.dtype.element_ty), mask=ht_ok)


DOT_TYPES = {"tf32": tl.float32, "fp16": tl.float16, "fp32": tl.float32}


def chunk_kda_recurrent(
    v, w, qg, kend, klo, ainv, mqk, gamma, *, initial_state, final_state, state_vk, cu_seqlens,
    chunk_offsets, num_seqs, block_v, num_warps, dot, guard, num_stages=2, seq_order=None,
    segments=None, summary=None, passes=(0,), skip_last=True, o=None, state_indices=None,
    checkpoints=None, checkpoint_offsets=None, checkpoint_chunks=0, first_flags=None,
):
    """Launch stage 2. Returns o (like v). ``segments`` (an int32 table [S, 6],
    ``launch_plan.segment_table``) selects the sequence-parallel ``passes`` (1: summaries into
    ``summary`` [S, H, V + K, K] fp32; 2: outputs from the combined start states); without it
    one serial pass (0) a sequence. ``o``: write the outputs there (pass 2 completes pass 1's).
    ``state_indices`` [N]: the initial and final states are rows of a pool (``initial_state``
    and ``final_state`` both the pool). ``checkpoints`` with ``checkpoint_offsets`` [N] (each
    sequence's first row) and ``checkpoint_chunks`` > 0: the state every that many chunks
    (``run_chunks``), stored through a tensor descriptor. ``guard``: the fp16 guard's redo in
    the same launch (True), in a second launch (``"launch"``), or none (False: tf32 products);
    ``first_flags``: its first launch's flags (run by ``chunk_recurrent_ws``): the redo alone."""
    B, T, H, V = v.shape
    K = w.shape[-1]
    if o is None:
        o = torch.empty_like(v)
    opt = lambda x: x if x is not None else gamma  # noqa: E731 - absent optional pointers
    if checkpoints is not None and checkpoints.shape[0] == 0:
        checkpoints = None  # no sequence is as long as one checkpoint interval
    if checkpoints is not None:
        # one [BV, K] (or [K, BV]) box a store; the box's bounds drop value rows past V
        from triton.tools.tensor_descriptor import TensorDescriptor

        view = checkpoints.view(-1, *checkpoints.shape[2:])
        box = [1, block_v, K] if state_vk else [1, K, block_v]
        checkpoints = TensorDescriptor.from_tensor(view, box)
    common = dict(H=H, K=K, V=V, BT=CHUNK, BV=block_v, HAS_H0=initial_state is not None,
                  STORE_HT=final_state is not None, STATE_VK=state_vk,
                  IS_VARLEN=cu_seqlens is not None, DT=DOT_TYPES[dot], GUARD=guard is True,
                  PREC=DOT_PRECISION[dot],
                  SKIP_LAST=skip_last, HAS_IDX=state_indices is not None,
                  CKC=checkpoint_chunks if checkpoints is not None else 0,
                  num_warps=num_warps, num_stages=num_stages)
    for pass_ in passes:
        if pass_ == 0:
            grid = (num_seqs * H, -(-V // block_v))
        else:
            rows = V + K if pass_ == 1 else V
            grid = (segments.shape[0] * H, -(-rows // block_v))
        args = (v, w, qg, kend, klo, ainv, mqk, gamma, opt(initial_state), opt(final_state), o,
                opt(summary), opt(cu_seqlens), opt(chunk_offsets), opt(seq_order),
                opt(segments), T)
        kw = dict(common, idx_ptr=state_indices, ck_ptr=checkpoints,
                  ck_offsets_ptr=checkpoint_offsets, PASS=pass_)
        if guard == "launch":  # the redo as a second launch (flags: one a program)
            flags = first_flags
            if flags is None:
                flags = torch.empty((math.prod(grid),), device=v.device, dtype=torch.int32)
                chunk_kda_recurrent_kernel[grid](*args, **dict(kw, FLAG=1, flag_ptr=flags))
            chunk_kda_recurrent_kernel[grid](*args, **dict(kw, FLAG=2, flag_ptr=flags))
        else:
            chunk_kda_recurrent_kernel[grid](*args, **kw)
    return o
