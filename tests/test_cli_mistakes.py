"""Held-out mistakes of issue 21, each through the command line's error boundary: one ``error:``
line on stderr, exit code 2, and nothing made in --out. --redraw takes no option that would
change the data (one rule in kdalab.cli.stored for every command); --resume with --force is
refused by every command with a store; an empty value is not the default; damaged stores and
captured inputs are one line, not a traceback."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.cli_run import cli


def one_error(code: int, err: str, says: str) -> None:
    lines = err.strip("\n").splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert says in lines[0], lines[0]


TAKES_NO = "--redraw draws from the stored records: it takes no "
MISTAKES = [
    # --redraw: every option that would change the data is named, by every command alike
    (["run", "end-to-end", "--redraw", "--chunks", "8", "--seeds", "1"],
     TAKES_NO + "--chunks, --seeds"),
    (["run", "end-to-end", "--redraw", "--quick"], TAKES_NO + "--quick"),
    (["run", "end-to-end", "--redraw", "--device", "cpu"], TAKES_NO + "--device"),
    (["run", "dynamic-range", "--redraw", "--formats", "bf16"], TAKES_NO + "--formats"),
    (["run", "dynamic-range", "--redraw", "--resume"], TAKES_NO + "--resume"),
    (["run", "diagonal-tile", "--redraw", "--seeds", "0", "--force"],
     TAKES_NO + "--seeds, --force"),
    (["run", "inverse-stability", "--redraw", "--dim", "8"], TAKES_NO + "--dim"),
    (["sweep", "--redraw", "--backend", "ray"], TAKES_NO + "--backend"),
    # the folder in the place of an argument: the one-line answer says the form
    (["sweep", "--redraw", "{tmp}/c.toml"],
     TAKES_NO + "CONFIG; it takes its folder as '--redraw --out PATH'"),
    (["check", "--redraw", "recipe:fp32"],
     TAKES_NO + "KERNELS; it takes its folder as '--redraw --out PATH'"),
    (["run", "end-to-end", "--redraw", "{tmp}/missing"],
     "/missing) (--redraw takes the folder as '--redraw --out PATH')"),
    (["run", "diagonal-tile", "--redraw", "{tmp}"],
     "--redraw PATH and --out both name the folder: give it once, '--redraw --out PATH'"),
    (["check", "--redraw", "--budget", "3"], TAKES_NO + "--budget"),
    # --resume keeps what --out holds, --force throws it away: never both
    *[(command + ["--resume", "--force"],
       "--resume keeps the records in --out and --force replaces them: give one")
      for command in (["sweep", "--chunks", "4", "--seeds", "0", "--dims", "8"],
                      ["reproduce", "--chunks", "4"], ["run", "end-to-end", "--quick"],
                      ["run", "dynamic-range"], ["run", "diagonal-tile"],
                      ["run", "inverse-stability", "--quick"],
                      ["check", "recipe:fp32", "--device", "cpu"],
                      ["hunt", "recipe:fp32", "--device", "cpu", "--trials", "1"])],
    # an empty value is a mistake, not the default
    (["hunt", "recipe:fp32", "--device", "cpu", "--trials", "1", "--dims", ""],
     "--dims has an empty item in ''; expected a comma-separated list"),
    (["hunt", "recipe:fp32", "--device", "cpu", "--trials", "1", "--lower-bound", ""],
     "--lower-bound must be a number < 0 or a range LOW:HIGH of them, got ''"),
    (["hunt", "recipe:fp32", "--device", "", "--trials", "1"],
     "--device must be cpu, cuda or cuda:N; got ''"),
    (["check", "recipe:fp32", "--device", ""], "--device must be cpu, cuda or cuda:N; got ''"),
    # an option the run would ignore, beside the one that voids it (was: silently ignored)
    (["check", "recipe:fp32", "--against", "recipe:fp64", "--budget", "3"],
     "--budget: with --against a case is judged by its bit-identical outputs"),
    (["check", "recipe:fp32", "--min-identical", "0.5"],
     "--min-identical judges the fidelity mode only (--against KERNEL)"),
    (["check", "recipe:fp32", "--suite", "full", "--inputs", "{tmp}/c.toml"],
     "--suite: --inputs grades the captured inputs instead of a suite"),
    (["check", "recipe:fp32", "--suite", "", "--device", "cpu"], "suite must be one of quick"),
    # a shape too large for memory, refused before anything runs (was: killed by the system)
    (["run", "end-to-end", "--quick", "--heads", "100000"], "--heads 100000, --long-length 256"),
    (["run", "end-to-end", "--quick", "--dim", "100000"], "--dim 100000 and --chunks up to 64"),
    (["run", "end-to-end", "--quick", "--length", "99999999999", "--families", "model_like"],
     "--length 99999999999"),
    (["run", "end-to-end", "--quick", "--chunks", "100000"], "--chunks up to 100000: one "),
    (["run", "inverse-stability", "--quick", "--dim", "999999999"],
     "--dim: keys of dimension 999,999,999 do not fit"),
    # a dimension too large names the dimension, not the chunks (was: "choose chunk sizes up
    # to about 3" for a dimension of 10^8)
    (["sweep", "--dims", "99999999", "--chunks", "4", "--seeds", "0"],
     "--dims: a dimension of 99999999 with chunks up to 4 needs about"),
    (["reproduce", "--dim", "99999999"], "--dim: a dimension of 99999999 with chunks up to"),
    (["run", "diagonal-tile", "--dim", "10000000", "--chunks", "2"],
     "--dim: a dimension of 10000000 with chunks up to 2 needs about"),
]


@pytest.mark.parametrize("args,says", MISTAKES, ids=[" ".join(a)[:70] for a, _ in MISTAKES])
def test_a_held_out_mistake_is_one_line_and_exit_2(args, says, tmp_path, capsys):
    (tmp_path / "c.toml").write_text("chunks = 4\n")
    args = [a.format(tmp=tmp_path) for a in args]
    args += ["--out", str(tmp_path / "o")]
    code, _, err = cli(capsys, *args)
    one_error(code, err, says)
    assert not (tmp_path / "o").exists()


def test_every_command_with_a_store_takes_its_folder_alike(tmp_path, capsys):
    """--redraw --out PATH everywhere, and its short forms --redraw PATH and --redraw=PATH (the
    sweep took only these; the others only the first)."""
    made = {"sweep": ["sweep", "--chunks", "4", "--seeds", "0", "--dims", "8"],
            "run diagonal-tile": ["run", "diagonal-tile", "--chunks", "2"],
            "check": ["check", "recipe:fp32", "--device", "cpu", "--cases", "T/1",
                      "--no-isolate"]}
    for name, args in made.items():
        out = tmp_path / name.replace(" ", "-")
        assert cli(capsys, *args, "--out", str(out), "--quiet")[0] == 0
        for form in (["--redraw", "--out", str(out)], ["--redraw", str(out)],
                     [f"--redraw={out}"]):
            code, _, err = cli(capsys, *name.split(), *form, "--quiet")
            assert code == 0 and not err, (name, form, err)
    # a folder that does not exist is said to hold no store, whichever form names it
    for command in (["sweep"], ["run", "diagonal-tile"]):
        code, _, err = cli(capsys, *command, "--redraw", str(tmp_path / "missing"))
        one_error(code, err, f"{tmp_path / 'missing'} holds no kdalab store")


def test_redraw_with_only_quiet_and_json_draws(tmp_path, capsys):
    out = tmp_path / "s"
    assert cli(capsys, "sweep", "--chunks", "4", "--seeds", "0", "--dims", "8", "--out",
               str(out), "--quiet")[0] == 0
    code, _, err = cli(capsys, "sweep", "--redraw", str(out), "--json", "--quiet")
    assert code == 0 and (out / "records.json").exists(), err


@pytest.mark.parametrize("field,value", [("runs", "x"), ("schema", 5), ("views", [1]),
                                         ("config", []), ("records_per_run", True)])
def test_a_manifest_field_of_the_wrong_type_is_one_line(field, value, tmp_path, capsys):
    out = tmp_path / "s"
    assert cli(capsys, "sweep", "--chunks", "4", "--seeds", "0", "--dims", "8", "--out",
               str(out), "--quiet")[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, field: value}))
    for args in (["sweep", "--redraw", str(out)], ["sweep", "--resume", "--out", str(out)],
                 ["run", "diagonal-tile", "--redraw", "--out", str(out)]):
        code, _, err = cli(capsys, *args)
        one_error(code, err, "unreadable manifest.json (TypeError); --force starts")


@pytest.mark.parametrize("bounds", [{}, {"dims": [64]}, None])
def test_a_damaged_hunt_json_is_one_line(bounds, tmp_path, capsys):
    meta = {"target": "recipe:fp32", "seed": 0, "threshold": 0.01}
    if bounds is not None:
        meta["bounds"] = bounds
    (tmp_path / "hunt.json").write_text(json.dumps(meta))
    code, _, err = cli(capsys, "hunt", "recipe:fp32", "--resume", "--trials", "1", "--out",
                       str(tmp_path))
    one_error(code, err, "--resume: ")
    assert "is not a hunt's description" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hunt.json"]


def _captured(path, **change) -> None:
    from safetensors.torch import save_file

    shape = (1, 4, 2, 8)  # B, T, H, K = V
    tensors = {"q": torch.randn(shape), "k": torch.randn(shape), "v": torch.randn(shape),
               "g": -torch.rand(shape), "beta": torch.rand(1, 4, 2), "A_log": torch.zeros(2),
               "dt_bias": torch.zeros(2, 8), **change}
    save_file(tensors, str(path), metadata={"lower_bound": "-5"})


@pytest.mark.parametrize("change,says", [
    ({"dt_bias": torch.zeros(2, 64)}, "dt_bias must hold H × K = 2 × 8 values"),
    ({"cu_seqlens": torch.tensor([0.0, 1.5, 4.0])}, "cu_seqlens must be one row of integers"),
])
def test_captured_inputs_of_the_wrong_shape_are_one_line(change, says, tmp_path, capsys):
    _captured(tmp_path / "x.safetensors", **change)
    code, _, err = cli(capsys, "check", "recipe:fp32", "--device", "cpu", "--inputs",
                       str(tmp_path / "x.safetensors"), "--out", str(tmp_path / "o"))
    one_error(code, err, f"--inputs: '{tmp_path / 'x.safetensors'}': {says}")
    assert not (tmp_path / "o").exists()


def test_an_interrupted_hunt_says_how_to_go_on(tmp_path, capsys, monkeypatch):
    import kdalab.cli.hunt as hunt
    from kdalab.cli.app import Interrupted

    def interrupted(cfg, target, sink, quiet, history):
        raise Interrupted()

    monkeypatch.setattr(hunt, "_search", interrupted)
    code, _, err = cli(capsys, "hunt", "recipe:fp32", "--device", "cpu", "--trials", "3",
                       "--out", str(tmp_path / "h"))
    assert code == 130, err
    assert err.strip() == (f"interrupted: 0 trials and the worst so far in {tmp_path / 'h'}/; "
                           f"'kdalab hunt recipe:fp32 --out {tmp_path / 'h'} --resume' "
                           "continues the hunt")


def test_a_study_interrupted_before_its_first_record_claims_nothing(tmp_path, capsys,
                                                                      monkeypatch):
    """The store removes the folder it began when nothing was stored: the line must not point
    at a folder (and a --resume) that no longer exists."""
    import kdalab.runner
    from kdalab.cli.app import Interrupted

    def interrupted(*args, **kwargs):
        raise Interrupted()

    monkeypatch.setattr(kdalab.runner, "run_into_store", interrupted)
    out = tmp_path / "dt"
    code, _, err = cli(capsys, "run", "diagonal-tile", "--chunks", "2", "--out", str(out),
                       "--quiet")
    assert code == 130 and err.strip() == "interrupted: nothing was kept", err
    assert not out.exists()


def test_a_hunt_of_a_kernel_that_breaks_the_convention_leaves_nothing(tmp_path, capsys):
    kernel = tmp_path / "k.py"
    kernel.write_text("def forward(q, k, v, g, beta, **kw):\n    return None\n")
    out, mine = tmp_path / "h", tmp_path / "empty"
    mine.mkdir()
    for folder in (out, mine):  # a folder the hunt made goes; the user's own stays, empty
        code, _, err = cli(capsys, "hunt", f"{kernel}:forward", "--device", "cpu", "--trials",
                           "1", "--out", str(folder))
        one_error(code, err, f"kernel '{kernel}:forward' returned a NoneType")
    assert not out.exists() and list(mine.iterdir()) == []


def test_a_hunt_folder_another_process_writes_is_refused(tmp_path, capsys):
    """One hunt at a time in a folder, as every store: a second one (fresh or --resume) was
    interleaved, or deleted the first one's trials while it ran."""
    import os

    from kdalab.records.identity import lock

    out = tmp_path / "h"
    args = ["hunt", "recipe:fp32", "--device", "cpu", "--trials", "1", "--out", str(out),
            "--quiet", "--gates", "lower_bound"]  # (unbounded, its chunk-start tiles overflow)
    assert cli(capsys, *args)[0] == 0
    held = lock(out)  # as the other process would
    try:
        for extra in ([], ["--resume"]):
            code, _, err = cli(capsys, *args, *extra)
            one_error(code, err, f"{out} is being written by another kdalab process")
    finally:
        os.close(held)
    assert cli(capsys, *args, "--resume")[0] == 0
    assert len((out / "trials.jsonl").read_text().splitlines()) == 2


