"""Declarative sweeps of the inverse experiment: a configuration is data, runs are its product.

A :class:`SweepConfig` names families × chunk sizes × seeds × dims × accumulation models (× lower
bounds for the families that use one). :func:`run_sweep` groups the runs by (chunk, dim), runs each
group as one batch (:func:`kdalab.studies.inverse.launch_group`) and hands every group's
records to a sink as soon as they exist. Configurations load from TOML, the keys spelled as the
command's options (dashes or underscores; plural field names work too)::

    families = ["floor", "model_like"]
    chunks = [4, 12, 16]
    seeds = "3-8"            # or a list
    dims = [64, 128]
    accumulation = ["fp16-seq"]
    lower-bound = [-5.0]
    out = "results/my-sweep"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from kdalab import params
from kdalab.arith import AccumulationModel
from kdalab.errors import Unavailable
from kdalab.inputs.families import FAMILIES, get_family
from kdalab.inputs.runs import Run
from kdalab.kda.recipe import Recipe, get_recipe
from kdalab.params import option_field, read_sweep_file
from kdalab.studies.plan import (
    DEFAULT_MAX_BATCH,
    SEED_TABLE_CHUNKS,
    Batch,
    SweepPlan,
    check_memory,
    cpu_threads,
    group_label,
    iter_batch_tables,
)

__all__ = ["DEFAULT_MAX_BATCH", "SweepConfig", "read_sweep_file", "plan_runs", "plan_batches",
           "run_sweep", "SEED_TABLE_CHUNKS", "seed_reproduction_runs", "record_cost",
           "option_field", "SweepPlan", "Batch", "iter_batch_tables", "group_label"]


@dataclass(frozen=True)
class SweepConfig:
    """A sweep's axes. Built from raw values (text, lists) or typed ones; every field is parsed
    once here, by :mod:`kdalab.params`, and holds its typed value afterwards."""

    families: tuple[str, ...] = tuple(FAMILIES)
    chunks: tuple[int, ...] = (8, 16, 32)
    seeds: tuple[int, ...] = (0, 1, 2)
    dims: tuple[int, ...] = (128,)
    accumulations: tuple[AccumulationModel, ...] = ("fp16-seq",)
    lower_bounds: tuple[float, ...] = (-5.0,)
    recipe: Recipe = "seed"
    device: str = "cpu"

    def __post_init__(self) -> None:
        device = params.device(self.device, "device")
        typed = {
            "families": tuple(get_family(f, "families").name
                              for f in params.name_list(self.families, "families")),
            "chunks": params.int_list(self.chunks, "chunks", minimum=1),
            "seeds": params.int_list(self.seeds, "seeds", minimum=0),
            "dims": params.int_list(self.dims, "dims", minimum=1),
            "accumulations": params.accumulations(self.accumulations, "accumulations",
                                                  torch.device(device).type),
            "lower_bounds": params.lower_bounds(self.lower_bounds, "lower_bounds"),
            "recipe": _recipe(self.recipe, "recipe"),
            "device": device,
        }
        for name, value in typed.items():
            object.__setattr__(self, name, value)
        check_memory(self.chunks, self.dims, len(self.accumulations), device)

    @classmethod
    def parse(cls, data: Mapping[str, object],
              labels: Mapping[str, str] | None = None) -> SweepConfig:
        """A configuration from a mapping whose keys are spelled as the command's options
        (``lower-bound``, ``--lower-bound``, ``lower_bounds``…). ``labels`` (key → how to name it
        in a message, e.g. ``"--seeds"`` or ``"sweep.toml: seeds"``) names the arguments in
        errors as the user wrote them; by default the keys themselves."""
        known = {f.name for f in fields(cls)}
        kw, names = {}, {}
        for key, value in data.items():
            name = option_field(key)
            if name not in known:
                options = ", ".join(sorted({k.replace("_", "-") for k in known}))
                raise ValueError(f"{(labels or {}).get(key, key)}: unknown key; expected one of "
                                 f"{options} (dashes or underscores)")
            if name in kw:
                raise ValueError(f"{(labels or {}).get(key, key)}: {name} is given twice")
            kw[name], names[name] = value, (labels or {}).get(key, key)
        try:
            return cls(**kw)
        except (ValueError, Unavailable) as exc:  # name the argument as the user wrote it
            raise params.renamed(exc, names) from None

    def runs(self) -> list[Run]:
        """Every run of the sweep, in its plan's order (:meth:`SweepPlan.runs`)."""
        return SweepPlan.of(self).runs()

    def as_dict(self) -> dict:
        return {"families": list(self.families), "chunks": list(self.chunks),
                "seeds": list(self.seeds), "dims": list(self.dims),
                "accumulations": [m.name for m in self.accumulations],
                "lower_bounds": list(self.lower_bounds), "recipe": self.recipe.name,
                "device": self.device}


