"""The tests mirror the source: each test module lies in the folder of the package it tests (tests/core, stacks,
components, steps, policy, tools, bench, inpod; images/ for the Containerfiles), the gates in tests/repo, support
in tests/podsim and tests/fixtures, data in tests/data and tests/identity. No test file is loose in tests/."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT

TESTS = ROOT / "tests"
MIRRORS = ("core", "stacks", "components", "steps", "policy", "tools", "bench", "inpod", "images")
"""Test folders named after the source directory they test."""
GATES, SUPPORT, DATA = ("repo",), ("podsim", "fixtures"), ("data", "identity")
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
        elif name not in (*MIRRORS, *GATES, *SUPPORT, *DATA):
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
