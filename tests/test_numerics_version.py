"""A reminder to bump :data:`kdalab.records.identity.NUMERICS_VERSION`: ``--resume`` keeps a
store's records when its numerics version is this kdalab's, so a change that changes the numbers
of an unchanged configuration must bump it (docs/sweeps.md, "Identity").

The test keeps a digest of the code that decides the records (every module of ``arith``, ``kda``,
``inputs``, ``studies`` and ``check``), its comments and docstrings left out, in
``tests/data/numerics_digest.json`` with the numerics version it was recorded at. When that code
changes the test fails, naming the files, until the digest is renewed::

    python tests/test_numerics_version.py --update

and whoever renews it decides: the records of an unchanged configuration change (bump
NUMERICS_VERSION first), or they do not (a refactoring: only the digest)."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "kdalab"
DIGEST = ROOT / "tests" / "data" / "numerics_digest.json"
#: the packages whose code decides what a store's records hold
DECIDING = ("arith", "kda", "inputs", "studies", "check")


def code_only(source: str) -> str:
    """``source`` without its comments, docstrings, blank lines and indentation-free trailing
    spaces: what a comment or a reflowed docstring changes does not count. Tokens are found by
    ``tokenize`` and docstrings by ``ast``, whose positions do not depend on the Python version."""
    lines = source.splitlines()
    drop: set[int] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            drop.update(range(body[0].lineno - 1, body[0].end_lineno))
    cut: dict[int, int] = {}  # line -> column where a comment starts
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0] - 1] = tok.start[1]
    kept = []
    for i, line in enumerate(lines):
        if i in drop:
            continue
        line = line[:cut[i]] if i in cut else line
        if line.strip():
            kept.append(line.rstrip())
    return "\n".join(kept) + "\n"


def digests() -> dict[str, str]:
    """sha256 of each deciding module's code, by its path under src/kdalab."""
    out = {}
    for package in DECIDING:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            text = code_only(path.read_text(encoding="utf-8"))
            out[path.relative_to(PACKAGE).as_posix()] = hashlib.sha256(text.encode()).hexdigest()
    return out


def test_comments_and_docstrings_do_not_count_and_code_does():
    a = 'def f(x):\n    """Doc."""\n    return x + 1  # why\n'
    b = 'def f(x):\n    """Another doc,\n    on two lines."""\n    # a note\n    return x + 1\n'
    assert code_only(a) == code_only(b) == "def f(x):\n    return x + 1\n"
    assert code_only(a) != code_only(a.replace("x + 1", "x + 2"))
    assert code_only("s = '#not a comment'\n") == "s = '#not a comment'\n"


def test_the_code_that_decides_the_records_is_the_recorded_one():
    from kdalab.records.identity import NUMERICS_VERSION

    recorded = json.loads(DIGEST.read_text(encoding="utf-8"))
    now = digests()
    changed = sorted(p for p in {*now, *recorded["files"]}
                     if now.get(p) != recorded["files"].get(p))
    assert recorded["numerics_version"] == NUMERICS_VERSION, (
        f"NUMERICS_VERSION is {NUMERICS_VERSION}, the digest was recorded at "
        f"{recorded['numerics_version']}: renew it (python tests/test_numerics_version.py "
        "--update)")
    assert not changed, (
        f"the code that decides the records changed ({', '.join(changed)}). If the records of an "
        "unchanged configuration change, bump NUMERICS_VERSION in "
        "src/kdalab/records/identity.py (--resume then refuses older stores); either way, "
        "renew the digest: python tests/test_numerics_version.py --update")


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    sys.path.insert(0, str(ROOT / "src"))
    from kdalab.records.identity import NUMERICS_VERSION

    DIGEST.write_text(json.dumps({"numerics_version": NUMERICS_VERSION, "files": digests()},
                                 indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {DIGEST.relative_to(ROOT)} (numerics version {NUMERICS_VERSION})")