def test_a_check_json_that_is_not_an_object_is_redrawn_from_the_store(tmp_path, capsys):
    out = tmp_path / "c"
    args = ["--out", str(out), "--quiet"]
    assert cli(capsys, "check", "recipe:fp32", "--device", "cpu", "--cases", "T/1", *args)[0] == 0
    (out / "check.json").write_text("[1]\n")  # damaged by hand: was a TypeError traceback
    code, _, err = cli(capsys, "check", "--redraw", *args)
    assert code == 0 and err == "", err


def test_a_resume_whose_trials_do_not_replay_changes_nothing(tmp_path, capsys):
    out = tmp_path / "h"
    args = ["hunt", "recipe:fp32", "--device", "cpu", "--trials", "1", "--out", str(out),
            "--quiet", "--gates", "lower_bound"]  # (unbounded, its chunk-start tiles overflow)
    assert cli(capsys, *args)[0] == 0
    first = json.loads((out / "trials.jsonl").read_text())
    (out / "trials.jsonl").write_text(json.dumps({**first, "params": {"bogus": 1}}) + "\n")
    meta = (out / "hunt.json").read_text()
    code, _, err = cli(capsys, *args, "--resume")
    one_error(code, err, "--resume: trial 0's parameters do not fit the bounds")
    assert (out / "hunt.json").read_text() == meta  # no run of the failed resume listed


