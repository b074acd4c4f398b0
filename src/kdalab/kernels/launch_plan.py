"""Launch shapes chosen from the problem: the recurrent programs' value block and warps, and
whether (and how finely) to split sequences into segments for the sequence-parallel state
pass; at the end, the backward's reverse pass's (``chunk_recurrent_bwd.py``).

The recurrent stage is a serial chain of one step per 16-token chunk, run by one program per
(sequence, head, block of value columns). When those programs cannot fill the GPU (few heads,
long sequences), splitting each sequence into segments of ``L`` chunks multiplies the
programs by the segment count, at the price of a summary pass over all but the last segment
(with K more rows: the segment's transition M), a short serial combine, and the same output
pass as before (``chunk_recurrent.py``, ``chunk_combine.py``). ``plan_launch`` estimates each
choice with the cost model below and takes the fastest.

The model (µs; measured by ``bench_kernel.py --explore``; the figures, where and when, in
docs/kernels.md "Launch plan"): a program's step takes ``lat_alone`` when it has an SM to
itself and ``lat_shared`` when the SM holds as many programs as fit (registers: two of BV = 64
on 4 warps, one of BV = 128 on 8 warps); a pass takes the longer of its longest program's
chain and its total steps spread over the SMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CHUNK = 16


@dataclass(frozen=True)
class StepCost:
    """One recurrent program shape: value rows, warps, programs an SM holds, and the step
    latency alone on an SM and with the SM full, for a step with outputs (``full``) and a
    summary step (pass 1: no output products)."""

    block_v: int
    num_warps: int
    per_sm: int
    full_alone: float
    full_shared: float
    summary_alone: float
    summary_shared: float
    kernel: str = "triton"


# Measured (the run: docs/kernels.md "Launch plan"), K = V = 128, fp16 products: BV = 64 on 4 warps
# (240-250 registers: 2 programs an SM) 0.97 µs a step alone (T = 8192, H = 64: 128 programs),
# 1.48 µs shared (B = 8, H = 32 and varlen 1024 x 8: 2.6-3.9 waves of 264 programs); summary
# steps 1.0 µs shared (T = 131072, H = 8 and T = 524288, H = 4). BV = 128 on 8 warps (255
# registers: one an SM) 1.15 µs a step (T = 8192, H = 96: 96 programs). The summary steps
# alone are not measured: taken as the full steps' alone/shared ratio of their shared time.
STEP_COSTS = (
    StepCost(64, 4, 2, full_alone=0.97, full_shared=1.48, summary_alone=0.66,
             summary_shared=1.0),
    StepCost(128, 8, 1, full_alone=1.15, full_shared=1.15, summary_alone=0.78,
             summary_shared=0.78),
)
# The Gluon stage 2 (chunk_recurrent_ws.py: BV 64, a loader warp and one compute warpgroup,
# two programs an SM), as ratios to the Triton kernel's stage 2 in the same H200 runs (each
# call's time less stage 1's; benchmarks/results/raw/logs/explore_31e02c3.json, grid_31e02c3.json
# and grid_gluon_order.json): 0.66x the BV-64 step alone (T =
# 8192, H = 64), 0.78-0.83x a BV-128 step's SM time shared (B = 8, T = 4096, H = 32; B = 16,
# T = 1024, H = 32; varlen 512 x 16 and 1024 x 8 at H = 64); summary steps at the Triton
# summary/full ratio (not measured alone). At T = 131072, H = 8 the model then takes segments
# of 512 chunks, not timed with Gluon (256: 2.285 ms, 1024: 2.469; the Triton plan 2.478).
GLUON_COST = StepCost(64, 4, 2, full_alone=0.64, full_shared=0.93, summary_alone=0.44,
                      summary_shared=0.63, kernel="gluon")
#: a call through the Gluon kernel takes at least this long (µs; host time: its tensor
#: descriptors, two launches a pass): 0.30-0.58 ms measured where its GPU work was under 0.25
#: ms (T = 1024 H = 16, T = 2048 H = 32, T = 4096 H = 8 with states), so the plan weighs the
#: whole call, stage 1 (``STAGE1_NS`` a token-head) and stage 2, against it
GLUON_CALL_US = 600.0
STAGE1_NS = 0.8
COMBINE_STEP_US = 3.0  # one segment of the combine (the whole M^T in registers; estimated)
LAUNCH_US = 8.0        # one more launch (host and device)
SEGMENT_CHUNKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: a split must be estimated this much faster than the serial pass to be taken
MIN_GAIN = 0.85


@dataclass(frozen=True)
class LaunchPlan:
    """What ``chunk_kda_fwd`` launches: the recurrent stage's value block and warps, stage 1's
    warps, the segment length in chunks (0: one serial pass per
    sequence), the model's estimate of the recurrent stage (µs), and its kernel
    (``"triton"``, or ``"gluon"``: chunk_recurrent_ws.py, whose tile is BV 64 on 4 warps)."""

    block_v: int
    num_warps: int
    prepare_warps: int
    segment_chunks: int
    estimate_us: float = float("nan")
    stage2: str = "triton"


def default_prepare_warps(K: int) -> int:
    """Stage 1's warps: 2 at K = 128 (measured fastest on the H200: 0.43 ms against 0.60 on 4
    warps at H = 64, T = 8192, stage 1 alone; 1.43 on 8 warps before; no spills), 4 for
    K <= 64, 8 for K = 256 (not measured: fewer would spill)."""
    return 4 if K <= 64 else 2 if K == 128 else 8


def _step(cost: StepCost, programs: int, sms: int, summary: bool) -> float:
    """A step's latency when ``programs`` programs share ``sms`` SMs."""
    alone = cost.summary_alone if summary else cost.full_alone
    shared = cost.summary_shared if summary else cost.full_shared
    # alone: 0.84 µs with 16-32 programs on the GPU (T >= 65536, H <= 16, serial), 0.97 with
    # one on every SM (T = 8192, H = 64): memory traffic of the other SMs; scaled likewise
    alone *= 0.87 + 0.13 * min(1.0, programs / sms)
    if programs <= sms or cost.per_sm == 1:
        return alone
    full = min(1.0, (programs / sms - 1) / (cost.per_sm - 1))  # share of SMs that are full
    return alone + (shared - alone) * full


