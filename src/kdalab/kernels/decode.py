"""KDA decode on a state pool: a few new tokens per sequence, the recurrence token by token.

One program owns BV value columns of one (sequence, value head) state: it reads them from the
pool row its index names, runs the sequence's new tokens (fp32 state in registers) and writes
them back in place, so a decode step is one launch that reads and writes each state once.
Per token, with the gate, L2 norms and β as ``chunk_kda_fwd`` (docs/kernels.md):

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

import os

import torch
import triton
import triton.language as tl

from .launch import LAUNCH_MODES
from .launch import launch as launch_kernel
from .replay import Replayer, buffer_like
from .shapes import check_gate, check_options, check_state_pool, check_tensor, head_shapes


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
    H, HV, HG, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
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
    if HAS_A_LOG:
        a = tl.exp(tl.load(a_log_ptr + i_g).to(tl.float32))
    if HAS_DT_BIAS:
        bias = tl.load(dt_bias_ptr + i_g * K + o_k).to(tl.float32)
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
        if HAS_DT_BIAS:
            x = x + bias
        if HAS_A_LOG:
            x = x * a
        decay = tl.exp(lower_bound * tl.sigmoid(x))
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
#: on the same warps: under graph replay at K = V = 128 (H200, f4492ce, all 16 decode shapes),
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


def kda_decode_launch(q, k, v, g, beta, A_log, dt_bias, o, pool, idx, accepted, cu_seqlens, *,
                      num_seqs, T, scale, lower_bound, use_qk_l2norm, beta_is_logits, state_vk,
                      block_v=None, num_warps=None, direct=True):
    """Launch the decode kernel on validated, contiguous tensors (``kernels.decode_api``);
    ``direct``: through ``launch.py`` (False: ``kernel[grid]`` every call)."""
    H, K = q.shape[-2:]
    HV, V = v.shape[-2:]
    HG = g.shape[-2]
    bv, warps = decode_launch_shape(K, V, num_seqs * HV)
    bv = block_v or bv
    warps = num_warps or warps
    dummy = o
    grid = (-(-V // bv), num_seqs * HV)  # not triton.cdiv: a JIT function, ~15 us a call
    if grid[1] == 0:
        return o
    launch_kernel(kda_decode_kernel, grid, (
        q, k, v, g, beta, A_log if A_log is not None else dummy,
        dt_bias if dt_bias is not None else dummy, o, pool, idx,
        accepted if accepted is not None else idx, cu_seqlens if cu_seqlens is not None else idx,
        T, float(scale), float(lower_bound), idx.shape[1] if idx.ndim == 2 else 1,
        H, HV, HG), dict(K=K, V=V, BV=bv, HAS_A_LOG=A_log is not None,
        HAS_DT_BIAS=dt_bias is not None, USE_L2NORM=use_qk_l2norm, BETA_LOGITS=beta_is_logits,
        STATE_VK=state_vk, PER_TOKEN=idx.ndim == 2, HAS_ACCEPTED=accepted is not None,
        IS_VARLEN=cu_seqlens is not None, num_warps=warps), direct=direct)
    return o


_INTS = (torch.int32, torch.int64)
_DIMS = (16, 32, 64, 128, 256)


def validate_decode(q, k, v, g, beta, state_pool, state_indices, A_log, dt_bias, lower_bound,
                    state_layout, num_accepted_tokens, cu_seqlens):
    """Shapes, dtypes and devices (no host sync: index contents are not read). Returns
    (number of sequences, tokens per sequence T or the packed length)."""
    B, T, H, HV, K, V = head_shapes(q, k, v, g, beta)
    if K not in _DIMS or V not in _DIMS:
        raise ValueError(f"head dims K={K}, V={V} must each be one of {_DIMS}")
    check_gate(A_log, dt_bias, lower_bound, state_layout, HG=g.shape[2], K=K)
    if cu_seqlens is not None:
        check_tensor("cu_seqlens", cu_seqlens, 1, _INTS)
        if B != 1 or cu_seqlens.numel() < 1:
            raise ValueError(f"cu_seqlens needs batch size 1 and >= 1 entry, got B={B}")
        N = cu_seqlens.numel() - 1
    else:
        N = B
    check_state_pool(state_pool, HV=HV, K=K, V=V, state_layout=state_layout)
    check_tensor("state_indices", state_indices, (1, 2), _INTS)
    if state_indices.shape[0] != N:
        raise ValueError(f"state_indices must have {N} rows (one a sequence), "
                         f"got {tuple(state_indices.shape)}")
    if state_indices.ndim == 2 and cu_seqlens is None and state_indices.shape[1] < T:
        raise ValueError(f"state_indices [N, T_new] needs T_new >= {T} columns (a pool row "
                         f"for each token's state), got {tuple(state_indices.shape)}")
    if num_accepted_tokens is not None:
        check_tensor("num_accepted_tokens", num_accepted_tokens, 1, _INTS)
        if state_indices.ndim != 2 or num_accepted_tokens.shape != (N,):
            raise ValueError("num_accepted_tokens must be [N] and needs state_indices [N, T_new]"
                             " (the per-token states it picks the start from)")
    for x in (k, v, g, beta, state_pool, state_indices, A_log, dt_bias, num_accepted_tokens,
              cu_seqlens):
        if x is not None and x.device != q.device:
            raise ValueError(f"all tensors must be on one device, got {q.device} and {x.device}")
    return N, T


def kda_decode(q, k, v, g, beta, *, state_pool, state_indices, scale=None, A_log=None,
               dt_bias=None, lower_bound=-5.0, use_qk_l2norm=True, beta_is_logits=True,
               state_layout="KV", num_accepted_tokens=None, cu_seqlens=None, out=None,
               block_v=None, num_warps=None, launch="replay"):
    """KDA decode: ``T_new`` new tokens of each of N sequences whose states live in a pool.

    q, k ``[N, T_new, H, K]``; v ``[N, T_new, HV, V]`` (GVA: HV a multiple of H, value head i
    reads q/k head ``i // (HV // H)``); g ``[N, T_new, HV or H, K]`` (the raw gate, as
    ``chunk_kda_fwd``), beta ``[N, T_new, HV]``; A_log ``[HG]``, dt_bias ``[HG * K]`` for the
    HG gate heads of g. ``cu_seqlens`` packs sequences of different token counts (B = 1).
    ``state_pool`` ``[P, HV, K, V]`` (``"VK"``: ``[P, HV, V, K]``), fp32 or bf16, updated in
    place at the rows ``state_indices`` names (module docstring: ``[N]``, or ``[N, T_new]``
    with per-token states and ``num_accepted_tokens`` for speculative decoding; negative
    indices skip). Index contents are not checked (a check would sync the host); two
    sequences naming one row race. Returns o like v (or written into ``out``). ``block_v``,
    ``num_warps``: the program shape (None: ``decode_launch_shape``); ``launch``:
    ``"replay"`` (a step of a seen key replays its launch, ``replay.py``), ``"direct"`` (the
    compiled kernel's launcher, ``launch.py``) or ``"triton"`` (``kernel[grid]`` every call);
    the same kernel and bits, less host time in that order.
    """
    if launch == "replay":
        return _replayed(q, k, v, g, beta, state_pool, state_indices, scale, A_log, dt_bias,
                         lower_bound, use_qk_l2norm, beta_is_logits, state_layout,
                         num_accepted_tokens, cu_seqlens, out, block_v, num_warps)
    N, T = validate_decode(q, k, v, g, beta, state_pool, state_indices, A_log, dt_bias,
                           lower_bound, state_layout, num_accepted_tokens, cu_seqlens)
    check_options(scale, use_qk_l2norm=use_qk_l2norm, beta_is_logits=beta_is_logits)
    if not isinstance(launch, str) or launch not in LAUNCH_MODES:
        raise ValueError(f"launch must be one of {tuple(LAUNCH_MODES)}, got {launch!r}")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError("kdalab.kernels.kda_decode runs a Triton kernel: it needs CUDA "
                           f"tensors, or TRITON_INTERPRET=1 on the CPU; got {q.device}")
    K = q.shape[-1]
    if scale is None:
        scale = K ** -0.5
    q, k, v, g, beta, state_indices = (x.contiguous() for x in (q, k, v, g, beta,
                                                                state_indices))
    if A_log is not None:
        A_log = A_log.contiguous()
    if dt_bias is not None:
        dt_bias = dt_bias.reshape(-1).contiguous()
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != v.shape
                            or out.dtype != v.dtype or out.device != v.device
                            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous tensor like v {tuple(v.shape)} {v.dtype}")
    o = buffer_like(v) if out is None else out
    return kda_decode_launch(q, k, v, g, beta, A_log, dt_bias, o, state_pool, state_indices,
                             num_accepted_tokens, cu_seqlens, num_seqs=N, T=T, scale=scale,
                             lower_bound=lower_bound, use_qk_l2norm=use_qk_l2norm,
                             beta_is_logits=beta_is_logits, state_vk=state_layout == "VK",
                             block_v=block_v, num_warps=num_warps, direct=LAUNCH_MODES[launch])


_REPLAY = Replayer()


def _replayed(q, k, v, g, beta, state_pool, state_indices, scale, A_log, dt_bias, lower_bound,
              use_qk_l2norm, beta_is_logits, state_layout, num_accepted_tokens, cu_seqlens,
              out, block_v, num_warps):
    """``kda_decode(launch="replay")``, the default (``replay.py``): a step of a seen key
    replays its one launch on the new tensors."""
    inputs = (q, k, v, g, beta, state_pool, state_indices, A_log, dt_bias,
              num_accepted_tokens, cu_seqlens, out)

    def call():
        return kda_decode(q, k, v, g, beta, state_pool=state_pool, state_indices=state_indices,
                          scale=scale, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                          use_qk_l2norm=use_qk_l2norm, beta_is_logits=beta_is_logits,
                          state_layout=state_layout, num_accepted_tokens=num_accepted_tokens,
                          cu_seqlens=cu_seqlens, out=out, block_v=block_v,
                          num_warps=num_warps, launch="direct")

    options = (scale, lower_bound, use_qk_l2norm, beta_is_logits, state_layout, block_v,
               num_warps)
    if out is not None:  # the output is the caller's: nothing to return from the buffers
        return _REPLAY(options, inputs, call, list, lambda o: [], lambda outs: out)
    return _REPLAY(options, inputs, call, list, lambda o: [o], lambda outs: outs[0])
