"""The measured phase diagram of the decay scales: lower bound × chunk × boundary × format.

For every chunk size C (one batch), inputs for every lower bound and family are stacked, and for
every (scale format, exp2 path, boundary) the kernel's L is built by
:func:`kdalab.kda.intra.kernel_l` (start/midpoint/end) or :func:`kdalab.kda.intra.
per_pair_l` (per_pair). One record per (family, seed, lower bound, C, format, exp2 path, boundary):

==================  ==============================================================================
scales              number of scale factors formed (2C for a fixed boundary: exp(G_i − G_b) and
                    exp(G_b − G_i) for every row; C(C+1)/2 for per_pair, i ≥ j)
overflow            factors that are ±inf — or, for a saturating format (fp8 e4m3), that the cast
                    clamped (counted with a twin of the format that returns NaN where it would
                    clamp)
zero                factors that are 0
subnormal           factors that are non-zero and below the format's smallest normal
scales_ok           1 if overflow == zero == 0;  scales_normal: 1 if also subnormal == 0
l_finite, l_rel_rmse   the kernel's L against the stable fp64 L
inv_finite, inv_rel_rmse  fp16 Neumann inverse of the kernel's L against the exact inverse of the
                    stable L (the seed's "INV total")
==================  ==============================================================================

Families: ``floor`` (worst case: every step at the bound, seed 0) and ``model_like``
(g = lb·sigmoid(N(0,1))), drawn by :func:`kdalab.inputs.draw.make_inputs`. Only the scale
format and the exp2 path vary; the rest of the recipe is the seed's (bf16 operands, fp32-accumulated
GEMM, fp16 L, fp16 Neumann inverse under ``inverse_accumulation``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kdalab import params
from kdalab.arith import AccumulationModel, Format, rel_rmse
from kdalab.arith.linalg import inv64
from kdalab.inputs.draw import make_inputs
from kdalab.kda.intra import boundary_log_decay, kernel_l, per_pair_l, split_factors, stable_l
from kdalab.kda.inverse import neumann_inverse
from kdalab.kda.recipe import SEED, Recipe
from kdalab.kda.safe_chunk import BOUNDARIES
from kdalab.studies.cells import CellStudy
from kdalab.studies.limits import TABLE_LOWER_BOUNDS, calculator_records
from kdalab.studies.plan import check_memory

__all__ = ["DEFAULT_LOWER_BOUNDS", "DEFAULT_FORMATS", "DEFAULT_CHUNKS", "SweepGrid", "run_chunk",
           "run_sweep", "calculator", "count_scales", "worst_case_scale_table",
           "DynamicRangeStudy"]

DEFAULT_LOWER_BOUNDS = (-0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0, -4.5, -5.0, -5.5, -6.0,
                        -6.5, -7.0, -8.0, -9.0, -10.0, -12.0, -14.0, -16.0, -18.0, -20.0)
DEFAULT_FORMATS = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2")
#: every C up to 32 (where bf16's boundaries fall for lb ≤ −3), then every 4th to 64, 8th to 128
DEFAULT_CHUNKS = "2-32,36-64:4,72-128:8"
#: the exp2 paths by name: the kernels' exp2 with flush-to-zero, exp rounded once, or both
FTZ_MODES = {"on": (True,), "off": (False,), "both": (True, False)}


@dataclass(frozen=True)
class SweepGrid:
    """The phase diagram's axes. Built from raw values (text, lists) or typed ones; each field is
    parsed once here (by :mod:`kdalab.params`). ``exp2_ftz``: ``"on"``, ``"off"``, ``"both"`` or a
    tuple of booleans."""

    lower_bounds: tuple[float, ...] = DEFAULT_LOWER_BOUNDS
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    formats: tuple[str, ...] = DEFAULT_FORMATS
    boundaries: tuple[str, ...] = BOUNDARIES
    exp2_ftz: tuple[bool, ...] = (True,)
    model_seeds: tuple[int, ...] = (0, 1)
    dim: int = 32
    inverse_accumulation: AccumulationModel = "fp32"

    def __post_init__(self) -> None:
        ftz = self.exp2_ftz
        if isinstance(ftz, str):
            ftz = FTZ_MODES[params.choice(ftz, "exp2_ftz", FTZ_MODES)]
        seeds = self.model_seeds
        typed = {
            "lower_bounds": params.lower_bounds(self.lower_bounds, "lower_bounds"),
            "chunks": tuple(sorted(params.int_list(self.chunks, "chunks", minimum=2))),
            "formats": tuple(dict.fromkeys(params.scale_format(f, "formats").name
                                           for f in params.name_list(self.formats, "formats"))),
            "boundaries": params.choices(self.boundaries, "boundaries", BOUNDARIES),
            "exp2_ftz": tuple(bool(x) for x in ftz),
            "model_seeds": () if seeds in ("", ()) else params.int_list(seeds, "model_seeds", 0),
            "dim": params.integer(self.dim, "dim", 1),
            "inverse_accumulation": params.accumulation(self.inverse_accumulation,
                                                        "inverse_accumulation", "cpu"),
        }
        for name, value in typed.items():
            object.__setattr__(self, name, value)
        # a chunk size is one cell, all its inputs at once: per pair (i, j) of an input its
        # per-pair scale factors over the dim (float32 and a float64 copy) and each
        # configuration's L, inverse and errors (an upper estimate: 902 bytes per pair measured
        # at dim 32 with 20 configurations, against 992 estimated)
        configs = len(self.formats) * len(self.exp2_ftz) * len(self.boundaries)
        inputs = len(self.lower_bounds) * (1 + len(self.model_seeds))
        params.records_per_run(configs * inputs, "model_seeds", noun="chunk size")  # first
        check_memory(self.chunks, [self.dim], configs, "cpu", "chunks", dim_name="dim",
                     bytes_of=lambda c, d, m: inputs * c * c * (16 * d + 24 * m))

    @property
    def group_count(self) -> int:
        return len(self.chunks)


def calculator(grid: SweepGrid) -> list[dict]:
    """The calculator's answers as records, for the grid's formats, boundaries and exp2 paths,
    at its lower bounds and those of the calculator's summary table."""
    lbs = sorted(set(grid.lower_bounds) | set(TABLE_LOWER_BOUNDS), reverse=True)
    return calculator_records(lbs, grid.formats, grid.boundaries, grid.exp2_ftz)


