"""CI runs each test once: the user pass (`make test PYTEST_ARGS=…`) and the sudo pass (`pytest … -m root`) of
ci.yml's test job, each collected with `pytest --co` as written there, split the suite without overlap or gap."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.fixtures import deselected


def ci_test_steps() -> list[str]:
    job = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())["jobs"]["test"]
    return [str(s.get("run", "")) for s in job["steps"]]


def user_pass_args() -> list[str]:
    """The pytest arguments of the step that runs `make test` (its PYTEST_ARGS=…)."""
    found = [shlex.split(r) for r in ci_test_steps() if r.startswith("make test")]
    assert len(found) == 1, "one `make test` step"
    args = [a.split("=", 1)[1] for a in found[0][2:] if a.startswith("PYTEST_ARGS=")]
    assert len(args) == 1, f"the `make test` step sets PYTEST_ARGS: {found[0]}"
    return shlex.split(args[0])


def sudo_pass_args() -> list[str]:
    """The pytest arguments of the sudo step (everything after `-m pytest`)."""
    lines = [line for r in ci_test_steps() for line in r.splitlines() if line.strip().startswith("sudo") and "-m pytest" in line]
    assert len(lines) == 1, "one sudo pytest command"
    words = shlex.split(lines[0])
    return words[words.index("pytest") + 1 :]


def collect(tmp: Path, *commands: list[str]) -> list[tuple[set[str], set[str]]]:
    """The test ids each pytest command line runs and those it deselects (collected side by side, each once, with
    `tests/fixtures/deselected.py` listing what its `-m` leaves out; its own -q dropped: -qq lists files)."""
    procs = []
    for i, args in enumerate(commands):
        env = {**os.environ, deselected.FILE: str(tmp / f"deselected-{i}")}
        command = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "tests.fixtures.deselected", *(a for a in args if a != "-q")]
        procs.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    found = []
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode in (0, 5), out[-3000:] + err[-3000:]
        left_out = tmp / f"deselected-{i}"
        runs = {line for line in out.splitlines() if "::" in line and not line.startswith(" ")}
        found.append((runs, set(left_out.read_text().splitlines()) if left_out.exists() else set()))
    return found


@pytest.fixture(scope="module")
def passes(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str], set[str]]:
    """Every test, the user pass's and the sudo pass's: each pass collected once as ci.yml writes it; every test is what
    each pass runs or deselects (the same suite for both, or the passes do not split one suite)."""
    (user, user_out), (sudo, sudo_out) = collect(tmp_path_factory.mktemp("passes"), user_pass_args(), sudo_pass_args())
    every = user | user_out
    assert every == sudo | sudo_out, "both passes collect the same suite before their -m"
    # and that suite is the whole one: a test file or test id named on a command line (or one --ignore'd) would leave
    # the rest out of both passes without deselecting it
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert files <= {i.split("::", 1)[0] for i in every}, sorted(files - {i.split("::", 1)[0] for i in every})[:5]
    for args in (user_pass_args(), sudo_pass_args()):
        assert all(a == "tests" or not a.startswith("tests") for a in args), f"a pass names part of the suite: {args}"
    return every, user, sudo


def test_the_commands_are_read_from_ci() -> None:
    assert user_pass_args() == ["-m", "not root"]
    assert sudo_pass_args()[-2:] == ["root", "tests"] and "-m" in sudo_pass_args()


def test_each_test_runs_in_exactly_one_pass(passes: tuple[set[str], set[str], set[str]]) -> None:
    every, user, sudo = passes
    assert len(every) > 1000 and sudo, "both passes collect tests"
    both = sorted(user & sudo)
    neither = sorted(every - user - sudo)
    assert not both, f"{len(both)} tests run in both passes, e.g. {both[:5]}"
    assert not neither, f"{len(neither)} tests run in neither pass, e.g. {neither[:5]}"
    assert any(i.startswith("tests/images/") for i in sudo) and any(i.startswith("tests/steps/") for i in sudo), "every folder"