def test_an_interrupt_while_the_views_are_drawn_says_every_record_is_kept(tmp_path, capsys,
                                                                          monkeypatch):
    """It said 'nothing was kept' (a study) or '... --resume continues with the rest' (check)
    once every record was stored."""
    import kdalab.cli.check as check
    import kdalab.cli.dynamic_range as studies
    from kdalab.cli.app import Interrupted

    def interrupted(*args, **kwargs):
        raise Interrupted()

    out = tmp_path / "dt"
    with monkeypatch.context() as m:
        m.setattr(studies, "_diagonal_tile_views", interrupted)
        code, _, err = cli(capsys, "run", "diagonal-tile", "--chunks", "2", "--out", str(out),
                           "--quiet")
    assert code == 130 and err.strip() == (
        f"interrupted: all 1 chunk sizes stored in {out} (the views are not drawn); 'kdalab run "
        f"diagonal-tile (the same options) --out {out} --resume' draws them"), err
    code, _, err = cli(capsys, "run", "diagonal-tile", "--chunks", "2", "--out", str(out),
                       "--quiet", "--resume")
    assert code == 0 and (out / "diagonal-error.svg").exists(), err

    monkeypatch.setattr(check, "_report", interrupted)
    out = tmp_path / "c"
    code, _, err = cli(capsys, "check", "recipe:fp32", "--device", "cpu", "--cases", "T/1",
                       "--out", str(out), "--quiet")
    assert code == 130 and err.strip() == (
        f"interrupted: every record in {out} (the report is not drawn); 'kdalab check --redraw "
        f"--out {out}' draws it"), err
    code, _, err = cli(capsys, "check", "--redraw", "--out", str(out))  # --redraw alike
    assert code == 130 and err.strip() == (f"interrupted: every record in {out} (no report); "
                                           "--redraw again"), err


