"""The backward's blocks kernel in Gluon (issue 40), beside ``chunk_blocks_bwd``'s Triton
kernel; ``chunk_kda_bwd_blocks`` takes it on a Hopper GPU where it ``applies``
(``autograd.BWD_MODE["blocks_gluon"]``; docs/training.md "The blocks kernel in Gluon").

The same walk as ``chunk_kda_bwd_blocks_kernel`` (its docstring): per 64-token block and
head, from the checkpoint before the block, forward through its chunks with S^T [V, K] fp32 in
registers,

    U^T = V^T AINV^T - S^T W^T          dQG^T = S dO^T     dW^T = -S dU^T
    S'^T = S^T diag(γ) + U_hi^T KEND_hi + U_lo^T KEND_hi + U^T KLO

then dMQK = tril(dO U^T) for the block's four chunks at once, then back from pass 3's
gradient after the block with dS^T [V, K] in registers,

    dKEND^T = dS' U^T     dγ = Σ_v S ⊙ dS'     dS^T = dS'^T diag(γ) + dO^T QG - dU^T W.

Every product is a tf32 ``wgmma`` (fp32 accumulation) of the Triton kernel's operands (the
same fp32 values, truncated to tf32 by the tensor cores), summed in another order: the two
agree to fp32's rounding, not bit for bit. One program on ``V / 16`` warps holds all V rows
(two warpgroups at V = 128), so the products that sum over V (dQG, dW, dKEND) are whole here,
no value-block partial sums: S (dS) is written to shared memory as [K, V] (V contiguous), the
A operand of an M = K product with dO^T, dU^T or U^T, whose rows the block's tiles in shared
memory hold as fp32 [16, V] (loaded once a block). A tf32 ``wgmma`` reads a shared-memory
operand K-major only (PTX ISA, ``wgmma.mma_async``, imm-trans), so W (for S^T W^T) is stored
token-major, KEND_hi, KLO, QG and W (for the products over the chunk's tokens) transposed.
S^T's accumulator becomes the A operand of S^T W^T without shuffles: its columns are taken in
the order a thread holds them (``_kperm``), W's with them; so are U^T's, with KEND's tokens.
The states a block's walk back needs for dγ go to a per-program scratch in global memory in
the accumulator's own layout (each thread reads back what it wrote: no barrier).

No warp specialization: the program loads the next operands with plain loads and stores
them to shared memory between the products (barriers around them). Gluon has no
interpreter: CI compiles it for sm_90a (``tests/test_kernels_bwd_ws.py``); the Triton kernel
is the arithmetic CI runs and the fallback.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .chunk_recurrent_bwd_ws import _kperm
from .chunk_recurrent_ws import _state_offsets
from .indexing import segment_of_program

CHUNK = 16
#: a CTA-wide barrier: ``gl.barrier`` (triton 3.9), ``gl.thread_barrier`` (3.6)
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _rows(ptr, row0, eos, i_h, H, N: gl.constexpr, layout: gl.constexpr):
    """Rows ``row0`` .. + 16 of a token-major [T, H, N] tensor, fp32 [16, N] in ``layout``,
    the rows from ``eos`` on zero (what the Triton kernel's masked loads give)."""
    o_t = gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
    o_n = gl.arange(0, N, layout=gl.SliceLayout(0, layout))
    rows = row0 + o_t
    p = ptr + (rows[:, None] * H + i_h) * N + o_n[None, :]
    return gl.load(p, mask=(rows < eos)[:, None], other=0.0).to(gl.float32)


@gluon.jit
def _store_kt(ptr, x, row0, eos, i_h, H, K: gl.constexpr, layout: gl.constexpr):
    """x^T [K, 16] (an M = K accumulator) as rows ``row0`` .. + 16 of a token-major
    [T, H, K] fp32 tensor, rows from ``eos`` on left alone."""
    o_k = gl.arange(0, K, layout=gl.SliceLayout(1, layout))
    o_t = gl.arange(0, 16, layout=gl.SliceLayout(0, layout))
    rows = row0 + o_t
    gl.store(ptr + (rows[None, :] * H + i_h) * K + o_k[:, None], x,
             mask=(rows < eos)[None, :])


@gluon.jit
def _tf32(x):
    """fp32 ``x`` truncated to tf32 (10 mantissa bits): the value a tensor core multiplies."""
    return (x.to(gl.int32, bitcast=True) & -8192).to(gl.float32, bitcast=True)


@gluon.jit
def _block_start(h0_ptr, ck_ptr, ck_offsets_ptr, i_n, jb, i_h, H,
                 K: gl.constexpr, V: gl.constexpr, HAS_H0: gl.constexpr,
                 STATE_VK: gl.constexpr, layout: gl.constexpr):
    """S^T [V, K] fp32 before block ``jb`` of sequence ``i_n``: the initial state (or zero)
    before its first block, else the forward's checkpoint after block jb - 1."""
    if jb == 0:
        if HAS_H0:
            St = gl.load(h0_ptr + _state_offsets(i_n, i_h, 0, H, K, V, V, STATE_VK,
                                                 layout)).to(gl.float32)
        else:
            St = gl.zeros([V, K], gl.float32, layout=layout)
    else:
        ck = gl.load(ck_offsets_ptr + i_n).to(gl.int64) + jb - 1
        St = gl.load(ck_ptr + _state_offsets(ck, i_h, 0, H, K, V, V, STATE_VK, layout))
    return St


@gluon.jit
def _dmqk(do_c, u_c, V: gl.constexpr, num_warps: gl.constexpr):
    """dO_c U_c^T [16, 16] from the chunk's fp32 rows in shared memory, by fp32 FMAs (in
    slabs of VB value columns, summed over them at the end) of the operands truncated to
    tf32 (``_tf32``): the Triton kernel's ``mma.sync`` product's, which reads them raw (no
    ``cvt.rna.tf32`` in its sm_90a PTX) and keeps their top 10 mantissa bits."""
    VB: gl.constexpr = 8 * (num_warps // 2)
    L3: gl.constexpr = gl.BlockedLayout([2, 2, 8], [8, 4, 1], [1, 2, num_warps // 2], [2, 1, 0])
    acc = gl.zeros([16, 16, VB], gl.float32, layout=L3)
    for vb in gl.static_range(V // VB):
        a = _tf32(do_c.slice(vb * VB, VB, dim=1).load(gl.SliceLayout(1, L3)))
        b = _tf32(u_c.slice(vb * VB, VB, dim=1).load(gl.SliceLayout(0, L3)))
        acc += a[:, None, :] * b[None, :, :]
    return gl.sum(acc, axis=2)


@gluon.jit
def chunk_kda_bwd_blocks_ws_kernel(
        v_ptr, do_ptr, du_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, ainv_ptr, gamma_ptr,
        h0_ptr, ck_ptr, ck_offsets_ptr, ends_ptr,
        dqg_ptr, dw_ptr, dkend_ptr, dgam_ptr, dmqk_ptr, dh0_ptr,
        scratch_ptr, seg_ptr, n_items, H,
        K: gl.constexpr, V: gl.constexpr, CKC: gl.constexpr, HAS_H0: gl.constexpr,
        STORE_DH0: gl.constexpr, STATE_VK: gl.constexpr, num_warps: gl.constexpr):
    """``chunk_kda_bwd_blocks_kernel``'s items (64-token block, head), all V rows a program
    (``num_warps`` = V / 16), persistent; the outputs are its first value block's partial
    sums (the only one)."""
    BT: gl.constexpr = 16
    f32: gl.constexpr = gl.float32
    # S^T [V, K] (instruction N = K), U^T [V, 16] and the M = K products [K, 16]
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, K, 8])
    u_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BT, 8])
    a_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_l, k_width=1)
    a_u: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=u_l, k_width=1)
    lay: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [num_warps, 1], [1, 0])
    sq: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [num_warps, 1], [1, 0])

    row_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, V], f32)
    st_s = gl.allocate_shared_memory(f32, [K, V],
                                     gl.NVMMASharedLayout.get_default_for([K, V], f32))
    do_s = gl.allocate_shared_memory(f32, [CKC, BT, V], row_l)
    du_s = gl.allocate_shared_memory(f32, [CKC, BT, V], row_l)
    u_s = gl.allocate_shared_memory(f32, [CKC, BT, V], row_l)
    v_s = gl.allocate_shared_memory(f32, [BT, V], row_l)
    w_s = gl.allocate_shared_memory(f32, [BT, K],
                                    gl.NVMMASharedLayout.get_default_for([BT, K], f32))
    # forward: KEND_hi^T, KLO^T; backward: QG^T, W^T ([K, 16], tokens contiguous)
    kx_s = gl.allocate_shared_memory(f32, [2, K, BT],
                                     gl.NVMMASharedLayout.get_default_for([K, BT], f32))
    ai_s = gl.allocate_shared_memory(f32, [BT, BT],
                                     gl.NVMMASharedLayout.get_default_for([BT, BT], f32))

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, s_l))
    o_v = gl.arange(0, V, layout=gl.SliceLayout(1, s_l))
    sq_offs = o_v[:, None] * K + o_k[None, :]
    scr = scratch_ptr + pid.to(gl.int64) * (CKC * V * K)
    o_i = gl.arange(0, BT, layout=gl.SliceLayout(1, sq))
    o_j = gl.arange(0, BT, layout=gl.SliceLayout(0, sq))
    zu = gl.zeros([V, BT], f32, layout=u_l)
    zk = gl.zeros([K, BT], f32, layout=u_l)
    for item in range(pid, n_items, nprog):
        i_s = (item // H).to(gl.int64)
        i_h = item % H
        i_n, jb, bos, eos, c0, _ = segment_of_program(i_s, seg_ptr)
        n_ch = gl.cdiv(eos - bos, BT).to(gl.int32)
        _cta_barrier()  # the last item's products have read the block's tiles
        for c in gl.static_range(CKC):  # the block's dO and dU rows, fp32, zero past eos
            do_s.index(c).store(_rows(do_ptr, bos + c * BT, eos, i_h, H, V, lay))
            du_s.index(c).store(_rows(du_ptr, bos + c * BT, eos, i_h, H, V, lay))
        St = _block_start(h0_ptr, ck_ptr, ck_offsets_ptr, i_n, jb, i_h, H, K, V,
                          HAS_H0, STATE_VK, s_l)
        # forward through the block, S^T live
        for c in range(0, n_ch):
            row = bos + c * BT
            cc = (c0 + c) * H + i_h
            wc = _rows(w_ptr, row, eos, i_h, H, K, lay)
            kh = gl.permute(_rows(kend_ptr, row, eos, i_h, H, K, lay), (1, 0))
            kl = gl.permute(_rows(klo_ptr, row, eos, i_h, H, K, lay), (1, 0))
            vc = _rows(v_ptr, row, eos, i_h, H, V, lay)
            ai = gl.load(ainv_ptr + cc * BT * BT + o_i[:, None] * BT + o_j[None, :]).to(f32)
            gam = gl.load(gamma_ptr + cc * K + o_k)
            _cta_barrier()  # the last chunk's products are done in every warpgroup
            st_s.permute((1, 0)).store(St)  # first: the loads above are in flight
            if c > 0:  # the state before the block is read again from where it came
                gl.store(scr + c * V * K + sq_offs, St, eviction_policy="evict_last")
            w_s.store(_kperm(wc))
            kx_s.index(0).store(_kperm(kh))
            kx_s.index(1).store(_kperm(kl))
            v_s.store(vc)
            ai_s.store(ai)
            fence_async_shared()
            _cta_barrier()
            vu = warpgroup_mma(v_s.permute((1, 0)).load(a_u), ai_s.permute((1, 0)), zu,
                               use_acc=False, is_async=True)
            su = warpgroup_mma(gl.convert_layout(_kperm(St), a_u), w_s.permute((1, 0)), zu,
                               use_acc=False, is_async=True)
            dq = warpgroup_mma(st_s, do_s.index(c).permute((1, 0)), zk, use_acc=False,
                               is_async=True)
            dw = warpgroup_mma(st_s, du_s.index(c).permute((1, 0)), zk, use_acc=False,
                               is_async=True)
            vu, su = warpgroup_mma_wait(num_outstanding=2, deps=(vu, su))
            u = vu - su
            u_s.index(c).permute((1, 0)).store(u)
            # U as two parts against KEND_hi (the H200 truncates U to 10 bits where the
            # forward rounds it: docs/training.md "Precision"), KLO against U whole
            u_hi = u.to(gl.bfloat16).to(f32)
            St = St * gam[None, :]
            St = warpgroup_mma(gl.convert_layout(_kperm(u_hi), a_s), kx_s.index(0).permute((1, 0)),
                               St, is_async=True)
            St = warpgroup_mma(gl.convert_layout(_kperm(u - u_hi), a_s),
                               kx_s.index(0).permute((1, 0)), St, is_async=True)
            St = warpgroup_mma(gl.convert_layout(_kperm(u), a_s), kx_s.index(1).permute((1, 0)),
                               St, is_async=True)
            St, dq, dw = warpgroup_mma_wait(num_outstanding=0, deps=(St, dq, dw))
            _store_kt(dqg_ptr, dq, row, eos, i_h, H, K, u_l)
            _store_kt(dw_ptr, -dw, row, eos, i_h, H, K, u_l)
        # dMQK = tril(dO U^T) of each chunk, [16, 16]: too short for a wgmma (M >= 64)
        _cta_barrier()  # U's rows stored by every warp
        for c in range(0, n_ch):
            mq = _dmqk(do_s.index(c), u_s.index(c), V, num_warps)
            cc = (c0 + c) * H + i_h
            mi = gl.arange(0, BT, layout=gl.SliceLayout(1, mq.type.layout))
            mj = gl.arange(0, BT, layout=gl.SliceLayout(0, mq.type.layout))
            gl.store(dmqk_ptr + cc * BT * BT + mi[:, None] * BT + mj[None, :],
                     gl.where(mi[:, None] >= mj[None, :], mq, 0.0))
        # back through the block, dS^T live, from pass 3's gradient after it
        dSt = gl.load(ends_ptr + (i_s * H + i_h) * V * K + sq_offs)
        for ic in range(0, n_ch):
            c = n_ch - 1 - ic
            row = bos + c * BT
            cc = (c0 + c) * H + i_h
            qgt = gl.permute(_rows(qg_ptr, row, eos, i_h, H, K, lay), (1, 0))
            wt = gl.permute(_rows(w_ptr, row, eos, i_h, H, K, lay), (1, 0))
            gam = gl.load(gamma_ptr + cc * K + o_k)
            if c > 0:  # by this thread (the same layout): no barrier between
                Sc = gl.load(scr + c * V * K + sq_offs, eviction_policy="evict_last")
            else:
                Sc = _block_start(h0_ptr, ck_ptr, ck_offsets_ptr, i_n, jb, i_h, H,
                                  K, V, HAS_H0, STATE_VK, s_l)
            _cta_barrier()
            st_s.permute((1, 0)).store(dSt)
            kx_s.index(0).store(qgt)
            kx_s.index(1).store(wt)
            fence_async_shared()
            _cta_barrier()
            dk = warpgroup_mma(st_s, u_s.index(c).permute((1, 0)), zk, use_acc=False,
                               is_async=True)
            doa = do_s.index(c).permute((1, 0)).load(a_s)
            dua = du_s.index(c).permute((1, 0)).load(a_s)
            gl.store(dgam_ptr + cc * K + o_k, gl.sum(Sc * dSt, axis=0))
            dSt = dSt * gam[None, :]
            dSt = warpgroup_mma(doa, kx_s.index(0).permute((1, 0)), dSt, is_async=True)
            dSt = warpgroup_mma(-dua, kx_s.index(1).permute((1, 0)), dSt, is_async=True)
            dSt, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dSt, dk))
            _store_kt(dkend_ptr, dk, row, eos, i_h, H, K, u_l)
        if STORE_DH0:
            if jb == 0:
                gl.store(dh0_ptr + _state_offsets(i_n, i_h, 0, H, K, V, V, STATE_VK, s_l),
                         dSt.to(dh0_ptr.dtype.element_ty))


