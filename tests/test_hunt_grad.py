"""kdalab hunt --grad: the search scores the worst gradient error, a planted wrong backward is
found, the worst case replays its gradients in check, a hunt keeps its mode across --resume."""

from __future__ import annotations

import json
import math

import pytest

from kdalab.cli import main
from kdalab.hunt import objective
from tests.cli_run import cli

#: tiny shapes: a trial with its backward and fp64 reference takes about a tenth of a second
SMALL = ("--device", "cpu", "--max-T", "40", "--max-heads", "2", "--dims", "16,32", "--quiet",
         "--gates", "lower_bound")  # the gate with A_log and dt_bias: every gradient
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0")


def _trials(folder) -> list[dict]:
    timings = ("seconds", "elapsed_s")
    return [{k: v for k, v in json.loads(line).items() if k not in timings}
            for line in (folder / "trials.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def hunted(tmp_path_factory):
    """Two --grad hunts of recipe:fp32 with the same seed and trial count."""
    root = tmp_path_factory.mktemp("hunt-grad")
    codes = []
    for name in ("a", "b"):
        with pytest.raises(SystemExit) as done:
            main(["hunt", "recipe:fp32", *SMALL, "--grad", "--seed", "2", "--trials", "4",
                  "--out", str(root / name)])
        codes.append(done.value.code)
    return root, codes


def test_the_search_scores_the_worst_gradient(hunted):
    root, codes = hunted
    assert codes[0] == codes[1] and codes[0] in (0, 1)
    trials = _trials(root / "a")
    assert len(trials) == 4 and trials == _trials(root / "b")  # bit-reproducible
    assert (root / "a" / "worst.json").read_bytes() == (root / "b" / "worst.json").read_bytes()
    for t in trials:
        errors = {n: t[f"{n}_error"] for n in NAMES if t[f"{n}_error"] is not None}
        assert {"dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"} <= errors.keys()
        assert t["grad_error"] == max(errors.values()) == errors[t["worst_grad"]]
        assert t["objective"] == objective(t["grad_error"])
    meta = json.loads((root / "a" / "hunt.json").read_text())
    assert meta["grad"] is True and meta["found"] == (codes[0] == 1)
    worst = json.loads((root / "a" / "worst.json").read_text())
    best = max(trials, key=lambda t: t["objective"])
    assert worst["grad_error"] == best["grad_error"] and worst["trial"] == best["trial"]
    report = (root / "a" / "report.md").read_text()
    assert "threshold (worst gradient error)" in report and "--grad --inputs" in report
    # each gradient's floor on the worst case, and the worst gradient as a multiple of its own
    floors = {n: worst[f"{n}_floor_error"] for n in NAMES if f"{n}_floor_error" in worst}
    assert {"dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"} <= floors.keys()
    assert all(math.isfinite(v) and v >= 0 for v in floors.values())
    w = worst["worst_grad"]
    assert worst["grad_floor_multiple"] == pytest.approx(worst["grad_error"] / floors[w],
                                                         rel=1e-12)
    assert "x its floor" in report and "Their floors on this case" in report


def test_check_grad_replays_the_worst_cases_gradients(hunted, capsys, tmp_path):
    root, _ = hunted
    worst = json.loads((root / "a" / "worst.json").read_text())
    code, out, _ = cli(capsys, "check", "recipe:fp32", "--grad", "--device", "cpu", "--inputs",
                       str(root / "a" / "worst.safetensors"), "--out", str(tmp_path / "c"),
                       "--json")
    rec = json.loads(out)["records"][0]
    assert rec["seed"] == worst["seed"]
    for n in NAMES:  # the same upstream gradients, the same reference: the same errors
        assert rec[f"{n}_rel_err"] == worst[f"{n}_error"], n


def test_a_wrong_backward_is_found(tmp_path, capsys):
    loud = tuple(a for a in SMALL if a != "--quiet")
    code, out, _ = cli(capsys, "hunt", "tests/check_kernels.py:grad_dk_scaled", *loud, "--grad",
                       "--trials", "3", "--out", str(tmp_path / "dk"))
    assert code == 1
    trials = _trials(tmp_path / "dk")
    # dk 2 % too large: its error is about 2e-2 in every trial, twice the threshold
    assert all(0.015 < t["dk_error"] < 0.03 and t["dq_error"] < 0.01 for t in trials)
    # and far above dk's own floor on the worst case (bf16 rounding: a few 1e-3), which the
    # summary line names beside it
    worst = json.loads((tmp_path / "dk" / "worst.json").read_text())
    assert worst["worst_grad"] == "dk" and worst["grad_floor_multiple"] > 4
    assert f"{worst['grad_floor_multiple']:.3g}x its floor" in out
    # its forward is right: an output hunt finds nothing
    code, _, _ = cli(capsys, "hunt", "tests/check_kernels.py:grad_dk_scaled", *SMALL,
                     "--trials", "3", "--out", str(tmp_path / "out"))
    assert code == 0


def test_a_target_without_a_backward_is_refused(tmp_path, capsys):
    code, _, err = cli(capsys, "hunt", "recipe:flashkda", *SMALL, "--grad", "--trials", "1",
                       "--out", str(tmp_path / "x"))
    assert code == 2 and "--grad: recipe:flashkda has no backward" in err
    assert not (tmp_path / "x").exists()


def test_resume_keeps_the_hunts_mode(tmp_path, capsys):
    out = str(tmp_path / "h")
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--grad", "--trials", "2",
                     "--out", out)
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", "--resume", "--trials", "1", "--quiet",
                     "--out", out)
    trials = _trials(tmp_path / "h")
    assert len(trials) == 3 and all(not math.isnan(t["grad_error"]) for t in trials)
    plain = str(tmp_path / "p")
    cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "1", "--out", plain)
    code, _, err = cli(capsys, "hunt", "recipe:fp32", "--resume", "--grad", "--trials", "1",
                       "--quiet", "--out", plain)
    assert code == 2 and "--grad differs" in err
    assert len(_trials(tmp_path / "p")) == 1
