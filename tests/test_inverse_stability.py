"""The inverse-stability study: the growth bound is a bound, the map finds what the theory
says (the fp16 Neumann product fails on near-collinear keys, FlashKDA v2's and fla's inverses do
not), records do not depend on the batching; its views and command."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from kdalab.cli import main
from kdalab.kda.inverse import neumann_inverse
from kdalab.studies.inverse_stability import (
    THRESHOLD,
    Batch,
    Config,
    neumann_growth,
    plan,
    run_batch,
    run_study,
    summarize,
)

TINY = Config(chunks=(16,), spreads=(0.01, 3.0), betas=(0.5, 0.9), decays=(0.0,), samples=2,
              dim=16)


def test_growth_bounds_every_intermediate_of_the_product():
    g = torch.Generator().manual_seed(0)
    for c in (8, 16, 32):
        l = torch.tril(torch.randn(20, c, c, generator=g, dtype=torch.float64), -1) * 0.4
        res = neumann_inverse(l, "fp64")
        growth = neumann_growth(l)
        # the powers formed are bounded entrywise by |L|^n; 1e-12 covers fp64's own rounding
        assert (res.power_max <= growth * (1 + 1e-12)).all()
        assert (res.inverse.abs().amax(dim=(-2, -1)) <= growth * (1 + 1e-12) + 1).all()


def test_growth_is_the_binomial_for_collinear_keys():
    """L = λ·(ones below the diagonal): (L^n)_ij = λ^n·C(i−j−1, n−1), largest at i − j = C − 1;
    the bound is attained (|L| = L)."""
    for c, lam in ((16, 1.0), (16, 0.9), (32, 1.0)):
        l = torch.tril(torch.full((c, c), lam, dtype=torch.float64), -1)
        n = 2 ** (math.ceil(math.log2(c)) - 1)  # the highest power formed
        power = lam**n * math.comb(c - 2, n - 1)
        assert neumann_growth(l).item() >= power
        assert neumann_inverse(l, "fp64").power_max.item() == pytest.approx(power, rel=1e-12)
    assert math.comb(14, 7) == 3432 and math.comb(30, 15) > 65504  # C = 32 overflows fp16


@pytest.fixture(scope="module")
def tiny_records():
    return run_study(TINY)


def test_the_map_finds_the_neumann_failure_and_not_the_substitutions(tiny_records):
    at = {(r["algorithm"], r["spread"], r["beta"]): r for r in tiny_records}
    # near-collinear, β = 0.9, no decay: L ≈ 0.9 everywhere below the diagonal, L^8 up to
    # 0.9^8·C(14, 7) ≈ 1.5e3, summed to an inverse of entries ≤ 1 in fp16 (measured 0.5)
    collinear = ("fp16-neumann", 0.01, 0.9)
    assert at[collinear]["inverse_error"] >= THRESHOLD
    assert at[collinear]["predicted_error"] >= THRESHOLD  # and the theory says so
    assert at[("fp16-neumann", 3.0, 0.5)]["inverse_error"] < THRESHOLD  # unrelated keys
    for alg in ("flashkda-v2", "fla", "fp32-neumann", "fp64-exact"):
        assert at[(alg, 0.01, 0.9)]["inverse_error"] < THRESHOLD, alg
    assert at[("fla", 0.01, 0.9)]["inverse_error"] < 1e-5  # fp32 throughout
    assert at[("fp64-exact", 0.01, 0.9)]["inverse_error"] < 1e-12
    rows = {r["algorithm"]: r for r in summarize(tiny_records)}
    assert rows["fp16-neumann"]["failing"] >= 1 and rows["fp16-neumann"]["missed"] == 0
    assert rows["flashkda-v2"]["failing"] == 0 and rows["flashkda-v2"]["missed"] is None


def test_fp16_neumann_overflows_at_c32_as_predicted():
    cfg = replace(TINY, chunks=(32,), spreads=(0.001,), betas=(1.0,),
                  algorithms=("fp16-neumann", "fla"))
    recs = {r["algorithm"]: r for r in run_study(cfg)}
    assert recs["fp16-neumann"]["predicted_overflow"]
    assert recs["fp16-neumann"]["nonfinite"] == 1.0
    assert math.isinf(recs["fp16-neumann"]["inverse_error"])
    assert recs["fla"]["inverse_error"] < 1e-5
    # FlashKDA v2's inverse exists for C = 16 only
    assert "flashkda-v2" not in {r["algorithm"] for r in run_study(replace(cfg, algorithms=(
        "flashkda-v2", "fla")))}


@pytest.mark.exact
def test_records_do_not_depend_on_the_batching(tiny_records):
    alone = run_batch(TINY, Batch(16, 3.0))
    assert [b.spread for b in plan(TINY)] == [0.01, 3.0]
    assert alone == [r for r in tiny_records if r["spread"] == 3.0]
    again = run_study(replace(TINY, spreads=(3.0,)))
    assert again == alone


def test_views_and_command(tmp_path, capsys, tiny_records):
    out = tmp_path / "map"
    args = ["run", "inverse-stability", "--chunks", "16", "--spreads", "0.01,3",
            "--betas", "0.5,0.9", "--decays", "0", "--samples", "2", "--dim", "16", "--quiet",
            "--out", str(out)]
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 0, capsys.readouterr().err
    names = {p.name for p in out.iterdir()}
    assert {"inverse-stability-C16-inverse.png", "inverse-stability-C16-output.png",
            "inverse-stability-summary.md", "manifest.json", "parts"} <= names
    text = (out / "inverse-stability-summary.md").read_text()
    assert "fp16-neumann" in text and "flashkda-v2" in text
    # the same configuration as TINY: the same records, in the same order, as the study run
    # in this process (JSON: NaN equals NaN, every float written in full)
    import json

    from kdalab.records import StoreReader

    store = StoreReader.read_only(out, kind="inverse-stability")
    assert store.complete and json.dumps(store.records()) == json.dumps(tiny_records)
    with pytest.raises(SystemExit) as done:  # its own study: --resume (nothing left to run)
        main(args)
    assert done.value.code == 2 and "--resume" in capsys.readouterr().err
    for again in (args + ["--resume"], args[:2] + ["--out", str(out), "--redraw"]):
        (out / "inverse-stability-summary.md").unlink()
        with pytest.raises(SystemExit) as done:
            main(again)
        assert done.value.code == 0 and (out / "inverse-stability-summary.md").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for bad, word in ((["--out", str(foreign)], "--force"), (["--betas", "1.5"], "--betas"),

                      (["--algorithms", "lu"], "--algorithms"), (["--chunks", "1"], "--chunks")):
        with pytest.raises(SystemExit) as done:
            main(args[:-2] + ["--out", str(tmp_path / "x")] + bad if bad[0] != "--out"
                 else args[:-2] + bad)
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.startswith("error: ") and word in err, err
    for bad, word in ((["--out", str(foreign), "--redraw"], "holds no kdalab store"),
                      (["--out", str(out), "--redraw", "--chunks", "16"], "takes no --chunks")):
        with pytest.raises(SystemExit) as done:
            main(args[:2] + bad)
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.startswith("error: ") and word in err, err


def test_heatmap_cells_keep_large_finite_errors_apart_from_non_finite():
    import pandas as pd

    from kdalab.views.inverse_stability import heatmap_grid

    frame = pd.DataFrame({"spread": [0.1, 1.0, 0.1, 1.0], "beta": [0.5, 0.5, 1.0, 1.0],
                          "inverse_error": [1e-3, 1e11, math.inf, 0.0]})
    spreads, betas, grid = heatmap_grid(frame, "inverse_error")
    assert spreads == [0.1, 1.0] and betas == [0.5, 1.0]
    assert grid[0, 0] == pytest.approx(-3) and grid[0, 1] == 1.0  # 1e11: the colour range's top
    assert grid[1, 0] == 2.0 and grid[1, 1] == -16.0  # inf: above it; 0: its bottom


def test_an_interrupted_map_resumes_to_the_same_records(tmp_path, capsys, tiny_records):
    """Half the cells stored (as an interrupt leaves them), then --resume: the records of an
    uninterrupted run, and the cells stored are not computed again."""
    import json
    from itertools import islice

    from kdalab.cli.inverse_stability import _study
    from kdalab.records import StoreReader
    from kdalab.runner import open_store

    study = _study(TINY)
    assert len(study) == 2 * 5 and study.records_per_run == 2  # C = 16: every algorithm
    with open_store(study, tmp_path) as store:
        for batch, table in study.compute(islice(study.batches(None, store.done), 1)):
            store.append(table, batch.group)
    assert StoreReader.read_only(tmp_path).manifest.state == "interrupted"
    with pytest.raises(SystemExit) as done:
        main(["run", "inverse-stability", "--chunks", "16", "--spreads", "0.01,3", "--betas",
              "0.5,0.9", "--decays", "0", "--samples", "2", "--dim", "16", "--out",
              str(tmp_path), "--resume"])
    assert done.value.code == 0, capsys.readouterr().err
    assert "resuming: 5 of 10 cells already stored" in capsys.readouterr().out
    store = StoreReader.read_only(tmp_path)
    assert store.complete and json.dumps(store.records()) == json.dumps(tiny_records)
