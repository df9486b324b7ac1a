"""Size that says why: a module over MODULE_LINES lines or a function over FUNCTION_LINES lines is split, or says why in
its opening comment (CONTRIBUTING.md, where it says what a module holds).

The module's docstring says "why one module" (and why), a function's docstring "why one function". The tests are no
rooms of the house: they are not held to it.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT

MODULE_LINES = 500
FUNCTION_LINES = 80
MODULE_WHY = re.compile(r"\bwhy one module\b", re.I)
FUNCTION_WHY = re.compile(r"\bwhy one function\b", re.I)


def sources() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / f for f in listed.split("\0") if f and not f.startswith("tests/") and (ROOT / f).is_file()]


def unexplained(path: Path) -> list[str]:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    lines = len(text.splitlines())
    if lines > MODULE_LINES and not MODULE_WHY.search(ast.get_docstring(tree) or ""):
        found.append(f"{rel}: {lines} lines")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES and not FUNCTION_WHY.search(ast.get_docstring(node) or ""):
                found.append(f"{rel}:{node.lineno}: {node.name}, {length} lines")
    return found


def test_the_detector_sees_a_long_function_and_its_reason(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f'def f():\n    """Does it."""\n{body}')
    (tmp_path / "said.py").write_text(f'def f():\n    """Does it. Why one function: one state machine."""\n{body}')
    assert unexplained(tmp_path / "long.py") == [f"{tmp_path / 'long.py'}:1: f, {FUNCTION_LINES + 2} lines"]
    assert unexplained(tmp_path / "said.py") == []


def test_every_long_module_and_function_says_why() -> None:
    found = [line for path in sources() for line in unexplained(path)]
    assert not found, "split these, or say why in the opening docstring ('why one module' / 'why one function'):\n" + "\n".join(found)
