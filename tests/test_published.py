"""The seed document's published values: kdalab's package data (``kdalab/data/seed_tables.json``)
is the document's three tables as it prints them, and ``kdalab reproduce`` ends with its verdict
on them, compared at the printed precision.

``tests/data/seed_document_tables.txt`` holds the document's own lines of the three tables (its
headings, then each table's tab-separated header and rows, LaTeX cells and all), copied
unchanged; the package data is checked against them here, and they against the document where
it is on this machine (``KDALAB_SEED_DOCUMENT``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kdalab.views.tables import published_seed_tables
from tests.cli_run import cli

DATA = Path(__file__).parent / "data"
EXCERPT = DATA / "seed_document_tables.txt"
SEED_DOCUMENT = Path(os.environ.get("KDALAB_SEED_DOCUMENT",
                                    "/work/shared/seeds/000_4ce7eed417112823.txt"))
#: the document's headings, and the names the package data gives its tables
HEADINGS = {"Exponent boundary": "exponent_boundary",
            "High-power stress input": "high_power_stress",
            "Ordinary random input": "ordinary_random"}


def _cell(latex: str) -> str:
    """A cell as the document typesets it, written as kdalab prints it: $8.80\\times {10}^{-7}$
    is 8.80e-7, $1.96\\times {10}^1$ is 1.96e1, $\\mathrm{\\infty }$ is ∞, $L^{16}$ is L^16."""
    text = latex.strip()
    if not (text.startswith("$") and text.endswith("$")):
        return text
    body = text[1:-1].strip()
    if body.replace(" ", "") == r"\mathrm{\infty}":
        return "∞"
    power = re.fullmatch(r"L\^\{?(\d+)\}?", body)
    if power:
        return f"L^{power.group(1)}"
    sci = re.fullmatch(r"([\d.]+)\\times \{10\}\^\{?(-?\d+)\}?", body)
    if sci:
        return f"{sci.group(1)}e{int(sci.group(2))}"
    if re.fullmatch(r"[\d.]+", body):
        return body
    raise ValueError(f"a cell this test cannot read: {latex!r}")


def _document_tables() -> dict[str, dict]:
    tables: dict[str, dict] = {}
    current = None
    for line in EXCERPT.read_text(encoding="utf-8").splitlines():
        if line in HEADINGS:
            current = tables.setdefault(HEADINGS[line], {"columns": None, "rows": []})
        elif current["columns"] is None:
            current["columns"] = line.split("\t")
        else:
            current["rows"].append([_cell(c) for c in line.split("\t")])
    return tables


def test_the_package_data_is_the_seed_documents_tables_as_printed():
    document = _document_tables()
    assert published_seed_tables() == document
    assert sum(len(row) - 1 for t in document.values() for row in t["rows"]) == 76


def test_the_excerpt_is_the_seed_documents_own_lines():
    if not SEED_DOCUMENT.is_file():
        pytest.skip(f"the seed document is not on this machine ({SEED_DOCUMENT})")
    document = SEED_DOCUMENT.read_text(encoding="utf-8")
    blocks = EXCERPT.read_text(encoding="utf-8").split("\n")
    table: list[str] = []
    for line in blocks + [""]:
        if line in HEADINGS or not line:
            if table:  # a table's header and rows: consecutive lines of the document
                assert "\n".join(table) + "\n" in document, table[0]
            table = []
            assert not line or f"\n{line}\n" in document
        else:
            table.append(line)


def test_reproduce_ends_with_its_verdict(tmp_path, capsys):
    code, out, err = cli(capsys, "reproduce", "--out", str(tmp_path / "h200"))
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "76 of 76 published values reproduced"


def test_reproduce_names_the_values_that_differ_and_exits_1(tmp_path, capsys):
    """The seed code's CPU fallback (an fp16 accumulator rounded after every product) is not
    the H200 the document measured: 11 of its values differ, each named."""
    code, out, err = cli(capsys, "reproduce", "--accumulation", "fp16-seq", "--quiet", "--out",
                         str(tmp_path / "seq"))
    assert code == 1, err
    line = " ".join(out.split())
    assert line.startswith("65 of 76 published values reproduced; these differ: ")
    assert "high_power_stress, C = 16, INV total: published 3.27e-3, computed 6.06e-3" in line
    assert line.count("published") == 1 + 11


def test_a_value_is_compared_as_printed(tmp_path, capsys, monkeypatch):
    """A published value one digit off is named; a table row not computed is too."""
    import kdalab.views.tables as tables

    published = published_seed_tables()
    published["ordinary_random"]["rows"][0][2] = "1.79e-5"  # C = 8, INV total: 1.78e-5
    published["exponent_boundary"]["rows"].append(["64", "0%", "0", "0", "∞", "∞"])
    monkeypatch.setattr(tables, "published_seed_tables", lambda: published)
    code, out, _ = cli(capsys, "reproduce", "--quiet", "--out", str(tmp_path / "h200"))
    assert code == 1
    line = " ".join(out.split())
    assert line.startswith("75 of 81 published values reproduced; these differ: "
                           "exponent_boundary, C = 64, inverse finite: published 0%, not "
                           "computed;")
    assert "ordinary_random, C = 8, INV total: published 1.79e-5, computed 1.78e-5" in line


def test_another_configuration_has_no_verdict(tmp_path, capsys):
    code, out, _ = cli(capsys, "reproduce", "--chunks", "4", "--seeds", "0", "--dim", "16",
                       "--out", str(tmp_path / "small"))
    assert code == 0
    assert out.strip().splitlines()[-1].startswith("not the seed document's configuration")
