"""The project's layers hold by construction: no import circles among its modules, function-local
imports included, and the runtime (what a device runs: pock_mlir/runtime/, bundles, checkpoints,
data, pock-train, the federated clients) imports nothing of the compile side, PyTorch or
torch-mlir, however deep and however late.

The import graph is read from the source (ast), so an import inside a function, which runs only
when the function is called, counts as much as one at the top."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# module name prefix -> its directory (pyproject's package-dir installs passes/ and dialects/ inside pock_mlir)
PACKAGES = {
    "pock_mlir": "pock_mlir",
    "pock_mlir.passes": "passes",
    "pock_mlir.dialects": "dialects",
    "bench": "bench",
    "tools": "tools",
}
RUNTIME = (
    "pock_mlir.runtime",
    "pock_mlir.bundle",
    "pock_mlir.checkpoint",
    "pock_mlir.data",
    "pock_mlir.abi",
    "pock_mlir.files",
    "pock_mlir.tools.pock_train",
    "pock_mlir.federated.client",
    "pock_mlir.federated.wire",
)
COMPILE_SIDE = (
    "pock_mlir.program",
    "pock_mlir.compiler",
    "pock_mlir.frontend",
    "pock_mlir.passes",
    "pock_mlir.dialects",
    "pock_mlir.autodiff",
    "pock_mlir.training",
    "pock_mlir.op_facts",
    "pock_mlir.torch_builder",
    "pock_mlir.sparse",
    "pock_mlir.search",
    "pock_mlir.layers",
)
COMPILERS = ("torch", "torch_mlir", "iree.compiler")  # third-party modules only the compile side may import


def _modules() -> dict[str, Path]:
    found = {}
    for prefix, directory in PACKAGES.items():
        for path in sorted((ROOT / directory).rglob("*.py")):
            parts = path.relative_to(ROOT / directory).with_suffix("").parts
            if directory == "pock_mlir" and parts[0] in ("passes", "dialects"):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((prefix, *parts))] = path
    return found


MODULES = _modules()


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _imported(module: str) -> set[str]:
    """Every module `module` imports, at any depth of its code: `from a import b` imports a.b when
    that is a module, else a; relative imports resolved."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
    return names


def _project_module(name: str) -> str | None:
    """The project module that importing `name` runs (its longest prefix that is one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges(module: str) -> set[str]:
    """What importing `module` imports directly: project modules (with the packages holding them,
    whose __init__ runs first, unless they hold `module` too) and third-party modules by name."""
    edges = set()
    for name in _imported(module):
        target = _project_module(name)
        if target is None:
            edges.add(name)
            continue
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            step = ".".join(parts[:i])
            if step in MODULES and step != module and not _within(module, [step]):
                edges.add(step)
    return edges


GRAPH = {module: _edges(module) for module in MODULES}


def _cycles() -> list[list[str]]:
    """The import circles: each strongly connected component of more than one module, as one circle through it."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v] & MODULES.keys()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
            if len(component) > 1:
                components.append(component)

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    return [_circle(component) for component in components]


def _circle(component: set[str]) -> list[str]:
    """A shortest circle from the component's first module back to it, within the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(GRAPH[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    following.append(w)
        frontier = following
    return sorted(component)


def _closure(roots) -> dict[str, list[str]]:
    """Everything importing `roots` may import, each with one chain of imports that leads there."""
    chains = {root: [root] for root in roots}
    frontier = list(roots)
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(GRAPH.get(v, ())):
                if w not in chains:
                    chains[w] = chains[v] + [w]
                    if w in MODULES:
                        following.append(w)
        frontier = following
    return chains


def test_graph_sees_the_project():
    """The graph covers every layer and resolves imports into modules (the other tests would pass on an empty one)."""
    for module in (
        "pock_mlir.runtime.trainer",
        "pock_mlir.passes.pock_dce",
        "pock_mlir.dialects.pock",
        "pock_mlir.autodiff.rules.core",
        "bench.child",
    ):
        assert module in MODULES, module
    assert "pock_mlir.op_facts" in GRAPH["pock_mlir.passes.pock_dce"]
    assert "pock_mlir.runtime.workspace" in GRAPH["pock_mlir.runtime.trainer"]
    assert "torch_mlir" in GRAPH["pock_mlir.passes.base"]
    assert "pock_mlir.autodiff.rules.base" in GRAPH["pock_mlir.autodiff.rules.core"]  # relative, `from .base import`


def test_no_import_circles():
    circles = _cycles()
    assert not circles, "import circles (function-local imports included):\n" + "\n".join(
        " -> ".join(circle) for circle in circles
    )


def test_abi_is_a_leaf():
    project = sorted(name for name in GRAPH["pock_mlir.abi"] if name in MODULES)
    assert not project, f"pock_mlir.abi imports {', '.join(project)}"


def test_op_facts_imports_no_rule():
    """The registry is filled by the rules the autodiff package imports, never the other way round."""
    rules = sorted(name for name in _closure(["pock_mlir.op_facts"]) if _within(name, ["pock_mlir.autodiff"]))
    assert not rules, f"pock_mlir.op_facts imports {', '.join(rules)}"


@pytest.mark.parametrize("root", RUNTIME)
def test_runtime_imports_no_compile_side(root):
    chains = _closure([name for name in MODULES if _within(name, [root])])
    bad = {name for name in chains if _within(name, COMPILE_SIDE + COMPILERS)}
    crossings = sorted(" -> ".join(chains[name]) for name in bad if chains[name][-2] not in bad)
    assert not bad, f"{root} imports the compile side:\n" + "\n".join(crossings)


def test_runtime_alone_loads_no_compile_side():
    """Importing the runtime layer in a fresh interpreter leaves PyTorch, torch-mlir and the compile side unloaded."""
    forbidden = COMPILE_SIDE + COMPILERS
    code = (
        f"import sys; import {', '.join(RUNTIME)}; "
        f"print(sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') for p in {forbidden!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
