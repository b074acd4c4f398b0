"""The inverse sweep as a study (:class:`kdalab.runner.Study`): its plan (the runs in canonical
order, indexed without being listed; the batches cut from the runs not yet stored, within a
memory budget) and how a batch becomes records, pipelined on CUDA, in this process or on a Ray
worker (see docs/sweeps.md)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import numpy as np
import torch

from kdalab import params
from kdalab.arith import AccumulationModel
from kdalab.inputs.draw import ChunkInputs, make_inputs_batch
from kdalab.inputs.families import get_family
from kdalab.inputs.runs import Run
from kdalab.kda.recipe import Recipe, get_recipe
from kdalab.studies.inverse import PendingGroup, launch_group, record_schema

__all__ = ["SEED_TABLE_CHUNKS", "SweepPlan", "Batch", "group_label", "DEFAULT_MAX_BATCH",
           "check_memory", "run_bytes", "STORE_KIND", "cpu_threads", "iter_batch_tables",
           "run_shard", "warm_worker"]

#: The store kind of the inverse sweep (``kdalab sweep`` and ``kdalab reproduce``).
STORE_KIND = "inverse-sweep"

#: The chunk sizes of the seed document's three tables.
SEED_TABLE_CHUNKS = {
    "floor": (8, 16, 17, 18, 19, 32),
    "weak_decay_correlated": (8, 16, 17, 24, 32, 48),
    "model_like": (8, 16, 32, 48),
}


#: C×C float64 matrices a run holds at the pipeline's peak, per accumulation model (an upper
#: estimate: L and its references, the inverses, the Neumann powers and their products)
MATRICES_PER_RUN = 24
#: the share of the device's memory one batch may take
MEMORY_SHARE = 0.5


def run_bytes(chunk: int, dim: int, models: int) -> int:
    """Bytes one run of a (chunk, dim) cell takes at the pipeline's peak (an estimate)."""
    return 8 * chunk * (MATRICES_PER_RUN * max(models, 1) * chunk + 4 * dim)


