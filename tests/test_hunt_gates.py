"""kdalab hunt's gate knob (issue 41): the search draws the lower-bound gate, fla's softplus gate
and a log-decay, with the strong-decay range where there is no bound; the worst case keeps its
mode (worst.json and the case file check replays); a target's declared gates bound the search;
a hunt of the lower-bound gate alone asks what it asked before the knob, and resumes a hunt
recorded then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kdalab.check.replay import replay_cases
from kdalab.cli import main
from kdalab.hunt import Bounds, HuntConfig, Target, read_case, rebuild, resolve, run_hunt
from kdalab.hunt.search import supported_bounds
from tests.cli_run import cli

SMALL = ("--device", "cpu", "--max-T", "40", "--max-heads", "2", "--dims", "16", "--quiet")
#: the parameters a hunt asked before the gate knob (tests/test_hunt.py's space, one dim)
OLD_PARAMS = {"T", "heads", "lower_bound", "sequences", "packed", "key_clusters",
              "log10_key_eps", "beta_mean", "beta_spread", "g_mean", "g_spread", "A_log_low",
              "A_log_width", "dt_bias_low", "dt_bias_width", "log2_v_scale", "initial_state",
              "log2_state_scale", "block_fraction", "block_position", "block_offset"}


def _records(folder: Path) -> list[dict]:
    lines = (folder / "trials.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "elapsed_s")}
            for line in lines]


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """recipe:fp32 (chunk-start tiles: a split exponent) searched over the three gates, twice
    with one seed."""
    root = tmp_path_factory.mktemp("gates")
    codes = {}
    for name in ("a", "b"):
        with pytest.raises(SystemExit) as done:
            main(["hunt", "recipe:fp32", *SMALL, "--seed", "5", "--trials", "16",
                  "--out", str(root / name)])
        codes[name] = done.value.code
    return root, codes


def test_the_search_draws_every_gate_with_the_strong_range(gated):
    root, _ = gated
    trials = _records(root / "a")
    assert trials == _records(root / "b")  # the same seed and trials: the same records
    gates = [t["params"]["gate"] for t in trials]
    assert set(gates) == {"lower_bound", "unbounded", "log_decay"}
    for t in trials:
        spec, p = t["spec"], t["params"]
        assert set(p) == OLD_PARAMS | {"gate", "strong_channels", "strong_low",
                                       "strong_high_ratio"}
        if p["gate"] == "lower_bound":
            assert spec["lower_bound"] == p["lower_bound"] and spec["decay_range"] is None
            continue
        assert spec["lower_bound"] is None  # no bound, none promised
        assert spec["g_as_log_decay"] == ("fp32" if p["gate"] == "log_decay" else None)
        if p["strong_channels"] > 0:
            low, high = spec["decay_range"]
            assert -20 <= low <= high <= low / 4 < 0 and spec["decay_channels"] > 0
        else:
            assert spec["decay_range"] is None


def test_the_worst_case_keeps_its_gate(gated):
    """A split exponent overflows where a chunk's decay spans past float32's range: the worst
    case is non-finite and its mode is not the bounded one; worst.json rebuilds it, and the
    case file replays it in check with its mode."""
    root, codes = gated
    assert codes["a"] == 1
    doc = json.loads((root / "a" / "worst.json").read_text())
    assert doc["output_nonfinite"] > 0 and doc["params"]["gate"] != "lower_bound"
    x = rebuild(doc)
    assert x["gate"] == doc["params"]["gate"] and x["lower_bound"] is None
    case = read_case(root / "a" / "worst.safetensors")
    assert case["gate"] == x["gate"] and case["lower_bound"] is None
    assert torch.equal(case["g"], x["g"]) and case["g"].dtype == x["g"].dtype
    (replayed,) = replay_cases(root / "a" / "worst.safetensors")
    assert replayed.gate == x["gate"] and replayed.lower_bound is None


def test_a_hunt_of_the_lower_bound_gate_asks_what_it_asked_before(tmp_path, capsys):
    code, _, _ = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--gates", "lower_bound",
                     "--trials", "3", "--out", str(tmp_path / "h"))
    assert code == 0
    assert all(set(t["params"]) == OLD_PARAMS for t in _records(tmp_path / "h"))
    # a hunt.json written before the knob (no "gates") resumes as the lower-bound hunt it was
    meta_path = tmp_path / "h" / "hunt.json"
    meta = json.loads(meta_path.read_text())
    del meta["bounds"]["gates"]
    meta_path.write_text(json.dumps(meta))
    code, _, err = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "2", "--resume",
                       "--out", str(tmp_path / "h"))
    assert code == 0, err
    assert len(_records(tmp_path / "h")) == 5
    code, _, err = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "1", "--resume",
                       "--gates", "unbounded", "--out", str(tmp_path / "h"))
    assert code == 2 and "--gates differs" in err


def test_declared_gates_bound_the_search():
    def lower_bound_only(x):
        return None if x["gate"] == "lower_bound" else f"the {x['gate']} gate: no"

    target = Target("t", "cpu", run=lambda x: None, why_not=lower_bound_only)
    assert supported_bounds(Bounds(dims=(16,)), target).gates == ("lower_bound",)
    with pytest.raises(ValueError, match="gates: t takes none of unbounded, log_decay"):
        supported_bounds(Bounds(dims=(16,), gates=("unbounded", "log_decay")), target)
    # and a search over one gate draws only it
    exact = resolve("recipe:fp64", "cpu")
    cfg = HuntConfig("t", trials=4, budget_s=None,
                     bounds=Bounds(max_T=24, max_heads=1, dims=(16,), gates=("log_decay",)))
    result = run_hunt(cfg, target=Target("t", "cpu", run=exact.run, why_not=exact.why_not))
    assert all(r["spec"]["g_as_log_decay"] == "fp32" for r in result.records)
    assert all("gate" not in r["params"] for r in result.records)
    # the fp64 recipe is exact in any mode: nothing found
    assert not result.found and max(r["output_error"] for r in result.records) < 1e-12


@pytest.mark.parametrize("gates", ["nope", "lower_bound,", "unbounded,x", ""])
def test_bad_gates_exit_2_with_one_line(gates, tmp_path, capsys):
    code, _, err = cli(capsys, "hunt", "recipe:fp32", *SMALL, "--trials", "1", "--gates",
                       gates, "--out", str(tmp_path / "x"))
    if gates == "lower_bound,":  # an empty item is ignored
        assert code == 0
        return
    assert code == 2 and err.strip().startswith("error: --gates must be")
    assert len(err.strip().splitlines()) == 1
