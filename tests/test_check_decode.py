"""The decode contract (decode = prefill): an honest decode passes, one that drops the carried
state or writes a row no index names fails with the contract's name, a kernel without a decode
function is unsupported (declared), never passed; kdalab's ``kda_decode`` under the interpreter
and, on a GPU, kdalab's and fla's decode. Planted kernels: tests/check_kernels.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from kdalab.check import BUILTIN, KernelAdapter, load_kernel, run_check, select_cases
from kdalab.check.cases import FULL, QUICK
from tests.test_check import MOD, ROOT, runner

DECODE = select_cases(QUICK, "contract/decode")


@pytest.fixture(scope="module")
def decode_records():
    names = ("honest_decode", "honest_decode_vk", "decode_forgets", "decode_leaks",
             "honest_fp32")
    recs = run_check([load_kernel(f"{MOD}:{n}") for n in names] + [load_kernel("recipe:fp32")],
                     DECODE)
    return {r["kernel"].rpartition(":")[2]: r for r in recs}


def test_the_decode_case_is_in_both_suites_at_a_cheap_shape():
    quick, = DECODE
    full, = select_cases(FULL, "contract/decode")
    assert quick.kind == full.kind == "decode" and quick.batch == full.batch == 2
    assert quick.initial_state == "fp32"  # the pool starts from the case's initial state
    assert quick.T <= 64 and (quick.heads, quick.K, quick.V) == (2, 32, 32)
    # the full suite's shape (H = 4, K = V = 128) adds no shape for a kernel to autotune on
    assert (full.heads, full.K, full.V) == (4, 128, 128) and full.T <= 512


@pytest.mark.exact
def test_an_honest_decode_keeps_the_contract(decode_records):
    for name in ("honest_decode", "honest_decode_vk"):  # [P, H, K, V] and [P, H, V, K] pools
        rec = decode_records[name]
        assert rec["status"] == "pass", rec
        assert rec["o_budget_multiple"] <= rec["budget"]
        assert "decode steps" in rec["contract_compared"] and "of 4" in rec["contract_compared"]
    # the float32 recurrence token by token through the pool repeats its prefill's operations:
    # the same bits, so the contract compares the carried state, nothing else
    assert decode_records["honest_decode"]["contract_max_diff"] == 0.0
    # the VK kernel's prefill is kda.forward's chunked fp32: a few fp32 ulps from the decode
    assert 0 < decode_records["honest_decode_vk"]["contract_max_diff"] < 1e-5


def test_a_decode_that_drops_the_carried_state_fails(decode_records):
    rec = decode_records["decode_forgets"]
    assert rec["status"] == "fail" and "decode: output error above 5x the floor" in \
        rec["message"]
    assert rec["o_budget_multiple"] > 50  # far off: each token sees only itself
    assert rec["contract_max_diff"] > 1e-2


def test_a_decode_that_writes_a_row_no_index_names_fails(decode_records):
    rec = decode_records["decode_leaks"]
    # its outputs and the sequences' own states are right: only the pool check sees it
    assert rec["o_budget_multiple"] < 1 and rec["contract_max_diff"] == 0.0
    assert rec["status"] == "fail" and rec["message"] == \
        "decode: pool rows no index names changed"


def test_a_kernel_without_decode_is_unsupported_not_passed(decode_records, tmp_path):
    for name in ("honest_fp32", "fp32"):  # a user's function, and a recipe
        rec = decode_records[name]
        assert rec["status"] == "unsupported"
        assert rec["message"] == "declared: no decode function (KernelAdapter.decode)"
        assert rec["o_rel_err"] is None and rec["contract_max_diff"] is None
    # alone on the decode case, a kernel without one ran nothing: the run fails
    res = runner.invoke(None, ["check", "recipe:fp32", "--cases", "contract/decode",
                               "--device", "cpu", "--out", str(tmp_path)])
    assert res.exit_code == 1 and "0 of 1 (kernel, case) pairs ran" in " ".join(
        res.output.split())


def test_the_report_lists_the_decode_contract(tmp_path):
    res = runner.invoke(None, ["check", f"{MOD}:honest_decode", f"{MOD}:decode_forgets",
                               "--cases", "contract/decode", "--device", "cpu",
                               "--out", str(tmp_path)])
    assert res.exit_code == 1, res.output  # decode_forgets fails
    md = (tmp_path / "report.md").read_text()
    contracts = md[md.index("## Contracts"):]
    assert contracts.count("contract/decode") >= 2 and "decode steps" in contracts


def test_decode_capability_of_the_adapters():
    with pytest.raises(ValueError, match="decode"):
        KernelAdapter(lambda *a, **k: None, decode=42)
    for name in ("kdalab", "kdalab-tf32", "fla", "fla-recurrent"):
        assert BUILTIN[name]().decode is not None, name
    assert BUILTIN["flashkda"]().decode is None
    # the other layout's adapter does not hand its decode a pool in the wrong layout
    assert load_kernel("recipe:fp32").in_other_layout().decode is None
    assert load_kernel(f"{MOD}:honest_decode").decode is not None


def test_a_decode_that_answers_off_the_convention_fails(tmp_path):
    bad = KernelAdapter(load_kernel(f"{MOD}:honest_decode").fn, name="bad",
                        decode=lambda q, k, v, g, beta, **kw: q[:, :, :, :1])
    rec, = run_check([bad], DECODE)
    assert rec["status"] == "fail" and "decode returned o of shape" in rec["message"]


def test_kdalab_decode_keeps_the_contract_in_the_interpreter(tmp_path):
    """kdalab's chunk_kda_fwd and kda_decode (Triton) under TRITON_INTERPRET=1, in a child."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", "from kdalab.cli import main; main()", "check", "kdalab",
         "--device", "cpu", "--cases", "contract/decode", "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec, = json.loads(proc.stdout)["records"]
    assert rec["status"] == "pass", rec
    # a bf16 output from the same fp32 recurrence as the prefill's: they differ by bf16
    # roundings only (interpreter: 4.9e-4, one ulp of outputs near 0.1), and the state not at all
    # beyond fp32
    assert 0 < rec["contract_max_diff"] < 1e-2
    assert rec["state_budget_multiple"] < 1


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["kdalab", "fla", "fla-recurrent"])
def test_decode_contract_on_the_gpu(kernel):
    """The full suite's decode case (T = 256, H = 4, K = V = 128) on CUDA: kdalab's kda_decode
    after its chunked prefill, fla's fused_recurrent_kda after chunk_kda (and after itself)."""
    if kernel != "kdalab":
        pytest.importorskip("fla.ops.kda")
    case = select_cases(FULL, "contract/decode")
    rec, = run_check([load_kernel(kernel)], case, device="cuda")
    assert rec["status"] == "pass", rec
    assert math.isfinite(rec["contract_max_diff"])  # recorded, for docs/check.md


def test_the_isolated_worker_gives_the_same_decode_records():
    from kdalab.check.harness import Thresholds
    from kdalab.check.isolate import run_isolated

    names = [f"{MOD}:honest_decode", f"{MOD}:decode_leaks", "recipe:fp32"]
    iso = run_isolated(names, DECODE, suite="quick", device="cpu", thresholds=Thresholds(),
                       against=None)
    assert [r["status"] for r in iso] == ["pass", "fail", "unsupported"]
    assert json.dumps(iso) == json.dumps(run_check([load_kernel(n) for n in names], DECODE))