def _counted(fmt: Format) -> Format:
    """``fmt`` with clamping replaced by NaN where it saturates, so that saturated factors can be
    counted (the cast itself hides them)."""
    return fmt.with_overflow("nan") if fmt.overflow == "saturate" else fmt


def count_scales(scales: torch.Tensor, fmt: Format, mask: torch.Tensor | None = None) -> dict:
    """Overflow / zero / subnormal counts per run of ``scales`` ``[runs, ...]`` (factors ≥ 0);
    ``mask`` (broadcast to ``scales``) selects the factors that count."""
    s = scales.double()
    mask = torch.ones_like(s, dtype=torch.bool) if mask is None else mask.expand_as(s)
    over = (~torch.isfinite(s)) & mask
    zero = (s == 0) & mask
    sub = (s > 0) & (s < fmt.tiny) & mask
    return {k: v.flatten(1).sum(-1) for k, v in
            (("scales", mask), ("overflow", over), ("zero", zero), ("subnormal", sub))}


def _scale_counts(keys, log_decay, beta, recipe: Recipe, boundary: str) -> dict:
    """Counts from the scale factors the kernel path forms (with the detection twin's format),
    by running the kernel itself (:func:`kernel_l` or :func:`per_pair_l`)."""
    fmt = recipe.scale_format
    twin = recipe.with_(scale_format=_counted(fmt))
    if boundary == "per_pair":
        pp = per_pair_l(keys, log_decay, beta, twin)
        c = log_decay.shape[-1]
        mask = torch.ones(c, c, dtype=torch.bool).tril()[..., None]  # i >= j
        return count_scales(pp.scales, fmt, mask)
    kl = kernel_l(keys, log_decay, beta, twin, boundary)
    both = torch.cat([kl.decay, kl.inv_decay], dim=-1)  # [..., C, 2X]
    return count_scales(both, fmt)


def _l_and_counts(keys, log_decay, beta, recipe: Recipe, boundary: str):
    """The kernel's L, and the counts of its scale factors. The counts come from the factors the
    kernel returned, except for a saturating format, where the same scale path
    (:func:`~kdalab.kda.intra.split_factors`) is rerun with saturation made visible."""
    fmt = recipe.scale_format
    if boundary == "per_pair":  # factors ≤ 1: the twin changes nothing
        pp = per_pair_l(keys, log_decay, beta, recipe)
        c = log_decay.shape[-1]
        mask = torch.ones(c, c, dtype=torch.bool).tril()[..., None]
        return pp.l, count_scales(pp.scales, fmt, mask)
    kl = kernel_l(keys, log_decay, beta, recipe, boundary)
    if fmt.overflow == "saturate":
        g = log_decay.double().cumsum(-1)[..., None]
        d, inv = split_factors(g - boundary_log_decay(g, boundary),
                               recipe.with_(scale_format=_counted(fmt)))
    else:
        d, inv = kl.decay, kl.inv_decay
    return kl.l, count_scales(torch.cat([d, inv], dim=-1), fmt)


