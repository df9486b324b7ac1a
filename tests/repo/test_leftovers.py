"""The suite leaves nothing behind (tests/fixtures/leftovers.py): a run whose test orphans a process fails, names the
process and the module that started it, and kills it; a run whose test writes a file outside its temporary folders
(the product's default paths, the repository) fails and names the file."""

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


WRITES = """import os
def test_writes_where_the_product_would(tmp_path):
    (tmp_path / "fine.json").write_text("{}")  # its own temporary folder: allowed
    os.makedirs(os.environ["WATCHED"] + "/.ml-dev-env/home", exist_ok=True)
    with open(os.environ["WATCHED"] + "/.ml-dev-env/home/history.json", "w") as f:
        f.write('{"samples": {}}')
"""


def run(tmp_path: Path, body: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_case.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
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


def test_a_file_written_outside_the_temporary_folders_fails_the_run(tmp_path: Path) -> None:
    """As a page given no workspace did (`/workspace/.ml-dev-env/home/history.json`): here the watched folder is one of
    the test's own (ML_DEV_TEST_WATCH), standing in for /workspace."""
    watched = tmp_path / "watched"
    watched.mkdir()
    (tmp_path / "case").mkdir()
    res = run(tmp_path / "case", WRITES, ML_DEV_TEST_WATCH=str(watched), WATCHED=str(watched))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 passed" in res.stdout, "the test itself passed: the file fails the run"
    assert f"file left outside the temporary folders: {watched}/.ml-dev-env/home/history.json" in res.stdout, res.stdout
    assert "fine.json" not in res.stdout


def test_the_product_paths_are_watched() -> None:
    from tests.fixtures import leftovers

    assert {"/workspace", "/opt/ml-dev-env", "/etc/ml-dev-env"} <= {str(p) for p in leftovers.watched()}