def applies(v, do, du, ops, *, precision: str, s_dtype, ds_dtype) -> bool:
    """Whether the Gluon blocks kernel runs this call (the caller checks the device is a
    Hopper): operands on the GPU that it ``fits``."""
    return v.is_cuda and fits(v, do, du, ops, precision=precision, s_dtype=s_dtype,
                              ds_dtype=ds_dtype)


def fits(v, do, du, ops, *, precision: str, s_dtype, ds_dtype) -> bool:
    """tf32 products of fp32 S and dS operands, K 128, V 64 or 128 (one program's
    warpgroups), contiguous 16-bit or fp32 operands (``train_memory_cpu.py`` counts the
    Hopper path's buffers on the CPU with it)."""
    w = ops[0]
    return (precision == "tf32" and s_dtype == torch.float32
            and ds_dtype == torch.float32 and w.shape[-1] == 128 and v.shape[-1] in (64, 128)
            and w.dtype in (torch.float16, torch.float32) and du.dtype == torch.float32
            and all(x.is_contiguous() for x in (v, do, du, *ops)))


def blocks_ws(v, do, du, ops, ends, out, *, initial_state, checkpoints, checkpoint_offsets,
              state_vk, blocks, items, sms, ckc):
    """Launch the kernel over ``items`` (blocks times heads) into ``out``
    (``chunk_kda_bwd_blocks``'s dict, one value block's partial sums): one persistent
    program an SM (its shared memory), each with a scratch of ``ckc`` states."""
    w, qg, kend, klo, ainv, mqk, gamma = ops
    B, T, H, V = v.shape
    K = w.shape[-1]
    n_prog = max(1, min(items, sms))
    scratch = torch.empty((n_prog * ckc * V * K,), device=v.device, dtype=torch.float32)
    opt = lambda x: x if x is not None else gamma  # noqa: E731 - absent optional pointers
    chunk_kda_bwd_blocks_ws_kernel[(n_prog,)](
        v, do, du, w, qg, kend, klo, ainv, gamma, opt(initial_state), opt(checkpoints),
        opt(checkpoint_offsets), ends, out["dqg"], out["dw"], out["dkend"], out["dgam"],
        out["dmqk"], opt(out["dh0"]), scratch, blocks, items, H, K=K, V=V, CKC=ckc,
        HAS_H0=initial_state is not None, STORE_DH0=out["dh0"] is not None,
        STATE_VK=state_vk, num_warps=V // 16)
