"""SIGTERM (``kill``, ``timeout``, a job scheduler) stops every command as Ctrl-C does: the
boundary (:func:`kdalab.cli.main`) installs one handler for both, so each command keeps its
finished work, says what it kept and how to go on (``terminated: …``) and exits with 143.

The signals here are real: the process sends SIGTERM to itself from inside the work (after the
first batch is stored, or from a planted kernel), as ``kill <pid>`` would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kdalab.records import RunStore
from tests.cli_run import cli

ROOT = Path(__file__).resolve().parent.parent


def _terminate_after_first_batch(monkeypatch) -> None:
    """The runner sends this process SIGTERM once the first batch is stored."""
    import kdalab.runner

    real = kdalab.runner.run_into_store

    def run_into_store(study, store, *, progress=None, **kw):
        def stored(batch):
            if progress is not None:
                progress(batch)
            os.kill(os.getpid(), signal.SIGTERM)

        return real(study, store, progress=stored, **kw)

    monkeypatch.setattr(kdalab.runner, "run_into_store", run_into_store)


@pytest.mark.parametrize("command,again", [
    (["sweep", "--chunks", "4,8", "--seeds", "0-1", "--dims", "16"],
     "'kdalab sweep --out {out} --resume' continues with the rest"),
    (["reproduce", "--chunks", "4,8", "--seeds", "0", "--dim", "16"],
     "'kdalab reproduce (the same options) --out {out} --resume' continues with the rest"),
    (["run", "diagonal-tile", "--chunks", "2,4"],
     "'kdalab run diagonal-tile (the same options) --out {out} --resume' continues with the "
     "rest"),
    (["run", "end-to-end", "--quick", "--chunks", "8,16", "--variants",
      "fp32/chunk_start/exact", "--families", "model_like", "--lower-bounds", "-5",
      "--seeds", "0"],
     "'kdalab run end-to-end (the same options) --out {out} --resume' continues with the rest"),
])
def test_sigterm_keeps_what_is_stored_says_so_and_exits_143(command, again, tmp_path, capsys,
                                                             monkeypatch):
    _terminate_after_first_batch(monkeypatch)
    out = tmp_path / "out"
    code, _, err = cli(capsys, *command, "--out", str(out), "--quiet")
    assert code == 143, err
    store = RunStore.read_only(out)
    kept = int(store.done.sum())
    assert 1 <= kept < store.runs and store.manifest.state == "interrupted"
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"terminated: {kept} of {store.runs} ")
    assert line.endswith(again.format(out=out)), line
    monkeypatch.undo()  # and the command it names completes the work
    code, _, err = cli(capsys, *command, "--out", str(out), "--quiet", "--resume")
    assert code == 0, err
    assert RunStore.read_only(out).complete


def test_the_boundary_restores_the_handlers_it_installed(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    cli(capsys, "safe-chunk", "--lower-bound", "-5")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _planted(tmp_path: Path, after: int) -> str:
    """A kernel (the fp32 recipe) that sends its process SIGTERM on its ``after``-th call."""
    path = tmp_path / "planted.py"
    path.write_text(
        "import os, signal\nfrom tests.check_kernels import honest_fp32\n\n"
        "def kernel(q, k, v, g, beta, **kw):\n"
        "    kernel.calls = getattr(kernel, 'calls', 0) + 1\n"
        f"    if kernel.calls == {after}:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return honest_fp32(q, k, v, g, beta, **kw)\n")
    return f"{path}:kernel"


def test_sigterm_stops_a_hunt_that_leaves_its_worst_case_and_report(tmp_path, capsys):
    """The hunt's trials so far, its worst case (worst.json, worst.safetensors) and its report
    are written as on Ctrl-C; --resume continues it."""
    kernel = _planted(tmp_path, after=7)
    out = tmp_path / "h"
    code, _, err = cli(capsys, "hunt", kernel, "--device", "cpu", "--trials", "20",
                       "--max-T", "32", "--max-heads", "1", "--dims", "16", "--out", str(out),
                       "--quiet")
    assert code == 143, err
    trials = (out / "trials.jsonl").read_text().splitlines()
    assert len(trials) >= 3  # each trial calls the kernel twice (determinism)
    assert err.strip() == (f"terminated: {len(trials)} trials and the worst so far in {out}/; "
                           f"'kdalab hunt {kernel} --out {out} --resume' continues the hunt")
    worst = json.loads((out / "worst.json").read_text())
    assert worst["trial"] < len(trials)
    for name in ("worst.safetensors", "report.md", "hunt.json"):
        assert (out / name).is_file(), name


def test_sigterm_stops_a_check_in_process_keeping_its_records(tmp_path, capsys):
    kernel = _planted(tmp_path, after=3)  # model_like's two calls, then T/1's first
    out = tmp_path / "c"
    code, _, err = cli(capsys, "check", kernel, "--device", "cpu", "--no-isolate", "--cases",
                       "model_like,T/1", "--out", str(out), "--quiet")
    assert code == 143, err
    assert "terminated: 1 of 2 records in" in " ".join(err.split())
    assert [r["case"] for r in RunStore.read_only(out).records()] == ["model_like"]


def test_sigterm_to_a_sweep_process_from_outside(tmp_path):
    """As ``timeout`` or ``kill`` sends it: a whole process, its parts kept, exit 143."""
    import time

    out = tmp_path / "sweep"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.Popen([sys.executable, "-c", "from kdalab.records import writer; "
                          "writer.PART_SECONDS = 0.05; from kdalab.cli import main; main()",
                          "sweep", "--chunks", "4-64:4", "--seeds", "0-63", "--dims", "16",
                          "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                         cwd=ROOT)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and p.poll() is None:
            if list(out.glob("parts/*.parquet")):
                break
            time.sleep(0.05)
        assert p.poll() is None, "the sweep ended before it could be terminated"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    kept = int(RunStore.read_only(out).done.sum())
    assert err.strip().splitlines()[-1] == (
        f"terminated: {kept} of 3072 runs stored in {out}; 'kdalab sweep --out {out} --resume' "
        "continues with the rest")
