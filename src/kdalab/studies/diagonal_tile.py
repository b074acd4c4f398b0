"""The diagonal-tile study (the seed's first conclusion): a dense tile through a fixed boundary
against the per-pair computation, at C = 16, 32, 64 and with 16-token secondary tiles.

The quantity is the β-free intra-chunk Gram matrix with per-channel decay (KDA's gate is per key
channel, which is why the per-pair form cannot be one GEMM):

    P_ij = Σ_d k_id · k_jd · exp(G_id − G_jd),   i > j,

built by :func:`kdalab.kda.tiles.decayed_scores` under the seed recipe (exp2 with FTZ in float32,
bf16 factors and operands, float32-accumulated products) with each tile-scaling strategy, and
compared with the same sum in float64 with every factor formed per pair (≤ 1).

**Work is counted, not estimated**: the computation runs under a ``TorchDispatchMode`` that tallies
the arithmetic the modelled kernel performs:

``exps``        elements produced by ``exp2``/``exp`` (one per decay factor formed);
``scalings``    products that apply a factor to an operand element — one per factor, by the
                construction of :func:`kdalab.kda.tiles.operand` (so reported equal to ``exps``);
``gemm_macs``   multiply-adds of matrix products whose output tile is at least 2×2 (what a
                Tensor Core can take);
``dot_macs``    multiply-adds of products with a 1×1 output (per-pair dot products over the
                channels: scalar work).

Everything the emulation does to *round* (frexp, ldexp, where, casts) is bookkeeping of the model
and is not counted. Dense tiles compute their whole square (masked afterwards), as a GEMM does.

Records: one per (family, seed, lower bound, C, strategy) with the error and the counts per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kdalab import params
from kdalab.arith import rel_rmse
from kdalab.inputs.draw import per_channel_inputs
from kdalab.kda.intra import LOG2E
from kdalab.kda.recipe import SEED, Recipe
from kdalab.kda.tiles import decayed_scores, get_tiles
from kdalab.studies.cells import CellStudy
from kdalab.studies.plan import check_memory

__all__ = ["STRATEGIES", "DiagonalTileStudy", "WorkCounter", "reference_scores", "run_study",
           "count_work", "summarize"]

#: chunk_start / midpoint: one dense tile through a fixed boundary; per_pair: every pair;
#: secondary*: 16-token tiles, off-diagonal through fla's shared boundary, the diagonal tiles per
#: pair (secondary) or dense through a boundary inside the 16-token tile.
STRATEGIES = ("chunk_start", "midpoint", "per_pair", "secondary", "secondary-start",
              "secondary-midpoint")

_aten = torch.ops.aten
_EXP = {_aten.exp.default, _aten.exp2.default}
_MM = {_aten.mm.default, _aten.bmm.default}


class WorkCounter(TorchDispatchMode):
    """Counts exponentials and multiply-adds of the aten ops that run inside it."""

    def __init__(self):
        super().__init__()
        self.exps = 0
        self.gemm_macs = 0
        self.dot_macs = 0
        self.gemm_calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _EXP:
            self.exps += out.numel()
        elif func in _MM:
            a, b = args[0], args[1]
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            batch = a.numel() // (m * k)
            macs = batch * m * n * k
            if m == 1 and n == 1:
                self.dot_macs += macs
            else:
                self.gemm_macs += macs
                self.gemm_calls += 1
        return out


@dataclass(frozen=True)
class Work:
    exps: int
    scalings: int
    gemm_macs: int
    dot_macs: int


def reference_scores(keys: torch.Tensor, log_decay: torch.Tensor) -> torch.Tensor:
    """P in float64, every factor exp(G_i − G_j) ≤ 1 formed per pair and channel; strict lower."""
    k = keys.double()
    g = log_decay.double().cumsum(-2)
    diff = (g.unsqueeze(-2) - g.unsqueeze(-3)).clamp(max=0.0)
    p = (k.unsqueeze(-2) * k.unsqueeze(-3) * torch.exp(diff)).sum(-1)
    return torch.tril(p, diagonal=-1)


def _scores(keys, log_decay, strategy: str, recipe: Recipe) -> torch.Tensor:
    g = log_decay.double().cumsum(-2)
    if recipe.exp2_ftz:
        g = g * LOG2E  # the kernels hold the gate in base 2
    return decayed_scores(keys, keys, g, get_tiles(strategy), recipe, strict=True)


def count_work(chunk: int, dim: int, strategy: str, recipe: Recipe = SEED) -> Work:
    """The work of one chunk under ``strategy``, counted on one run."""
    keys, g = per_channel_inputs("model_like", chunk, dim, 0, -1.0)
    with WorkCounter() as wc:
        _scores(keys, g, strategy, recipe)
    return Work(wc.exps, wc.exps, wc.gemm_macs, wc.dot_macs)


def run_study(chunks: Sequence[int] = (16, 32, 64), strategies: Sequence[str] = STRATEGIES,
              lower_bounds: Sequence[float] = (-0.5, -1.0, -2.0, -5.0, -8.0),
              seeds: Sequence[int] = (0, 1, 2), dim: int = 64,
              recipe: Recipe = SEED) -> list[dict]:
    """Records of the study, batched: one call per (C, strategy) over every run."""
    chunks = params.int_list(chunks, "chunks", minimum=1)
    strategies = params.choices(strategies, "strategies", STRATEGIES)
    lower_bounds = params.lower_bounds(lower_bounds, "lower_bounds")
    seeds = params.int_list(seeds, "seeds", minimum=0)
    dim = params.integer(dim, "dim", 1)
    records = []
    for chunk in chunks:
        runs = [(f, s, lb) for f in ("floor", "model_like") for lb in lower_bounds
                for s in (seeds if f == "model_like" else (0,))]
        ins = [per_channel_inputs(f, chunk, dim, s, lb) for f, s, lb in runs]
        keys = torch.stack([k for k, _ in ins])
        g = torch.stack([x for _, x in ins])
        ref = reference_scores(keys, g)
        lower = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)
        for strategy in strategies:
            work = count_work(chunk, dim, strategy, recipe)
            p = _scores(keys, g, strategy, recipe)
            err = rel_rmse(p, ref).tolist()
            finite = torch.isfinite(p).flatten(-2).all(-1).tolist()
            lost = ((p == 0) & (ref.abs() > 0) & lower).flatten(-2).sum(-1).tolist()
            nonfinite = (~torch.isfinite(p)).flatten(-2).sum(-1).tolist()
            for i, (family, seed, lb) in enumerate(runs):
                records.append({
                    "family": family, "seed": seed, "lower_bound": lb, "chunk": chunk,
                    "dim": dim, "strategy": strategy, "rel_rmse": err[i],
                    "finite": int(finite[i]), "nonfinite_entries": nonfinite[i],
                    "lost_entries": lost[i], "exps": work.exps, "scalings": work.scalings,
                    "gemm_macs": work.gemm_macs, "dot_macs": work.dot_macs,
                })
    return records


class DiagonalTileStudy(CellStudy):
    """The study as cells (:class:`~kdalab.studies.cells.CellStudy`): one per chunk size, each
    a record per (strategy, input) (:func:`run_study`'s arguments, parsed there)."""

    kind = "diagonal-tile"
    FIELDS = (("family", "str"), ("seed", "int"), ("lower_bound", "float"), ("chunk", "int"),
              ("dim", "int"), ("strategy", "str"), ("rel_rmse", "float"), ("finite", "int"),
              ("nonfinite_entries", "int"), ("lost_entries", "int"), ("exps", "int"),
              ("scalings", "int"), ("gemm_macs", "int"), ("dot_macs", "int"))

    def __init__(self, chunks: Sequence[int], strategies: Sequence[str],
                 lower_bounds: Sequence[float], seeds: Sequence[int], dim: int):
        self.chunks = params.int_list(chunks, "chunks", minimum=1)
        self.strategies = params.choices(strategies, "strategies", STRATEGIES)
        self.lower_bounds = params.lower_bounds(lower_bounds, "lower_bounds")
        self.seeds = params.int_list(seeds, "seeds", minimum=0)
        self.dim = params.integer(dim, "dim", 1)
        inputs = len(self.lower_bounds) * (1 + len(self.seeds))  # floor once, model_like per seed
        self.records_per_run = len(self.strategies) * inputs
        # a chunk size is one cell, all its inputs at once: per pair (i, j) of an input and
        # channel its tiles' factors and products (an upper estimate: 41 bytes measured at
        # C = 128, dim 64, every strategy)
        params.records_per_run(self.records_per_run, "seeds", noun="chunk size")  # first
        check_memory(self.chunks, [self.dim], len(self.strategies), "cpu", "chunks", dim_name="dim",
                     bytes_of=lambda c, d, m: inputs * c * c * 48 * d)

    def keys(self) -> list[int]:
        return list(self.chunks)

    def identity(self) -> dict:
        return {"chunks": list(self.chunks), "strategies": list(self.strategies),
                "lower_bounds": list(self.lower_bounds), "seeds": list(self.seeds),
                "dim": self.dim}

    def run_cells(self, keys) -> list[list[dict]]:
        return [run_study([c], self.strategies, self.lower_bounds, self.seeds, self.dim)
                for c in keys]


def summarize(records: list[dict]) -> dict[str, pd.DataFrame]:
    """Work per chunk (counted) and error (median over seeds) per strategy and lower bound:
    ``work``, ``errors`` (long) and ``errors_wide`` (one column per lower bound)."""
    df = pd.DataFrame(records)
    work = (df.groupby(["chunk", "strategy"], sort=False, as_index=False)
            [["exps", "scalings", "gemm_macs", "dot_macs"]].first())
    work["gemm_share"] = work["gemm_macs"] / (work["gemm_macs"] + work["dot_macs"])
    err = df.groupby(["family", "chunk", "strategy", "lower_bound"], sort=False,
                     as_index=False).agg(rel_rmse=("rel_rmse", "median"),
                                         nonfinite=("nonfinite_entries", "max"),
                                         lost=("lost_entries", "max"))
    wide = err.pivot_table(index=["family", "chunk", "strategy"], columns="lower_bound",
                           values="rel_rmse", aggfunc="first", sort=False)
    wide = wide[sorted(wide.columns, reverse=True)]
    wide.columns = [f"lb {c:g}" for c in wide.columns]
    return {"work": work, "errors": err, "errors_wide": wide.reset_index()}
