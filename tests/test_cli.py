"""The command line's contract: files written and tables printed; every mistake one line on
stderr and exit code 2; --version, python -m kdalab, help with defaults and choices; a closed
pipe ends quietly; Ctrl-C keeps the records and says so, exit code 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kdalab.cli import main
from tests.cli_run import cli

ROOT = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH",
                                                                                 "")}


def kdalab(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdalab", *args], capture_output=True,
                          text=True, env=ENV, **kw)


# --- what the commands write -----------------------------------------------------------------

def test_reproduce_small(tmp_path, capsys):
    code, out, err = cli(capsys, "reproduce", "--chunks", "4,8", "--seeds", "0", "--dim", "16",
                         "--out", str(tmp_path), "--json")
    assert code == 0, err
    assert "Exponent boundary" in out and "High-power stress" in out
    # a table's title is one line of its own (never wrapped into the table's width)
    assert any(line.startswith("Exponent boundary") and line.endswith("dim 16")
               for line in out.splitlines())
    for name in ("records.json", "manifest.json", "summary.csv", "exponent_boundary.md",
                 "exponent_boundary.csv", "high_power_stress.md", "ordinary_random.csv",
                 "error_vs_chunk.png", "error_vs_chunk.svg"):
        assert (tmp_path / name).exists(), name
    recs = json.loads((tmp_path / "records.json").read_text())
    # the default is the H200's arithmetic (the published tables), L by its fp32 GEMM order
    assert len(recs) == 3 * 2 and {r["accumulation"] for r in recs} == {"h200"}
    assert {r["l_accumulation"] for r in recs} == {"h200-sgemm"}


def test_reproduce_again_keeps_its_store_and_refuses_other_options(tmp_path, capsys):
    args = ["reproduce", "--chunks", "4", "--seeds", "0", "--dim", "16", "--out", str(tmp_path)]
    assert cli(capsys, *args)[0] == 0
    (tmp_path / "summary.csv").unlink()
    code, out, err = cli(capsys, *args)  # the main job again: nothing recomputed, views redrawn
    assert code == 0 and "1 of 1 runs" not in err and (tmp_path / "summary.csv").exists(), err
    assert "3 of 3 runs already stored" in out
    code, _, err = cli(capsys, *args[:-4], "--seeds", "1", "--out", str(tmp_path))
    assert code == 2 and err.startswith("error: ") and "--force" in err and err.count("\n") == 1


def test_sweep_from_toml_with_override_and_out(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    out = tmp_path / "from-toml"
    cfg.write_text(f'families = "floor"\nchunks = [4]\nseeds = "0-1"\ndims = [8]\n'
                   f'lower-bound = -2\nout = "{out}"\naccumulation = "fp32"\n')
    code, _, err = cli(capsys, "sweep", str(cfg), "--accumulation", "fp16-seq,fp16-once",
                       "--quiet", "--json")
    assert code == 0, err
    recs = json.loads((out / "records.json").read_text())
    assert len(recs) == 4 and {r["lower_bound"] for r in recs} == {-2.0}
    assert {r["accumulation"] for r in recs} == {"fp16-seq", "fp16-once"}  # the option won


# --- mistakes: one line on stderr, exit code 2 ---------------------------------------------

MISTAKES = [
    # (arguments, what the line must say)
    (["sweep", "--out", "{file}"], "--out: '{file}' is a file; expected a folder"),
    (["reproduce", "--out", "{file}/sub"], "--out: cannot create the folder"),
    (["sweep", "--out", "/proc/kdalab-x"], "--out: cannot create the folder"),
    (["sweep", "{tmp}"], "config: '{tmp}' is a folder; expected a file"),
    (["sweep", "no_such_file.toml"], "config: no such file 'no_such_file.toml'"),
    (["sweep", "{bad_toml}"], "config: malformed TOML"),
    (["sweep", "{unknown_key_toml}"], "unknown key; expected one of"),
    (["sweep", "{bad_value_toml}"], "c3.toml: lower-bound must be a finite number < 0"),
    (["reproduce", "--chunks", "0"], "--chunks must be integers >= 1, got 0"),
    (["reproduce", "--seeds", "a-b"], "--seeds: cannot read 'a-b'; expected integers like"),
    (["reproduce", "--seeds", "-1"], "--seeds must be integers >= 0, got -1"),
    (["sweep", "--seeds", "-1"], "--seeds must be integers >= 0, got -1"),
    (["sweep", "--chunks", "8-4"], "--chunks: the range '8-4' is reversed; write it from low "
                                   "to high, '4-8'"),
    (["sweep", "--seeds", "9-3:2"], "--seeds: the range '9-3:2' is reversed; write it from low "
                                    "to high, '3-9:2'"),
    (["reproduce", "--dim", "0"], "--dim must be an integer >= 1, got 0"),
    (["reproduce", "--dim", "x"], "Invalid value for '--dim'"),
    (["reproduce", "--accumulation", "fp12"], "--accumulation: unknown accumulation model"),
    (["reproduce", "--accumulation", "cublas-16f"], "unknown accumulation model 'cublas-16f'"),
    (["sweep", "--families", "floor,bogus"], "--families must be one of floor, "),
    (["sweep", "--lower-bound", "0"], "--lower-bound must be a finite number < 0"),
    (["sweep", "--lower-bound", "0.5"], "--lower-bound must be a finite number < 0"),
    (["sweep", "--lower-bound", "x"], "--lower-bound must be a finite number < 0"),
    (["sweep", "--lower-bound", "nan"], "--lower-bound must be a finite number < 0"),
    (["sweep", "--device", "tpu"], "--device must be cpu, cuda or cuda:N; got 'tpu'"),
    (["reproduce", "--bogus"], "No such option: --bogus"),
    (["sweep", "--out", "{tmp}/o", "--chunks"], "Option '--chunks' requires an argument"),
    (["safe-chunk"], "give --lower-bound"),
    (["safe-chunk", "--lower-bound", "0"], "--lower-bound must be a finite number < 0"),
    (["safe-chunk", "--lower-bound", "inf"], "--lower-bound must be a finite number < 0"),
    (["safe-chunk", "--lower-bound", "-5", "--format", "bf17"], "--format: unknown format"),
    (["safe-chunk", "--lower-bound", "-5", "--format", "12,3"], "--format: exp_bits must be"),
    (["safe-chunk", "--lower-bound", "-5", "--boundary", "mid"], "--boundary must be one of"),
    (["safe-chunk", "--chunk", "0"], "--chunk must be an integer >= 1, got 0"),
    (["safe-chunk", "--chunk", "1" + "0" * 400], "--chunk: 1.000000e+400 tokens span"),
    (["run", "dynamic-range", "--boundaries", "diag"], "--boundaries must be one of start"),
    (["run", "dynamic-range", "--chunks", "1-4"], "--chunks must be integers >= 2, got 1"),
    (["run", "dynamic-range", "--ftz", "maybe"], "--ftz must be one of on, off, both"),
    (["run", "dynamic-range", "--formats", "bf16,fp7"], "--formats: unknown format 'fp7'"),
    (["run", "diagonal-tile", "--strategies", "diag"], "--strategies must be one of"),
    (["run", "diagonal-tile", "--lower-bounds", "-1,1"], "--lower-bounds must be a finite"),
    (["run", "end-to-end", "--lower-bounds", "0.5"], "--lower-bounds must be a finite number"),
    (["run", "end-to-end", "--chunks", "0"], "--chunks must be integers >= 1, got 0"),
    (["run", "end-to-end", "--variants", "flashkda/diagonal/neumann"], "tiles must be one of"),
    (["run", "end-to-end", "--variants", "fp32/chunk_start"], "variant must be"),
    (["run", "end-to-end", "--families", "gaussian"], "--families must be one of model_like"),
    (["run", "end-to-end", "--dim", "0"], "--dim must be an integer >= 1, got 0"),
    (["run", "end-to-end", "--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["run", "end-to-end", "--redraw", "--out", "{tmp}/empty"],
     "--redraw: {tmp}/empty holds no kdalab store"),
    (["run", "bogus"], "No such command 'bogus'"),
    # what a newcomer met (issue 21), and its kin
    (["sweep", "--seeds", "0-99999999999"], "--seeds: '0-99999999999' holds more than 1,000,000"),
    (["reproduce", "--seeds", "0-99999999"], "--seeds: '0-99999999' holds more than 1,000,000"),
    (["sweep", "--seeds", "0-999999", "--chunks", "2-64"], "--seeds: the sweep would plan"),
    (["sweep", "{out_int_toml}"], "out-int.toml: out must be a path (text), got 5"),
    (["sweep", "{out_empty_toml}"], "out-empty.toml: out is empty; expected a path"),
    (["sweep", "{out_file_toml}"], "out-file.toml: out: "),
    (["sweep", "{huge_toml}"], "huge.toml: seeds: '0-99999999999' holds more than"),
    (["sweep", "{chunks_float_toml}"], "chunks-float.toml: chunks must hold integers"),
    (["sweep", "{chunks_empty_toml}"], "chunks-empty.toml: chunks is empty"),
    (["sweep", "--seeds", "0", "--chunks", "4", "--out", "{foreign}"], "--force"),
    (["reproduce", "--seeds", "0", "--chunks", "4", "--out", "{foreign}"], "--force"),
    (["sweep", "{tmp}/no-such.toml"], "config: no such file"),
    (["sweep", "{acc_int_toml}"], "acc-int.toml: accumulation must name an accumulation model"),
    (["sweep", "{binary_toml}"], "is not a TOML file (not UTF-8 text)"),
    (["sweep", "{tmp}"], "is a folder; expected a file"),
    (["sweep", "--seeds", "0-10:0"], "--seeds: cannot read '0-10:0'"),
    (["sweep", "--redraw", "{file}"], "--redraw"),
    (["reproduce", "--dim", "abc"], "Invalid value for '--dim'"),
    (["sweep", "--backend", "ray", "--address", "127.0.0.1:1", "--seeds", "0", "--chunks", "4"],
     "no Ray cluster answers there"),
]
if torch.cuda.is_available():
    MISTAKES += [(["reproduce", "--accumulation", "gpu-h200", "--device", "cpu"],
                  "'gpu-h200' runs on CUDA tensors only")]
else:
    MISTAKES += [
        (["reproduce", "--accumulation", "gpu-h200"],
         "--accumulation: 'gpu-h200' is the GPU's own arithmetic and needs a CUDA device; none "
         "is available here (its CPU emulation is 'h200')"),
        (["sweep", "--device", "cuda"], "--device cuda: no CUDA device is available"),
        (["run", "end-to-end", "--device", "cuda:1"], "--device cuda:1: no CUDA device"),
    ]


@pytest.fixture
def files(tmp_path) -> dict:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "c1.toml").write_text("chunks = [4,\n")
    (tmp_path / "c2.toml").write_text("chunkz = [4]\n")
    (tmp_path / "c3.toml").write_text("lower-bound = 0.5\n")
    (tmp_path / "empty").mkdir()
    tomls = {"out_int_toml": "out = 5", "out_empty_toml": "out = ''",
             "out_file_toml": f"out = '{tmp_path / 'a-file'}'",
             "huge_toml": "seeds = '0-99999999999'",
             "chunks_float_toml": "chunks = 3.5", "chunks_empty_toml": "chunks = []",
             "acc_int_toml": "accumulation = [1, 2]", "binary_toml": "\udcff\udcfe"}
    for key, text in tomls.items():
        (tmp_path / (key[:-5].replace("_", "-") + ".toml")).write_text(
            text + "\n", errors="surrogateescape")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "thesis.tex").write_text("not kdalab's")
    return {"file": str(tmp_path / "a-file"), "tmp": str(tmp_path),
            "foreign": str(tmp_path / "foreign"),
            **{key: str(tmp_path / (key[:-5].replace("_", "-") + ".toml")) for key in tomls},
            "bad_toml": str(tmp_path / "c1.toml"), "unknown_key_toml": str(tmp_path / "c2.toml"),
            "bad_value_toml": str(tmp_path / "c3.toml")}


@pytest.mark.parametrize("args,message", MISTAKES, ids=[" ".join(a)[:60] for a, _ in MISTAKES])
def test_every_mistake_is_one_line_and_exit_2(args, message, files, tmp_path, capsys):
    args = [a.format(**files) for a in args]
    if "--out" not in args and args[0] != "safe-chunk" and "/out-" not in args[-1]:
        args += ["--out", str(tmp_path / "out")]  # (a TOML file's own out is the mistake)
    code, out, err = cli(capsys, *args)
    lines = err.strip("\n").splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message.format(**files) in lines[0], lines[0]
    assert "Traceback" not in err + out


def test_a_mistake_through_the_script_is_one_line_without_traceback(tmp_path):
    p = kdalab("sweep", "--seeds", "0-99999999999", "--out", str(tmp_path / "o"), timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: ")
    assert "Traceback" not in p.stderr


def test_home_expands_in_options_and_toml(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    small = ["--seeds", "0", "--chunks", "4", "--dims", "8", "--families", "floor", "--quiet"]
    assert cli(capsys, "sweep", "--out", "~/a", *small)[0] == 0
    assert cli(capsys, "sweep", "--out=~/b", *small)[0] == 0
    (tmp_path / "c.toml").write_text("out = '~/c'\n")
    assert cli(capsys, "sweep", "c.toml", *small)[0] == 0
    for name in "abc":
        assert (tmp_path / "home" / name / "manifest.json").exists(), name
    assert not (tmp_path / "~").exists()


def test_output_is_not_folded_through_a_pipe(tmp_path):
    out = tmp_path / ("a-folder-with-a-rather-long-name-" * 4) / "sweep"
    p = kdalab("sweep", "--seeds", "0", "--chunks", "4", "--dims", "8", "--families", "floor",
               "--out", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"wrote 5 files to {out}/" in p.stdout.splitlines()
    again = kdalab("sweep", "--seeds", "0", "--chunks", "4", "--dims", "8", "--families",
                   "floor", "--out", str(out), timeout=300)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and str(out) in again.stderr


def test_an_interrupt_claims_nothing_a_command_did_not_declare(monkeypatch, capsys):
    import kdalab.cli as boundary

    def interrupted(*a, **kw):
        raise boundary.Interrupted()

    monkeypatch.setattr(boundary, "app", interrupted)
    code, _, err = cli(capsys, "sweep")
    assert code == 130 and err.strip() == "interrupted: nothing was kept"


@pytest.mark.parametrize("error", [
    MemoryError(),
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                 "allocate memory: you tried to allocate 80000000000 bytes. Error code 12"),
])
def test_out_of_memory_is_one_line(error, monkeypatch, tmp_path, capsys):
    import kdalab.studies.plan as backends

    def too_big(*a, **kw):
        raise error

    monkeypatch.setattr(backends, "iter_batch_tables", too_big)
    code, _, err = cli(capsys, "sweep", "--chunks", "4", "--seeds", "0", "--dims", "8",
                       "--out", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: out of memory"), err


def test_a_runtime_error_that_is_no_memory_error_keeps_its_traceback(monkeypatch, tmp_path):
    import kdalab.studies.plan as backends

    def broken(*a, **kw):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(backends, "iter_batch_tables", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main(["sweep", "--chunks", "4", "--seeds", "0", "--dims", "8", "--out", str(tmp_path)])


def test_debug_shows_the_traceback_of_an_expected_error(capsys, tmp_path):
    code, _, err = cli(capsys, "--debug", "sweep", "--seeds", "-1", "--out", str(tmp_path))
    assert code == 2 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error:")


def test_an_unexpected_error_keeps_its_traceback(monkeypatch, tmp_path, capsys):
    import kdalab.studies.plan as plan

    def broken(*a, **kw):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(plan, "iter_batch_tables", broken)
    with pytest.raises(ZeroDivisionError):
        main(["sweep", "--chunks", "4", "--seeds", "0", "--dims", "8", "--out", str(tmp_path)])


# --- version, python -m kdalab, help ---------------------------------------------------------

def test_version_and_python_m_kdalab():
    from importlib.metadata import version

    res = kdalab("--version")
    assert res.returncode == 0 and res.stdout == f"kdalab {version('kdalab')}\n"
    res = kdalab()  # no command: the help, not an error
    assert res.returncode == 0 and "Usage: kdalab" in res.stdout and res.stderr == ""
    res = kdalab("--help")
    assert res.returncode == 0
    for command in ("reproduce", "sweep", "safe-chunk", "run"):
        assert command in res.stdout


def test_the_script_leaves_at_once_with_everything_written(tmp_path):
    """``kdalab`` / ``python -m kdalab`` end the process without Python's teardown once done
    (cli._leave): the exit code, the whole output, the store and its views are all there, and
    the atexit handlers still ran."""
    out = tmp_path / "sw"
    res = kdalab("sweep", "--chunks", "3,5", "--seeds", "0-1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    views = json.loads((out / "manifest.json").read_text())["views"]
    assert len(views) == 9 and all((out / v).exists() for v in views)
    assert "".join(res.stdout.split()).endswith(f"wrote9filesto{out}/"), res.stdout
    res = kdalab("sweep", "--chunks", "0")
    assert res.returncode == 2 and res.stderr.startswith("error: --chunks") and res.stdout == ""
    code = ("import atexit, sys; from kdalab.cli import run\n"
            "atexit.register(lambda: print('atexit ran', flush=True))\n"
            "sys.argv = ['kdalab', '--version']; run()")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert res.returncode == 0 and res.stdout.endswith("atexit ran\n"), res


def test_help_starts_without_the_heavy_layers():
    """--help, --version and every mistake before a command runs must not import torch (about 1
    s), numpy, pandas or matplotlib. (The times are measured in benchmarks/bench_cli.py.)"""
    code = ("import sys; from kdalab.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'numpy', 'pandas', 'matplotlib') "
            "if m in sys.modules), file=sys.stderr)")
    for args in (["--help"], ["--version"], ["sweep", "--help"], ["run", "end-to-end", "--help"],
                 ["reproduce", "--bogus"]):
        res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                             text=True, env=ENV)
        assert res.stderr.strip().splitlines()[-1] == "[]", (args, res.stderr)


def test_help_shows_defaults_choices_and_flowing_text(capsys):
    code, out, _ = cli(capsys, "sweep", "--help")
    assert code == 0
    text = " ".join(out.split())
    for needle in ("[default: (8,16,32)]", "[default: (fp16-seq)]", "[default: (-5)]",
                   "floor, weak_decay_correlated, model_like", "fp16-seq, fp16-once, h200",
                   "gpu-h200", "dashes or underscores"):
        assert needle in text, needle
    code, out, _ = cli(capsys, "reproduce", "--help")
    assert "[default: h200]" in " ".join(out.split())
    # docstring paragraphs are reflowed by the terminal's width, not the source's line breaks
    assert "floor_e-5, weak_decay_correlated and model_like inputs across chunk sizes" in \
        " ".join(out.split())
    code, out, _ = cli(capsys, "run", "--help")
    for command in ("dynamic-range", "diagonal-tile", "end-to-end"):
        assert command in out


def test_the_help_lists_every_model_and_family_the_layers_define():
    from kdalab.arith import available_accumulations, get_accumulation
    from kdalab.cli import options
    from kdalab.inputs.families import FAMILIES
    from kdalab.kda.safe_chunk import BOUNDARIES
    from kdalab.studies.diagonal_tile import STRATEGIES
    from kdalab.studies.end_to_end import E2E_FAMILIES

    names = available_accumulations()
    assert list(options.ACCUMULATIONS) == [n for n in names if not get_accumulation(n).needs_cuda]
    assert list(options.GPU_ACCUMULATIONS) == [n for n in names
                                               if get_accumulation(n).needs_cuda]
    assert options.FAMILIES == tuple(FAMILIES) and options.E2E_FAMILIES == E2E_FAMILIES
    assert options.BOUNDARIES == BOUNDARIES and options.STRATEGIES == STRATEGIES


# --- safe-chunk answers every finite input in bounded time -----------------------------------

def test_safe_chunk_answers_tiny_and_huge_bounds_at_once(capsys):
    from fractions import Fraction

    from kdalab.kda.safe_chunk import safe_chunk, scale_limits

    x = scale_limits("bf16").zero.x
    for lb in (-1e-21, -1e-22, -1e-30, -5e-324):  # -1e-22 searched for ever before
        r = safe_chunk("bf16", lb)
        k = r.steps_nonzero  # exact: k·|lb| < x <= (k + 1)·|lb|
        assert k * Fraction(-lb) < Fraction(x) <= (k + 1) * Fraction(-lb)
        assert r.max_chunk == k  # start boundary: C = k
    assert safe_chunk("bf16", -1e300).max_chunk == 0
    code, out, err = cli(capsys, "safe-chunk", "--lower-bound", "-1e-22")
    assert code == 0 and "max chunk: 8.733654e+23" in out
    code, out, _ = cli(capsys, "safe-chunk", "--chunk", "1000000000000")
    assert code == 0 and "lower bound must be > -8.73365e-11" in out
    code, out, _ = cli(capsys, "safe-chunk", "--lower-bound", "-1e-22", "--json")
    assert json.loads(out)["max_chunk"] == 873365448101577570317849


def test_safe_chunk_never_hangs_in_a_fresh_process():
    for lb in ("-1e-22", "-1e-30", "-4.9e-324"):
        res = kdalab("safe-chunk", "--lower-bound", lb, timeout=120)
        assert res.returncode == 0 and "max chunk:" in res.stdout, res.stderr


# --- a closed pipe, Ctrl-C ---------------------------------------------------------------------

def test_a_closed_pipe_ends_quietly(tmp_path):
    """`kdalab … | head`: the reader goes away before the output; exit 0, nothing on stderr."""
    for args in (["reproduce", "--chunks", "4", "--seeds", "0", "--dim", "8", "--out",
                  str(tmp_path)], ["--help"], ["safe-chunk", "--lower-bound", "-5", "--json"]):
        p = subprocess.Popen([sys.executable, "-m", "kdalab", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=ENV)
        p.stdout.close()  # the reader is gone before the first line
        err = p.stderr.read().decode()
        assert p.wait(timeout=300) == 0, err
        assert err == "", err


def test_ctrl_c_keeps_the_records_and_says_how_to_go_on(tmp_path):
    """Ctrl-C: every stored part is kept, the boundary says how many runs and how to continue
    (exit 130), and --resume then completes the sweep."""
    from kdalab.records import RunStore

    out = tmp_path / "sweep"
    args = ["sweep", "--chunks", "4-64:4", "--seeds", "0-63", "--dims", "16", "--out", str(out)]
    p = subprocess.Popen([sys.executable, "-c", "import sys; from kdalab.records import writer; "
                          "writer.PART_SECONDS = 0.05; from kdalab.cli import main; main()",
                          *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        if list(out.glob("parts/*.parquet")):
            break
        time.sleep(0.05)
    assert p.poll() is None, "the sweep ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=240)
    assert p.returncode == 130, err
    kept = int(RunStore.read_only(out).done.sum())
    lines = err.strip().splitlines()
    assert lines and lines[-1] == (f"interrupted: {kept} of 3072 runs stored in {out}; "
                                   f"'kdalab sweep --out {out} --resume' continues with the rest")
    assert 1 <= kept < 3072 and "Traceback" not in err
    assert not (out / "summary.csv").exists()  # the sweep did not finish: no views yet
    done = kdalab("sweep", "--out", str(out), "--resume", "--quiet")
    assert done.returncode == 0, done.stderr
    assert RunStore.read_only(out).complete and (out / "summary.csv").exists()


# --- issue 21, finished: held-out kinds of mistake, each one line, exit 2, nothing left behind --

SWEEP_KEYS = [  # (a sweep TOML, what the line must say): every key names itself, any wrong type
    ("recipe = 5", "k.toml: recipe must name a recipe, one of seed, "),
    ("recipe = 'nope'", "k.toml: recipe: unknown recipe 'nope'; expected one of seed"),
    ("recipe = ['seed']", "k.toml: recipe must name a recipe"),
    ("recipe = true", "k.toml: recipe must name a recipe"),
    ("recipe = {a = 1}", "k.toml: recipe must name a recipe"),
    ("[sweep]\nrecipe = 5", "k.toml: recipe must name a recipe"),
    ("families = true", "k.toml: families must be a list, got True"),
    ("families = [1]", "k.toml: families must be one of floor"),
    ("chunks = {a = 1}", "k.toml: chunks: cannot read 'a'"),
    ("chunks = [[4]]", "k.toml: chunks must hold integers like"),
    ("seeds = 1.5", "k.toml: seeds must hold integers like"),
    ("seeds = [true]", "k.toml: seeds must hold integers like"),
    ("dims = true", "k.toml: dims must be a list, got True"),
    ("accumulation = 5", "k.toml: accumulation must name an accumulation model, got 5"),
    ("accumulation = [['fp32']]", "k.toml: accumulation must name an accumulation model"),
    ("lower-bound = [true]", "k.toml: lower-bound must be a finite number < 0"),
    ("lower-bound = [[-1]]", "k.toml: lower-bound must be a finite number < 0"),
    ("device = 5", "k.toml: device must be cpu, cuda or cuda:N; got 5"),
    ("device = ['cpu']", "k.toml: device must be cpu, cuda or cuda:N"),
    ("out = true", "k.toml: out must be a path (text), got True"),
    ("out = {a = 1}", "k.toml: out must be a path (text)"),
    ("out = '~nosuchuser-kdalab/x'", "k.toml: out: cannot expand '~nosuchuser-kdalab/x'"),
    ("chunk = 4\nchunks = 8", "k.toml: chunks: chunks is given twice"),
    ("[sweep]\n[sweep.x]\ny = 1", "k.toml: x: unknown key; expected one of"),
]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _one_mistake(capsys, tmp_path, args, message) -> None:
    """``args`` is a mistake: one ``error:`` line holding ``message``, exit code 2, no
    traceback, and nothing made or changed under ``tmp_path``."""
    before = _tree(tmp_path)
    code, out, err = cli(capsys, *args)
    lines = err.strip("\n").splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0], lines[0]
    assert "Traceback" not in err + out
    assert _tree(tmp_path) == before, _tree(tmp_path) - before


@pytest.mark.parametrize("text,message", SWEEP_KEYS, ids=[t for t, _ in SWEEP_KEYS])
def test_every_sweep_key_of_the_wrong_type_names_itself(text, message, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.toml").write_text(text + "\n")
    args = ["sweep", "k.toml"] + ([] if text.startswith("out") else ["--out", "o"])
    _one_mistake(capsys, tmp_path, args, message)


def test_a_bad_out_in_the_toml_is_refused_even_when_the_option_overrides_it(tmp_path, capsys):
    (tmp_path / "k.toml").write_text("out = ['x']\n")
    _one_mistake(capsys, tmp_path, ["sweep", str(tmp_path / "k.toml"), "--out",
                                    str(tmp_path / "o")], "k.toml: out must be a path (text)")


LEFT_BEHIND = [  # mistakes found late (after --out was once made): nothing may be left behind
    (["sweep", "--seeds", "0-999999", "--chunks", "2-64", "--out", "{tmp}/o"],
     "--seeds: the sweep would plan"),
    (["reproduce", "--seeds", "0-999999", "--chunks", "2-64", "--out", "{tmp}/o"],
     "--seeds: the sweep would plan"),
    (["sweep", "--seeds", "0", "--chunks", "4", "--out", "{tmp}/foreign/sub", "--families",
      "bogus"], "--families must be one of"),
    (["sweep", "--out", "{tmp}/file/sub"], "--out: cannot create the folder"),
    (["sweep", "--seeds", "99999999999999999999", "--out", "{tmp}/o"],
     "--seeds: 99999999999999999999 is too large; expected integers below 2**63"),
    (["run", "diagonal-tile", "--seeds", "0-999999", "--chunks", "2-64", "--out", "{tmp}/o"],
     "--seeds: each chunk size would make"),
    (["run", "dynamic-range", "--model-seeds", "0-999999", "--out", "{tmp}/o"],
     "--model-seeds: each chunk size would make"),
    (["run", "end-to-end", "--redraw", "--out", "{tmp}/o"], "holds no kdalab store"),
    # an empty path is not '.' (click reads '' as the current folder)
    (["sweep", "--seeds", "0", "--chunks", "4", "--out", ""], "--out is empty; expected a path"),
    (["run", "end-to-end", "--quick", "--out="], "--out is empty; expected a path"),
    (["run", "dynamic-range", "--out", "  "], "--out is empty; expected a path"),
    (["sweep", "--redraw", ""], "--redraw is empty; expected a path"),
    # chunk sizes bounded before anything runs, as sweep --chunks 100000 is
    (["run", "dynamic-range", "--chunks", "2-999999", "--out", "{tmp}/o"],
     "--chunks: a chunk of 999999 needs about"),
    (["run", "diagonal-tile", "--chunks", "2-999999", "--out", "{tmp}/o"],
     "--chunks: a chunk of 999999 needs about"),
    (["run", "inverse-stability", "--chunks", "2-999999", "--out", "{tmp}/o"],
     "--chunks: a chunk of 999999 needs about"),
    (["run", "inverse-stability", "--chunks", "100000", "--out", "{tmp}/o"],
     "--chunks: a chunk of 100000 needs about"),
    (["run", "inverse-stability", "--samples", "99999999999", "--out", "{tmp}/o"],
     "--samples: 2,399,999,999,976 grid points × samples at once (keys of dimension"),
    (["run", "dynamic-range", "--redraw", "--out", "{tmp}/o"], "holds no kdalab store"),
    (["run", "diagonal-tile", "--redraw", "--out", "{tmp}/o"], "holds no kdalab store"),
    (["run", "end-to-end", "--quick", "--out", "~nosuchuser-kdalab/x"],
     "--out: cannot expand '~nosuchuser-kdalab/x': no user 'nosuchuser-kdalab' here"),
    (["run", "end-to-end", "--quick", "--out=~nosuchuser-kdalab/x"], "--out: cannot expand"),
    # kdalab run inverse-stability
    (["run", "inverse-stability", "--redraw", "--chunks", "4", "--out", "{tmp}/o"],
     "--redraw draws from the stored records: it takes no --chunks"),
    (["run", "inverse-stability", "--redraw", "--out", "{tmp}/o"], "holds no kdalab store"),
    (["run", "inverse-stability", "--chunks", "1", "--out", "{tmp}/o"],
     "--chunks must be integers >= 2, got 1"),
    (["run", "inverse-stability", "--algorithms", "nope", "--out", "{tmp}/o"],
     "--algorithms must be one of fp16-neumann"),
    (["run", "inverse-stability", "--betas", "nan", "--out", "{tmp}/o"],
     "--betas must hold numbers in [0, 1], got nan"),
    (["run", "inverse-stability", "--decays", "1", "--out", "{tmp}/o"], "--decays must hold"),
    (["run", "inverse-stability", "--spreads", "", "--out", "{tmp}/o"], "--spreads: cannot read"),
    (["run", "inverse-stability", "--samples", "0", "--out", "{tmp}/o"], "--samples must be"),
    (["run", "inverse-stability", "--seed", "99999999999999999999", "--out", "{tmp}/o"],
     "--seed: 99999999999999999999 is too large"),
    (["run", "inverse-stability", "--quick", "--out", "{tmp}/file"], "--out: "),
    (["run", "inverse-stability", "--quick", "--out", "{tmp}/foreign"],
     "holds no kdalab store"),
    # kdalab hunt
    (["hunt", "nope"], "unknown kernel 'nope'; kernels are kdalab"),
    (["hunt", "recipe:nope"], "unknown recipe 'nope'"),
    (["hunt", "recipe:"], "unknown recipe ''"),
    (["hunt", "module:"], "kernel 'module:': expected module:function"),
    (["hunt", "os:nothing"], "kernel 'os:nothing': module 'os' has no attribute 'nothing'"),
    (["hunt", "flashkda", "--device", "cpu"], "kernel 'flashkda' runs on cuda only"),
    (["hunt", "recipe:fp32", "--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["hunt", "recipe:fp32", "--trials", "0"], "--trials must be an integer >= 1, got 0"),
    (["hunt", "recipe:fp32", "--trials", "-3"], "--trials must be an integer >= 1, got -3"),
    (["hunt", "recipe:fp32", "--budget-s", "0"], "--budget-s must be a number of seconds > 0"),
    (["hunt", "recipe:fp32", "--budget-s", "nan"], "--budget-s must be a number of seconds"),
    (["hunt", "recipe:fp32", "--seed", "-1"], "--seed must be an integer in [0, 2**32 - 1]"),
    (["hunt", "recipe:fp32", "--seed", "99999999999999999999"], "--seed must be an integer in"),
    (["hunt", "recipe:fp32", "--min-T", "300", "--max-T", "100"],
     "--min-T must be <= --max-T, got 300 > 100"),
    (["hunt", "recipe:fp32", "--min-T", "0"], "--min-T must be an integer >= 1, got 0"),
    (["hunt", "recipe:fp32", "--min-heads", "5", "--max-heads", "2"], "--min-heads must be <="),
    (["hunt", "recipe:fp32", "--max-sequences", "0"], "--max-sequences must be an integer >= 1"),
    (["hunt", "recipe:fp32", "--dims", "x"], "--dims: cannot read 'x'; expected integers"),
    (["hunt", "recipe:fp32", "--dims", "0,64"], "--dims must be integers >= 1, got 0"),
    (["hunt", "recipe:fp32", "--dims", "64,,128"], "--dims has an empty item in '64,,128'"),
    (["hunt", "recipe:fp32", "--dims", "99999999"], "the largest case needs about"),
    (["hunt", "recipe:fp32", "--max-T", "999999999999"], "--max-T 999999999999, --max-heads"),
    (["hunt", "recipe:fp32", "--max-heads", "999999999"], "the largest case needs about"),
    (["hunt", "recipe:fp32", "--threshold", "0"], "--threshold must be a finite number > 0"),
    (["hunt", "recipe:fp32", "--threshold", "-1"], "--threshold must be a finite number > 0"),
    (["hunt", "recipe:fp32", "--threshold", "nan"], "--threshold must be a finite number > 0"),
    (["hunt", "recipe:fp32", "--lower-bound", "0"], "--lower-bound must be a number < 0 or"),
    (["hunt", "recipe:fp32", "--lower-bound", "-1:-5"],
     "--lower-bound: the range '-1:-5' is reversed; LOW:HIGH with LOW <= HIGH, e.g. '-5:-1'"),
    (["hunt", "recipe:fp32", "--lower-bound", "-5:-1:2"],  # as typed (no emoji for ":-1:")
     "--lower-bound must be a number < 0 or a range LOW:HIGH of them, got '-5:-1:2'"),
    (["hunt", "recipe:fp32", "--lower-bound", "unbounded"], "--lower-bound must be a number"),
    (["hunt", "recipe:fp32", "--out", "{tmp}/file"], "--out: "),
    (["hunt", "recipe:fp32", "--out", "{tmp}/file/sub"], "--out: cannot create the folder"),
    (["hunt", "recipe:fp32", "--out", "{tmp}/foreign"], "holds files that are not a hunt's"),
    (["hunt", "recipe:fp32", "--out", "~nosuchuser-kdalab/x"], "--out: cannot expand"),
]
if not torch.cuda.is_available():
    LEFT_BEHIND += [(["hunt", "recipe:fp32", "--device", "cuda"],
                     "--device cuda: no CUDA device is available")]


@pytest.mark.parametrize("args,message", LEFT_BEHIND,
                         ids=[" ".join(a)[:60] for a, _ in LEFT_BEHIND])
def test_a_mistake_leaves_nothing_behind(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "thesis.tex").write_text("not kdalab's")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[0] == "hunt" and not any(a.startswith("--out") for a in args):
        args += ["--out", str(tmp_path / "o")]
    if args[0] == "hunt" and "--trials" not in args and "--budget-s" not in args:
        args += ["--trials", "1"]
    if args[0] == "hunt" and "--device" not in args:
        args += ["--device", "cpu"]
    _one_mistake(capsys, tmp_path, args, message)


def test_a_silent_port_at_address_is_one_prompt_line(tmp_path, capsys):
    """--address at a port that accepts and says nothing (no Ray cluster): kdalab's one line
    naming --address within a few seconds, none of Ray's retry warnings, nothing made."""
    import socket
    import threading

    from kdalab.runner.ray import PROBE_TIMEOUT

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept() -> None:  # accepts every connection and says nothing, until the test ends
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        _one_mistake(capsys, tmp_path, [
            "sweep", "--backend", "ray", "--address", f"127.0.0.1:{server.getsockname()[1]}",
            "--seeds", "0", "--chunks", "4", "--dims", "8", "--out", str(tmp_path / "o")],
            "is no Ray cluster (it said nothing for")
        assert time.monotonic() - t0 < PROBE_TIMEOUT + 15  # (Ray's import, on a loaded CPU)
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()
    assert held, "kdalab never connected"
