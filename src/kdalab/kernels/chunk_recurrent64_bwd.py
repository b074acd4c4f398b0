"""Backward of stage 2: the dS recurrence in 64-token steps, a candidate for the 16-token pass
of ``chunk_recurrent_bwd.py`` (``autograd.BWD_MODE["ds64"]``; docs/training.md "A 64-token
reverse pass": not yet timed on a GPU, so not the default). It hands on what that pass does: each
chunk's dU^T (like dO, fp32) and the gradient after every 64-token block ([blocks, H, V, K]).
Fixed-length input with T a multiple of 64 only (``fits``).

Three kernels:

1. ``prep64_kernel``, parallel over (block, head): the 64-token operands from stage 1's four
   16-token chunks. With D_c = Π_{j<c} γ_j and E(c', c) = Π_{c'<j<c} γ_j (products, never a
   quotient, which would overflow fp32 under a strong gate): X's blocks W_c diag(E(c', c))
   KEND_c'^T (c' < c), W₆₄ = (I + X)^-1 [W_c diag(D_c)] by block forward substitution, QG₆₄ =
   [QG_c diag(D_c)], KEND₆₄ = [KEND_c diag(E(c, 4))], MQK₆₄'s blocks MQK_c and QG_c diag(E(c',
   c)) KEND_c'^T, γ₆₄ = D_4.
2. ``ds64_kernel``, serial over a sequence's blocks (program: sequence, head, value block),
   from the gradient dS'^T after a block (dS^T held as two halves of key columns, as fla's
   pass holds its state):

       dU₆₄^T = dS'^T KEND₆₄^T + dO^T MQK₆₄,   dS^T = dS'^T diag(γ₆₄) + dO^T QG₆₄ - dU₆₄^T W₆₄

3. ``solve64_kernel``, parallel: the chain's dU from dU₆₄, (I + X)^T dU = dU₆₄ by block back
   substitution (``tests/test_kernels_backward.py`` ``test_64_token_reverse_step_algebra``).

The operands are fp32 values, which a tf32 product truncates to 10 bits: the serial kernel's
products in one of ``PRECISIONS``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: the block: four 16-token chunks
BB = 64
#: ``prep64_kernel``'s key columns a pass (sm_90a: 16, 256 bytes of spills a thread; 32, 888;
#: whole rows, 23,620: BENCHMARKS.md ``ds64_sm90``)
PREP_BK = 16
#: ``BWD_MODE["ds64"]``'s values: the serial kernel's products. "mixed": those with dS or dU
#: "split" (the other operand as its tf32 truncation and the rest, two tf32 products, dS and
#: dU truncated, as the 16-token pass multiplies dS by KEND's two fp16 parts), those with dO
#: (bf16, exact in tf32) one tf32 product; "tf32x3"; "tf32" (the precision's price). The
#: parallel kernels' products are 3xTF32 whichever
PRECISIONS = {1: "mixed", 2: "split", 3: "tf32x3", 4: "tf32"}


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    """a @ b: ``PREC`` a tl.dot precision, or "split" (and "mixed", ``_mm_do``): b as its tf32
    truncation and the rest, two tf32 products, ``a`` truncated (as the 16-token pass
    multiplies dS by KEND's fp16 part and KLO: training.md "Precision")."""
    if (PREC == "split") or (PREC == "mixed"):
        hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        return (tl.dot(a, hi, input_precision="tf32")
                + tl.dot(a, b - hi, input_precision="tf32"))
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _mm_do(a, b, PREC: tl.constexpr):
    """a @ b for the products with dO (bf16 values, exact in tf32): "mixed" takes them in one
    tf32 product, the other operand truncated (QG₆₄'s and MQK₆₄'s terms reach dS at tf32's
    precision, as the 16-token pass's cross-chunk terms do through its truncated dS), and the
    products with dS and dU split as "split"."""
    if PREC == "mixed":
        return tl.dot(a, b, input_precision="tf32")
    else:
        return _mm(a, b, PREC)


@triton.jit
def ds64_kernel(do_ptr, w_ptr, qg_ptr, ke_ptr, mqk_ptr, g_ptr, dht_ptr, ends_ptr, du_ptr,
                T, H, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                HAS_DHT: tl.constexpr, STATE_VK: tl.constexpr, PREC: tl.constexpr):
    """The serial 64-token dS pass over one (sequence, head, value block) of fixed-length
    input (T % 64 == 0): the gradient after every block to ``ends`` ([blocks, H, V, K]),
    each block's dU₆₄^T to ``du`` (like dO, fp32). dS^T is held as its two halves of key
    columns, as fla's pass holds its state (each product's operands a [64, K/2] tile: the
    whole [64, K] ones spilled 1.3-1.9 KB a thread on sm_90a in 3xTF32)."""
    KH: tl.constexpr = K // 2
    i_nh = tl.program_id(0)
    i_v = tl.program_id(1)
    i_n = (i_nh // H).to(tl.int64)
    i_h = i_nh % H
    o_r = tl.arange(0, 64)
    o_a = tl.arange(0, KH)
    o_b = KH + o_a
    o_v = i_v * BV + tl.arange(0, BV)
    nb = T // 64
    if HAS_DHT:  # [N, H, K, V] (VK: [N, H, V, K])
        d0 = dht_ptr + (i_n * H + i_h) * K * V
        if STATE_VK:
            dSa = tl.load(d0 + o_v[:, None] * K + o_a[None, :]).to(tl.float32)
            dSb = tl.load(d0 + o_v[:, None] * K + o_b[None, :]).to(tl.float32)
        else:
            dSa = tl.load(d0 + o_v[:, None] + o_a[None, :] * V).to(tl.float32)
            dSb = tl.load(d0 + o_v[:, None] + o_b[None, :] * V).to(tl.float32)
    else:
        dSa = tl.zeros([BV, KH], dtype=tl.float32)
        dSb = tl.zeros([BV, KH], dtype=tl.float32)
    for ib in range(0, nb):
        b = nb - 1 - ib
        gb = (i_n * nb + b) * H + i_h
        e0 = ends_ptr + gb * V * K + o_v[:, None] * K
        tl.store(e0 + o_a[None, :], dSa)
        tl.store(e0 + o_b[None, :], dSb)
        rows = i_n * T + b * 64 + o_r
        tok = (rows[None, :] * H + i_h) * V + o_v[:, None]
        dot_ = tl.load(do_ptr + tok).to(tl.float32)
        k0 = (rows[:, None] * H + i_h) * K
        mqk = tl.load(mqk_ptr + gb * 4096 + o_r[:, None] * 64 + o_r[None, :])
        dut = (_mm(dSa, tl.trans(tl.load(ke_ptr + k0 + o_a[None, :])), PREC)
               + _mm(dSb, tl.trans(tl.load(ke_ptr + k0 + o_b[None, :])), PREC)
               + _mm_do(dot_, mqk, PREC))
        tl.store(du_ptr + tok, dut)
        ga = tl.load(g_ptr + gb * K + o_a)
        gbk = tl.load(g_ptr + gb * K + o_b)
        dSa = (dSa * ga[None, :] + _mm_do(dot_, tl.load(qg_ptr + k0 + o_a[None, :]), PREC)
               - _mm(dut, tl.load(w_ptr + k0 + o_a[None, :]), PREC))
        dSb = (dSb * gbk[None, :] + _mm_do(dot_, tl.load(qg_ptr + k0 + o_b[None, :]), PREC)
               - _mm(dut, tl.load(w_ptr + k0 + o_b[None, :]), PREC))


@triton.jit
def _rows16(ptr, rows, i_h, H, o_k, K: tl.constexpr):
    """A chunk's [16, K] rows of a token-major [T, H, K] tensor, fp32."""
    return tl.load(ptr + (rows[:, None] * H + i_h) * K + o_k[None, :]).to(tl.float32)


@triton.jit
def _put16(ptr, base, r, c, t):
    """Block (r, c) of a [64, 64] matrix at ``base``."""
    o = tl.arange(0, 16)
    tl.store(ptr + base + (16 * r + o[:, None]) * 64 + 16 * c + o[None, :], t)


@triton.jit
def _kend16(kend_ptr, klo_ptr, rows, i_h, H, o_k, K: tl.constexpr):
    """KEND's [16, len(o_k)] rows whole: its fp16 part and KLO, fp32."""
    return _rows16(kend_ptr, rows, i_h, H, o_k, K) + _rows16(klo_ptr, rows, i_h, H, o_k, K)


@triton.jit
def _put_rows(w64_ptr, qg64_ptr, ke64_ptr, r, i_h, H, o_k, K: tl.constexpr, y, q, e):
    """A chunk's rows of W₆₄, QG₆₄ and KEND₆₄."""
    ofs = (r[:, None] * H + i_h) * K + o_k[None, :]
    tl.store(w64_ptr + ofs, y)
    tl.store(qg64_ptr + ofs, q)
    tl.store(ke64_ptr + ofs, e)


@triton.jit
def _xt(a, b, PREC: tl.constexpr):
    """a @ b^T."""
    return tl.dot(a, tl.trans(b), input_precision=PREC)


@triton.jit
def prep64_kernel(w_ptr, qg_ptr, kend_ptr, klo_ptr, mqk_ptr, gamma_ptr, w64_ptr, qg64_ptr,
                  ke64_ptr, mqk64_ptr, g64_ptr, x64_ptr, T, H, K: tl.constexpr,
                  BK: tl.constexpr, PREC: tl.constexpr):
    """One (64-token block, head) of fixed-length input: the 64-token operands from stage 1's
    four 16-token chunks (module docstring; training.md "A 64-token reverse pass"). Decays
    between chunks as products of the chunks' γ, never a quotient (no overflow): E(c', c) =
    Π_{c' < j < c} γ_j, D_c = E(-1, c). Two passes over ``BK`` key columns at a time (the
    whole rows at once spilled 23 KB a thread on sm_90a): X's and MQK₆₄'s strictly lower
    blocks, sums over the key columns; then W₆₄ by block forward substitution, (I + X) W₆₄ =
    [W_c D_c], column by column, with QG₆₄, KEND₆₄ and γ₆₄. The [64, 64] outputs' upper blocks
    are the host's zeros."""
    i_b = tl.program_id(0).to(tl.int64)     # global block: sequence · blocks + block
    i_h = tl.program_id(1)
    o_r = tl.arange(0, 16)
    r0 = i_b * 64 + o_r                     # fixed length: block i_b's rows start at 64 i_b
    r1, r2, r3 = r0 + 16, r0 + 32, r0 + 48
    cc = i_b * 4 * H + i_h                  # chunk-and-head of the block's first chunk
    z = tl.zeros([16, 16], dtype=tl.float32)
    X10, X21, X32, X20, X31, X30 = z, z, z, z, z, z
    N10, N21, N32, N20, N31, N30 = z, z, z, z, z, z
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        W1 = _rows16(w_ptr, r1, i_h, H, o_k, K)
        W2 = _rows16(w_ptr, r2, i_h, H, o_k, K)
        W3 = _rows16(w_ptr, r3, i_h, H, o_k, K)
        Q1 = _rows16(qg_ptr, r1, i_h, H, o_k, K)
        Q2 = _rows16(qg_ptr, r2, i_h, H, o_k, K)
        Q3 = _rows16(qg_ptr, r3, i_h, H, o_k, K)
        E0 = _kend16(kend_ptr, klo_ptr, r0, i_h, H, o_k, K)
        E1 = _kend16(kend_ptr, klo_ptr, r1, i_h, H, o_k, K)
        E2 = _kend16(kend_ptr, klo_ptr, r2, i_h, H, o_k, K)
        G1 = tl.load(gamma_ptr + (cc + H) * K + o_k)[None, :]
        G2 = tl.load(gamma_ptr + (cc + 2 * H) * K + o_k)[None, :]
        X10 += _xt(W1, E0, PREC)
        X21 += _xt(W2, E1, PREC)
        X32 += _xt(W3, E2, PREC)
        X20 += _xt(W2 * G1, E0, PREC)
        X31 += _xt(W3 * G2, E1, PREC)
        X30 += _xt(W3 * (G1 * G2), E0, PREC)
        N10 += _xt(Q1, E0, PREC)
        N21 += _xt(Q2, E1, PREC)
        N32 += _xt(Q3, E2, PREC)
        N20 += _xt(Q2 * G1, E0, PREC)
        N31 += _xt(Q3 * G2, E1, PREC)
        N30 += _xt(Q3 * (G1 * G2), E0, PREC)
    base = (i_b * H + i_h) * 4096
    _put16(x64_ptr, base, 1, 0, X10)
    _put16(x64_ptr, base, 2, 1, X21)
    _put16(x64_ptr, base, 3, 2, X32)
    _put16(x64_ptr, base, 2, 0, X20)
    _put16(x64_ptr, base, 3, 1, X31)
    _put16(x64_ptr, base, 3, 0, X30)
    _put16(mqk64_ptr, base, 1, 0, N10)
    _put16(mqk64_ptr, base, 2, 1, N21)
    _put16(mqk64_ptr, base, 3, 2, N32)
    _put16(mqk64_ptr, base, 2, 0, N20)
    _put16(mqk64_ptr, base, 3, 1, N31)
    _put16(mqk64_ptr, base, 3, 0, N30)
    mq = mqk_ptr + cc * 256 + o_r[:, None] * 16 + o_r[None, :]
    for j in tl.static_range(4):
        _put16(mqk64_ptr, base, j, j, tl.load(mq + j * H * 256).to(tl.float32))
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        G0 = tl.load(gamma_ptr + cc * K + o_k)
        G1 = tl.load(gamma_ptr + (cc + H) * K + o_k)
        G2 = tl.load(gamma_ptr + (cc + 2 * H) * K + o_k)
        G3 = tl.load(gamma_ptr + (cc + 3 * H) * K + o_k)
        D2 = G0 * G1
        D3 = D2 * G2
        G23 = G2 * G3
        Y0 = _rows16(w_ptr, r0, i_h, H, o_k, K)
        Y1 = (_rows16(w_ptr, r1, i_h, H, o_k, K) * G0[None, :]
              - tl.dot(X10, Y0, input_precision=PREC))
        Y2 = (_rows16(w_ptr, r2, i_h, H, o_k, K) * D2[None, :]
              - tl.dot(X20, Y0, input_precision=PREC) - tl.dot(X21, Y1, input_precision=PREC))
        Y3 = (_rows16(w_ptr, r3, i_h, H, o_k, K) * D3[None, :]
              - tl.dot(X30, Y0, input_precision=PREC) - tl.dot(X31, Y1, input_precision=PREC)
              - tl.dot(X32, Y2, input_precision=PREC))
        _put_rows(w64_ptr, qg64_ptr, ke64_ptr, r0, i_h, H, o_k, K, Y0,
                  _rows16(qg_ptr, r0, i_h, H, o_k, K),
                  _kend16(kend_ptr, klo_ptr, r0, i_h, H, o_k, K) * (G1 * G23)[None, :])
        _put_rows(w64_ptr, qg64_ptr, ke64_ptr, r1, i_h, H, o_k, K, Y1,
                  _rows16(qg_ptr, r1, i_h, H, o_k, K) * G0[None, :],
                  _kend16(kend_ptr, klo_ptr, r1, i_h, H, o_k, K) * G23[None, :])
        _put_rows(w64_ptr, qg64_ptr, ke64_ptr, r2, i_h, H, o_k, K, Y2,
                  _rows16(qg_ptr, r2, i_h, H, o_k, K) * D2[None, :],
                  _kend16(kend_ptr, klo_ptr, r2, i_h, H, o_k, K) * G3[None, :])
        _put_rows(w64_ptr, qg64_ptr, ke64_ptr, r3, i_h, H, o_k, K, Y3,
                  _rows16(qg_ptr, r3, i_h, H, o_k, K) * D3[None, :],
                  _kend16(kend_ptr, klo_ptr, r3, i_h, H, o_k, K))
        tl.store(g64_ptr + (i_b * H + i_h) * K + o_k, D3 * G3)


@triton.jit
def solve64_kernel(du64_ptr, x64_ptr, du_ptr, H, V: tl.constexpr, BV: tl.constexpr,
                   PREC: tl.constexpr):
    """One (64-token block, head, value block): the chain's dU from dU₆₄, (I + X)^T dU =
    dU₆₄ by block back substitution, in the transposed form (dU_c^T = dU₆₄_c^T -
    Σ_{c'' > c} dU_c''^T X_{c'', c})."""
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    i_v = tl.program_id(2)
    o_r = tl.arange(0, 16)
    o_v = i_v * BV + tl.arange(0, BV)
    base = (i_b * H + i_h) * 4096
    xo = x64_ptr + base + o_r[:, None] * 64 + o_r[None, :]
    X10 = tl.load(xo + 1024)
    X20 = tl.load(xo + 2048)
    X30 = tl.load(xo + 3072)
    X21 = tl.load(xo + 2048 + 16)
    X31 = tl.load(xo + 3072 + 16)
    X32 = tl.load(xo + 3072 + 32)
    tok = ((i_b * 64 + o_r)[None, :] * H + i_h) * V + o_v[:, None]   # [BV, 16], chunk 0
    step = 16 * H * V
    d0 = tl.load(du64_ptr + tok)
    d1 = tl.load(du64_ptr + tok + step)
    d2 = tl.load(du64_ptr + tok + 2 * step)
    d3 = tl.load(du64_ptr + tok + 3 * step)
    u3 = d3
    u2 = d2 - tl.dot(u3, X32, input_precision=PREC)
    u1 = d1 - tl.dot(u2, X21, input_precision=PREC) - tl.dot(u3, X31, input_precision=PREC)
    u0 = (d0 - tl.dot(u1, X10, input_precision=PREC) - tl.dot(u2, X20, input_precision=PREC)
          - tl.dot(u3, X30, input_precision=PREC))
    tl.store(du_ptr + tok, u0)
    tl.store(du_ptr + tok + step, u1)
    tl.store(du_ptr + tok + 2 * step, u2)
    tl.store(du_ptr + tok + 3 * step, u3)



def prep64(ops, B, T, H, precision="tf32x3", num_warps=4, block_k=PREP_BK):
    """The 64-token operands by ``prep64_kernel``: ((W₆₄, QG₆₄, KEND₆₄ like q, fp32; MQK₆₄
    [blocks, H, 64, 64]; γ₆₄ [blocks, H, K]), X [blocks, H, 64, 64])."""
    w, qg, kend, klo, _, mqk, gamma = ops
    K, nb = w.shape[-1], B * T // BB
    f32 = dict(device=w.device, dtype=torch.float32)
    w64, qg64, ke64 = torch.empty((3, B, T, H, K), **f32).unbind(0)
    mqk64, x64 = torch.zeros((2, nb, H, BB, BB), **f32).unbind(0)
    g64 = torch.empty((nb, H, K), **f32)
    prep64_kernel[(nb, H)](w, qg, kend, klo, mqk, gamma, w64, qg64, ke64, mqk64, g64, x64, T,
                           H, K=K, BK=min(block_k, K), PREC=precision, num_warps=num_warps)
    return (w64, qg64, ke64, mqk64, g64), x64


def ds64(do, w64, qg64, ke64, mqk64, g64, dht, *, state_vk=False, block_v, num_warps,
         precision, num_stages=1):
    """``ds64_kernel``: (the gradient after every block, [blocks, H, V, K]; dU₆₄ like do)."""
    B, T, H, V = do.shape
    K = w64.shape[-1]
    ends = torch.empty((B * (T // BB), H, V, K), device=do.device, dtype=torch.float32)
    du = torch.empty(do.shape, device=do.device, dtype=torch.float32)
    ds64_kernel[(B * H, V // block_v)](
        do, w64, qg64, ke64, mqk64, g64, dht if dht is not None else g64, ends, du, T, H,
        K=K, V=V, BV=block_v, HAS_DHT=dht is not None, STATE_VK=state_vk, PREC=precision,
        num_warps=num_warps, num_stages=num_stages)
    return ends, du


def solve64(du64, x64, *, block_v=64, precision="tf32x3", num_warps=4):
    """``solve64_kernel``: the chain's dU (like dU₆₄)."""
    B, T, H, V = du64.shape
    du = torch.empty_like(du64)
    solve64_kernel[(B * T // BB, H, V // block_v)](du64, x64, du, H, V=V, BV=block_v,
                                                   PREC=precision, num_warps=num_warps)
    return du


def fits(varlen: bool, T: int, K: int, V: int, block_v: int) -> bool:
    """Whether the 64-token pass takes the call: fixed length, T a multiple of 64, K a power of
    two from 32 to 128 (dS in halves of at least 16 key columns; more spills), ``block_v``
    value columns dividing V."""
    return (not varlen and T % BB == 0 and K in (32, 64, 128) and block_v >= 16
            and V % block_v == 0)


def chunk_kda_bwd_recurrent64(do, ops, *, dht, state_vk, block_v=64, num_warps=8,
                              precision="mixed", num_stages=1):
    """The 64-token dS pass (module docstring) on stage 1's ``ops`` for fixed-length ``do``
    ([B, T, H, V], T % 64 == 0): (dU like do, fp32; the gradient after every block, [B · T/64,
    H, V, K] fp32), as ``chunk_recurrent_bwd.chunk_kda_bwd_recurrent`` returns them."""
    B, T, H, V = do.shape
    aux = precision if precision in ("tf32", "tf32x3", "ieee") else "tf32x3"
    ops64, x64 = prep64(ops, B, T, H, aux)
    ends, du64 = ds64(do, *ops64, dht, state_vk=state_vk, block_v=block_v,
                      num_warps=num_warps, precision=precision, num_stages=num_stages)
    return solve64(du64, x64, block_v=min(64, V), precision=aux), ends
