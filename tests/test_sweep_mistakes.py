"""The studies' mistakes of issue 21, each through the command line's error boundary: one
``error:`` line and exit code 2 where the user asked for something impossible, and every file
written where a study's panel holds nothing a log axis can place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_run import cli

ROOT = Path(__file__).parents[1]


def one_error(code: int, err: str, starts: str) -> None:
    lines = err.strip("\n").splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"error: {starts}"), err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["sweep", "reproduce"])
def test_a_chunk_too_large_for_memory_is_refused_before_any_folder(command, tmp_path, capsys):
    out = tmp_path / "big"
    code, _, err = cli(capsys, command, "--chunks", "100000", "--out", str(out))
    one_error(code, err, "--chunks: a chunk of 100000 needs about")
    assert not out.exists()


def test_a_start_that_fails_leaves_no_manifest(tmp_path, monkeypatch):
    import kdalab.studies.plan as plan
    from kdalab.runner import open_store, run_into_store
    from kdalab.studies.sweep import SweepConfig, SweepPlan

    def broken(*args, **kwargs):
        raise MemoryError("no room")

    monkeypatch.setattr(plan, "iter_batch_tables", broken)
    study = SweepPlan.of(SweepConfig(chunks=(4,), seeds=(0,), dims=(8,)))
    (tmp_path / "kept.txt").write_text("mine")
    for out in (tmp_path / "new", tmp_path):  # a folder made by the store, and one that was not
        with pytest.raises(MemoryError):
            with open_store(study, out, force=True) as store:
                run_into_store(study, store)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "kept.txt"]


def _views_all_there(out) -> int:
    views = json.loads((out / "manifest.json").read_text())["views"]
    assert views and all((out / v).exists() for v in views)
    return len(views)


def test_end_to_end_with_only_non_finite_panels_writes_every_file(tmp_path, capsys):
    out = tmp_path / "e2e"
    code, _, err = cli(capsys, "run", "end-to-end", "--quick", "--variants",
                       "flashkda/chunk_start/neumann", "--chunks", "16", "--families",
                       "saturated", "--lower-bounds", "-5,unbounded", "--out", str(out),
                       "--quiet")
    assert code == 0, err
    assert _views_all_there(out) == 15  # 5 tables, 5 plots in PNG and SVG
    # the unbounded gate's panels hold only non-finite errors: drawn, with a note
    assert "no finite non-zero error" in (out / "e2e_output_vs_chunk_unbounded.svg").read_text()


def test_diagonal_tile_of_chunk_1_writes_every_file(tmp_path, capsys):
    out = tmp_path / "dt"
    code, _, err = cli(capsys, "run", "diagonal-tile", "--chunks", "1", "--out", str(out),
                       "--quiet")
    assert code == 0, err
    assert _views_all_there(out) == 6
    assert "no finite non-zero error" in (out / "diagonal-error.svg").read_text()


def test_redraw_of_another_tools_folder_is_one_line(tmp_path, capsys):
    sweep, tile = tmp_path / "sweep", tmp_path / "tile"
    assert cli(capsys, "sweep", "--chunks", "4", "--seeds", "0", "--dims", "8", "--out",
               str(sweep), "--quiet")[0] == 0
    assert cli(capsys, "run", "diagonal-tile", "--chunks", "2", "--seeds", "0",
               "--lower-bounds", "-1", "--out", str(tile), "--quiet")[0] == 0
    for args in (["run", "end-to-end", "--redraw", "--out", str(sweep)],
                 ["run", "dynamic-range", "--redraw", "--out", str(tile)],
                 ["run", "diagonal-tile", "--redraw", "--out", str(sweep)],
                 ["sweep", "--redraw", str(tile)]):
        code, _, err = cli(capsys, *args)
        one_error(code, err, "--redraw: ")
        assert "holds the records of" in err
    code, _, err = cli(capsys, "run", "diagonal-tile", "--redraw", "--out", str(tile), "--quiet")
    assert code == 0, err


@pytest.mark.parametrize("command", [
    ["run", "end-to-end", "--quick"], ["run", "dynamic-range"], ["run", "diagonal-tile"],
    ["sweep"], ["reproduce"]])
def test_a_foreign_folder_is_refused(command, tmp_path, capsys):
    (tmp_path / "report.md").write_text("someone else's")
    code, _, err = cli(capsys, *command, "--out", str(tmp_path), "--quiet")
    one_error(code, err, f"{tmp_path} is not empty and holds no kdalab store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_force_writes_beside_foreign_files_and_a_rerun_needs_resume(tmp_path, capsys):
    command = ["run", "diagonal-tile", "--chunks", "2", "--out", str(tmp_path), "--quiet"]
    (tmp_path / "report.md").write_text("someone else's")
    code, _, err = cli(capsys, *command, "--force")
    assert code == 0, err
    assert (tmp_path / "report.md").read_text() == "someone else's"
    code, _, err = cli(capsys, *command)
    one_error(code, err, f"{tmp_path} already holds")  # its own records: --resume or --force
    code, _, err = cli(capsys, *command, "--resume")
    assert code == 0, err


def test_a_ray_address_where_nothing_answers_gives_up_quickly(tmp_path):
    """As a command of its own (a test session may hold a Ray cluster already)."""
    pytest.importorskip("ray")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "kdalab", "sweep", "--backend", "ray",
                          "--address", "127.0.0.1:1", "--chunks", "4", "--seeds", "0", "--out",
                          str(tmp_path / "r")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert time.monotonic() - t0 < 60  # the probe's bound is 30 s; the rest is start-up
    one_error(res.returncode, res.stderr, "--address 127.0.0.1:1: no Ray cluster answers there")
    assert not (tmp_path / "r").exists()
