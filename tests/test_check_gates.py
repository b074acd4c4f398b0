"""check's gate groups and the fp16 guard's causal case (issue 41): the unbounded-gate,
strong-decay and log-decay groups run on the reference and the recipes; a split exponent without
a safe path fails the strong-decay cases; a kernel that ignores the gate mode fails the groups; a
kernel whose fp16 guard recomputes the past fails the new causal case, which fresh inputs never
trip; kernels that do not take a mode declare it."""

from __future__ import annotations

import math

import pytest
import torch

from kdalab.check import KernelAdapter, load_kernel, run_check, select_cases
from kdalab.check.cases import FULL, QUICK, Case, case_inputs
from kdalab.check.replay import replay_cases, write_inputs

MOD = "tests.check_kernels"
GROUPS = "unbounded/*,strong_decay/*,log_decay/*"
#: accuracy cases of the groups whose decay leaves float32's exp range within a 16-token chunk
STRONG = {"unbounded/saturated", "unbounded/strongest", "strong_decay/unbounded",
          "strong_decay/log_decay", "strong_decay/at_-20", "strong_decay/mixed",
          "strong_decay/mixed_bf16"}


def _by(records, **match):
    return [r for r in records if all(r[k] == v for k, v in match.items())]


def test_the_groups_are_in_both_suites_with_their_gates():
    for suite in (QUICK, FULL):
        groups = select_cases(suite, GROUPS)
        gates = {c.name: c.gate for c in groups}
        assert {c.name for c in groups if c.kind == "accuracy"} >= STRONG
        assert all(g == "unbounded" for n, g in gates.items() if n.startswith("unbounded/"))
        assert {gates[n] for n in gates if n.startswith("strong_decay/")} == \
            {"unbounded", "log_decay"}
        assert all(g == "log_decay" for n, g in gates.items() if n.startswith("log_decay/"))
        assert all(c.lower_bound is None for c in groups if c.gate == "unbounded")
        guard = select_cases(suite, "contract/causal/fp16_guard")[0]
        assert guard.kind == "causal" and guard.perturb == "v_beyond_fp16"
    assert select_cases(FULL, "contract/causal/fp16_guard_long")[0].T == 65536


@pytest.mark.parametrize("suite", [QUICK, FULL])
def test_the_strongest_case_overflows_a_split_exponent(suite):
    """unbounded/strongest: every 16-token chunk spans more than float32's exp range, so
    exp(G_i)·exp(-G_j) overflows there without a safe path (the fp64 gate of its inputs)."""
    from kdalab.kda import log_decay

    case = select_cases(suite, "unbounded/strongest")[0]
    x = case_inputs(replace_shape(case))
    decay = log_decay(x.g, gate="unbounded", A_log=x.A_log, dt_bias=x.dt_bias)
    span = -decay[:, :16].sum(1)  # the first chunk, per head and channel
    assert float(span.min()) > math.log(torch.finfo(torch.float32).max)  # 88.7


def replace_shape(case: Case) -> Case:
    """The case at a small T (the decay's distribution does not depend on it)."""
    from dataclasses import replace

    return replace(case, T=32)


@pytest.fixture(scope="module")
def gate_records():
    kernels = [load_kernel(f"{MOD}:{n}") for n in ("honest_fp32", "fp32_recurrence",
                                                     "ignores_the_gate_mode", "vk_adapter")]
    kernels += [load_kernel("recipe:fp64"), load_kernel("recipe:fp32"),
                load_kernel(f"{MOD}:honest_decode")]
    return run_check(kernels, select_cases(QUICK, GROUPS))


@pytest.mark.parametrize("kernel", [f"{MOD}:honest_fp32", f"{MOD}:fp32_recurrence",
                                    "recipe:fp64", f"{MOD}:honest_decode"])
def test_safe_kernels_pass_every_gate_case(gate_records, kernel):
    recs = _by(gate_records, kernel=kernel)
    assert len(recs) == len(select_cases(QUICK, GROUPS))
    ran = [r for r in recs if r["status"] != "unsupported"]
    assert all(r["status"] == "pass" for r in ran), [(r["case"], r["message"]) for r in ran]
    # unsupported only where the kernel has no decode function
    assert {r["case"] for r in recs if r["status"] == "unsupported"} <= {"unbounded/decode"}
    if kernel.endswith("honest_decode"):
        assert _by(recs, case="unbounded/decode")[0]["status"] == "pass"


