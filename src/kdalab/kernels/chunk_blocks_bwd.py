"""Backward of stage 2, its second part: dV, dAINV chunk-parallel (``chunk_kda_bwd_dv_kernel``)
and every 64-token block in parallel (``chunk_kda_bwd_blocks_kernel``), after the dS recurrence
(``chunk_recurrent_bwd.py``, whose docstring has the algebra)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_recurrent_bwd import (
    _TL,
    CHUNK,
    CKC,
    _cc,
    _chunk,
    _mm,
    _opt,
    _state_ptrs,
    _tile_t,
)
from .indexing import chunk_of_program, segment_of_program
from .launch_plan import blocks_kernel_stages, persistent_programs, resident_programs


@triton.jit
def chunk_kda_bwd_dv_kernel(v_ptr, du_ptr, ainv_ptr, dv_ptr, dainv_ptr, chunk_table_ptr, T, H,
                            part_cc, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                            IS_VARLEN: tl.constexpr, PREC: tl.constexpr = "tf32"):
    """dV and dAINV of every chunk and head in parallel from pass 3's dU, the blocks kernel's
    state-free products taken out of it; partial sums by ``BV`` as its own."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    row0, eos = chunk_of_program(i_c, chunk_table_ptr, T, BT, IS_VARLEN)
    o_r = tl.arange(0, BT)
    rows = row0 + o_r
    r_ok = rows < eos
    cc = i_c.to(tl.int64) * H + i_h
    ainv = tl.load(ainv_ptr + cc * BT * BT + o_r[:, None] * BT + o_r[None, :]).to(tl.float32)
    tril = o_r[:, None] >= o_r[None, :]
    for i_v in tl.static_range(0, (V + BV - 1) // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        m = (o_v < V)[:, None] & r_ok[None, :]
        tok = (rows[None, :] * H + i_h) * V + o_v[:, None]
        dut = tl.load(du_ptr + tok, mask=m, other=0.0)
        vt = tl.load(v_ptr + tok, mask=m, other=0.0).to(tl.float32)
        dvt = tl.dot(dut, ainv, input_precision=PREC)
        tl.store(dv_ptr + tok, dvt.to(dv_ptr.dtype.element_ty), mask=m)
        dainv = tl.where(tril, tl.dot(tl.trans(dut), vt, input_precision=PREC), 0.0)
        tl.store(dainv_ptr + i_v * part_cc + cc * BT * BT + o_r[:, None] * BT + o_r[None, :],
                 dainv)


@triton.jit
def _block_start(h0_ptr, ck_ptr, ck_offsets_ptr, i_n, jb, i_h, o_v, v_ok, H,
                 K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                 STATE_VK: tl.constexpr):
    """S^T [BV, K] fp32 before block ``jb`` of sequence ``i_n``: the initial state (or zero)
    before its first block, else the forward's checkpoint after block jb - 1."""
    if jb == 0:
        if HAS_H0:
            St = tl.load(_state_ptrs(h0_ptr, i_n, i_h, o_v, H, K, V, STATE_VK),
                         mask=v_ok[:, None], other=0.0).to(tl.float32)
        else:
            St = tl.zeros([BV, K], dtype=tl.float32)
    else:
        ck_base = tl.load(ck_offsets_ptr + i_n).to(tl.int64)
        St = tl.load(_state_ptrs(ck_ptr, ck_base + jb - 1, i_h, o_v, H, K, V, STATE_VK),
                     mask=v_ok[:, None], other=0.0).to(tl.float32)
    return St


@triton.jit
def chunk_kda_bwd_blocks_kernel(
    v_ptr, do_ptr, du_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, gamma_ptr,
    h0_ptr, ck_ptr, ck_offsets_ptr, ends_ptr,
    dqg_ptr, dw_ptr, dkend_ptr, dgam_ptr, dmqk_ptr, dh0_ptr,
    scratch_ptr, seg_ptr, n_items, part_tok, part_gam, part_cc,
    H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    CKC: tl.constexpr, HAS_H0: tl.constexpr, STORE_DH0: tl.constexpr,
    STATE_VK: tl.constexpr, DS: tl.constexpr = tl.float32, DD: tl.constexpr = tl.float32,
    DKEND_OVER_DU: tl.constexpr = False, PREC: tl.constexpr = "tf32",
):
    """Every 64-token block (and head, and value block) from its checkpoint and pass 3's
    ``ends`` and ``du``; no block waits for another. Forward through the block (S live; each
    chunk's S^T and U^T to the program's scratch; dQG, dW, dMQK), then back (dS live, by pass
    3's expression; dKEND, dγ with S read back). dV and dAINV, which need no state, are
    ``chunk_kda_bwd_dv_kernel``'s (a state that is both an accumulator and a product's
    operand spills: sm_90a 604 against 1276 bytes a thread with them here). ``DKEND_OVER_DU``:
    ``dkend_ptr`` is ``du_ptr`` (one value block, K = V), each chunk's dKEND stored after a
    barrier behind every thread's load of its dU. Programs are persistent (the scratch is per
    running program), each looping over (block, head) items."""
    pid = tl.program_id(0)
    i_v = tl.program_id(1)
    nprog = tl.num_programs(0)
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    v_ok = o_v < V
    slot = (pid * tl.num_programs(1) + i_v).to(tl.int64) * CKC
    scr_s = scratch_ptr + slot * (BV * K) + tl.arange(0, BV)[:, None] * K + o_k[None, :]
    scr_u = (scratch_ptr + nprog * tl.num_programs(1) * CKC * BV * K
             + slot * (BV * BT) + tl.arange(0, BV)[:, None] * BT + o_r[None, :])
    for item in range(pid, n_items, nprog):
        i_s = (item // H).to(tl.int64)
        i_h = item % H
        i_n, jb, bos, eos, c0, last = segment_of_program(i_s, seg_ptr)
        n_ch = tl.cdiv(eos - bos, BT)
        St = _block_start(h0_ptr, ck_ptr, ck_offsets_ptr, i_n, jb, i_h, o_v, v_ok, H, K, V,
                          BV, HAS_H0, STATE_VK)
        # forward through the block
        for c in range(0, n_ch):
            rows, r_ok, c_ok, cc, tok = _chunk(bos, eos, c, c0, i_h, o_r, o_v, H, V, BT)
            m = v_ok[:, None] & r_ok[None, :]
            vt = tl.load(v_ptr + tok, mask=m, other=0.0).to(tl.float32)
            dot_ = tl.load(do_ptr + tok, mask=m, other=0.0).to(tl.float32)
            dut = tl.load(du_ptr + tok, mask=m, other=0.0)
            wt = _tile_t(w_ptr, rows, r_ok, i_h, H, o_k, K)
            kend_hi = _tile_t(kend_ptr, rows, r_ok, i_h, H, o_k, K)
            klo = _tile_t(klo_ptr, rows, r_ok, i_h, H, o_k, K)
            ainv = _cc(ainv_ptr, cc, o_r, c_ok, BT)
            gam = tl.load(gamma_ptr + cc * K + o_k)
            Sd = St.to(DS)
            tl.store(scr_s + c * BV * K, St)
            ut = tl.dot(vt, tl.trans(ainv), input_precision=PREC) - _mm(Sd, wt, DS, PREC)
            tl.store(scr_u + c * BV * BT, ut)
            tril = o_r[:, None] >= o_r[None, :]
            dmqk = tl.where(tril, tl.dot(tl.trans(dot_), ut, input_precision=PREC), 0.0)
            tl.store(dmqk_ptr + i_v * part_cc + cc * BT * BT + o_r[:, None] * BT
                     + o_r[None, :], dmqk)
            dqgt = _mm(tl.trans(Sd), dot_, DS, PREC)
            dwt = -_mm(tl.trans(Sd), dut, DS, PREC)
            offs_t = i_v * part_tok + (rows[None, :] * H + i_h) * K + o_k[:, None]
            tl.store(dqg_ptr + offs_t, dqgt, mask=r_ok[None, :])
            tl.store(dw_ptr + offs_t, dwt, mask=r_ok[None, :])
            # U as two parts in U·KEND_hi, and KEND's two parts (docs/training.md
            # "Precision": the H200 truncates U to 10 bits where the forward rounds it);
            # 3xTF32 products take U whole, as the fp32 forward does
            kt = tl.trans(kend_hi)
            if PREC == "tf32":
                u_hi = ut.to(tl.bfloat16).to(tl.float32)
                St = (St * gam[None, :] + tl.dot(u_hi, kt, input_precision="tf32")
                      + tl.dot(ut - u_hi, kt, input_precision="tf32"))
            else:
                St = St * gam[None, :] + tl.dot(ut, kt, input_precision=PREC)
            St += tl.dot(ut, tl.trans(klo), input_precision=PREC)
        tl.debug_barrier()  # the scratch rows are read by other threads
        dSt = tl.load(ends_ptr + (i_s * H + i_h) * V * K + o_v[:, None] * K + o_k[None, :],
                      mask=v_ok[:, None], other=0.0)
        # backward through the block; never pipelined: an asynchronous copy of dU would be
        # read after the barrier that lets DKEND_OVER_DU's store overwrite it
        for ic in tl.range(0, n_ch, num_stages=1):
            c = n_ch - 1 - ic
            rows, r_ok, c_ok, cc, tok = _chunk(bos, eos, c, c0, i_h, o_r, o_v, H, V, BT)
            m = v_ok[:, None] & r_ok[None, :]
            dot_ = tl.load(do_ptr + tok, mask=m, other=0.0).to(tl.float32)
            dut = tl.load(du_ptr + tok, mask=m, other=0.0)
            ut = tl.load(scr_u + c * BV * BT)
            wt = _tile_t(w_ptr, rows, r_ok, i_h, H, o_k, K)
            qgt = _tile_t(qg_ptr, rows, r_ok, i_h, H, o_k, K)
            gam = tl.load(gamma_ptr + cc * K + o_k)
            dkendt = _mm(tl.trans(dSt), ut, DD, PREC)
            if DKEND_OVER_DU:  # every thread's dU rows of this chunk read before any store
                tl.debug_barrier()
            offs_t = i_v * part_tok + (rows[None, :] * H + i_h) * K + o_k[:, None]
            tl.store(dkend_ptr + offs_t, dkendt, mask=r_ok[None, :])
            dgam = tl.sum(tl.load(scr_s + c * BV * K) * dSt, axis=0)
            tl.store(dgam_ptr + i_v * part_gam + cc * K + o_k, dgam)
            # pass 3's recurrence, the same expression (its dU loaded): the same dS
            dSt = (dSt * gam[None, :] + tl.dot(dot_, tl.trans(qgt), input_precision=PREC)
                   - tl.dot(dut, tl.trans(wt), input_precision=PREC))
        if STORE_DH0:
            if jb == 0:
                tl.store(_state_ptrs(dh0_ptr, i_n, i_h, o_v, H, K, V, STATE_VK),
                         dSt.to(dh0_ptr.dtype.element_ty), mask=v_ok[:, None])
        tl.debug_barrier()  # the next item's walk forward overwrites the scratch


def chunk_kda_bwd_blocks(v, do, ops, du, ends, *, initial_state, checkpoints,
                         checkpoint_offsets, state_vk, num_chunks, block_v, num_warps, sms,
                         blocks, chunk_table, dh0_dtype=torch.float32, s_dtype=torch.float32,
                         ds_dtype=torch.float32, stages=None, dkend_over_du=True,
                         precision="tf32", gluon=False):
    """Launch the dV kernel and the blocks kernel after the dS pass (``du``, ``ends``).
    ``checkpoints``: the forward's states after every 64 tokens (fp32, ``pool.py``'s),
    ``checkpoint_offsets`` each sequence's first; ``blocks``: the table of 64-token segments;
    ``chunk_table``: ``Sequences.chunk_table``; ``sms``: the device's SM count, which sizes the
    persistent grid (``resident_programs``); ``s_dtype``, ``ds_dtype``: the operand types of
    the products with S and dS (fp32: tf32); ``stages``: ``num_stages`` (None:
    ``blocks_kernel_stages``'s); ``dkend_over_du``: with one value block and K = V, dKEND is
    written over ``du`` (dU is then overwritten), T·H·V·4 bytes less at the peak (8 MiB at T
    1024 H 16); ``precision``: the fp32 products' ("tf32", or "tf32x3" for config.dot
    "fp32"); ``gluon``: on a Hopper GPU, the Gluon kernel (``chunk_blocks_bwd_ws``) where it
    applies (all value rows a program: NV 1 but for dainv). Returns a dict of dv (like v),
    the partial sums dqg, dw, dkend [NV, B, T, H, K], dgam [NV, chunks, H, K], dmqk, dainv
    [NV, chunks, H, 16, 16] (NV value blocks) and dh0 (or None)."""
    w, qg, kend, klo, ainv, mqk, gamma = ops
    B, T, H, V = v.shape
    K = w.shape[-1]
    nv = -(-V // block_v)  # the dV kernel's value blocks
    dev = v.device
    if gluon:
        from . import chunk_blocks_bwd_ws as ws

        gluon = ws.applies(v, do, du, ops, precision=precision, s_dtype=s_dtype,
                           ds_dtype=ds_dtype)
    nb = 1 if gluon else nv  # the blocks kernel's
    f32 = dict(device=dev, dtype=torch.float32)
    over = (dkend_over_du and nb == 1 and K == V and du.dtype == torch.float32
            and du.is_contiguous())
    out = dict(dv=torch.empty_like(v),  # rounded once, in the kernel
               dqg=torch.empty((nb, B, T, H, K), **f32),
               dw=torch.empty((nb, B, T, H, K), **f32),
               dkend=du.view(1, B, T, H, K) if over else torch.empty((nb, B, T, H, K), **f32),
               dgam=torch.empty((nb, num_chunks, H, K), **f32),
               dmqk=torch.empty((nb, num_chunks, H, CHUNK, CHUNK), **f32),
               dainv=torch.empty((nv, num_chunks, H, CHUNK, CHUNK), **f32),
               dh0=None if initial_state is None else torch.empty(
                   initial_state.shape, device=dev, dtype=dh0_dtype))
    items = blocks.shape[0] * H
    if items == 0:
        return out
    chunk_kda_bwd_dv_kernel[(num_chunks, H)](  # before the blocks kernel: it reads dU
        v, du, ainv, out["dv"], out["dainv"], _opt(chunk_table, gamma), T, H,
        num_chunks * H * CHUNK * CHUNK, V=V, BT=CHUNK, BV=block_v,
        IS_VARLEN=chunk_table is not None, PREC=precision, num_warps=4)
    if gluon:
        ws.blocks_ws(v, do, du, ops, ends, out, initial_state=initial_state,
                     checkpoints=checkpoints, checkpoint_offsets=checkpoint_offsets,
                     state_vk=state_vk, blocks=blocks, items=items, sms=sms, ckc=CKC)
        return out
    n_prog = persistent_programs(items, resident_programs(sms, num_warps, nv))
    scratch = torch.empty((n_prog * nv * CKC * block_v * (K + CHUNK),), **f32)
    chunk_kda_bwd_blocks_kernel[(n_prog, nv)](
        v, do, du, w, qg, kend, klo, ainv, gamma,
        _opt(initial_state, gamma), _opt(checkpoints, gamma), _opt(checkpoint_offsets, gamma),
        ends, out["dqg"], out["dw"], out["dkend"], out["dgam"], out["dmqk"],
        _opt(out["dh0"], gamma), scratch, blocks, items,
        B * T * H * K, num_chunks * H * K, num_chunks * H * CHUNK * CHUNK,
        H=H, K=K, V=V, BT=CHUNK, BV=block_v, CKC=CKC, HAS_H0=initial_state is not None,
        STORE_DH0=out["dh0"] is not None, STATE_VK=state_vk, DS=_TL[s_dtype],
        DD=_TL[ds_dtype], DKEND_OVER_DU=over, PREC=precision, num_warps=num_warps,
        num_stages=stages or blocks_kernel_stages(initial_state is not None))
    return out