def run_chunk(grid: SweepGrid, chunk: int) -> list[dict]:
    """All records of one chunk size: one batch per (format, exp2 path, boundary)."""
    runs = [("floor", 0, lb) for lb in grid.lower_bounds]
    runs += [("model_like", s, lb) for s in grid.model_seeds for lb in grid.lower_bounds]
    inputs = [make_inputs(f, chunk, grid.dim, s, lb) for f, s, lb in runs]
    keys = torch.stack([i.keys for i in inputs])
    log_decay = torch.stack([i.log_decay for i in inputs])
    beta = torch.stack([i.beta for i in inputs])

    eye = torch.eye(chunk, dtype=torch.float64)
    l_ref = stable_l(keys, log_decay, beta)
    inv_ref = inv64(eye + l_ref)

    configs, ls, counts = [], [], []
    for fmt_name in grid.formats:
        fmt = params.scale_format(fmt_name)
        for ftz in grid.exp2_ftz:
            recipe = SEED.with_(scale_format=fmt, exp2_ftz=ftz)
            for boundary in grid.boundaries:
                configs.append((fmt.name, ftz, boundary))
                l, cnt = _l_and_counts(keys, log_decay, beta, recipe, boundary)
                ls.append(l)
                counts.append(cnt)
    l_all = torch.stack(ls)  # [configs, runs, C, C] fp16
    l_err = rel_rmse(l_all, l_ref)
    l_fin = torch.isfinite(l_all).flatten(-2).all(-1)
    inv = neumann_inverse(l_all, grid.inverse_accumulation, SEED.inverse_format).inverse
    inv_err = rel_rmse(inv, inv_ref)
    inv_fin = torch.isfinite(inv).flatten(-2).all(-1)

    records: list[dict] = []
    l_err, l_fin, inv_err, inv_fin = (t.tolist() for t in (l_err, l_fin, inv_err, inv_fin))
    for ci, (fmt_name, ftz, boundary) in enumerate(configs):
        cnt = {k: v.tolist() for k, v in counts[ci].items()}
        for ri, (family, seed, lb) in enumerate(runs):
            over, zero, sub = cnt["overflow"][ri], cnt["zero"][ri], cnt["subnormal"][ri]
            records.append({
                "family": family, "seed": seed, "lower_bound": lb, "chunk": chunk,
                "boundary": boundary, "format": fmt_name, "exp2_ftz": ftz, "dim": grid.dim,
                "scales": cnt["scales"][ri], "overflow": over, "zero": zero, "subnormal": sub,
                "scales_ok": int(over == 0 and zero == 0),
                "scales_normal": int(over == 0 and zero == 0 and sub == 0),
                "l_finite": int(l_fin[ci][ri]), "l_rel_rmse": l_err[ci][ri],
                "inv_finite": int(inv_fin[ci][ri]), "inv_rel_rmse": inv_err[ci][ri],
                "inverse_accumulation": grid.inverse_accumulation.name,
            })
    return records


class DynamicRangeStudy(CellStudy):
    """The phase diagram as cells (:class:`~kdalab.studies.cells.CellStudy`): one per chunk
    size, each a record per (format, exp2 path, boundary, family input)."""

    kind = "dynamic-range"
    FIELDS = (("family", "str"), ("seed", "int"), ("lower_bound", "float"), ("chunk", "int"),
              ("boundary", "str"), ("format", "str"), ("exp2_ftz", "bool"), ("dim", "int"),
              ("scales", "int"), ("overflow", "int"), ("zero", "int"), ("subnormal", "int"),
              ("scales_ok", "int"), ("scales_normal", "int"), ("l_finite", "int"),
              ("l_rel_rmse", "float"), ("inv_finite", "int"), ("inv_rel_rmse", "float"),
              ("inverse_accumulation", "str"))

    def __init__(self, grid: SweepGrid):
        self.grid = grid
        inputs = len(grid.lower_bounds) * (1 + len(grid.model_seeds))
        self.records_per_run = (len(grid.formats) * len(grid.exp2_ftz) * len(grid.boundaries)
                                * inputs)

    def keys(self) -> list[int]:
        return list(self.grid.chunks)

    def identity(self) -> dict:
        g = self.grid
        return {"lower_bounds": list(g.lower_bounds), "chunks": list(g.chunks),
                "formats": list(g.formats), "boundaries": list(g.boundaries),
                "exp2_ftz": list(g.exp2_ftz), "model_seeds": list(g.model_seeds), "dim": g.dim,
                "inverse_accumulation": g.inverse_accumulation.name}

    def cost(self, key) -> float:
        return float(key * key)  # per_pair and the inverse grow like C²…C³

    def run_cells(self, keys) -> list[list[dict]]:
        return [run_chunk(self.grid, chunk) for chunk in keys]


