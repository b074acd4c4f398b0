"""Public entry point of the Triton KDA forward: validation, chunk tables, two launches.

Stage 1 (``chunk_prepare``) is parallel over (chunk, head); stage 2 (``chunk_recurrent``)
is serial over chunks and parallel over (sequence, head, value block). See docs/kernels.md.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from dataclasses import dataclass

import torch

from .chunk_fused import chunk_kda_fused
from .chunk_prepare import chunk_kda_prepare
from .chunk_prepare64 import chunk_kda_prepare64
from .chunk_recurrent import chunk_kda_recurrent
from .chunk_recurrent_t import chunk_kda_recurrent_t

_SUPPORTED_DIMS = (16, 32, 64, 128, 256)
_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_STATE_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class KernelConfig:
    """Kernel choices: the inverse's precision, the recurrent stage's form and precision, and
    the launch shapes (value columns per program, warps, pipeline stages).

    The default (measured on the H200, 2026-11-29, docs/BENCHMARKS.md): the fp32 inverse
    (FlashKDA's fp16 one gives 1.2e-2 state error on weak_decay_correlated, fla 1.6e-2, fp32
    2.0e-3); fp16 products in the recurrent stage (``dot="auto"``: where q and k are
    L2-normalized, else tf32) (S and U rounded to fp16: 11 bits, more
    accurate than tf32's operands here, since they come from fp16-stored operands, and than
    bf16's), guarded: a program whose state leaves fp16's range is recomputed with tf32
    products (``fp16_fallback``); stage 1 on 2 warps at K = 128. :data:`TF32_CONFIG` is the
    earlier default (tf32 products, stage 1 on 8 warps), 2–3× slower.
    """

    inverse: str = "fp32"     # "fp32" (FMA products), "tf32x3" (tensor cores), "fp16"
    variant: str = "t"        # recurrent stage: "t" (S^T, M = BV products), "kv" (S, M = 16),
    #                           or "fused": one pass, stage 1 inside the recurrent programs
    dot: str = "auto"         # recurrent products: "fp16", "tf32", "bf16" (t form) or "auto":
    #                           fp16 where safe (L2-normalized q, k; t form; 16-token step),
    #                           else tf32
    operands: str = "fp16"    # storage of stage-1 operands with dot="tf32": "fp16" or "fp32"
    step: int = 16            # tokens per recurrent step: 16, or 64 (experimental, untimed)
    prefetch: bool = True     # "t" form: load chunk i+1's operands while chunk i computes
    prepare_warps: int | None = None  # stage 1's warps (None: 2 at K = 128, 4 below, 8 above)
    fp16_fallback: bool = True  # dot="fp16": recompute out-of-range programs with tf32
    block_v: int = 64
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_CONFIG = KernelConfig()
#: The default's name from before it was the default (fp16 products, a small stage 1).
FAST_CONFIG = DEFAULT_CONFIG
#: tf32 recurrent products, stage 1 on 8 warps at K = 128: the default until 2026-11-29.
TF32_CONFIG = KernelConfig(dot="tf32", prepare_warps=8)


def _resolve_dot(config: KernelConfig, use_qk_l2norm: bool) -> KernelConfig:
    if config.dot != "auto":
        return config
    fp16 = use_qk_l2norm and config.variant in ("t", "fused") and config.step == 16
    return dataclasses.replace(config, dot="fp16" if fp16 else "tf32")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_tensor(name, x, ndim, dtypes=_INPUT_DTYPES):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {x.dtype}; expected one of {dtypes}")


def _chunk_tables(cu_seqlens: torch.Tensor, chunk: int):
    """(chunk_table [NC, 2] int32 of (sequence, chunk), chunk_offsets [N] int32, NC)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    n_chunks = (lens + chunk - 1) // chunk
    offsets = torch.cumsum(n_chunks, 0) - n_chunks
    total = int(n_chunks.sum().item())
    seq = torch.repeat_interleave(torch.arange(len(lens), device=lens.device), n_chunks)
    local = torch.arange(total, device=lens.device) - offsets[seq]
    table = torch.stack([seq, local], dim=1).to(torch.int32).contiguous()
    return table, offsets.to(torch.int32).contiguous(), total


#: (weak ref to cu_seqlens, its version, T, step) -> validated int32 copy and chunk tables.
_VARLEN_CACHE: dict[int, tuple] = {}
_VARLEN_CACHE_SIZE = 8


def _varlen_tables(cu_seqlens: torch.Tensor, T: int, step: int):
    """Validated ``cu_seqlens`` (int32) and its chunk tables, cached per tensor.

    Validating ``cu_seqlens`` reads it on the host, and building the tables needs the chunk
    count: each is a device-to-host sync, which costs a varlen call about 0.5 ms of idle GPU
    (measured on the H200, docs/BENCHMARKS.md). Like fla (its ``tensor_cache``), the result is
    kept for the tensor object: a call with the same, unmodified ``cu_seqlens`` (same object,
    same in-place version counter) reuses it without touching the host.
    """
    key = id(cu_seqlens)
    hit = _VARLEN_CACHE.get(key)
    if hit is not None:
        ref, version, t, s, result = hit
        if ref() is cu_seqlens and version == cu_seqlens._version and t == T and s == step:
            return result
    cs = cu_seqlens.detach().cpu()
    if int(cs[0]) != 0 or int(cs[-1]) != T or bool((cs[1:] < cs[:-1]).any()):
        raise ValueError(f"cu_seqlens must start at 0, end at T={T} and be non-decreasing")
    cu32 = cu_seqlens.detach().to(torch.int32).contiguous()
    result = (cu32, *_chunk_tables(cu32, step))
    if len(_VARLEN_CACHE) >= _VARLEN_CACHE_SIZE:
        _VARLEN_CACHE.pop(next(iter(_VARLEN_CACHE)))
    _VARLEN_CACHE[key] = (weakref.ref(cu_seqlens), cu_seqlens._version, T, step, result)
    return result


def chunk_kda_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float = -5.0,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    beta_is_logits: bool = True,
    state_layout: str = "KV",
    config: KernelConfig = DEFAULT_CONFIG,
):
    """Chunked KDA forward (chunk 16, lower-bounded gate) on Triton.

    Args follow fla's ``chunk_kda``: q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``, beta
    ``[B, T, H]`` (logits when ``beta_is_logits``), ``g`` the raw gate input, turned into
    the log-decay ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` in the kernel
    (A_log ``[H]`` and dt_bias ``[H*K]`` or ``[H, K]`` optional). ``lower_bound`` must lie
    in [-5, 0): 16 steps of -5 keep exp(±G) inside fp32. ``initial_state`` is fp32 or bf16,
    ``[N, H, K, V]`` (state_layout "KV") or ``[N, H, V, K]`` ("VK"), N = B, or the number
    of sequences with ``cu_seqlens`` (then B must be 1).

    Returns ``(o, final_state)``: o like v; final_state (dtype of initial_state, fp32 when
    there is none) or None.
    """
    _check_tensor("q", q, 4)
    _check_tensor("k", k, 4)
    _check_tensor("v", v, 4)
    _check_tensor("g", g, 4)
    _check_tensor("beta", beta, 3)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if g.shape != q.shape:
        raise ValueError(f"g must have q's shape {tuple(q.shape)}, got {tuple(g.shape)}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(f"v must have shape [{B}, {T}, {H}, V], got {tuple(v.shape)}")
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must have shape {(B, T, H)}, got {tuple(beta.shape)}")
    if K not in _SUPPORTED_DIMS:
        raise ValueError(f"q/k head dim must be one of {_SUPPORTED_DIMS}, got {K}")
    if V not in _SUPPORTED_DIMS:
        raise ValueError(f"v head dim must be one of {_SUPPORTED_DIMS}, got {V}")
    if not isinstance(lower_bound, (int, float)) or not (-5.0 <= float(lower_bound) < 0.0):
        raise ValueError(f"lower_bound must be a number in [-5, 0), got {lower_bound!r}")
    if state_layout not in ("KV", "VK"):
        raise ValueError(f"state_layout must be 'KV' or 'VK', got {state_layout!r}")
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config must be a KernelConfig, got {type(config).__name__}")
    config = _resolve_dot(config, use_qk_l2norm)
    if config.inverse not in ("fp32", "tf32x3", "fp16"):
        raise ValueError(f"config.inverse must be 'fp32', 'tf32x3' or 'fp16', "
                         f"got {config.inverse!r}")
    if config.variant not in ("t", "kv", "fused") \
            or config.dot not in ("tf32", "bf16", "fp16") \
            or (config.variant == "fused" and config.step != 16) \
            or config.operands not in ("fp16", "fp32") \
            or (config.variant == "kv" and config.dot != "tf32"):
        raise ValueError(f"config: unsupported combination {config}")
    if config.prepare_warps not in (None, 1, 2, 4, 8, 16):
        raise ValueError(f"config.prepare_warps must be 1, 2, 4, 8 or 16, "
                         f"got {config.prepare_warps!r}")
    if config.step not in (16, 64) or (config.step == 64 and config.inverse != "fp32"):
        raise ValueError(f"config.step must be 16, or 64 with the fp32 inverse; got {config}")
    if config.dot == "fp16" and not use_qk_l2norm:
        raise ValueError("config.dot='fp16' needs use_qk_l2norm=True (fp16 operands are only "
                         "safe for unit-norm q and k)")
    if scale is None:
        scale = K ** -0.5
    if A_log is not None:
        _check_tensor("A_log", A_log, A_log.ndim if isinstance(A_log, torch.Tensor) else 1)
        if A_log.shape != (H,):
            raise ValueError(f"A_log must have shape ({H},), got {tuple(A_log.shape)}")
    if dt_bias is not None:
        _check_tensor("dt_bias", dt_bias, dt_bias.ndim if isinstance(dt_bias, torch.Tensor) else 1)
        if dt_bias.shape not in ((H * K,), (H, K)):
            raise ValueError(f"dt_bias must have shape ({H * K},) or ({H}, {K}), "
                             f"got {tuple(dt_bias.shape)}")

    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 \
                or cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must be a 1-D tensor with at least two entries")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
        if B != 1:
            raise ValueError(f"cu_seqlens needs batch size 1 (flattened sequences), got B={B}")
        num_seqs = cu_seqlens.numel() - 1
        # validated (a host read) and tabled once per cu_seqlens tensor
        cu32, chunk_table, chunk_offsets, num_chunks = _varlen_tables(cu_seqlens, T,
                                                                      config.step)
    else:
        num_seqs = B

    state_vk = state_layout == "VK"
    if initial_state is not None:
        _check_tensor("initial_state", initial_state, 4, _STATE_DTYPES)
        want = (num_seqs, H, V, K) if state_vk else (num_seqs, H, K, V)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must have shape {want} ({state_layout}), "
                             f"got {tuple(initial_state.shape)}")

    tensors = [q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens]
    devices = {x.device for x in tensors if x is not None}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = q.device
    if device.type != "cuda" and not _interpreting():
        raise RuntimeError(
            "kdalab.kernels.chunk_kda_fwd runs Triton kernels: it needs CUDA tensors, "
            f"or TRITON_INTERPRET=1 for the (slow) CPU interpreter; got tensors on {device}")

    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    if A_log is not None:
        A_log = A_log.contiguous()
    if dt_bias is not None:
        dt_bias = dt_bias.reshape(H * K).contiguous()
    if initial_state is not None:
        initial_state = initial_state.contiguous()

    step = config.step
    if cu_seqlens is not None:
        cu_seqlens = cu32
    else:
        chunk_table, chunk_offsets, num_chunks = None, None, B * ((T + step - 1) // step)

    # fp16 holds every stage-1 operand when q, k are unit vectors (all are <= 1 in size,
    # AINV's entries are bounded by the Neumann terms); otherwise keep fp32.
    if config.dot == "bf16":
        operand_dtype = torch.bfloat16
    elif config.dot == "fp16":
        operand_dtype = torch.float16
    elif use_qk_l2norm and config.operands == "fp16":
        operand_dtype = torch.float16
    else:
        operand_dtype = torch.float32
    stage1 = dict(scale=scale, lower_bound=lower_bound, use_qk_l2norm=use_qk_l2norm,
                  beta_is_logits=beta_is_logits, cu_seqlens=cu_seqlens,
                  operand_dtype=operand_dtype)
    inverse = dict(fp16_inverse=config.inverse == "fp16",
                   inv_precision="tf32x3" if config.inverse == "tf32x3" else "ieee")
    final_state = None
    if output_final_state:
        state_dtype = initial_state.dtype if initial_state is not None else torch.float32
        shape = (num_seqs, H, V, K) if state_vk else (num_seqs, H, K, V)
        final_state = torch.empty(shape, device=device, dtype=state_dtype)
    stage2 = dict(initial_state=initial_state, final_state=final_state, state_vk=state_vk,
                  num_seqs=num_seqs, block_v=config.block_v, num_warps=config.num_warps,
                  num_stages=config.num_stages)
    if config.variant == "fused":
        o = chunk_kda_fused(q, k, g, beta, A_log, dt_bias, v, **stage1, **inverse, **stage2,
                            dot=config.dot, fp16_fallback=config.fp16_fallback)
        return o, final_state
    if step == 64:
        w, qg, kend, ainv, mqk, gamma = chunk_kda_prepare64(
            q, k, g, beta, A_log, dt_bias, **stage1, chunk_table=chunk_table,
            num_chunks=num_chunks)
    else:
        w, qg, kend, ainv, mqk, gamma = chunk_kda_prepare(
            q, k, g, beta, A_log, dt_bias, **stage1, **inverse, chunk_table=chunk_table,
            num_chunks=num_chunks, num_warps=config.prepare_warps)

    launch = dict(**stage2, cu_seqlens=cu_seqlens, chunk_offsets=chunk_offsets, chunk=step)
    if config.variant == "t":
        o = chunk_kda_recurrent_t(v, w, qg, kend, ainv, mqk, gamma, **launch,
                                  dot=config.dot, prefetch=config.prefetch,
                                  fp16_fallback=config.fp16_fallback)
    else:
        o = chunk_kda_recurrent(v, w, qg, kend, ainv, mqk, gamma, **launch)
    return o, final_state
