"""Declarative sweeps, record files, determinism and interruption."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from kdalab.studies.aggregate import GROUP_KEYS, summarize
from kdalab.studies.sweep import (
    SweepConfig,
    SweepPlan,
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


@pytest.mark.exact
@pytest.mark.parametrize("threads,max_batch,streams", [
    (1, 3, "cleared"), (2, 7, "cleared"), (2, None, "kept"), (1, 1, "evicting")],
    ids=["1thread-batch3", "2threads-batch7", "2threads-streams-kept", "1thread-batch1-evicting"])
def test_records_do_not_depend_on_batching_threads_or_key_streams(threads, max_batch, streams,
                                                                  monkeypatch):
    """The same configuration gives bit-identical records whatever the batch size, the number of
    torch threads and what the key streams hold (nothing, the reference's streams, or nothing
    kept from one batch to the next), for every kind of model."""
    from kdalab.inputs import keystream

    cfg = SweepConfig(families=("floor", "weak_decay_correlated", "model_like"),
                      chunks=(4, 12, 17), seeds="0-3", dims=(32,),
                      accumulations=("fp16-seq", "fp16-once", "fp32", "h200"),
                      lower_bounds=(-5.0, -1.0))
    keystream.STREAMS.clear()
    reference = run_sweep(cfg.runs(), cfg.accumulations)
    assert len(reference) == (2 * 2 + 1) * 3 * 4 * 4
    if streams != "kept":
        keystream.STREAMS.clear()
    if streams == "evicting":
        monkeypatch.setattr(keystream.STREAMS, "budget", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        again = run_sweep(cfg.runs(), cfg.accumulations, max_batch=max_batch)
    finally:
        torch.set_num_threads(before)
    assert _by_run(again) == _by_run(reference)
    assert json.dumps(run_sweep(cfg.runs(), cfg.accumulations)) == json.dumps(reference)


def test_store_roundtrip_nonfinite(tmp_path):
    import pyarrow as pa

    from kdalab.cli.stored import export_json
    from kdalab.records import RunStore, StoreReader, records_table

    schema = pa.schema([("run", pa.int64()), ("a", pa.int64()), ("x", pa.float64()),
                        ("y", pa.float64()), ("z", pa.float64()), ("lb", pa.float64())])
    recs = [{"a": 1, "x": math.inf, "y": -math.inf, "z": math.nan, "lb": None}]
    with RunStore.open(tmp_path, kind="t", config={}, runs=1, records_per_run=1,
                       schema=schema) as store:
        store.append(records_table(recs, schema, [0]), "g")
    back = StoreReader.read_only(tmp_path).records()[0]
    assert back["x"] == math.inf and back["y"] == -math.inf and math.isnan(back["z"])
    assert back["lb"] is None
    text = export_json(StoreReader.read_only(tmp_path), tmp_path / "records.json").read_text()
    assert '"inf"' in text and '"-inf"' in text and '"nan"' in text
    df = pd.read_parquet(tmp_path / "parts")
    assert df["x"].iloc[0] == math.inf


@pytest.mark.parametrize("pipelined", [False, True], ids=["plain", "pipelined"])
def test_interrupted_sweep_keeps_written_records(tmp_path, monkeypatch, pipelined):
    # (pipelined: the CUDA pipeline, forced on the CPU)
    import kdalab.studies.plan as plan
    from kdalab.records import StoreReader
    from kdalab.runner import open_store, run_into_store

    monkeypatch.setattr(plan, "_pipelined", lambda device: pipelined)
    study = SweepPlan.of(SweepConfig(families=("floor",), chunks=(4, 8, 12), seeds=(0, 1)))
    calls = []

    def progress(batch):
        calls.append(batch)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with open_store(study, tmp_path) as store:
            run_into_store(study, store, progress=progress)
    kept = StoreReader.read_only(tmp_path)
    assert kept.manifest.state == "interrupted" and int(kept.done.sum()) == 4
    assert {r["chunk"] for r in kept.records()} == {4, 8}


def test_pipelined_sweep_keeps_order_and_records(monkeypatch):
    # The CUDA pipeline (next batch drawn and queued before this one is collected), run on CPU.
    import kdalab.studies.plan as plan

    runs = SweepConfig(families=("floor", "weak_decay_correlated", "model_like"),
                       chunks=(3, 8), seeds=(0, 1, 2, 3, 4), dims=(16,)).runs()
    plain = run_sweep(runs, ["fp16-seq", "fp32"], max_batch=4)
    monkeypatch.setattr(plan, "_pipelined", lambda device: True)
    sunk, seen = [], []
    piped = run_sweep(runs, ["fp16-seq", "fp32"], max_batch=4,
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


def _bits(frame: pd.DataFrame) -> list:
    return [(c, frame[c].dtype, frame[c].to_numpy().tobytes() if frame[c].dtype.kind in "fiub"
             else frame[c].tolist()) for c in frame.columns]


@pytest.mark.exact
def test_summarize_is_the_per_configuration_numpy_statistics_bit_for_bit():
    """summarize (one groupby per statistic) against a loop over configurations with numpy's
    NaN-propagating median and max: a NaN among a configuration's values makes its median
    and maximum NaN; float32 values are summarized in float64; a None lower bound is a group."""
    rng = np.random.default_rng(3)
    n = 400
    medians = ["l_rel_rmse", "inv_total_rel_rmse", "inv_neumann_only_rel_rmse",
               "inv_stable_l_rel_rmse", "inverse_residual", "kernel_power_max",
               "stable_l_power_max"]
    df = pd.DataFrame({
        "family": rng.choice(["floor", "model_like"], n),
        "lower_bound": rng.choice(np.array([None, -5.0, -2.0], dtype=object), n),
        "chunk": rng.choice([2, 3, 8, 17], n), "dim": rng.choice([16, 32], n),
        "accumulation": rng.choice(["fp16-seq", "h200"], n),
        "inv_finite": rng.random(n) < 0.7, "l_finite": rng.random(n) < 0.5,
        **{k: rng.integers(0, 60, n) for k in ["decay_zeros", "inv_decay_nonfinite",
                                               "highest_power", "stable_l_highest_power"]}})
    for i, m in enumerate(medians):
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)
        v[rng.random(n) < 0.03] = np.nan
        v[rng.random(n) < 0.02] = np.inf
        df[m] = v.astype(np.float32) if i % 3 == 0 else v
    rows = []
    for key, g in df.assign(lower_bound=df["lower_bound"].astype(float)).groupby(
            GROUP_KEYS, dropna=False, sort=True):
        row = dict(zip(GROUP_KEYS, key), runs=len(g),
                   inv_finite_fraction=float(g["inv_finite"].mean()),
                   l_finite_fraction=float(g["l_finite"].mean()))
        for k in ["decay_zeros", "inv_decay_nonfinite"]:
            row[f"{k}_max"] = int(g[k].max())
        for k in ["highest_power", "stable_l_highest_power"]:
            row[k] = int(g[k].max())
        for m in medians:
            row[f"{m}_median"] = float(np.median(g[m].to_numpy(dtype=float)))
        for m in ["kernel_power_max", "stable_l_power_max"]:
            row[f"{m}_max"] = float(np.max(g[m].to_numpy(dtype=float)))
        rows.append(row)
    want = pd.DataFrame(rows)
    got = summarize(df)
    assert _bits(got) == _bits(want)
    assert got["l_rel_rmse_median"].isna().any() and got["l_rel_rmse_median"].notna().any()
    assert got["lower_bound"].isna().any()  # the None lower bound's rows
    assert _bits(summarize(df.to_dict("records"))) == _bits(want)
