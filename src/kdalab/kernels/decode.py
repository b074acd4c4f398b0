"""KDA decode on a state pool: a few new tokens per sequence, the recurrence token by token.

One program owns BV value columns of one (sequence, value head) state: it reads them from the
pool row its index names, runs the sequence's new tokens (fp32 state in registers) and writes
them back in place, so a decode step is one launch that reads and writes each state once.
Per token, with the gate (``gate.py``), L2 norms and β as ``chunk_kda_fwd`` (docs/kernels.md):

    S <- diag(exp g) S;   u = β (v - Sᵀk);   S <- S + k uᵀ;   o = Sᵀ(scale · q)

(o is formed as (scale q)ᵀS + (scale q·k) u from the decayed S: the same value, one
reduction round a token instead of two.)

Pool rows (``state_indices``): ``[N]`` — read row n's state, write the state after the last
token back to it; ``[N, T_new]`` (speculative decoding, fla's ``ssm_state_indices``) — read
from column ``num_accepted_tokens[n] - 1`` (column 0 without it) and write the state after
token t to column t, the per-token states a rollback needs. A negative index (a padded batch
slot) reads a zero state and writes nothing. Rows no index names are never touched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import DEFAULT_CONFIG, KernelConfig
from .contract import decode_problem
from .gate import gate_params, log2_decay


@triton.jit
def _pool_ptrs(pool_ptr, row, i_hv, o_k, o_v, HV, K: tl.constexpr, V: tl.constexpr,
               STATE_VK: tl.constexpr):
    """Pointers to the [K, BV] tile of columns ``o_v`` of pool row ``row``, head ``i_hv``."""
    base = pool_ptr + (row * HV + i_hv) * K * V
    if STATE_VK:
        return base + o_v[None, :] * K + o_k[:, None]
    return base + o_k[:, None] * V + o_v[None, :]


@triton.jit
def kda_decode_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, o_ptr, pool_ptr,
    idx_ptr, accepted_ptr, cu_seqlens_ptr,
    T, scale, lower_bound, idx_stride,
    H, HV, HG, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
    HAS_A_LOG: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_L2NORM: tl.constexpr,
    BETA_LOGITS: tl.constexpr, STATE_VK: tl.constexpr, PER_TOKEN: tl.constexpr,
    HAS_ACCEPTED: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = (i_nh // HV).to(tl.int64)
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)      # q/k head (GVA: HV // H value heads share it)
    i_g = i_hv // (HV // HG)     # gate head (g, A_log, dt_bias: per value head or per q/k head)
    if IS_VARLEN:
        bos = tl.load(cu_seqlens_ptr + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens_ptr + i_n + 1).to(tl.int64)
    else:
        bos = i_n * T
        eos = bos + T
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    # the state first: its load is the long one, the per-token loads and gate math overlap it
    if HAS_ACCEPTED:
        col = tl.load(accepted_ptr + i_n).to(tl.int64) - 1
    else:
        col = 0
    row0 = tl.load(idx_ptr + i_n * idx_stride + col).to(tl.int64)
    m0 = (o_k[:, None] * 0 + row0) >= 0  # a tensor mask: the interpreter rejects scalar ones
    S = tl.load(_pool_ptrs(pool_ptr, row0, i_hv, o_k, o_v, HV, K, V, STATE_VK), mask=m0,
                other=0.0).to(tl.float32)
    a, bias = gate_params(a_log_ptr, dt_bias_ptr, i_g, o_k, K, HAS_A_LOG, HAS_DT_BIAS)
    for t in range(0, eos - bos):
        r = bos + t
        q = tl.load(q_ptr + (r * H + i_h) * K + o_k).to(tl.float32)
        k = tl.load(k_ptr + (r * H + i_h) * K + o_k).to(tl.float32)
        x = tl.load(g_ptr + (r * HG + i_g) * K + o_k).to(tl.float32)
        v = tl.load(v_ptr + (r * HV + i_hv) * V + o_v).to(tl.float32)
        b = tl.load(beta_ptr + r * HV + i_hv + o_v * 0).to(tl.float32)
        if BETA_LOGITS:
            b = tl.sigmoid(b)
        if USE_L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        decay = tl.exp2(log2_decay(x, a, bias, lower_bound, o_k >= 0, GATE))
        q = q * scale
        S = S * decay[:, None]
        # o = qᵀ(S + k uᵀ) = qᵀS + (q·k) u: both reductions over K read the decayed S at
        # once, so a token waits on one cross-thread reduction instead of two in a row
        ks = tl.sum(S * k[:, None], axis=0)
        qs = tl.sum(S * q[:, None], axis=0)
        u = b * (v - ks)
        S = S + k[:, None] * u[None, :]
        o = qs + tl.sum(q * k, axis=0) * u
        tl.store(o_ptr + (r * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty))
        if PER_TOKEN:
            row = tl.load(idx_ptr + i_n * idx_stride + t).to(tl.int64)
            mt = (o_k[:, None] * 0 + row) >= 0
            tl.store(_pool_ptrs(pool_ptr, row, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                     S.to(pool_ptr.dtype.element_ty), mask=mt)
    if not PER_TOKEN:
        tl.store(_pool_ptrs(pool_ptr, row0, i_hv, o_k, o_v, HV, K, V, STATE_VK),
                 S.to(pool_ptr.dtype.element_ty), mask=m0)


#: decode's programs (sequences × value heads) from which a program owns twice the value block
#: on the same warps: under graph replay at K = V = 128 (H200, all 16 decode shapes),
#: BV 64 on 4 warps was 4.6–7.7 % faster than BV 32 at every N · HV >= 768 (9 shapes, N 8–256)
#: and 0.6–18 % slower at every N · HV <= 384 (7 shapes): with few programs each SM holds
#: only a few, and halving them halves the loads in flight; with many, fewer and longer
#: programs cost less (docs/kernels.md, "Decode")
DECODE_WIDE_FROM = 768


def decode_launch_shape(K: int, V: int, programs: int) -> tuple[int, int]:
    """(BV, warps) for ``programs`` (sequences × value heads): a [K, BV] fp32 tile of 32
    values a thread (K = 128: BV = 32 on 4 warps, fla's shape), 64 a thread (BV 64 at
    K = 128) from ``DECODE_WIDE_FROM`` programs on. No autotuning (a decode step must not pay
    it, and graphs capture one launch). The block also moves which threads sum a column over
    K, so the fp32 state's last bits differ between shapes: a sequence decoded in a batch
    past the threshold and alone agree within fp32 reassociation, not bit for bit. Pin
    ``block_v`` and ``num_warps`` for bits that do not depend on the batch (tested on the
    H200). Measured at K = 128 only; other K take the same tile sizes (BV 16 → 32 at K = 256,
    64 → 128 at K = 64), not timed."""
    bv = max(16, min(V, 4096 // K))
    warps = 4 if K * bv >= 4096 else 2
    if programs >= DECODE_WIDE_FROM and warps == 4 and 2 * bv <= V:
        bv *= 2
    return bv, warps


def kda_decode(q, k, v, g, beta, *, state_pool, state_indices, scale=None, A_log=None,
               dt_bias=None, lower_bound=-5.0, gate="raw", use_qk_l2norm=True,
               beta_is_logits=True, state_layout="KV", num_accepted_tokens=None,
               cu_seqlens=None, out=None, config: KernelConfig = DEFAULT_CONFIG):
    """KDA decode: ``T_new`` new tokens of each of N sequences whose states live in a pool.

    q, k ``[N, T_new, H, K]``; v ``[N, T_new, HV, V]`` (GVA: HV a multiple of H, value head i
    reads q/k head ``i // (HV // H)``); g ``[N, T_new, HV or H, K]`` and the gate as
    ``chunk_kda_fwd`` takes them (``gate``, ``lower_bound``, ``A_log [HG]``,
    ``dt_bias [HG * K]``), beta ``[N, T_new, HV]``. ``cu_seqlens`` packs sequences of
    different token counts (B = 1). ``state_pool`` ``[P, HV, K, V]`` (``"VK"``:
    ``[P, HV, V, K]``), fp32 or bf16, updated in place at the rows ``state_indices`` names
    (module docstring: ``[N]``, or ``[N, T_new]`` with per-token states and
    ``num_accepted_tokens`` for speculative decoding; negative indices skip). Index contents
    are not checked (a check would sync the host); two sequences naming one row race.
    Returns o like v (or written into ``out``). ``config``: its ``block_v`` and ``num_warps``
    pin the program shape (None: ``decode_launch_shape``).

    One launch and no host sync: a step can be captured in a CUDA graph (which removes the
    host's time a step, the larger part at small N: docs/kernels.md).
    """
    p = decode_problem(q, k, v, g, beta, state_pool=state_pool, state_indices=state_indices,
                       scale=scale, A_log=A_log, dt_bias=dt_bias, gate=gate,
                       lower_bound=lower_bound, use_qk_l2norm=use_qk_l2norm,
                       beta_is_logits=beta_is_logits, state_layout=state_layout,
                       num_accepted_tokens=num_accepted_tokens, cu_seqlens=cu_seqlens,
                       out=out, config=config)
    q, k, v, g, beta, state_indices = (x.contiguous() for x in (q, k, v, g, beta,
                                                                state_indices))
    A_log = None if A_log is None else A_log.contiguous()
    dt_bias = None if dt_bias is None else dt_bias.reshape(-1).contiguous()
    o = torch.empty_like(v) if out is None else out
    bv, warps = decode_launch_shape(p.K, p.V, p.num_seqs * p.H)
    bv = config.block_v or bv
    warps = config.num_warps or warps
    grid = (-(-p.V // bv), p.num_seqs * p.H)  # not triton.cdiv: a JIT function, ~15 us a call
    if grid[1] == 0:
        return o
    dummy = o
    idx = state_indices
    kda_decode_kernel[grid](
        q, k, v, g, beta, A_log if A_log is not None else dummy,
        dt_bias if dt_bias is not None else dummy, o, state_pool, idx,
        num_accepted_tokens if num_accepted_tokens is not None else idx,
        cu_seqlens if cu_seqlens is not None else idx,
        p.T, p.scale, p.gate.kernel_bound, idx.shape[1] if idx.ndim == 2 else 1,
        p.HQ, p.H, p.HG, K=p.K, V=p.V, BV=bv, GATE=p.gate.code, HAS_A_LOG=A_log is not None,
        HAS_DT_BIAS=dt_bias is not None, USE_L2NORM=p.use_qk_l2norm,
        BETA_LOGITS=p.beta_is_logits, STATE_VK=p.state_vk, PER_TOKEN=idx.ndim == 2,
        HAS_ACCEPTED=num_accepted_tokens is not None, IS_VARLEN=cu_seqlens is not None,
        num_warps=warps)
    return o
