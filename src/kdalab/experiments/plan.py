"""A sweep's plan: the runs of a sweep in canonical order, indexed without being listed, and the
batches cut from the runs not yet stored (see docs/sweeps.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kdalab import params
from kdalab.arith import AccumulationModel
from kdalab.experiments.families import get_family
from kdalab.experiments.runs import Run
from kdalab.kda.recipe import Recipe, get_recipe

__all__ = ["SEED_TABLE_CHUNKS", "SweepPlan", "Batch", "group_label"]

#: The chunk sizes of the seed document's three tables.
SEED_TABLE_CHUNKS = {
    "floor": (8, 16, 17, 18, 19, 32),
    "weak_decay_correlated": (8, 16, 17, 24, 32, 48),
    "model_like": (8, 16, 32, 48),
}


@dataclass(frozen=True)
class Batch:
    """Runs of one (chunk, dim) that go through the pipeline together, with their indices in
    the sweep (the records' ``run``) and the label of their store group."""

    group: str
    index: np.ndarray  # int64 [n]
    runs: list[Run]


def group_label(chunk: int, dim: int) -> str:
    """A (chunk, dim) group's label in the store; labels sort as the groups do."""
    return f"c{chunk:06d}-d{dim:06d}"


def _compact(values: Sequence[int]) -> str:
    """Integers in the list grammar, runs of consecutive values as ranges: '0-499,512'."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


Cell = tuple[int, int, tuple[tuple[str, float | None], ...]]  # chunk, dim, (family, bound)s


@dataclass(frozen=True)
class SweepPlan:
    """Everything that determines a sweep's records, with its runs in canonical order, indexed
    0…n−1 without listing them: cells of (chunk, dim) in sorted order; in each, its (family,
    lower bound) pairs, each over the seeds in order. Memory does not grow with the runs.

    :meth:`of` makes the plan of a :class:`SweepConfig` (every family at every chunk size),
    :meth:`seed_tables` the one of ``kdalab reproduce``, :meth:`from_identity` the one a store
    was written for."""

    cells: tuple[Cell, ...]
    seeds: tuple[int, ...]
    accumulations: tuple[AccumulationModel, ...]
    recipe: Recipe
    device: str

    @classmethod
    def of(cls, config) -> SweepPlan:
        """The plan of a :class:`~kdalab.experiments.sweep.SweepConfig` (its parsed fields)."""
        pairs: dict = {}
        for name in config.families:
            fam = get_family(name)
            for lb in (config.lower_bounds if fam.uses_lower_bound else (None,)):
                pairs.setdefault((fam.name, lb), None)
        cells = tuple((c, d, tuple(pairs)) for c, d in
                      sorted({(c, d) for c in config.chunks for d in config.dims}))
        return cls(cells, tuple(config.seeds), tuple(config.accumulations), config.recipe,
                   config.device)

    @classmethod
    def seed_tables(cls, seeds: Sequence[int], dim: int, chunks: Sequence[int] | None,
                    accumulations, device: str = "cpu") -> SweepPlan:
        """The runs behind the seed document's three tables (each family at its own chunk
        sizes, or all at ``chunks``), lower bound −5."""
        by_cell: dict[int, list] = {}
        for fam, fam_chunks in SEED_TABLE_CHUNKS.items():
            lb = -5.0 if get_family(fam).uses_lower_bound else None
            for c in params.int_list(chunks or fam_chunks, "chunks", minimum=1):
                by_cell.setdefault(c, []).append((fam, lb))
        dim = params.integer(dim, "dim", 1)
        device = params.device(device)
        return cls(tuple((c, dim, tuple(p)) for c, p in sorted(by_cell.items())),
                   params.int_list(seeds, "seeds", minimum=0),
                   params.accumulations(accumulations, "accumulations",
                                        torch.device(device).type),
                   get_recipe("seed"), device)

    def identity(self) -> dict:
        """The plan as JSON data: a store's configuration (its fingerprint hashes it). The
        device enters as its type: a GPU's float64 sums need not match the CPU's."""
        return {"cells": [[c, d, [list(p) for p in pairs]] for c, d, pairs in self.cells],
                "seeds": _compact(self.seeds),
                "accumulations": [m.name for m in self.accumulations],
                "recipe": self.recipe.name, "device": torch.device(self.device).type}

    @classmethod
    def from_identity(cls, data: dict, device: str | None = None) -> SweepPlan:
        """The plan a store was written for (``device``: e.g. ``cuda:1`` for ``cuda``)."""
        try:
            cells = tuple((int(c), int(d), tuple((str(f), None if lb is None else float(lb))
                                                 for f, lb in pairs))
                          for c, d, pairs in data["cells"])
            device = params.device(device or data["device"])
            if torch.device(device).type != data["device"]:
                raise ValueError(f"--device {device}: the stored sweep ran on "
                                 f"{data['device']}")
            return cls(cells, params.int_list(data["seeds"], "seeds", minimum=0),
                       params.accumulations(data["accumulations"], "accumulations",
                                            torch.device(device).type),
                       get_recipe(data["recipe"]), device)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"the store's configuration is not a sweep's ({exc})") from None

    @property
    def _offsets(self) -> list[int]:
        out, total = [], 0
        for _, _, pairs in self.cells:
            out.append(total)
            total += len(pairs) * len(self.seeds)
        return out + [total]

    def __len__(self) -> int:
        return self._offsets[-1]

    def batches(self, max_batch: int, done: np.ndarray | None = None) -> Iterator[Batch]:
        """The runs not ``done`` (a bool array over the indices), cut into batches of at most
        ``max_batch`` runs of one cell, in index order; generated lazily."""
        offsets, n_seeds = self._offsets, len(self.seeds)
        for (chunk, dim, pairs), lo in zip(self.cells, offsets):
            index = np.arange(lo, lo + len(pairs) * n_seeds, dtype=np.int64)
            if done is not None:
                index = index[~done[index]]
            for start in range(0, len(index), max_batch):
                part = index[start : start + max_batch]
                pair, seed = np.divmod(part - lo, n_seeds)
                runs = [Run(pairs[p][0], pairs[p][1], chunk, self.seeds[s], dim)
                        for p, s in zip(pair.tolist(), seed.tolist())]
                yield Batch(group_label(chunk, dim), part, runs)