def _pass_us(cost: StepCost, programs: int, longest: int, total_steps: int, sms: int,
             summary: bool) -> float:
    if programs == 0:
        return 0.0
    chain = longest * _step(cost, programs, sms, summary)
    spread = total_steps * _step(cost, programs, sms, summary) / (sms * cost.per_sm)
    return max(chain, spread)


def estimate_us(n_chunks, H: int, K: int, V: int, cost: StepCost, segment_chunks: int,
                sms: int) -> float:
    """Estimated time of the recurrent stage (µs) for sequences of ``n_chunks`` chunks each."""
    vb = math.ceil(V / cost.block_v)
    longest = max(n_chunks, default=0)
    total = sum(n_chunks)
    if segment_chunks <= 0 or segment_chunks >= longest:
        return _pass_us(cost, len(n_chunks) * H * vb, longest, total * H * vb, sms, False)
    L = segment_chunks
    mb = math.ceil((V + K) / cost.block_v)
    segs = [max(1, math.ceil(c / L)) for c in n_chunks]
    # pass 1: every segment but a sequence's last (S and M^T rows); pass 2: every segment
    p1 = sum(s - 1 for s in segs) * H * mb
    steps1 = sum(s - 1 for s in segs) * L * H * mb  # the first s - 1 segments are full
    p2 = sum(segs) * H * vb
    t1 = _pass_us(cost, p1, L, steps1, sms, True)
    t2 = _pass_us(cost, p2, L, total * H * vb, sms, False)
    tc = (max(segs) - 1) * COMBINE_STEP_US
    return t1 + tc + t2 + 2 * LAUNCH_US


