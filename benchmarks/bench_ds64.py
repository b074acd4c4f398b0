"""The 64-token dS pass, measured before it is built into the backward (issue 40;
docs/training.md "A 64-token reverse pass"): prototype kernels, in this script, against the
backward's 16-token dS pass and fla's 64-token one (``chunk_gated_delta_rule_bwd_dhu``) at the
same shapes, in one process.

    python benchmarks/bench_ds64.py [--shapes T1024_H16,T4096_H16] [--tiles 64x4x1] [--json F]
    TRITON_INTERPRET=1 python benchmarks/bench_ds64.py --check   (CPU: correctness only)

The question: the 64-token form takes the serial dependency from four 16-token steps a block
to one step of [BV, K] x [K, 64] products, but its operands (W₆₄ from a 64 x 64 solve, KEND₆₄
and QG₆₄ scaled by in-block decays) are fp32 values, not the fp16 ones whose tf32 products are
exact, so it needs 3xTF32 products to keep this backward's accuracy, where fla's runs bf16.
Does it, in plain Triton, run near fla's pass, and how far below the chain's time? Three
kernels, each pass the chain's equal in what it hands on (the chain's dU and the gradient
after every block, which the blocks and dV kernels take):

1. ``prep64_kernel``, chunk-parallel over (block, head): the 64-token operands from stage 1's
   16-token ones (X's blocks, W₆₄ by block forward substitution, QG₆₄, KEND₆₄, MQK₆₄, γ₆₄);
2. ``ds64_kernel``, serial over the blocks of a (sequence, head, value block); from the
   gradient dS'^T after a block, in the transposed form of ``kernels/chunk_recurrent_bwd.py``:

       dU₆₄^T = dS'^T KEND₆₄^T + dO^T MQK₆₄                 [BV, 64]
       dS^T   = dS'^T diag(γ₆₄) + dO^T QG₆₄ - dU₆₄^T W₆₄     [BV, K]

3. ``solve64_kernel``, parallel: the chain's dU from dU₆₄, (I + X)^T dU = dU₆₄.

Fixed-length input with T % 64 == 0 only (a prototype: no varlen, no partial block). Rows:
each pass's GPU time (``triton.testing.do_bench``, median), the 64-token pass whole at each
launch and precision and its kernels alone, the 16-token pass (serial and ``plan_reverse``'s
split), fla's; each pass's block-end gradients and dU against the fp64 chain on the same
operands, two input families; the byte floors beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

from kdalab.inputs.sequences import draw, preset
from kdalab.kernels.api import _sm_count, prepare
from kdalab.kernels.chunk_recurrent_bwd import CKC, chunk_kda_bwd_recurrent
from kdalab.kernels.config import KernelConfig
from kdalab.kernels.contract import prefill_problem
from kdalab.kernels.launch_plan import ds_value_block, plan_reverse

BT, BB = 16, 64  # the chain's chunk, the block
#: name -> (B, T, H); K = V = 128
SHAPES = {"T1024_H16": (1, 1024, 16), "T4096_H16": (1, 4096, 16),
          "T8192_H64": (1, 8192, 64), "B8_T4096_H32": (8, 4096, 32)}
#: input families: model_like's own gate averages -3.2 a step (a block's decay e^-200: the
#: gradient after a block hardly reaches the one before, and the two forms agree whatever
#: their cross-block terms); its raw gate at N(-6, 1) decays -0.004 to -0.03 a step, so the
#: cross-block terms carry the result; collinear keys with β near 1 are the accuracy corner
FAMILIES = {"weak": ("model_like", dict(g_mean=-6.0)), "collinear": ("collinear", {})}
#: the launches timed: (form, precision, BV, warps, stages); form "path": ``path64`` (its
#: serial kernel at the launch), "fused": ``fused64``; chosen by their sm_90a compiles (``--sm90``:
#: the fewest spills of each precision; stages 2, Triton's software pipeline fetching the next
#: block's operands, which do not depend on dS, during this one); tf32 is the precision's price
LAUNCHES = (("path", "mixed", 64, 8, 1), ("path", "mixed", 128, 8, 1),
            ("path", "mixed", 32, 4, 1), ("path", "split", 64, 8, 1),
            ("path", "split", 128, 8, 1), ("path", "split", 32, 4, 1),
            ("path", "tf32x3", 128, 8, 1), ("path", "tf32x3", 64, 4, 2),
            ("path", "tf32", 128, 8, 1), ("path", "tf32", 64, 8, 1),
            ("fused", "tf32x3", 64, 8, 1), ("fused", "tf32", 64, 8, 1))
#: ``prep64_kernel``'s key columns a pass (sm_90a: 16, 256 bytes of spills a thread; 32, 888)
PREP_BK = 16


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
                HAS_DHT: tl.constexpr, PREC: tl.constexpr):
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
    if HAS_DHT:  # [N, H, K, V]
        d0 = dht_ptr + (i_n * H + i_h) * K * V + o_v[:, None]
        dSa = tl.load(d0 + o_a[None, :] * V)
        dSb = tl.load(d0 + o_b[None, :] * V)
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


def ds64(do, w64, qg64, ke64, mqk64, g64, dht, *, block_v, num_warps, precision,
         num_stages=1):
    B, T, H, V = do.shape
    K = w64.shape[-1]
    ends = torch.empty((B * (T // BB), H, V, K), device=do.device, dtype=torch.float32)
    du = torch.empty(do.shape, device=do.device, dtype=torch.float32)
    ds64_kernel[(B * H, V // block_v)](
        do, w64, qg64, ke64, mqk64, g64, dht if dht is not None else g64, ends, du, T, H,
        K=K, V=V, BV=block_v, HAS_DHT=dht is not None, PREC=precision, num_warps=num_warps,
        num_stages=num_stages)
    return ends, du


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
        E0 = _rows16(kend_ptr, r0, i_h, H, o_k, K) + _rows16(klo_ptr, r0, i_h, H, o_k, K)
        E1 = _rows16(kend_ptr, r1, i_h, H, o_k, K) + _rows16(klo_ptr, r1, i_h, H, o_k, K)
        E2 = _rows16(kend_ptr, r2, i_h, H, o_k, K) + _rows16(klo_ptr, r2, i_h, H, o_k, K)
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


@triton.jit
def _t16(ptr, rows, i_h, H, o_v, V: tl.constexpr):
    """A chunk's [BV, 16] tile (transposed) of a token-major [T, H, V] tensor, and its
    offsets."""
    tok = (rows[None, :] * H + i_h) * V + o_v[:, None]
    return tl.load(ptr + tok).to(tl.float32), tok


@triton.jit
def fused64_kernel(do_ptr, w_ptr, qg_ptr, kend_ptr, klo_ptr, mqk_ptr, gamma_ptr, dht_ptr,
                   ends_ptr, du_ptr, T, H, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                   HAS_DHT: tl.constexpr, PREC: tl.constexpr):
    """The 64-token dS pass in one serial kernel over (sequence, head, value block), its
    operands formed in the program from stage 1's 16-token ones (``prep64_kernel``'s algebra,
    kept in [16, K] and [16, 16] pieces), the chain's dU solved in it (``solve64_kernel``'s):
    the 16-token pass's reads and writes. Per block, in 16-token pieces c of the transposed
    form (A_c^T = dU₆₄_c^T; F_c = KEND₆₄_c, P_c = QG₆₄_c, Y_c = W₆₄_c; N_{c'c} = MQK₆₄'s
    blocks):

        A_c^T = dS'^T F_c^T + Σ_{c' >= c} dO_c'^T N_{c'c},
        dS^T  = dS'^T diag(γ₆₄) + Σ_c (dO_c^T P_c - A_c^T Y_c)

    on the serial path two levels of products a block (dS' to the A's, the A's to dS); the
    operands' forming and the solve do not depend on dS."""
    i_nh = tl.program_id(0)
    i_v = tl.program_id(1)
    i_n = (i_nh // H).to(tl.int64)
    i_h = i_nh % H
    o_r = tl.arange(0, 16)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    nb = T // 64
    if HAS_DHT:  # [N, H, K, V]
        dSt = tl.load(dht_ptr + ((i_n * H + i_h) * K + o_k[None, :]) * V + o_v[:, None])
    else:
        dSt = tl.zeros([BV, K], dtype=tl.float32)
    for ib in range(0, nb):
        b = nb - 1 - ib
        gb = (i_n * nb + b) * H + i_h
        tl.store(ends_ptr + gb * V * K + o_v[:, None] * K + o_k[None, :], dSt)
        r0 = i_n * T + b * 64 + o_r
        r1 = r0 + 16
        r2 = r0 + 32
        r3 = r0 + 48
        W0 = _rows16(w_ptr, r0, i_h, H, o_k, K)
        W1 = _rows16(w_ptr, r1, i_h, H, o_k, K)
        W2 = _rows16(w_ptr, r2, i_h, H, o_k, K)
        W3 = _rows16(w_ptr, r3, i_h, H, o_k, K)
        E0 = _rows16(kend_ptr, r0, i_h, H, o_k, K) + _rows16(klo_ptr, r0, i_h, H, o_k, K)
        E1 = _rows16(kend_ptr, r1, i_h, H, o_k, K) + _rows16(klo_ptr, r1, i_h, H, o_k, K)
        E2 = _rows16(kend_ptr, r2, i_h, H, o_k, K) + _rows16(klo_ptr, r2, i_h, H, o_k, K)
        E3 = _rows16(kend_ptr, r3, i_h, H, o_k, K) + _rows16(klo_ptr, r3, i_h, H, o_k, K)
        cc = (i_n * nb + b) * 4 * H + i_h
        G0 = tl.load(gamma_ptr + cc * K + o_k)
        G1 = tl.load(gamma_ptr + (cc + H) * K + o_k)
        G2 = tl.load(gamma_ptr + (cc + 2 * H) * K + o_k)
        G3 = tl.load(gamma_ptr + (cc + 3 * H) * K + o_k)
        D2 = G0 * G1
        D3 = D2 * G2
        G12 = G1 * G2
        G23 = G2 * G3
        X10 = _xt(W1, E0, PREC)
        X21 = _xt(W2, E1, PREC)
        X32 = _xt(W3, E2, PREC)
        X20 = _xt(W2 * G1[None, :], E0, PREC)
        X31 = _xt(W3 * G2[None, :], E1, PREC)
        X30 = _xt(W3 * G12[None, :], E0, PREC)
        Y0 = W0
        Y1 = W1 * G0[None, :] - tl.dot(X10, Y0, input_precision=PREC)
        Y2 = (W2 * D2[None, :] - tl.dot(X20, Y0, input_precision=PREC)
              - tl.dot(X21, Y1, input_precision=PREC))
        Y3 = (W3 * D3[None, :] - tl.dot(X30, Y0, input_precision=PREC)
              - tl.dot(X31, Y1, input_precision=PREC) - tl.dot(X32, Y2, input_precision=PREC))
        # the A's: dS' through KEND₆₄, dO through MQK₆₄ (its diagonal blocks stage 1's MQK)
        do0, t0 = _t16(do_ptr, r0, i_h, H, o_v, V)
        do1, t1 = _t16(do_ptr, r1, i_h, H, o_v, V)
        do2, t2 = _t16(do_ptr, r2, i_h, H, o_v, V)
        do3, t3 = _t16(do_ptr, r3, i_h, H, o_v, V)
        mq = mqk_ptr + cc * 256 + o_r[:, None] * 16 + o_r[None, :]
        A0 = (_xt(dSt, E0 * (G1 * G23)[None, :], PREC)
              + tl.dot(do0, tl.load(mq).to(tl.float32), input_precision=PREC))
        A1 = (_xt(dSt, E1 * G23[None, :], PREC)
              + tl.dot(do1, tl.load(mq + H * 256).to(tl.float32), input_precision=PREC))
        A2 = (_xt(dSt, E2 * G3[None, :], PREC)
              + tl.dot(do2, tl.load(mq + 2 * H * 256).to(tl.float32), input_precision=PREC))
        A3 = (_xt(dSt, E3, PREC)
              + tl.dot(do3, tl.load(mq + 3 * H * 256).to(tl.float32), input_precision=PREC))
        Q0 = _rows16(qg_ptr, r0, i_h, H, o_k, K)
        Q1 = _rows16(qg_ptr, r1, i_h, H, o_k, K)
        Q2 = _rows16(qg_ptr, r2, i_h, H, o_k, K)
        Q3 = _rows16(qg_ptr, r3, i_h, H, o_k, K)
        A0 += (tl.dot(do1, _xt(Q1, E0, PREC), input_precision=PREC)
               + tl.dot(do2, _xt(Q2 * G1[None, :], E0, PREC), input_precision=PREC)
               + tl.dot(do3, _xt(Q3 * G12[None, :], E0, PREC), input_precision=PREC))
        A1 += (tl.dot(do2, _xt(Q2, E1, PREC), input_precision=PREC)
               + tl.dot(do3, _xt(Q3 * G2[None, :], E1, PREC), input_precision=PREC))
        A2 += tl.dot(do3, _xt(Q3, E2, PREC), input_precision=PREC)
        # the chain's dU, (I + X)^T dU = A (``solve64_kernel``)
        u3 = A3
        u2 = A2 - tl.dot(u3, X32, input_precision=PREC)
        u1 = A1 - tl.dot(u2, X21, input_precision=PREC) - tl.dot(u3, X31, input_precision=PREC)
        u0 = (A0 - tl.dot(u1, X10, input_precision=PREC)
              - tl.dot(u2, X20, input_precision=PREC) - tl.dot(u3, X30, input_precision=PREC))
        tl.store(du_ptr + t0, u0)
        tl.store(du_ptr + t1, u1)
        tl.store(du_ptr + t2, u2)
        tl.store(du_ptr + t3, u3)
        dSt = (dSt * (D3 * G3)[None, :]
               + tl.dot(do0, Q0, input_precision=PREC)
               + tl.dot(do1, Q1 * G0[None, :], input_precision=PREC)
               + tl.dot(do2, Q2 * D2[None, :], input_precision=PREC)
               + tl.dot(do3, Q3 * D3[None, :], input_precision=PREC)
               - tl.dot(A0, Y0, input_precision=PREC) - tl.dot(A1, Y1, input_precision=PREC)
               - tl.dot(A2, Y2, input_precision=PREC) - tl.dot(A3, Y3, input_precision=PREC))


def fused64(c, do, dht, B, T, H, *, block_v, num_warps, num_stages=1, precision="tf32x3"):
    """``fused64_kernel``: (the chain's dU, the block-end gradients), as the 16-token pass."""
    w, qg, kend, klo, _, mqk, gamma = c.ops
    V, K = do.shape[-1], w.shape[-1]
    ends = torch.empty((B * (T // BB), H, V, K), device=do.device, dtype=torch.float32)
    du = torch.empty(do.shape, device=do.device, dtype=torch.float32)
    fused64_kernel[(B * H, V // block_v)](
        do, w, qg, kend, klo, mqk, gamma, dht if dht is not None else gamma, ends, du, T, H,
        K=K, V=V, BV=block_v, HAS_DHT=dht is not None, PREC=precision, num_warps=num_warps,
        num_stages=num_stages)
    return du, ends


def prep64(ops, B, T, H, precision="tf32x3", num_warps=4, block_k=PREP_BK):
    """The 64-token operands by ``prep64_kernel``: (W₆₄, QG₆₄, KEND₆₄, MQK₆₄, γ₆₄) as
    ``operands64`` returns them, and X [blocks, H, 64, 64]."""
    w, qg, kend, klo, _, mqk, gamma = ops
    K, nb = w.shape[-1], B * T // BB
    f32 = dict(device=w.device, dtype=torch.float32)
    w64, qg64, ke64 = torch.empty((3, B, T, H, K), **f32).unbind(0)
    mqk64, x64 = torch.zeros((2, nb, H, BB, BB), **f32).unbind(0)
    g64 = torch.empty((nb, H, K), **f32)
    prep64_kernel[(nb, H)](w, qg, kend, klo, mqk, gamma, w64, qg64, ke64, mqk64, g64, x64, T,
                           H, K=K, BK=min(block_k, K), PREC=precision, num_warps=num_warps)
    return (w64, qg64, ke64, mqk64, g64), x64


def solve64(du64, x64, *, block_v=64, precision="tf32x3", num_warps=4):
    B, T, H, V = du64.shape
    du = torch.empty_like(du64)
    solve64_kernel[(B * T // BB, H, V // block_v)](du64, x64, du, H, V=V, BV=block_v,
                                                   PREC=precision, num_warps=num_warps)
    return du


def path64(c, do, dht, B, T, H, *, block_v, num_warps, num_stages=1, precision="tf32x3"):
    """The whole 64-token dS pass: the operands, the serial pass, the solve. Returns (the
    chain's dU, the block-end gradients), as the 16-token pass."""
    # the parallel kernels' products
    aux = "tf32x3" if precision in ("split", "mixed") else precision
    ops64, x64 = prep64(c.ops, B, T, H, aux)
    ends, du64 = ds64(do, *ops64, dht, block_v=block_v, num_warps=num_warps,
                      precision=precision, num_stages=num_stages)
    return solve64(du64, x64, block_v=min(64, do.shape[-1]), precision=aux), ends


def stage1(B, T, H, K, V, device, family="weak", seed=0):
    """Inputs of ``FAMILIES[family]`` (bf16 on the GPU, fp32 in the interpreter; the
    lower-bounded gate) and stage 1's recompute as the backward makes it
    (``autograd.backward``: 3xTF32 products), with dO and dHT drawn."""
    name, changes = FAMILIES[family]
    spec = preset(name, T=T, batch=B, seqlens=None, heads=H, K=K, V=V, lower_bound=-5.0,
                  initial_state="none", **changes)
    x = draw(spec, seed, device)
    if device == "cpu":
        x = {n: t.float() if torch.is_tensor(t) and t.is_floating_point() else t
             for n, t in x.items()}
    q, k, v, g, beta = (x[n].contiguous() for n in ("q", "k", "v", "g", "beta"))
    A_log, dt_bias = x["A_log"], x["dt_bias"].reshape(-1).contiguous()
    config = KernelConfig()
    p = prefill_problem(q, k, v, g, beta, scale=None, initial_state=None, A_log=A_log,
                        dt_bias=dt_bias, gate="raw", lower_bound=-5.0, cu_seqlens=None,
                        use_qk_l2norm=True, beta_is_logits=True, state_layout="KV",
                        config=config)
    c = prepare(q, k, g, beta, A_log, dt_bias, p, None, config, precision="tf32x3")
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(B, T, H, V, generator=gen).to(device, v.dtype)
    dht = torch.randn(B, H, K, V, generator=gen).to(device)
    return c, do, dht


def operands64(ops, B, T, H, dtype=torch.float32):
    """The 64-token operands from stage 1's 16-token ones (training.md), fp64 then fp32:
    W₆₄, QG₆₄, KEND₆₄ token-major like q; MQK₆₄ [blocks, H, 64, 64]; γ₆₄ [blocks, H, K]."""
    w, qg, kend, klo, _, mqk, gamma = ops
    K, nb, C = w.shape[-1], T // BB, BB // BT
    f = dict(dtype=torch.float64)

    def tok(x):  # [B, T, H, K] -> [B, nb, H, C, 16, K]
        return x.to(**f).view(B, nb, C, BT, H, K).permute(0, 1, 4, 2, 3, 5)

    W, QG, KE = tok(w), tok(qg), tok(kend.to(**f) + klo.to(**f))
    G = gamma.to(**f).view(B, nb, C, H, K).permute(0, 1, 3, 2, 4)        # [B, nb, H, C, K]
    M16 = mqk.to(**f).view(B, nb, C, H, BT, BT).permute(0, 1, 3, 2, 4, 5)
    one = torch.ones_like(G[..., 0, :])

    def decay(lo, hi):  # Π_{lo <= j < hi} γ_j
        out = one
        for j in range(lo, hi):
            out = out * G[..., j, :]
        return out

    X = torch.zeros(B, nb, H, BB, BB, device=w.device, **f)
    M = torch.zeros_like(X)
    for c in range(C):
        rc = slice(c * BT, (c + 1) * BT)
        M[..., rc, rc] = M16[..., c, :, :]
        for cp in range(c):
            e = decay(cp + 1, c)[..., None, :]
            rp = slice(cp * BT, (cp + 1) * BT)
            X[..., rc, rp] = (W[..., c, :, :] * e) @ KE[..., cp, :, :].transpose(-1, -2)
            M[..., rc, rp] = (QG[..., c, :, :] * e) @ KE[..., cp, :, :].transpose(-1, -2)
    eye = torch.eye(BB, device=w.device, **f)
    rhs = torch.cat([W[..., c, :, :] * decay(0, c)[..., None, :] for c in range(C)], -2)
    W64 = torch.linalg.solve_triangular(eye + X, rhs, upper=False, unitriangular=True)
    QG64 = torch.cat([QG[..., c, :, :] * decay(0, c)[..., None, :] for c in range(C)], -2)
    KE64 = torch.cat([KE[..., c, :, :] * decay(c + 1, C)[..., None, :] for c in range(C)], -2)

    def rows(x):  # [B, nb, H, 64, K] -> [B, T, H, K]
        return x.permute(0, 1, 3, 2, 4).reshape(B, T, H, K).to(dtype).contiguous()

    return (rows(W64), rows(QG64), rows(KE64),
            M.reshape(B * nb, H, BB, BB).to(dtype).contiguous(),
            decay(0, C).reshape(B * nb, H, K).to(dtype).contiguous())


def chain_ends64(ops, do, dht, B, T, H):
    """The 16-token chain in fp64 on the same operands: (the gradient after every block,
    [blocks, H, V, K] (transposed as ``ends``); each chunk's dU, like dO)."""
    w, qg, kend, klo, _, mqk, gamma = ops
    K, V, nc = w.shape[-1], do.shape[-1], T // BT
    f = dict(dtype=torch.float64)
    W, QG = (x.to(**f).view(B, nc, BT, H, K).permute(0, 1, 3, 2, 4) for x in (w, qg))
    KE = (kend.to(**f) + klo.to(**f)).view(B, nc, BT, H, K).permute(0, 1, 3, 2, 4)
    M16 = mqk.to(**f).view(B, nc, H, BT, BT)
    G = gamma.to(**f).view(B, nc, H, K)
    dO = do.to(**f).view(B, nc, BT, H, V).permute(0, 1, 3, 2, 4)
    dS = dht.to(**f)                                                      # [B, H, K, V]
    ends = torch.empty(B, T // BB, H, V, K, device=do.device, **f)
    dUs = torch.empty(B, nc, H, BT, V, device=do.device, **f)
    for c in reversed(range(nc)):
        if (c + 1) % (BB // BT) == 0:
            ends[:, c // (BB // BT)] = dS.transpose(-1, -2)
        dU = KE[:, c] @ dS + M16[:, c].transpose(-1, -2) @ dO[:, c]    # [B, H, 16, V]
        dUs[:, c] = dU
        dS = G[:, c][..., None] * dS + QG[:, c].transpose(-1, -2) @ dO[:, c] \
            - W[:, c].transpose(-1, -2) @ dU
    return (ends.reshape(B * (T // BB), H, V, K),
            dUs.permute(0, 1, 3, 2, 4).reshape(B, T, H, V))


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def chain_pass(c, do, dht, sms, split):
    """This backward's 16-token dS pass as ``autograd.backward`` launches it (serial, or
    ``plan_reverse``'s split)."""
    p, seqs = c.p, c.seqs
    H, K, V = p.H, p.K, p.V
    block_v, warps = min(128, V), 8
    serial_bv = ds_value_block(p.num_seqs * H, V, block_v, warps, sms, None)
    blocks, block_offsets, _ = seqs.segments(CKC)
    segments = None
    if split:
        L = plan_reverse(seqs.n_chunks, H, K, V, sms, block_v, serial_bv)
        if L > 0:
            segments = seqs.segments(-(-L // CKC) * CKC)
    return lambda: chunk_kda_bwd_recurrent(
        do, c.ops, dht=dht, state_vk=False, cu_seqlens=None, chunk_offsets=None,
        num_seqs=p.num_seqs, seq_order=None, n_blocks=blocks.shape[0],
        block_offsets=block_offsets, segments=segments, ds_block_v=serial_bv,
        block_v=block_v, num_warps=warps, sms=sms, ds_dtype=torch.float32, precision="tf32")


def fla_pass(B, T, H, K, V):
    """fla's 64-token dS pass (bf16 operands) on random inputs of the shape."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu

    gen = torch.Generator().manual_seed(1)
    r = lambda *s: (torch.randn(*s, generator=gen) * 0.1).cuda()  # noqa: E731
    q, k, w = (r(B, T, H, K).bfloat16() for _ in range(3))
    do, dv = (r(B, T, H, V).bfloat16() for _ in range(2))
    gk = -torch.rand(B, T, H, K, generator=gen).cuda().cumsum(1) * 0.01
    gk = gk.view(B, T // BB, BB, H, K)
    gk = (gk - gk[:, :, :1]).view(B, T, H, K).float().contiguous()
    dht = r(B, H, K, V).float()
    return lambda: chunk_gated_delta_rule_bwd_dhu(q=q, k=k, w=w, do=do, dv=dv, gk=gk,
                                                  dht=dht, scale=K ** -0.5, chunk_size=BB)


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def floors(B, T, H, K, V, bw):
    """Byte floors (ms at ``bw`` B/s) of each kernel: the serial one's (W₆₄, QG₆₄, KEND₆₄ fp32
    and MQK₆₄ read, dO bf16, dU₆₄ written fp32, the block-end gradients), the operands'
    (stage 1's W, QG, KEND, KLO fp16, MQK and γ read; W₆₄, QG₆₄, KEND₆₄, MQK₆₄, X, γ₆₄
    written), the solve's (dU₆₄ and X read, dU written); and the 16-token pass's, once over
    the tokens (its split reads them twice: summaries, then the pass)."""
    th = B * T * H
    ends = th // BB * V * K * 4
    serial = th * (3 * K * 4 + BB * 4 + V * 2 + V * 4) + ends
    prep = th * (4 * K * 2 + BT * 2 + K * 4 / BT) + th * (3 * K * 4 + 2 * BB * 4 + K * 4 / BB)
    solve = th * (2 * V * 4 + BB * 4)
    chain = th * (4 * K * 2 + BT * 2 + V * 2 + V * 4) + ends
    return {n: b / bw * 1e3 for n, b in (("serial64", serial), ("prep64", prep),
                                         ("solve64", solve), ("chain", chain))}


def check_cpu():
    """The interpreter (which multiplies fp32 exactly, 3xTF32 too): on stage 1's real operands
    (T 192, H 2, K 64: two passes of ``prep64_kernel``'s key columns; V 16), each family,
    ``prep64_kernel``'s operands against ``operands64``'s (fp64), and the block-end gradients
    and dU of the whole 64-token pass (operands, serial pass, solve; each precision), of the
    fused kernel and of the 16-token pass against the fp64 chain's."""
    B, T, H, K, V = 1, 192, 2, 64, 16
    errs = {}
    for family in FAMILIES:
        c, do, dht = stage1(B, T, H, K, V, "cpu", family)
        want_ends, want_du = chain_ends64(c.ops, do, dht, B, T, H)
        ref = operands64(c.ops, B, T, H, torch.float64)
        for name, got, r in zip(("W64", "QG64", "KEND64", "MQK64", "gamma64"),
                                prep64(c.ops, B, T, H)[0], ref):
            errs[f"{family} {name}"] = rel(got, r)
        for prec in ("tf32x3", "ieee", "split", "mixed"):
            du, ends = path64(c, do, dht, B, T, H, block_v=16, num_warps=4, precision=prec)
            errs[f"{family} ds64 {prec} ends"] = rel(ends, want_ends)
            errs[f"{family} ds64 {prec} dU"] = rel(du, want_du)
        du, ends = fused64(c, do, dht, B, T, H, block_v=16, num_warps=4)
        errs[f"{family} fused64 ends"] = rel(ends, want_ends)
        errs[f"{family} fused64 dU"] = rel(du, want_du)
        du, ends = chain_pass(c, do, dht, _sm_count(do.device), False)()
        errs[f"{family} chain ends"] = rel(ends, want_ends)
        errs[f"{family} chain dU"] = rel(du, want_du)
    print(json.dumps(errs))
    # fp32 rounding of the formed operands and of the sums is what is left (measured 2.6e-8 to
    # 5.3e-7); a wrong operand (KEND₆₄ 10 % off, the tests' probe) gives 8e-3 to 0.13
    bad = {n: e for n, e in errs.items() if not e < 1e-5}
    if bad:
        sys.exit(f"bench_ds64 --check: off the fp64 chain: {bad}")


def copy_bandwidth():
    src = torch.empty(2 ** 28, device="cuda")
    dst = torch.empty_like(src)
    return 2 * 2 ** 30 / (ms(lambda: dst.copy_(src)) * 1e-3)


def _launch(form, prec, bv, nw, st):
    return f"{form}64_{prec}_bv{bv}_w{nw}_s{st}"


def family_rows(B, T, H, K, V, family, sms, timed):
    """{pass: {err_<family>: its block-end gradients' error against the fp64 chain's,
    du_err_<family>: its dU's, ms: its time where ``timed``}} on one family's inputs. The
    passes: the 16-token one (serial, split); the 64-token one at each of ``LAUNCHES``; where
    timed, its three kernels alone too (the serial one at each path launch)."""
    c, do, dht = stage1(B, T, H, K, V, "cuda", family)
    want_ends, want_du = chain_ends64(c.ops, do, dht, B, T, H)
    passes = {("chain_split" if split else "chain_serial"): chain_pass(c, do, dht, sms, split)
              for split in (False, True)}
    for form, prec, bv, nw, st in LAUNCHES:
        passes[_launch(form, prec, bv, nw, st)] = (
            lambda form=form, bv=bv, nw=nw, st=st, prec=prec: (path64 if form == "path"
                                                               else fused64)(
                c, do, dht, B, T, H, block_v=bv, num_warps=nw, num_stages=st, precision=prec))
    out = {}
    for key, fn in passes.items():
        du, ends = fn()
        out[key] = {f"err_{family}": rel(ends, want_ends), f"du_err_{family}": rel(du, want_du)}
        if timed:
            out[key]["ms"] = ms(fn)
    if timed:  # the path's kernels alone
        ops64, x64 = prep64(c.ops, B, T, H)
        out["prep64"] = dict(ms=ms(lambda: prep64(c.ops, B, T, H)))
        for form, prec, bv, nw, st in LAUNCHES:
            if form == "path":
                out[_launch("serial", prec, bv, nw, st)] = dict(ms=ms(
                    lambda bv=bv, nw=nw, st=st, prec=prec: ds64(
                        do, *ops64, dht, block_v=bv, num_warps=nw, precision=prec,
                        num_stages=st)))
        du64 = ds64(do, *ops64, dht, block_v=64, num_warps=8, precision="mixed")[1]
        out["solve64"] = dict(ms=ms(lambda: solve64(du64, x64)))
    return out


def sm90_rows(commit):
    """The prototypes' sm_90a compiles (``scripts/sm90_report.py``: registers, spills, shared
    memory, tensor-core instructions), each of ``LAUNCHES`` and the operand and solve kernels,
    beside the 16-token pass's kernel: page rows (value: bytes of spill stores a thread)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "scripts"))
    from sm90_report import report

    from kdalab.kernels.chunk_recurrent_bwd import chunk_kda_bwd_recurrent_kernel

    f16, f32 = "*fp16", "*fp32"
    stage = dict(w_ptr=f16, qg_ptr=f16, kend_ptr=f16, klo_ptr=f16, mqk_ptr=f16, gamma_ptr=f32,
                 T="i32", H="i32")
    out = dict(ends_ptr=f32, du_ptr=f32, dht_ptr=f32, do_ptr="*bf16")
    chain = dict(stage, **out, sum_ptr=f32, cu_seqlens_ptr="*i32", chunk_offsets_ptr="*i32",
                 seq_order_ptr="*i32", seg_ptr="*i32", seg_off_ptr="*i32")
    serial = dict(out, w_ptr=f32, qg_ptr=f32, ke_ptr=f32, mqk_ptr=f32, g_ptr=f32, T="i32",
                  H="i32")
    jobs = [("the 16-token pass (pass 3, serial) BV128 w8", chunk_kda_bwd_recurrent_kernel,
             chain, dict(K=128, V=128, BT=16, BV=128, CKC=4, HAS_DHT=True, STATE_VK=False,
                         IS_VARLEN=False, PASS=3, SEG=False), 8, 1)]
    for form, prec, bv, nw, st in LAUNCHES:
        jobs.append((f"{'serial' if form == 'path' else 'fused'} 64-token pass {prec} BV{bv} "
                     f"w{nw} s{st}", ds64_kernel if form == "path" else fused64_kernel,
                     serial if form == "path" else dict(stage, **out),
                     dict(K=128, V=128, BV=bv, HAS_DHT=True, PREC=prec), nw, st))
    for bk in (16, 32):
        jobs.append((f"operands (prep64) tf32x3 BK{bk} w4", prep64_kernel,
                     dict(stage, w64_ptr=f32, qg64_ptr=f32, ke64_ptr=f32, mqk64_ptr=f32,
                          g64_ptr=f32, x64_ptr=f32), dict(K=128, BK=bk, PREC="tf32x3"), 4, 1))
    jobs.append(("solve64 tf32x3 BV64 w4", solve64_kernel,
                 dict(du64_ptr=f32, x64_ptr=f32, du_ptr=f32, H="i32"),
                 dict(V=128, BV=64, PREC="tf32x3"), 4, 1))
    rows = []
    for label, fn, sig, ce, nw, st in jobs:
        r = report(fn, sig, ce, num_warps=nw, num_stages=st, label=label)
        rows.append(dict(target=f"sm_90a {label} (K = V = 128): spill stores", unit="B/thread",
                         value=r["spill_st"],
                         note=f"{r['regs']} registers, spill loads {r['spill_ld']} B, shared "
                              f"{r['smem']} B, wgmma {r['wgmma']}, mma {r['mma']}, "
                              f"SASS {r['sass']} instructions"))
        print(json.dumps(rows[-1]), flush=True)
    return dict(benchmark="ds64_sm90", device=f"none (ptxas of triton {triton.__version__}, "
                "sm_90a)", date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                commit=commit, command="python benchmarks/bench_ds64.py --sm90 "
                "benchmarks/results/ds64_sm90.json", rows=rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="T1024_H16,T4096_H16,T8192_H64")
    ap.add_argument("--json", default=None)
    ap.add_argument("--check", action="store_true", help="CPU interpreter correctness only")
    ap.add_argument("--launches", default=None, metavar="N,N,...",
                    help="some of LAUNCHES, by index (default: all)")
    ap.add_argument("--sm90", default=None, metavar="JSON",
                    help="no GPU: compile the prototypes for sm_90a and write their page here")
    a = ap.parse_args()
    if a.check:
        check_cpu()
        return
    if a.sm90:
        page = sm90_rows(os.environ.get("KDALAB_COMMIT", "unknown"))
        with open(a.sm90, "w") as fh:
            json.dump(page, fh, indent=1)
        return
    global LAUNCHES
    if a.launches:
        try:
            LAUNCHES = tuple(LAUNCHES[int(i)] for i in a.launches.split(","))
        except (ValueError, IndexError):
            ap.error(f"--launches: indices of LAUNCHES (0-{len(LAUNCHES) - 1}), got "
                     f"{a.launches!r}")
    unknown = [s for s in a.shapes.split(",") if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; known: {', '.join(SHAPES)}")
    bw = copy_bandwidth()
    rows, K, V = [], 128, 128
    sms = _sm_count(torch.device("cuda"))
    print(json.dumps(dict(copy_bw_tbs=bw / 1e12, device=torch.cuda.get_device_name())),
          flush=True)
    for name in a.shapes.split(","):
        B, T, H = SHAPES[name]
        row = dict(shape=name, floors_ms=floors(B, T, H, K, V, bw))
        for i, family in enumerate(FAMILIES):  # the first family's passes timed too
            for key, fig in family_rows(B, T, H, K, V, family, sms, timed=i == 0).items():
                row.setdefault(key, {}).update(fig)
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)  # before fla's, which may autotune for minutes
        try:
            row["fla_dhu"] = dict(ms=ms(fla_pass(B, T, H, K, V)))
        except Exception as e:  # noqa: BLE001 - fla absent or changed: the row says so
            row["fla_dhu"] = dict(error=f"{type(e).__name__}: {e}"[:200])
        print(json.dumps(dict(shape=name, fla_dhu=row["fla_dhu"])), flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(benchmark="ds64", device=torch.cuda.get_device_name(),
                           date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                           commit=os.environ.get("KDALAB_COMMIT", "unknown"),
                           copy_bw_tbs=bw / 1e12, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
