"""The end-to-end study: what the lower bound, the chunk size, the tile scaling and the precision
recipe do to the layer's output and final state, measured against the float64 recurrent reference.

A study is declarative (:class:`StudyConfig`): input families × gates (lower bounds and the
unbounded gate) × seeds × chunk sizes × variants (recipe, tile scaling, inverse). It is batched:
every gate and seed of a family is one batch of sequences, so one chunked forward call covers a
whole (family, variant, chunk size) cell, and one recurrent call gives the reference for a family.

Families: the presets ``model_like``, ``saturated``, ``weak_decay_correlated`` and ``long`` of
:mod:`kdalab.inputs.sequences` (bf16 inputs as a model hands them to the kernel, β logits, q and
k L2-normalized by the kernel), drawn at the study's length, heads and dim for each gate and seed.

One record per (family, gate, seed, chunk, variant) with ``o_rel_rmse`` and ``state_rel_rmse``
(relative RMS error over the whole output / final state; ``inf`` when any value is non-finite),
``o_nonfinite`` / ``state_nonfinite`` (counts) and ``finite`` (1 if both are all finite), and the
gate's statistics (mean and minimum log-decay per step) for context.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd
import torch

from kdalab import params
from kdalab.arith import rel_rmse
from kdalab.inputs.sequences import draw, kda_kwargs, preset
from kdalab.kda.chunk import forward_prepared, prepare_for_recipe
from kdalab.kda.gate import Prepared
from kdalab.kda.inverse import INVERSES
from kdalab.kda.naive import recurrent_core
from kdalab.kda.recipe import get_recipe
from kdalab.kda.tiles import get_tiles
from kdalab.studies.cells import CellStudy
from kdalab.studies.plan import memory_budget

__all__ = ["E2E_FAMILIES", "Variant", "DEFAULT_VARIANTS", "StudyConfig", "QUICK", "FULL",
           "study_inputs", "run_study", "gate_label", "summarize", "cell_cost",
           "EndToEndStudy"]

E2E_FAMILIES = ("model_like", "saturated", "weak_decay_correlated", "long")


@dataclass(frozen=True)
class Variant:
    """One way to compute the layer: a precision recipe, a tile scaling and an inverse."""

    recipe: str
    tiles: str
    inverse: str

    def __post_init__(self) -> None:
        get_recipe(self.recipe)
        get_tiles(self.tiles)
        params.choice(self.inverse, "inverse", INVERSES)

    @property
    def name(self) -> str:
        return f"{self.recipe}/{self.tiles}/{self.inverse}"

    @staticmethod
    def parse(text: str) -> Variant:
        parts = text.strip().split("/")
        if len(parts) != 3:
            raise ValueError(f"variant must be recipe/tiles/inverse, got {text!r}")
        return Variant(*parts)


#: The kernels as they are, and each one's tile scaling / inverse changed one at a time.
DEFAULT_VARIANTS = (
    Variant("flashkda", "chunk_start", "neumann"),       # FlashKDA v1
    Variant("flashkda", "midpoint", "neumann"),
    Variant("flashkda", "secondary", "neumann"),
    Variant("flashkda", "per_pair", "neumann"),
    Variant("flashkda", "chunk_start", "forward_substitution"),
    Variant("flashkda-h200", "chunk_start", "neumann"),  # FlashKDA v1, Tensor-Core arithmetic
    Variant("fla", "secondary-midpoint", "forward_substitution"),  # fla safe_gate
    Variant("fla", "secondary", "forward_substitution"),           # fla, per-pair diagonal
    Variant("fp32", "chunk_start", "neumann"),
    Variant("fp32", "per_pair", "forward_substitution"),
    Variant("fp64", "chunk_start", "exact"),
)


def gate_label(lower_bound: float | None) -> str:
    return "unbounded" if lower_bound is None else f"lb={lower_bound:g}"


@dataclass(frozen=True)
class StudyConfig:
    families: tuple[str, ...] = E2E_FAMILIES
    lower_bounds: tuple[float | None, ...] = (-1.0, -2.0, -5.0, -8.0, -10.0, None)
    chunks: tuple[int, ...] = (8, 16, 32, 64)
    variants: tuple[Variant, ...] = DEFAULT_VARIANTS
    seeds: tuple[int, ...] = (0, 1)
    length: int = 1024
    long_length: int = 4096
    heads: int = 2
    dim: int = 128

    def __post_init__(self) -> None:
        variants = self.variants
        if isinstance(variants, str):
            variants = params.name_list(variants, "variants")
        typed = {
            "families": params.choices(self.families, "families", E2E_FAMILIES),
            "lower_bounds": params.lower_bounds(self.lower_bounds, "lower_bounds",
                                                unbounded=True),
            "chunks": params.int_list(self.chunks, "chunks", minimum=1),
            "variants": tuple(dict.fromkeys(v if isinstance(v, Variant) else Variant.parse(v)
                                            for v in variants)),
            "seeds": params.int_list(self.seeds, "seeds", minimum=0),
            **{name: params.integer(getattr(self, name), name, 1)
               for name in ("length", "long_length", "heads", "dim")},
        }
        if not typed["variants"]:
            raise ValueError("variants is empty; expected recipe/tiles/inverse names")
        for name, value in typed.items():
            object.__setattr__(self, name, value)

    def seq_len(self, family: str) -> int:
        return self.long_length if family == "long" else self.length

    def cells(self) -> int:
        return len(self.families) * len(self.variants) * len(self.chunks)

    def cell_keys(self) -> list[tuple[str, str, int]]:
        """(family, variant name, chunk) of every cell, in the order :func:`run_study` runs
        them."""
        return [(f, v.name, c) for f in self.families for v in self.variants for c in self.chunks]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["variants"] = [v.name for v in self.variants]
        return d


FULL = StudyConfig()
#: Small enough for CI (seconds), same shape of output.
QUICK = replace(FULL, lower_bounds=(-2.0, -5.0, -10.0, None), chunks=(8, 16, 64), seeds=(0,),
                length=64, long_length=256, heads=1, dim=32,
                variants=tuple(Variant.parse(v) for v in (
                    "flashkda/chunk_start/neumann", "flashkda/per_pair/neumann",
                    "fla/secondary-midpoint/forward_substitution", "fp32/chunk_start/neumann")))


def cell_cost(cfg: StudyConfig, family: str, variant: str, chunk: int) -> float:
    """A rough relative cost of one cell, for progress estimates only: sequences × T × heads ×
    (C·D + D²) (the intra-chunk scores and the recurrence), ×C/4 where the tiles form every pair,
    ×16 for recipes on the Tensor-Core emulation (every product of a 16-block in float64)."""
    recipe, tiles, _ = variant.split("/")
    d = cfg.dim
    cost = (len(cfg.lower_bounds) * len(cfg.seeds) * cfg.seq_len(family) * cfg.heads
            * (chunk * d + d * d))
    if tiles == "per_pair" or tiles == "secondary":
        cost *= max(1.0, min(chunk, 16) / 4)
    if "h200" in recipe:
        cost *= 16
    return float(cost)


def study_inputs(family: str, lower_bound: float | None, seed: int, length: int, heads: int,
                 dim: int) -> dict:
    """Keyword arguments of :func:`kdalab.kda.forward` for one sequence batch (B = 1): the
    family's preset of :mod:`kdalab.inputs.sequences` at this shape and gate."""
    spec = preset(family, T=length, heads=heads, K=dim, V=dim, lower_bound=lower_bound)
    return kda_kwargs(draw(spec, seed))


