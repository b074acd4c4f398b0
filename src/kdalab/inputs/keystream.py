"""Each seed's keys drawn once, for every chunk size: the draw engine's cache.

A run of chunk C and dim D draws its keys first, ``torch.randn(C, D, float64)`` from a
generator just seeded with its seed (:mod:`kdalab.inputs.draw`), then its gate and β.
torch's CPU normal sampler fills a tensor of n ≥ 16 values, n a multiple of 16, with n uniforms
(one 64-bit draw each) and turns them into normals by Box–Muller within blocks of 16
(``normal_fill`` in ATen's ``DistributionTemplates.h``). So when D is a multiple of 16 the keys
of chunk C are the first C rows of the keys of any longer chunk of the same seed, and drawing
rows r…C−1 from the generator's state after row r − 1 gives the same bits as drawing all C at
once. Keys are normalized row by row (``vector_norm`` over the last dim reduces each row alone)
and rounded to bfloat16 element by element, so the normalized rows are prefixes too.

A sweep of chunks 2…64 draws each seed's keys once instead of once per chunk size and family:
:class:`KeyStreams` keeps, per (seed, dim), the normalized bfloat16 rows drawn so far and the
generator's state after them (and after the first row, for the families with one shared key),
extends them when a longer chunk comes, and leaves a generator where the run's own next draw
(gate, β) starts. Entries are dropped least recently used beyond a memory budget; a dropped or
shorter-than-needed entry is drawn again, with the same bits. ``tests/test_families.py`` checks
the inputs against the seed document's per-run ``make_inputs`` at every chunk size 1…64 in
orders that grow, shrink and evict entries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

__all__ = ["KeyStreams", "STREAMS", "reusable"]

#: Bytes of rows kept per process by default (about 4,000 seeds of 64 rows × 128 columns).
DEFAULT_BUDGET = 64 << 20
_STATE_BYTES = 2 * 5056  # two states of torch's CPU generator (Mersenne Twister and more)


def reusable(dim: int) -> bool:
    """Whether keys of ``dim`` columns are prefixes of longer chunks' (see the module)."""
    return dim % 16 == 0


def _normalized(raw: torch.Tensor) -> torch.Tensor:
    """Rows divided by their 2-norms, as the seed's ``k / k.norm(dim=-1, keepdim=True)``."""
    return raw.div_(torch.linalg.vector_norm(raw, 2, -1, keepdim=True))


