"""Declarative sweeps of the inverse experiment: a configuration is data, runs are its product.

A :class:`SweepConfig` names families × chunk sizes × seeds × dims × accumulation models (× lower
bounds for the families that use one). :func:`run_sweep` groups the runs by (chunk, dim), runs each
group as one batch (:func:`kdalab.experiments.inverse.launch_group`) and hands every group's
records to a sink as soon as they exist. Configurations load from TOML::

    families = ["floor", "model_like"]
    chunks = [4, 12, 16]
    seeds = "3-8"            # or a list
    dims = [64, 128]
    accumulations = ["fp16-seq"]
    lower_bounds = [-5.0]
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kdalab.arith import get_accumulation
from kdalab.experiments.families import (
    FAMILIES,
    PROCESS_MIN_RUNS,
    ChunkInputs,
    check_family,
    cuda_draw_processes,
    draw_processes_running,
    make_inputs_batch,
)
from kdalab.experiments.inverse import PendingGroup, RunSpec, launch_group

__all__ = ["DEFAULT_MAX_BATCH", "SweepConfig", "parse_int_list", "parse_float_list",
           "parse_name_list", "plan_runs", "plan_batches", "run_sweep", "SEED_TABLE_CHUNKS",
           "seed_reproduction_runs"]

#: The chunk sizes of the seed document's three tables.
SEED_TABLE_CHUNKS = {
    "floor": (8, 16, 17, 18, 19, 32),
    "weak_decay_correlated": (8, 16, 17, 24, 32, 48),
    "model_like": (8, 16, 32, 48),
}


def parse_int_list(text: str | int | Iterable, name: str) -> tuple[int, ...]:
    """``"3-8"``, ``"4,12,16"``, ``"0-2,5"``, an int, or a list → a tuple of ints."""
    if isinstance(text, bool):
        raise ValueError(f"{name}: expected integers, got {text!r}")
    if isinstance(text, int):
        return (text,)
    if not isinstance(text, str):
        try:
            items = list(text)
        except TypeError:
            raise ValueError(f"{name}: expected a list of integers, got {text!r}") from None
        out = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                raise ValueError(f"{name}: expected integers, got {item!r}")
            out.extend(parse_int_list(item, name))
        return tuple(out)
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"{name}: empty item in {text!r}")
        lo, sep, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(
                f"{name}: malformed list {text!r}; expected e.g. '4,12,16' or '3-8'") from None
    return tuple(out)


def parse_float_list(text: str | float | Iterable, name: str) -> tuple[float, ...]:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return (float(text),)
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        try:
            out.append(float(item.strip() if isinstance(item, str) else item))
        except (TypeError, ValueError):
            raise ValueError(f"{name}: malformed number {item!r} in {text!r}") from None
    if not out:
        raise ValueError(f"{name}: empty list")
    return tuple(out)


def parse_name_list(text: str | Iterable[str], name: str) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    out = tuple(str(i).strip() for i in items if str(i).strip())
    if not out:
        raise ValueError(f"{name}: empty list")
    return out


@dataclass(frozen=True)
class SweepConfig:
    families: tuple[str, ...] = FAMILIES
    chunks: tuple[int, ...] = (8, 16, 32)
    seeds: tuple[int, ...] = (0, 1, 2)
    dims: tuple[int, ...] = (128,)
    accumulations: tuple[str, ...] = ("fp16-seq",)
    lower_bounds: tuple[float, ...] = (-5.0,)
    recipe: str = "seed"
    device: str = "cpu"
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for f in self.families:
            check_family(f)
        for c in self.chunks:
            if c < 1:
                raise ValueError(f"chunks: every chunk size must be >= 1, got {c}")
        for d in self.dims:
            if d < 1:
                raise ValueError(f"dims: every dim must be >= 1, got {d}")
        for s in self.seeds:
            if s < 0:
                raise ValueError(f"seeds: seeds must be >= 0, got {s}")
        for lb in self.lower_bounds:
            if not lb < 0:
                raise ValueError(f"lower_bound must be < 0 (log-decay lies in (lower_bound, 0)), "
                                 f"got {lb}")
        for a in self.accumulations:
            get_accumulation(a)
        for name in ("families", "chunks", "seeds", "dims", "accumulations", "lower_bounds"):
            if not getattr(self, name):
                raise ValueError(f"{name}: empty list")

    @classmethod
    def from_mapping(cls, data: dict) -> SweepConfig:
        known = {"families", "chunks", "seeds", "dims", "accumulations", "accumulation",
                 "lower_bounds", "lower_bound", "recipe", "device"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown sweep keys: {', '.join(sorted(unknown))}; expected "
                             f"{', '.join(sorted(known))}")
        kw: dict = {}
        if "families" in data:
            kw["families"] = tuple(check_family(f) for f in parse_name_list(data["families"],
                                                                             "families"))
        if "chunks" in data:
            kw["chunks"] = parse_int_list(data["chunks"], "chunks")
        if "seeds" in data:
            kw["seeds"] = parse_int_list(data["seeds"], "seeds")
        if "dims" in data:
            kw["dims"] = parse_int_list(data["dims"], "dims")
        acc = data.get("accumulations", data.get("accumulation"))
        if acc is not None:
            kw["accumulations"] = parse_name_list(acc, "accumulations")
        lbs = data.get("lower_bounds", data.get("lower_bound"))
        if lbs is not None:
            kw["lower_bounds"] = parse_float_list(lbs, "lower_bounds")
        for key in ("recipe", "device"):
            if key in data:
                kw[key] = str(data[key])
        return cls(**kw)

    @classmethod
    def from_toml(cls, path: str | Path) -> SweepConfig:
        path = Path(path)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ValueError(f"config: no such file {str(path)!r}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config: malformed TOML in {str(path)!r}: {exc}") from None
        if "sweep" in data and isinstance(data["sweep"], dict):
            data = data["sweep"]
        return cls.from_mapping(data)

    def runs(self) -> list[RunSpec]:
        return plan_runs(self.families, self.chunks, self.seeds, self.dims, self.lower_bounds)

    def as_dict(self) -> dict:
        return {"families": list(self.families), "chunks": list(self.chunks),
                "seeds": list(self.seeds), "dims": list(self.dims),
                "accumulations": list(self.accumulations),
                "lower_bounds": list(self.lower_bounds), "recipe": self.recipe,
                "device": self.device}


def plan_runs(families: Sequence[str], chunks: Sequence[int], seeds: Sequence[int],
              dims: Sequence[int], lower_bounds: Sequence[float]) -> list[RunSpec]:
    """The product of the axes, without duplicates (families that ignore the lower bound run
    once)."""
    seen: dict[RunSpec, None] = {}
    for fam in families:
        for lb in lower_bounds:
            for c in chunks:
                for d in dims:
                    for s in seeds:
                        seen.setdefault(RunSpec.make(fam, c, s, d, lb), None)
    return list(seen)


def seed_reproduction_runs(seeds: Sequence[int] = (0, 1, 2), dim: int = 128,
                           chunks: Sequence[int] | None = None) -> list[RunSpec]:
    """The runs behind the seed document's three tables (or all families at ``chunks``)."""
    runs: list[RunSpec] = []
    for fam, fam_chunks in SEED_TABLE_CHUNKS.items():
        runs += plan_runs([fam], chunks or fam_chunks, seeds, [dim], [-5.0])
    return runs


