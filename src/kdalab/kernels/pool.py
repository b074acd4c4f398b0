"""Prefill through a state pool, and the states kept for prefix caching (checkpoints).

A serving engine keeps every sequence's recurrent state in one pool ``[P, HV, K, V]`` and
names a sequence's row by index. ``chunk_kda_fwd(..., state_pool, state_indices)`` reads each
sequence's initial state from its row and writes the final state back in place (the serial
pass's program reads its rows before it writes them; the split pass reads them in the combine,
a launch before the pass that writes them).

Checkpoints (``checkpoint_every`` = c tokens, a multiple of 16): the state after tokens c, 2c,
... of every sequence (counted from the start of this call's tokens), for prefix caching. They
come in one tensor ``[B * (T // c), HV, K, V]`` (``"VK"``: ``[..., V, K]``; dtype of the state):
sequence n's j-th checkpoint (j = 1 .. len_n // c) is row ``offsets[n] + j - 1`` with
``offsets[n] = sum_{m < n} len_m // c`` (``checkpoint_offsets``). With fixed length that is
``n * (T // c) + j - 1``; with ``cu_seqlens`` the rows past the last checkpoint (the sum of
len_n // c is at most T // c, the static bound a compiled graph needs) are zero.
"""

from __future__ import annotations

import torch


def checkpoint_offsets(cu_seqlens: torch.Tensor, checkpoint_every: int) -> torch.Tensor:
    """Each sequence's first checkpoint row (module docstring), int64 on cu_seqlens' device,
    computed there (no host sync)."""
    counts = torch.diff(cu_seqlens.to(torch.int64)) // checkpoint_every
    return torch.cumsum(counts, 0) - counts


def checkpoint_table(seqs, checkpoint_every: int):
    """(int32 offsets on the device, number of checkpoints) for a cached sequence table."""
    hit = seqs.checkpoint_tables.get(checkpoint_every)
    if hit is None:
        counts = (seqs.ends - seqs.starts) // checkpoint_every
        offsets = torch.cumsum(counts, 0) - counts
        hit = (offsets.to(torch.int32).to(seqs.device), int(counts.sum()))
        seqs.checkpoint_tables[checkpoint_every] = hit
    return hit


def checkpoint_buffer(seqs, B, T, H, K, V, checkpoint_every, *, state_layout, dtype):
    """The checkpoints' tensor (zeros past the last) and its per-sequence offsets."""
    offsets, count = checkpoint_table(seqs, checkpoint_every)
    rows = B * (T // checkpoint_every)
    shape = (rows, H, V, K) if state_layout == "VK" else (rows, H, K, V)
    ck = torch.empty(shape, device=seqs.device, dtype=dtype)
    ck[count:].zero_()
    return ck, offsets