class _Slab:
    """One dim's rows: ``rows`` [slots, cap, dim] bfloat16, a slot per seed, and per seed its
    slot, rows drawn and the generator's states after them and after the first, least recently
    used first."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.rows = torch.empty(0, 0, dim, dtype=torch.bfloat16)
        self.seeds: OrderedDict[int, list] = OrderedDict()  # seed -> [slot, count, state, first]
        self.free: list[int] = []

    def slot_bytes(self, cap: int) -> int:
        return cap * self.dim * 2 + _STATE_BYTES

    def reserve(self, slots: int, cap: int) -> None:
        """Room for ``slots`` seeds of ``cap`` rows (grown at least twofold, rows kept)."""
        have, have_cap = self.rows.shape[:2]
        if slots <= have and cap <= have_cap:
            return
        new_slots = max(slots, 2 * have) if slots > have else have
        new_cap = max(cap, 2 * have_cap) if cap > have_cap else have_cap
        rows = torch.empty(new_slots, new_cap, self.dim, dtype=torch.bfloat16)
        rows[:have, :have_cap] = self.rows
        self.free += range(new_slots - 1, have - 1, -1)
        self.rows = rows


class KeyStreams:
    """Per (seed, dim): the normalized key rows drawn so far (see the module). Thread-safe;
    what is kept never changes a bit of what is returned."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self._slabs: dict[int, _Slab] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._slabs.clear()

    def keys(self, seeds: list[int], dim: int, end: int,
             gen: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The first ``end`` normalized key rows of each seed at ``dim`` (bfloat16
        [len(seeds), end, dim]; the seeds distinct) and the generator's state after them:
        where ``torch.randn(end, dim)`` from a generator seeded with the seed leaves it.
        ``dim`` must be :func:`reusable`; ``gen`` is scratch."""
        with self._lock:
            slab = self._slabs.setdefault(dim, _Slab(dim))
            self._make_room(slab, seeds, end)
            self._extend(slab, [s for s in seeds if slab.seeds[s][1] < end], end, gen)
            states = [self._state(slab, seed, end, gen) for seed in seeds]
            slots = torch.tensor([slab.seeds[s][0] for s in seeds])
            return slab.rows[:, :end].index_select(0, slots), states

    def _make_room(self, slab: _Slab, seeds: list[int], end: int) -> None:
        """Every seed of ``seeds`` in ``slab`` (new ones with nothing drawn), the least
        recently used others dropped beyond the budget."""
        cap = max(end, slab.rows.shape[1])
        keep = max(len(seeds), self.budget // slab.slot_bytes(cap))
        new = []
        for seed in seeds:
            if seed in slab.seeds:
                slab.seeds.move_to_end(seed)
            else:
                new.append(seed)
        while len(slab.seeds) + len(new) > keep:  # the seeds asked for are the most recent
            slot, *_ = slab.seeds.popitem(last=False)[1]
            slab.free.append(slot)
        slab.reserve(len(slab.seeds) + len(new), cap)
        for seed in new:
            slab.seeds[seed] = [slab.free.pop(), 0, None, None]

    @staticmethod
    def _extend(slab: _Slab, seeds: list[int], end: int, gen: torch.Generator) -> None:
        """Draw rows count…end−1 of each of ``seeds`` (one float64 block, normalized at once)."""
        if not seeds:
            return
        low = min(slab.seeds[s][1] for s in seeds)  # raw holds rows low…end−1
        raw = torch.empty(len(seeds), end - low, slab.dim, dtype=torch.float64)
        starts = []
        for j, seed in enumerate(seeds):
            entry = slab.seeds[seed]  # [slot, count, state after count rows, after the first]
            start = entry[1]
            if start == 0:
                gen.manual_seed(seed)
                torch.randn(1, slab.dim, dtype=torch.float64, generator=gen, out=raw[j, :1])
                entry[3] = gen.get_state()
                if end > 1:
                    torch.randn(end - 1, slab.dim, dtype=torch.float64, generator=gen,
                                out=raw[j, 1:])
            else:
                gen.set_state(entry[2])
                torch.randn(end - start, slab.dim, dtype=torch.float64, generator=gen,
                            out=raw[j, start - low:])
            entry[1], entry[2] = end, gen.get_state()
            starts.append(start)
        # row by row (a seed's rows below its start are not drawn and not used); rounded to
        # bfloat16 as the seed's .to(bfloat16)
        normalized = _normalized(raw)
        slots = torch.tensor([slab.seeds[s][0] for s in seeds])
        if len(set(starts)) == 1:  # a sweep's case: every seed one chunk size further
            slab.rows[slots, low:end] = normalized.to(torch.bfloat16)
        else:
            for j, (slot, start) in enumerate(zip(slots.tolist(), starts)):
                slab.rows[slot, start:end] = normalized[j, start - low:].to(torch.bfloat16)

    @staticmethod
    def _state(slab: _Slab, seed: int, end: int, gen: torch.Generator) -> torch.Tensor:
        _, count, state, first = slab.seeds[seed]
        if end == count:
            return state
        if end == 1:
            return first
        # a shorter chunk than drawn: skip from the first row (uniform_ draws as randn does)
        gen.set_state(first)
        torch.empty((end - 1) * slab.dim, dtype=torch.float64).uniform_(generator=gen)
        return gen.get_state()


#: This process's streams (each draw process has its own).
STREAMS = KeyStreams()