def test_a_split_exponent_overflows_on_the_strong_cases(gate_records):
    """recipe:fp32 forms exp(G_i)·exp(-G_j) from the chunk's start (FlashKDA's tiles): fine while
    the decay is bounded, non-finite where a chunk spans past float32's range."""
    recs = {r["case"]: r for r in _by(gate_records, kernel="recipe:fp32")}
    for name in STRONG:
        assert recs[name]["status"] == "fail" and "non-finite" in recs[name]["message"], name
    for name in ("unbounded/model_like", "unbounded/varlen", "unbounded/collinear",
                 "log_decay/model_like", "log_decay/unbounded"):
        assert recs[name]["status"] == "pass", (name, recs[name]["message"])
    assert "non-finite output from finite inputs" in recs["unbounded/causal"]["message"]
    for name in ("unbounded/causal_wide", "log_decay/causal_wide"):  # past the range after P
        assert "non-finite output from finite inputs" in recs[name]["message"], name


def test_a_kernel_that_ignores_the_gate_mode_fails_the_groups(gate_records):
    recs = _by(gate_records, kernel=f"{MOD}:ignores_the_gate_mode")
    accuracy = [r for r in recs if r["kind"] == "accuracy"]
    assert accuracy and all(r["status"] == "fail" and "above 5x the floor" in r["message"]
                            for r in accuracy), [(r["case"], r["status"]) for r in accuracy]


def test_kernels_declare_the_gates_they_do_not_take(gate_records):
    recs = _by(gate_records, kernel=f"{MOD}:vk_adapter")  # FlashKDA's conventions
    assert recs and all(r["status"] == "unsupported" for r in recs)
    assert _by(recs, case="unbounded/model_like")[0]["message"] == \
        "declared: the unbounded gate: takes lower_bound"
    assert _by(recs, case="log_decay/model_like")[0]["message"] == \
        "declared: the log_decay gate: takes lower_bound"


def _plain(q, k, v, g, beta, *, scale, initial_state, output_final_state, A_log, dt_bias,
           lower_bound, cu_seqlens):
    raise AssertionError("not called: it takes no gate keyword")


def test_a_log_decay_case_needs_a_gate_keyword():
    recs = run_check([KernelAdapter(_plain, name="plain")],
                     select_cases(QUICK, "log_decay/model_like"))
    assert recs[0]["status"] == "unsupported"
    assert recs[0]["message"] == ("declared: takes no gate keyword (g as the log-decay: "
                                  "gate='log_decay')")


def test_records_keep_the_gate_and_store_a_missing_bound(tmp_path):
    from typer.testing import CliRunner

    from kdalab.check.records import read
    from kdalab.cli import app

    res = CliRunner().invoke(app, ["check", "recipe:fp64", "--device", "cpu", "--cases",
                                   "unbounded/model_like,log_decay/*,model_like", "--out",
                                   str(tmp_path), "--quiet"])
    assert res.exit_code == 0, res.output
    recs = {r["case"]: r for r in read(tmp_path)}
    assert recs["unbounded/model_like"]["gate"] == "unbounded"
    assert recs["unbounded/model_like"]["lower_bound"] is None or \
        math.isnan(recs["unbounded/model_like"]["lower_bound"])
    assert recs["log_decay/model_like"]["gate"] == "log_decay"
    assert recs["log_decay/model_like"]["lower_bound"] == -5.0  # the promise
    assert recs["log_decay/model_like"]["g_dtype"] == "fp32"
    assert recs["model_like"]["gate"] == "lower_bound"


# -- the fp16 guard's causal case ------------------------------------------------------------

@pytest.fixture(scope="module")
def causal_records():
    names = ("honest_fp32", "fp32_recurrence", "guard_redoes_the_sequence")
    return run_check([load_kernel(f"{MOD}:{n}") for n in names],
                     select_cases(QUICK, "contract/causal/*"))


def test_a_guard_that_recomputes_the_past_fails_the_fp16_case_only(causal_records):
    recs = {r["case"]: r for r in _by(causal_records, kernel=f"{MOD}:guard_redoes_the_sequence")}
    guard = recs["contract/causal/fp16_guard"]
    # the whole sequence was recomputed: the very first token changed
    assert guard["status"] == "fail" and "first at t = 0, sequence 0, head 0" in \
        guard["message"], guard["message"]
    assert "v times 100000 at t >= 37" in guard["contract_compared"]
    assert guard["contract_max_diff"] > 0
    # fresh N(0, 1) values after P never leave fp16's range: the old cases cannot see it
    for name in ("contract/causal/boundary", "contract/causal/inside", "contract/causal/tail"):
        assert recs[name]["status"] == "pass", name


@pytest.mark.parametrize("kernel", ["honest_fp32", "fp32_recurrence"])
def test_a_correct_kernel_keeps_every_bit_under_the_fp16_case(causal_records, kernel):
    recs = _by(causal_records, kernel=f"{MOD}:{kernel}")
    assert {r["status"] for r in recs} == {"pass"}
    assert all(r["contract_max_diff"] == 0.0 for r in recs)


