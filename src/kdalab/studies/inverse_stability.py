"""The inverse's stability map: where each (I + L)⁻¹ algorithm fails, over key collinearity × β ×
decay, beside what the Neumann product's growth predicts (docs/inverse-stability.md).

One chunk of C tokens, scalar decay g per step (natural log), write strength β for every token,
unit keys around one shared key:

    k_i = normalize(k₀ + s·n_i)    (s: the keys' spread; s = 0 collinear, s ≳ 1 unrelated)
    L_ij = β · (k_i·k_j) · exp(g·(i − j)),  i > j

L is formed in float64 and handed to each algorithm in its own input format:

===================  ========================================================================
``fp16-neumann``     (I − L)(I + L²)(I + L⁴)··· in fp16, each product one H200 Tensor-Core
                     chain with fp16 accumulation (``h200-mma``): the seed's and FlashKDA v1's
``fp32-neumann``     the same product in fp32 (kdalab's kernel)
``flashkda-v2``      8×8 fp32 forward substitution + bf16 merge (C = 16 only: FlashKDA's chunk)
``fla``              16×16 fp32 forward substitution + fp32 merge (fla's ``solve_tril``: C = 16,
                     32, 64)
``fp64-exact``       LAPACK in float64: the floor
===================  ========================================================================

Measured per grid point over ``samples`` draws (the worst draw): the inverse's error
max|X̃ − X| / max|X| against the float64 inverse X (forward substitution), and the chunk
output's relative RMSE, o = Mqk·X̃·(β v) with everything but X̃ in float64
(Mqk_ij = q_i·k_j·exp(g(i − j)), i ≥ j).

The theory beside it (the Neumann product only): the product forms L^n for n = 2^j < C and the
partial inverses; every entry of L^n is bounded by the entry of |L|^n (the triangle inequality),
and by ‖L‖^n in any submultiplicative norm. The largest entry it bounds, ``growth``, is what the
format must hold (fp16: ≤ 65504, else inf) and the scale of the terms whose sum is an inverse of
entries O(1): the result's error is about u·growth (u = 2⁻¹¹ fp16, 2⁻²⁴ fp32), so the product is
predicted to fail where u·growth ≥ 1e-2 (``predicted_error``).

Config → plan (one batch per chunk size and spread: every β, decay and draw at once) → records
(one per chunk, algorithm, spread, β, decay). The draws depend on (seed, C) only, so records are
the same whatever the batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch

from kdalab.arith import FP16, FP32, quantize
from kdalab.arith.linalg import matmul64
from kdalab.kda.inverse import (
    block_substitution,
    exact_inverse,
    forward_substitution,
    neumann_inverse,
)

__all__ = ["ALGORITHMS", "Config", "QUICK", "FULL", "Batch", "plan", "run_batch", "run_study",
           "neumann_growth", "THRESHOLD", "UNIT_ROUNDOFF", "summarize", "algorithms_for"]

#: The error at which an inverse is called failed (and the contour drawn).
THRESHOLD = 1e-2
#: Unit roundoff of the Neumann product's formats (round to nearest).
UNIT_ROUNDOFF = {"fp16-neumann": 2.0**-11, "fp32-neumann": 2.0**-24}
FP16_MAX = 65504.0


def _fp16_neumann(l):
    return neumann_inverse(quantize(l, FP16), "h200-mma", FP16).inverse


def _fp32_neumann(l):
    return neumann_inverse(quantize(l, FP32), "fp32", FP32).inverse


def _flashkda_v2(l):
    return block_substitution(quantize(l, FP32), "fp32", "bf16", block=8)


def _fla(l):
    return block_substitution(quantize(l, FP32), "fp32", None, block=16)


#: name -> (inverse of a float64 L, chunk sizes it exists for (None: any))
ALGORITHMS: dict[str, tuple[Callable, tuple[int, ...] | None]] = {
    "fp16-neumann": (_fp16_neumann, None),
    "fp32-neumann": (_fp32_neumann, None),
    "flashkda-v2": (_flashkda_v2, (16,)),
    "fla": (_fla, (16, 32, 64)),
    "fp64-exact": (exact_inverse, None),
}


def algorithms_for(chunk: int, names: Iterable[str]) -> list[str]:
    return [a for a in names if ALGORITHMS[a][1] is None or chunk in ALGORITHMS[a][1]]


@dataclass(frozen=True)
class Config:
    """The grid (values are trusted: the command line parses them)."""

    chunks: tuple[int, ...] = (16, 32, 64)
    algorithms: tuple[str, ...] = tuple(ALGORITHMS)
    spreads: tuple[float, ...] = (0.001, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    betas: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
    decays: tuple[float, ...] = (0.0, -0.01, -0.05, -0.2)
    samples: int = 4
    dim: int = 128
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


#: Seconds on a laptop-class CPU core; the docs' figures.
QUICK = Config(chunks=(16,), spreads=(0.0, 0.03, 0.3, 3.0), betas=(0.3, 0.7, 1.0),
               decays=(0.0, -0.2), samples=2, dim=32)
FULL = Config()


@dataclass(frozen=True)
class Batch:
    chunk: int
    spread: float


def plan(cfg: Config) -> list[Batch]:
    return [Batch(c, s) for c in cfg.chunks for s in cfg.spreads]


def _draws(cfg: Config, chunk: int):
    """Shared key, noise, queries and values of the ``samples`` draws for chunk ``chunk``."""
    gen = torch.Generator().manual_seed(cfg.seed * 1009 + chunk)
    n, d = cfg.samples, cfg.dim
    base = torch.randn(n, 1, d, generator=gen, dtype=torch.float64)
    noise = torch.randn(n, chunk, d, generator=gen, dtype=torch.float64)
    q = torch.nn.functional.normalize(torch.randn(n, chunk, d, generator=gen,
                                                  dtype=torch.float64), dim=-1)
    v = torch.randn(n, chunk, d, generator=gen, dtype=torch.float64)
    return base, noise, q, v


def neumann_growth(l: torch.Tensor) -> torch.Tensor:
    """The largest entry the Neumann product can form from ``l [..., C, C]`` (float64): max over
    n = 1, 2, 4, … < C of max (|L|^n)_ij and of the partial inverses' bound
    Π_j (I + |L|^(2^j)) − the triangle inequality's bound on every intermediate."""
    a = l.abs().double()
    c = a.shape[-1]
    power, growth = a, a.amax(dim=(-2, -1))
    partial = torch.eye(c, dtype=torch.float64) + a
    n = 1
    while n * 2 < c:
        power = matmul64(power, power)
        n *= 2
        partial = partial + matmul64(partial, power)
        growth = torch.maximum(growth, torch.maximum(power.amax(dim=(-2, -1)),
                                                     partial.amax(dim=(-2, -1))))
    return growth