def _cat(preps: Sequence[Prepared]) -> Prepared:
    p0 = preps[0]

    def cat(name):
        return torch.cat([getattr(p, name) for p in preps], dim=0)

    return replace(p0, q=cat("q"), k=cat("k"), v=cat("v"), log_decay=cat("log_decay"),
                   beta=cat("beta"), state=None, lengths=sum((p.lengths for p in preps), ()))


def _prepare(inputs: list[dict], recipe: str) -> Prepared:
    return _cat([prepare_for_recipe(**kw, recipe=recipe) for kw in inputs])


def _rows(o: torch.Tensor, s: torch.Tensor, o_ref: torch.Tensor, s_ref: torch.Tensor):
    """Per batch row: errors and non-finite counts."""
    n = o.shape[0]
    o2, s2 = o.reshape(n, -1), s.reshape(n, -1)
    return (rel_rmse(o2, o_ref.reshape(n, -1), 1).tolist(),
            rel_rmse(s2, s_ref.reshape(n, -1), 1).tolist(),
            (~torch.isfinite(o2)).sum(-1).tolist(), (~torch.isfinite(s2)).sum(-1).tolist())


class _Family:
    """A family's inputs and fp64 reference, drawn once for all of its cells."""

    def __init__(self, cfg: StudyConfig, family: str, device: torch.device):
        self.family, self.t = family, cfg.seq_len(family)
        self.keys = [(lb, seed) for lb in cfg.lower_bounds for seed in cfg.seeds]
        self.inputs = [{k: (x.to(device) if isinstance(x, torch.Tensor) else x)
                        for k, x in study_inputs(family, lb, seed, self.t, cfg.heads,
                                                 cfg.dim).items()}
                       for lb, seed in self.keys]
        ref = _prepare(self.inputs, "fp64")
        self.o_ref, self.s_ref = recurrent_core(ref.q, ref.k, ref.v, ref.log_decay, ref.beta,
                                                ref.scale)
        g = ref.log_decay.reshape(len(self.keys), -1)
        self.g_mean, self.g_min = g.mean(-1).tolist(), g.amin(-1).tolist()
        self.prepared: dict[str, Prepared] = {}

    def cell(self, cfg: StudyConfig, variant: Variant, chunk: int, device: str) -> list[dict]:
        if variant.recipe not in self.prepared:
            self.prepared[variant.recipe] = _prepare(self.inputs, variant.recipe)
        o, s = forward_prepared(self.prepared[variant.recipe], chunk_size=int(chunk),
                                tiles=variant.tiles, inverse=variant.inverse,
                                recipe=variant.recipe)
        eo, es, no, ns = _rows(o, s, self.o_ref, self.s_ref)
        return [{
            "family": self.family, "gate": gate_label(lb),
            "lower_bound": math.nan if lb is None else float(lb),
            "seed": int(seed), "T": self.t, "heads": cfg.heads, "dim": cfg.dim,
            "chunk": int(chunk), "variant": variant.name, "recipe": variant.recipe,
            "tiles": variant.tiles, "inverse": variant.inverse,
            "o_rel_rmse": float(eo[i]), "state_rel_rmse": float(es[i]),
            "o_nonfinite": int(no[i]), "state_nonfinite": int(ns[i]),
            "finite": int(no[i] == 0 and ns[i] == 0),
            "log_decay_mean": float(self.g_mean[i]), "log_decay_min": float(self.g_min[i]),
            "device": device,
        } for i, (lb, seed) in enumerate(self.keys)]