def test_the_fp16_case_writes_v_past_fp16_from_the_split_on():
    from kdalab.check.contracts import _perturbed

    case = select_cases(QUICK, "contract/causal/fp16_guard")[0]
    x = case_inputs(case)
    y = _perturbed(x, case.split, case.seed + 1, case.perturb)
    assert torch.equal(y.v[:, :case.split], x.v[:, :case.split])
    assert float(y.v[:, case.split:].float().abs().max()) > torch.finfo(torch.float16).max
    for name in ("q", "k", "g", "beta"):
        assert torch.equal(getattr(y, name), getattr(x, name))


@pytest.mark.parametrize("name", ["unbounded/causal_wide", "log_decay/causal_wide"])
def test_the_wide_case_writes_a_log_decay_of_20_a_step_from_the_split_on(name):
    from kdalab.check.contracts import STRONG_DECAY, _perturbed
    from kdalab.kda.gate import prepare_inputs

    case = select_cases(QUICK, name)[0]
    x = case_inputs(case)
    y = _perturbed(x, case.split, case.seed + 1, case.perturb)
    assert torch.equal(y.g[:, :case.split], x.g[:, :case.split])
    for name_ in ("q", "k", "v", "beta"):
        assert torch.equal(getattr(y, name_), getattr(x, name_))

    def log_decay(z):
        return prepare_inputs(z.q.double(), z.k.double(), z.v.double(), z.g.double(),
                              z.beta.double(), A_log=z.A_log, dt_bias=z.dt_bias,
                              lower_bound=z.lower_bound, gate=z.gate).log_decay

    p, c0 = case.split, case.split // 16 * 16  # P and its 16-token chunk's first row
    before, changed = log_decay(x), log_decay(y)  # [B, H, T, K]
    after = changed[:, :, p:]
    # -20 a step within bf16's rounding of the raw input (the unbounded gate's softplus)
    assert torch.allclose(after, torch.full_like(after, -STRONG_DECAY), rtol=1e-2)
    # P's chunk: within a split exponent's range (80) before P, past it with the change
    assert float(before[:, :, c0:p].sum(2).min()) > -80
    assert float(changed[:, :, c0:c0 + 16].sum(2).max()) < -80
    with pytest.raises(ValueError, match="perturb"):
        Case("bounded", kind="causal", split=3, perturb="decay_past_split")


# -- replay keeps the gate ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["unbounded/model_like", "log_decay/unbounded",
                                  "strong_decay/mixed_bf16", "model_like"])
def test_a_case_file_keeps_its_gate(tmp_path, name):
    case = select_cases(QUICK, name)[0]
    x = case_inputs(case)
    write_inputs(tmp_path / "c.safetensors", x.tensors(), lower_bound=x.lower_bound,
                 scale=x.scale, gate=x.gate)
    (again,) = replay_cases(tmp_path)
    assert (again.gate, again.lower_bound, again.g_dtype) == (case.gate, case.lower_bound,
                                                             case.g_dtype)
    y = case_inputs(again)
    assert y.gate == x.gate and y.lower_bound == x.lower_bound
    for n, t in x.tensors().items():
        assert torch.equal(getattr(y, n), t), n


def test_capture_writes_each_gate_and_check_replays_it(tmp_path):
    import kdalab.kda as kda
    from kdalab.check.capture import capture
    from kdalab.inputs.sequences import SequenceSpec, draw

    x = draw(SequenceSpec(T=24, heads=2, K=16, V=16, lower_bound=None), 0)
    ld = draw(SequenceSpec(T=24, heads=2, K=16, V=16, lower_bound=None, g_as_log_decay="fp32"),
              0)["g"]
    args = (x["q"], x["k"], x["v"])
    with capture("kdalab.kda:forward", tmp_path / "cap") as cap:
        kda.forward(*args, x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                    lower_bound=None, gate="unbounded", recipe="fp32")
        kda.forward(*args, ld, x["beta"], lower_bound=None, gate="log_decay", recipe="fp32")
    assert cap.skipped == {} and len(cap.paths) == 2
    cases = replay_cases(tmp_path / "cap")
    assert [(c.gate, c.lower_bound, c.g_dtype) for c in cases] == [
        ("unbounded", None, "bf16"), ("log_decay", None, "fp32")]
    recs = run_check([load_kernel(f"{MOD}:honest_fp32")], cases)
    assert [r["status"] for r in recs] == ["pass", "pass"], [r["message"] for r in recs]


# -- fla's own recurrent kernel, interpreted: the peers' gate mapping ---------------------------