def _norm_bound(l: torch.Tensor) -> torch.Tensor:
    """‖L‖∞^n for the highest power n = 2^j < C (the submultiplicative bound on ‖L^n‖∞)."""
    c = l.shape[-1]
    n = 1
    while n * 2 < c:
        n *= 2
    return l.abs().sum(-1).amax(-1).double() ** n


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """max|x − ref| / max|ref| per matrix; inf where x is not finite."""
    x = x.double()
    err = (x - ref).abs().amax(dim=(-2, -1)) / ref.abs().amax(dim=(-2, -1))
    return torch.where(torch.isfinite(x).all(-1).all(-1), err, torch.full_like(err, math.inf))


def _rel_rmse(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    num = (x - ref).square().mean(dim=(-2, -1)).sqrt()
    err = num / ref.square().mean(dim=(-2, -1)).sqrt()
    return torch.where(torch.isfinite(x).all(-1).all(-1), err, torch.full_like(err, math.inf))


def run_batch(cfg: Config, batch: Batch) -> list[dict]:
    c = batch.chunk
    base, noise, q, v = _draws(cfg, c)
    k = torch.nn.functional.normalize(base + batch.spread * noise, dim=-1)  # [S, C, D]
    gram = matmul64(k, k.transpose(-1, -2))
    qk = matmul64(q, k.transpose(-1, -2))
    idx = torch.arange(c, dtype=torch.float64)
    lag = idx[:, None] - idx[None, :]  # i − j
    nb, nd, ns = len(cfg.betas), len(cfg.decays), cfg.samples
    beta = torch.tensor(cfg.betas, dtype=torch.float64).view(nb, 1, 1, 1, 1)
    decay = torch.tensor(cfg.decays, dtype=torch.float64).view(1, nd, 1, 1, 1)
    fac = torch.exp(decay * lag.clamp(min=0))  # [1, nd, 1, C, C]
    l = torch.tril(beta * gram * fac, -1)  # [nb, nd, S, C, C]
    mqk = torch.tril(qk * fac).expand(nb, nd, ns, c, c)
    bv = beta * v  # [nb, 1, S, C, D]
    x = forward_substitution(l, "fp64")  # the reference; fp64-exact (LAPACK) shows the floor
    o_ref = matmul64(mqk, matmul64(x, bv.expand(nb, nd, ns, c, v.shape[-1])))
    growth = neumann_growth(l)
    norm = _norm_bound(l)
    lmax = l.abs().amax(dim=(-2, -1))
    out = []
    for name in algorithms_for(c, cfg.algorithms):
        inv = ALGORITHMS[name][0](l).double()
        inv_err = _rel_err(inv, x)
        o = matmul64(mqk, matmul64(inv, bv.expand_as(o_ref)))
        out_err = _rel_rmse(o, o_ref)
        for bi, b in enumerate(cfg.betas):
            for di, g in enumerate(cfg.decays):
                e, oe = inv_err[bi, di], out_err[bi, di]
                u = UNIT_ROUNDOFF.get(name)
                gr = float(growth[bi, di].max())
                out.append({
                    "chunk": c, "algorithm": name, "spread": batch.spread, "beta": b,
                    "decay": g, "samples": ns, "dim": cfg.dim, "seed": cfg.seed,
                    "inverse_error": float(e.max()), "inverse_error_median":
                    float(e.median()), "output_error": float(oe.max()),
                    "nonfinite": float((~torch.isfinite(e)).double().mean()),
                    "l_max": float(lmax[bi, di].max()), "growth": gr,
                    "norm_bound": float(norm[bi, di].max()),
                    "predicted_error": (u * gr if u is not None else math.nan),
                    "predicted_overflow": bool(name == "fp16-neumann" and gr > FP16_MAX),
                })
    return out


def run_study(cfg: Config, sink: Callable[[list[dict]], None] | None = None) -> list[dict]:
    records = []
    for batch in plan(cfg):
        recs = run_batch(cfg, batch)
        if sink is not None:
            sink(recs)
        records += recs
    return records


def _fails(r: dict) -> bool:
    e = r["inverse_error"]
    return not math.isfinite(e) or e >= THRESHOLD


def summarize(records: list[dict]) -> list[dict]:
    """Per (chunk, algorithm): grid points, how many fail (error ≥ THRESHOLD or non-finite),
    how many are non-finite, the worst finite inverse and output errors, and — for the Neumann
    products — how many the theory predicts to fail (u·growth ≥ THRESHOLD, or fp16 overflow)
    and how many failures it missed (a sound bound misses none)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["chunk"], r["algorithm"]), []).append(r)
    rows = []
    for (c, name), rs in groups.items():
        fails = [_fails(r) for r in rs]
        finite = [r for r in rs if math.isfinite(r["inverse_error"])]
        row = {"chunk": c, "algorithm": name, "points": len(rs), "failing": sum(fails),
               "nonfinite": sum(r["nonfinite"] > 0 for r in rs),
               "worst_inverse_error": max((r["inverse_error"] for r in finite), default=math.nan),
               "worst_output_error": max((r["output_error"] for r in rs
                                          if math.isfinite(r["output_error"])),
                                         default=math.nan)}
        if name in UNIT_ROUNDOFF:
            pred = [r["predicted_error"] >= THRESHOLD or r["predicted_overflow"] for r in rs]
            row["predicted_failing"] = sum(pred)
            row["missed"] = sum(f and not p for p, f in zip(pred, fails))
        else:
            row["predicted_failing"] = row["missed"] = None
        rows.append(row)
    return rows
