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


def test_feature_folders_hold_only_in_pod_program_tests() -> None:
    """What may stay in tests/fabric, tests/lifecycle and tests/home until the pod-package issue moves it to
    tests/inpod: tests of the in-pod programs (no render-only test: those went to tests/components and tests/tools)."""
    allowed = {
        "fabric": {"test_curve.py", "test_expectation.py", "test_gate.py", "test_hold.py", "test_preflight.py", "test_rank_order.py",
                   "test_real_output.py"},
        "lifecycle": {"test_checkpoint_stop.py", "test_idle_agent.py", "test_real_output.py", "test_usage.py"},
        "home": {"test_home_page.py", "test_listen.py", "test_podsim.py", "test_browser.py"},
    }  # fmt: skip
    present = {d: {p.name for p in (TESTS / d).glob("test_*.py")} for d in allowed if (TESTS / d).is_dir()}
    extra = {f"tests/{d}/{name}" for d, names in present.items() for name in names - allowed[d]}
    assert extra == set()
