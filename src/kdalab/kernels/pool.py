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

from .replay import new_buffer
from .shapes import check_state_pool

_INTS = (torch.int32, torch.int64)


def validate_pool(state_pool, state_indices, initial_state, checkpoint_every, *, num_seqs, H,
                  K, V, state_layout, device):
    """The pool's and the checkpoints' arguments (shapes, dtypes, device; index contents are
    not read: that would sync the host)."""
    if (state_pool is None) != (state_indices is None):
        raise ValueError("state_pool and state_indices go together (give both or neither)")
    if state_pool is not None:
        if initial_state is not None:
            raise ValueError("initial_state cannot be given with state_pool (the initial "
                             "states are the pool's rows at state_indices)")
        check_state_pool(state_pool, HV=H, K=K, V=V, state_layout=state_layout)
        if not isinstance(state_indices, torch.Tensor) or state_indices.dtype not in _INTS \
                or tuple(state_indices.shape) != (num_seqs,):
            raise ValueError(f"state_indices must be an int32/int64 tensor of shape "
                             f"({num_seqs},), one pool row a sequence")
        for x in (state_pool, state_indices):
            if x.device != device:
                raise ValueError(f"state_pool and state_indices must be on {device}, "
                                 f"got {x.device}")
    if checkpoint_every is not None:
        c = checkpoint_every
        if isinstance(c, bool) or not isinstance(c, int) or c <= 0 or c % 16:
            raise ValueError(f"checkpoint_every must be a positive multiple of 16 (tokens), "
                             f"got {c!r}")


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
    # a buffer of the call (replay.py: a replayed call zeroes the same rows)
    return new_buffer(shape, device=seqs.device, dtype=dtype, zero_from=count), offsets
