"""Stage 2 as a warp-specialized Gluon kernel (issue 43, a prototype beside ``chunk_recurrent``).

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

Scope of the prototype: the serial pass (one program a sequence, head and value block), fixed
length with T a multiple of 16 (a TMA box never crosses a sequence), fp16 products with the
guard's first launch (``FLAG`` 1 of ``chunk_recurrent``: a program whose end state is not
finite writes its flag and no final state; ``chunk_recurrent``'s second launch redoes it), no
checkpoints. ``chunk_kda_recurrent_ws`` refuses anything else (``ValueError``).

Gluon has no interpreter: CI compiles it for sm_90a (``tests/test_kernels_ws.py``); the GPU
tests hold it to the Triton kernel's outputs.
"""

from __future__ import annotations

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

CHUNK = 16
# Gluon's TMA copies were renamed after triton 3.6 (the H200's): async_load / async_store
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = (tma.async_store if hasattr(tma, "async_store")
              else tma.async_copy_shared_to_global)


@gluon.jit
def _loader(descs, bufs, bars, row0, col_k, col_v, cc0, n_chunks, i_h, H):
    """One warp: chunk i's operands into stage i % NUM_STAGES once the compute warpgroup has
    released it."""
    w_d, qg_d, kend_d, klo_d, v_d, ainv_d, mqk_d = descs
    w_s, qg_s, kend_s, klo_s, v_s, ainv_s, mqk_s = bufs
    ready, empty = bars
    NS: gl.constexpr = w_s.type.shape[0]
    BT: gl.constexpr = w_s.type.shape[1]
    nbytes: gl.constexpr = (4 * w_d.block_type.nbytes + v_d.block_type.nbytes
                            + 2 * ainv_d.block_type.nbytes)
    for i in range(n_chunks):
        s = i % NS
        mbarrier.wait(empty.index(s), ((i // NS) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, nbytes)
        row = row0 + i * BT
        cc = (cc0 + i) * H + i_h
        _tma_load(w_d, [row, col_k], bar, w_s.index(s))
        _tma_load(qg_d, [row, col_k], bar, qg_s.index(s))
        _tma_load(kend_d, [row, col_k], bar, kend_s.index(s))
        _tma_load(klo_d, [row, col_k], bar, klo_s.index(s))
        _tma_load(v_d, [row, col_v], bar, v_s.index(s))
        _tma_load(ainv_d, [cc * BT, 0], bar, ainv_s.index(s))
        _tma_load(mqk_d, [cc * BT, 0], bar, mqk_s.index(s))


@gluon.jit
def _compute(bufs, bars, o_d, o_s, gamma_ptr, h0_ptr, ht_ptr, flag_ptr, row0, col_v, cc0,
             n_chunks, i_n, i_h, i_v, H, lin, K: gl.constexpr, V: gl.constexpr,
             BV: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr,
             STATE_VK: gl.constexpr, num_warps: gl.constexpr):
    """The compute warpgroup: the chunks in order, S^T in registers."""
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
    o_v = gl.arange(0, BV, layout=gl.SliceLayout(1, s_l))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, s_l))
    base = (i_n * H + i_h) * K * V
    if STATE_VK:
        offs = base + (i_v * BV + o_v)[:, None] * K + o_k[None, :]
    else:
        offs = base + o_k[None, :] * V + (i_v * BV + o_v)[:, None]
    if HAS_H0:
        St = gl.load(h0_ptr + offs).to(gl.float32)
    else:
        St = gl.zeros([BV, K], gl.float32, layout=s_l)
    zc = gl.zeros([BV, BT], gl.float32, layout=c_l)
    for i in range(n_chunks):
        s = i % NS
        gam = gl.load(gamma_ptr + ((cc0 + i) * H + i_h) * K + o_k)  # off the loader's ring
        mbarrier.wait(ready.index(s), (i // NS) & 1)
        Sa = gl.convert_layout(St.to(gl.float16), a_c)
        sw = warpgroup_mma(Sa, w_s.index(s).permute((1, 0)), zc, use_acc=False, is_async=True)
        sq = warpgroup_mma(Sa, qg_s.index(s).permute((1, 0)), zc, use_acc=False,
                           is_async=True)
        vt = v_s.index(s).permute((1, 0)).load(a_c).to(gl.float16)
        va = warpgroup_mma(vt, ainv_s.index(s).permute((1, 0)), zc, use_acc=False,
                           is_async=True)
        sw, sq, va = warpgroup_mma_wait(num_outstanding=0, deps=(sw, sq, va))
        ud = (va - sw).to(gl.float16)
        ot = warpgroup_mma(gl.convert_layout(ud, a_c), mqk_s.index(s).permute((1, 0)), sq,
                           is_async=True)
        ua = gl.convert_layout(ud, a_s)
        St = St * gam[None, :]
        St = warpgroup_mma(ua, kend_s.index(s), St, is_async=True)
        St = warpgroup_mma(ua, klo_s.index(s), St, is_async=True)
        ot, St = warpgroup_mma_wait(num_outstanding=0, deps=(ot, St))
        fence_async_shared()  # V^T was read through the generic proxy
        mbarrier.arrive(empty.index(s))
        # O^T leaves through shared memory: the buffer's store from two chunks ago first
        ob = o_s.index(i % 2)
        tma.store_wait(1)
        ob.permute((1, 0)).store(ot.to(o_d.dtype))
        fence_async_shared()
        _tma_store(o_d, [row0 + i * BT, col_v], ob)
    tma.store_wait(0)
    bad = gl.max(gl.max(((St != St) | (gl.abs(St) == float("inf"))).to(gl.int32), 1), 0)
    gl.store(flag_ptr + lin, bad)
    if STORE_HT:
        if bad == 0:
            gl.store(ht_ptr + offs, St.to(ht_ptr.dtype.element_ty))


@gluon.jit
def _ring(desc, NUM_STAGES: gl.constexpr):
    """NUM_STAGES tiles of ``desc``'s box in shared memory."""
    return gl.allocate_shared_memory(desc.dtype, [NUM_STAGES] + desc.block_type.shape,
                                     desc.layout)


@gluon.jit
def chunk_kda_recurrent_ws_kernel(w_d, qg_d, kend_d, klo_d, v_d, ainv_d, mqk_d, o_d,
                                  gamma_ptr, h0_ptr, ht_ptr, flag_ptr, T, H,
                                  K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                                  NUM_STAGES: gl.constexpr, HAS_H0: gl.constexpr,
                                  STORE_HT: gl.constexpr, STATE_VK: gl.constexpr,
                                  num_warps: gl.constexpr):
    i_nh = gl.program_id(0)
    i_v = gl.program_id(1)
    lin = i_nh * gl.num_programs(1) + i_v
    i_n = i_nh // H
    i_h = i_nh % H
    BT: gl.constexpr = 16
    n_chunks = T // BT
    row0 = i_n * T
    cc0 = i_n * n_chunks
    col_k = i_h * K
    col_v = i_h * V + i_v * BV
    bufs = (_ring(w_d, NUM_STAGES), _ring(qg_d, NUM_STAGES), _ring(kend_d, NUM_STAGES),
            _ring(klo_d, NUM_STAGES), _ring(v_d, NUM_STAGES), _ring(ainv_d, NUM_STAGES),
            _ring(mqk_d, NUM_STAGES))
    o_s = gl.allocate_shared_memory(o_d.dtype, [2] + o_d.block_type.shape, o_d.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    bars = (ready, empty)
    descs = (w_d, qg_d, kend_d, klo_d, v_d, ainv_d, mqk_d)
    gl.warp_specialize([
        (_compute, (bufs, bars, o_d, o_s, gamma_ptr, h0_ptr, ht_ptr, flag_ptr, row0, col_v,
                    cc0, n_chunks, i_n, i_h, i_v, H, lin, K, V, BV, HAS_H0, STORE_HT,
                    STATE_VK, num_warps)),
        (_loader, (descs, bufs, bars, row0, col_k, col_v, cc0, n_chunks, i_h, H)),
    ], [1], [40])


_GL = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}


def _desc(x, block):
    """A TMA descriptor of the 2D tensor ``x`` with ``block``-sized boxes."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for(block, _GL[x.dtype])
    return TensorDescriptor.from_tensor(x, block, layout)


def applies(v, w, varlen: bool, dot: str) -> bool:
    """Whether the prototype runs this call's serial pass: fixed length, T a positive multiple
    of 16, fp16 products, K 64 or 128, V a multiple of 64, v contiguous bf16 or fp16 on a
    CUDA device (Gluon has no interpreter)."""
    B, T, H, V = v.shape
    return (v.is_cuda and not varlen and T > 0 and T % CHUNK == 0 and dot == "fp16"
            and w.shape[-1] in (64, 128) and V % 64 == 0
            and v.dtype in (torch.bfloat16, torch.float16) and v.is_contiguous())


def chunk_kda_recurrent_ws(v, w, qg, kend, klo, ainv, mqk, gamma, *, initial_state,
                           final_state, state_vk, block_v=64, num_stages=3, maxnreg=128):
    """Stage 2's serial pass (fixed length, T % 16 == 0, fp16 products) by
    ``chunk_kda_recurrent_ws_kernel``, then the guard's redo of the programs it flagged by
    ``chunk_recurrent``'s second launch (``FLAG`` 2, tf32 from the first chunk whose fp16 step
    is not finite). Returns o; the final state, when given, is written."""
    from .chunk_recurrent import chunk_kda_recurrent_kernel

    B, T, H, V = v.shape
    K = w.shape[-1]
    if T % CHUNK or T == 0:
        raise ValueError(f"chunk_kda_recurrent_ws: T must be a positive multiple of {CHUNK}, "
                         f"got {T}")
    if V % block_v or block_v != 64 or K not in (64, 128):
        raise ValueError(f"chunk_kda_recurrent_ws: needs block_v 64 dividing V and K 64 or "
                         f"128, got block_v {block_v}, V {V}, K {K}")
    if v.dtype not in (torch.bfloat16, torch.float16) or not v.is_contiguous():
        raise ValueError(f"chunk_kda_recurrent_ws: v must be contiguous bf16 or fp16, got "
                         f"{v.dtype}")
    o = torch.empty_like(v)
    rows = B * T
    descs = [_desc(x.view(rows, H * K), [CHUNK, K]) for x in (w, qg, kend, klo)]
    descs.append(_desc(v.view(rows, H * V), [CHUNK, block_v]))
    descs += [_desc(x.view(-1, CHUNK), [CHUNK, CHUNK]) for x in (ainv, mqk)]
    descs.append(_desc(o.view(rows, H * V), [CHUNK, block_v]))
    grid = (B * H, V // block_v)
    flags = torch.empty(grid[0] * grid[1], device=v.device, dtype=torch.int32)
    h0 = initial_state if initial_state is not None else gamma
    ht = final_state if final_state is not None else gamma
    chunk_kda_recurrent_ws_kernel[grid](
        *descs, gamma, h0, ht, flags, T, H, K=K, V=V, BV=block_v, NUM_STAGES=num_stages,
        HAS_H0=initial_state is not None, STORE_HT=final_state is not None,
        STATE_VK=state_vk, num_warps=4, maxnreg=maxnreg)
    if bool(flags.any()):  # the redo (a host sync: the prototype's, not the launcher's)
        import triton.language as tl

        chunk_kda_recurrent_kernel[grid](
            v, w, qg, kend, klo, ainv, mqk, gamma, h0, ht, o, gamma, gamma, gamma, gamma,
            gamma, T, H=H, K=K, V=V, BT=CHUNK, BV=block_v, HAS_H0=initial_state is not None,
            STORE_HT=final_state is not None, STATE_VK=state_vk, IS_VARLEN=False, PASS=0,
            SKIP_LAST=True, DT=tl.float16, GUARD=False, FLAG=2, flag_ptr=flags, num_warps=4,
            num_stages=2)
    return o
