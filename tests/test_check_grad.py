"""Gradients judged (``kdalab check --grad``): the fp64 reference against finite differences,
the floor's definition, the upstream gradients, the check end to end with a recipe and with
planted backwards (a wrong gradient must fail), the reports' gradient table."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from kdalab.check import Thresholds, get_suite, load_kernel, run_check, select_cases
from kdalab.check.budget import fp32_forward
from kdalab.check.cases import Case, case_inputs, recurrence
from kdalab.check.gradients import (
    GRADIENTS,
    floor_gradients,
    gradients,
    reference_gradients,
    upstream,
)
from kdalab.cli import main
from kdalab.kda import reference_forward
from kdalab.kda.gate import prepare_inputs
from kdalab.views.check import gradient_rows, terminal_table
from kdalab.views.check_report import html_report, markdown_report

GRAD = Thresholds(grad=True)
TINY = Case("tiny", T=9, heads=2, K=4, V=3, initial_state="fp32")


def _cases(patterns: str):
    return select_cases(get_suite("quick"), patterns)


# -- the reference -----------------------------------------------------------------------------

@pytest.mark.parametrize("gate", ["lower_bound", "unbounded"])
def test_the_fp64_reference_passes_torch_gradcheck(gate):
    """Autograd through the fp64 recurrence against central differences, every input at once:
    the gate (both forms), β logits, the q/k normalization, grouped values (HV = 2H), packed
    sequences with initial states. gradcheck's default tolerances (atol 1e-5, rtol 1e-3 on
    eps 1e-6 differences in fp64) are far above the O(eps²) error of a smooth function."""
    gen = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    q, k, g = r(1, 7, 1, 3), r(1, 7, 1, 3), r(1, 7, 2, 3)
    v, beta, a_log, dt_bias, h0 = r(1, 7, 2, 2), r(1, 7, 2), r(2), r(2, 3), r(2, 2, 3, 2)
    cu = torch.tensor([0, 3, 7])

    def layer(q, k, v, g, beta, a_log, dt_bias, h0):
        return reference_forward(q, k, v, g, beta, A_log=a_log, dt_bias=dt_bias,
                                 gate=gate, lower_bound=-5.0 if gate == "lower_bound" else None,
                                 initial_state=h0, cu_seqlens=cu, output_final_state=True)

    assert torch.autograd.gradcheck(layer, (q, k, v, g, beta, a_log, dt_bias, h0))


def _loss(x, do, dht) -> float:
    o, s = recurrence(x, reference_forward)
    return float((o * do.double()).sum() + (s * dht.double()).sum())


def _fp64(x):
    return replace(x, **{i: getattr(x, i).double() for i in GRADIENTS.values()
                         if getattr(x, i) is not None})


def test_reference_gradients_match_finite_differences_through_the_case():
    """The gradients check judges by (the case's plumbing: packed sequences, an empty one, its
    initial state kept; the upstream dO and dHT) against a central difference of the loss
    ⟨dO, o⟩ + ⟨dHT, S_T⟩ along a random direction per input. In fp64 with eps 1e-6 the
    difference's truncation error is ~1e-12 and its rounding ~1e-16·|L|/1e-6 ~ 1e-9 of the
    loss: 1e-6 relative is a wide margin that a wrong gradient (off by a factor or a sign, or
    missing dHT) misses by orders of magnitude."""
    case = replace(TINY, seqlens=(4, 0, 5), batch=1)
    x = case_inputs(case)
    do, dht = upstream(x, 3)
    got = reference_gradients(x, do, dht)
    assert set(got) == set(GRADIENTS)
    x64, eps = _fp64(x), 1e-6
    gen = torch.Generator().manual_seed(5)
    for name, field in GRADIENTS.items():
        d = torch.randn(getattr(x64, field).shape, generator=gen, dtype=torch.float64)
        plus = replace(x64, **{field: getattr(x64, field) + eps * d})
        minus = replace(x64, **{field: getattr(x64, field) - eps * d})
        fd = (_loss(plus, do, dht) - _loss(minus, do, dht)) / (2 * eps)
        analytic = float((got[name] * d).sum())
        assert abs(fd - analytic) <= 1e-6 * max(abs(analytic), 1e-3), (name, fd, analytic)
    # the empty sequence's state passes through: its dh0 is its dHT
    assert torch.equal(got["dh0"][1], dht[1].double())


def test_upstream_is_drawn_per_seed_in_bf16_apart_from_the_inputs():
    x = case_inputs(TINY)
    do, dht = upstream(x, 0)
    again, _ = upstream(x, 0)
    other, _ = upstream(x, 1)
    assert do.shape == x.v.shape and dht.shape == (1, 2, 4, 3)
    assert torch.equal(do, again) and not torch.equal(do, other)
    assert torch.equal(do, do.bfloat16().float()) and torch.equal(dht, dht.bfloat16().float())
    # not the generator of the inputs' draw (seeded by the same case seed): uncorrelated
    plain = torch.randn(tuple(x.v.shape), generator=torch.Generator().manual_seed(0))
    assert not torch.equal(do, plain.bfloat16().float())


# -- the floor ---------------------------------------------------------------------------------

def test_the_floor_rounds_the_fp32_recurrences_gradients_at_the_tokens():
    """Per-token gradients and dh0: the float32 recurrence's gradient rounded to bf16.
    dA_log and ddt_bias: Σ over tokens of the rounded log-decay gradient times the gate's
    derivative, here in closed form for the lower-bound gate lb·σ(e^A·(g + dt))."""
    x = case_inputs(TINY)
    do, dht = upstream(x, 0)
    floor = floor_gradients(x, do, dht)
    fp32 = gradients(x, fp32_forward, do, dht)
    for name in ("dq", "dk", "dv", "dg", "dbeta", "dh0"):
        assert torch.equal(floor[name], fp32[name].bfloat16().double()), name
    # the log-decay's gradient in the float32 recurrence, by hand
    x64 = _fp64(x)
    prep = prepare_inputs(x64.q, x64.k, x64.v, x64.g, x64.beta, A_log=x64.A_log,
                          dt_bias=x64.dt_bias, lower_bound=x.lower_bound,
                          initial_state=x64.initial_state, scale=x.scale)
    ld = prep.log_decay.float().detach().requires_grad_()
    from kdalab.check.budget import fp32_recurrence

    o, s = fp32_recurrence(replace(prep, log_decay=ld))
    (dld,) = torch.autograd.grad((o, s), ld, (do, dht))
    dld = dld.bfloat16().double().movedim(1, 2)  # [B, T, H, K]
    a = x64.A_log.exp()[:, None]
    z = a * (x64.g + x64.dt_bias)  # [B, T, H, K]
    sig = torch.sigmoid(z)
    dz = dld * x.lower_bound * sig * (1 - sig)
    assert torch.allclose(floor["ddt_bias"], (dz * a).sum((0, 1)), rtol=1e-12, atol=0)
    assert torch.allclose(floor["dA_log"], (dz * z).sum((0, 1, 3)), rtol=1e-12, atol=0)


# -- check --grad ------------------------------------------------------------------------------

def _by(records, kernel):
    return {r["case"]: r for r in records if r["kernel"] == kernel}


def test_check_grad_judges_every_gradient_of_a_recipe():
    cases = _cases("model_like,no_h0,h0/bf16,varlen/mixed,collinear/eps0.05,prenorm,"
                   "contract/causal/inside")
    recs = run_check([load_kernel("recipe:fp32"), load_kernel("recipe:flashkda")], cases,
                     thresholds=GRAD)
    fp32, flash = _by(recs, "recipe:fp32"), _by(recs, "recipe:flashkda")
    assert all(r["status"] == "pass" for r in fp32.values()), [r["message"] for r in recs]
    for case, rec in fp32.items():
        names = [n for n in GRADIENTS if rec[f"{n}_rel_err"] is not None]
        if rec["kind"] != "accuracy":  # the causal contract: the gradients' bits, no errors
            assert names == [] and rec["grad_deterministic"] is True
            assert rec["grad_contract_max_diff"] == 0.0
            continue
        want = [n for n in GRADIENTS if n != "dh0" or case != "no_h0"]
        assert names == want, case
        assert rec["grad_deterministic"] is True and rec["grad_nonfinite"] == 0
        for n in names:  # the floor is the same in every kernel's record of the case
            assert rec[f"{n}_floor_err"] == flash[case][f"{n}_floor_err"] > 0
            assert rec[f"{n}_budget_multiple"] == rec[f"{n}_rel_err"] / rec[f"{n}_floor_err"]
    # per-token gradients in bf16 (the inputs' dtype) are at their floor, the fp32 sums far
    # below it (the floor rounds the tokens' terms, the fp32 recipe sums them in fp32)
    m = fp32["model_like"]
    assert 0.9 < m["dk_budget_multiple"] < 1.2 and m["dA_log_budget_multiple"] < 0.1
    assert all(r["status"] == "unsupported" and "no backward" in r["message"]
               for r in flash.values())


@pytest.mark.parametrize("name, rule", [
    ("grad_dk_scaled", "dk error above 5x the floor"),
    ("grad_drops_final_state", "dk error above 5x the floor"),
    ("grad_of_late_gate", "dg error above 5x the floor"),
    ("grad_detached", "without a gradient"),
    ("grad_nondeterministic", "two calls gave different gradient bits"),
])
def test_a_wrong_backward_fails_while_its_forward_passes(name, rule):
    kernel = load_kernel(f"tests/check_kernels.py:{name}")
    cases = _cases("model_like,varlen/mixed")
    plain = run_check([kernel], cases)
    assert [r["status"] for r in plain] == ["pass", "pass"]  # a forward check passes it
    for rec in run_check([kernel], cases, thresholds=GRAD):
        assert rec["status"] == "fail" and rule in rec["message"], rec["message"]
    if name == "grad_dk_scaled":  # 2 % on dk: about 12x the floor; the others untouched
        assert 8 < rec["dk_budget_multiple"] < 16 and rec["dq_budget_multiple"] < 1.5


# -- the gradient contracts (kdalab.check.contracts, "Gradients") ---------------------------------

GRAD_CONTRACTS = "contract/causal/*,contract/batch_varlen,contract/layout"


@pytest.mark.exact
def test_honest_backwards_keep_the_gradient_contracts():
    recs = run_check([load_kernel("recipe:fp32"), load_kernel("tests/check_kernels.py:"
                                                              "fp32_recurrence")],
                     _cases(GRAD_CONTRACTS), thresholds=GRAD)
    assert len(recs) == 12
    for rec in recs:
        if rec["kind"] == "layout" and rec["kernel"] != "recipe:fp32":  # one layout
            assert rec["status"] == "unsupported"
            continue
        assert rec["status"] == "pass", (rec["case"], rec["message"])
        assert "gradients" in rec["contract_compared"] and rec["grad_nonfinite"] == 0
        if rec["kind"] == "batch_varlen":  # judged against fp64, as an accuracy case
            assert all(rec[f"{n}_budget_multiple"] < 2 for n in GRADIENTS), rec
            assert rec["grad_contract_max_diff"] < 1e-5
        else:  # causal and layout: bit for bit, both directions of causality
            assert rec["grad_contract_max_diff"] == 0.0


@pytest.mark.parametrize("name, case, rule", [
    ("grad_upstream_leak", "contract/causal/inside",
     "changed when the upstream gradient before"),
    ("grad_sees_the_future", "contract/causal/boundary",
     "changed when later inputs did, with no gradient from"),
    ("grad_layout_sloppy", "contract/layout",
     "layout: the other state layout changed the gradients (dh0;"),
    ("grad_varlen_scaled", "contract/batch_varlen",
     "batch = varlen = separate (varlen gradients): dv error above 5x the floor"),
])
def test_a_gradient_contract_catches_what_accuracy_cannot(name, case, rule):
    kernel = load_kernel(f"tests/check_kernels.py:{name}")
    recs = {r["case"]: r for r in run_check([kernel], _cases(f"model_like,{case}"),
                                            thresholds=GRAD)}
    assert recs["model_like"]["status"] == "pass"  # every gradient within the budget
    assert recs[case]["status"] == "fail" and rule in recs[case]["message"], recs[case]
    assert recs[case]["grad_contract_max_diff"] > 0
    row = next(x for x in markdown_report(list(recs.values()), {}).splitlines()
               if x.startswith(f"| {case} |"))
    assert "; ∇ " in row and "✗ fail" in row  # the gradients' largest difference beside
    # the forward keeps the contract: without --grad the case passes
    assert [r["status"] for r in run_check([kernel], _cases(case))] == ["pass"]


def test_a_kernel_without_a_backward_is_unsupported_and_fails_the_run(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["check", "tests/check_kernels.py:no_backward", "--grad", "--device", "cpu",
              "--cases", "model_like,contract/causal/inside", "--out", str(out), "--quiet"])
    assert exc.value.code == 1
    recs = json.loads((out / "records.json").read_text())
    assert [r["status"] for r in recs] == ["unsupported", "unsupported"]
    assert recs[0]["message"] == "declared: no backward: a forward only (planted)"
    assert "no case ran" in (out / "report.md").read_text()


def test_the_cli_writes_the_gradient_table_and_refuses_what_it_cannot_judge(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["check", "recipe:fp32", "--grad", "--device", "cpu", "--cases", "model_like,T/17",
              "--out", str(out), "--quiet"])
    assert exc.value.code == 0
    report = (out / "report.md").read_text()
    assert "## Gradients" in report and "| `T/17` | ✓ recipe:fp32 |" in report
    assert "gradients judged" in report
    meta = json.loads((out / "check.json").read_text())
    assert meta["thresholds"]["gradients"] == "judged"
    # resuming it as a forward-only check is another check
    with pytest.raises(SystemExit) as exc:
        main(["check", "recipe:fp32", "--device", "cpu", "--cases", "model_like,T/17",
              "--out", str(out), "--resume", "--quiet"])
    assert exc.value.code == 2 and "thresholds" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["check", "recipe:fp32", "--grad", "--against", "recipe:fp64", "--device", "cpu",
              "--out", str(tmp_path / "f"), "--quiet"])
    assert exc.value.code == 2
    assert "--grad: with --against" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_poisoned_cases_judge_the_clean_sequences_and_not_the_sums():
    kernel = load_kernel("tests/check_kernels.py:nan_propagating")
    rec = run_check([kernel], _cases("nonfinite/nan_v"), thresholds=GRAD)[0]
    assert rec["dk_rel_err"] is not None and rec["dh0_rel_err"] is not None
    assert rec["dA_log_rel_err"] is None and rec["ddt_bias_floor_err"] is None


def test_isolated_and_in_process_grad_records_are_identical():
    from kdalab.check.isolate import run_isolated

    cases = _cases("model_like,contract/causal/inside")
    here = run_check([load_kernel("recipe:fp32")], cases, thresholds=GRAD)
    there = run_isolated(["recipe:fp32"], cases, suite="quick", device="cpu", thresholds=GRAD,
                         against=None)
    assert json.dumps(here) == json.dumps(there)


# -- the reports -------------------------------------------------------------------------------

def test_the_reports_show_a_gradient_row_per_kernel_and_the_floor():
    recs = run_check([load_kernel("recipe:fp32"),
                      load_kernel("tests/check_kernels.py:grad_dk_scaled")],
                     _cases("model_like"), thresholds=GRAD)
    rows = gradient_rows(recs)
    assert [r["kernel"] for r in rows] == ["floor", "recipe:fp32",
                                           "tests/check_kernels.py:grad_dk_scaled"]
    assert math.isnan(rows[0]["dk"][1]) and rows[0]["dk"][0] == recs[0]["dk_floor_err"]
    assert rows[2]["dk"] == (recs[1]["dk_rel_err"], recs[1]["dk_budget_multiple"])
    md = markdown_report(recs, {"complete": True})
    line = next(x for x in md.splitlines() if "grad_dk_scaled |" in x and "✗" in x)
    assert f"({recs[1]['dk_budget_multiple']:.1f}×)" in line
    assert "<h2>Gradients</h2>" in html_report(recs, {"complete": True})
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(terminal_table(recs))
    assert "∇ dk" in console.export_text()
    plain = run_check([load_kernel("recipe:fp32")], _cases("model_like"))
    assert gradient_rows(plain) == [] and "## Gradients" not in markdown_report(plain, {})


def test_the_kdalab_adapter_differentiates_through_chunk_kda(monkeypatch):
    """Under --grad kdalab's adapter calls kdalab.kernels.chunk_kda, its differentiable kernel,
    on leaves that require grad, in the convention (and in the other state layout where asked).
    A stand-in with chunk_kda's signature (the fp32 recipe) plays the kernel here, so that the
    adapter is tested on the CPU apart from the Triton backward."""
    import kdalab.kda as kda
    import kdalab.kernels as kernels

    calls = []

    def chunk_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                  A_log=None, dt_bias=None, lower_bound=-5.0, gate="raw", cu_seqlens=None,
                  use_qk_l2norm=True, beta_is_logits=True, state_layout="KV", config=None):
        calls.append({"leaves": all(t.requires_grad for t in (q, k, v, g, beta, A_log,
                                                               dt_bias)),
                      "state_layout": state_layout, "gate": gate})
        return kda.forward(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, A_log=A_log,
                           dt_bias=dt_bias, lower_bound=lower_bound, cu_seqlens=cu_seqlens,
                           use_qk_l2norm=use_qk_l2norm, state_layout=state_layout,
                           recipe="fp32")

    monkeypatch.setattr(kernels, "chunk_kda", chunk_kda, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the adapter then runs on the CPU
    kernel = load_kernel("kdalab")
    recs = run_check([kernel], _cases("model_like,varlen/mixed,prenorm"), thresholds=GRAD)
    assert [r["status"] for r in recs] == ["pass"] * 3, [r["message"] for r in recs]
    assert len(calls) == 6 and all(c["leaves"] and c["gate"] == "raw" for c in calls)
    x = case_inputs(_cases("model_like")[0])
    o, s, grads = kernel.in_other_layout().differentiate(x, *upstream(x, 0))
    assert calls[-1]["state_layout"] == "VK" and grads["dh0"].shape == x.initial_state.shape
    # chunk_kda takes the configuration too: kdalab-tf32 differentiates through it as well
    assert not load_kernel("kdalab-tf32").no_backward


@pytest.mark.gpu
def test_fla_backward_on_cuda_meets_its_own_tolerances_on_ordinary_inputs():
    """fla's chunk_kda backward, through check --grad (fla's Triton kernels do not run in the
    interpreter: its autotuner needs a GPU driver, and its intra-chunk kernel's ``gather``
    fails there). On ordinary inputs its gradients meet the tolerances of fla's own tests
    (issue 40's table: 8e-3 on dq, dk, dv, dh0, 2e-2 on dg and dβ; dA_log only warned on),
    finite and deterministic."""
    pytest.importorskip("fla.ops.kda")
    rec = run_check([load_kernel("fla")], _cases("model_like"), device="cuda",
                    thresholds=GRAD)[0]
    assert rec["status"] in ("pass", "fail"), rec["message"]
    assert rec["grad_nonfinite"] == 0 and rec["grad_deterministic"] is True
    for name, tolerance in (("dq", 8e-3), ("dk", 8e-3), ("dv", 8e-3), ("dh0", 8e-3),
                            ("dg", 2e-2), ("dbeta", 2e-2)):
        assert rec[f"{name}_rel_err"] <= tolerance, (name, rec[f"{name}_rel_err"])
