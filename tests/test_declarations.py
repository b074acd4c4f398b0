"""Every parameter parsed once, at its edge, with one range; what a kernel takes is its adapter's
declaration, and ``check`` and ``hunt`` refuse early (one line, exit 2) what a kernel cannot
take, instead of meeting the refusal inside the kernel; models, not names, inside a process."""

from __future__ import annotations

import pytest

from kdalab import params
from kdalab.check import KernelAdapter, load_kernel
from kdalab.check.builtin import BUILTIN
from kdalab.check.cases import QUICK, Case, case_inputs, select_cases
from kdalab.hunt import Bounds
from kdalab.inputs.sequences import SequenceSpec
from tests.check_kernels import honest_fp32
from tests.cli_run import cli

LB_RULE = "must be a finite number < 0"


# --- one parse, one range ---------------------------------------------------------------------

def test_a_lower_bound_range_is_parsed_once_by_params():
    assert params.lower_bound_range("-5:-1", "lb") == (-5.0, -1.0)
    assert params.lower_bound_range("-2", "lb") == (-2.0, -2.0)
    assert params.lower_bound_range((-3, -0.5), "lb") == (-3.0, -0.5)
    with pytest.raises(ValueError, match=r"^lb: the range '-1:-5' is reversed; LOW:HIGH"):
        params.lower_bound_range("-1:-5", "lb")
    for bad in ("0:1", "-1:0", "x", "-inf:-1", True):
        with pytest.raises(ValueError, match="^lb must be a number < 0 or a range LOW:HIGH"):
            params.lower_bound_range(bad, "lb")
    assert params.lower_bound("unbounded", "lb", unbounded=True) is None
    assert params.lower_bound(None, "lb", unbounded=True) is None
    with pytest.raises(ValueError, match="needs a bound"):
        params.lower_bound("unbounded", "lb")


@pytest.mark.parametrize("make", [
    lambda: Case("x", lower_bound=0.0),
    lambda: SequenceSpec(lower_bound=0.5),
    lambda: Bounds(lower_bound=(-1.0, 0.0)),
])
def test_every_layer_takes_the_one_rule(make):
    """A check case, a drawn sequence and a hunt's bounds refuse a lower bound >= 0 by the one
    rule of kdalab.params, in its words (they had three rules of their own)."""
    with pytest.raises(ValueError, match="must be a (finite )?number < 0"):
        make()


def test_a_hunts_bounds_take_text_as_the_command_line_gives_it():
    b = Bounds(dims="32-64:32", lower_bound="-4:-2", max_T="64")
    assert b.dims == (32, 64) and b.lower_bound == (-4.0, -2.0) and b.max_T == 64


# --- declarations ------------------------------------------------------------------------------

def test_an_adapter_declares_lower_bounds_and_gates():
    narrow = KernelAdapter(honest_fp32, lower_bound_range=(-1.0, 0.0), gates=("lower_bound",))
    assert narrow.declines(K=16, V=16, lower_bound=-0.5) is None
    assert narrow.declines(K=16, V=16, lower_bound=-2.0) == (
        "lower bound -2: takes lower bounds in [-1, 0)")
    assert narrow.declines(K=16, V=16, lower_bound=None, gate="unbounded") == (
        "the unbounded gate: takes lower_bound")
    both = KernelAdapter(honest_fp32, gates=("lower_bound", "unbounded"))
    assert both.declines(K=16, V=16, lower_bound=None, gate="unbounded") is None
    with pytest.raises(ValueError, match="gates must be one of lower_bound, unbounded"):
        KernelAdapter(honest_fp32, gates=("softplus",))
    with pytest.raises(ValueError, match="lower_bound_range must be"):
        KernelAdapter(honest_fp32, lower_bound_range=(-1.0, -2.0))
    # the case's inputs say the same as its parameters
    case = select_cases(QUICK, "lb/-2")[0]
    x = case_inputs(case, "cpu")
    assert narrow.declines_case(case) == narrow.unsupported(x) == (
        "lower bound -2: takes lower bounds in [-1, 0)")


