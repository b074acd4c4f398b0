"""``kdalab check`` cannot be fooled: no pass without a run, the contracts (causal, chunked
prefill, batch = varlen = separate), budgets from the floor, the collinear group, an interrupted
run and the output folder's rules. Planted kernels: tests/check_kernels.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kdalab.check import load_kernel, run_check, select_cases
from kdalab.check.budget import DEFAULT_BUDGET, Floors, floor_reference, multiple
from kdalab.check.calls import rel
from kdalab.check.cases import QUICK, Case, case_inputs, reference
from kdalab.check.records import read
from kdalab.records import StoreReader
from tests.test_check import MOD, ROOT, runner

CONTRACTS = select_cases(QUICK, "contract/*")


def _cli(args, out):
    device = [] if "--redraw" in args else ["--device", "cpu"]  # --redraw takes no --device
    return runner.invoke(None, ["check", *args, *device, "--out", str(out)])


# -- no pass without a run ------------------------------------------------------------------------

@pytest.mark.parametrize("kernel,needle", [
    ("always_raises", "raised RuntimeError: CUDA error: an illegal memory access"),
    ("import_fails_inside", "raised ModuleNotFoundError: No module named"),
    ("exits", "raised SystemExit: 0"),  # sys.exit(0) inside the call is no pass
])
def test_a_kernel_that_raises_fails_every_case(kernel, needle, tmp_path):
    res = _cli([f"{MOD}:{kernel}", "--cases", "model_like,T/*,varlen/*,contract/causal/*"],
               tmp_path)
    assert res.exit_code == 1, res.output
    recs = read(tmp_path)
    assert {r["status"] for r in recs} == {"fail"}
    assert all(r["message"].startswith(needle) for r in recs)
    assert all("second line" not in r["message"] for r in recs)  # the first line only
    assert f"0 passed, {len(recs)} failed" in " ".join(res.output.split())


def test_a_kernel_that_supports_nothing_fails(tmp_path):
    res = _cli([f"{MOD}:declines_everything", "--cases", "model_like,T/17"], tmp_path)
    assert res.exit_code == 1, res.output
    assert {r["status"] for r in read(tmp_path)} == {"unsupported"}
    text = " ".join(res.output.split())
    assert "0 of 2 (kernel, case) pairs ran" in text and "no case ran for" in text


# -- contracts --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def contracts():
    names = ("honest_fp32", "fp32_recurrence", "acausal_leak", "varlen_leaks_state",
             "drops_initial_state", "layout_sloppy")
    recs = run_check([load_kernel(f"{MOD}:{n}") for n in names] + [load_kernel("recipe:fp32")],
                     CONTRACTS)
    return {(r["kernel"].rpartition(":")[2], r["case"]): r for r in recs}


@pytest.mark.exact
def test_honest_kernels_keep_every_contract(contracts):
    for kernel in ("honest_fp32", "fp32_recurrence", "fp32"):  # "fp32": recipe:fp32
        for case in CONTRACTS:
            rec = contracts[(kernel, case.name)]
            if case.kind == "layout" and kernel != "fp32":  # plain functions: one layout
                assert rec["status"] == "unsupported" and "one layout" in rec["message"]
                continue
            if case.kind == "decode":  # no decode function (tests/test_check_decode.py)
                assert rec["status"] == "unsupported" and rec["message"].startswith("declared:")
                continue
            assert rec["status"] == "pass", rec
            assert rec["contract_compared"] and rec["contract_max_diff"] is not None
    # the token recurrence is causal to the bit and takes batch, varlen and one by one alike
    assert contracts[("fp32_recurrence", "contract/causal/inside")]["contract_max_diff"] == 0.0
    assert contracts[("fp32_recurrence", "contract/batch_varlen")]["contract_max_diff"] == 0.0


def test_a_small_acausal_leak_fails_the_causal_contract(contracts, tmp_path):
    for case in ("contract/causal/boundary", "contract/causal/inside", "contract/causal/tail"):
        rec = contracts[("acausal_leak", case)]
        assert rec["status"] == "fail" and "causal: outputs before" in rec["message"]
        assert 0 < rec["contract_max_diff"] < 1e-2  # small: 1e-4 of a value
    # ... yet accurate: its accuracy cases pass the budget
    res = _cli([f"{MOD}:acausal_leak", "--cases", "model_like,contract/causal/*"], tmp_path)
    assert res.exit_code == 1, res.output
    status = {r["case"]: r["status"] for r in read(tmp_path)}
    assert {r["budget"] for r in read(tmp_path)} == {DEFAULT_BUDGET}  # the CLI's default
    assert status == {"model_like": "pass", "contract/causal/boundary": "fail",
                      "contract/causal/inside": "fail", "contract/causal/tail": "fail",
                      "contract/causal/fp16_guard": "fail"}
    md = (tmp_path / "report.md").read_text()
    assert "## Contracts" in md and "contract/causal/inside" in md and "first at t =" in md


@pytest.mark.exact
def test_prefill_and_batch_contracts_catch_their_bugs(contracts):
    for case in ("contract/prefill/aligned", "contract/prefill/unaligned"):
        rec = contracts[("drops_initial_state", case)]
        assert rec["status"] == "fail" and "prefill:" in rec["message"]
    rec = contracts[("varlen_leaks_state", "contract/batch_varlen")]
    assert rec["status"] == "fail" and "batch = varlen = separate" in rec["message"]
    assert rec["contract_max_diff"] > 1e-2
    assert contracts[("varlen_leaks_state", "contract/prefill/aligned")]["status"] == "pass"
    rec = contracts[("layout_sloppy", "contract/layout")]
    assert rec["status"] == "fail" and rec["message"].startswith("layout: the other state")
    assert contracts[("fp32", "contract/layout")]["contract_max_diff"] == 0.0


# -- budgets from the floor ---------------------------------------------------------------------

def test_the_floor_is_the_fp32_recurrence_rounded():
    x = case_inputs(QUICK[0])
    o64, s64 = reference(x)
    fo, fs = floor_reference(x)
    assert fo.dtype == torch.float64 and torch.equal(fo, fo.float().double())  # fp32 values
    floors = Floors(x, (o64, s64), (fo, fs), rel)
    assert floors.of(torch.float32) == floors.default  # never finer than the inputs'
    x32 = replace(x, v=x.v.float())  # float32 inputs: a bf16-output kernel is held to bf16
    assert Floors(x32, (o64, s64), (fo, fs), rel).of(torch.bfloat16) == floors.default
    fo = fo.bfloat16().double()  # rounded to the output dtype (bf16, v's)
    err = float((fo - o64).norm() / o64.norm())
    assert floors.default["o_floor_err"] == pytest.approx(err, rel=1e-12)
    bf16 = float((o64.bfloat16().double() - o64).norm() / o64.norm())
    # ordinary inputs: the rounding dominates, so the floor is the bf16 floor within 5 %
    assert 0.95 * bf16 < err < 1.05 * bf16
    assert multiple(0.0, 0.0) == 0.0 and multiple(1.0, 0.0) == float("inf")


def test_records_report_the_multiple_of_the_floor():
    recs = run_check([load_kernel("recipe:flashkda")], select_cases(QUICK, "model_like"))
    rec = recs[0]
    assert rec["budget"] == 5.0 and rec["status"] == "pass"
    assert rec["o_budget_multiple"] == pytest.approx(rec["o_rel_err"] / rec["o_floor_err"])
    assert 1 < rec["o_budget_multiple"] < 5


# -- the collinear group ------------------------------------------------------------------------

def test_collinear_cases_are_what_the_issue_says():
    cases = select_cases(QUICK, "collinear/*")
    assert {c.key_noise for c in cases} >= {0.0, 0.02} and all(c.T >= 256 for c in cases)
    x = case_inputs(cases[0])
    assert bool((x.beta.float() >= 9).all())  # beta -> 1
    assert bool((x.k == x.k[:, :1]).all())  # eps = 0: one key
    assert float(x.A_log.abs().max()) == 0 and float(x.dt_bias.abs().max()) == 0


def test_flashkda_recipe_fails_the_collinear_group(tmp_path):
    res = _cli(["recipe:flashkda", "--suite", "quick", "--cases", "collinear/*,model_like"],
               tmp_path)
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert "fail on collinear/eps0, collinear/eps0.02, collinear/eps0.05" in text
    assert "collinear/eps0.02" in (tmp_path / "report.md").read_text()


def test_kdalab_kernel_passes_collinear_and_the_contracts_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", "from kdalab.cli import main; main()", "check", "kdalab",
         "--device", "cpu", "--suite", "quick", "--cases",
         "collinear/eps0.02,contract/causal/inside", "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert [r["status"] for r in doc["records"]] == ["pass", "pass"]


# -- interrupted runs, output folders -----------------------------------------------------------

def test_ctrl_c_says_what_was_kept_and_the_report_says_incomplete(tmp_path):
    # the kernel raises the boundary's Ctrl-C in this process (isolated, the worker would die)
    res = _cli([f"{MOD}:interrupted_on_third_case", "--cases", "model_like,T/*",
                "--no-isolate"], tmp_path)
    assert res.exit_code == 130, res.output
    assert "interrupted: 2 of 3 records in" in " ".join(res.output.split())
    assert "nothing was written" not in res.output
    assert json.loads((tmp_path / "check.json").read_text())["complete"] is False
    # the two cases that ran are in the store, which says the run was interrupted
    assert [r["case"] for r in read(tmp_path)] == ["model_like", "T/1"]
    assert json.loads((tmp_path / "manifest.json").read_text())["state"] == "interrupted"
    again = runner.invoke(None, ["check", "--redraw", "--out", str(tmp_path)])
    assert again.exit_code == 1  # an incomplete run does not pass
    assert "INCOMPLETE" in (tmp_path / "report.md").read_text()
    assert "INCOMPLETE" in (tmp_path / "report.html").read_text()


def test_out_folders_of_others_are_refused(tmp_path):
    foreign = tmp_path / "sweep"
    foreign.mkdir()
    (foreign / "manifest.json").write_text("{}")
    res = _cli(["recipe:fp32", "--cases", "T/1"], foreign)
    assert res.exit_code == 2 and res.output.startswith("error:")
    assert "holds no check run" in res.output and "--force" in res.output
    assert (foreign / "manifest.json").read_text() == "{}"
    res = runner.invoke(None, ["check", "--redraw", "--out", str(foreign)])
    assert res.exit_code == 2 and res.output.startswith("error:"), res.output
    assert len(res.output.strip().splitlines()) == 1
    assert _cli(["recipe:fp32", "--cases", "T/1", "--force"], foreign).exit_code == 0
    again = _cli(["recipe:fp32", "--cases", "T/1"], foreign)  # now its own: the same again
    assert again.exit_code == 0, again.output
    other = _cli([f"{MOD}:honest_fp32", "--cases", "T/17"], foreign)  # another check's: kept
    assert other.exit_code == 2 and "holds the records of another check" in other.output
    assert [(r["kernel"], r["case"]) for r in read(foreign)] == [("recipe:fp32", "T/1")]
    assert _cli([f"{MOD}:honest_fp32", "--cases", "T/17", "--force"], foreign).exit_code == 0
    assert [(r["kernel"], r["case"]) for r in read(foreign)] == [(f"{MOD}:honest_fp32", "T/17")]


def test_a_store_of_another_kind_is_not_a_check_run(tmp_path):
    import pyarrow as pa

    from kdalab.records import RunStore, records_table

    schema = pa.schema([("run", pa.int64()), ("x", pa.float64())])
    with RunStore.open(tmp_path, kind="sweep", config={}, runs=1, records_per_run=1,
                       schema=schema) as store:
        store.append(records_table([{"x": 1.0}], schema, [0]), group="g")
    for args in (["--redraw"], ["recipe:fp32", "--cases", "T/1"]):
        res = _cli(args, tmp_path)
        assert res.exit_code == 2 and res.output.startswith("error:"), res.output
        assert len(res.output.strip().splitlines()) == 1 and "holds no check run" in res.output
    assert "records of sweep" in _cli(["--redraw"], tmp_path).output
    assert StoreReader.read_only(tmp_path, kind="sweep").complete  # untouched


def test_case_kinds_round_trip_through_the_isolated_worker(tmp_path):
    from kdalab.check.harness import Thresholds
    from kdalab.check.isolate import run_isolated

    cases = select_cases(QUICK, "contract/causal/inside,T/1")
    iso = run_isolated(["recipe:fp32"], cases, suite="quick", device="cpu",
                       thresholds=Thresholds(), against=None)
    assert json.dumps(iso) == json.dumps(run_check([load_kernel("recipe:fp32")], cases))


def test_isolated_and_in_process_runs_store_the_same_records_and_no_caches(tmp_path):
    """The stores of the same check run in this process and with --isolate hold the same
    records bit for bit; the isolated run's folder holds the store and the report only (the
    workers' references, .pt files, live in a temporary folder that is gone)."""
    from kdalab.records import StoreReader, identical

    args = ["recipe:fp32", f"{MOD}:honest_fp32", "--cases", "T/1,contract/causal/inside"]
    assert _cli(args, tmp_path / "in").exit_code == 0
    assert _cli([*args, "--isolate"], tmp_path / "iso").exit_code == 0
    a, b = (StoreReader.read_only(tmp_path / n) for n in ("in", "iso"))
    assert a.complete and b.complete and a.read().num_rows == 4
    assert identical(a.read(), b.read())
    assert not list((tmp_path / "iso").rglob("*.pt"))
    assert {p.name for p in (tmp_path / "iso").iterdir()} == {p.name for p in
                                                              (tmp_path / "in").iterdir()}


