"""The backward's dS pass as a warp-specialized Gluon kernel (issue 40), beside
``chunk_recurrent_bwd``'s Triton kernel; ``chunk_kda_bwd_recurrent`` takes it on a Hopper GPU
where it ``applies`` (``autograd.BWD_MODE["ds_gluon"]``; docs/training.md "The dS pass in
Gluon").

The recurrence of ``chunk_recurrent_bwd.py`` (its kernel 1, module docstring there): per
chunk, last first, with dS^T [BV, K] fp32 in a compute warpgroup's registers,

    dU^T = dS'^T KEND_hi^T + dS'^T KLO^T + dO^T MQK          [BV, 16]
    dS^T = dS'^T diag(γ) + dO^T QG - dU^T W                  [BV, K]

every product on the tensor cores in tf32 (``warpgroup_mma``, fp32 accumulation), dS^T, dO^T
and dU^T as register operands. A tf32 ``wgmma`` reads its shared-memory operand K-major only
(the transposed form is for 16-bit types: PTX ISA, ``wgmma.mma_async``, imm-trans-b), and
stage 1 stores its operands 16-bit (or fp32) and token-major, so three kinds of partition
share two rings:

- the loader (one warp) brings a chunk's W, QG, KEND, KLO [16, K], MQK [16, 16] and dO
  [16, BV] into shared memory by TMA, ``NUM_STAGES`` chunks ahead;
- the converter (a warpgroup) makes them fp32 operands in the layouts a tf32 ``wgmma``
  reads: QG^T, W^T [K, 16] (tokens contiguous), KEND_hi and KLO as the rows of one [32, K]
  tile, interleaved, MQK^T's rows interleaved with zeros in a [32, 16] tile, dO^T; the rows
  past a sequence's end are zeroed there (a TMA box reads on into the next sequence), which
  is what the Triton kernel's masked loads give;
- one or two compute warpgroups (``NWG``: value blocks of 64 rows on the same operands) run
  the chain and store each chunk's dU^T and the gradient after every 64-token block, as the
  Triton kernel does (``PASS`` 1 and 3, segments, varlen).

dU^T's three terms are one [BV, 32] accumulator whose adjacent columns (a thread's pair) add
up to it: K / 8 + 2 ``wgmma`` a chunk instead of 2 K / 8 + 2. dS^T's accumulator becomes the
next product's operand without shuffles: its columns are taken in the order a thread holds
them (``_kperm``), KEND's and KLO's in the same order.

The products are those of the Triton kernel, operand for operand (tf32 truncation of the
same fp32 values), summed in another order: the two kernels agree to fp32's rounding, not bit
for bit (the GPU tests hold them to it). Gluon has no interpreter: CI compiles it for sm_90a
(``tests/test_kernels_bwd_ws.py``); the Triton kernel is the arithmetic CI runs.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .chunk_recurrent_ws import _MAX_GRID_Y, _desc, _tma_load
from .indexing import program_rows

CHUNK = 16
BV = 64  # value rows a warpgroup: its wgmma M


@gluon.jit
def _loader(descs, bufs, bars, bos, c0, n_chunks, i_h, H, col_k, col_v, HAS_DO,
            NWG: gl.constexpr):
    """One warp: chunk ``n_chunks - 1 - i``'s operands into stage i % NS once the converter
    has released it, dO for each of the ``NWG`` value blocks (value blocks of the
    transition's rows, ``HAS_DO`` 0, take none)."""
    w_d, qg_d, kend_d, klo_d, mqk_d, do_d = descs
    w_s, qg_s, kend_s, klo_s, mqk_s, do_s = bufs
    ready, empty = bars
    NS: gl.constexpr = w_s.type.shape[0]
    BT: gl.constexpr = w_s.type.shape[1]
    n_ops: gl.constexpr = 4 * w_d.block_type.nbytes + mqk_d.block_type.nbytes
    n_do: gl.constexpr = NWG * do_d.block_type.nbytes
    BV: gl.constexpr = do_d.block_type.shape[1]
    for i in range(n_chunks):
        s = i % NS
        c = n_chunks - 1 - i
        mbarrier.wait(empty.index(s), ((i // NS) & 1) ^ 1)
        bar = ready.index(s)
        row = (bos + c * BT).to(gl.int32)
        cc = ((c0 + c) * H + i_h).to(gl.int32)
        if HAS_DO:
            mbarrier.expect(bar, n_ops + n_do)
            for wg in gl.static_range(NWG):
                _tma_load(do_d, [row, col_v + wg * BV], bar, do_s.index(s * NWG + wg))
        else:
            mbarrier.expect(bar, n_ops)
        _tma_load(w_d, [row, col_k], bar, w_s.index(s))
        _tma_load(qg_d, [row, col_k], bar, qg_s.index(s))
        _tma_load(kend_d, [row, col_k], bar, kend_s.index(s))
        _tma_load(klo_d, [row, col_k], bar, klo_s.index(s))
        _tma_load(mqk_d, [cc * BT, 0], bar, mqk_s.index(s))


@gluon.jit
def _pairs(a, b):
    """[N, C] and [N, C] as one [2N, C]: rows a_0, b_0, a_1, b_1, ..."""
    N: gl.constexpr = a.shape[0]
    C: gl.constexpr = a.shape[1]
    return gl.reshape(gl.permute(gl.join(a, b), (0, 2, 1)), [2 * N, C])


@gluon.jit
def _kperm(x):
    """x's columns in each group of 8 reordered, k' = 4 p + t <- k = 2 t + p: the order in
    which a thread holds an fp32 wgmma accumulator's columns (2t, 2t + 1) is the order of a
    tf32 A operand's (t, t + 4), so that dS^T's accumulator is its next product's operand
    without a shuffle, with the other operand's rows in the same order."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    return gl.reshape(gl.permute(gl.reshape(x, [M, N // 8, 4, 2]), (0, 1, 3, 2)), [M, N])


@gluon.jit
def _converter(bufs, cbufs, bars, cbars, bos, eos, n_chunks, HAS_DO, NWG: gl.constexpr,
               num_warps: gl.constexpr):
    """A warpgroup: the landed 16-bit (or fp32) tiles as fp32 tf32 operands, the rows past
    ``eos`` zeroed (MQK's columns too), then both rings' stages handed on. dU's operand is
    KEND_hi and KLO as the rows of one [32, K] tile, interleaved (rows 2j, 2j + 1: token j's),
    with MQK^T's rows interleaved with zeros beside it, so that dU^T is one [BV, 32] product
    whose adjacent columns (a thread's pair in the accumulator) add up to it; QG and W
    transposed (the products that reduce over the chunk's tokens)."""
    w_s, qg_s, kend_s, klo_s, mqk_s, do_s = bufs
    wt_c, qgt_c, kb_c, mb_c, do_c = cbufs
    ready, empty = bars
    cready, cempty = cbars
    NS: gl.constexpr = w_s.type.shape[0]
    NC: gl.constexpr = wt_c.type.shape[0]
    BT: gl.constexpr = w_s.type.shape[1]
    BV: gl.constexpr = do_c.type.shape[2]
    lay: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    sq: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])
    o_t = gl.arange(0, BT, layout=gl.SliceLayout(1, lay))
    o_i = gl.arange(0, BT, layout=gl.SliceLayout(1, sq))
    o_j = gl.arange(0, BT, layout=gl.SliceLayout(0, sq))
    for i in range(n_chunks):
        s = i % NS
        sc = i % NC
        c = n_chunks - 1 - i
        n_ok = eos - (bos + c * BT)  # the chunk's tokens before the sequence's end
        keep = (o_t < n_ok)[:, None]
        mbarrier.wait(ready.index(s), (i // NS) & 1)
        mbarrier.wait(cempty.index(sc), ((i // NC) & 1) ^ 1)
        x = gl.where(keep, w_s.index(s).load(lay).to(gl.float32), 0.0)
        wt_c.index(sc).permute((1, 0)).store(x)
        x = gl.where(keep, qg_s.index(s).load(lay).to(gl.float32), 0.0)
        qgt_c.index(sc).permute((1, 0)).store(x)
        hi = gl.where(keep, kend_s.index(s).load(lay).to(gl.float32), 0.0)
        lo = gl.where(keep, klo_s.index(s).load(lay).to(gl.float32), 0.0)
        kb_c.index(sc).store(_pairs(_kperm(hi), _kperm(lo)))
        m = gl.where((o_i < n_ok)[:, None] & (o_j < n_ok)[None, :],
                     mqk_s.index(s).load(sq).to(gl.float32), 0.0)
        mt = gl.permute(m, (1, 0))
        mb_c.index(sc).store(_pairs(mt, gl.zeros_like(mt)))
        for wg in gl.static_range(NWG):
            if HAS_DO:
                d = gl.where(keep, do_s.index(s * NWG + wg).load(lay).to(gl.float32), 0.0)
            else:
                d = gl.zeros([BT, BV], gl.float32, layout=lay)
            do_c.index(sc * NWG + wg).store(d)
        fence_async_shared()  # generic stores, then the tensor cores' reads
        mbarrier.arrive(empty.index(s))
        mbarrier.arrive(cready.index(sc))


@gluon.jit
def _compute(cbufs, cbars, ptrs, prog, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
             CKC: gl.constexpr, HAS_DHT: gl.constexpr, STATE_VK: gl.constexpr,
             PASS: gl.constexpr, SEG: gl.constexpr, WG: gl.constexpr, NWG: gl.constexpr,
             num_warps: gl.constexpr):
    """A compute warpgroup (``WG`` of ``NWG``, each its own value block ``i_v`` + ``WG`` of
    the same chunks' operands): the chain, last chunk first, dS^T in fp32 registers."""
    gamma_ptr, dht_ptr, sum_ptr, ends_ptr, du_ptr, seg_off_ptr = ptrs
    bos, eos, c0, n_chunks, i_n, i_s, i_h, i_v0, H, j0 = prog
    i_v = i_v0 + WG
    wt_c, qgt_c, kb_c, mb_c, do_c = cbufs
    cready, cempty = cbars
    NC: gl.constexpr = wt_c.type.shape[0]
    BT: gl.constexpr = 16
    # dS^T's layout (instruction N = K), the paired dU^T's (N = 32) and dU^T's (N = 16)
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, K, 8])
    p_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, 2 * BT, 8])
    c_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BT, 8])
    a_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_l, k_width=1)
    a_p: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=p_l, k_width=1)
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, s_l))
    o_v = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, s_l))
    o_t = gl.arange(0, BT, layout=gl.SliceLayout(0, c_l))
    o_vc = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, c_l))
    sq_offs = o_v[:, None] * K + o_k[None, :]  # a [V (+ K), K] slot's rows of this block
    if PASS == 1:  # rows V.. of the transition from the identity
        dSt = gl.where(o_v[:, None] - V == o_k[None, :], 1.0, 0.0)
    elif SEG:
        dSt = gl.load(sum_ptr + (i_s * H + i_h) * (V + K) * K + sq_offs)
    else:
        dSt = gl.zeros([BV, K], gl.float32, layout=s_l)
        if HAS_DHT:
            base = (i_n * H + i_h) * K * V
            if STATE_VK:
                dSt = gl.load(dht_ptr + base + sq_offs).to(gl.float32)
            else:
                dSt = gl.load(dht_ptr + base + o_k[None, :] * V + o_v[:, None]).to(gl.float32)
    slot_0 = ends_ptr
    if PASS == 3:
        seg0 = gl.load(seg_off_ptr + i_n).to(gl.int64)  # the sequence's first block
        slot_0 = ends_ptr + ((seg0 + j0 // CKC) * H + i_h) * V * K
        if n_chunks == 0:  # an empty sequence has one (empty) block: its dS, dht, is stored
            gl.store(slot_0 + sq_offs, dSt)
    zp = gl.zeros([BV, 2 * BT], gl.float32, layout=p_l)
    for i in range(n_chunks):
        sc = i % NC
        c = n_chunks - 1 - i
        if PASS == 3:  # the gradient after a block: at its last chunk
            if (c == n_chunks - 1) | ((c + 1) % CKC == 0):
                gl.store(slot_0 + (c // CKC) * H * V * K + sq_offs, dSt)
        cc = (c0 + c) * H + i_h
        gam = gl.load(gamma_ptr + cc * K + o_k)
        mbarrier.wait(cready.index(sc), (i // NC) & 1)
        dsa = gl.convert_layout(_kperm(dSt), a_p)
        du2 = warpgroup_mma(dsa, kb_c.index(sc).permute((1, 0)), zp, use_acc=False,
                            is_async=True)
        doc = do_c.index(sc * NWG + WG).permute((1, 0)).load(a_p)
        du2 = warpgroup_mma(doc, mb_c.index(sc).permute((1, 0)), du2, is_async=True)
        dos = do_c.index(sc * NWG + WG).permute((1, 0)).load(a_s)
        du2 = warpgroup_mma_wait(num_outstanding=0, deps=(du2,))
        hi, lo = gl.split(gl.reshape(du2, [BV, BT, 2]))
        dun = hi + lo  # in a thread's registers: the layout of dU^T as an operand (a_s)
        if PASS == 3:  # dU^T, like v: rows past the sequence's end left alone
            row = bos + c * BT
            pd = du_ptr + ((row + o_t[None, :]) * H + i_h) * V + o_vc[:, None]
            gl.store(pd, gl.convert_layout(dun, c_l), mask=(o_t < eos - row)[None, :])
        dua = gl.convert_layout(-dun, a_s)
        dSt = dSt * gam[None, :]
        dSt = warpgroup_mma(dos, qgt_c.index(sc).permute((1, 0)), dSt, is_async=True)
        dSt = warpgroup_mma(dua, wt_c.index(sc).permute((1, 0)), dSt, is_async=True)
        dSt = warpgroup_mma_wait(num_outstanding=0, deps=(dSt,))
        mbarrier.arrive(cempty.index(sc))
    if PASS == 1:  # the summary: the gradient at the segment's start
        if n_chunks > 0:
            gl.store(sum_ptr + (i_s * H + i_h) * (V + K) * K + sq_offs, dSt)


@gluon.jit
def _ring(n: gl.constexpr, shape: gl.constexpr, dtype: gl.constexpr):
    """``n`` fp32-operand tiles of ``shape`` in shared memory, in the layout a tf32 wgmma
    reads."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(shape, dtype)
    return gl.allocate_shared_memory(dtype, [n] + shape, layout)


@gluon.jit
def _tma_ring(desc, n: gl.constexpr):
    return gl.allocate_shared_memory(desc.dtype, [n] + desc.block_type.shape, desc.layout)


@gluon.jit
def _barriers(n: gl.constexpr, count: gl.constexpr = 1):
    bars = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(n):
        mbarrier.init(bars.index(s), count=count)
    return bars


@gluon.jit
def chunk_kda_bwd_recurrent_ws_kernel(
        w_d, qg_d, kend_d, klo_d, mqk_d, do_d, gamma_ptr, dht_ptr, sum_ptr, ends_ptr, du_ptr,
        cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr, seg_off_ptr, T, H,
        K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, CKC: gl.constexpr,
        NUM_STAGES: gl.constexpr, CONV_STAGES: gl.constexpr, HAS_DHT: gl.constexpr,
        STATE_VK: gl.constexpr, IS_VARLEN: gl.constexpr, PASS: gl.constexpr,
        SEG: gl.constexpr, NWG: gl.constexpr, num_warps: gl.constexpr):
    """``chunk_kda_bwd_recurrent_kernel``'s program (its ``PASS``, ``SEG``, slots and
    stores) for ``NWG`` value blocks, one a compute warpgroup, which share the loaded and
    converted operands (the blocks on the grid's first axis, in groups of ``NWG``; every
    group's blocks all values' or all the transition's)."""
    i_v = gl.program_id(0) * NWG
    item = gl.program_id(1)
    BT: gl.constexpr = 16
    i_n, i_h, i_s, bos, eos, c0, j0, p, _ = program_rows(
        item, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr, T, H, BT, IS_VARLEN,
        SEG)
    n_chunks = gl.cdiv(eos - bos, BT).to(gl.int32)
    if PASS == 1:  # nothing before a sequence's first segment needs its summary
        n_chunks = gl.where(p == 0, 0, n_chunks)
    has_do = i_v * BV < V  # a block of the transition's rows (pass 1) has no dO
    bufs = (_tma_ring(w_d, NUM_STAGES), _tma_ring(qg_d, NUM_STAGES),
            _tma_ring(kend_d, NUM_STAGES), _tma_ring(klo_d, NUM_STAGES),
            _tma_ring(mqk_d, NUM_STAGES), _tma_ring(do_d, NUM_STAGES * NWG))
    f32: gl.constexpr = gl.float32
    cbufs = (_ring(CONV_STAGES, [K, BT], f32), _ring(CONV_STAGES, [K, BT], f32),
             _ring(CONV_STAGES, [2 * BT, K], f32), _ring(CONV_STAGES, [2 * BT, BT], f32),
             _ring(CONV_STAGES * NWG, [BT, BV], f32))
    bars = (_barriers(NUM_STAGES), _barriers(NUM_STAGES))
    cbars = (_barriers(CONV_STAGES), _barriers(CONV_STAGES, NWG))
    ptrs = (gamma_ptr, dht_ptr, sum_ptr, ends_ptr, du_ptr, seg_off_ptr)
    prog = (bos, eos, c0, n_chunks, i_n, i_s, i_h, i_v, H, j0)
    descs = (w_d, qg_d, kend_d, klo_d, mqk_d, do_d)
    col_v = i_h * V + i_v * BV
    if NWG == 1:
        gl.warp_specialize([
            (_compute, (cbufs, cbars, ptrs, prog, K, V, BV, CKC, HAS_DHT, STATE_VK, PASS, SEG,
                        0, NWG, num_warps)),
            (_loader, (descs, bufs, bars, bos, c0, n_chunks, i_h, H, i_h * K, col_v, has_do,
                       NWG)),
            (_converter, (bufs, cbufs, bars, cbars, bos, eos, n_chunks, has_do, NWG, 4))],
            [1, 4], [40, 128])
    else:  # the second warpgroup's registers: as many as the first's (ptxas: 168)
        gl.warp_specialize([
            (_compute, (cbufs, cbars, ptrs, prog, K, V, BV, CKC, HAS_DHT, STATE_VK, PASS, SEG,
                        0, NWG, num_warps)),
            (_compute, (cbufs, cbars, ptrs, prog, K, V, BV, CKC, HAS_DHT, STATE_VK, PASS, SEG,
                        1, NWG, 4)),
            (_loader, (descs, bufs, bars, bos, c0, n_chunks, i_h, H, i_h * K, col_v, has_do,
                       NWG)),
            (_converter, (bufs, cbufs, bars, cbars, bos, eos, n_chunks, has_do, NWG, 4))],
            [4, 1, 4], [184, 24, 104])


def applies(do, ops, *, precision: str, ds_dtype) -> bool:
    """Whether the Gluon dS pass runs this call (the caller checks the device is a Hopper):
    tf32 products with fp32 dS operands, K 64 or 128, V a multiple of 64, contiguous 16-bit
    or fp32 operands on the GPU."""
    w = ops[0]
    return (do.is_cuda and precision == "tf32" and ds_dtype == torch.float32
            and w.shape[-1] in (64, 128) and do.shape[-1] % BV == 0 and do.numel() > 0
            and w.dtype in (torch.float16, torch.float32) and ops[5].dtype == w.dtype
            and do.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and do.is_contiguous() and all(x.is_contiguous() for x in ops))


def value_blocks_a_program(nv: int, items: int, V: int, sms: int, warpgroups: int = 0) -> int:
    """Compute warpgroups a program for a pass of ``nv`` value blocks and ``items`` sequences
    or segments (times heads): 2 where asked (``warpgroups`` 2, or 0 and one block a program
    would leave programs waiting for ``sms`` SMs) and the blocks pair up, each pair all
    values' or all the transition's (nv and V / 64 even), else 1.

    Measured (H100, c7f803f; docs/training.md "The dS pass in Gluon"): a chain's step took
    1.6 µs alone (T 8192 H 64 serial, 128 one-block programs on 132 SMs: 0.818 ms; as 64
    two-block programs 1.348 ms, 2.6 µs a step, the two chains share an SM's issue), and two
    chains' steps 2.6 where programs queue for SMs (T 4096 H 16, 32-chunk segments: 0.236
    against 0.325 ms; T 1024 H 16 0.070 against 0.097)."""
    if warpgroups == 0:
        warpgroups = 2 if nv * items > sms else 1
    return 2 if warpgroups == 2 and nv % 2 == 0 and (V // BV) % 2 == 0 else 1


def descriptors(do, ops, H: int, K: int, V: int) -> list:
    """The kernel's TMA descriptors of W, QG, KEND, KLO, MQK and dO: built once a call, for
    both passes of a split."""
    w, qg, kend, klo, ainv, mqk, gamma = ops
    rows = do.shape[0] * do.shape[1]
    descs = [_desc(x.view(rows, H * K), [CHUNK, K]) for x in (w, qg, kend, klo)]
    descs.append(_desc(mqk.view(-1, CHUNK), [CHUNK, CHUNK]))
    descs.append(_desc(do.view(rows, H * V), [CHUNK, BV]))
    return descs


def ds_pass_ws(descs, gamma, pass_, *, items, dht, state_vk, cu_seqlens, chunk_offsets,
               seq_order, segments, seg_offsets, summary, ends, du, H, K, V, T, sms, ckc,
               num_stages=2, conv_stages=2, warpgroups=0):
    """One pass (1 or 3) of the dS recurrence by ``chunk_kda_bwd_recurrent_ws_kernel`` on
    ``descriptors``' tiles, as ``chunk_recurrent_bwd._ds_pass`` launches the Triton kernel
    (the same buffers); past the grid's second axis (65535 items) returns False and launches
    nothing. ``ckc``: chunks a block (``chunk_recurrent_bwd.CKC``, passed: that module
    imports this one); ``warpgroups``: 1, 2, or 0 for ``value_blocks_a_program``'s choice."""
    if items > _MAX_GRID_Y:
        return False
    opt = lambda x: x if x is not None else gamma  # noqa: E731 - absent optional pointers
    nv = (V + K if pass_ == 1 else V) // BV
    nwg = value_blocks_a_program(nv, items, V, sms, warpgroups)
    chunk_kda_bwd_recurrent_ws_kernel[(nv // nwg, items)](
        *descs, gamma, opt(dht), opt(summary), ends, du, opt(cu_seqlens), opt(chunk_offsets),
        opt(seq_order), opt(segments), opt(seg_offsets), T, H, K=K, V=V, BV=BV, CKC=ckc,
        NUM_STAGES=num_stages, CONV_STAGES=conv_stages, HAS_DHT=dht is not None,
        STATE_VK=state_vk, IS_VARLEN=cu_seqlens is not None, PASS=pass_,
        SEG=segments is not None, NWG=nwg, num_warps=4)
    return True