def check_memory(cfg: StudyConfig, device: str, names: Mapping[str, str] | None = None) -> None:
    """A ValueError naming the shape's fields (as ``names`` labels them: the command line's
    options) where one family's tensors could not be held on ``device``, before anything runs
    or is made (a process the system kills for its memory says nothing). A lower bound of what
    a family holds at once: the gates' and seeds' q, k, v, g and output in float64 with their
    states, and a chunk's C×C scores per head; so a study refused here could not have run."""
    label = (names or {}).get
    n, h, d = len(cfg.lower_bounds) * len(cfg.seeds), cfg.heads, cfg.dim
    t = max(cfg.seq_len(f) for f in cfg.families)
    c = max(cfg.chunks)
    need = 8 * n * h * (t * 8 * d + 2 * d * d + math.ceil(t / c) * c * c)
    budget = memory_budget(device)
    if need > budget:
        length = "long_length" if t == cfg.long_length and "long" in cfg.families else "length"
        raise ValueError(f"{label('heads', 'heads')} {h}, {label(length, length)} {t}, "
                         f"{label('dim', 'dim')} {d} and {label('chunks', 'chunks')} up to {c}: "
                         f"one family's tensors need at least {need / 2**30:,.0f} GiB, more "
                         f"than {device}'s budget of {budget / 2**30:,.0f} GiB; lower them")


