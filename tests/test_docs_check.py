"""docs/check.md's section on captured inputs, which the README, ``check --help`` and
``kdalab.check.capture`` point at, says what the code does: its runnable example runs and writes
the files it says, the file format it tabulates is the reader's, and every form of call the
capture skips is named there."""

from __future__ import annotations

import re
from pathlib import Path

from kdalab.check.records import read
from kdalab.check.tensors import OPTIONAL, REQUIRED
from tests.cli_run import cli

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end > 0 else None]


def _capture_module():
    import importlib

    return importlib.import_module("kdalab.check.capture")  # (the package exports the function)


def test_the_pointers_lead_to_the_section():
    assert "docs/check.md" in _capture_module().__doc__
    assert "--inputs" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Captured inputs: `--inputs`" in DOC


def test_the_tabulated_file_format_is_the_readers():
    section = _section("Captured inputs")
    named = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)?(?:, `(\w+)`)?", section, flags=re.M))
    names = {n for row in named for n in row if n}
    assert names == set(REQUIRED) | set(OPTIONAL)
    assert "`lower_bound` (required" in section and "`scale` (default" in section


def test_every_call_the_capture_skips_is_named():
    import inspect

    capture = _capture_module()
    section = " ".join(_section("Captured inputs").split())
    for keyword in re.findall(r'args\.get\("(\w+)"', inspect.getsource(capture._why_not)):
        assert f"`{keyword}" in section, keyword


def test_the_runnable_example_runs_and_check_grades_what_it_wrote(tmp_path, capsys,
                                                                  monkeypatch):
    code = re.search(r"```python\n(.*?)```", _section("Captured inputs"), flags=re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/check.md", "exec"), {})
    assert sorted(p.name for p in (tmp_path / "captured").iterdir()) == [
        "call_0000.safetensors", "call_0001.safetensors"]
    monkeypatch.chdir(ROOT)  # the kernels of tests/check_kernels.py, as the doc names them
    for kernel, status, exit_code in (("honest_fp32", ["pass", "pass"], 0),
                                      ("drops_initial_state", ["pass", "fail"], 1)):
        out = tmp_path / kernel
        done, _, err = cli(capsys, "check", f"tests/check_kernels.py:{kernel}", "--device",
                           "cpu", "--no-isolate", "--inputs", str(tmp_path / "captured"),
                           "--out", str(out), "--quiet")
        assert done == exit_code, err
        assert [r["status"] for r in read(out)] == status