def test_full_suite_has_the_contracts_and_collinear_group():
    from kdalab.check.cases import FULL

    kinds = {c.kind for c in FULL}
    assert kinds == {"accuracy", "causal", "prefill", "batch_varlen", "layout", "decode"}
    splits = {c.split for c in FULL if c.kind in ("causal", "prefill")}
    assert any(s % 64 == 0 for s in splits) and any(s % 16 for s in splits)
    assert all(c.T >= 1024 for c in FULL if c.family == "collinear")
    assert Path(ROOT / "docs" / "check.md").exists()
    assert isinstance(Case("x", kind="prefill", T=8, split=3), Case)


def test_a_terminated_isolated_check_keeps_its_records_and_leaves_nothing_running(tmp_path):
    """SIGTERM (``timeout``'s) in the middle of an isolated run: exit 143, the case that finished
    is in the store, which says interrupted; the worker is stopped and its temporary folder (the
    shared references) removed; --redraw draws the INCOMPLETE report."""
    import signal
    import time

    from kdalab.records import StoreReader

    kernel = tmp_path / "slow.py"
    kernel.write_text(
        "import os, time\nfrom tests.check_kernels import honest_fp32\n\n"
        "def slow_after_t1(q, k, v, g, beta, **kw):\n"
        f"    open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        "    if q.shape[1] > 1:\n        time.sleep(120)\n"
        "    return honest_fp32(q, k, v, g, beta, **kw)\n")
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "out"
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from kdalab.cli import main; main()", "check",
         f"{kernel}:slow_after_t1", "--device", "cpu", "--isolate", "--cases", "T/1,T/17",
         "--out", str(out), "--quiet"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (out / "manifest.json").exists() and StoreReader.read_only(out).done.sum():
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        time.sleep(0.5)  # the worker is on T/17
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "terminated: 1 of 2 records in" in " ".join(err.split())
    store = StoreReader.read_only(out)
    assert store.manifest.state == "interrupted" and store.records()[0]["case"] == "T/1"
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "pid").read_text()), 0)
    assert not list((tmp_path / "tmp").iterdir()) and not list(out.rglob("*.pt"))
    again = runner.invoke(None, ["check", "--redraw", "--out", str(out)])
    assert again.exit_code == 1 and "INCOMPLETE" in (out / "report.md").read_text()