_FLA_CHILD = '''
from dataclasses import replace
from kdalab import peers
from kdalab.check import select_cases
from kdalab.check.calls import rel
from kdalab.check.cases import QUICK, case_inputs, reference
for name in ("model_like", "unbounded/model_like", "log_decay/unbounded", "strong_decay/mixed"):
    x = case_inputs(replace(select_cases(QUICK, name)[0], T=24))
    ref_o, ref_s = reference(x)
    kw = dict(scale=x.scale, initial_state=x.initial_state, output_final_state=True,
              A_log=x.A_log, dt_bias=x.dt_bias, lower_bound=x.lower_bound, cu_seqlens=None)
    if x.gate == "log_decay":
        kw["gate"] = "log_decay"
    o, s = peers.fla_fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, **kw)
    print(name, rel(o, ref_o), rel(s, ref_s), rel(ref_o.bfloat16(), ref_o))
    if x.gate == "unbounded":  # the same inputs through the lower-bound gate: far off
        o, s = peers.fla_fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, **{**kw,
                                             "lower_bound": -5.0})
        print(name + "~lb", rel(o, ref_o), rel(s, ref_s), rel(ref_o.bfloat16(), ref_o))
'''


def test_fla_recurrent_takes_each_gate_as_mapped(tmp_path):
    """fla's fused_recurrent_kda (its Triton code, interpreted on the CPU) through kdalab.peers
    on each gate mode, against the fp64 reference: the mapping to use_gate_in_kernel and
    lower_bound is right where the errors are rounding, and a wrong gate is far off."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    pytest.importorskip("fla.ops.kda")
    proc = subprocess.run([sys.executable, "-c", _FLA_CHILD], capture_output=True, text=True,
                          env=dict(os.environ, TRITON_INTERPRET="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r[0]: [float(v) for v in r[1:]] for r in map(str.split, proc.stdout.splitlines())}
    assert len(rows) == 6, proc.stdout
    for name, (o_err, s_err, floor) in rows.items():
        if name.endswith("~lb"):
            assert o_err > 0.05 and s_err > 0.05, (name, o_err, s_err)
            continue
        # bf16 output: within check's default budget of the bf16 floor; the fp32 state: fp32
        # rounding over 24 steps (measured 5e-8 to 5e-7), far below a wrong decay's O(1)
        assert o_err < 5 * floor and s_err < 1e-5, (name, o_err, s_err, floor)


# -- kdalab's Triton kernel, interpreted: what issue 41 asks of it ------------------------------

def _kdalab_interpreted(tmp_path, cases: str, *extra: str) -> list[dict]:
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    proc = subprocess.run(
        [sys.executable, "-c", "from kdalab.cli import main; main()", "check", "kdalab",
         "--device", "cpu", "--suite", "quick", "--cases", cases, "--out", str(tmp_path),
         "--json", *extra], capture_output=True, text=True, timeout=900,
        env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)["records"]


def test_kdalab_is_bit_causal_in_the_interpreter(tmp_path):
    # before the guard's redo resumed at its first non-finite step, contract/causal/fp16_guard
    # failed: outputs changed from t = 0 (4.9e-4); before a wide chunk kept the split for its
    # rows within the range (20cf247), */causal_wide failed: from t = 32 (2.4e-4)
    recs = _kdalab_interpreted(tmp_path, "contract/causal/*,*/causal_wide")
    assert len(recs) == 6
    assert {r["status"] for r in recs} == {"pass"}, [(r["case"], r["message"]) for r in recs]


def test_kdalab_gradients_keep_the_contracts_in_the_interpreter(tmp_path):
    # before 20cf247 stage 1's backward anchored its split exponent at the chunk's midpoint
    # (the last row's decay): dA_log, ddt_bias and dg before P moved by 3e-8 when later gates
    # changed, with no gradient from P on (contract/causal/inside and tail)
    recs = _kdalab_interpreted(tmp_path, "contract/causal/inside,contract/causal/tail,"
                                         "contract/layout,*/causal_wide", "--grad")
    assert len(recs) == 5
    assert {r["status"] for r in recs} == {"pass"}, [(r["case"], r["message"]) for r in recs]
    assert all(r["grad_contract_max_diff"] == 0.0 and r["grad_deterministic"] is not False
               for r in recs)


def test_kdalab_takes_every_gate_in_the_interpreter(tmp_path):
    recs = _kdalab_interpreted(tmp_path, "unbounded/model_like,unbounded/strongest,"
                                         "strong_decay/mixed_bf16,log_decay/*")
    assert {r["status"] for r in recs} == {"pass"}, [(r["case"], r["message"]) for r in recs]
