"""Where the sequences are, and the tables the kernels read: built once per ``cu_seqlens``
tensor (or fixed-length shape) and cached, with the launch plans and segment tables made for
them. Building them reads the host (a device sync for a CUDA ``cu_seqlens``); a call that
finds them cached does not."""

from __future__ import annotations

import weakref

import torch

from .launch_plan import CHUNK, LaunchPlan, segment_table


class Sequences:
    """Where the sequences are, and the tables the kernels read, for one (cu_seqlens, T) or
    fixed-length (B, T): built once, then cached (building them reads the host)."""

    def __init__(self, device, starts: torch.Tensor, ends: torch.Tensor, varlen: bool,
                 cu32: torch.Tensor | None):
        n_chunks = (ends - starts + CHUNK - 1) // CHUNK
        self.n_chunks = tuple(int(c) for c in n_chunks)
        self.num_seqs = len(self.n_chunks)
        self.num_chunks = sum(self.n_chunks)
        offsets = torch.cumsum(n_chunks, 0) - n_chunks
        self.starts, self.ends, self.chunk_starts = starts, ends, offsets
        self.device = device
        self.cu32 = cu32
        if varlen:
            # stage 1's table: each chunk's first row and its sequence's end row
            seq = torch.repeat_interleave(torch.arange(self.num_seqs), n_chunks)
            local = torch.arange(self.num_chunks) - offsets[seq]
            table = torch.stack([starts[seq] + CHUNK * local, ends[seq]], dim=1).to(torch.int32)
            self.chunk_table = table.to(device)
            self.chunk_offsets = offsets.to(torch.int32).to(device)
            # the serial pass takes the sequences longest first (kernels/indexing.py)
            order = torch.argsort(-n_chunks, stable=True)
            self.seq_order = order.to(torch.int32).to(device)
        else:
            self.chunk_table = self.chunk_offsets = self.seq_order = None
        self._segments: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        #: the forward's launch plans (``api.plan_for``) and the dS pass's segment lengths
        #: (``autograd.backward``: ``launch_plan.plan_reverse``, keyed from "reverse")
        self.plans: dict[tuple, LaunchPlan | int] = {}
        #: checkpoint interval -> (each sequence's first checkpoint row, int32 on the device;
        #: the number of checkpoints): ``pool.checkpoint_table``
        self.checkpoint_tables: dict[int, tuple[torch.Tensor, int]] = {}

    def segments(self, segment_chunks: int):
        """(segment table, seg_offsets, segment count) on the device, per segment length."""
        hit = self._segments.get(segment_chunks)
        if hit is None:
            table, offs = segment_table(self.starts, self.ends, self.chunk_starts,
                                        segment_chunks)
            hit = (table.to(self.device), offs.to(self.device), table.shape[0])
            self._segments[segment_chunks] = hit
        return hit


#: cu_seqlens id -> (weak ref, version, T, Sequences); fixed length (device, B, T) -> Sequences
_VARLEN_CACHE: dict[int, tuple] = {}
_FIXED_CACHE: dict[tuple, Sequences] = {}
_CACHE_SIZE = 16


def _remember(cache: dict, key, value):
    if len(cache) >= _CACHE_SIZE:
        cache.pop(next(iter(cache)))
    cache[key] = value


def varlen_sequences(cu_seqlens: torch.Tensor, T: int) -> Sequences:
    """Validated ``cu_seqlens`` and its tables, cached per tensor.

    Validating ``cu_seqlens`` reads it on the host: a device-to-host sync, which cost a varlen
    call about 0.5 ms of idle GPU (measured on the H200, docs/BENCHMARKS.md). Like fla (its
    ``tensor_cache``), the result is kept for the tensor object: a call with the same,
    unmodified ``cu_seqlens`` (same object, same in-place version counter) reuses it.
    """
    key = id(cu_seqlens)
    hit = _VARLEN_CACHE.get(key)
    if hit is not None:
        ref, version, t, seqs = hit
        if ref() is cu_seqlens and version == cu_seqlens._version and t == T:
            return seqs
    cs = cu_seqlens.detach().to("cpu", torch.int64)
    if int(cs[0]) != 0 or int(cs[-1]) != T or bool((cs[1:] < cs[:-1]).any()):
        raise ValueError(f"cu_seqlens must start at 0, end at T={T} and be non-decreasing, "
                         f"got {cs.tolist()[:8]}{' ...' if len(cs) > 8 else ''}")
    cu32 = cu_seqlens.detach().to(torch.int32).contiguous()
    seqs = Sequences(cu_seqlens.device, cs[:-1], cs[1:], True, cu32)
    _remember(_VARLEN_CACHE, key, (weakref.ref(cu_seqlens), cu_seqlens._version, T, seqs))
    return seqs


def fixed_sequences(device: torch.device, B: int, T: int) -> Sequences:
    key = (device, B, T)
    seqs = _FIXED_CACHE.get(key)
    if seqs is None:
        starts = torch.arange(B, dtype=torch.int64) * T
        seqs = Sequences(device, starts, starts + T, False, None)
        _remember(_FIXED_CACHE, key, seqs)
    return seqs
