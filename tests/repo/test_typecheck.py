"""`make typecheck` checks the step programs with their `lib` resolved: there `RegistryClient` is the class, not
`Any` (as it is in the repository-wide pass, where `lib` is no importable package)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from steps.embed import STEPS
from tests.conftest import ROOT

PROBE = "from lib.registry import RegistryClient\n\nreveal_type(RegistryClient)\nreveal_type(RegistryClient.__init__)\n"


def steps_command() -> tuple[str, list[str]]:
    """The typecheck recipe's line for the steps (its MYPYPATH and its files), as `make -n` expands it."""
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), "typecheck"], capture_output=True, text=True, timeout=120, check=True,
                          env={k: v for k, v in os.environ.items() if k != "MAKEFLAGS"})  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("cd steps && ")]
    assert len(lines) == 1, proc.stdout
    words = shlex.split(lines[0].removeprefix("cd steps && "))
    assert words[0] == "MYPYPATH=." and words[1].endswith("python") and words[2:4] == ["-m", "mypy"], words
    return words[0].split("=", 1)[1], [w for w in words[4:] if w.endswith(".py")]


def reveal(directory: Path, mypypath: str) -> str:
    (directory / "probe.py").write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", "probe.py"],
        cwd=directory, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "MYPYPATH": mypypath},
    )  # fmt: skip
    return proc.stdout


def test_typecheck_covers_every_step_program() -> None:
    _, files = steps_command()
    assert sorted(files) == sorted(f"{name}.py" for name in STEPS)


def test_registry_client_is_the_class_where_the_steps_are_checked(tmp_path: Path) -> None:
    mypypath, _ = steps_command()
    out = reveal(tmp_path, str(ROOT / "steps" / mypypath))
    assert re.search(r'Revealed type is "def \(.*\) -> lib\.registry\.RegistryClient"', out), out
    assert 'Revealed type is "Any"' not in out, out


def test_without_lib_resolved_it_is_any(tmp_path: Path) -> None:
    """The probe tells the two apart: without MYPYPATH the same import is Any (global ignore_missing_imports)."""
    out = reveal(tmp_path, "")
    assert 'Revealed type is "Any"' in out, out
