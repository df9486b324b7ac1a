"""The in-pod package's structure: families import each other relatively, with no circle and no import deferred into
a function body.

A deferred import of our modules can fail in the pod: `sys.path[0]` is the launcher's real `..<timestamp>` directory
(CPython Python/pathconfig.c `_PyPathConfig_ComputeSysPath0` resolves the script's symlinks), and the kubelet deletes
that directory after a `..data` swap (kubernetes pkg/volume/util/atomic_writer.go `Write`, step 11), so a module first
imported after a ConfigMap update is no longer there. Every module imports its siblings when the program starts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import inpod

MODULES = sorted(p for p in inpod.HERE.rglob("*.py") if "__pycache__" not in p.parts and p.parent.name != "bin")


def module_name(path: Path) -> str:
    rel = path.relative_to(inpod.HERE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def ours(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules of the package that an import statement names (resolved relative imports included)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "inpod"]
    if node.level == 0:
        base = node.module or ""
        if base.split(".")[0] != "inpod":
            return []
    else:
        package = module_name(path).split(".")
        if not is_package(path):
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    known = {module_name(p) for p in MODULES}
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def imports(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(top-level imports, deferred imports) of our modules: (line, module)."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    # a module-level `try: from . import x / except ImportError` is still an import at start
    for n in tree.body:
        if isinstance(n, ast.Try):
            top |= {id(s) for s in n.body}
    now: list[tuple[int, str]] = []
    later: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in ours(path, node):
                (now if id(node) in top else later).append((node.lineno, name))
    return now, later


def test_no_deferred_import_of_our_modules() -> None:
    found = [f"{p.relative_to(inpod.HERE.parent)}:{line}: {name}" for p in MODULES for line, name in imports(p)[1]]
    assert not found, f"imported inside a function (fails after a ..data swap): {found}"


def test_relative_imports_only_and_no_dual_header() -> None:
    """Inside the package a module names its siblings relatively; nothing checks `__package__` to import twice."""
    found = []
    for p in MODULES:
        text = p.read_text()
        if "__package__" in text:
            found.append(f"{p.name}: __package__")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("inpod"):
                found.append(f"{p.relative_to(inpod.HERE.parent)}:{node.lineno}: absolute import of {node.module}")
    assert not found, found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by a depth-first walk (one per back edge)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for p in MODULES:
        now, later = imports(p)
        name = module_name(p)
        # a package's __init__ is imported before its modules: an edge to the package itself is no cycle
        graph[name] = {m for _, m in now + later if m != name and not name.startswith(m + ".")}
    # the all-reduce runs sit below both the gate and the localisation (the circle the flat layout had)
    assert {"inpod.fabric.allreduce", "inpod.fabric.localise"} <= graph["inpod.fabric.gate"]
    assert "inpod.fabric.allreduce" in graph["inpod.fabric.localise"] and not graph["inpod.fabric.allreduce"] & {"inpod.fabric.gate"}
    assert not cycles(graph), cycles(graph)


def test_the_twice_detector_sees_a_copy(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def env():\n    pass\n\n\ndef main():\n    pass\n")
    (tmp_path / "b.py").write_text("def env():\n    pass\n\n\ndef main():\n    pass\n")
    found = {n: len(f) for n, f in defined_twice_in(tmp_path).items()}
    assert found == {"env": 2}


def defined_twice_in(root: Path) -> dict[str, list[str]]:
    """Module-level function names defined in more than one module under `root` (`main`, each program's entry, excepted)."""
    where: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "main":
                where.setdefault(node.name, []).append(path.name)
    return {name: files for name, files in where.items() if len(files) > 1}


def test_each_helper_once() -> None:
    """A helper every family needs lives in inpod/lib once (`env`, `state_dir`, `read_rank_env`, the kube client,
    `listen_addresses`, …); two functions of one name in the package are two copies of one helper or a confusion."""
    assert not defined_twice_in(inpod.HERE), defined_twice_in(inpod.HERE)
