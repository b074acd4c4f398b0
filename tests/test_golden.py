"""The seed document's experiment, reproduced exactly: every metric of the 48 runs of its tables.

Two comparisons, both over all 48 runs:

1. **kdalab against the seed's own code, run here in the same process** (benchmarks/
   seed_baseline.py: the seed's ``make_inputs``, ``kernel_l``, CPU ``fp16_accum_mm`` and
   ``run_one``): every input tensor, the kernel's fp16 L, its fp16 Neumann inverse and all 13
   metrics, bit for bit. This holds on any machine.

2. **kdalab against the stored runs** (tests/data/seed_runs.json: the seed's code run on another
   machine). Those depend on one platform-dependent operation, torch's float64 ``sigmoid``
   (the families' gate and β): its vectorized CPU kernel gives another last bit for some inputs on
   some CPUs (found on an AVX2 AMD EPYC: one element of ``model_like`` C = 8 seed 1). So for each
   run the test asks first whether the seed's code, run here, reproduces the stored record. Where
   it does, the platform's sigmoid agrees with the one that made the record, and kdalab must equal
   the record bit for bit. Where it does not, the difference must be the sigmoid's alone: moving
   one sigmoid output by one ulp must make the seed's code reproduce the stored record exactly;
   the test says so in a warning (``SigmoidDiffers``). Runs that use no sigmoid
   (weak_decay_correlated) must match on every machine, so the comparison is never skipped.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

from kdalab.inputs.draw import make_inputs
from kdalab.inputs.runs import Run
from kdalab.kda.intra import kernel_l
from kdalab.kda.inverse import neumann_inverse
from kdalab.kda.recipe import SEED
from kdalab.studies.inverse import METRIC_KEYS
from kdalab.studies.sweep import run_sweep, seed_reproduction_runs

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from seed_baseline import (  # noqa: E402  (the seed document's code)
    SEED_CASES,
    seed_kernel_l,
    seed_make_inputs,
    seed_neumann,
    seed_run_one,
)

GOLDEN = json.loads((Path(__file__).parent / "data" / "seed_runs.json").read_text())["cpu"]
FAMILY = {case: family for family, case in SEED_CASES.items()}
#: more differing runs than this is not a last-bit sigmoid difference: fail instead of searching
MAX_SIGMOID_RUNS = 12


class SigmoidDiffers(UserWarning):
    """This machine's float64 torch.sigmoid differs from the one that made the stored runs."""


def _key(run) -> tuple:
    return (run.family, run.chunk, run.seed)


def _gold_key(rec: dict) -> tuple:
    return (FAMILY[rec["case"]], rec["chunk"], rec["seed"])


def _same(a, b) -> bool:
    """Equal bits: floats equal (NaN = NaN), ints equal and of the same type."""
    b = float(b) if isinstance(b, str) else b  # the stored file writes inf/nan as strings
    if isinstance(b, float):
        return isinstance(a, float) and (a == b or (math.isnan(a) and math.isnan(b)))
    return type(a) is type(b) and a == b


def _differences(mine: dict, gold: dict) -> list[str]:
    return [f"{k}: {mine[k]!r} vs {gold[k]!r}" for k in METRIC_KEYS if not _same(mine[k], gold[k])]


@pytest.fixture(scope="module")
def kdalab_records() -> dict:
    return {(r["family"], r["chunk"], r["seed"]): r
            for r in run_sweep(seed_reproduction_runs(), ["fp16-seq"])}


@pytest.fixture(scope="module")
def seed_code_records() -> dict:
    """The seed's run_one, run here, for each of the 48 runs."""
    return {_key(r): seed_run_one(*seed_make_inputs(r.family, r.chunk, r.dim, r.seed))[1]
            for r in seed_reproduction_runs()}


def test_golden_covers_the_seed_tables(kdalab_records, seed_code_records):
    assert len(GOLDEN) == 48
    assert {_gold_key(g) for g in GOLDEN} == set(kdalab_records) == set(seed_code_records)


def test_every_metric_equals_the_seed_code_run_here(kdalab_records, seed_code_records):
    mismatches = {key: _differences(kdalab_records[key], rec)
                  for key, rec in seed_code_records.items()}
    assert {k: v for k, v in mismatches.items() if v} == {}


@pytest.mark.parametrize("run", seed_reproduction_runs(), ids=lambda r: f"{r.family}-{r.chunk}-"
                         f"{r.seed}")
