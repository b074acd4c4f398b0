"""Stage 2 as a warp-specialized Gluon kernel (issue 43), beside ``chunk_recurrent``; the launch
plan chooses between them (``launch_plan.GLUON_COST``, ``KernelConfig.stage2``).

The recurrence of ``chunk_recurrent.py`` (module docstring there), with the operands of every
chunk brought into shared memory by TMA from a loader warp that runs ``NUM_STAGES`` chunks ahead
(mbarrier ring: ``ready`` when a chunk's bytes landed, ``empty`` when the compute warpgroup is
done with them), and the outputs leaving through shared memory by TMA stores that are awaited
only when their buffer comes round again. The compute warpgroup keeps S^T [BV, K] in fp32
registers and runs the chunk's products on the tensor cores (``warpgroup_mma``) with S and U
as register operands in fp16, W, QG, KEND, KLO, AINV, MQK straight from shared memory:

    U^T = V^T AINV^T - S^T W^T,   O^T = S^T QG^T + U^T MQK^T,
    S^T = S^T diag(GAMMA) + U^T KEND + U^T KLO

the products, operand types and order of ``chunk_step`` (fp16 operands, fp32 accumulation).

Scope: ``chunk_recurrent``'s passes, serial and split (one program a sequence or segment, head
and value block: fixed length, any T, or varlen, longest first), fp16 products with the guard's
first launch (``FLAG`` 1 of ``chunk_recurrent``: a program whose end state is not finite writes
its flag and no final state; ``chunk_recurrent``'s second launch redoes it), the pool
(``state_indices``) and checkpoints every ``CKC`` chunks: a chunk's outputs and the checkpoint
of the state entering the next one are written to shared memory while the next chunk's first
products run, and leave by TMA stores awaited only before their tile is written again. A chunk
that ends a sequence early reads the next sequence's rows (a TMA box does not stop there): its
V^T and U^T columns and its KEND and KLO rows past the end are zeroed (in registers; in shared
memory), which is what the Triton kernel's masked loads give (the other operands' rows there
meet zeros of these, and come from this sequence's own chunk), and its outputs are stored
through pointers.

Gluon has no interpreter: CI compiles it for sm_90a (``tests/test_kernels_ws.py``); the GPU
tests hold it to the Triton kernel's outputs. Why Gluon and not NVIDIA's CuTe DSL
(nvidia-cutlass-dsl 4.8 is on the package index): Gluon ships in the triton wheel the kernels
already need, compiles on a machine without a GPU with triton's own ptxas (so CI checks it),
and shares the Triton kernel's MMA layouts, which is what lets the two agree bit for bit.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .indexing import program_rows

CHUNK = 16
# Gluon's TMA copies were renamed after triton 3.6 (the H200's): async_load / async_store
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = (tma.async_store if hasattr(tma, "async_store")
              else tma.async_copy_shared_to_global)


@gluon.jit
def _loader(descs, bufs, bars, bos, col_k, col_v, c0, n_chunks, i_h, H,
            WRITE_O: gl.constexpr):
    """One warp: chunk i's operands into stage i % NUM_STAGES once the compute warpgroup has
    released it (rows past the tensor's end come as zeros; without outputs no QG, MQK)."""
    w_d, qg_d, kend_d, klo_d, v_d, ainv_d, mqk_d = descs
    w_s, qg_s, kend_s, klo_s, v_s, ainv_s, mqk_s = bufs
    ready, empty = bars
    NS: gl.constexpr = w_s.type.shape[0]
    BT: gl.constexpr = w_s.type.shape[1]
    n_o: gl.constexpr = 2 if WRITE_O else 1  # tiles of QG-like and of MQK-like shapes
    nbytes: gl.constexpr = ((2 + n_o) * w_d.block_type.nbytes + v_d.block_type.nbytes
                            + n_o * ainv_d.block_type.nbytes)
    for i in range(n_chunks):
        s = i % NS
        mbarrier.wait(empty.index(s), ((i // NS) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, nbytes)
        row = (bos + i * BT).to(gl.int32)
        cc = ((c0 + i) * H + i_h).to(gl.int32)
        _tma_load(w_d, [row, col_k], bar, w_s.index(s))
        if WRITE_O:
            _tma_load(qg_d, [row, col_k], bar, qg_s.index(s))
        _tma_load(kend_d, [row, col_k], bar, kend_s.index(s))
        _tma_load(klo_d, [row, col_k], bar, klo_s.index(s))
        _tma_load(v_d, [row, col_v], bar, v_s.index(s))
        _tma_load(ainv_d, [cc * BT, 0], bar, ainv_s.index(s))
        if WRITE_O:
            _tma_load(mqk_d, [cc * BT, 0], bar, mqk_s.index(s))


@gluon.jit
def _state_offsets(row, i_h, i_v, H, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                   STATE_VK: gl.constexpr, layout: gl.constexpr):
    """Offsets of S^T's rows i_v * BV + [0, BV) of state ``row`` ([N, H, K, V], VK: [N, H, V,
    K]) in ``layout``: ``chunk_recurrent.user_state_ptrs``' arithmetic, whose ``tl.arange``
    without a layout Gluon refuses."""
    o_v = gl.arange(0, BV, layout=gl.SliceLayout(1, layout))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, layout))
    base = (row * H + i_h) * K * V
    if STATE_VK:
        return base + (i_v * BV + o_v)[:, None] * K + o_k[None, :]
    return base + o_k[None, :] * V + (i_v * BV + o_v)[:, None]


@gluon.jit
def _zero_rows(tile, n_ok, num_warps: gl.constexpr):
    """Rows ``n_ok`` and on of a [16, K] shared-memory tile set to zero."""
    lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    rows = gl.arange(0, tile.type.shape[0], layout=gl.SliceLayout(1, lay))
    tile.store(gl.where((rows < n_ok)[:, None], tile.load(lay), 0.0))


@gluon.jit
def _store_o(ot, j, o_d, o_s, o_ptr, bos, eos, i_h, i_v, H, V: gl.constexpr,
             BV: gl.constexpr, FULL: gl.constexpr, layout: gl.constexpr):
    """Chunk j's O^T: a whole chunk through shared memory by a TMA store (the buffer's store
    from two chunks before awaited first), a sequence's short last chunk through pointers."""
    BT: gl.constexpr = ot.type.shape[1]
    row = bos + j * BT
    if FULL or ((eos - row) >= BT):
        ob = o_s.index(j % 2)
        tma.store_wait(1)
        ob.permute((1, 0)).store(ot.to(o_d.dtype))
        fence_async_shared()
        _tma_store(o_d, [row.to(gl.int32), (i_h * V + i_v * BV).to(gl.int32)], ob)
    else:
        o_t = gl.arange(0, BT, layout=gl.SliceLayout(0, layout))
        o_v = gl.arange(0, BV, layout=gl.SliceLayout(1, layout))
        po = o_ptr + ((row + o_t[None, :]) * H + i_h) * V + (i_v * BV + o_v)[:, None]
        gl.store(po, ot.to(o_ptr.dtype.element_ty), mask=(o_t < eos - row)[None, :])


@gluon.jit
def _store_checkpoint(St, j, j0, ck_d, ck_s, ck_row, bos, eos, i_h, i_v, H, K: gl.constexpr,
                      V: gl.constexpr, BV: gl.constexpr, CKC: gl.constexpr,
                      STATE_VK: gl.constexpr):
    """The state after the program's j chunks (its sequence's j0 + j), when that ends a
    checkpoint interval with a whole chunk: to checkpoint row ``ck_row`` + (j0 + j) / CKC - 1
    by a TMA store from ``ck_s`` (its previous store, an earlier bulk group than the last O
    store, awaited first)."""
    if ((j0 + j) % CKC == 0) & (bos + j * 16 <= eos) & (j > 0):
        tma.store_wait(1)
        cr = ((ck_row + (j0 + j) // CKC - 1) * H + i_h).to(gl.int32)
        if STATE_VK:
            ck_s.store(St.to(ck_d.dtype))
            fence_async_shared()
            _tma_store(ck_d, [cr * V + i_v * BV, 0], ck_s)
        else:
            ck_s.permute((1, 0)).store(St.to(ck_d.dtype))
            fence_async_shared()
            _tma_store(ck_d, [cr * K, i_v * BV], ck_s)


@gluon.jit
def _compute(bufs, bars, o_d, o_s, ck_d, ck_s, ptrs, prog, K: gl.constexpr, V: gl.constexpr,
             BV: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr,
             STATE_VK: gl.constexpr, CKC: gl.constexpr, FULL: gl.constexpr,
             PASS: gl.constexpr, num_warps: gl.constexpr):
    """The compute warpgroup: the chunks in order, S^T in registers (``FULL``: every chunk
    whole, fixed length with T % 16 == 0: the short last chunk's code left out). The previous
    chunk's outputs and the checkpoint of the state entering this chunk are stored while this
    chunk's first products run on the tensor cores. ``PASS`` as ``chunk_recurrent``'s: 0 the
    serial pass, 1 a segment's summary (no outputs), 2 a segment from its combined start."""
    o_ptr, gamma_ptr, h0_ptr, ht_ptr, flag_ptr, ck_offsets_ptr, sum_ptr = ptrs
    bos, eos, c0, n_chunks, i_n, i_row, i_h, i_v, H, lin, j0, last, slot = prog
    WRITE_O: gl.constexpr = PASS != 1
    w_s, qg_s, kend_s, klo_s, v_s, ainv_s, mqk_s = bufs
    ready, empty = bars
    NS: gl.constexpr = w_s.type.shape[0]
    BT: gl.constexpr = w_s.type.shape[1]
    # S^T's layout (instruction N = K) and the [BV, 16] products' (N = 16)
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, K, 16])
    c_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BT, 16])
    a_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_l, k_width=2)
    a_c: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=c_l, k_width=2)
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, s_l))
    o_t = gl.arange(0, BT, layout=gl.SliceLayout(0, c_l))   # a chunk's tokens (columns)
    offs = _state_offsets(i_row, i_h, i_v, H, K, V, BV, STATE_VK, s_l)
    o_vg = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, s_l))
    slot_offs = slot + o_vg[:, None] * K + o_k[None, :]  # summaries [segments, H, V + K, K]
    St = gl.zeros([BV, K], gl.float32, layout=s_l)
    if PASS == 0:
        if HAS_H0:
            if i_row >= 0:  # a negative pool row: a zero start
                St = gl.load(h0_ptr + offs).to(gl.float32)
    elif PASS == 1:  # rows of R from zero, rows V.. of M^T from the identity (with v = 0)
        St = gl.where(o_vg[:, None] - V == o_k[None, :], 1.0, 0.0)
    else:
        St = gl.load(sum_ptr + slot_offs)
    zc = gl.zeros([BV, BT], gl.float32, layout=c_l)
    ck_row = 0
    if CKC > 0:
        ck_row = gl.load(ck_offsets_ptr + i_n)
    ot = zc  # the previous chunk's O^T
    for i in range(n_chunks):
        s = i % NS
        gam = gl.load(gamma_ptr + ((c0 + i) * H + i_h) * K + o_k)  # off the loader's ring
        n_ok = eos - (bos + i * BT)  # the chunk's tokens before the sequence's end
        t_ok = o_t < n_ok
        mbarrier.wait(ready.index(s), (i // NS) & 1)
        if not FULL:
            if n_ok < BT:  # KEND's and KLO's rows past the end: zeros, not another sequence's
                _zero_rows(kend_s.index(s), n_ok, num_warps)
                _zero_rows(klo_s.index(s), n_ok, num_warps)
                fence_async_shared()  # generic stores, then the tensor cores' reads
        Sa = gl.convert_layout(St.to(gl.float16), a_c)
        sw = warpgroup_mma(Sa, w_s.index(s).permute((1, 0)), zc, use_acc=False, is_async=True)
        sq = zc
        if WRITE_O:
            sq = warpgroup_mma(Sa, qg_s.index(s).permute((1, 0)), zc, use_acc=False,
                               is_async=True)
        if FULL:
            vt = v_s.index(s).permute((1, 0)).load(a_c).to(gl.float16)
        else:
            vt = gl.where(t_ok[None, :], v_s.index(s).permute((1, 0)).load(c_l), 0.0)
            vt = gl.convert_layout(vt.to(gl.float16), a_c)
        if PASS == 1:  # the rows of M^T: no values
            vt = gl.where(i_v * BV < V, vt, 0.0)
        va = warpgroup_mma(vt, ainv_s.index(s).permute((1, 0)), zc, use_acc=False,
                           is_async=True)
        # while they run: the previous chunk's outputs, the checkpoint of the state S^T (ptxas
        # waits for the products before the checkpoint's shared-memory writes, C7517: S^T came
        # from a GMMA; its TMA store still runs behind the next chunks)
        if WRITE_O:
            if i > 0:
                _store_o(ot, i - 1, o_d, o_s, o_ptr, bos, eos, i_h, i_v, H, V, BV, FULL, c_l)
            if CKC > 0:
                _store_checkpoint(St, i, j0, ck_d, ck_s, ck_row, bos, eos, i_h, i_v, H, K, V,
                                  BV, CKC, STATE_VK)
        sw, sq, va = warpgroup_mma_wait(num_outstanding=0, deps=(sw, sq, va))
        ud = (va - sw).to(gl.float16)
        if not FULL:
            ud = gl.where(t_ok[None, :], ud, 0.0)
        if WRITE_O:
            ot = warpgroup_mma(gl.convert_layout(ud, a_c), mqk_s.index(s).permute((1, 0)), sq,
                               is_async=True)
        ua = gl.convert_layout(ud, a_s)
        St = St * gam[None, :]
        St = warpgroup_mma(ua, kend_s.index(s), St, is_async=True)
        St = warpgroup_mma(ua, klo_s.index(s), St, is_async=True)
        ot, St = warpgroup_mma_wait(num_outstanding=0, deps=(ot, St))
        fence_async_shared()  # V^T was read through the generic proxy
        mbarrier.arrive(empty.index(s))
    if WRITE_O:
        if n_chunks > 0:
            _store_o(ot, n_chunks - 1, o_d, o_s, o_ptr, bos, eos, i_h, i_v, H, V, BV, FULL,
                     c_l)
            if CKC > 0:
                _store_checkpoint(St, n_chunks, j0, ck_d, ck_s, ck_row, bos, eos, i_h, i_v, H,
                                  K, V, BV, CKC, STATE_VK)
    tma.store_wait(0)
    bad = gl.max(gl.max(((St != St) | (gl.abs(St) == float("inf"))).to(gl.int32), 1), 0)
    gl.store(flag_ptr + lin, bad)
    if PASS == 1:
        if last == 0:  # (a sequence's last segment needs no summary: nothing ran)
            gl.store(sum_ptr + slot_offs, St)
    elif STORE_HT:  # passes 0 and 2 (pass 2: from a sequence's last segment)
        if (bad == 0) & (i_row >= 0) & (last != 0):
            gl.store(ht_ptr + offs, St.to(ht_ptr.dtype.element_ty))


@gluon.jit
def _ring(desc, NUM_STAGES: gl.constexpr):
    """NUM_STAGES tiles of ``desc``'s box in shared memory."""
    return gl.allocate_shared_memory(desc.dtype, [NUM_STAGES] + desc.block_type.shape,
                                     desc.layout)


@gluon.jit
def chunk_kda_recurrent_ws_kernel(w_d, qg_d, kend_d, klo_d, v_d, ainv_d, mqk_d, o_d, ck_d,
                                  o_ptr, gamma_ptr, h0_ptr, ht_ptr, flag_ptr, cu_seqlens_ptr,
                                  chunk_offsets_ptr, seq_order_ptr, idx_ptr, ck_offsets_ptr,
                                  sum_ptr, seg_ptr, T, H, K: gl.constexpr, V: gl.constexpr,
                                  BV: gl.constexpr,
                                  NUM_STAGES: gl.constexpr, HAS_H0: gl.constexpr,
                                  STORE_HT: gl.constexpr, STATE_VK: gl.constexpr,
                                  IS_VARLEN: gl.constexpr, HAS_IDX: gl.constexpr,
                                  CKC: gl.constexpr, FULL: gl.constexpr, PASS: gl.constexpr,
                                  NV: gl.constexpr, num_warps: gl.constexpr):
    # the value block on the grid's first axis, so that a pair's blocks start together (as
    # chunk_recurrent's one axis, whose index ``lin`` the flags use)
    i_v = gl.program_id(0)
    i_nh = gl.program_id(1)
    lin = i_nh * NV + i_v
    BT: gl.constexpr = 16
    # the program's sequence (varlen: longest first) or segment, and its first chunk's index
    # in its sequence (j0)
    i_n, i_h, i_s, bos, eos, c0, j0, _, last = program_rows(
        i_nh, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr, T, H, BT, IS_VARLEN,
        PASS != 0)
    slot = 0
    if PASS != 0:
        slot = (i_s * H + i_h) * (V + K) * K
    n_chunks = gl.cdiv(eos - bos, BT).to(gl.int32)
    if PASS == 1:  # nothing after a sequence's last segment needs its summary
        n_chunks = gl.where(last != 0, 0, n_chunks)
    i_row = i_n
    if HAS_IDX:
        i_row = gl.load(idx_ptr + i_n).to(gl.int64)
    bufs = (_ring(w_d, NUM_STAGES), _ring(qg_d, NUM_STAGES), _ring(kend_d, NUM_STAGES),
            _ring(klo_d, NUM_STAGES), _ring(v_d, NUM_STAGES), _ring(ainv_d, NUM_STAGES),
            _ring(mqk_d, NUM_STAGES))
    o_s = gl.allocate_shared_memory(o_d.dtype, [2] + o_d.block_type.shape, o_d.layout)
    ck_s = gl.allocate_shared_memory(ck_d.dtype, ck_d.block_type.shape, ck_d.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    bars = (ready, empty)
    descs = (w_d, qg_d, kend_d, klo_d, v_d, ainv_d, mqk_d)
    gl.warp_specialize([
        (_compute, (bufs, bars, o_d, o_s, ck_d, ck_s,
                    (o_ptr, gamma_ptr, h0_ptr, ht_ptr, flag_ptr, ck_offsets_ptr, sum_ptr),
                    (bos, eos, c0, n_chunks, i_n, i_row, i_h, i_v, H, lin, j0, last, slot),
                    K, V, BV, HAS_H0, STORE_HT, STATE_VK, CKC, FULL, PASS, num_warps)),
        (_loader, (descs, bufs, bars, bos, i_h * K, i_h * V + i_v * BV, c0, n_chunks, i_h,
                   H, PASS != 1)),
    ], [1], [40])


#: the grid's second axis's limit (CUDA); the items go there, the value blocks first (a 1-D
#: grid with the item and block computed from one index spilled 104-196 bytes on sm_90a)
_MAX_GRID_Y = 65535
_GL = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple, dtype: torch.dtype):
    """The shared-memory layout of a ``block`` box (a value: built once, half the wrapper's
    host time before it was cached)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), _GL[dtype])


def _desc(x, block):
    """A TMA descriptor of the 2D tensor ``x`` with ``block``-sized boxes."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor.from_tensor(x, block, _smem_layout(tuple(block), x.dtype))


def applies(v, ops, dot: str) -> bool:
    """Whether the Gluon kernel runs this call's passes (``ops``: stage 1's), where the plan
    chose it: fp16 products, K 64 or 128, V a multiple of 64, v contiguous, not empty, bf16 or
    fp16 on the GPU (Gluon has no interpreter). The device's kind (Hopper: wgmma) is the
    plan's to check (``api._gluon``), once a plan."""
    w = ops[0]
    return (w.dtype == torch.float16 and v.is_cuda
            and v.numel() > 0 and dot == "fp16" and w.shape[-1] in (64, 128)
            and v.shape[-1] % 64 == 0 and v.dtype in (torch.bfloat16, torch.float16)
            and v.is_contiguous())


def chunk_kda_recurrent_ws(v, w, qg, kend, klo, ainv, mqk, gamma, *, initial_state, final_state,
                           state_vk, cu_seqlens, chunk_offsets, num_seqs, block_v, num_warps, dot,
                           guard, seq_order=None, segments=None, summary=None, passes=(0,),
                           o=None, state_indices=None, checkpoints=None, checkpoint_offsets=None,
                           checkpoint_chunks=0, num_stages=3, maxnreg=128):
    """``chunk_kda_recurrent`` (its arguments, its passes) by ``chunk_kda_recurrent_ws_kernel``
    with fp16 products, then the guard's redo of the programs it flagged by
    ``chunk_recurrent``'s second launch (tf32 from the first chunk whose fp16 step is not
    finite; a summary wholly). The tile is the kernel's own, 64 value rows on one
    warpgroup and a loader warp (``block_v``, ``num_warps`` are the Triton plan's: ignored);
    ``guard`` is always the second launch. Returns o."""
    from .chunk_recurrent import chunk_kda_recurrent

    B, T, H, V = v.shape
    K = w.shape[-1]
    BV = 64
    if dot != "fp16":
        raise ValueError(f"chunk_kda_recurrent_ws: fp16 products only, got dot={dot!r}")
    if V % BV or K not in (64, 128):
        raise ValueError(f"chunk_kda_recurrent_ws: needs V a multiple of {BV} and K 64 or 128, "
                         f"got V {V}, K {K}")
    if v.dtype not in (torch.bfloat16, torch.float16) or not v.is_contiguous():
        raise ValueError(f"chunk_kda_recurrent_ws: v must be contiguous bf16 or fp16, got "
                         f"{v.dtype}")
    if o is None:
        o = torch.empty_like(v)
    rows = B * T
    if checkpoints is not None and checkpoints.shape[0] == 0:
        checkpoints = None  # no sequence is as long as one checkpoint interval
    descs = [_desc(x.view(rows, H * K), [CHUNK, K]) for x in (w, qg, kend, klo)]
    descs.append(_desc(v.view(rows, H * V), [CHUNK, BV]))
    descs += [_desc(x.view(-1, CHUNK), [CHUNK, CHUNK]) for x in (ainv, mqk)]
    descs.append(_desc(o.view(rows, H * V), [CHUNK, BV]))
    if checkpoints is not None:  # [rows * H * V, K] (VK) or [rows * H * K, V] (KV)
        descs.append(_desc(checkpoints.view(-1, checkpoints.shape[-1]),
                           [BV, K] if state_vk else [K, BV]))
    else:  # a placeholder the kernel does not use (CKC 0)
        descs.append(_desc(gamma.view(-1, gamma.shape[-1])[:1], [1, K]))
    opt = lambda x: x if x is not None else gamma  # noqa: E731 - absent optional pointers
    ckc = checkpoint_chunks if checkpoints is not None else 0
    common = dict(K=K, V=V, BV=BV, NUM_STAGES=num_stages, HAS_H0=initial_state is not None,
                  STORE_HT=final_state is not None, STATE_VK=state_vk,
                  IS_VARLEN=cu_seqlens is not None, HAS_IDX=state_indices is not None, CKC=ckc,
                  FULL=cu_seqlens is None and T % CHUNK == 0, num_warps=4, maxnreg=maxnreg)
    for pass_ in passes:
        items = num_seqs * H if pass_ == 0 else segments.shape[0] * H
        nv = (V + K if pass_ == 1 else V) // BV
        flags = None  # past the grid's second axis (65535 items): Triton's two launches
        if items <= _MAX_GRID_Y:
            flags = torch.empty(items * nv, device=v.device, dtype=torch.int32)
            chunk_kda_recurrent_ws_kernel[(nv, items)](
                *descs, o, gamma, opt(initial_state), opt(final_state), flags,
                opt(cu_seqlens), opt(chunk_offsets), opt(seq_order), opt(state_indices),
                opt(checkpoint_offsets), opt(summary), opt(segments), T, H, PASS=pass_, NV=nv,
                **common)
        # the redo, always launched: its programs read their flag and only the flagged run
        # (no host sync, so a CUDA graph captures the call; a launch of exits otherwise)
        chunk_kda_recurrent(v, w, qg, kend, klo, ainv, mqk, gamma,
                            initial_state=initial_state, final_state=final_state,
                            state_vk=state_vk, cu_seqlens=cu_seqlens,
                            chunk_offsets=chunk_offsets, num_seqs=num_seqs, block_v=BV,
                            num_warps=4, dot="fp16", guard="launch", seq_order=seq_order,
                            segments=segments, summary=summary, passes=(pass_,), o=o,
                            state_indices=state_indices, checkpoints=checkpoints,
                            checkpoint_offsets=checkpoint_offsets,
                            checkpoint_chunks=checkpoint_chunks, first_flags=flags)
    return o
