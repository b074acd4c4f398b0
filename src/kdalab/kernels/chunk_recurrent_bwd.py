"""Backward of stage 2: the reverse pass over chunks, on dS^T [BV, K] (value rows first).

The forward's chunk (``chunk_recurrent.py``), in the same transposed form,

    U^T  = V^T AINV^T - S^T W^T,   O^T = S^T QG^T + U^T MQK^T,   S'^T = S^T diag(γ) + U^T KEND

has, for dO^T and the gradient dS'^T of the state after the chunk,

    dU^T  = dS'^T KEND^T + dO^T MQK                 [BV, 16]
    dV^T  = dU^T AINV                               [BV, 16]
    dS^T  = dS'^T diag(γ) + dO^T QG - dU^T W        [BV, K]   (the state before the chunk)

and the gradients of stage 1's operands, sums over the value columns:

    dQG = dO S^T,  dW = -dU S^T,  dKEND = U dS'^T   [16, K]   (stored token-major)
    dγ = Σ_v S ⊙ dS'                                [K]
    dMQK = tril(dO U^T),  dAINV = tril(dU V^T)      [16, 16]

Two kernels, so that one state is live at a time (docs/training.md):

1. ``chunk_kda_bwd_recurrent_kernel``: the dS recurrence alone (four products a chunk; it
   needs no forward state), storing each chunk's dU^T and the gradient after every 64-token
   block (``ends``). It is affine, dS_before^T = dS_after^T B + R with
   B = diag(γ) - KEND^T W, so it splits into segments as the forward does (``launch_plan``):
   pass 1 computes each segment's (R^T, B) from a zero and an identity start (rows
   V..V+K-1, dO = 0), the combine (``chunk_combine.py``, in reverse) each segment's dS at its
   end, and pass 3 runs every segment from there (serial plans: pass 3 alone).
2. ``chunk_kda_bwd_blocks_kernel`` (``chunk_blocks_bwd.py``): every 64-token block in
   parallel from its checkpoint (the forward keeps the state every ``CKC`` chunks, fp32)
   and its ``ends`` gradient: forward through the block (S live; each chunk's S and U to
   the program's scratch, dQG, dW, dMQK), then backward (dS live; dKEND, dγ); dV and dAINV,
   which need no state, by ``chunk_kda_bwd_dv_kernel`` there, chunk-parallel.

A program owns BV value columns and all K; the sums over value columns are partial, one per
value block, added on the host (a deterministic sum, no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_combine import chunk_kda_combine
from .indexing import program_rows
from .launch_plan import ds_value_block

CHUNK = 16
#: chunks between the forward's stored states (the block the backward recomputes)
CKC = 4
_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _tile_t(ptr, rows, r_ok, i_h, H, o_k, K: tl.constexpr):
    """A [K, 16] tile (transposed) of a token-major [T, H, K] tensor, fp32: loaded as its
    [16, K] rows (contiguous along K: vector loads), transposed in registers."""
    return tl.trans(tl.load(ptr + (rows[:, None] * H + i_h) * K + o_k[None, :],
                            mask=r_ok[:, None], other=0.0).to(tl.float32))


@triton.jit
def _chunk(bos, eos, c, c0, i_h, o_r, o_v, H, V: tl.constexpr, BT: tl.constexpr):
    """Chunk ``c`` of the rows from ``bos``: (its rows, which are before ``eos``, the same as
    a tensor for [16, 16] masks, its chunk-and-head index, the [BV, 16] offsets of v and o)."""
    rows = bos + c * BT + o_r
    c_ok = (bos + c * BT + o_r * 0) < eos
    return (rows, rows < eos, c_ok, (c0 + c) * H + i_h,
            (rows[None, :] * H + i_h) * V + o_v[:, None])


@triton.jit
def _cc(ptr, cc, o_r, c_ok, BT: tl.constexpr):
    """The [16, 16] tile of chunk-and-head ``cc``, fp32."""
    m = c_ok[:, None] & c_ok[None, :]
    return tl.load(ptr + cc * BT * BT + o_r[:, None] * BT + o_r[None, :], mask=m,
                   other=0.0).to(tl.float32)


@triton.jit
def _state_ptrs(ptr, row, i_h, o_v, H, K: tl.constexpr, V: tl.constexpr,
                STATE_VK: tl.constexpr):
    """Pointers to S^T's rows ``o_v`` of state ``row`` of a [N, H, K, V] (VK: [N, H, V, K])
    tensor."""
    o_k = tl.arange(0, K)
    base = ptr + (row * H + i_h) * K * V
    if STATE_VK:
        return base + o_v[:, None] * K + o_k[None, :]
    return base + o_k[None, :] * V + o_v[:, None]


@triton.jit
def _mm(a, b, DT: tl.constexpr, PREC: tl.constexpr):
    """a @ b with ``DT`` operands (fp32: tf32 products, which the H200 truncates to 10 bits:
    docs/training.md "Precision"; 3xTF32 with ``PREC`` "tf32x3"), fp32 accumulation."""
    return tl.dot(a.to(DT), b.to(DT), input_precision=PREC)


@triton.jit
def _mm_pair(a, b1, b2, DT: tl.constexpr, PREC: tl.constexpr):
    """(a @ b1, a @ b2) as one product with b1 and b2 side by side, ``a`` staged once (the dS
    pass's dU 3-9 % faster; the blocks kernel's dQG and dW slower so: docs/training.md)."""
    N: tl.constexpr = b1.shape[1]
    b = tl.reshape(tl.permute(tl.join(b1, b2), (0, 2, 1)), [b1.shape[0], 2 * N])
    r = tl.permute(tl.reshape(_mm(a, b, DT, PREC), [a.shape[0], 2, N]), (0, 2, 1))
    return tl.split(r)


@triton.jit
def chunk_kda_bwd_recurrent_kernel(
    do_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, mqk_ptr, gamma_ptr, dht_ptr,
    sum_ptr, ends_ptr, du_ptr, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr,
    seg_off_ptr, T, H, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    CKC: tl.constexpr, HAS_DHT: tl.constexpr, STATE_VK: tl.constexpr,
    IS_VARLEN: tl.constexpr, PASS: tl.constexpr, SEG: tl.constexpr,
    DD: tl.constexpr = tl.float32, PREC: tl.constexpr = "tf32",
):
    """The dS recurrence over one (sequence or segment, head, value block). ``PASS`` 1: a
    segment's summary (R^T, B) into ``sum_ptr`` ([segments, H, V + K, K]; nothing for a
    sequence's first segment); 3: the gradient itself, from the final state's (``dht_ptr``)
    or, with ``SEG``, from the combined summary, storing each chunk's dU^T (``du_ptr``, like
    v, fp32) and the gradient after every 64-token block (``ends_ptr``, [blocks, H, V, K];
    ``seg_off_ptr``: each sequence's first block). ``DD``: the operand type of the products
    with dS (fp32: tf32 products); ``PREC``: every fp32 product's precision ("tf32", or
    "tf32x3" for config.dot "fp32")."""
    item = tl.program_id(0)
    i_v = tl.program_id(1)
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    if PASS == 1:
        v_ok = o_v < V + K
        is_v = o_v < V          # rows of R (the dO-driven part); the rest: the transition's
    else:
        v_ok = o_v < V
        is_v = v_ok
    # the program's sequence (varlen: the longest first, as the forward's serial pass) or
    # segment, and its first chunk's index in its sequence (j0)
    i_n, i_h, i_s, bos, eos, c0, j0, p, _ = program_rows(
        item, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr, T, H, BT, IS_VARLEN,
        SEG)
    first = (p == 0).to(tl.int32) if SEG else 1
    n_ch = tl.cdiv(eos - bos, BT)
    # the gradient of the state after the program's last chunk
    if PASS == 1:
        dSt = tl.where(o_v[:, None] - V == o_k[None, :], 1.0, 0.0)
    elif SEG:
        slot_s = sum_ptr + (i_s * H + i_h) * (V + K) * K
        dSt = tl.load(slot_s + o_v[:, None] * K + o_k[None, :], mask=v_ok[:, None], other=0.0)
    else:
        dSt = tl.zeros([BV, K], dtype=tl.float32)
        if HAS_DHT:
            dSt = tl.load(_state_ptrs(dht_ptr, i_n, i_h, o_v, H, K, V, STATE_VK),
                          mask=v_ok[:, None], other=0.0).to(tl.float32)
    # nothing before a sequence's first segment needs its summary
    run = 1
    if PASS == 1:
        run = 1 - first
    if run != 0:
        j_blk0 = j0 // CKC   # the program's first block in its sequence
        if PASS == 3:
            seg0 = tl.load(seg_off_ptr + i_n).to(tl.int64)  # the sequence's first block
            slot_0 = ends_ptr + ((seg0 + j_blk0) * H + i_h) * V * K
            if n_ch == 0:  # an empty sequence has one (empty) block: its dS, dht, is stored
                tl.store(slot_0 + o_v[:, None] * K + o_k[None, :], dSt, mask=v_ok[:, None])
        # one loop over the chunks, last first, the block-end stores inside it (a loop over
        # blocks around one over their chunks spilled 148 bytes a thread on sm_90a, this 84)
        for ic in range(0, n_ch):
            c = n_ch - 1 - ic
            if PASS == 3:  # the gradient after a block: at its last chunk
                if (c == n_ch - 1) | ((c + 1) % CKC == 0):
                    slot_b = slot_0 + (c // CKC) * H * V * K
                    tl.store(slot_b + o_v[:, None] * K + o_k[None, :], dSt,
                             mask=v_ok[:, None])
            rows, r_ok, c_ok, cc, tok = _chunk(bos, eos, c, c0, i_h, o_r, o_v, H, V, BT)
            dot_ = tl.load(do_ptr + tok, mask=(is_v & v_ok)[:, None] & r_ok[None, :],
                           other=0.0).to(tl.float32)
            wt = _tile_t(w_ptr, rows, r_ok, i_h, H, o_k, K)
            qgt = _tile_t(qg_ptr, rows, r_ok, i_h, H, o_k, K)
            kend_hi = _tile_t(kend_ptr, rows, r_ok, i_h, H, o_k, K)
            klo = _tile_t(klo_ptr, rows, r_ok, i_h, H, o_k, K)
            mqk = _cc(mqk_ptr, cc, o_r, c_ok, BT)
            gam = tl.load(gamma_ptr + cc * K + o_k)
            # KEND as its two parts, as the forward multiplies it: KEND whole in one
            # tf32 product would drop KLO, which the collinear cases' dβ needs
            du_hi, du_lo = _mm_pair(dSt, kend_hi, klo, DD, PREC)
            dut = du_hi + du_lo + tl.dot(dot_, mqk, input_precision=PREC)
            if PASS == 3:
                tl.store(du_ptr + tok, dut, mask=v_ok[:, None] & r_ok[None, :])
            dSt = (dSt * gam[None, :] + tl.dot(dot_, tl.trans(qgt), input_precision=PREC)
                   - tl.dot(dut, tl.trans(wt), input_precision=PREC))
        if PASS == 1:  # the summary: the gradient at the segment's start
            slot_s = sum_ptr + (i_s * H + i_h) * (V + K) * K
            tl.store(slot_s + o_v[:, None] * K + o_k[None, :], dSt, mask=v_ok[:, None])


def _opt(x, dummy):
    """``x``, or ``dummy`` for an absent optional pointer (the kernel does not read it)."""
    return x if x is not None else dummy


def _ds_pass(do, ops, pass_, *, items, grid_v, dht, state_vk, cu_seqlens, chunk_offsets,
             seq_order, segments, seg_offsets, summary, ends, du, H, K, V, T, block_v,
             num_warps, ds_dtype, precision):
    w, qg, kend, klo, ainv, mqk, gamma = ops
    chunk_kda_bwd_recurrent_kernel[(items, grid_v)](
        do, w, qg, kend, klo, mqk, gamma, _opt(dht, gamma), _opt(summary, gamma), ends, du,
        _opt(cu_seqlens, gamma), _opt(chunk_offsets, gamma), _opt(seq_order, gamma),
        _opt(segments, gamma), _opt(seg_offsets, gamma),
        T, H, K=K, V=V, BT=CHUNK, BV=block_v, CKC=CKC, HAS_DHT=dht is not None,
        STATE_VK=state_vk, IS_VARLEN=cu_seqlens is not None, PASS=pass_,
        SEG=segments is not None, DD=_TL[ds_dtype], PREC=precision, num_warps=num_warps,
        num_stages=1)


def chunk_kda_bwd_recurrent(do, ops, *, dht, state_vk, cu_seqlens, chunk_offsets, num_seqs,
                            block_v, num_warps, sms, seq_order, n_blocks, block_offsets,
                            segments=None, ds_dtype=torch.float32, ds_block_v=None,
                            precision="tf32", gluon=0):
    """Launch the dS recurrence (module docstring, kernel 1). ``ops``: stage 1's; ``dht``:
    the final state's gradient or None; ``n_blocks``, ``block_offsets``: the 64-token blocks
    (``Sequences.segments(CKC)``) and each sequence's first; ``segments``:
    ``Sequences.segments(L)``'s triple for a sequence-parallel plan, else None (serial).
    ``ds_dtype``: the operand type of the products with dS (fp32: tf32). ``ds_block_v``: the
    serial pass's value columns a program (a segmented plan takes ``block_v``; None:
    ``ds_value_block``'s choice, for ``sms`` SMs; its warps scaled with it); ``precision``:
    the fp32 products' ("tf32", or "tf32x3" for config.dot "fp32"). ``gluon``: on a Hopper
    GPU, the Gluon kernel (``chunk_recurrent_bwd_ws``) runs the passes it ``applies`` to, with
    1 or 2 value blocks a program, or 3: its own choice for ``sms`` SMs; 0: the Triton
    kernel.
    Returns (dU like do, fp32; the gradient after every block, [n_blocks, H, V, K] fp32)."""
    w, qg, kend, klo, ainv, mqk, gamma = ops
    B, T, H, V = do.shape
    K = w.shape[-1]
    f32 = dict(device=do.device, dtype=torch.float32)
    ends = torch.empty((n_blocks, H, V, K), **f32)
    du = torch.empty(do.shape, **f32)
    dbv = block_v if segments is not None else ds_value_block(
        num_seqs * H, V, block_v, num_warps, sms, ds_block_v)
    ds = dict(dht=dht, state_vk=state_vk, cu_seqlens=cu_seqlens, chunk_offsets=chunk_offsets,
              seq_order=seq_order, ends=ends, du=du, H=H, K=K, V=V, T=T, block_v=dbv,
              num_warps=max(1, num_warps * dbv // block_v), ds_dtype=ds_dtype,
              precision=precision)
    nv_ds = -(-V // dbv)
    ws_kw = None  # the Gluon kernel's arguments where it runs the passes
    if gluon:
        from . import chunk_recurrent_bwd_ws as ws

        if ws.applies(do, ops, precision=precision, ds_dtype=ds_dtype):
            ws_kw = {n: ds[n] for n in ("dht", "state_vk", "cu_seqlens", "chunk_offsets",
                                        "seq_order", "ends", "du", "H", "K", "V", "T")}
            ws_kw.update(warpgroups=int(gluon) % 3, sms=sms, ckc=CKC)
            descs = ws.descriptors(do, ops, H, K, V)

    def run(pass_, items, grid_v, **kw):  # the Triton kernel past the Gluon grid's limit
        if ws_kw is None or not ws.ds_pass_ws(descs, gamma, pass_, items=items, **kw, **ws_kw):
            _ds_pass(do, ops, pass_, items=items, grid_v=grid_v, **kw, **ds)

    if segments is None:
        if num_seqs * H:
            run(3, num_seqs * H, nv_ds, segments=None, seg_offsets=block_offsets,
                summary=None)
    else:
        table, seg_off, n_segs = segments
        summary = torch.empty((n_segs, H, V + K, K), **f32)
        if n_segs * H:
            run(1, n_segs * H, -(-(V + K) // dbv), segments=table, seg_offsets=None,
                summary=summary)
        chunk_kda_combine(summary, seg_off, dht, num_seqs=num_seqs, state_vk=state_vk,
                          H=H, K=K, V=V, reverse=True)
        if n_segs * H:
            run(3, n_segs * H, nv_ds, segments=table, seg_offsets=block_offsets,
                summary=summary)
        del summary
    return du, ends
