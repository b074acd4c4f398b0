"""The differentiable ``chunk_kda``: a torch custom op (``torch.ops.kdalab.chunk_kda``) with its
backward registered (``torch.library.register_autograd``), so that autograd and
``torch.compile(fullgraph=True)`` see one opaque operator each way.

Forward: stage 1, then stage 2 keeping the state every 64 tokens (fp32; the checkpoints of
``pool.py``, written from the recurrence as it runs). Saved for the backward: the inputs (no
copies) and those states. Nothing of stage 1 is kept: the backward forms it again.

Backward (docs/training.md): stage 1 again, the reverse pass (``chunk_recurrent_bwd.py``,
serial or sequence-parallel as the forward's plan), then stage 1's backward
(``chunk_prepare_bwd.py``); GVA's heads and the per-chunk parameter gradients are summed on the
host.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import Tensor

from .api import _hopper, _sm_count, chunk_kda_fwd, contiguous, forward_stage2, prepare
from .chunk_blocks_bwd import chunk_kda_bwd_blocks
from .chunk_prepare_bwd import chunk_kda_prepare_bwd
from .chunk_recurrent_bwd import CKC, chunk_kda_bwd_recurrent
from .config import DEFAULT_CONFIG, DOT_PRECISION, KernelConfig
from .contract import prefill_problem
from .launch_plan import ds_value_block, plan_reverse

__all__ = ["chunk_kda"]

#: the forward keeps the state every this many tokens for the backward
SAVE_EVERY = 16 * CKC
#: the reverse pass's operand types for its products with S and with dS (fp32: tf32
#: products; docs/training.md "Precision")
BWD_PRODUCTS = dict(s_dtype=torch.float32, ds_dtype=torch.float32)
#: stage 1's backward: key columns a block; the reverse pass: the serial dS pass's value
#: columns a program (0: ``ds_value_block``'s choice), the blocks kernel's pipeline stages
#: (0: ``blocks_kernel_stages``'s choice); stage 1's backward's register cap and pipeline
#: stages (0: Triton's). Measured (H200, the kernel's GPU time; docs/training.md): a cap of
#: 168 registers (three programs an SM on 4 warps, 244 bytes of spills) without pipelining,
#: against Triton's 255 and 3 stages: 0.87x at T 8192 H 64 and T 4096 H 16, 0.86x at B 8
#: T 4096 H 32, 0.94x at T 1024 H 16; a cap of 128 alone 1.17-1.25x, 168 alone 0.99x.
#: dkend_over_du: dKEND written over dU where one value block and K = V allow (8 MiB less at
#: the peak at T 1024 H 16; 0 for its own buffer). prep_warps: stage 1's backward's warps (2,
#: uncapped, on an H100: 1.05x at T 4096 H 16, 1.10x at T 8192 H 64; docs/training.md)
#: ds_segment: the dS pass's segments (chunks, whole 64-token blocks; K <= 128), given (0: as
#: ds_plan says); ds_plan: 1, the dS pass's own split (``launch_plan.plan_reverse``) unless the
#: config gives segment_chunks, 0: the forward plan's (an H100, the step: 0.585 against 0.686
#: ms at T 1024 H 16, 1.074 against 1.122 at T 4096 H 8; docs/training.md)
#: (The dS pass in 64-token steps, a candidate, ran 1.47-1.84x slower than this 16-token one
#: on an H100 and was deleted: docs/training.md, ds64_h100)
#: ds_gluon: the dS pass by the Gluon kernel (``chunk_recurrent_bwd_ws``) on a Hopper GPU where
#: it applies, 3 with its choice of value blocks a program, 1 or 2 with that many; 0: the
#: Triton kernel everywhere (H100, the backward: 1.557 against 1.732 ms at T 4096 H 16, 0.451
#: against 0.489 at T 1024 H 16, 10.56 against 11.64 at T 8192 H 64; docs/training.md)
#: blocks_gluon: the blocks kernel by the Gluon kernel (``chunk_blocks_bwd_ws``) on a Hopper
#: GPU where it applies; 0: the Triton kernel everywhere (H100, the kernel at 35d5b54: 0.544
#: against 0.756 ms at T 4096 H 16, 4.21 against 5.70 at T 8192 H 64; docs/training.md)
#: prep_aux: 1: the recompute of stage 1 keeps P, (I + L)^-1 and the norm factors in fp32
#: for stage 1's backward, which then skips its sweep (A), P's products and the inverse
#: (gates without a span check; ``chunk_prepare``'s AUX); 0: stage 1's backward forms them
#: (an H100, with its products over the chunk's rows on FMAs: stage 1's backward 0.309
#: against 0.403 ms at T 4096 H 16, the step 1.498 against 1.591; 2.35 against 3.08 and
#: 9.38 against 10.22 at T 8192 H 64; memory 119.1 against 118.0 MiB at T 1024 H 16, fla's
#: 121.6; docs/training.md)
BWD_MODE = dict(prep_block_k=32, ds_block_v=0, blocks_stages=0, prep_maxnreg=168,
                prep_stages=1, dkend_over_du=1, ds_segment=0, ds_plan=1, ds_gluon=3,
                blocks_gluon=1, prep_aux=1, prep_warps=4)


def bwd_mode_settings(text: str) -> dict[str, int]:
    """``KEY=INT,...`` of :data:`BWD_MODE`'s keys (the benchmarks' and the device script's one
    parse; empty text: none). A ValueError names an item that is not ``KEY=INT`` or a key
    BWD_MODE lacks, listing its keys."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key] = int(value)
        except ValueError:
            raise ValueError(f"{item!r} is not KEY=INT") from None
        if key not in BWD_MODE:
            raise ValueError(f"BWD_MODE has {', '.join(sorted(BWD_MODE))}, not {key!r}")
    return out


