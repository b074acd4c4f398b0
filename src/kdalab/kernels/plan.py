"""Launch shapes chosen from the problem: value block, warps, and whether (and how finely) to
split sequences into segments for the sequence-parallel state pass.

The recurrent stage is a serial chain of one step per 16-token chunk, run by one program per
(sequence, head, block of BV value columns). When those programs cannot fill the GPU (few
heads, long sequences), splitting each sequence into segments of ``L`` chunks multiplies the
programs by the segment count at the price of a second pass and a short combine
(``chunk_recurrent.py``, ``chunk_combine.py``). ``plan_launch`` compares the two with a
small cost model whose constants were measured on the H200 (docs/kernels.md, "Launch
plan"): a program's step takes ``STEP_US``; an SM runs ``programs_per_sm`` programs at once
without slowing each (register-bound); a launch costs ``LAUNCH_US``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CHUNK = 16

# Cost model (µs), measured on the H200 (docs/kernels.md, "Launch plan").
STEP_US = 1.0          # one 16-token step of a program with outputs (fp16 products, BV = 64)
SUMMARY_STEP_US = 0.8  # one step of a segment-summary program (no output products)
COMBINE_STEP_US = 1.5  # one segment of the combine
LAUNCH_US = 6.0        # one more launch (host and device)
MIN_SEGMENT_CHUNKS = 8


@dataclass(frozen=True)
class LaunchPlan:
    """What ``chunk_kda_fwd`` launches: the recurrent stage's value block and warps, stage 1's
    warps, and the segment length in chunks (0: one serial pass per sequence)."""

    block_v: int
    num_warps: int
    prepare_warps: int
    prepare_chunks: int
    segment_chunks: int
    estimate_us: float = float("nan")


def programs_per_sm(block_v: int, num_warps: int) -> int:
    """Recurrent programs an SM holds at once: register-bound (about 240 registers per thread
    at BV = 64 on 4 warps, sm_90a: ``scripts/sm90_report.py``), so two of any shape that keeps
    BV / warps at 16 rows a warp, more for smaller rows per warp."""
    rows_per_warp = block_v / num_warps
    return 2 if rows_per_warp >= 16 else 4


def default_prepare_warps(K: int) -> int:
    """Stage 1's warps: 2 at K = 128 (measured fastest on the H200: 0.53 ms against 0.68 on 4
    and 1.43 on 8 warps at H = 64, T = 8192; 255 registers, no spills), 4 for K <= 64, 8 for
    K = 256 (not measured: fewer would spill)."""
    return 4 if K <= 64 else 2 if K == 128 else 8


def _waves(programs: int, slots: int) -> int:
    return max(1, math.ceil(programs / slots))


def estimate_us(n_chunks: list[int] | tuple[int, ...], H: int, K: int, V: int, block_v: int,
                num_warps: int, segment_chunks: int, sms: int) -> float:
    """Estimated time of the recurrent stage for sequences of ``n_chunks`` chunks each."""
    slots = sms * programs_per_sm(block_v, num_warps)
    vb = math.ceil(V / block_v)
    longest = max(n_chunks, default=0)
    if segment_chunks <= 0 or segment_chunks >= longest:
        return _waves(len(n_chunks) * H * vb, slots) * longest * STEP_US
    L = segment_chunks
    segs = [max(1, math.ceil(c / L)) for c in n_chunks]
    mb = math.ceil((V + K) / block_v)
    # pass 1: first segments (outputs, rows of S), middle ones (summaries, S and M rows)
    p1 = sum(vb + (s - 2) * mb if s > 1 else vb for s in segs) * H
    p2 = sum(s - 1 for s in segs) * H * vb
    longest_segs = max(segs)
    t1 = _waves(p1, slots) * L * max(STEP_US, SUMMARY_STEP_US)
    t2 = _waves(p2, slots) * L * STEP_US if p2 else 0.0
    tc = (longest_segs - 2) * COMBINE_STEP_US if longest_segs > 2 else 0.0
    return t1 + tc + t2 + (2 if longest_segs > 2 else 1) * LAUNCH_US


def plan_launch(n_chunks: list[int] | tuple[int, ...], H: int, K: int, V: int, sms: int, *,
                block_v: int | None = None, num_warps: int | None = None,
                prepare_warps: int | None = None, prepare_chunks: int | None = None,
                segment_chunks: int | None = None) -> LaunchPlan:
    """The launch plan for sequences of ``n_chunks`` chunks (16 tokens) each, ``H`` heads,
    head dims K and V, on a GPU of ``sms`` multiprocessors. Given values are kept; ``None``
    ones are chosen by the cost model above."""
    bv = block_v or min(64, V)
    warps = num_warps or 4
    pw = prepare_warps or default_prepare_warps(K)
    pc = prepare_chunks or 1
    if segment_chunks is not None:
        return LaunchPlan(bv, warps, pw, pc, segment_chunks,
                          estimate_us(n_chunks, H, K, V, bv, warps, segment_chunks, sms))
    longest = max(n_chunks, default=0)
    best = (estimate_us(n_chunks, H, K, V, bv, warps, 0, sms), 0)
    L = MIN_SEGMENT_CHUNKS
    while L * 2 <= longest:
        t = estimate_us(n_chunks, H, K, V, bv, warps, L, sms)
        if t < 0.9 * best[0]:  # a clear win only: the split adds passes and rounding
            best = min(best, (t, L))
        L *= 2
    return LaunchPlan(bv, warps, pw, pc, best[1], best[0])


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
