"""Long work says how it goes where stderr is not a terminal (a log, CI, ``nohup``): a plain
line every :data:`kdalab.cli.progress.PLAIN_EVERY_S` seconds (here every update, the interval
set to 0), for studies, sweeps, check and hunt alike; and the studies print their table at the
end, as sweep does. (Under pytest's capture stderr is not a terminal.)"""

from __future__ import annotations

import re

import pytest

import kdalab.cli.progress as progress
from tests.cli_run import cli


@pytest.fixture
def every_update(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)


def _lines(err: str, what: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(f"{what}: ")]


def test_the_line_says_the_share_the_count_the_time_and_what_is_left(monkeypatch):
    bar = progress.WeightedProgress("runs", 3072, 4.0, quiet=True, what="sweep")
    bar.start_at(1000, 1.0)  # a resumed store: a quarter done before, not timed
    bar.advance(135, 1.0, note="chunk 16")
    monkeypatch.setattr(progress.time, "monotonic", lambda: bar._start + 60.0)  # a minute on
    assert bar.line() == ("sweep: 50% (1,135 of 3,072 runs; chunk 16) after 1 min 00 s, "
                          "about 2 min 00 s left")
    assert progress._duration(3725) == "1 h 02 min" and progress._duration(7) == "7 s"


def test_without_a_terminal_a_sweep_prints_plain_lines(tmp_path, capsys, every_update):
    code, _, err = cli(capsys, "sweep", "--chunks", "4,8", "--seeds", "0-1", "--dims", "16",
                       "--families", "floor", "--out", str(tmp_path / "s"))
    assert code == 0, err
    lines = _lines(err, "sweep")
    assert lines and all(re.fullmatch(r"sweep: \d+% \(\d of 4 runs\) after \d+ s(, about .*)?",
                                      ln) for ln in lines), lines
    assert lines[-1].startswith("sweep: 100% (4 of 4 runs)")
    assert "\x1b" not in err  # no bar's control characters in a log


def test_quiet_prints_no_progress(tmp_path, capsys, every_update):
    code, _, err = cli(capsys, "sweep", "--chunks", "4", "--seeds", "0", "--dims", "16",
                       "--out", str(tmp_path / "s"), "--quiet")
    assert code == 0 and err == ""


def test_without_a_terminal_a_check_prints_plain_lines(tmp_path, capsys, every_update):
    code, _, err = cli(capsys, "check", "recipe:fp32", "--device", "cpu", "--no-isolate",
                       "--cases", "T/1,T/17", "--out", str(tmp_path / "c"))
    assert code == 0, err
    lines = _lines(err, "check")
    assert lines[0].startswith("check: 50% (1 of 2 records; T/1 · recipe:fp32) after ")
    assert lines[-1].startswith("check: 100% (2 of 2 records; T/17 · recipe:fp32) after ")


def test_without_a_terminal_a_hunt_prints_plain_lines(tmp_path, capsys, every_update):
    code, _, err = cli(capsys, "hunt", "recipe:fp32", "--device", "cpu", "--trials", "2",
                       "--max-T", "32", "--max-heads", "1", "--dims", "16", "--out",
                       str(tmp_path / "h"))
    assert code == 0, err
    lines = _lines(err, "hunt")
    assert [ln.split(" after ")[0].split(";")[0] for ln in lines] == [
        "hunt: 50% (1 of 2 trials", "hunt: 100% (2 of 2 trials"]
    assert all("; worst output error " in ln for ln in lines)


def test_run_end_to_end_quick_prints_its_table(tmp_path, capsys):
    code, out, err = cli(capsys, "run", "end-to-end", "--quick", "--chunks", "8,16",
                         "--families", "model_like", "--lower-bounds", "-5", "--seeds", "0",
                         "--variants", "fp32/chunk_start/exact", "--out", str(tmp_path / "e"))
    assert code == 0, err
    text = out.splitlines()
    title = next(i for i, ln in enumerate(text) if ln.startswith("Output relative RMSE"))
    assert re.match(r"\s*family\s+gate\s+variant\s+C=8\s+C=16", text[title + 1])
    assert re.match(r"\s*model_like\s+lb=-5\s+fp32/chunk_start/exact\s+\S+e-\d+\s+\S+e-\d+",
                    text[title + 3])


def test_run_dynamic_range_prints_its_tables(tmp_path, capsys):
    code, out, err = cli(capsys, "run", "dynamic-range", "--out", str(tmp_path / "d"),
                         "--chunks", "4,18", "--lower-bounds", "-1,-5", "--formats", "bf16",
                         "--model-seeds", "0", "--dim", "4")
    assert code == 0, err
    assert "Calculator: max_chunk (max_chunk_normal where it differs), exp2 FTZ path" in out
    assert "Worst case: measured vs calculator" in out
    row = next(ln for ln in out.splitlines() if ln.lstrip().startswith("bf16") and "start" in ln)
    assert re.search(r"\b17\b", row)  # bf16 from the chunk start at lb = -5: C <= 17
