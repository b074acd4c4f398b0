"""Public entry points of the Triton KDA forward: validation, launch plan, launches.

Stage 1 (``chunk_prepare``) is parallel over (chunk, head); stage 2 (``chunk_recurrent``)
is serial over chunks and parallel over (sequence, head, value block), or, when that cannot
fill the GPU, over segments of each sequence too (sequence parallelism: ``plan``,
``chunk_combine``). See docs/kernels.md.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .chunk_combine import chunk_kda_combine
from .chunk_prepare import chunk_kda_prepare
from .chunk_recurrent import chunk_kda_recurrent
from .launch import LAUNCH_MODES
from .plan import LaunchPlan, fp16_guard, plan_launch
from .pool import checkpoint_buffer, validate_pool
from .replay import Replayer, buffer_like, new_buffer
from .sequences import Sequences, fixed_sequences, varlen_sequences
from .shapes import check_gate, check_options, check_tensor, head_shapes

_SUPPORTED_DIMS = (16, 32, 64, 128, 256)
_STATE_DTYPES = (torch.float32, torch.bfloat16)
#: multiprocessors assumed by the launch plan in the Triton interpreter (an H200's count)
INTERPRETER_SMS = 132


@dataclass(frozen=True)
class KernelConfig:
    """Kernel choices; ``None`` means "chosen from the problem" (``kernels.plan``).

    ``dot``: the recurrent products' operands — ``"fp16"`` (S and U rounded to fp16, fp32
    accumulation; only with L2-normalized q, k; guarded: a program whose state leaves fp16's
    range is recomputed with tf32 products), ``"tf32"``, or ``"auto"`` (fp16 where allowed,
    else tf32). ``block_v``, ``num_warps``: the recurrent programs' value columns and warps;
    ``prepare_warps``: stage 1's warps; ``segment_chunks``: the sequence-parallel state
    pass's segment length in 16-token chunks (0: a serial pass per sequence).
    ``fp16_guard``: where the fp16 range
    guard's tf32 redo runs — ``"inline"`` (in the same launch: its code costs registers; on
    triton 3.6 BV 128 on 8 warps spills 432 bytes with it, 0 without), ``"launch"`` (a
    second launch of only the programs the first flagged; the same bits), ``"auto"`` (the
    launch plan's choice, ``plan.fp16_guard``: a second launch for the serial pass at BV 128
    on 8 warps, inline otherwise) or ``"off"`` (a measurement candidate only: an fp16
    overflow then leaves inf or NaN). ``kend_split``:
    KEND enters the state update as its rounding plus the rounding's error (KLO,
    ``chunk_prepare.py``); ``False`` is a measurement candidate only (one rounded KEND: what
    the split costs; it fails the hunt's collinear keys, docs/hunt.md). ``launch``: how
    each kernel is launched — ``"replay"`` (a call whose shapes, options and alignment were
    seen before replays that call's launches on new buffers and addresses, ``replay.py``;
    a key's first call goes direct), ``"direct"`` (the compiled kernel's launcher, once
    Triton has compiled it for the call's specialization: ``launch.py``; nothing kept but
    the compiled kernels) or ``"triton"`` (``kernel[grid]`` every call). All three give the
    same kernels and bits; they differ in host time a call (docs/kernels.md "Host
    overhead").
    """

    dot: str = "auto"
    block_v: int | None = None
    num_warps: int | None = None
    prepare_warps: int | None = None
    segment_chunks: int | None = None
    fp16_guard: str = "auto"
    kend_split: bool = True
    launch: str = "replay"

    def __post_init__(self):
        if self.dot not in ("auto", "fp16", "tf32"):
            raise ValueError(f"config.dot must be 'auto', 'fp16' or 'tf32', got {self.dot!r}")
        checks = (("block_v", (16, 32, 64, 128)), ("num_warps", (1, 2, 4, 8)),
                  ("prepare_warps", (1, 2, 4, 8, 16)))
        for name, allowed in checks:
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"config.{name} must be one of {allowed} or None, "
                                 f"got {value!r}")
        if self.fp16_guard not in ("auto", "inline", "launch", "off"):
            raise ValueError(f"config.fp16_guard must be 'auto', 'inline', 'launch' or 'off', "
                             f"got {self.fp16_guard!r}")
        if not isinstance(self.kend_split, bool):
            raise ValueError(f"config.kend_split must be True or False, "
                             f"got {self.kend_split!r}")
        if not isinstance(self.launch, str) or self.launch not in LAUNCH_MODES:
            raise ValueError(f"config.launch must be one of {tuple(LAUNCH_MODES)}, "
                             f"got {self.launch!r}")
        s = self.segment_chunks
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
            raise ValueError(f"config.segment_chunks must be a chunk count >= 0 or None, "
                             f"got {s!r}")


DEFAULT_CONFIG = KernelConfig()
_GUARDS = {"inline": True, "launch": "launch", "off": False}  # chunk_kda_recurrent's guard
#: tf32 recurrent products (the earlier default, slower than fp16 products: docs/kernels.md;
#: the fp16 path's fallback). Stage 1 as the default's.
TF32_CONFIG = KernelConfig(dot="tf32")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _plan(seqs: Sequences, H: int, K: int, V: int, config: KernelConfig) -> LaunchPlan:
    key = (H, K, V, config)
    plan = seqs.plans.get(key)
    if plan is None:
        plan = plan_launch(seqs.n_chunks, H, K, V, _sm_count(seqs.device),
                           block_v=config.block_v, num_warps=config.num_warps,
                           prepare_warps=config.prepare_warps,
                           segment_chunks=config.segment_chunks)
        seqs.plans[key] = plan
    return plan


def _validate(q, k, v, g, beta, initial_state, A_log, dt_bias, lower_bound, cu_seqlens,
              state_layout, config, use_qk_l2norm, scale, beta_is_logits):
    # value heads H: GVA shares each of q's HQ heads among H // HQ of them
    B, T, HQ, H, K, V = head_shapes(q, k, v, g, beta)
    HG = g.shape[2]
    if K not in _SUPPORTED_DIMS:
        raise ValueError(f"q/k head dim must be one of {_SUPPORTED_DIMS}, got {K}")
    if V not in _SUPPORTED_DIMS:
        raise ValueError(f"v head dim must be one of {_SUPPORTED_DIMS}, got {V}")
    check_gate(A_log, dt_bias, lower_bound, state_layout, HG=HG, K=K)
    check_options(scale, use_qk_l2norm=use_qk_l2norm, beta_is_logits=beta_is_logits)
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config must be a KernelConfig, got {type(config).__name__}")
    if config.dot == "fp16" and not use_qk_l2norm:
        raise ValueError("config.dot='fp16' needs use_qk_l2norm=True (fp16 operands are only "
                         "safe for unit-norm q and k)")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 \
                or cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must be a 1-D tensor with at least two entries")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
        if B != 1:
            raise ValueError(f"cu_seqlens needs batch size 1 (flattened sequences), got B={B}")
        num_seqs = cu_seqlens.numel() - 1
    else:
        num_seqs = B
    if initial_state is not None:
        check_tensor("initial_state", initial_state, 4, _STATE_DTYPES)
        want = (num_seqs, H, V, K) if state_layout == "VK" else (num_seqs, H, K, V)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must have shape {want} ({state_layout}), "
                             f"got {tuple(initial_state.shape)}")
    device = q.device
    for x in (k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens):
        if x is not None and x.device != device:
            raise ValueError(f"all tensors must be on one device, got {device} and {x.device}")
    return B, T, H, K, V, num_seqs


def _sequences(cu_seqlens, device, B, T) -> Sequences:
    """The validated sequence tables (cu_seqlens' contents checked here), then the device."""
    seqs = (varlen_sequences(cu_seqlens, T) if cu_seqlens is not None
            else fixed_sequences(device, B, T))
    if device.type != "cuda" and not _interpreting():
        raise RuntimeError(
            "kdalab.kernels.chunk_kda_fwd runs Triton kernels: it needs CUDA tensors, "
            f"or TRITON_INTERPRET=1 for the (slow) CPU interpreter; got tensors on {device}")
    return seqs


def _stage1(q, k, g, beta, A_log, dt_bias, seqs, H, K, *, scale, lower_bound, use_qk_l2norm,
            beta_is_logits, plan, kend_split=True, clamp_rows=None, direct=True):
    # fp16 holds every stage-1 operand when q, k are unit vectors (all are <= 1 in size,
    # AINV's entries are bounded by the Neumann terms); otherwise keep fp32.
    operand_dtype = torch.float16 if use_qk_l2norm else torch.float32
    return chunk_kda_prepare(
        q, k, g, beta, A_log, dt_bias, scale=scale, lower_bound=lower_bound,
        use_qk_l2norm=use_qk_l2norm, beta_is_logits=beta_is_logits,
        chunk_table=seqs.chunk_table, num_chunks=seqs.num_chunks, operand_dtype=operand_dtype,
        num_warps=plan.prepare_warps, kend_split=kend_split, clamp_rows=clamp_rows,
        direct=direct)


class _Call(NamedTuple):
    H: int
    K: int
    V: int
    num_seqs: int
    seqs: Sequences
    plan: LaunchPlan
    dot: str
    v: torch.Tensor
    initial_state: torch.Tensor | None
    ops: tuple


def _front(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, lower_bound, cu_seqlens,
           state_layout, config, use_qk_l2norm, beta_is_logits, pool=(None, None, None)
           ) -> _Call:
    """What both entry points do first: validate, find the sequences and the plan, make the
    inputs contiguous and run stage 1."""
    B, T, H, K, V, num_seqs = _validate(q, k, v, g, beta, initial_state, A_log, dt_bias,
                                        lower_bound, cu_seqlens, state_layout, config,
                                        use_qk_l2norm, scale, beta_is_logits)
    validate_pool(pool[0], pool[1], initial_state, pool[2], num_seqs=num_seqs, H=H, K=K, V=V,
                  state_layout=state_layout, device=q.device)
    if scale is None:
        scale = K ** -0.5
    seqs = _sequences(cu_seqlens, q.device, B, T)
    plan = _plan(seqs, H, K, V, config)
    dot = config.dot if config.dot != "auto" else ("fp16" if use_qk_l2norm else "tf32")
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    if A_log is not None:
        A_log = A_log.contiguous()
    if dt_bias is not None:
        dt_bias = dt_bias.reshape(-1).contiguous()
    if initial_state is not None:
        initial_state = initial_state.contiguous()
    ops = _stage1(q, k, g, beta, A_log, dt_bias, seqs, H, K, scale=scale,
                  lower_bound=lower_bound, use_qk_l2norm=use_qk_l2norm,
                  beta_is_logits=beta_is_logits, plan=plan,
                  kend_split=config.kend_split, direct=LAUNCH_MODES[config.launch])
    return _Call(H, K, V, num_seqs, seqs, plan, dot, v, initial_state, ops)


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
    state_pool: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    checkpoint_every: int | None = None,
):
    """Chunked KDA forward (chunk 16, lower-bounded gate) on Triton.

    Args follow fla's ``chunk_kda``: q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``, beta
    ``[B, T, H]`` (logits when ``beta_is_logits``), ``g`` the raw gate input, turned into the
    log-decay ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` in the kernel (A_log
    ``[H]`` and dt_bias ``[H*K]`` or ``[H, K]`` optional). q, k, v, g, beta: bf16, fp16 or
    fp32; K and V each one of 16, 32, 64, 128, 256. ``lower_bound`` must lie in [-5, 0): 16
    steps of -5 keep exp(±G) inside fp32. ``initial_state`` is fp32 or bf16, ``[N, H, K, V]``
    (state_layout "KV") or ``[N, H, V, K]`` ("VK"), N = B, or the number of sequences with
    ``cu_seqlens`` (int32 or int64, then B must be 1; zero-length sequences allowed).

    GVA: v and beta may have HV = G·H heads (q, k: H); g, A_log and dt_bias then have H or HV
    heads (fla's layout is HV), the state HV.

    Serving (``kernels/pool.py``): ``state_pool`` ``[P, HV, K, V]`` (or VK; fp32 or bf16,
    contiguous) with ``state_indices`` ``[N]``: the initial states are the pool's rows, the
    final states are written back in place (a negative index: zero start, nothing written;
    two sequences naming one row race); final_state is then None. ``checkpoint_every`` (a
    multiple of 16): also return the states at every that many tokens of each sequence.

    Returns ``(o, final_state)``: o like v; final_state (dtype of initial_state, fp32 when
    there is none) or None; with ``checkpoint_every`` ``(o, final_state, checkpoints)``, the
    layout in ``kernels/pool.py``.

    Non-finite inputs are not checked (a check would read every input once more and sync
    the host): NaN or inf in a sequence's inputs propagates to that sequence's outputs and
    final state (for the heads it reaches) and leaves the others untouched.
    """
    if config.__class__ is KernelConfig and config.launch == "replay":
        return _replayed(q, k, v, g, beta, scale, initial_state, output_final_state, A_log,
                         dt_bias, lower_bound, cu_seqlens, use_qk_l2norm, beta_is_logits,
                         state_layout, config, state_pool, state_indices, checkpoint_every)
    c = _front(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, lower_bound,
               cu_seqlens, state_layout, config, use_qk_l2norm, beta_is_logits,
               pool=(state_pool, state_indices, checkpoint_every))
    H, K, V, num_seqs, seqs, plan, dot = c.H, c.K, c.V, c.num_seqs, c.seqs, c.plan, c.dot
    v, initial_state, ops, device = c.v, c.initial_state, c.ops, c.v.device
    final_state = None
    serving = {}
    if state_pool is not None:
        initial_state = state_pool
        serving["state_indices"] = state_indices.contiguous()
    if checkpoint_every is not None:
        ck_dtype = initial_state.dtype if initial_state is not None else torch.float32
        ck, ck_offsets = checkpoint_buffer(seqs, v.shape[0], v.shape[1], H, K, V,
                                           checkpoint_every, state_layout=state_layout,
                                           dtype=ck_dtype)
        serving.update(checkpoints=ck, checkpoint_offsets=ck_offsets,
                       checkpoint_chunks=checkpoint_every // 16)
    if state_pool is not None:
        final_state = state_pool
    elif output_final_state:
        state_dtype = initial_state.dtype if initial_state is not None else torch.float32
        shape = (num_seqs, H, V, K) if state_layout == "VK" else (num_seqs, H, K, V)
        final_state = new_buffer(shape, device=device, dtype=state_dtype)
    launch = dict(initial_state=initial_state, final_state=final_state,
                  state_vk=state_layout == "VK", cu_seqlens=seqs.cu32,
                  chunk_offsets=seqs.chunk_offsets, seq_order=seqs.seq_order,
                  num_seqs=num_seqs, block_v=plan.block_v,
                  num_warps=plan.num_warps, dot=dot, guard=_GUARDS[
                      fp16_guard(plan) if config.fp16_guard == "auto" else config.fp16_guard]
                  if dot == "fp16" else False, direct=LAUNCH_MODES[config.launch],
                  **serving)
    o = _recurrent(v, ops, launch, seqs, plan, initial_state, num_seqs, state_layout, H, K, V)
    if state_pool is not None:
        final_state = None  # the final states are in the pool
    if checkpoint_every is not None:
        return o, final_state, serving["checkpoints"]
    return o, final_state


_REPLAY = Replayer()


def _replayed(q, k, v, g, beta, scale, initial_state, output_final_state, A_log, dt_bias,
              lower_bound, cu_seqlens, use_qk_l2norm, beta_is_logits, state_layout, config,
              state_pool, state_indices, checkpoint_every):
    """``chunk_kda_fwd`` with ``config.launch == "replay"``, the default (``replay.py``): the
    first call of a key through the direct path, recorded; later calls of the key
    replayed."""
    inputs = (q, k, v, g, beta, initial_state, A_log, dt_bias, state_pool, state_indices,
              cu_seqlens)

    def call():  # the ordinary path (a key's first call, or one that is not replayed)
        return chunk_kda_fwd(
            q, k, v, g, beta, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, A_log=A_log, dt_bias=dt_bias,
            lower_bound=lower_bound, cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
            beta_is_logits=beta_is_logits, state_layout=state_layout,
            config=dataclasses.replace(config, launch="direct"),
            state_pool=state_pool, state_indices=state_indices,
            checkpoint_every=checkpoint_every)

    def constants():  # the call's sequence tables (cached by it: no host read here)
        seqs = (fixed_sequences(q.device, q.shape[0], q.shape[1]) if cu_seqlens is None
                else varlen_sequences(cu_seqlens, q.shape[1]))
        return [cu_seqlens, *seqs.tensors()]

    # the sequence tables were built for this cu_seqlens object at this version (sequences.py)
    seqs_of = None if cu_seqlens is None else (id(cu_seqlens), getattr(cu_seqlens, "_version",
                                                                        None))
    options = (scale, lower_bound, use_qk_l2norm, beta_is_logits, state_layout,
               output_final_state, checkpoint_every, config, seqs_of)
    return _REPLAY(options, inputs, call, constants, list, tuple)


def _recurrent(v, ops, launch, seqs, plan, initial_state, num_seqs, state_layout, H, K, V):
    """Stage 2: the serial pass, or the sequence-parallel passes and their combine."""
    device = v.device
    if plan.segment_chunks <= 0:
        return chunk_kda_recurrent(v, *ops, **launch)

    table, seg_offsets, n_segs = seqs.segments(plan.segment_chunks)
    summary = new_buffer((n_segs, H, V + K, K), device=device, dtype=torch.float32)
    o = buffer_like(v)
    stages = dict(launch, segments=table, summary=summary, o=o)
    chunk_kda_recurrent(v, *ops, **stages, passes=(1,))
    chunk_kda_combine(summary, seg_offsets, initial_state, num_seqs=num_seqs,
                      state_vk=state_layout == "VK", H=H, K=K, V=V,
                      state_indices=launch.get("state_indices"), direct=launch["direct"])
    chunk_kda_recurrent(v, *ops, **stages, passes=(2,))
    return o


def chunk_kda_transition(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float = -5.0,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    beta_is_logits: bool = True,
    config: KernelConfig = DEFAULT_CONFIG,
):
    """Each sequence's state transition: ``(M, R)`` with ``S_end = M @ S_start + R`` for any
    start state S_start ``[K, V]`` (per sequence and head).

    The KDA state update is affine in the state, one chunk at a time: with stage 1's
    operands, S_next = (diag(GAMMA) - KEND^T W) S + KEND^T AINV V. Composing a sequence's
    chunks gives M ``[N, H, K, K]`` (the product of the chunk matrices, fp32) and R
    ``[N, H, K, V]`` (the end state from a zero start). This is the algebra the forward's
    sequence-parallel pass runs per segment, and what carries a sequence split across devices
    (context parallelism): each shard's (M, R), a prefix combine, then ``chunk_kda_fwd`` from
    the true start state. Arguments as ``chunk_kda_fwd`` (no state, no outputs).
    """
    c = _front(q, k, v, g, beta, None, A_log, dt_bias, scale, lower_bound, cu_seqlens, "KV",
               dataclasses.replace(config, segment_chunks=0), use_qk_l2norm, beta_is_logits)
    H, K, V, num_seqs, seqs, plan, dot = c.H, c.K, c.V, c.num_seqs, c.seqs, c.plan, c.dot
    v, ops, device = c.v, c.ops, c.v.device
    # one segment per sequence: the segment length covers the longest sequence
    table, _, n_segs = seqs.segments(max(1, max(seqs.n_chunks, default=1)))
    summary = torch.empty(n_segs, H, V + K, K, device=device, dtype=torch.float32)
    chunk_kda_recurrent(v, *ops, initial_state=None, final_state=None, state_vk=False,
                        cu_seqlens=seqs.cu32, chunk_offsets=seqs.chunk_offsets,
                        num_seqs=num_seqs, block_v=plan.block_v, num_warps=plan.num_warps,
                        dot=dot, guard=dot == "fp16", segments=table, summary=summary,
                        passes=(1,), skip_last=False, direct=LAUNCH_MODES[config.launch])
    R = summary[:, :, :V, :].transpose(-1, -2)
    M = summary[:, :, V:, :].transpose(-1, -2)
    return M, R