def _recipe(value, name: str) -> Recipe:
    """A recipe by name (or the recipe itself), errors naming ``name``."""
    from kdalab.kda.recipe import RECIPES

    if isinstance(value, Recipe):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{name} must name a recipe, one of {', '.join(RECIPES)}; got "
                         f"{value!r}")
    try:
        return get_recipe(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def plan_runs(families: Sequence[str], chunks: Sequence[int], seeds: Sequence[int],
              dims: Sequence[int], lower_bounds: Sequence[float]) -> list[Run]:
    """The product of the axes (each checked once), without duplicates (families that ignore
    the lower bound run once), in the plan's order."""
    return SweepConfig(families=families, chunks=chunks, seeds=seeds, dims=dims,
                       lower_bounds=lower_bounds).runs()


def seed_reproduction_runs(seeds: Sequence[int] = (0, 1, 2), dim: int = 128,
                           chunks: Sequence[int] | None = None) -> list[Run]:
    """The runs behind the seed document's three tables (or all families at ``chunks``):
    :meth:`SweepPlan.seed_tables`' runs."""
    return SweepPlan.seed_tables(seeds, dim, chunks, ["fp16-seq"]).runs()


def record_cost(chunk: int, dim: int, accumulation: str) -> float:
    """A rough cost of one record (one run under one model) in CPU milliseconds, for progress
    estimates only, fitted to `run_sweep` on one CPU thread (dim 128, C = 8…64): a fixed part
    per run for the draws, L and the references, then per model a term linear in C (fp16-seq,
    fp32, fp64) or cubic in C (fp16-once's exact limbs, the Tensor-Core emulation); the GPU's
    models cost little per run."""
    if accumulation.startswith("h200"):
        model = 1e-4 * chunk**3
    elif accumulation == "fp16-once":
        model = 8e-5 * chunk**3
    elif accumulation == "fp16-seq":
        model = 0.08 * chunk
    else:
        model = 0.03 * chunk
    return 0.4 * dim / 128 + model


def plan_batches(runs: Sequence[Run], max_batch: int = 512) -> list[list[Run]]:
    """The batches :func:`run_sweep` runs, for a list of runs of any shape (a
    :class:`SweepPlan` cuts its own): runs grouped by (chunk, dim), sorted, each group cut
    into batches of at most ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    groups: dict[tuple[int, int], list[Run]] = {}
    for spec in runs:
        groups.setdefault((spec.chunk, spec.dim), []).append(spec)
    return [specs[start : start + max_batch]
            for _, specs in sorted(groups.items())
            for start in range(0, len(specs), max_batch)]


def run_sweep(
    runs: Sequence[Run],
    accumulations: Sequence[str | AccumulationModel],
    *,
    recipe: str | Recipe = "seed",
    device: str | torch.device = "cpu",
    sink: Callable[[list[dict]], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_batch: int | None = None,
    threads: int | None = None,
) -> list[dict]:
    """Run ``runs`` batched by (chunk, dim); return all records (in a fixed order).

    ``sink`` receives each batch's records as soon as they exist; ``progress(done, total)`` is
    called after each batch. Records do not depend on batching (tested), only on the run.
    ``max_batch``: runs per batch (default
    :data:`DEFAULT_MAX_BATCH` for the device: 512 on the CPU, where small batches stay in cache;
    4096 on CUDA, where each batch costs a few hundred kernel launches). ``threads``: torch's
    intra-op threads during the sweep (default 1, see :func:`~kdalab.studies.plan.cpu_threads`).
    Pipelined on CUDA (:func:`iter_batch_tables`). For sweeps kept on disk, resumable and
    run on Ray, see :func:`kdalab.runner.run_into_store`.
    """
    device = torch.device(params.device(device))
    models = params.accumulations(accumulations, "accumulations", device.type)
    recipe = get_recipe(recipe)
    if max_batch is None:
        max_batch = DEFAULT_MAX_BATCH[device.type == "cuda"]
    batches = [Batch(group_label(b[0].chunk, b[0].dim), np.arange(len(b)), b)
               for b in plan_batches(runs, max_batch)]
    total, done = len(runs), 0
    out: list[dict] = []
    with cpu_threads(device, threads):
        for batch, table in iter_batch_tables(batches, models, recipe=recipe, device=device):
            records = table.drop_columns(["run"]).to_pylist()
            if sink is not None:
                sink(records)
            out.extend(records)
            done += len(batch.runs)
            if progress is not None:
                progress(done, total)
    return out


# --- sweeps into a store, on a backend ---------------------------------------------------------