class EndToEndStudy(CellStudy):
    """The study as cells (:class:`~kdalab.studies.cells.CellStudy`): one per (family,
    variant, chunk) in :meth:`StudyConfig.cell_keys` order, each a record per (gate, seed).
    Inputs are drawn on the CPU (so every device sees the same values) and moved to
    ``device``; a family's inputs and reference are made once for its cells."""

    kind = "end-to-end"
    FIELDS = (("family", "str"), ("gate", "str"), ("lower_bound", "float"), ("seed", "int"),
              ("T", "int"), ("heads", "int"), ("dim", "int"), ("chunk", "int"),
              ("variant", "str"), ("recipe", "str"), ("tiles", "str"), ("inverse", "str"),
              ("o_rel_rmse", "float"), ("state_rel_rmse", "float"), ("o_nonfinite", "int"),
              ("state_nonfinite", "int"), ("finite", "int"), ("log_decay_mean", "float"),
              ("log_decay_min", "float"), ("device", "str"))

    def __init__(self, cfg: StudyConfig, device: str | torch.device = "cpu",
                 names: Mapping[str, str] | None = None):
        """``names``: how errors name ``cfg``'s fields (the command line's options)."""
        self.cfg = cfg
        self.device = str(device)
        check_memory(cfg, self.device, names)
        self.records_per_run = len(cfg.lower_bounds) * len(cfg.seeds)
        self._variants = {v.name: v for v in cfg.variants}
        self._family: _Family | None = None

    def __getstate__(self) -> dict:  # a Ray worker draws its own inputs
        return {**self.__dict__, "_family": None}

    def keys(self) -> list[tuple[str, str, int]]:
        return self.cfg.cell_keys()

    def group(self, key) -> str:
        return key[0]

    def identity(self) -> dict:
        return {**self.cfg.as_dict(), "device": torch.device(self.device).type}

    def cost(self, key) -> float:
        return cell_cost(self.cfg, *key)

    def run_cells(self, keys) -> list[list[dict]]:
        device = torch.device(self.device)
        out = []
        for family, variant, chunk in keys:
            if self._family is None or self._family.family != family:
                self._family = None  # the last family's tensors go first
                self._family = _Family(self.cfg, family, device)
            out.append(self._family.cell(self.cfg, self._variants[variant], chunk,
                                         device.type))
        return out


def run_study(
    cfg: StudyConfig,
    *,
    sink: Callable[[list[dict]], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    device: str | torch.device = "cpu",
) -> list[dict]:
    """Run the study in memory; ``sink`` receives each cell's records as soon as they exist
    (:class:`EndToEndStudy` runs it into a store)."""
    study = EndToEndStudy(cfg, device)
    records: list[dict] = []
    keys = study.keys()
    for done, key in enumerate(keys, 1):
        cell = study.run_cells([key])[0]
        records.extend(cell)
        if sink is not None:
            sink(cell)
        if progress is not None:
            progress(done, len(keys))
    return records


def _worst(s: pd.Series) -> float:
    return float(s.max()) if len(s) else math.nan


def summarize(records: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """One row per (family, gate, variant, chunk): median and worst errors over seeds, finite
    fraction, and ``shown_o``/``shown_state`` = the median, or inf where any run is non-finite."""
    df = pd.DataFrame(records) if not isinstance(records, pd.DataFrame) else records
    keys = ["family", "gate", "variant", "recipe", "tiles", "inverse", "chunk"]
    g = df.groupby(keys, sort=False)
    out = g.agg(o_median=("o_rel_rmse", "median"), o_worst=("o_rel_rmse", _worst),
                state_median=("state_rel_rmse", "median"),
                state_worst=("state_rel_rmse", _worst),
                finite_fraction=("finite", "mean"), runs=("finite", "size"),
                log_decay_mean=("log_decay_mean", "mean")).reset_index()
    all_finite = out["finite_fraction"] == 1.0
    out["shown_o"] = np.where(all_finite, out["o_median"], math.inf)
    out["shown_state"] = np.where(all_finite, out["state_median"], math.inf)
    return out
