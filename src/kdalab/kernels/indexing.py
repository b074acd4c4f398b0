"""Where a program's tokens are: the index arithmetic the kernels share (forward and backward).

Fixed-length input is ``[B, T, ...]`` flattened to rows; variable-length input is one row
range per sequence (``cu_seqlens``). Row ranges are ``[bos, eos)`` in the flattened rows.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_of_program(i_c, chunk_table_ptr, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """A token-parallel program's rows: global chunk ``i_c`` → (its first row, its sequence's
    eos). Varlen reads both from the host's table (``Sequences.chunk_table``) in one pair of
    independent loads (a (sequence, chunk) table then ``cu_seqlens[sequence]`` were two
    dependent loads: measured no slower on the H200, docs/kernels.md "Launch plan")."""
    if IS_VARLEN:
        row0 = tl.load(chunk_table_ptr + 2 * i_c).to(tl.int64)
        eos = tl.load(chunk_table_ptr + 2 * i_c + 1).to(tl.int64)
    else:
        nt = tl.cdiv(T, BT)
        i_n = (i_c // nt).to(tl.int64)
        row0 = i_n * T + (i_c % nt).to(tl.int64) * BT
        eos = i_n * T + T
    return row0, eos


@triton.jit
def sequence_of_program(i_nh, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, T, H,
                        BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """A recurrent program's sequence and head: ``i_nh`` = rank · H + head → (sequence, head,
    bos, eos, global index of the sequence's first chunk). Varlen programs take the sequences
    longest first (``seq_order``, from the host): the GPU starts programs in order, so the
    longest chains start first and short ones fill in (fixed length: rank = sequence)."""
    i_n = (i_nh // H).to(tl.int64)
    i_h = i_nh % H
    if IS_VARLEN:
        i_n = tl.load(seq_order_ptr + i_n).to(tl.int64)
        bos = tl.load(cu_seqlens_ptr + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens_ptr + i_n + 1).to(tl.int64)
        c0 = tl.load(chunk_offsets_ptr + i_n).to(tl.int64)
    else:
        bos = i_n * T
        eos = bos + T
        c0 = i_n * tl.cdiv(T, BT)
    return i_n, i_h, bos, eos, c0


@triton.jit
def segment_of_program(i_s, seg_ptr):
    """A sequence-parallel program's segment ``i_s`` → (sequence, segment in the sequence, bos,
    eos, global index of its first chunk, last segment of its sequence?) from the host's
    segment table (int32 [segments, 6], ``kernels.plan.segment_table``)."""
    base = seg_ptr + 6 * i_s
    i_n = tl.load(base).to(tl.int64)
    p = tl.load(base + 1)
    bos = tl.load(base + 2).to(tl.int64)
    eos = tl.load(base + 3).to(tl.int64)
    c0 = tl.load(base + 4).to(tl.int64)
    last = tl.load(base + 5)
    return i_n, p, bos, eos, c0, last


@triton.jit
def program_rows(i_sh, cu_seqlens_ptr, chunk_offsets_ptr, seq_order_ptr, seg_ptr, T, H,
                 BT: tl.constexpr, IS_VARLEN: tl.constexpr, SEG: tl.constexpr):
    """A recurrent program's rows, forward or backward: ``i_sh`` = (sequence rank, or
    segment with ``SEG``) · H + head → (sequence, head, segment, bos, eos, global index of
    the first chunk, index of the first chunk in its sequence, the segment's place in its
    sequence, last segment of its sequence?). Without ``SEG`` the program has its whole
    sequence: segment -1, first chunk 0, place 0, last."""
    if SEG:
        i_s = (i_sh // H).to(tl.int64)
        i_h = i_sh % H
        i_n, p, bos, eos, c0, last = segment_of_program(i_s, seg_ptr)
        if IS_VARLEN:
            j0 = (bos - tl.load(cu_seqlens_ptr + i_n).to(tl.int64)) // BT
        else:
            j0 = (bos - i_n * T) // BT
    else:
        i_n, i_h, bos, eos, c0 = sequence_of_program(i_sh, cu_seqlens_ptr, chunk_offsets_ptr,
                                                     seq_order_ptr, T, H, BT, IS_VARLEN)
        i_s = -1
        j0 = 0
        p = 0
        last = 1
    return i_n, i_h, i_s, bos, eos, c0, j0, p, last
