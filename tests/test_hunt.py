"""kdalab hunt: the same seed and trials give the same worst case, the worst case rebuilds
exactly, the case file holds what check replays, the exit codes, the folder rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kdalab.cli import main
from kdalab.hunt import Bounds, Target, objective, read_case, rebuild, resolve
from kdalab.hunt.evaluate import NONFINITE_OBJECTIVE, evaluate
from kdalab.hunt.search import supported_bounds
from kdalab.inputs.sequences import SequenceSpec, draw
from tests.cli_run import cli

#: tiny shapes: a trial takes a few hundredths of a second on the CPU
SMALL = ("--device", "cpu", "--max-T", "40", "--max-heads", "2", "--dims", "16,32", "--quiet",
         "--gates", "lower_bound")  # the gate knob: tests/test_hunt_gates.py


def _trials(folder: Path) -> list[dict]:
    lines = (folder / "trials.jsonl").read_text().splitlines()
    timings = ("seconds", "elapsed_s")
    return [{k: v for k, v in json.loads(line).items() if k not in timings} for line in lines]


@pytest.fixture(scope="module")
def hunted(tmp_path_factory):
    """Two hunts of recipe:flashkda with the same seed and trial count, one with another seed."""
    root = tmp_path_factory.mktemp("hunt")
    codes = {}
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        with pytest.raises(SystemExit) as done:
            main(["hunt", "recipe:flashkda", *SMALL, "--seed", seed, "--trials", "14",
                  "--out", str(root / name)])
        codes[name] = done.value.code
    return root, codes


def test_same_seed_and_trials_give_the_same_worst_case_bit_for_bit(hunted):
    root, codes = hunted
    assert codes["a"] == codes["b"] and codes["a"] in (0, 1)
    a, b = (root / "a" / "worst.json").read_bytes(), (root / "b" / "worst.json").read_bytes()
    assert a == b
    ca, cb = (read_case(root / name / "worst.safetensors") for name in ("a", "b"))
    assert ca.keys() == cb.keys() and ca["metadata"] == cb["metadata"]  # (the header's key
    for name, t in ca.items():  # order is safetensors' own choice: compare what it holds)
        if isinstance(t, torch.Tensor):
            assert t.dtype == cb[name].dtype and torch.equal(t, cb[name]), name
    assert _trials(root / "a") == _trials(root / "b")  # every trial, timings aside
    assert len(_trials(root / "a")) == 14
    assert _trials(root / "a")[0]["spec"] != _trials(root / "c")[0]["spec"]  # the seed matters


def test_worst_json_rebuilds_the_case_and_its_error(hunted):
    root, _ = hunted
    doc = json.loads((root / "a" / "worst.json").read_text())
    for key in ("output_error", "state_error", "output_nonfinite", "state_nonfinite", "spec",
                "seed", "hunt_seed", "params", "threshold"):
        assert key in doc
    assert doc["hunt_seed"] == 3
    trials = _trials(root / "a")
    assert doc["output_error"] == max(t["output_error"] for t in trials
                                      if t["status"] == "measured")
    x = rebuild(doc)
    case = read_case(root / "a" / "worst.safetensors")
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens"):
        if x[name] is None:
            assert case[name] is None, name
        else:
            assert x[name].dtype == case[name].dtype and torch.equal(x[name], case[name]), name
    assert case["lower_bound"] == x["lower_bound"] and case["scale"] == x["scale"]
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the hunt ran: the fp64 sums in the same order
    try:
        again = evaluate(resolve("recipe:flashkda", "cpu"),
                         SequenceSpec.from_dict(doc["spec"]), doc["seed"])
    finally:
        torch.set_num_threads(before)
    assert again["output_error"] == doc["output_error"]
    assert again["state_error"] == doc["state_error"]


def test_case_file_holds_the_named_tensors_and_metadata(hunted):
    from safetensors import safe_open

    root, _ = hunted
    with safe_open(str(root / "a" / "worst.safetensors"), framework="pt") as f:
        names, meta = set(f.keys()), f.metadata()
    assert {"q", "k", "v", "g", "beta", "A_log", "dt_bias"} <= names
    assert names <= {"q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                     "cu_seqlens"}
    assert float(meta["lower_bound"]) < 0 and float(meta["scale"]) > 0
    assert json.loads(meta["spec"]) == json.loads((root / "a" / "worst.json").read_text())["spec"]


def test_views_and_run_description(hunted):
    root, _ = hunted
    names = {p.name for p in (root / "a").iterdir()}
    assert {"hunt.json", "trials.jsonl", "worst.json", "worst.safetensors", "progress.png",
            "progress.svg", "report.md"} <= names
    meta = json.loads((root / "a" / "hunt.json").read_text())
    assert meta["trials_run"] == 14 and meta["seed"] == 3 and "TPESampler" in meta["sampler"]
    report = (root / "a" / "report.md").read_text()
    assert "Verdict" in report and "The worst case" in report


_PLANTED = '''
import torch
import kdalab.kda as kda

def forgets_output(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
    o, s = kda.forward(q, k, v, g, beta, recipe="fp32", **kw)
    return o * 0, s

def nan_output(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
    o, s = kda.forward(q, k, v, g, beta, recipe="fp32", **kw)
    return o * float("nan"), s

def raises(q, k, v, g, beta, **kw):
    raise RuntimeError("no kernel image")
'''


@pytest.fixture
def planted(tmp_path):
    path = tmp_path / "planted.py"
    path.write_text(_PLANTED)
    return str(path)


def test_exit_0_when_nothing_exceeds_and_1_when_something_does(tmp_path, capsys, planted):
    code, out, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "5", "--out",
                       str(tmp_path / "ok"))
    assert code == 0, out
    assert json.loads((tmp_path / "ok" / "hunt.json").read_text())["found"] is False
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "3", "--threshold",
                     "1e-12", "--out", str(tmp_path / "tiny"))
    assert code == 1
    code, _, _ = cli(capsys, "hunt", f"{planted}:forgets_output", *SMALL, "--trials", "3",
                     "--out", str(tmp_path / "forgets"))
    assert code == 1
    doc = json.loads((tmp_path / "forgets" / "worst.json").read_text())
    assert doc["output_error"] == pytest.approx(1.0) and doc["exceeds_threshold"] is True


def test_nonfinite_output_is_the_worst_and_written_as_infinity(tmp_path, capsys, planted):
    code, _, _ = cli(capsys, "hunt", f"{planted}:nan_output", *SMALL, "--trials", "2", "--out",
                     str(tmp_path / "out"))
    assert code == 1
    text = (tmp_path / "out" / "worst.json").read_text()
    assert '"output_error": Infinity' in text
    doc = json.loads(text)
    assert doc["output_nonfinite"] > 0 and doc["exceeds_threshold"] is True


def test_a_kernel_that_raises_is_recorded_and_found(tmp_path, capsys, planted):
    code, _, _ = cli(capsys, "hunt", f"{planted}:raises", *SMALL, "--trials", "2", "--out",
                     str(tmp_path / "out"))
    assert code == 1
    trials = _trials(tmp_path / "out")
    assert [t["status"] for t in trials] == ["raised", "raised"]
    assert "no kernel image" in trials[0]["message"]
    assert not (tmp_path / "out" / "worst.json").exists()
    assert "raised 2" in (tmp_path / "out" / "report.md").read_text()


def test_objective_maps_every_error_to_a_finite_value():
    assert objective(math.inf) == objective(math.nan) == NONFINITE_OBJECTIVE
    assert objective(1e27) == pytest.approx(27.0)
    assert objective(0.0) == -30.0 and objective(1e-3) == pytest.approx(-3.0)


def test_the_search_leaves_out_what_the_target_declares():
    def why_not(x):
        if x["q"].shape[-1] != 32:
            return "takes K = 32 only"
        state = x["initial_state"]
        return "fp32 state only" if state is not None and state.dtype != torch.float32 else None

    target = Target("t", "cpu", run=lambda x: None, why_not=why_not)
    bounds = supported_bounds(Bounds(dims=(16, 32, 64)), target)
    assert bounds.dims == (32,) and bounds.initial_states == ("none", "fp32")
    with pytest.raises(ValueError, match="dims: t takes none of 16, 64"):
        supported_bounds(Bounds(dims=(16, 64)), target)
    assert why_not(draw(SequenceSpec(T=1, heads=1, K=32, V=32), 0)) is None


def test_output_folder_rules(tmp_path, capsys, monkeypatch):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "1", "--out",
                       str(foreign))
    assert code == 2 and "not a hunt's" in err and "--force" in err
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "1", "--out",
                     str(foreign), "--force")
    assert code == 0 and (foreign / "notes.txt").read_text() == "mine"
    # its own folder now: a hunt's trials are not thrown away without --force
    code, _, err = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "2", "--out",
                       str(foreign))
    assert code == 2 and "holds a hunt; --resume continues it, --force" in err
    assert len(_trials(foreign)) == 1
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "2", "--out",
                     str(foreign), "--force")  # replaced, the other files kept
    assert code == 0 and len(_trials(foreign)) == 2
    assert (foreign / "notes.txt").read_text() == "mine"
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "1", "--out", "~/h")
    assert code == 0 and (tmp_path / "h" / "worst.json").exists()


@pytest.mark.parametrize("args, needle", [
    (["recipe:nope"], "recipe"),
    (["fla"], "runs on cuda only"),
    (["nothing_here"], "unknown kernel"),
    (["recipe:fp32", "--lower-bound", "1"], "--lower-bound must be"),
    (["recipe:fp32", "--lower-bound", "-1:-5"], "--lower-bound: the range '-1:-5' is reversed"),
    (["recipe:fp32", "--dims", "x"], "--dims: cannot read 'x'"),
    (["recipe:fp32", "--trials", "0"], "--trials must be"),
    (["recipe:fp32", "--budget-s", "0"], "--budget-s must be"),
    (["recipe:fp32", "--threshold", "-1"], "--threshold must be"),
    (["recipe:fp32", "--min-T", "50"], "--min-T must be <= --max-T"),
    (["recipe:fp32", "--seed", "-2"], "--seed must be"),
])
def test_usage_errors_exit_2_with_one_line(args, needle, tmp_path, capsys):
    # the options under test come last (the last of a repeated option wins)
    code, out, err = cli(capsys, "hunt", args[0], *SMALL, "--trials", "1", "--out",
                         str(tmp_path / "x"), *args[1:])
    assert code == 2, (out, err)
    assert err.strip().startswith("error:") and needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_time_budget_alone_stops_the_search(tmp_path, capsys):
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--budget-s", "1", "--out",
                     str(tmp_path))
    meta = json.loads((tmp_path / "hunt.json").read_text())
    assert code == 0 and meta["budget_s"] == 1.0 and meta["trials"] is None
    assert meta["trials_run"] == len(_trials(tmp_path)) >= 1
    # checked between trials: the last one started within the second
    assert all(t["elapsed_s"] < 30 for t in map(json.loads, open(tmp_path / "trials.jsonl")))