def _candidates(K: int, V: int, block_v: int | None, num_warps: int | None, gluon: str):
    """The program shapes to consider: the measured ones that fit V (and the given values),
    the Gluon kernel's where ``gluon`` is "yes" or "only" (then alone) and K, V suit it;
    below V = 64 one block of all V columns, above K = 128 eight warps (the state S^T of
    64 x 256 fp32 would spill on four); a shape without figures gets the nearest one's,
    scaled by its rows."""
    if K > 128 and block_v is None and num_warps is None:
        ref = STEP_COSTS[0]
        return [StepCost(64, 8, 1, ref.full_alone, ref.full_alone, ref.summary_alone,
                         ref.summary_alone)]
    given = [c for c in STEP_COSTS + (GLUON_COST,) if c.block_v <= V
             and block_v in (None, c.block_v) and num_warps in (None, c.num_warps)]
    costs = [c for c in given if c.kernel == "triton" and gluon != "only"]
    if gluon != "no" and K in (64, 128) and V % 64 == 0:
        costs += [c for c in given if c.kernel == "gluon"]
    if costs:
        return costs
    ref = STEP_COSTS[0]
    return [_scaled(ref, block_v or min(ref.block_v, V), num_warps or ref.num_warps)]


def _scaled(ref: StepCost, block_v: int, num_warps: int) -> StepCost:
    """A program shape without figures: ``ref``'s step times scaled by its value rows."""
    scale = block_v / ref.block_v
    return StepCost(block_v, num_warps, ref.per_sm, ref.full_alone * scale,
                    ref.full_shared * scale, ref.summary_alone * scale,
                    ref.summary_shared * scale)


def plan_launch(n_chunks, H: int, K: int, V: int, sms: int, *,
                block_v: int | None = None, num_warps: int | None = None,
                prepare_warps: int | None = None,
                segment_chunks: int | None = None, gluon: str = "no") -> LaunchPlan:
    """The launch plan for sequences of ``n_chunks`` chunks (16 tokens) each, ``H`` heads,
    head dims K and V, on a GPU of ``sms`` multiprocessors. Given values are kept; ``None``
    ones are chosen by the cost model above. Sequence parallelism needs K <= 128 (the
    combine holds a segment's K x K transition in registers). ``gluon``: whether the Gluon
    stage 2 may run ("yes": the model chooses, "only": it runs wherever K and V suit it,
    "no"); the caller says whether the call suits it otherwise (a Hopper GPU, fp16 products).
    Its estimate is at least ``GLUON_CALL_US`` less stage 1's: below that the call waits on
    the host."""
    if segment_chunks and K > 128:
        raise ValueError(f"config.segment_chunks={segment_chunks}: the sequence-parallel pass "
                         f"needs K <= 128, got K={K}")
    pw = prepare_warps or default_prepare_warps(K)
    costs = _candidates(K, V, block_v, num_warps, gluon)
    if K > 128 or (segment_chunks is not None):
        lengths = [0 if K > 128 else segment_chunks or 0]
    else:
        longest = max(n_chunks, default=0)
        lengths = [0] + [L for L in SEGMENT_CHUNKS if 2 * L <= longest]
    best = None
    stage1 = STAGE1_NS * 1e-3 * CHUNK * H * sum(n_chunks)
    for cost in costs:
        host = GLUON_CALL_US - stage1 if cost.kernel == "gluon" else 0.0
        serial = estimate_us(n_chunks, H, K, V, cost, 0, sms)
        for L in lengths:
            t = estimate_us(n_chunks, H, K, V, cost, L, sms)
            if L > 0 and segment_chunks is None and t > MIN_GAIN * serial:
                continue  # a split must clearly win: it adds passes and roundings
            t = max(t, host)
            if best is None or t < best[0]:
                best = (t, cost, L)
    t, cost, L = best
    return LaunchPlan(cost.block_v, cost.num_warps, pw, L, t, cost.kernel)


