"""The draw engine: the inputs of a batch of runs, each bit-identical to the seed document's
per-run ``make_inputs``, drawn as fast as the machine allows.

Each run draws from its own ``torch.Generator(device="cpu").manual_seed(seed)`` in the seed's
order (keys, gate, β: what its :class:`~kdalab.inputs.families.Family` says). Those draws
are per run by nature, but a seed's keys are drawn once for every chunk size
(:mod:`kdalab.inputs.keystream`) and runs that share a stream share its draws. Everything
else is done once per batch: the
sigmoids (torch's CPU sigmoid splits a tensor between a vectorized and a scalar loop whose last
bits differ; :func:`_sigmoid_rows` reproduces each run's own split, calibrated at run time),
g = lower_bound · sigmoid, the families' constants, and one copy to the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kdalab import params
from kdalab.inputs.families import FAMILIES, Family, get_family
from kdalab.inputs.keystream import STREAMS, reusable
from kdalab.inputs.runs import Run

__all__ = ["ChunkInputs", "make_inputs", "make_inputs_batch", "per_channel_inputs"]


@dataclass(frozen=True)
class ChunkInputs:
    keys: torch.Tensor  # [..., C, D] bfloat16
    log_decay: torch.Tensor  # [..., C] float64
    beta: torch.Tensor  # [..., C] float64


def make_inputs(family: str, chunk: int, dim: int, seed: int, lower_bound: float = -5.0,
                device: str | torch.device = "cpu") -> ChunkInputs:
    """One chunk's inputs for ``family``, drawn exactly as the seed document's ``make_inputs``."""
    run = Run.checked(family, chunk, seed, dim, lower_bound)
    batch = make_inputs_batch([run], device)
    return ChunkInputs(batch.keys[0], batch.log_decay[0], batch.beta[0])


def _draw_run(gen: torch.Generator, family: Family, seed: int, scratch: torch.Tensor,
              keys: torch.Tensor, gate: torch.Tensor, beta: torch.Tensor) -> None:
    """The random draws of one run, in the seed's order, into the run's rows: ``keys`` [C, D]
    bfloat16 (normalized as the seed does, per run), ``gate`` [C] (families with a random gate)
    and ``beta`` [C] (families with a random β) as unsigmoided normal samples (float64; the
    sigmoids are done for the whole batch). ``scratch`` is a [C, D] float64 workspace.

    ``gen`` is reseeded: ``manual_seed`` resets the whole CPU generator (Mersenne Twister state
    and cached Box-Muller sample), so a reused generator draws what a fresh one would. Each
    draw has the seed's own size (torch's CPU normal sampler takes different paths below and
    above 16 values). The keys are normalized here, per run (small tensors: torch runs them
    without intra-op threads, which matters on draw threads), in a small reused workspace.
    """
    chunk = keys.shape[0]
    gen.manual_seed(seed)
    k = scratch[:1] if family.shared_key else scratch
    torch.randn(k.shape, dtype=torch.float64, generator=gen, out=k)
    # copy_ rounds float64 as the seed's keys.to(bfloat16) does (through float32); a shared
    # key fills every step
    keys.copy_(k.div_(torch.linalg.vector_norm(k, 2, -1, keepdim=True)))  # = k.norm(dim=-1, …)
    if family.random_gate:
        torch.randn(chunk, dtype=torch.float64, generator=gen, out=gate)
    if family.random_beta:
        torch.randn(chunk, dtype=torch.float64, generator=gen, out=beta)


def _draw_runs(families: Sequence[str], seeds: Sequence[int], keys: torch.Tensor,
               raw_gate: torch.Tensor, raw_beta: torch.Tensor) -> None:
    """The draws of each run, into row ``i`` of ``keys`` [n, C, D], ``raw_gate`` and
    ``raw_beta`` [n, C]: :func:`_draw_run` per run, or, where keys are prefixes of longer
    chunks' (:func:`~kdalab.inputs.keystream.reusable`), per *stream*: runs of one seed
    whose keys end at the same row (C rows, or 1 for a shared key) make the same draws after
    their keys (the first is the gate of a family with a random gate, else its β), so each
    stream's keys come from :data:`~kdalab.inputs.keystream.STREAMS` and its draws are
    made once, then gathered into the runs' rows."""
    gen = torch.Generator(device="cpu")
    chunk, dim = keys.shape[1:]
    fams = [FAMILIES[f] for f in families]
    if not reusable(dim):
        scratch = torch.empty(keys.shape[1:], dtype=torch.float64)
        for i, (fam, seed) in enumerate(zip(fams, seeds)):
            _draw_run(gen, fam, seed, scratch, keys[i], raw_gate[i], raw_beta[i])
        return
    # streams by where their keys end: {end: {seed: index among that end's streams}}
    by_end: dict[int, dict[int, int]] = {}
    where = []  # (end, index) of each run
    for fam, seed in zip(fams, seeds):
        ends = by_end.setdefault(1 if fam.shared_key else chunk, {})
        where.append((1 if fam.shared_key else chunk, ends.setdefault(seed, len(ends))))
    offset, n_streams = {}, 0
    for end, ends in by_end.items():
        offset[end], n_streams = n_streams, n_streams + len(ends)
    stream = [offset[end] + i for end, i in where]
    draws_after = [0] * n_streams  # draws each stream makes after its keys
    for fam, s in zip(fams, stream):
        draws_after[s] = max(draws_after[s], fam.random_gate + fam.random_beta)
    # every stream's keys, then each run's by one gather (index_select copies whole rows)
    stream_keys = torch.empty(n_streams, chunk, dim, dtype=torch.bfloat16)
    # draws[d·S + s] is stream s's draw d after its keys; the last row stays zero
    draws = torch.zeros(2 * n_streams + 1, chunk, dtype=torch.float64)
    for end, ends in by_end.items():
        got, states = STREAMS.keys(list(ends), dim, end, gen)
        stream_keys[offset[end] : offset[end] + len(ends)] = got  # a shared key fills C rows
        for s, state in enumerate(states, offset[end]):
            if draws_after[s]:
                gen.set_state(state)
                for d in range(draws_after[s]):
                    torch.randn(chunk, dtype=torch.float64, generator=gen,
                                out=draws[d * n_streams + s])
    torch.index_select(stream_keys, 0, torch.tensor(stream), out=keys)
    # the gate is a stream's first draw; β its first or, after a gate, its second
    none = 2 * n_streams
    gate = [s if f.random_gate else none for f, s in zip(fams, stream)]
    beta = [f.random_gate * n_streams + s if f.random_beta else none
            for f, s in zip(fams, stream)]
    torch.index_select(draws, 0, torch.tensor(gate), out=raw_gate)
    torch.index_select(draws, 0, torch.tensor(beta), out=raw_beta)


