"""The public entry points of the Triton KDA forward: contract, tables, plan, stages.

Stage 1 (``chunk_prepare``) is parallel over (chunk, head); stage 2 (``chunk_recurrent``)
is serial over chunks and parallel over (sequence, head, value block), or, when that cannot
fill the GPU, over segments of each sequence too (sequence parallelism: ``launch_plan``,
``chunk_combine``). The differentiable ``chunk_kda`` (``autograd.py``) runs the same forward
and the backward stages. Launches go through Triton's own path (``kernel[grid]``); a caller
that needs no host time a call captures the call in a CUDA graph (docs/kernels.md).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch

from .chunk_combine import chunk_kda_combine
from .chunk_prepare import AUX_SIZE, chunk_kda_prepare
from .chunk_recurrent import chunk_kda_recurrent
from .config import DEFAULT_CONFIG, KernelConfig
from .contract import Problem, device_ok, prefill_problem
from .launch_plan import LaunchPlan, fp16_guard, plan_launch
from .pool import checkpoint_buffer
from .tables import Sequences, fixed_sequences, varlen_sequences

#: multiprocessors assumed by the launch plan in the Triton interpreter (an H200's count)
INTERPRETER_SMS = 132
_SMS: dict[int, int] = {}
_GUARDS = {"inline": True, "launch": "launch"}  # chunk_kda_recurrent's guard


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _hopper(device: torch.device) -> bool:
    """Whether ``device`` is a Hopper GPU, where the Gluon kernels run (wgmma; Gluon has no
    interpreter). ``train_memory_cpu.py`` stubs the backward's use to count that path."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def _gluon(seqs: Sequences, dot: str, config: KernelConfig) -> str:
    """``plan_launch``'s ``gluon``: "no" unless the call's products are fp16 on a Hopper GPU
    (wgmma; Gluon has no interpreter) and ``config.stage2`` allows it; "only" when asked for.
    (``chunk_recurrent_ws.applies`` checks the tensors themselves at the launch.)"""
    if config.stage2 == "triton" or dot != "fp16" or not _hopper(seqs.device):
        return "no"
    return "only" if config.stage2 == "gluon" else "yes"


def _capturing(seqs: Sequences) -> bool:
    """Whether the call is being captured into a CUDA graph (its host time then never
    recurs: a replay launches nothing from the host)."""
    return seqs.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def plan_for(seqs: Sequences, p: Problem, config: KernelConfig, dot: str = "fp16") -> LaunchPlan:
    """The launch plan of a call (cached with its sequence tables). Under CUDA-graph capture
    the Gluon stage 2 takes the place of the Triton kernel wherever the plan is the Triton
    kernel's BV-64 tile on 4 warps, the Gluon kernel's own, so the same bits: the host time
    that keeps the plan off it eagerly (``GLUON_CALL_US``) is not replayed."""
    capturing = _capturing(seqs)
    key = (p.H, p.K, p.V, config, dot, capturing)
    plan = seqs.plans.get(key)
    if plan is None:
        gluon = _gluon(seqs, dot, config)
        plan = plan_launch(seqs.n_chunks, p.H, p.K, p.V, _sm_count(seqs.device),
                           block_v=config.block_v, num_warps=config.num_warps,
                           prepare_warps=config.prepare_warps,
                           segment_chunks=config.segment_chunks, gluon=gluon)
        if (capturing and gluon == "yes" and plan.stage2 == "triton" and plan.block_v == 64
                and plan.num_warps == 4):
            plan = dataclasses.replace(plan, stage2="gluon")
        seqs.plans[key] = plan
    return plan


def sequences_for(p: Problem, cu_seqlens, device, entry="chunk_kda_fwd") -> Sequences:
    """The call's sequence tables (``cu_seqlens``' contents checked there, once a tensor);
    then the device is checked (a bad ``cu_seqlens`` is reported first on any device)."""
    seqs = (varlen_sequences(cu_seqlens, p.T) if p.varlen
            else fixed_sequences(device, p.B, p.T))
    device_ok(device, entry)
    return seqs


class Prepared(NamedTuple):
    """A call after stage 1: what stage 2 (forward or backward) needs."""

    p: Problem
    seqs: Sequences
    plan: LaunchPlan
    dot: str
    ops: tuple  # stage 1's (w, qg, kend, klo, ainv, mqk, gamma)
    inverse: str = "neumann"  # how stage 1 formed (I + L)^-1 (chunk_kda_prepare)
    aux: Optional[torch.Tensor] = None  # for stage 1's backward (chunk_kda_prepare's aux)


