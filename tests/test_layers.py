"""The house's rules, checked on the source: no import cycle, layers that don't look up, no long
module without a reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "kdalab"
#: arith -> kda -> experiments -> views / cli; kernels stand alone. A module may import its own
#: layer and the layers listed for it (kdalab.errors and kdalab.params sit below every layer,
#: kdalab.timeline, the phase marks, below every layer that marks; kdalab.cudastart, CUDA's
#: start while torch imports, is the command line's and imports nothing of kdalab's).
BELOW = {"errors", "params", "timeline"}
ALLOWED = {
    "arith": {"arith", "errors"},
    "kda": {"arith", "kda"} | BELOW,
    "experiments": {"arith", "kda", "experiments"} | BELOW,
    "check": {"arith", "kda", "experiments", "check", "kernels"} | BELOW,
    "views": {"experiments", "check", "views"} | BELOW,  # views draw: no arithmetic
    "cli": {"arith", "kda", "experiments", "check", "views", "cli", "kernels", "cudastart"}
    | BELOW,
    "kernels": {"kernels"},
    "compat": {"compat", "kernels"},  # drop-ins for other libraries' call sites
    "params": {"arith", "errors"},
    "errors": set(),
    "timeline": set(),
    "cudastart": set(),
    "__main__": {"cli"},  # python -m kdalab
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every kdalab module ``name`` imports, at any depth of its code (lazy imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # "from pkg import sub" imports the submodule pkg.sub where there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # "import kdalab.arith.x.y" -> the deepest module
                t = t.rpartition(".")[0]
            if t.startswith("kdalab") and t != name:
                out.add(t)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)
    assert len(GRAPH) > 40  # the walk saw the whole package


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_layers_do_not_look_up():
    wrong = []
    for name, targets in GRAPH.items():
        layer = _layer(name)
        if layer is None:  # kdalab/__init__
            continue
        for t in targets:
            if _layer(t) is not None and _layer(t) not in ALLOWED[layer]:
                wrong.append(f"{name} imports {t}")
    assert wrong == []


def test_no_module_over_400_lines_without_a_reason():
    long = []
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if len(text.splitlines()) > 400 and "Why this module is long:" not in doc:
            long.append(f"{name}: {len(text.splitlines())} lines")
    assert long == []


def test_the_gpu_kernels_source_ships_with_the_package():
    from importlib import resources

    source = resources.files("kdalab.arith.gpu").joinpath("mma.cu").read_text()
    launched = {"mma_f16_acc", "mma_bf16_f32_acc", "mma_f16_f32_acc", "gemmex_f16_k8",
                "gemmex_f16_k16", "sgemm_slices"}
    for kernel in launched:
        assert f'extern "C" __global__ void {kernel}(' in source, kernel