def plan_batches(runs: Sequence[RunSpec], max_batch: int = 512) -> list[list[RunSpec]]:
    """The batches :func:`run_sweep` runs, in its order: runs grouped by (chunk, dim), sorted,
    each group cut into batches of at most ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    groups: dict[tuple[int, int], list[RunSpec]] = {}
    for spec in runs:
        groups.setdefault((spec.chunk, spec.dim), []).append(spec)
    return [specs[start : start + max_batch]
            for _, specs in sorted(groups.items())
            for start in range(0, len(specs), max_batch)]


def _pipelined(device: torch.device) -> bool:
    return device.type == "cuda"


#: run_sweep's batch size by device (False: CPU, True: CUDA); 4096 measured fastest of
#: 256/512/1024/4096 on the H200 (docs/BENCHMARKS.md).
DEFAULT_MAX_BATCH = {False: 512, True: 4096}


def default_draw_processes(n_runs: int, device: torch.device) -> int:
    """run_sweep's draw processes when not given: on CUDA for ``PROCESS_MIN_RUNS`` runs or
    more, or once they are running; else 0 (threads)."""
    big = n_runs >= PROCESS_MIN_RUNS or draw_processes_running()
    return cuda_draw_processes() if torch.device(device).type == "cuda" and big else 0


def run_sweep(
    runs: Sequence[RunSpec],
    accumulations: Sequence[str],
    *,
    recipe: str = "seed",
    device: str | torch.device = "cpu",
    sink: Callable[[list[dict]], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_batch: int | None = None,
    workers: int | None = None,
    processes: int | None = None,
) -> list[dict]:
    """Run ``runs`` batched by (chunk, dim); return all records (in a fixed order).

    ``sink`` receives each batch's records as soon as they exist; ``progress(done, total)`` is
    called after each batch. Records do not depend on batching (tested), only on the run.
    ``workers`` / ``processes``: threads or processes for the input draws (see
    :func:`~kdalab.experiments.families.make_inputs_batch`); ``processes=None`` draws in
    processes on CUDA for sweeps of ``families.PROCESS_MIN_RUNS`` runs or more, or once draw
    processes are running (``families.cuda_draw_processes()`` of them), else on threads.
    Records never depend on the choice. ``max_batch``: runs per batch (default
    :data:`DEFAULT_MAX_BATCH` for the device: 512 on the CPU, where small batches stay in cache;
    4096 on CUDA, where each batch costs a few hundred kernel launches).

    On CUDA the batches are pipelined: while the GPU computes batch n, the CPU draws the inputs
    of batch n+1 (on a helper thread) and queues its work, then builds batch n's records; the
    only wait for the GPU is each batch's one copy of its metrics back.
    """
    if max_batch is None:
        max_batch = DEFAULT_MAX_BATCH[torch.device(device).type == "cuda"]
    batches = plan_batches(runs, max_batch)
    total, done = len(runs), 0
    out: list[dict] = []

    def emit(pending: PendingGroup) -> None:
        nonlocal done
        records = pending.collect()
        if sink is not None:
            sink(records)
        out.extend(records)
        done += len(pending.specs)
        if progress is not None:
            progress(done, total)

    def launch(batch: list[RunSpec], inputs: ChunkInputs | None = None) -> PendingGroup:
        return launch_group(batch, accumulations, recipe=recipe, device=device, workers=workers,
                            processes=processes, inputs=inputs)

    device = torch.device(device)
    if processes is None:
        processes = default_draw_processes(len(runs), device)
    if device.type == "cuda" and device.index is None:  # the helper thread's default may differ
        device = torch.device("cuda", torch.cuda.current_device())
    if not _pipelined(device) or len(batches) < 2:
        for batch in batches:
            emit(launch(batch))
        return out
    with ThreadPoolExecutor(1, thread_name_prefix="kdalab-ahead") as ahead:
        draw = lambda batch: ahead.submit(  # noqa: E731
            make_inputs_batch, batch, device, workers, processes)
        next_inputs = draw(batches[0])
        pending = None
        try:
            for i, batch in enumerate(batches):
                inputs = next_inputs.result()
                if i + 1 < len(batches):
                    next_inputs = draw(batches[i + 1])
                launched = launch(batch, inputs)
                if pending is not None:
                    emit(pending)
                pending = launched
            emit(pending)
        finally:
            next_inputs.cancel()
    return out