def run_sweep(grid: SweepGrid, *, sink: Callable[[list[dict]], None] | None = None,
              progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Every chunk size of the grid; each chunk's records go to ``sink`` as soon as they exist."""
    out: list[dict] = []
    for i, chunk in enumerate(grid.chunks):
        recs = run_chunk(grid, chunk)
        if sink is not None:
            sink(recs)
        out.extend(recs)
        if progress is not None:
            progress(i + 1, len(grid.chunks))
    return out


def worst_case_scale_table(lower_bounds: Sequence[float], chunks: Sequence[int],
                           formats: Sequence[str], boundaries: Sequence[str] = BOUNDARIES,
                           exp2_ftz: Sequence[bool] = (True,)) -> list[dict]:
    """Scale-factor counts on the worst case (every step at the bound), the whole grid at once.

    G is the float64 cumulative sum of the steps, as the kernels compute it; the chunk of C tokens
    is its first C entries. For a fixed boundary every chunk's exponents G_i − G_b (G_b from
    :func:`boundary_log_decay`) are stacked, padded, into one tensor and pushed through the scale
    path once per (format, exp2 path). For per_pair the 128×128 pair matrix G_i − G_j is formed
    once per lower bound and chunk C counts its leading C×C block (prefix sums).
    """
    chunks = [int(c) for c in chunks]
    lbs = torch.tensor([float(x) for x in lower_bounds], dtype=torch.float64)
    cmax = max(chunks)
    g_full = lbs[:, None].expand(-1, cmax).cumsum(-1)  # [L, Cmax]
    fixed = [b for b in boundaries if b != "per_pair"]
    rel = torch.zeros(len(fixed), len(chunks), len(lbs), cmax, dtype=torch.float64)
    mask = torch.zeros(len(chunks), 1, cmax, dtype=torch.bool)
    for ci, c in enumerate(chunks):
        g = g_full[:, :c, None]  # [L, C, 1]
        mask[ci, :, :c] = True
        for bi, b in enumerate(fixed):
            rel[bi, ci, :, :c] = (g - boundary_log_decay(g, b))[..., 0]
    if "per_pair" in boundaries:
        diff = (g_full[:, :, None] - g_full[:, None, :]).clamp(max=0.0)  # [L, i, j]
        lower = torch.ones(cmax, cmax, dtype=torch.bool).tril()
    out = []
    for fmt_name in formats:
        fmt = params.scale_format(fmt_name, "formats")
        for ftz in exp2_ftz:
            recipe = SEED.with_(scale_format=_counted(fmt), exp2_ftz=ftz)
            counts = {}
            if fixed:
                d, inv = split_factors(rel, recipe)
                both = torch.stack([d, inv]).double()  # [2, B, C, L, Cmax]
                m = mask.expand_as(both)
                for key, bad in (("overflow", ~torch.isfinite(both)), ("zero", both == 0),
                                 ("subnormal", (both > 0) & (both < fmt.tiny))):
                    counts[key] = (bad & m).sum(dim=(0, -1))  # [B, C, L]
            if "per_pair" in boundaries:
                s = split_factors(diff, recipe)[0].double()
                pp = {}
                for key, bad in (("overflow", ~torch.isfinite(s)), ("zero", s == 0),
                                 ("subnormal", (s > 0) & (s < fmt.tiny))):
                    cum = (bad & lower).to(torch.int64).cumsum(-1).cumsum(-2)  # [L, i, j]
                    pp[key] = torch.stack([cum[:, c - 1, c - 1] for c in chunks])  # [C, L]
            for bi, boundary in enumerate(boundaries):
                for ci, c in enumerate(chunks):
                    for li, lb in enumerate(lower_bounds):
                        if boundary == "per_pair":
                            vals = {k: int(pp[k][ci, li]) for k in pp}
                        else:
                            j = fixed.index(boundary)
                            vals = {k: int(counts[k][j, ci, li]) for k in counts}
                        out.append({"lower_bound": float(lb), "chunk": c, "format": fmt.name,
                                    "exp2_ftz": ftz, "boundary": boundary, **vals})
    return out