def test_kdalabs_kernel_declares_the_lower_bounds_it_takes():
    """chunk_kda_fwd takes every lower bound < 0 and every gate (a chunk whose decay spans past
    the split exponent's range takes the per-pair path: docs/kernels.md), so its adapter
    declares no range; fla's safe gate takes [-5, 0) and says so."""
    kernel = BUILTIN["kdalab"]()
    assert kernel.lower_bound_range is None
    assert kernel.declines(K=64, V=64, lower_bound=-8.0) is None
    assert kernel.declines(K=64, V=64, lower_bound=None, gate="unbounded") is None
    fla = BUILTIN["fla"]()
    assert "takes lower bounds in [-5, 0)" in fla.declines(K=64, V=64, lower_bound=-8.0)


@pytest.fixture
def narrow(tmp_path) -> str:
    """A planted kernel (the fp32 recipe) whose adapter takes lower bounds in [-1, 0) only."""
    path = tmp_path / "narrow.py"
    path.write_text("from kdalab.check import KernelAdapter\n"
                    "from tests.check_kernels import honest_fp32\n\n"
                    "kernel = KernelAdapter(honest_fp32, lower_bound_range=(-1.0, 0.0))\n")
    return f"{path}:kernel"


def test_check_refuses_early_what_a_kernel_cannot_take(narrow, tmp_path, capsys):
    out = tmp_path / "c"
    code, _, err = cli(capsys, "check", narrow, "--device", "cpu", "--cases", "model_like,lb/-2",
                       "--out", str(out))
    assert code == 2 and err.strip() == (
        f"error: kernel '{narrow}' takes none of the 2 cases asked (model_like: lower bound -5: "
        "takes lower bounds in [-1, 0))"), err
    assert not out.exists()
    # some it takes: those run, the others are recorded as declared
    code, _, err = cli(capsys, "check", narrow, "--device", "cpu", "--no-isolate", "--cases",
                       "lb/-2,lb/-0.5", "--out", str(out), "--quiet")
    assert code == 0, err
    recs = {r["case"]: r for r in load_records(out)}
    assert recs["lb/-0.5"]["status"] == "pass"
    assert recs["lb/-2"]["status"] == "unsupported"
    assert recs["lb/-2"]["message"] == "declared: lower bound -2: takes lower bounds in [-1, 0)"


def load_records(out):
    from kdalab.check.records import read

    return read(out)


def test_hunt_refuses_early_a_lower_bound_the_kernel_cannot_take(narrow, tmp_path, capsys):
    out = tmp_path / "h"
    code, _, err = cli(capsys, "hunt", narrow, "--device", "cpu", "--trials", "1",
                       "--lower-bound", "-8:-0.5", "--dims", "16", "--out", str(out))
    assert code == 2 and err.strip() == (
        "error: --lower-bound -8:-0.5 reaches beyond what " + narrow + " takes (lower bound -8: "
        "takes lower bounds in [-1, 0))"), err
    assert not out.exists()
    code, _, err = cli(capsys, "hunt", narrow, "--device", "cpu", "--trials", "1",
                       "--lower-bound", "-1:-0.5", "--dims", "16", "--max-T", "32",
                       "--max-heads", "1", "--out", str(out), "--quiet")
    assert code == 0, err


def test_a_recipe_takes_every_lower_bound():
    assert load_kernel("recipe:fp32").declines(K=16, V=16, lower_bound=-20.0) is None


# --- models, not names --------------------------------------------------------------------------

def test_a_group_runs_on_models_without_looking_names_up(monkeypatch):
    """launch_group is given models (parsed at the edge): no name is looked up while it runs
    (the L's model went name -> model -> name -> model)."""
    import kdalab.arith.registry as registry
    import kdalab.kda.recipe as recipe
    import kdalab.studies.inverse as inverse
    from kdalab.inputs.runs import Run

    models = params.accumulations("h200,fp16-seq", "accumulations")
    looked_up = []
    real = registry.get_accumulation

    def counting(name):
        if isinstance(name, str):
            looked_up.append(name)
        return real(name)

    for module in (registry, recipe, inverse):
        monkeypatch.setattr(module, "get_accumulation", counting)
    records = inverse.run_group([Run("floor", -5.0, 8, 0, 16)], models)
    assert [r["accumulation"] for r in records] == ["h200", "fp16-seq"]
    assert [r["l_accumulation"] for r in records] == ["h200-sgemm", "fp32"]
    assert looked_up == []
