"""`make typecheck` checks the step programs with their `lib` resolved: there `RegistryClient` is the class, not
`Any` (as an unresolved import is under the global ignore_missing_imports). `steps/` is a package whose modules
import each other relatively, so the repository's pass resolves them; no pass of its own is needed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from steps.embed import STEPS
from tests.conftest import ROOT

PROBE = "from steps.lib.registry import RegistryClient\n\nreveal_type(RegistryClient)\nreveal_type(RegistryClient.__init__)\n"


def mypy_lines() -> list[list[str]]:
    """The typecheck recipe's mypy commands, as `make -n` expands them."""
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), "typecheck"], capture_output=True, text=True, timeout=120, check=True,
                          env={k: v for k, v in os.environ.items() if k != "MAKEFLAGS"})  # fmt: skip
    return [shlex.split(line) for line in proc.stdout.splitlines() if " -m mypy" in line]


def reveal(directory: Path, probe: str = PROBE) -> str:
    """mypy on a probe module inside the repository (its own folder, as a module of `tests`), with the repository's
    configuration: the repository root is the import root, as in `make typecheck`."""
    (directory / "probe.py").write_text(probe)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", str(directory / "probe.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return proc.stdout


def test_typecheck_covers_every_step_program() -> None:
    """The repository's pass (`mypy` with no arguments) reads pyproject's `files`, which hold the steps package: every
    step module and its launcher."""
    assert ["mypy"] in [words[words.index("-m") + 1 :] for words in mypy_lines()], "a pass over pyproject's files"
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert "steps" in files
    assert all((ROOT / "steps" / f"{name}.py").is_file() and (ROOT / "steps" / "bin" / f"{name}.py").is_file() for name in STEPS)


def test_registry_client_is_the_class_where_the_steps_are_checked(tmp_path: Path) -> None:
    out = reveal(tmp_path)
    assert re.search(r'Revealed type is "def \(.*\) -> steps\.lib\.registry\.RegistryClient"', out), out
    assert 'Revealed type is "Any"' not in out, out


def test_without_lib_resolved_it_is_any(tmp_path: Path) -> None:
    """The probe tells the two apart: a name mypy cannot resolve is Any (global ignore_missing_imports)."""
    out = reveal(tmp_path, PROBE.replace("steps.lib.registry", "lib.registry"))
    assert 'Revealed type is "Any"' in out, out
