"""docs/BENCHMARKS.md is generated from benchmarks/results/*.json (benchmarks/report.py): every
result file has the schema, and the page is exactly what the files give, so the two cannot drift."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import report  # noqa: E402


def test_every_result_file_has_the_schema():
    results = report.load()
    assert results, "no benchmark results"
    for data in results:
        assert report.check_schema(data, data["benchmark"]) == []


def test_the_page_is_what_the_results_give():
    text = report.render(report.load())
    assert report.PAGE.read_text(encoding="utf-8") == text, (
        "docs/BENCHMARKS.md is stale: run python benchmarks/report.py")
    assert text.count("\n") <= 250


@pytest.mark.parametrize("broken", [
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "command": "k", "rows": []},
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "command": "k",
     "rows": [{"target": "t", "value": "fast", "unit": "x"}]},
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "command": "k",
     "rows": [{"target": "t", "value": 1.0, "unit": "x", "when": "today"}]},
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "rows": [
        {"target": "t", "value": 1.0, "unit": "x"}]},
])
def test_the_schema_check_can_fail(broken):
    assert report.check_schema(broken, "x.json") != []
