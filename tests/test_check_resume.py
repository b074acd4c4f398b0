"""``kdalab check --resume``: an interrupted check completed across sessions gives the records of
one uninterrupted run bit for bit (in-process and isolated), runs only the (kernel, case) pairs
without a record, refuses a stored run of other kernels or options, and its exit code and
summary cover every record. An interrupt is a real Ctrl-C (a planted kernel raises the
boundary's Interrupted) or the store as an interrupted run leaves it (some runs' parts, the
manifest ``interrupted``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kdalab.check import load_kernel, run_check, select_cases
from kdalab.check.cases import QUICK
from kdalab.records import StoreReader, identical
from tests.test_check import MOD, runner

CASES = "model_like,T/1,varlen/mixed"  # accuracy cases: two kernel calls each


def _cli(args, out, *more):
    return runner.invoke(None, ["check", *args, "--device", "cpu", "--out", str(out),
                                "--quiet", *more])


@pytest.fixture
def counted(tmp_path) -> tuple[str, Path]:
    """A planted kernel (fp32 recurrence) that logs each call to a file and raises the
    boundary's Interrupted (Ctrl-C) once the number in ``stop`` (if that file exists) is
    spent, or, while a file ``signal`` exists, sends its process SIGTERM on T = 1; isolated
    workers log to the same file."""
    calls, stop = tmp_path / "calls", tmp_path / "stop"
    path = tmp_path / "counted.py"
    path.write_text(
        "import os, signal\nfrom tests.check_kernels import honest_fp32\n\n"
        "def kernel(q, k, v, g, beta, **kw):\n"
        f"    if q.shape[1] == 1 and os.path.exists({str(tmp_path / 'signal')!r}):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        f"    if os.path.exists({str(stop)!r}):\n"
        f"        left = int(open({str(stop)!r}).read())\n"
        "        if left <= 0:\n"
        "            from kdalab.cli.app import Interrupted\n"
        "            raise Interrupted()\n"
        f"        open({str(stop)!r}, 'w').write(str(left - 1))\n"
        f"    with open({str(calls)!r}, 'a') as fh:\n"
        "        fh.write(f'{q.shape[1]}\\n')\n"
        "    return honest_fp32(q, k, v, g, beta, **kw)\n")
    return f"{path}:kernel", calls


def _calls(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def _table(folder: Path) -> pa.Table:
    store = StoreReader.read_only(folder)
    assert store.complete
    return store.read()


def _truncate(folder: Path, keep: set[int]) -> None:
    """The store as a run interrupted after the runs ``keep`` leaves it: those runs' records
    in a part, the manifest ``interrupted``, check.json not complete."""
    table = StoreReader.read_only(folder).read()
    kept = table.filter(pa.array([r in keep for r in table.column("run").to_pylist()]))
    for part in (folder / "parts").iterdir():
        part.unlink()
    pq.write_table(kept, folder / "parts" / "check-000000.parquet")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "state": "interrupted"}))
    meta = json.loads((folder / "check.json").read_text())
    (folder / "check.json").write_text(json.dumps({**meta, "complete": False}))
    assert int(StoreReader.read_only(folder).done.sum()) == len(keep)


def test_resume_after_ctrl_c_gives_the_records_of_one_run(counted, tmp_path):
    kernel, calls = counted
    args = [kernel, "recipe:fp32", "--cases", CASES]
    assert _cli(args, tmp_path / "whole").exit_code == 0
    calls.unlink()
    (tmp_path / "stop").write_text("3")  # model_like's two calls, T/1's first, then Ctrl-C
    first = _cli(args, tmp_path / "cut", "--no-isolate")  # Ctrl-C raised in this process
    assert first.exit_code == 130, first.output
    text = " ".join(first.output.split())
    assert "interrupted: 2 of 6 records in" in text and "--resume' continues" in text
    assert _calls(calls) == 3
    (tmp_path / "stop").unlink()
    again = _cli(args, tmp_path / "cut", "--resume")
    assert again.exit_code == 0, again.output
    assert _calls(calls) == 3 + 4  # T/1 and varlen/mixed only, two calls each
    assert identical(_table(tmp_path / "cut"), _table(tmp_path / "whole"))
    meta = json.loads((tmp_path / "cut" / "check.json").read_text())
    assert meta["complete"] is True and len(meta["resumed"]) == 1
    assert "--resume" not in meta["command"]  # the run's own command
    assert "INCOMPLETE" not in (tmp_path / "cut" / "report.md").read_text()
    assert len(json.loads((tmp_path / "cut" / "records.json").read_text())) == 6


@pytest.mark.parametrize("isolate", [False, True])
def test_resume_runs_only_the_missing_pairs_of_each_kernel(counted, tmp_path, isolate):
    """Kernel 0 stored on model_like only, recipe:fp32 on model_like and T/1 (runs are
    case × 2 + kernel): resumed, kernel 0 runs T/1 and varlen/mixed, recipe:fp32 varlen/mixed
    alone (with --isolate each worker is given its kernel's missing cases)."""
    kernel, calls = counted
    args = [kernel, "recipe:fp32", "--cases", CASES]
    assert _cli(args, tmp_path / "whole").exit_code == 0  # isolated or not: the same records
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    _truncate(tmp_path / "cut", {0, 1, 3})
    calls.unlink()
    res = _cli([*args, "--isolate" if isolate else "--no-isolate"], tmp_path / "cut",
               "--resume")
    assert res.exit_code == 0, res.output
    assert sorted(map(int, calls.read_text().split())) == [1, 1, 49, 49]  # T/1, varlen/mixed
    assert identical(_table(tmp_path / "cut"), _table(tmp_path / "whole"))


def test_run_check_skips_the_stored_pairs():
    kernels = [load_kernel("recipe:fp32"), load_kernel(f"{MOD}:honest_fp32")]
    cases = select_cases(QUICK, "T/1,T/17")
    whole = run_check(kernels, cases)
    stored = {("T/1", "recipe:fp32"), ("T/1", f"{MOD}:honest_fp32"), ("T/17", "recipe:fp32")}
    rest = run_check(kernels, cases, stored=stored)
    assert json.dumps(rest) == json.dumps([r for r in whole
                                           if (r["case"], r["kernel"]) not in stored])
    assert run_check(kernels, cases, stored={(r["case"], r["kernel"]) for r in whole}) == []


def test_exit_code_and_summary_of_a_resumed_run_cover_every_record(tmp_path):
    """A failure among the stored records fails the resumed run though every pair it ran
    passes; a kernel that runs no case fails it too."""
    args = [f"{MOD}:honest_fp32", f"{MOD}:drops_initial_state", "--cases", "model_like,no_h0"]
    assert _cli(args, tmp_path / "a").exit_code == 1
    _truncate(tmp_path / "a", {0, 1})  # model_like stored: drops_initial_state failed it
    res = runner.invoke(None, ["check", *args, "--device", "cpu", "--out", str(tmp_path / "a"),
                               "--resume"])
    assert res.exit_code == 1, res.output
    assert "4 of 4 (kernel, case) pairs ran: 3 passed, 1 failed" in " ".join(res.output.split())
    assert "resuming: 2 of 4 records already stored" in res.output
    assert StoreReader.read_only(tmp_path / "a").manifest.state == "complete"

    idle = [f"{MOD}:honest_fp32", f"{MOD}:declines_everything", "--cases", "T/1,T/17"]
    assert _cli(idle, tmp_path / "b").exit_code == 1
    _truncate(tmp_path / "b", {0, 1})
    res = runner.invoke(None, ["check", *idle, "--device", "cpu", "--out", str(tmp_path / "b"),
                               "--resume"])
    assert res.exit_code == 1
    assert "no case ran for" in " ".join(res.output.split())


def test_resume_of_a_complete_run_runs_nothing_and_redraws(counted, tmp_path):
    kernel, calls = counted
    args = [kernel, f"{MOD}:declines_everything", "--cases", "T/1"]
    out = tmp_path / "out"
    assert _cli(args, out).exit_code == 1  # a kernel that ran no case
    before = _table(out)
    (out / "report.md").unlink()
    n = _calls(calls)
    res = _cli(args, out, "--resume")
    assert res.exit_code == 1, res.output  # from the records, as the run's own
    assert _calls(calls) == n and (out / "report.md").exists()
    assert identical(_table(out), before)
    assert _cli([kernel, "--cases", "T/1"], tmp_path / "ok").exit_code == 0
    assert _cli([kernel, "--cases", "T/1"], tmp_path / "ok", "--resume").exit_code == 0


_OTHER = [  # another run than the stored one, and what the refusal names
    (["--cases", "T/1"], "cases stored ['model_like', 'T/1'], given ['T/1']"),
    (["--budget", "2.5"], "thresholds stored {'budget': '5x the floor'}, given {'budget': "
                          "'2.5x the floor'}"),
    (["--budget", "5.0000001"], "given {'budget': '5.0000001x the floor'}"),
    (["--max-output-error", "0.1"], "thresholds stored"),
    (["--against", f"{MOD}:honest_fp32"], "against stored None"),
    (["--suite", "full"], "suite stored 'quick', given 'full'"),
    (["--exclude", "recipe:fp32=T/1"], "excluded stored {}"),
]


def test_resume_refuses_another_check(tmp_path):
    """One error line naming what differs, the store untouched; the stored run's own options
    then complete it."""
    args = ["recipe:fp32", "--cases", "model_like,T/1"]
    assert _cli(args, tmp_path).exit_code == 0
    _truncate(tmp_path, {0})
    parts = sorted((tmp_path / "parts").iterdir())
    tries = [(["recipe:fp32", "--cases", "model_like,T/1", *change], needle)
             for change, needle in _OTHER]
    tries.append(([f"{MOD}:honest_fp32", "--cases", "model_like,T/1"],
                  "kernels stored ['recipe:fp32'], given ['tests.check_kernels:honest_fp32']"))
    for given, needle in tries:
        res = _cli(given, tmp_path, "--resume")
        assert res.exit_code == 2 and res.output.startswith("error: --resume:"), res.output
        assert len(res.output.strip().splitlines()) == 1 and needle in res.output, res.output
    assert sorted((tmp_path / "parts").iterdir()) == parts
    assert StoreReader.read_only(tmp_path).manifest.state == "interrupted"
    assert _cli(args, tmp_path, "--resume").exit_code == 0
    assert StoreReader.read_only(tmp_path).complete


def test_resume_on_a_missing_or_empty_folder_runs_the_check(counted, tmp_path):
    """As a study's --resume: nothing stored, so everything runs; so too after a run stopped
    before its first record (it leaves its check.json alone)."""
    kernel, _ = counted
    args = [kernel, "--cases", "T/1"]
    assert _cli(args, tmp_path / "plain").exit_code == 0
    (tmp_path / "empty").mkdir()
    (tmp_path / "stop").write_text("0")
    assert _cli(args, tmp_path / "early", "--no-isolate").exit_code == 130
    assert [p.name for p in (tmp_path / "early").iterdir() if p.name != ".lock"] == [
        "check.json"]
    (tmp_path / "stop").unlink()
    for name in ("missing", "empty", "early"):
        assert _cli(args, tmp_path / name, "--resume").exit_code == 0
        assert identical(_table(tmp_path / name), _table(tmp_path / "plain"))


@pytest.mark.parametrize("extra,needle", [
    (["--force"], "--resume keeps the records in --out and --force replaces them"),
    # --redraw names every option that would change the records (the kernels, the cases, ...)
    (["--redraw"], "--redraw draws from the stored records: it takes no KERNELS, --device, "
                   "--cases, --resume"),
])
def test_resume_with_force_or_redraw_is_a_usage_error(extra, needle, tmp_path):
    res = _cli(["recipe:fp32", "--cases", "T/1"], tmp_path, "--resume", *extra)
    assert res.exit_code == 2 and needle in res.output and not any(tmp_path.iterdir())


def test_resume_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    res = _cli(["recipe:fp32", "--cases", "T/1"], tmp_path, "--resume")
    assert res.exit_code == 2 and "holds no check run" in res.output
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_an_isolated_worker_stopped_by_a_signal_is_an_interrupt_and_resume_completes(
        counted, tmp_path):
    """Ctrl-C and ``timeout`` signal the whole process group: a worker that dies of SIGTERM
    before the check hears of it leaves its case without a record (exit 143), not a crash that
    --resume would keep; resumed, the records are one run's."""
    kernel, _ = counted
    args = [kernel, "--cases", "model_like,T/1"]
    assert _cli(args, tmp_path / "whole").exit_code == 0
    (tmp_path / "signal").touch()
    res = _cli([*args, "--isolate"], tmp_path / "cut")
    assert res.exit_code == 143, res.output
    assert "terminated: 1 of 2 records in" in " ".join(res.output.split())
    assert [r["case"] for r in StoreReader.read_only(tmp_path / "cut").records()] == [
        "model_like"]
    (tmp_path / "signal").unlink()
    assert _cli([*args, "--isolate"], tmp_path / "cut", "--resume").exit_code == 0
    assert identical(_table(tmp_path / "cut"), _table(tmp_path / "whole"))


def test_another_check_into_the_same_folder_is_refused_and_loses_nothing(tmp_path):
    """The README's check lines one after another into one --out: the second (other kernels)
    is refused in one line naming what differs, --force and another --out; the first run's
    records and report stay as they were. With --force it replaces them; the same check run
    again replaces its own records without asking."""
    out = tmp_path / "check"
    assert _cli(["recipe:fp32", "--cases", "T/1"], out).exit_code == 0
    first, report = _table(out), (out / "report.md").read_text()
    res = _cli(["recipe:fp64", "--cases", "T/1"], out)
    assert res.exit_code == 2, res.output
    line = " ".join(res.output.split())
    assert line.startswith(f"error: --out '{out}' holds the records of another check (kernels "
                           "stored ['recipe:fp32'], given ['recipe:fp64'])")
    assert "choose another --out, or --force to replace them" in line
    assert len(res.output.strip().splitlines()) == 1
    assert identical(_table(out), first) and (out / "report.md").read_text() == report
    # other options are another check too (here the cases)
    res = _cli(["recipe:fp32", "--cases", "T/1,T/17"], out)
    assert res.exit_code == 2 and "cases stored ['T/1'], given ['T/1', 'T/17']" in res.output
    assert _cli(["recipe:fp32", "--cases", "T/1"], out).exit_code == 0  # the same: run again
    assert identical(_table(out), first)
    assert _cli(["recipe:fp64", "--cases", "T/1"], out, "--force").exit_code == 0
    assert {r["kernel"] for r in StoreReader.read_only(out).records()} == {"recipe:fp64"}
