"""The suite's own pytest rules (tests/conftest.py, pyproject's pytest options), run on small test files:
`root` tests skip as another user with the reason, a test skipping for root without the marker fails, markers
are strict, and the run ends with one line naming the CPythons of the in-pod matrix it lacks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

CONFTEST = """\
import os

from tests.conftest import (  # the suite's hooks, nothing else of tests/conftest.py
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_terminal_summary,
)

if os.environ.get("AS_USER"):
    os.geteuid = lambda: 1000  # another user than root
"""


def pytest_run(tmp_path: Path, source: str, as_user: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(source)
    env = {**os.environ, "AS_USER": "1" if as_user else ""}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider", str(tmp_path / "test_sample.py")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


SAMPLE = """\
import pytest


@pytest.mark.root
def test_marked():
    pass


def test_skips_for_root_unmarked():
    pytest.skip("mounting a tmpfs needs root")


@pytest.mark.parametrize("version", ["3.8", "3.12", "3.10"])
def test_interpreter(version):
    pytest.skip(f"no CPython {version} here (pyenv versions/{version}.*, python{version} on PATH)")


def test_plain():
    pass
"""


def test_as_another_user_root_tests_skip_with_the_reason_and_an_unmarked_one_fails(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, SAMPLE, as_user=True)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "SKIPPED [1] " in out and "needs root (marker `root`" in out
    assert "FAILED" in out and "test_skips_for_root_unmarked skips for root (mounting a tmpfs needs root) but has no `root` marker" in out
    assert "1 failed, 1 passed, 4 skipped" in out


def test_the_run_ends_with_one_line_naming_the_missing_interpreters(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, SAMPLE.replace("needs root", "is not wanted"), as_user=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CPython missing here")]
    assert lines == ["CPython missing here of the in-pod matrix (neither Debian's packages nor PyPI provide it): 3.8, 3.10, 3.12"]
    assert proc.returncode == 0, proc.stdout


def test_an_unknown_marker_is_an_error(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, "import pytest\n\n\n@pytest.mark.roto\ndef test_typo():\n    pass\n", as_user=False)
    assert proc.returncode != 0 and "'roto' not found in `markers` configuration option" in proc.stdout + proc.stderr


def test_every_module_guarded_by_the_simulation_is_marked_root() -> None:
    """A module that skips unless simulated pods can run (podsim's `missing_requirements()`) needs root: it carries the
    marker (or fabric's `needs_pods`), so CI's sudo pass runs it and the user pass leaves it out."""
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        if re.search(r"\bmissing_requirements\(\)", source) and "mark.root" not in source and "needs_pods" not in source:
            unmarked.append(str(path.relative_to(ROOT)))
    assert unmarked == [], "add pytest.mark.root to their pytestmark"
