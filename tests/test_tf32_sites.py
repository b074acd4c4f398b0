"""scripts/tf32_sites.py: which of the kernels' tf32 products carries a case's error (each call
site exact in turn, then truncated in turn, the GPU's truncation emulated in the interpreter),
run as the command it is (a child process: it defines the kernels under TRITON_INTERPRET=1)."""

from __future__ import annotations

import json

import pytest

from tests.script_runs import RIDGE_SPEC as SPEC
from tests.script_runs import run_script


def _run(*args):
    return run_script("tf32_sites.py", *args)


@pytest.fixture
def case(tmp_path):
    path = tmp_path / "worst.json"
    path.write_text(json.dumps(dict(spec=dict(SPEC, T=80), seed=11, worst_grad=None)))
    return path


def test_each_site_exact_then_truncated_in_turn(case, tmp_path):
    out = tmp_path / "sites.jsonl"
    r = _run(case, "--set", "T=40", "--measure", "output", "--json", out)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["mode"] for x in lines[:2]] == ["as_run", "all_exact"]
    exact = {x["site"]: x["error"] for x in lines if x["mode"] == "exact_only"}
    alone = {x["site"]: x["error"] for x in lines if x["mode"] == "truncated_only"}
    assert exact and set(exact) == set(alone)  # every site both ways, once each
    assert len(lines) == 2 + 2 * len(exact)
    assert all(s.split(" < ")[0].split(":")[1].isdigit() for s in exact)  # file:line
    as_run, all_exact = lines[0]["error"], lines[1]["error"]
    assert 0 < all_exact and 0 < as_run < 1
    assert as_run != all_exact  # the truncation reaches the output
    # one site exact, or one site truncated, lies between the two ends somewhere: at least
    # one site moves the error off the as-run figure
    assert any(e != as_run for e in exact.values())
    assert "with every product exact" in r.stdout


@pytest.mark.parametrize("args,word", [(["--measure", "nope"], "--measure"),
                                       (["--set", "nosuch=1"], "--set"),
                                       (["--only", "no such site"], "--only"),
                                       (["--target", "nonesuch"], "--target")])
def test_mistakes_exit_2_naming_the_argument(case, args, word):
    r = _run(case, "--set", "T=16", "--measure", "output", *args)
    assert r.returncode == 2 and word in r.stderr.splitlines()[-1], r.stderr


def test_a_case_that_is_not_a_hunts_exits_2(tmp_path):
    r = _run(tmp_path)  # a folder without worst.json
    assert r.returncode == 2 and "CASE" in r.stderr.splitlines()[-1], r.stderr
    (tmp_path / "worst.json").write_text("[1, 2]")
    r = _run(tmp_path)
    assert r.returncode == 2 and "not a hunt's worst case" in r.stderr.splitlines()[-1]