def test_an_interrupted_redraw_says_the_records_are_kept(tmp_path, capsys, monkeypatch):
    import kdalab.cli.dynamic_range as studies
    from kdalab.cli.app import Interrupted

    out = tmp_path / "dt"
    args = ["run", "diagonal-tile", "--out", str(out), "--quiet"]
    assert cli(capsys, *args, "--chunks", "2")[0] == 0

    def interrupted(*args, **kwargs):
        raise Interrupted()

    monkeypatch.setattr(studies, "_diagonal_tile_views", interrupted)
    code, _, err = cli(capsys, *args, "--redraw")
    assert code == 130 and err.strip() == (f"interrupted: every record in {out} (the views are "
                                           "not drawn); --redraw again draws them"), err


@pytest.mark.parametrize("case", ["huge-budget", "nan-inputs"])
def test_check_plots_without_warnings(tmp_path, capsys, case):
    # a budget of 1e308 (the budget line overflowed matplotlib's log transform) and captured
    # inputs whose errors are all non-finite (a log axis with nothing positive): the report is
    # drawn and nothing but kdalab's own lines reaches stderr
    import warnings

    args = ["check", "recipe:fp32", "--device", "cpu", "--out", str(tmp_path / "o"), "--quiet"]
    if case == "huge-budget":
        args += ["--cases", "T/1", "--budget", "1e308"]
    else:
        from kdalab.hunt.files import write_case
        from kdalab.inputs.sequences import SequenceSpec, draw

        x = draw(SequenceSpec(T=32, heads=1, K=32, V=32), 0, "cpu")
        x["q"][:] = float("nan")
        write_case(tmp_path / "nan.safetensors", x)
        args = [a for a in args if a != "--device" and a != "cpu"]
        args += ["--inputs", str(tmp_path / "nan.safetensors")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = cli(capsys, *args)
    assert code in (0, 1), err
    assert err == "", err
    drawing = [str(w.message) for w in caught
               if "matplotlib" in w.filename or "views" in w.filename]
    assert not drawing, drawing
    assert (tmp_path / "o" / "errors.png").is_file()


# --- the timeline's switch: 0, false, no, off and empty leave it off -----------------------------

@pytest.mark.parametrize("value,on", [("1", True), ("yes", True), ("0", False), ("false", False),
                                      ("FALSE", False), ("no", False), ("off", False),
                                      ("", False), (" 0 ", False)])
def test_kdalab_timeline_is_on_only_when_asked(value, on, monkeypatch, capsys):
    from kdalab.timeline import mark

    monkeypatch.setenv("KDALAB_TIMELINE", value)
    mark("here")
    err = capsys.readouterr().err
    assert ("here" in err) is on, (value, err)


# --- a sweep file's keys are the command's options ------------------------------------------------

def _help_options(capsys, *command) -> set[str]:
    code, out, _ = cli(capsys, *command, "--help")
    assert code == 0
    return set(re.findall(r"^\s+--([a-z][a-z-]*)", out, flags=re.M))


def test_a_sweep_file_takes_the_options_and_says_which(tmp_path, capsys):
    """The keys are the sweep's options but those that say what to do with the folder
    (--resume, --force, --redraw), and its recipe: the message lists them, derived from the
    options, and each one listed is taken."""
    (tmp_path / "k.toml").write_text("chunkz = 4\n")
    code, _, err = cli(capsys, "sweep", str(tmp_path / "k.toml"))
    one_error(code, err, "k.toml: chunkz: unknown key; expected one of ")
    listed = err.split("expected one of ")[1].split(" (")[0].split(", ")
    options = _help_options(capsys, "sweep") - {"resume", "force", "redraw", "help"}
    assert set(listed) == options | {"recipe"}, listed
    values = {"families": "'floor'", "chunks": "'4'", "seeds": "'0'", "dims": "8",
              "accumulation": "'fp32'", "lower-bound": "-5", "device": "'cpu'",
              "out": repr(str(tmp_path / "s")), "backend": "'local'", "json": "true",
              "quiet": "true", "recipe": "'seed'"}
    assert set(values) == set(listed) - {"address"}  # address needs --backend ray
    (tmp_path / "all.toml").write_text("".join(f"{k} = {v}\n" for k, v in values.items()))
    code, out, err = cli(capsys, "sweep", str(tmp_path / "all.toml"))
    assert code == 0 and out == "" and err == "", err  # quiet = true from the file
    assert (tmp_path / "s" / "records.json").exists()  # json = true from the file


def test_the_command_line_overrides_the_files_run_options(tmp_path, capsys):
    (tmp_path / "k.toml").write_text(f"chunks = '4'\nseeds = '0'\ndims = 8\n"
                                     f"backend = 'no-such'\nout = '{tmp_path / 's'}'\n")
    code, _, err = cli(capsys, "sweep", str(tmp_path / "k.toml"), "--backend", "local")
    one_error(code, err, "k.toml: backend must be one of local, ray; got 'no-such'")
    (tmp_path / "k.toml").write_text(f"chunks = '4'\nseeds = '0'\ndims = 8\nquiet = false\n"
                                     f"backend = 'ray'\nout = '{tmp_path / 's'}'\n")
    code, out, err = cli(capsys, "sweep", str(tmp_path / "k.toml"), "--quiet", "--backend",
                         "local")
    assert code == 0 and out == "" and err == "", err
