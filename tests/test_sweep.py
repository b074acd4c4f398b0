"""Declarative sweeps, record files, determinism and interruption."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from kdalab.experiments.aggregate import summarize
from kdalab.experiments.store import RecordWriter, read_records
from kdalab.experiments.sweep import (
    SweepConfig,
    read_sweep_file,
    run_sweep,
    seed_reproduction_runs,
)
from kdalab.views.tables import seed_tables, to_markdown


def test_config_validation_names_the_argument():
    with pytest.raises(ValueError, match="chunk"):
        SweepConfig(chunks=(0,))
    with pytest.raises(ValueError, match="lower_bound"):
        SweepConfig(lower_bounds=(0.0,))
    with pytest.raises(ValueError, match="^families must be one of floor, "):
        SweepConfig(families=("nope",))
    with pytest.raises(ValueError, match="accumulation"):
        SweepConfig(accumulations=("fp9",))
    with pytest.raises(ValueError, match="chunkz: unknown key"):
        SweepConfig.parse({"chunkz": [4]})
    # errors name the argument as the user wrote it
    with pytest.raises(ValueError, match="^--seeds must be integers >= 0, got -1$"):
        SweepConfig.parse({"seeds": "-1"}, labels={"seeds": "--seeds"})
    with pytest.raises(ValueError, match="^lower-bound must be a finite number < 0"):
        SweepConfig.parse({"lower-bound": "0.5"})


def test_toml_config(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('families = ["floor", "model_like"]\nchunks = [4, 12]\nseeds = "3-5"\n'
                 'dims = [64]\naccumulations = ["fp16-seq", "fp16-once"]\n'
                 'lower_bounds = [-5, -2]\n')
    cfg = SweepConfig.parse(read_sweep_file(p))
    assert cfg.families == ("floor", "model_like") and cfg.seeds == (3, 4, 5)
    assert [m.name for m in cfg.accumulations] == ["fp16-seq", "fp16-once"]
    # the keys as the options: dashes or underscores, singular as the option names
    dashed = tmp_path / "d.toml"
    dashed.write_text('lower-bound = "-5,-2"\naccumulation = "fp16-once"\nchunks = "4-6"\n')
    cfg2 = SweepConfig.parse(read_sweep_file(dashed))
    assert cfg2.lower_bounds == (-5.0, -2.0) and cfg2.chunks == (4, 5, 6)
    assert cfg2.accumulations[0].name == "fp16-once"
    assert len(cfg.runs()) == 2 * 2 * 3 * 2  # families × lower bounds × seeds × chunks
    bad = tmp_path / "bad.toml"
    bad.write_text("chunks = [4,\n")
    with pytest.raises(ValueError, match="malformed TOML"):
        read_sweep_file(bad)


def test_families_without_a_lower_bound_run_once():
    cfg = SweepConfig(families=("weak_decay_correlated",), chunks=(4,), seeds=(0,),
                      lower_bounds=(-5.0, -2.0))
    runs = cfg.runs()
    assert len(runs) == 1 and runs[0].lower_bound is None


def _by_run(records: list[dict]) -> str:
    key = lambda r: (r["family"], str(r["lower_bound"]), r["chunk"], r["seed"], r["dim"],  # noqa
                     r["accumulation"])
    return json.dumps(sorted(records, key=key), sort_keys=True)


@pytest.mark.parametrize("threads,max_batch,draw", [
    (1, 3, dict(workers=1)), (2, 7, dict(workers=3)), (2, None, dict(processes=2)),
    (1, 1, dict(processes=2))], ids=["1thread-batch3", "2threads-batch7-3drawthreads",
                                     "2threads-2drawprocs", "1thread-batch1-2drawprocs"])
def test_records_do_not_depend_on_batching_threads_or_draw_processes(threads, max_batch, draw):
    """The same configuration gives bit-identical records whatever the batch size, the number of
    torch threads and how the inputs are drawn (threads or processes), for every kind of model."""
    cfg = SweepConfig(families=("floor", "weak_decay_correlated", "model_like"),
                      chunks=(4, 12, 17), seeds="0-3", dims=(32,),
                      accumulations=("fp16-seq", "fp16-once", "fp32", "h200"),
                      lower_bounds=(-5.0, -1.0))
    reference = run_sweep(cfg.runs(), cfg.accumulations)
    assert len(reference) == (2 * 2 + 1) * 3 * 4 * 4
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        again = run_sweep(cfg.runs(), cfg.accumulations, max_batch=max_batch, **draw)
    finally:
        torch.set_num_threads(before)
    assert _by_run(again) == _by_run(reference)
    assert json.dumps(run_sweep(cfg.runs(), cfg.accumulations)) == json.dumps(reference)


def test_store_roundtrip_nonfinite(tmp_path):
    recs = [{"a": 1, "x": math.inf, "y": -math.inf, "z": math.nan, "lb": None}]
    with RecordWriter(tmp_path) as w:
        w.write(recs)
    text = (tmp_path / "records.json").read_text()
    assert '"inf"' in text and '"-inf"' in text and '"nan"' in text
    back = read_records(tmp_path)[0]
    assert back["x"] == math.inf and back["y"] == -math.inf and math.isnan(back["z"])
    df = pd.read_parquet(tmp_path / "records.parquet")
    assert df["x"].iloc[0] == math.inf


@pytest.mark.parametrize("pipelined", [False, True], ids=["plain", "pipelined"])
def test_interrupted_sweep_keeps_written_records(tmp_path, monkeypatch, pipelined):
    # (pipelined: the CUDA pipeline, forced on the CPU)
    import kdalab.experiments.sweep as sweep

    monkeypatch.setattr(sweep, "_pipelined", lambda device: pipelined)
    runs = SweepConfig(families=("floor",), chunks=(4, 8, 12), seeds=(0, 1)).runs()
    calls = []

    def sink(records):
        writer.write(records)
        calls.append(len(records))
        if len(calls) == 2:
            raise KeyboardInterrupt

    writer = RecordWriter(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with writer:
            run_sweep(runs, ["fp16-seq"], sink=sink)
    kept = read_records(tmp_path)
    assert len(kept) == 4 and not (tmp_path / "records.json").exists()
    assert {r["chunk"] for r in kept} == {4, 8}


def test_pipelined_sweep_keeps_order_and_records(monkeypatch):
    # The CUDA pipeline (next batch drawn and queued before this one is collected), run on CPU.
    import kdalab.experiments.sweep as sweep

    runs = SweepConfig(families=("floor", "weak_decay_correlated", "model_like"),
                       chunks=(3, 8), seeds=(0, 1, 2, 3, 4), dims=(16,)).runs()
    plain = run_sweep(runs, ["fp16-seq", "fp32"], max_batch=4)
    monkeypatch.setattr(sweep, "_pipelined", lambda device: True)
    sunk, seen = [], []
    piped = run_sweep(runs, ["fp16-seq", "fp32"], max_batch=4, workers=2,
                      sink=lambda recs: sunk.extend(recs),
                      progress=lambda done, total: seen.append((done, total)))
    assert json.dumps(piped) == json.dumps(plain) == json.dumps(sunk)
    assert [d for d, _ in seen] == sorted({d for d, _ in seen}) and seen[-1] == (30, 30)
    assert len(seen) == 8  # 15 runs of each chunk in batches of 4


def test_seed_tables_from_records():
    recs = run_sweep(seed_reproduction_runs(seeds=(0,), chunks=(8, 16)), ["fp16-seq"])
    tables = seed_tables(summarize(recs))
    assert [t.name for t in tables] == ["exponent_boundary", "high_power_stress",
                                        "ordinary_random"]
    md = to_markdown(tables[1])
    assert "| 16 | L^8 |" in md
    s = summarize(recs)
    assert set(s["chunk"]) == {8, 16} and (s["runs"] == 1).all()
