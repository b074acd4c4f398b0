"""Input families of the seed document's inverse experiment, generated exactly as the seed does.

For a given seed a family draws from ``torch.Generator(device="cpu").manual_seed(seed)`` in the
seed's order, so kdalab's inputs are bit-identical to the seed code's:

``floor``                  every step at the lower bound (the seed's ``floor_e-5`` for −5);
                           keys ~ N(0, I) normalized, β = sigmoid(N(0, 1)).
``weak_decay_correlated``  one normalized random key repeated, g = −0.01, β = 0.5 (stresses the
                           high powers of L without touching the exponent range).
``model_like``             keys as ``floor``, g = lower_bound · sigmoid(N(0, 1)), then β as
                           ``floor``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = ["FAMILIES", "USES_LOWER_BOUND", "SEED_CASE_NAMES", "ChunkInputs", "make_inputs",
           "make_inputs_batch", "check_family"]

FAMILIES = ("floor", "weak_decay_correlated", "model_like")
USES_LOWER_BOUND = {"floor": True, "weak_decay_correlated": False, "model_like": True}
#: The seed document's names for (family, lower bound −5).
SEED_CASE_NAMES = {"floor": "floor_e-5", "weak_decay_correlated": "weak_decay_correlated",
                   "model_like": "model_like"}
WEAK_LOG_DECAY = -0.01
WEAK_BETA = 0.5


def check_family(family: str) -> str:
    if family not in FAMILIES:
        if family == "floor_e-5":
            return "floor"
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    return family


@dataclass(frozen=True)
class ChunkInputs:
    keys: torch.Tensor  # [..., C, D] bfloat16
    log_decay: torch.Tensor  # [..., C] float64
    beta: torch.Tensor  # [..., C] float64


def _check_args(family: str, chunk: int, dim: int, lower_bound: float) -> str:
    family = check_family(family)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not lower_bound < 0:
        raise ValueError(f"lower_bound must be < 0, got {lower_bound}")
    return family


class _Run(NamedTuple):
    family: str
    chunk: int
    dim: int
    seed: int
    lower_bound: float | None


def make_inputs(family: str, chunk: int, dim: int, seed: int, lower_bound: float = -5.0,
                device: str | torch.device = "cpu") -> ChunkInputs:
    """One chunk's inputs for ``family``, drawn exactly as the seed document's ``make_inputs``."""
    batch = make_inputs_batch([_Run(family, chunk, dim, seed, lower_bound)], device, workers=1)
    return ChunkInputs(batch.keys[0], batch.log_decay[0], batch.beta[0])


def _draw_run(gen: torch.Generator, family: str, seed: int, keys: torch.Tensor,
              gate: torch.Tensor, beta: torch.Tensor) -> None:
    """The random part of one run, as the seed's ``make_inputs`` draws it, into the run's rows:
    ``keys`` [C, D] bfloat16 (normalized), ``gate`` and ``beta`` [C] float64 (sigmoid of the
    normal draws; ``gate`` for ``model_like`` only, neither for ``weak_decay_correlated``).

    ``gen`` is reseeded: ``manual_seed`` resets the whole CPU generator (Mersenne Twister state
    and cached Box-Muller sample), so a reused generator draws what a fresh one would. The norm
    and the sigmoid act on this run's own tensors, as in the seed: torch's CPU sigmoid rounds
    differently on short and long tensors.
    """
    chunk, dim = keys.shape
    gen.manual_seed(seed)
    k = torch.randn(1 if family == "weak_decay_correlated" else chunk, dim, dtype=torch.float64,
                    generator=gen)
    # copy_ rounds float64 as the seed's keys.to(bfloat16) does (through float32); the
    # correlated family's one key fills every step
    keys.copy_(k / torch.linalg.vector_norm(k, 2, -1, keepdim=True))  # = k.norm(dim=-1, …)
    if family == "weak_decay_correlated":
        return
    if family == "model_like":
        torch.sigmoid(torch.randn(chunk, dtype=torch.float64, generator=gen), out=gate)
    torch.sigmoid(torch.randn(chunk, dtype=torch.float64, generator=gen), out=beta)


_POOLS: dict[int, ThreadPoolExecutor] = {}  # reused: starting threads per batch costs
_POOLS_LOCK = threading.Lock()


def _cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _pool(workers: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="kdalab-draw")
        return _POOLS[workers]


def make_inputs_batch(runs: Sequence, device: str | torch.device = "cpu",
                      workers: int | None = None) -> ChunkInputs:
    """The inputs of runs of one chunk size and dim, stacked: keys [B, C, D], log_decay and
    beta [B, C]; run ``i`` equal bit for bit to the seed's ``make_inputs`` of ``runs[i]``.

    ``runs`` hold ``family``, ``chunk``, ``dim``, ``seed`` and ``lower_bound`` (a
    :class:`~kdalab.experiments.inverse.RunSpec`; ``None`` = −5 for families without one).
    Each run's draws use its own seeded generator; they are compute-bound in torch, which
    releases the GIL there, so they run on ``workers`` threads (default: one per core, at most
    one per run; 1 = no threads). The rest (g = lower_bound · sigmoid, the constants) is
    elementwise and runs once for the batch. Each tensor then goes to ``device`` in one copy
    (from pinned memory, without waiting, on CUDA).
    """
    if not runs:
        raise ValueError("make_inputs_batch needs at least one run")
    chunk, dim = runs[0].chunk, runs[0].dim
    families, seeds, lower_bounds = [], [], []
    for r in runs:
        if r.chunk != chunk or r.dim != dim:
            raise ValueError("make_inputs_batch needs runs of one chunk size and one dim")
        lb = -5.0 if r.lower_bound is None else float(r.lower_bound)
        families.append(_check_args(r.family, chunk, dim, lb))
        seeds.append(int(r.seed))
        lower_bounds.append(lb)
    n = len(runs)
    device = torch.device(device)
    pin = device.type == "cuda"
    keys = torch.empty(n, chunk, dim, dtype=torch.bfloat16, pin_memory=pin)
    gate = torch.ones(n, chunk, dtype=torch.float64)  # floor: g = lower_bound · 1
    beta = torch.empty(n, chunk, dtype=torch.float64, pin_memory=pin)

    def draw(lo: int, hi: int) -> None:
        gen = torch.Generator(device="cpu")
        rows = zip(keys[lo:hi].unbind(), gate[lo:hi].unbind(), beta[lo:hi].unbind())
        for family, seed, (k, g, b) in zip(families[lo:hi], seeds[lo:hi], rows):
            _draw_run(gen, family, seed, k, g, b)

    workers = min(n, _cores()) if workers is None else max(1, min(int(workers), n))
    if workers == 1:
        draw(0, n)
    else:
        edges = [n * w // workers for w in range(workers + 1)]
        for f in [_pool(workers).submit(draw, lo, hi) for lo, hi in zip(edges, edges[1:])]:
            f.result()
    weak = torch.tensor([f == "weak_decay_correlated" for f in families])[:, None]
    log_decay = torch.empty(n, chunk, dtype=torch.float64, pin_memory=pin)
    torch.mul(torch.tensor(lower_bounds, dtype=torch.float64)[:, None], gate, out=log_decay)
    log_decay.masked_fill_(weak, WEAK_LOG_DECAY)
    beta.masked_fill_(weak, WEAK_BETA)
    if device.type == "cpu":
        return ChunkInputs(keys, log_decay, beta)
    return ChunkInputs(*(t.to(device, non_blocking=pin) for t in (keys, log_decay, beta)))
