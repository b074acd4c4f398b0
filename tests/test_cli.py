"""The command line: files written, tables printed, bad input → exit code 2 and one message."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from kdalab.cli import app

runner = CliRunner()


def test_reproduce_small(tmp_path):
    res = runner.invoke(app, ["reproduce", "--chunks", "4,8", "--seeds", "0", "--dim", "16",
                              "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert "Exponent boundary" in res.output and "High-power stress" in res.output
    for name in ("records.json", "manifest.json", "summary.csv", "exponent_boundary.md",
                 "exponent_boundary.csv", "high_power_stress.md", "ordinary_random.csv",
                 "error_vs_chunk.png", "error_vs_chunk.svg"):
        assert (tmp_path / name).exists(), name
    recs = json.loads((tmp_path / "records.json").read_text())
    assert len(recs) == 3 * 2 and {r["accumulation"] for r in recs} == {"fp16-seq"}


def test_sweep_from_toml_with_override(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('families = "floor"\nchunks = [4]\nseeds = "0-1"\ndims = [8]\n')
    res = runner.invoke(app, ["sweep", str(cfg), "--accumulation", "fp16-seq,fp16-once",
                              "--out", str(tmp_path / "o"), "--quiet", "--json"])
    assert res.exit_code == 0, res.output
    recs = json.loads((tmp_path / "o" / "records.json").read_text())
    assert len(recs) == 4


@pytest.mark.parametrize("args,needle", [
    (["reproduce", "--chunks", "0"], "chunk"),
    (["reproduce", "--seeds", "a-b"], "--seeds"),
    (["reproduce", "--accumulation", "fp12"], "accumulation"),
    (["sweep", "--families", "floor,bogus"], "--families"),
    (["sweep", "--lower-bound", "0"], "--lower-bound"),
    (["sweep", "--lower-bound", "x"], "--lower-bound"),
    (["sweep", "--backend", "dask"], "--backend"),
    (["sweep", "--address", "auto"], "--address"),
    (["sweep", "--redraw", "."], "--redraw"),
    (["sweep", "no_such_file.toml"], "no such file"),
])
def test_bad_input_exits_2_without_traceback(args, needle, tmp_path):
    res = runner.invoke(app, args + ["--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_device_cuda_without_cuda_exits_2(tmp_path):
    res = runner.invoke(app, ["reproduce", "--device", "cuda", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "CUDA" in res.output


def test_help_everywhere():
    for args in (["--help"], ["reproduce", "--help"], ["sweep", "--help"], ["run", "--help"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0 and "Usage" in res.output
