"""The tests mirror the source: each test module lies in the folder of the package it tests (tests/core, stacks,
components, steps, policy, tools, bench, inpod; images/ for the Containerfiles), the gates in tests/repo, support
in tests/podsim and tests/fixtures, data in tests/data and tests/identity. No test file is loose in tests/."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

TESTS = ROOT / "tests"
MIRRORS = ("core", "stacks", "components", "steps", "policy", "tools", "bench", "inpod", "images")
"""Test folders named after the source directory they test."""
GATES, SUPPORT, DATA = ("repo",), ("podsim", "fixtures"), ("data", "identity")
FEATURE_FOLDERS = ("fabric", "lifecycle", "home")
"""Folders by feature that hold only tests of the in-pod programs, on their way to tests/inpod (the pod-package
issue moves them); nothing else may go there."""
TOP_FILES = {"__init__.py", "conftest.py"}


def layout_problems(tests: Path) -> list[str]:
    problems = []
    for path in sorted(tests.iterdir()):
        name = path.name
        if name.startswith(".") or name == "__pycache__":
            continue
        if path.is_file():
            if name not in TOP_FILES:
                problems.append(f"tests/{name}: loose in tests/ (put it in the folder of the package it tests, or tests/repo)")
        elif name not in (*MIRRORS, *GATES, *SUPPORT, *DATA, *FEATURE_FOLDERS):
            problems.append(f"tests/{name}/: not a folder of the layout ({', '.join((*MIRRORS, *GATES))})")
    return problems


def test_no_test_file_lies_outside_the_layout() -> None:
    assert layout_problems(TESTS) == []


def test_each_mirror_folder_has_its_source() -> None:
    assert [m for m in MIRRORS if not (ROOT / m).is_dir()] == []
    assert [m for m in MIRRORS if not (TESTS / m).is_dir()] == []


def test_the_gate_finds_a_loose_file_and_a_stray_folder(tmp_path: Path) -> None:
    for keep in ("core", "repo", "conftest.py", "__init__.py"):
        (tmp_path / keep).mkdir() if "." not in keep else (tmp_path / keep).write_text("")
    (tmp_path / "test_loose.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "devloop").mkdir()
    assert layout_problems(tmp_path) == [
        "tests/devloop/: not a folder of the layout (core, stacks, components, steps, policy, tools, bench, inpod, images, repo)",
        "tests/test_loose.py: loose in tests/ (put it in the folder of the package it tests, or tests/repo)",
    ]


LEFT_TO_THE_POD_PACKAGE_ISSUE = {"tests/fabric/test_expectation.py"}
"""Render/config tests in a feature folder that the pod-package issue moves with the folder (its split of the work);
their place is tests/components (components/fabric.py)."""


def runs_in_pod_programs(source: str) -> bool:
    """Whether a test module drives the in-pod programs: it imports `inpod` or the harness of a feature folder
    (its conftest, tests/podsim, tests/home's pods) rather than only rendering."""
    harness = ("inpod", "tests.podsim", "tests.fabric", "tests.lifecycle", "tests.home", "tests.inpod")
    return any(
        (isinstance(n, ast.ImportFrom) and (n.module or "").startswith(harness))
        or (isinstance(n, ast.Import) and any(a.name.startswith(harness) for a in n.names))
        for n in ast.walk(ast.parse(source))
    )


def test_feature_folders_hold_only_in_pod_program_tests() -> None:
    """What may stay in tests/fabric, tests/lifecycle and tests/home until the pod-package issue moves it to
    tests/inpod: tests of the in-pod programs. A test that only renders goes to the folder of its package."""
    stray = [
        str(path.relative_to(ROOT))
        for folder in FEATURE_FOLDERS
        for path in sorted((TESTS / folder).glob("test_*.py"))
        if not runs_in_pod_programs(path.read_text()) and str(path.relative_to(ROOT)) not in LEFT_TO_THE_POD_PACKAGE_ISSUE
    ]
    assert stray == []
