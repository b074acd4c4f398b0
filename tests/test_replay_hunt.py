"""scripts/replay_hunt.py: a hunt's worst trials measured again, here on the CPU with the GPU's
arithmetic emulated (tests/h200_arith.py), run as the command it is (a child process: it
defines the kernels under TRITON_INTERPRET=1)."""

from __future__ import annotations

import json

import pytest

from tests.script_runs import RIDGE_SPEC as SPEC
from tests.script_runs import run_script


def _run(*args):
    return run_script("replay_hunt.py", *args, timeout=600)


@pytest.fixture
def hunt_folder(tmp_path):
    common = dict(objective=0.0, params={}, elapsed_s=1.0, spec=SPEC)
    records = [dict(trial=i, seed=7 + i, status="measured", output_error=e, state_error=e / 2,
                    **common) for i, e in enumerate((4e-3, 6e-3, 5e-3))]
    records.append(dict(trial=3, seed=1, status="raised", output_error=None, **common))
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_replays_the_worst_with_the_emulation_in_force(hunt_folder, tmp_path):
    out = tmp_path / "replay.jsonl"
    r = _run(hunt_folder, "--top", 2, "--targets", "kdalab,kdalab-tf32", "--json", out)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["trial"] for x in lines] == [1, 2]  # the two largest output errors, in order
    assert [x["hunt_output"] for x in lines] == [6e-3, 5e-3]
    assert [x["seed"] for x in lines] == [8, 9]
    for x in lines:
        assert list(x["targets"]) == ["kdalab", "kdalab-tf32"]
        for got in x["targets"].values():
            assert got["status"] == "measured" and got["nonfinite"] == 0
            # a bf16 output's error is at least its rounding's (the floor, ~1.7e-3 relative):
            # a finite figure at or above it, not the hunt's record copied
            assert x["bf16_floor"] * 0.99 < got["output"] < 1e-1
            assert got["output"] != x["hunt_output"]
    worst = [line for line in r.stdout.splitlines() if ": worst output" in line]
    assert [w.split(":")[0] for w in worst] == ["kdalab", "kdalab-tf32"]
    assert all("over 2 trials" in w for w in worst)
    # both emulations were in force: products and conversions counted
    counts = worst[0].split("(emulated: ")[1].split(")")[0]
    assert not counts.startswith("0 tf32") and " 0 bf16" not in counts, counts


def test_parts_share_the_trials(hunt_folder, tmp_path):
    outs = []
    for i in (0, 1):
        r = _run(hunt_folder, "--top", 3, "--part", f"{i}/2", "--json", tmp_path / f"{i}.jsonl")
        assert r.returncode == 0, r.stderr
        outs.append([json.loads(x)["trial"]
                     for x in (tmp_path / f"{i}.jsonl").read_text().splitlines()])
    assert outs == [[1, 0], [2]]


@pytest.mark.parametrize("args,word", [(["--top", "0"], "--top"), (["--part", "2/2"], "--part"),
                                       (["--targets", "nonesuch"], "--targets"),
                                       (["--device", "gpu"], "--device")])
def test_mistakes_exit_2_naming_the_argument(hunt_folder, args, word):
    r = _run(hunt_folder, *args)
    assert r.returncode == 2 and word in r.stderr.splitlines()[-1], r.stderr


def test_cuda_without_a_device_exits_2(hunt_folder):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without")
    r = _run(hunt_folder, "--device", "cuda")
    assert r.returncode == 2 and "--device cuda" in r.stderr.splitlines()[-1], r.stderr


def test_a_folder_without_trials_exits_2_and_is_only_read(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 2 and "HUNT_FOLDER" in r.stderr.splitlines()[-1], r.stderr
    common = dict(seed=1, objective=0.0, params={}, elapsed_s=1.0, output_error=None)
    raised = json.dumps(dict(trial=0, status="raised", **common))
    for text, says in ((raised + '\n{"trial": 1, "status": "meas', "no measured trial"),
                       (raised, "no measured trial"),  # a whole last line without its newline
                       ('{"not": "a trial"}\n' + raised + "\n", "line 1 of")):
        (tmp_path / "trials.jsonl").write_text(text)
        r = _run(tmp_path)
        assert r.returncode == 2 and says in r.stderr.splitlines()[-1], r.stderr
        assert (tmp_path / "trials.jsonl").read_text() == text  # the hunt's file, as it was


def test_a_gradient_hunt_is_replayed_by_its_worst_gradient(tmp_path):
    """A ``hunt --grad`` folder (hunt.json's ``grad``) is ranked by the trials' worst-gradient
    error, not their output error, and each gradient is measured again (autograd through the
    fp64 recurrence as the reference), the emulation in force."""
    common = dict(objective=0.0, params={}, elapsed_s=1.0, spec=dict(SPEC, v_scale=1.0))
    records = [dict(trial=i, seed=7 + i, status="measured", output_error=o, state_error=o,
                    grad_error=g, worst_grad="dbeta", **common)
               for i, (o, g) in enumerate(((9e-3, 1e-3), (2e-3, 5e-2), (3e-3, 4e-2)))]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "hunt.json").write_text(json.dumps(dict(target="kdalab", grad=True)))
    out = tmp_path / "replay.jsonl"
    r = _run(tmp_path, "--top", 1, "--json", out)
    assert r.returncode == 0, r.stderr
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["trial"] == 1 and line["hunt_grad"] == 5e-2  # the largest gradient error
    got = line["targets"]["kdalab"]
    assert got["status"] == "measured" and got["nonfinite"] == 0
    assert set(got["grads"]) == {"dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"}
    assert got["grad"] == max(got["grads"].values()) and got["grad"] != 5e-2
    assert got["grads"][got["worst_grad"]] == got["grad"]
    # measured, not copied or blown up: positive and finite at T = 40 (the bf16 inputs'
    # gradients measured 1.7e-3 to 7.5e-3; dh0, of the fp32 initial state, 6e-5)
    assert all(1e-7 < e < 0.5 for e in got["grads"].values()), got["grads"]
    assert "kdalab: worst gradient" in r.stdout
    (tmp_path / "hunt.json").write_text("[1, 2]")  # not a hunt's summary
    r = _run(tmp_path)
    assert r.returncode == 2 and "HUNT_FOLDER" in r.stderr.splitlines()[-1], r.stderr
