"""The seed document's experiment, reproduced exactly: every metric of every golden CPU run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kdalab.experiments.inverse import METRIC_KEYS, RunSpec
from kdalab.experiments.sweep import run_sweep, seed_reproduction_runs

GOLDEN = json.loads((Path(__file__).parent / "data" / "seed_runs.json").read_text())
CASES = {"floor_e-5": "floor", "weak_decay_correlated": "weak_decay_correlated",
         "model_like": "model_like"}


def _key(rec: dict) -> tuple:
    return (CASES.get(rec.get("case"), rec.get("family")), rec["chunk"], rec["seed"])


def _same(a, b) -> bool:
    b = float(b) if isinstance(b, str) else b
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b and type(a) is type(b) if not isinstance(b, float) else a == b


@pytest.fixture(scope="module")
def fp16_seq_records():
    return {_key(r): r for r in run_sweep(seed_reproduction_runs(), ["fp16-seq"])}


def test_golden_covers_the_seed_tables(fp16_seq_records):
    assert len(GOLDEN["cpu"]) == 48
    assert {_key(r) for r in GOLDEN["cpu"]} == set(fp16_seq_records)


def test_every_cpu_metric_is_bit_identical(fp16_seq_records):
    mismatches = []
    for gold in GOLDEN["cpu"]:
        mine = fp16_seq_records[_key(gold)]
        for k in METRIC_KEYS:
            if not _same(mine[k], gold[k]):
                mismatches.append((_key(gold), k, mine[k], gold[k]))
    assert mismatches == []


def test_records_do_not_depend_on_batching(fp16_seq_records):
    # The same runs one at a time give the same bits as the whole batch.
    for fam, c, s in [("floor", 18, 1), ("weak_decay_correlated", 24, 2), ("model_like", 48, 0)]:
        alone = run_sweep([RunSpec.make(fam, c, s, 128, -5.0)], ["fp16-seq"])[0]
        batched = fp16_seq_records[(fam, c, s)]
        assert all(_same(alone[k], batched[k]) for k in METRIC_KEYS)