def prepare(q, k, g, beta, A_log, dt_bias, p: Problem, cu_seqlens,
            config: KernelConfig, products=None, precision="tf32", aux=False) -> Prepared:
    """Tables, plan and stage 1 of a checked call (inputs contiguous, dt_bias flat);
    ``products``, ``precision``: stage 1's storage dtype instead of its default and its
    products' precision (chunk_kda_prepare); ``config.dot`` "fp32" stores fp32 with 3xTF32
    products whatever they say. ``aux``: the backward's recompute also keeps what stage 1's
    backward reads (``Prepared.aux``; gates without a span check, else None)."""
    seqs = sequences_for(p, cu_seqlens, q.device)
    dot = config.dot if config.dot != "auto" else ("fp16" if p.use_qk_l2norm else "tf32")
    inverse = "neumann"
    if dot == "fp32":
        products, precision, inverse = torch.float32, "tf32x3", "substitution"
    plan = plan_for(seqs, p, config, dot)
    kept = None
    if aux and not p.gate.span_checked:
        kept = torch.empty((seqs.num_chunks, p.H, AUX_SIZE.value), device=q.device,
                           dtype=torch.float32)
    ops = chunk_kda_prepare(q, k, g, beta, A_log, dt_bias, p, seqs,
                            num_warps=plan.prepare_warps, dtype=products,
                            precision=precision, inverse=inverse, aux=kept)
    return Prepared(p, seqs, plan, dot, ops, inverse, kept)


