"""The design pages stay design: docs/kernels.md short, without commit hashes or dates, and
every repository path a page names (``scripts/...``, ``benchmarks/...``, ``src/...``) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
KERNELS = ROOT / "docs" / "kernels.md"

#: a commit-hash-like token: 7 to 40 hex digits standing alone (a decimal of 7+ digits counts
#: too: the page writes large numbers with separators, 131,072 or 1.07 GB)
HASH = re.compile(r"(?<![\w.])[0-9a-fA-F]{7,40}(?![\w])")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
#: a repository path as the pages write it (ending before the punctuation that closes a
#: sentence), optionally prefixed ``COMMIT:`` (a path into git history, not the tree)
PATH = re.compile(r"(?<![\w./-])((?:[0-9a-f]{7,40}:)?(?:scripts|benchmarks|src)/[\w./-]*\w)")
#: the other way a page names a path in git history: ``path (in git at commit COMMIT``
HISTORY_AFTER = re.compile(r" \(in git at commit [0-9a-f]{7,40}")


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def named_paths(text: str) -> list[str]:
    """The repository paths a page names, less those it names as git history."""
    found = []
    for m in PATH.finditer(text):
        token = m.group(1)
        if ":" in token or HISTORY_AFTER.match(text, m.end()):
            continue
        found.append(token)
    return found


def test_kernels_page_is_short():
    assert len(lines(KERNELS)) <= 300


def test_kernels_page_has_no_long_line():
    long = [(i, len(line)) for i, line in enumerate(lines(KERNELS), 1) if len(line) > 100]
    assert long == []


def test_kernels_page_has_no_commit_hash_or_date():
    text = KERNELS.read_text(encoding="utf-8")
    assert HASH.findall(text) == []
    assert DATE.findall(text) == []


def test_kernels_page_keeps_its_decision_record():
    text = KERNELS.read_text(encoding="utf-8")
    record = text.split("\n## Decision record\n", 1)
    assert len(record) == 2, "docs/kernels.md has no '## Decision record' section"
    entries = [line for line in record[1].splitlines() if line.startswith("- **")]
    assert len(entries) >= 10


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    missing = sorted({p for p in named_paths(page.read_text(encoding="utf-8"))
                      if not (ROOT / p).exists()})
    assert missing == [], f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("text, want", [
    ("run `scripts/sm90_report.py` and `benchmarks/bench_kernel.py --grid`.",
     ["scripts/sm90_report.py", "benchmarks/bench_kernel.py"]),
    ("(`src/kdalab/kernels/`, see src/kdalab/kda/intra.py)",
     ["src/kdalab/kernels", "src/kdalab/kda/intra.py"]),
    ("`git show 894fd20:benchmarks/results/x.json` is history", []),
    ("bash scripts/device/old.sh (in git at commit 386f211), part (b)", []),
    ("the one-off tensorcore_pack.py and kdalab/compat/fla.py", []),
])
def test_named_paths_reads_paths_as_the_pages_write_them(text, want):
    assert named_paths(text) == want


def test_the_checks_can_fail():
    # a deleted script, a commit hash, a date and a long line are each caught
    assert named_paths("see `scripts/launch_replay.py`") == ["scripts/launch_replay.py"]
    assert not (ROOT / "scripts/launch_replay.py").exists()
    assert HASH.findall("measured at 3fe7ea3 and 1034880") == ["3fe7ea3", "1034880"]
    assert HASH.findall("3xTF32, 131,072 tokens, 1.07 GB, e5m10, sm_90a") == []
    assert DATE.findall("on 2026-12-01") == ["2026-12-01"]