def test_inputs_l_and_inverse_equal_the_seed_code_bit_for_bit(run):
    keys, log_decay, beta = seed_make_inputs(run.family, run.chunk, run.dim, run.seed)
    mine = make_inputs(run.family, run.chunk, run.dim, run.seed, -5.0)
    for a, b in ((mine.keys, keys), (mine.log_decay, log_decay), (mine.beta, beta)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    l_seed = seed_kernel_l(keys, log_decay, beta)[0]
    l_mine = kernel_l(mine.keys, mine.log_decay, mine.beta, SEED).l
    assert torch.equal(l_mine.view(torch.int16), l_seed.view(torch.int16))
    inv_seed = seed_neumann(l_seed)[0]
    inv_mine = neumann_inverse(l_mine, SEED.inverse_accumulation, SEED.inverse_format).inverse
    same = (inv_mine.view(torch.int16) == inv_seed.view(torch.int16)) | (
        inv_mine.isnan() & inv_seed.isnan())
    assert bool(same.all())


def _one_ulp_explanation(run: Run, gold: dict) -> str | None:
    """The one sigmoid output (call, element, direction) whose one-ulp move makes the seed's code
    give ``gold`` exactly; None if there is none. Elements where torch's vectorized and scalar
    loops disagree on this machine are tried first (that is where CPUs differ)."""
    gen = torch.Generator().manual_seed(run.seed)
    torch.randn(run.chunk, run.dim, dtype=torch.float64, generator=gen)  # the keys
    calls = 2 if run.family == "model_like" else 1
    raw = [torch.randn(run.chunk, dtype=torch.float64, generator=gen) for _ in range(calls)]
    candidates = []
    for call, x in enumerate(raw):
        scalar = torch.stack([torch.sigmoid(x[i:i + 1])[0] for i in range(len(x))])
        suspect = (torch.sigmoid(x) != scalar).tolist()
        candidates += [(not suspect[i], call, i) for i in range(len(x))]
    for _, call, i in sorted(candidates):
        for direction in (1.0, -1.0):
            seen = []

            def sigmoid(x, call=call, i=i, direction=direction):
                y = torch.sigmoid(x)
                if len(seen) == call:
                    y = y.clone()
                    y[i] = torch.nextafter(y[i], torch.tensor(direction * math.inf,
                                                              dtype=y.dtype))
                seen.append(call)
                return y

            inputs = seed_make_inputs(run.family, run.chunk, run.dim, run.seed, sigmoid=sigmoid)
            if not _differences(seed_run_one(*inputs)[1], gold):
                what = ("gate", "beta")[call] if run.family == "model_like" else "beta"
                return f"{what} sigmoid element {i}, {'+' if direction > 0 else '-'}1 ulp"
    return None


def test_every_metric_equals_the_stored_golden_runs(kdalab_records, seed_code_records):
    agree, differ = [], []
    for gold in GOLDEN:
        key = _gold_key(gold)
        (agree if not _differences(seed_code_records[key], gold) else differ).append(gold)
    # where this machine reproduces the stored record, kdalab gives it bit for bit
    mismatches = {_gold_key(g): _differences(kdalab_records[_gold_key(g)], g) for g in agree}
    assert {k: v for k, v in mismatches.items() if v} == {}
    assert all(_gold_key(g)[0] != "weak_decay_correlated" for g in differ)  # no sigmoid there
    assert len(differ) <= MAX_SIGMOID_RUNS, [_gold_key(g) for g in differ]
    # elsewhere the platform's sigmoid is the only difference: one ulp of one output
    for gold in differ:
        family, chunk, seed = _gold_key(gold)
        why = _one_ulp_explanation(Run(family, -5.0, chunk, seed, 128), gold)
        assert why is not None, (f"{family} C={chunk} seed {seed} differs from the stored run "
                                 "and no one-ulp change of a sigmoid output explains it")
        warnings.warn(SigmoidDiffers(
            f"{family} C={chunk} seed {seed}: this machine's float64 torch.sigmoid differs from "
            f"the stored run's platform ({why}); compared with the seed's code run here instead"))
    assert len(agree) + len(differ) == 48 and len(agree) >= 48 - MAX_SIGMOID_RUNS


def test_records_do_not_depend_on_batching(kdalab_records):
    # The same runs one at a time give the same bits as the whole batch.
    for fam, c, s in [("floor", 18, 1), ("weak_decay_correlated", 24, 2), ("model_like", 48, 0)]:
        lb = None if fam == "weak_decay_correlated" else -5.0
        alone = run_sweep([Run(fam, lb, c, s, 128)], ["fp16-seq"])[0]
        batched = kdalab_records[(fam, c, s)]
        assert _differences(alone, batched) == []