_SIGMOID_UNIT: list = []  # [block] once calibrated; [None] if the split does not reproduce
_SIGMOID_SLICE = 16384  # a multiple of every block tried, half torch's grain size


def _sigmoid_split(x: torch.Tensor, unit: int) -> torch.Tensor:
    """sigmoid of each row of ``x`` [n, C] as torch computes it on that row alone: its CPU
    kernel takes the first ``unit``·⌊C/unit⌋ values through the vectorized loop and the rest
    through the scalar one, whose results differ in the last bit. Here the vectorized part is
    computed for all rows at once (one flat tensor whose length is a multiple of ``unit``) and
    the tail through a strided view (TensorIterator's scalar loop)."""
    n, chunk = x.shape
    full = (chunk // unit) * unit
    out = torch.empty_like(x)
    if full:
        flat = x[:, :full].reshape(-1)
        pad = (-flat.numel()) % unit
        flat = torch.cat([flat, flat.new_zeros(pad)]) if pad else flat
        # slices a multiple of ``unit`` long and below torch's parallel grain (32768): a
        # longer call is split across intra-op threads at arbitrary points, and each split's
        # tail goes through the scalar loop
        vec = torch.cat([torch.sigmoid(flat[i : i + _SIGMOID_SLICE])
                         for i in range(0, flat.numel(), _SIGMOID_SLICE)])
        out[:, :full] = vec[: n * full].view(n, full)
    if full < chunk:
        strided = torch.empty(n, chunk - full, 2, dtype=x.dtype)
        strided[..., 0] = x[:, full:]
        out[:, full:] = torch.sigmoid(strided[..., 0])
    return out


def _sigmoid_unit() -> int | None:
    """The block of torch's vectorized CPU sigmoid on float64 (16 with AVX-512, measured),
    found by comparing row-by-row sigmoid with :func:`_sigmoid_split` on random rows of every
    length 1…40; None (= compute row by row) if no block reproduces all of them."""
    if not _SIGMOID_UNIT:
        gen = torch.Generator().manual_seed(12345)
        rows = [torch.randn(5, c, dtype=torch.float64, generator=gen) * 4 for c in range(1, 41)]
        found = None
        for unit in (1, 2, 4, 8, 16, 32, 64):
            if all(torch.equal(_sigmoid_split(x, unit), torch.stack([torch.sigmoid(r.clone())
                                                                     for r in x]))
                   for x in rows):
                found = unit
                break
        _SIGMOID_UNIT.append(found)
    return _SIGMOID_UNIT[0]


def _sigmoid_rows(x: torch.Tensor) -> torch.Tensor:
    """Row-by-row torch.sigmoid of ``x`` [n, C], bit for bit, batched where calibrated."""
    unit = _sigmoid_unit()
    if unit is None:
        return torch.stack([torch.sigmoid(r.clone()) for r in x]) if len(x) else x.clone()
    return _sigmoid_split(x, unit)


def make_inputs_batch(runs: Sequence, device: str | torch.device = "cpu") -> ChunkInputs:
    """The inputs of runs of one chunk size and dim, stacked: keys [B, C, D], log_decay and
    beta [B, C]; run ``i`` equal bit for bit to the seed's ``make_inputs`` of ``runs[i]``.

    ``runs`` are :class:`~kdalab.inputs.runs.Run` values (as made by
    :meth:`~kdalab.inputs.runs.Run.checked` or ``plan_runs``: not checked again here).
    The random draws are each run's own (:func:`_draw_runs`: per key stream where the keys of
    one seed serve every chunk size, else per run); the rest is done once for the batch and
    equals the seed's per-run arithmetic bit for bit: the sigmoids (:func:`_sigmoid_rows`
    reproduces torch's per-tensor split between its vectorized and scalar loops),
    g = lower_bound · sigmoid and the constants. Each tensor then goes to ``device`` in one
    copy (from pinned memory, without waiting, on CUDA). Draws run in the calling thread:
    with the key streams, draw threads and draw processes measured slower (docs/sweeps.md).
    """
    if not runs:
        raise ValueError("make_inputs_batch needs at least one run")
    chunk, dim = runs[0].chunk, runs[0].dim
    if any(r.chunk != chunk or r.dim != dim for r in runs):
        raise ValueError("make_inputs_batch needs runs of one chunk size and one dim")
    fams = [get_family(r.family) for r in runs]
    families = [f.name for f in fams]
    seeds = [r.seed for r in runs]
    # a family without a lower bound has a fixed log-decay: the −5 placeholder is overwritten
    lower_bounds = [-5.0 if r.lower_bound is None else r.lower_bound for r in runs]
    n = len(runs)
    device = torch.device(device)
    pin = device.type == "cuda"
    keys = torch.empty(n, chunk, dim, dtype=torch.bfloat16, pin_memory=pin)
    raw_gate = torch.zeros(n, chunk, dtype=torch.float64)
    raw_beta = torch.zeros(n, chunk, dtype=torch.float64)

    _draw_runs(families, seeds, keys, raw_gate, raw_beta)
    random_gate = torch.tensor([f.random_gate for f in fams])
    gate = torch.where(random_gate[:, None], _sigmoid_rows(raw_gate), 1.0)  # else g = lb · 1
    log_decay = torch.empty(n, chunk, dtype=torch.float64, pin_memory=pin)
    torch.mul(torch.tensor(lower_bounds, dtype=torch.float64)[:, None], gate, out=log_decay)
    beta = torch.empty(n, chunk, dtype=torch.float64, pin_memory=pin)
    beta.copy_(_sigmoid_rows(raw_beta))
    for f in {f for f in fams if f.log_decay is not None or not f.random_beta}:
        rows = torch.tensor([g is f for g in fams])[:, None]
        if f.log_decay is not None:
            log_decay.masked_fill_(rows, f.log_decay)
        if not f.random_beta:
            beta.masked_fill_(rows, f.beta)
    if device.type == "cpu":
        return ChunkInputs(keys, log_decay, beta)
    return ChunkInputs(*(t.to(device, non_blocking=pin) for t in (keys, log_decay, beta)))


def per_channel_inputs(family: str, chunk: int, dim: int, seed: int, lower_bound: float):
    """The per-channel variant of ``floor`` and ``model_like`` (the diagonal-tile study's):
    keys (bf16, unit norm) and log-decay [C, D]; ``floor`` puts every step and channel at the
    bound, ``model_like`` draws g = lb·sigmoid(N(0, 1)) per step and channel."""
    params.choice(family, "family", ("floor", "model_like"))
    gen = torch.Generator().manual_seed(int(seed))
    keys = torch.randn(chunk, dim, dtype=torch.float64, generator=gen)
    keys = (keys / keys.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
    if family == "floor":
        g = torch.full((chunk, dim), float(lower_bound), dtype=torch.float64)
    else:
        g = float(lower_bound) * torch.sigmoid(torch.randn(chunk, dim, dtype=torch.float64,
                                                           generator=gen))
    return keys, g