def fp16_guard(plan: LaunchPlan) -> str:
    """Where the fp16 range guard's tf32 redo runs under ``KernelConfig(fp16_guard="auto")``:
    in a second launch for the serial pass of value blocks of 128 on 8 warps, in the same
    launch otherwise. The redo's code in the same launch costs registers: at BV 128 on 8
    warps ptxas spills 432 bytes a thread with it (triton 3.6, sm_90a), none without; at BV 64
    on 4 warps 56 bytes. Measured on the H200 (docs/kernels.md "Decision record"): a
    second launch is 1.4-5% faster on five serial BV-128 shapes and 1.2% slower at B 128
    T 64 (one more launch in a 0.24 ms call); 1% slower on the split pass (two passes, two
    more launches) and 5% at T 8192 H 64 (BV 64)."""
    serial_wide = plan.segment_chunks == 0 and plan.block_v == 128 and plan.num_warps == 8
    return "launch" if serial_wide else "inline"


def segment_table(seq_starts: torch.Tensor, seq_ends: torch.Tensor, chunk_starts: torch.Tensor,
                  segment_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequence-parallel pass's tables for sequences of rows [start, end) whose first
    chunk has global index ``chunk_starts`` (int64 tensors, any device): an int32 table
    [segments, 6] of (sequence, segment in the sequence, bos, eos, first global chunk, last?),
    and int32 ``seg_offsets`` [N + 1] (each sequence's first segment). An empty sequence has
    one empty segment."""
    L = segment_chunks
    n_chunks = (seq_ends - seq_starts + CHUNK - 1) // CHUNK
    n_segs = torch.clamp((n_chunks + L - 1) // L, min=1)
    offsets = torch.cumsum(n_segs, 0)
    total = int(offsets[-1]) if len(offsets) else 0
    seq = torch.repeat_interleave(torch.arange(len(n_segs), device=n_segs.device), n_segs,
                                  output_size=total)
    p = torch.arange(total, device=n_segs.device) - (offsets - n_segs)[seq]
    bos = seq_starts[seq] + p * L * CHUNK
    eos = torch.minimum(bos + L * CHUNK, seq_ends[seq])
    c0 = chunk_starts[seq] + p * L
    last = (p == n_segs[seq] - 1).to(p.dtype)
    table = torch.stack([seq, p, bos, eos, c0, last], dim=1).to(torch.int32).contiguous()
    seg_offsets = torch.cat([offsets.new_zeros(1), offsets]).to(torch.int32)
    return table, seg_offsets


# ---------------------------------------- the backward's reverse pass (chunk_recurrent_bwd.py)

def resident_programs(sms: int, num_warps: int, value_blocks: int) -> int:
    """Persistent programs per value block of the blocks kernel: as many as the SMs hold at
    once. Its tile takes 255 registers a thread (sm_90a, ``scripts/sm90_report.py``), so an
    SM holds 65,536 // (255 · 32 · num_warps) programs (1 on 8 warps, 2 on 4); more would only
    wait for a free SM, and each running program has its scratch (CKC states and U tiles:
    295 KB at K = V = BV = 128), which is 39 MB on the H200's 132 SMs at the default tile
    (``persistent_programs`` trims it to whole waves; one state less, re-read from the
    checkpoint, was 13-14 % slower on the H200: docs/training.md "Memory")."""
    per_sm = max(1, 65536 // (255 * 32 * num_warps))
    return max(1, sms * per_sm // value_blocks)


def persistent_programs(items: int, resident: int) -> int:
    """The blocks kernel's programs a value block: as few as run ``items`` in as many waves
    as ``resident`` programs would (each program has its scratch; 256 items on 132 SMs: 128
    programs, two waves either way)."""
    if items <= 0:
        return 1
    waves = -(-items // max(1, resident))
    return -(-items // waves)


def ds_value_block(items: int, V: int, block_v: int, num_warps: int, sms: int,
                   given: int | None = None) -> int:
    """The serial dS pass's value columns a program (its rows are independent of each other,
    so any split of V gives the same bits): half of ``block_v`` (on half the warps) where the
    halves' programs are all resident at once (two an SM, by registers), else ``block_v``.
    Measured on the H200 (docs/training.md): at BV 64 against 128, T 8192 H 64 (64
    sequence-heads) 1.99 against 2.62 ms, T 1024 H 16 0.242 against 0.318; B 8 T 4096 H 32 (256,
    two waves either way) 3.06 against 2.67. ``given``: the caller's choice instead."""
    if given:
        return min(given, V)
    half = block_v // 2
    if block_v < 128 or num_warps < 8:  # measured from 128 on 8 warps only (BV 32 on 2
        return min(block_v, V)          # warps: 2.97 ms at T 8192 H 64, slower than both)
    fit = resident_programs(sms, num_warps // 2, -(-V // half))  # per value block, at once
    return min(half if items <= fit else block_v, V)


def blocks_kernel_stages(has_initial_state: bool) -> int:
    """The blocks kernel's ``num_stages``: 2 (Triton's pipeliner loads the next chunk's
    operands through shared memory while the current one computes) without an initial
    state, 1 with one. Measured on the H200, the kernel's GPU time at 2 against 1 stage
    (docs/training.md): 0.925-0.94x on six shapes without a state (T 1024 H 16 to T 8192
    H 64, B 16 T 1024 H 32, varlen), 1.07x and 1.08x on the two with one (B 8 T 4096 H 32,
    T 4096 H 8); 3 stages 1.15-1.35x. The same bits either way. Why the state decides is not
    pinned down: sm_90a spills 888 against 1284 bytes a thread without it, 1104 against 1276
    with it, so the pipelined form spills less in both (``scripts/sm90_report.py``)."""
    return 1 if has_initial_state else 2


#: The dS pass's step (µs; K = V = 128, tf32 products; H200, docs/training.md "The backward's
#: launch, measured"): serial on value blocks of 64 on 4 warps 3.8 alone (T 1024 H 16: 0.242
#: ms for 64 chunks; 3.9 at T 8192 H 64, 128 programs), of 128 on 8 warps 5.0 alone (T 1024
#: H 16: 0.318) and 5.2 with two waves (B 8 T 4096 H 32: 2.67 ms); in 32-chunk segments on
#: 128 on 8 warps about 4.1 (T 4096 H 16: 0.428 ms for 64 steps of pass 1 and 32 of pass 3 and
#: 7 combine segments). Pass 1's steps (K more rows) are taken as pass 3's. Against an H100's
#: run (docs/training.md): T 1024 H 16 serial 219 µs estimated, 233 measured; in 8-chunk
#: segments 134, 133 measured (the dS pass and the combine).
DS_STEP_COSTS = (
    StepCost(64, 4, 2, full_alone=3.8, full_shared=5.2, summary_alone=3.8, summary_shared=5.2),
    StepCost(128, 8, 1, full_alone=4.5, full_shared=4.5, summary_alone=4.5,
             summary_shared=4.5),
)
#: the dS pass's segments (chunks): whole 64-token blocks, finer than the forward's
DS_SEGMENT_CHUNKS = (4, 8, 16) + SEGMENT_CHUNKS


def _ds_cost(block_v: int) -> StepCost:
    """The dS pass's step costs at ``block_v`` value columns a program."""
    ref = next((c for c in DS_STEP_COSTS if c.block_v == block_v), None)
    return ref or _scaled(DS_STEP_COSTS[0], block_v, DS_STEP_COSTS[0].num_warps)


def plan_reverse(n_chunks, H: int, K: int, V: int, sms: int, block_v: int,
                 serial_block_v: int) -> int:
    """The dS pass's segment length in chunks (0: serial), by ``estimate_us`` with the dS
    pass's step costs: its own split, not the forward's (a dS step takes about four times a
    forward step, so short sequences gain from a split the forward does without). The serial
    pass runs ``serial_block_v`` value columns a program (``ds_value_block``), a split one
    ``block_v``; a split must be estimated ``MIN_GAIN`` of the serial time or less. K > 128:
    serial (the combine holds a K x K transition)."""
    if K > 128:
        return 0
    serial = estimate_us(n_chunks, H, K, V, _ds_cost(serial_block_v), 0, sms)
    best, longest = (serial, 0), max(n_chunks, default=0)
    for L in DS_SEGMENT_CHUNKS:
        if 2 * L > longest:
            break
        t = estimate_us(n_chunks, H, K, V, _ds_cost(block_v), L, sms)
        if t <= MIN_GAIN * serial and t < best[0]:
            best = (t, L)
    return best[1]