def _config(dot, block_v, num_warps, prepare_warps, segment_chunks, fp16_guard):
    none = lambda x: None if x < 0 else x  # noqa: E731 - the op's ints: -1 for None
    return KernelConfig(dot=dot, block_v=none(block_v), num_warps=none(num_warps),
                        prepare_warps=none(prepare_warps), segment_chunks=none(segment_chunks),
                        fp16_guard=fp16_guard)


def _problem(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, lower_bound,
             gate, use_qk_l2norm, beta_is_logits, state_layout, config):
    return prefill_problem(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           A_log=A_log, dt_bias=dt_bias, gate=gate, lower_bound=lower_bound,
                           cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                           beta_is_logits=beta_is_logits, state_layout=state_layout,
                           config=config)


@torch.library.custom_op("kdalab::chunk_kda", mutates_args=())
def chunk_kda_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                 A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                 initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
                 scale: Optional[float], lower_bound: Optional[float], gate: str,
                 use_qk_l2norm: bool, beta_is_logits: bool, state_layout: str,
                 output_final_state: bool, dot: str, block_v: int, num_warps: int,
                 prepare_warps: int, segment_chunks: int, fp16_guard: str,
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """(o, final state or [0], the states the backward reads)."""
    config = _config(dot, block_v, num_warps, prepare_warps, segment_chunks, fp16_guard)
    p = _problem(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
                 lower_bound, gate, use_qk_l2norm, beta_is_logits, state_layout, config)
    q, k, v, g, beta, A_log, dt_bias, h0 = contiguous(q, k, v, g, beta, A_log, dt_bias,
                                                      initial_state)
    c = prepare(q, k, g, beta, A_log, dt_bias, p, cu_seqlens, config)
    o, final, ck = forward_stage2(v, c, h0, config, output_final_state=output_final_state,
                                  checkpoint_every=SAVE_EVERY, checkpoint_dtype=torch.float32)
    return o, (final if final is not None else v.new_empty(0)), ck


