"""What pyproject.toml declares and what the README and docs tell a user to install agree: the
extra for Python use of the Triton kernels exists and holds Triton (and not CuPy), and every
extra named anywhere (``pip install 'kdalab[X]'``, ``".[X]"``) is declared."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_EXTRA = re.compile(r"""(?:kdalab|\.)\[([A-Za-z0-9_,-]+)\]""")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _extras() -> dict[str, list[str]]:
    return _pyproject()["project"]["optional-dependencies"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_kernels_extra_holds_triton_and_not_cupy():
    extras = _extras()
    assert "triton" in _names(extras["kernels"])
    assert not any(n.startswith("cupy") for n in _names(extras["kernels"]))
    # the CuPy emulation extra is apart from it, and brings no Triton
    assert any(n.startswith("cupy") for n in _names(extras["gpu-models"]))
    assert "triton" not in _names(extras["gpu-models"])
    # the tests import the kernels: the test extra keeps Triton, with the same bound
    kernels_triton = [r for r in extras["kernels"] if r.startswith("triton")]
    assert kernels_triton and set(kernels_triton) <= set(extras["test"])


def test_the_readme_says_how_to_install_for_python_use_of_the_kernels():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'pip install -e ".[kernels]"' in readme
    # said before the first Python import of the kernels
    assert readme.index(".[kernels]") < readme.index("from kdalab.kernels import")


def test_every_extra_named_in_the_docs_and_messages_is_declared():
    declared = set(_extras())
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "src").rglob("*.py"))]
    named = {}
    for path in files:
        for match in _EXTRA.finditer(path.read_text(encoding="utf-8")):
            for extra in match.group(1).split(","):
                named.setdefault(extra, path.relative_to(ROOT))
    assert named, "no extra named anywhere: the pattern is wrong"
    unknown = {e: str(p) for e, p in named.items() if e not in declared}
    assert not unknown, f"extras named but not declared in pyproject.toml: {unknown}"