def contiguous(q, k, v, g, beta, A_log, dt_bias, initial_state):
    """The tensors as the kernels read them: contiguous, dt_bias flat ([HG * K])."""
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    A_log = None if A_log is None else A_log.contiguous()
    dt_bias = None if dt_bias is None else dt_bias.reshape(-1).contiguous()
    initial_state = None if initial_state is None else initial_state.contiguous()
    return q, k, v, g, beta, A_log, dt_bias, initial_state


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
    lower_bound: float | None = -5.0,
    gate: str = "raw",
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    beta_is_logits: bool = True,
    state_layout: str = "KV",
    config: KernelConfig = DEFAULT_CONFIG,
    state_pool: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    checkpoint_every: int | None = None,
):
    """Chunked KDA forward (chunk 16) on Triton.

    Args follow fla's ``chunk_kda``: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, beta
    ``[B, T, HV]`` (logits when ``beta_is_logits``), g ``[B, T, H or HV, K]``. q, k, v, g,
    beta: bf16, fp16 or fp32; K and V each one of 16, 32, 64, 128, 256. GVA: HV = G·H value
    heads share q's H heads; g, A_log and dt_bias have H or HV heads (fla's layout is HV),
    the state HV.

    The gate (``contract.Gate``): with ``gate="raw"`` (the default) g is the gate's input and
    the log-decay is ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` for a finite
    ``lower_bound < 0`` (K3's bounded gate), or ``-exp(A_log) * softplus(g + dt_bias)`` with
    ``lower_bound=None`` (fla's unbounded gate); A_log ``[HG]`` and dt_bias ``[HG * K]`` or
    ``[HG, K]`` optional. With ``gate="log_decay"`` g is the log-decay itself (<= 0, fp32 or
    bf16; fla's ``use_gate_in_kernel=False``), A_log and dt_bias absent. Every chunk whose
    decay is wider than the split exponent's range is computed per pair, exactly
    (docs/kernels.md "The gate"): a log-decay below ``lower_bound`` is no error, and a
    bounded gate with ``lower_bound >= -5`` never needs the check.

    ``initial_state`` is fp32 or bf16, ``[N, HV, K, V]`` (state_layout "KV") or
    ``[N, HV, V, K]`` ("VK"), N = B, or the number of sequences with ``cu_seqlens`` (int32 or
    int64, then B must be 1; zero-length sequences allowed).

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
    p = prefill_problem(q, k, v, g, beta, scale=scale, initial_state=initial_state, A_log=A_log,
                        dt_bias=dt_bias, gate=gate, lower_bound=lower_bound,
                        cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                        beta_is_logits=beta_is_logits, state_layout=state_layout, config=config,
                        state_pool=state_pool, state_indices=state_indices,
                        checkpoint_every=checkpoint_every)
    if not isinstance(output_final_state, bool):
        raise ValueError(f"output_final_state must be True or False, got {output_final_state!r}")
    q, k, v, g, beta, A_log, dt_bias, initial_state = contiguous(q, k, v, g, beta, A_log,
                                                                 dt_bias, initial_state)
    c = prepare(q, k, g, beta, A_log, dt_bias, p, cu_seqlens, config)
    o, final_state, ck = forward_stage2(
        v, c, initial_state, config, output_final_state=output_final_state,
        state_pool=state_pool, state_indices=state_indices, checkpoint_every=checkpoint_every)
    if checkpoint_every is not None:
        return o, final_state, ck
    return o, final_state


def forward_stage2(v, c: Prepared, initial_state, config: KernelConfig, *,
                   output_final_state, state_pool=None, state_indices=None,
                   checkpoint_every=None, checkpoint_dtype=None):
    """Stage 2 of a prepared call: (o, final state or None, checkpoints or None).
    ``checkpoint_dtype``: the checkpoints' dtype (default: the state's)."""
    p, seqs, plan = c.p, c.seqs, c.plan
    device = v.device
    serving = {}
    if state_pool is not None:
        initial_state = state_pool
        serving["state_indices"] = state_indices.contiguous()
    state_dtype = initial_state.dtype if initial_state is not None else torch.float32
    ck = None
    if checkpoint_every is not None:
        ck, ck_offsets = checkpoint_buffer(seqs, p.B, p.T, p.H, p.K, p.V, checkpoint_every,
                                           state_layout=p.state_layout,
                                           dtype=checkpoint_dtype or state_dtype)
        serving.update(checkpoints=ck, checkpoint_offsets=ck_offsets,
                       checkpoint_chunks=checkpoint_every // 16)
    if state_pool is not None:
        final_state = state_pool
    elif output_final_state:
        final_state = torch.empty(p.state_shape(p.num_seqs), device=device, dtype=state_dtype)
    else:
        final_state = None
    guard = False
    if c.dot == "fp16":
        guard = _GUARDS[fp16_guard(plan) if config.fp16_guard == "auto" else config.fp16_guard]
    launch = dict(initial_state=initial_state, final_state=final_state, state_vk=p.state_vk,
                  cu_seqlens=seqs.cu32, chunk_offsets=seqs.chunk_offsets,
                  seq_order=seqs.seq_order, num_seqs=p.num_seqs, block_v=plan.block_v,
                  num_warps=plan.num_warps, dot=c.dot, guard=guard, **serving)
    run = chunk_kda_recurrent
    if plan.stage2 == "gluon":  # the Gluon kernel, where the tensors suit it
        from . import chunk_recurrent_ws

        if chunk_recurrent_ws.applies(v, c.ops, c.dot):
            run = chunk_recurrent_ws.chunk_kda_recurrent_ws
    if plan.segment_chunks <= 0:
        o = run(v, *c.ops, **launch)
    else:
        table, seg_offsets, n_segs = seqs.segments(plan.segment_chunks)
        summary = torch.empty((n_segs, p.H, p.V + p.K, p.K), device=device,
                              dtype=torch.float32)
        o = torch.empty_like(v)
        stages = dict(launch, segments=table, summary=summary, o=o)
        run(v, *c.ops, **stages, passes=(1,))
        chunk_kda_combine(summary, seg_offsets, initial_state, num_seqs=p.num_seqs,
                          state_vk=p.state_vk, H=p.H, K=p.K, V=p.V,
                          state_indices=launch.get("state_indices"))
        run(v, *c.ops, **stages, passes=(2,))
    if state_pool is not None:
        final_state = None  # the final states are in the pool
    return o, final_state, ck


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
    lower_bound: float | None = -5.0,
    gate: str = "raw",
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
    p = prefill_problem(q, k, v, g, beta, scale=scale, initial_state=None, A_log=A_log,
                        dt_bias=dt_bias, gate=gate, lower_bound=lower_bound,
                        cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                        beta_is_logits=beta_is_logits, state_layout="KV", config=config)
    q, k, v, g, beta, A_log, dt_bias, _ = contiguous(q, k, v, g, beta, A_log, dt_bias, None)
    c = prepare(q, k, g, beta, A_log, dt_bias, p, cu_seqlens,
                dataclasses.replace(config, segment_chunks=0))
    seqs = c.seqs
    # one segment per sequence: the segment length covers the longest sequence
    table, _, n_segs = seqs.segments(max(1, max(seqs.n_chunks, default=1)))
    summary = torch.empty(n_segs, p.H, p.V + p.K, p.K, device=v.device, dtype=torch.float32)
    chunk_kda_recurrent(v, *c.ops, initial_state=None, final_state=None, state_vk=False,
                        cu_seqlens=seqs.cu32, chunk_offsets=seqs.chunk_offsets,
                        num_seqs=p.num_seqs, block_v=c.plan.block_v,
                        num_warps=c.plan.num_warps, dot=c.dot, guard=c.dot == "fp16",
                        segments=table, summary=summary, passes=(1,), skip_last=False)
    R = summary[:, :, :p.V, :].transpose(-1, -2)
    M = summary[:, :, p.V:, :].transpose(-1, -2)
    return M, R