@chunk_kda_op.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, lower_bound, gate,
      use_qk_l2norm, beta_is_logits, state_layout, output_final_state, dot, block_v,
      num_warps, prepare_warps, segment_chunks, fp16_guard):
    B, T, H, V = v.shape
    K = q.shape[-1]
    n = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    tail = (H, V, K) if state_layout == "VK" else (H, K, V)
    dtype = initial_state.dtype if initial_state is not None else torch.float32
    final = v.new_empty((n, *tail), dtype=dtype) if output_final_state else v.new_empty(0)
    ck = v.new_empty((B * (T // SAVE_EVERY), *tail), dtype=torch.float32)
    return torch.empty_like(v), final, ck


@torch.library.custom_op("kdalab::chunk_kda_bwd", mutates_args=())
def chunk_kda_bwd_op(do: Tensor, dht: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                     g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                     dt_bias: Optional[Tensor], initial_state: Optional[Tensor],
                     checkpoints: Tensor, cu_seqlens: Optional[Tensor],
                     scale: Optional[float], lower_bound: Optional[float], gate: str,
                     use_qk_l2norm: bool, beta_is_logits: bool, state_layout: str,
                     dot: str, block_v: int, num_warps: int, prepare_warps: int,
                     segment_chunks: int, fp16_guard: str) -> list[Tensor]:
    """[dq, dk, dv, dg, dbeta, dA_log or [0], ddt_bias or [0], dh0 or [0]]."""
    config = _config(dot, block_v, num_warps, prepare_warps, segment_chunks, fp16_guard)
    p = _problem(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
                 lower_bound, gate, use_qk_l2norm, beta_is_logits, state_layout, config)
    grads = backward(do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, checkpoints,
                     cu_seqlens, p, config)
    return [x if x is not None else v.new_empty(0) for x in grads]


@chunk_kda_bwd_op.register_fake
def _(do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, checkpoints, cu_seqlens,
      scale, lower_bound, gate, use_qk_l2norm, beta_is_logits, state_layout, dot, block_v,
      num_warps, prepare_warps, segment_chunks, fp16_guard):
    like = lambda x: torch.empty_like(x) if x is not None else v.new_empty(0)  # noqa: E731
    return [like(q), like(k), like(v), like(g), like(beta), like(A_log), like(dt_bias),
            like(initial_state)]


def backward(do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, checkpoints,
             cu_seqlens, p, config: KernelConfig):
    """The gradients (dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0), each like its input
    (None where the input is absent)."""
    dt_shape = None if dt_bias is None else dt_bias.shape
    q, k, v, g, beta, A_log, dt_bias, h0 = contiguous(q, k, v, g, beta, A_log, dt_bias,
                                                      initial_state)
    do = do.contiguous()
    # an unbounded decay's QG and W reach below fp16's range inside a chunk (exp(-20) at one
    # step of -20): fp16 products flush them to zero, and with them the whole of dh0, which
    # lives there (relative error 1.0 at -20 a step, 5e-2 at -12; the H200's check --grad):
    # the recompute stores them in fp32 then, the bounded gate keeps the forward's fp16
    products = torch.float32 if p.gate.span_checked else None
    # stage 1's products in 3xTF32: their tf32 rounding reaches dA_log and dβ through
    # (I + L)^-1 on clustered keys with β near 1
    # (the plan's segments, which the reverse pass follows, are the Triton model's: the
    # forward's Gluon figures say nothing of the reverse pass)
    c = prepare(q, k, g, beta, A_log, dt_bias, p, cu_seqlens,
                dataclasses.replace(config, stage2="triton"), products=products,
                precision="tf32x3", aux=bool(BWD_MODE["prep_aux"]))
    seqs, plan = c.seqs, c.plan
    if dht is not None:
        dht = dht.contiguous()
    B, T, H, K, V = p.B, p.T, p.H, p.K, p.V
    # the reverse pass's tile: the config's (a recurrent program's value columns and warps)
    block_v = min(config.block_v or 128, V)
    sms = _sm_count(v.device)
    # config.dot "fp32": every product of the reverse pass in 3xTF32, as the forward's, on at
    # most 4 warps where a program has 64 value columns or fewer: at K = V = 64 the dS pass on
    # 8 warps faulted (an illegal address; triton 3.6, an H100), and so did the blocks kernel
    # alone on 8 (an H200, docs/training.md "The fp32 path"): the cap is both launches'
    warps = config.num_warps or 8
    if c.dot == "fp32" and block_v <= 64:
        warps = min(warps, 4)
    tile = dict(state_vk=p.state_vk, block_v=block_v, num_warps=warps, sms=sms,
                ds_dtype=BWD_PRODUCTS["ds_dtype"],
                precision=DOT_PRECISION[c.dot])
    blocks, block_offsets, _ = seqs.segments(CKC)
    segments = None
    # the serial dS pass's value columns a program, once: the plan's estimate and the launch
    serial_bv = ds_value_block(p.num_seqs * H, V, block_v, warps, sms,
                               BWD_MODE["ds_block_v"] or None)
    seg_chunks = plan.segment_chunks
    if BWD_MODE["ds_segment"] and K <= 128:  # the combine holds a K x K transition
        seg_chunks = BWD_MODE["ds_segment"]
    elif BWD_MODE["ds_plan"] and config.segment_chunks is None:  # a given split is kept
        # cached with the sequence tables, as the forward's plan: the estimate walks every
        # sequence for each candidate length (0.74 ms a call at 1024 sequences)
        key = ("reverse", H, K, V, block_v, serial_bv)
        if key not in seqs.plans:
            seqs.plans[key] = plan_reverse(seqs.n_chunks, H, K, V, sms, block_v, serial_bv)
        seg_chunks = seqs.plans[key]
    if seg_chunks > 0:  # segments of whole blocks
        segments = seqs.segments(-(-seg_chunks // CKC) * CKC)
    hopper = _hopper(v.device)
    du, ends = chunk_kda_bwd_recurrent(
        do, c.ops, dht=dht, cu_seqlens=seqs.cu32, chunk_offsets=seqs.chunk_offsets,
        num_seqs=p.num_seqs, seq_order=seqs.seq_order, n_blocks=blocks.shape[0],
        block_offsets=block_offsets, segments=segments, ds_block_v=serial_bv,
        gluon=BWD_MODE["ds_gluon"] if hopper else 0, **tile)
    out = chunk_kda_bwd_blocks(
        v, do, c.ops, du, ends, initial_state=h0, checkpoints=checkpoints,
        checkpoint_offsets=_offsets(seqs), num_chunks=seqs.num_chunks, blocks=blocks,
        chunk_table=seqs.chunk_table, s_dtype=BWD_PRODUCTS["s_dtype"],
        stages=BWD_MODE["blocks_stages"] or None,
        dkend_over_du=bool(BWD_MODE["dkend_over_du"]),
        gluon=bool(BWD_MODE["blocks_gluon"]) and hopper, **tile)
    del du, ends
    grads = dict(out)
    for name in ("dqg", "dw", "dkend", "dgam", "dmqk", "dainv"):  # the value blocks' sums
        grads[name] = out[name][0] if out[name].shape[0] == 1 else out[name].sum(0)
    dq, dk, dg, db, dalog, ddt = chunk_kda_prepare_bwd(q, k, g, beta, A_log, dt_bias, p, seqs,
                                                       grads, block_k=BWD_MODE["prep_block_k"],
                                                       num_warps=BWD_MODE["prep_warps"],
                                                       maxnreg=BWD_MODE["prep_maxnreg"] or None,
                                                       num_stages=BWD_MODE["prep_stages"] or None,
                                                       inverse=c.inverse, aux=c.aux)
    dv, dh0 = out["dv"], out["dh0"]
    del c, out, grads  # stage 1 again and the partial sums: freed before the GVA sums
    GQ, GG = H // p.HQ, H // p.HG
    if GQ > 1:  # GVA: the value heads of a q/k head
        dq = dq.view(B, T, p.HQ, GQ, K).sum(3)
        dk = dk.view(B, T, p.HQ, GQ, K).sum(3)
    if GG > 1:
        dg = dg.view(B, T, p.HG, GG, K).sum(3)
    if dalog is not None:
        dalog = dalog.sum(0)
        dalog = (dalog.view(p.HG, GG).sum(1) if GG > 1 else dalog).to(A_log.dtype)
    if ddt is not None:
        ddt = ddt.sum(0)
        ddt = (ddt.view(p.HG, GG, K).sum(1) if GG > 1 else ddt).reshape(dt_shape)
        ddt = ddt.to(dt_bias.dtype)
    return (dq.to(q.dtype), dk.to(k.dtype), dv, dg.to(g.dtype),
            db.to(beta.dtype), dalog, ddt,
            None if dh0 is None else dh0.to(initial_state.dtype))


def _offsets(seqs):
    from .pool import checkpoint_table

    return checkpoint_table(seqs, SAVE_EVERY)[0]


_OPTIONS = ("scale", "lower_bound", "gate", "use_qk_l2norm", "beta_is_logits", "state_layout",
            "dot", "block_v", "num_warps", "prepare_warps", "segment_chunks", "fp16_guard")


def _setup_context(ctx, inputs, output):
    (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, lower_bound, gate,
     use_qk_l2norm, beta_is_logits, state_layout, output_final_state, dot, block_v,
     num_warps, prepare_warps, segment_chunks, fp16_guard) = inputs
    ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                          output[2])
    ctx.options = (scale, lower_bound, gate, use_qk_l2norm, beta_is_logits, state_layout,
                   dot, block_v, num_warps, prepare_warps, segment_chunks, fp16_guard)
    ctx.output_final_state = output_final_state
    # the checkpoints are an output only to be saved: no gradient, and none made. Autograd
    # otherwise hands the backward a zero tensor of their size (T/64 · H · K · V fp32: 16 MiB
    # at T 1024 H 16, 512 at T 8192 H 64), at the peak (train_memory_cpu: 145.0 -> 129.0 MiB
    # at T 1024 H 16); absent gradients come as None instead
    ctx.mark_non_differentiable(output[2])
    ctx.set_materialize_grads(False)


def _backward(ctx, do, dht, _dck):
    q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, ck = ctx.saved_tensors
    if do is None:  # a loss on the final state alone
        do = torch.zeros_like(v)
    if not ctx.output_final_state or dht is None or dht.numel() == 0:
        dht = None
    grads = torch.ops.kdalab.chunk_kda_bwd(do, dht, q, k, v, g, beta, A_log, dt_bias,
                                           initial_state, ck, cu_seqlens, *ctx.options)
    dq, dk, dv, dg, db, dalog, ddt, dh0 = grads
    none = lambda x, ref: x if ref is not None else None  # noqa: E731
    return (dq, dk, dv, dg, db, none(dalog, A_log), none(ddt, dt_bias),
            none(dh0, initial_state), None, None, None, None, None, None, None, None, None,
            None, None, None, None, None)


torch.library.register_autograd("kdalab::chunk_kda", _backward, setup_context=_setup_context)


def chunk_kda(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    lower_bound: float | None = -5.0,
    gate: str = "raw",
    cu_seqlens: Tensor | None = None,
    use_qk_l2norm: bool = True,
    beta_is_logits: bool = True,
    state_layout: str = "KV",
    config: KernelConfig = DEFAULT_CONFIG,
):
    """Chunked KDA, differentiable: ``chunk_kda_fwd``'s arguments (no pool, no checkpoints),
    returning ``(o, final_state)`` (final_state None unless ``output_final_state``).
    Gradients reach q, k, v, g (the gate's input, or the log-decay with ``gate="log_decay"``),
    beta (logits or probabilities), A_log, dt_bias and initial_state, and flow in through the
    final state too. One custom op each way (``torch.ops.kdalab.chunk_kda`` and
    ``.chunk_kda_bwd``), so ``torch.compile(fullgraph=True)`` traces a training step. Where no
    input requires a gradient (or grad mode is off) it is ``chunk_kda_fwd``: the states every
    64 tokens are kept only for a backward. ``config.stage2`` is not carried by the op: a
    training step's forward runs the plan's choice ("auto")."""
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config must be a KernelConfig, got {type(config).__name__}")
    if not isinstance(output_final_state, bool):
        raise ValueError(f"output_final_state must be True or False, got {output_final_state!r}")
    tensors = (q, k, v, g, beta, A_log, dt_bias, initial_state)
    if not (torch.is_grad_enabled()
            and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)):
        # no gradient asked: the forward alone, without the states kept for a backward
        return chunk_kda_fwd(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state, A_log=A_log,
                             dt_bias=dt_bias, lower_bound=lower_bound, gate=gate,
                             cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm,
                             beta_is_logits=beta_is_logits, state_layout=state_layout,
                             config=config)
    opt = lambda x: -1 if x is None else x  # noqa: E731
    c = dataclasses.astuple(config)
    names = [f.name for f in dataclasses.fields(config)]
    cfg = dict(zip(names, c))
    o, final, _ = torch.ops.kdalab.chunk_kda(
        q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
        None if scale is None else float(scale),
        None if lower_bound is None else lower_bound, gate, use_qk_l2norm, beta_is_logits,
        state_layout, output_final_state, cfg["dot"], opt(cfg["block_v"]),
        opt(cfg["num_warps"]), opt(cfg["prepare_warps"]), opt(cfg["segment_chunks"]),
        cfg["fp16_guard"])
    return o, (final if output_final_state else None)
