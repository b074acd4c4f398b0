"""The house's rules, checked on the source: no import cycle, layers that don't look up, no long
module without a reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "kdalab"
#: arith -> kda -> inputs / records -> studies / runner -> check -> hunt -> views -> cli;
#: kernels, compat and peers stand alone. A module may import its own layer and the layers
#: listed for it (kdalab.errors and kdalab.params sit below every layer, kdalab.timeline, the
#: phase marks, below every layer that marks).
BELOW = {"errors", "params", "timeline"}
ALLOWED = {
    "arith": {"arith", "errors"},
    "kda": {"arith", "kda"} | BELOW,
    "inputs": {"arith", "kda", "inputs"} | BELOW,
    "records": {"records"} | BELOW,
    "studies": {"arith", "kda", "inputs", "records", "studies"} | BELOW,
    "runner": {"records", "runner"} | BELOW,
    "check": {"arith", "kda", "inputs", "records", "studies", "runner", "check", "kernels",
              "peers"} | BELOW,
    "hunt": {"arith", "kda", "inputs", "records", "studies", "runner", "check", "hunt",
             "kernels", "peers"} | BELOW,
    "views": {"inputs", "records", "studies", "check", "hunt", "views"} | BELOW,  # no arithmetic
    "cli": {"arith", "kda", "inputs", "records", "studies", "runner", "check", "hunt", "views",
            "cli", "kernels", "peers"} | BELOW,
    "kernels": {"kernels"},
    "compat": {"kernels", "compat"},
    "peers": {"peers"},
    "params": {"arith", "errors"},
    "errors": set(),
    "timeline": set(),
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


def test_no_module_over_450_lines():  # issue 21: the limit, and no waiver
    long = [f"{name}: {n} lines" for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 450]
    assert long == []


def test_the_gpu_kernels_source_ships_with_the_package():
    from importlib import resources

    source = resources.files("kdalab.arith.gpu").joinpath("mma.cu").read_text()
    launched = {"mma_f16_acc", "mma_bf16_f32_acc", "mma_f16_f32_acc", "gemmex_f16_k8",
                "gemmex_f16_k16", "sgemm_slices"}
    for kernel in launched:
        assert f'extern "C" __global__ void {kernel}(' in source, kernel