def memory_budget(device: str) -> int:
    """Bytes a batch may take on ``device``: a share of the GPU's memory, or of this machine's
    (its physical memory where the system says it, else 8 GiB)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev.index or 0).total_memory
    else:
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            total = 8 << 30
    return int(MEMORY_SHARE * total)


def check_memory(chunks: Sequence[int], dims: Sequence[int], models: int, device: str,
                 name: str = "chunks", bytes_of=run_bytes, dim_name: str = "dims") -> None:
    """A ValueError if the work of the largest chunk size done at once (one run of the sweep:
    ``bytes_of(chunk, dim, models)``, :func:`run_bytes`) would not fit the device's memory
    budget (:func:`memory_budget`): said before any work or folder is made. It names the
    dimension (``dim_name``) where the chunks would fit at an ordinary dimension (128) or even
    a chunk of 1 does not fit at this one, else the chunk sizes (``name``)."""
    budget = memory_budget(device)
    chunk, dim = max(chunks), max(dims)
    need = bytes_of(chunk, dim, models)
    if need <= budget:
        return
    gib = f"about {need / 2**30:,.0f} GiB at once, more than {device}'s budget of " \
          f"{budget / 2**30:,.0f} GiB"
    if bytes_of(1, dim, models) > budget or bytes_of(chunk, min(dim, 128), models) <= budget:
        raise ValueError(f"{dim_name}: a dimension of {dim} with chunks up to {chunk} needs "
                         f"{gib}; choose a smaller dimension")
    lo, hi = 1, chunk  # the largest chunk that fits: bytes grow with the chunk
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if bytes_of(mid, dim, models) <= budget else (lo, mid - 1)
    raise ValueError(f"{name}: a chunk of {chunk} needs {gib} (C×C matrices at dimension "
                     f"{dim}); choose chunk sizes up to about {lo}")


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

    kind: ClassVar[str] = STORE_KIND

    @classmethod
    def of(cls, config) -> SweepPlan:
        """The plan of a :class:`~kdalab.studies.sweep.SweepConfig` (its parsed fields)."""
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
        chunks = None if chunks is None else params.int_list(chunks, "chunks", minimum=1)
        for fam, fam_chunks in SEED_TABLE_CHUNKS.items():
            lb = -5.0 if get_family(fam).uses_lower_bound else None
            for c in fam_chunks if chunks is None else chunks:
                by_cell.setdefault(c, []).append((fam, lb))
        dim = params.integer(dim, "dim", 1)
        device = params.device(device)
        models = params.accumulations(accumulations, "accumulations", torch.device(device).type)
        check_memory(list(by_cell), [dim], len(models), device, dim_name="dim")
        return cls(tuple((c, dim, tuple(p)) for c, p in sorted(by_cell.items())),
                   params.int_list(seeds, "seeds", minimum=0), models, get_recipe("seed"),
                   device)

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

    def runs(self) -> list[Run]:
        """Every run, in index order (a list: for small plans and tests)."""
        return [Run(f, lb, c, s, d) for c, d, pairs in self.cells for f, lb in pairs
                for s in self.seeds]

    @property
    def _offsets(self) -> list[int]:
        out, total = [], 0
        for _, _, pairs in self.cells:
            out.append(total)
            total += len(pairs) * len(self.seeds)
        return out + [total]

    def __len__(self) -> int:
        return self._offsets[-1]

    def batches(self, max_batch: int | None = None,
                done: np.ndarray | None = None) -> Iterator[Batch]:
        """The runs not ``done`` (a bool array over the indices), cut into batches of at most
        ``max_batch`` runs of one cell (default :data:`DEFAULT_MAX_BATCH` for the device; fewer
        where the runs are large: :func:`memory_budget`), in index order; generated lazily."""
        max_batch = max_batch or DEFAULT_MAX_BATCH[self.gpu]
        budget = memory_budget(self.device)
        offsets, n_seeds = self._offsets, len(self.seeds)
        for (chunk, dim, pairs), lo in zip(self.cells, offsets):
            index = np.arange(lo, lo + len(pairs) * n_seeds, dtype=np.int64)
            if done is not None:
                index = index[~done[index]]
            # large chunks: fewer runs per batch, within the memory budget
            step = max(1, min(max_batch,
                              budget // run_bytes(chunk, dim, len(self.accumulations))))
            for start in range(0, len(index), step):
                part = index[start : start + step]
                pair, seed = np.divmod(part - lo, n_seeds)
                runs = [Run(pairs[p][0], pairs[p][1], chunk, self.seeds[s], dim)
                        for p, s in zip(pair.tolist(), seed.tolist())]
                yield Batch(group_label(chunk, dim), part, runs)

    # --- the study protocol (kdalab.runner.Study) ----------------------------------------
    @property
    def records_per_run(self) -> int:
        return len(self.accumulations)

    @property
    def schema(self):
        return record_schema()

    @property
    def gpu(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def compute(self, batches: Iterable[Batch], threads: int | None = None
                ) -> Iterator[tuple[Batch, object]]:
        """``(batch, records)`` in this process, pipelined on CUDA (:func:`iter_batch_tables`),
        on ``threads`` intra-op threads (default 1: :func:`cpu_threads`)."""
        device = torch.device(self.device)
        with cpu_threads(device, threads):
            yield from iter_batch_tables(batches, self.accumulations, recipe=self.recipe,
                                         device=device)

    def shard_fn(self):
        """A Ray worker's function (:func:`run_shard`), pickled with names, not models."""
        return partial(run_shard, accumulations=[m.name for m in self.accumulations],
                       recipe=self.recipe.name, device=torch.device(self.device).type)

    def ray_setup(self) -> tuple | None:
        """A GPU worker warms CUDA once (:func:`warm_worker`); a CPU worker needs nothing."""
        if not self.gpu:
            return None
        return (warm_worker, torch.device(self.device).type,
                tuple(m.name for m in self.accumulations), self.recipe.name)

    def shard_runs(self, pending: int, slots: int, max_batch: int | None) -> int:
        """Runs per Ray shard: on a GPU about four shards per GPU, so the last ones finish
        together (between one and 16 batches); on the CPU one batch."""
        max_batch = max_batch or DEFAULT_MAX_BATCH[self.gpu]
        if not self.gpu:
            return max_batch
        return max(max_batch, min(16 * max_batch, -(-pending // (4 * slots))))


def _pipelined(device: torch.device) -> bool:
    return device.type == "cuda"


#: run_sweep's batch size by device (False: CPU, True: CUDA); 4096 measured fastest of
#: 256/512/1024/4096 on the H200 (docs/BENCHMARKS.md).
DEFAULT_MAX_BATCH = {False: 512, True: 4096}


def cpu_threads(device: torch.device, threads: int | None):
    """Run with ``threads`` intra-op threads (default 1), restored afterwards, whatever the
    device: a sweep's CPU tensors are small, and intra-op threads only wait for each other.

    With two threads on a machine whose other core is busy, OpenMP waits for the descheduled
    thread at every operation (docs/BENCHMARKS.md has the figures); cores are used by Ray
    workers instead (``--backend ray``), one thread each. On CUDA the CPU's share (draws,
    copies, sigmoids, records) is small tensors too, and one thread measured faster than
    torch's default (docs/sweeps.md)."""
    @contextmanager
    def scope():
        before = torch.get_num_threads()
        torch.set_num_threads(threads or 1)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return scope()


def iter_batch_tables(batches: Iterable[Batch], accumulations: Sequence[AccumulationModel],
                      *, recipe: Recipe, device: torch.device
                      ) -> Iterator[tuple[Batch, object]]:
    """``(batch, records)`` for each batch in order, the records an Arrow table
    (:func:`~kdalab.studies.inverse.record_schema`).

    On CUDA the batches are pipelined: while the GPU computes batch n, the inputs of the next
    are drawn on a thread and this thread queues batch n+1's work, then builds batch n's
    records; the only wait for the GPU is each batch's one copy of its metrics back."""
    if device.type == "cuda" and device.index is None:  # the helper thread's default may differ
        device = torch.device("cuda", torch.cuda.current_device())

    def launch(batch: Batch, inputs: ChunkInputs | None = None) -> PendingGroup:
        return launch_group(batch.runs, accumulations, recipe=recipe, device=device,
                            inputs=inputs)

    source = iter(batches)
    if not _pipelined(device):
        for batch in source:
            yield batch, launch(batch).table(batch.index)
        return
    inputs_of = _drawn_ahead(source, device)
    pending = None
    try:
        for batch, inputs in inputs_of:
            launched = (batch, launch(batch, inputs))
            if pending is not None:
                yield pending[0], pending[1].table(pending[0].index)
            pending = launched
        if pending is not None:
            yield pending[0], pending[1].table(pending[0].index)
    finally:
        inputs_of.close()


def _drawn_ahead(source: Iterator[Batch], device: torch.device):
    """``(batch, inputs)`` in order, batch n+1's inputs drawn on a thread meanwhile."""
    with ThreadPoolExecutor(1, thread_name_prefix="kdalab-ahead") as ahead:
        batch = next(source, None)
        drawn = ahead.submit(make_inputs_batch, batch.runs, device) if batch else None
        try:
            while batch is not None:
                inputs = drawn.result()
                following = next(source, None)
                drawn = (ahead.submit(make_inputs_batch, following.runs, device)
                         if following is not None else None)
                yield batch, inputs
                batch = following
        finally:
            if drawn is not None:
                drawn.cancel()


def run_shard(shard: list[Batch], *, accumulations: list[str], recipe: str,
              device: str) -> list[tuple[Batch, object]]:
    """A Ray worker's shard: the records of its batches, pipelined as in the local backend, on
    one intra-op thread (Ray gives each worker one CPU)."""
    dev = torch.device(device)
    models = params.accumulations(accumulations, "accumulations", dev.type)
    with cpu_threads(dev, 1):
        return list(iter_batch_tables(shard, models, recipe=get_recipe(recipe), device=dev))


def warm_worker(device: str, accumulations: tuple[str, ...], recipe: str) -> None:
    """A GPU worker's start: one small batch initializes CUDA, its libraries and kdalab's
    kernels, so that no shard pays for them."""
    dev = torch.device(device)
    models = params.accumulations(list(accumulations), "accumulations", dev.type)
    with cpu_threads(dev, 1):
        launch_group([Run("floor", -5.0, 16, 0, 16)], models, recipe=get_recipe(recipe),
                     device=dev).table()
