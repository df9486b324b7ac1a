"""The suite leaves nothing behind (tests/fixtures/leftovers.py): a run whose test orphans a process fails, names the
process and the module that started it, and kills it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """from tests.fixtures.leftovers import (  # noqa: F401
    _nothing_left_behind_by_module, pytest_configure, pytest_sessionfinish, pytest_terminal_summary)
"""
LEAK = """import subprocess
def test_orphans_a_sleep():
    # the shell exits at once; its background child is orphaned (as startup.sh exiting early left `sleep infinity`)
    subprocess.run(["sh", "-c", "sleep 271828 & exit 0"], check=True, timeout=30)
"""
CLEAN = """import subprocess
def test_waits_for_its_child():
    subprocess.run(["sh", "-c", "sleep 0.1"], check=True, timeout=30)
"""


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_case.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def sleeps() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"271828"]:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_an_orphaned_process_fails_the_run_is_named_and_killed(tmp_path: Path) -> None:
    res = run(tmp_path, LEAK)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 passed" in res.stdout, "the test itself passed: the leftover fails the run"
    assert re.search(r"pid \d+ \(started during test_case\): sleep 271828", res.stdout), res.stdout
    assert sleeps() == [], "the leftover was killed"


def test_a_run_that_waits_for_its_children_passes(tmp_path: Path) -> None:
    res = run(tmp_path, CLEAN)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "left behind" not in res.stdout
