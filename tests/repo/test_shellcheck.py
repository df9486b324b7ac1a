"""Every shell file of the repository (in-pod programs, tools, CI) passes `shellcheck` (Debian package,
installed by `make system-deps`), all severities. A finding is fixed, or disabled in place with a
`# shellcheck disable=SCxxxx` line that says why. Sourced snippets without a shebang carry a
`# shellcheck shell=bash` directive."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fixtures import programs

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", "rendered", "__pycache__", "node_modules"}
SHEBANGS = ("#!/bin/sh", "#!/bin/bash", "#!/usr/bin/env bash", "#!/usr/bin/env sh")

pytestmark = pytest.mark.skipif(programs.missing("shellcheck") is not None, reason=programs.missing("shellcheck") or "")


def shell_files() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if SKIP & set(rel.parts) or not path.is_file() or path.suffix not in ("", ".sh", ".bash"):
            continue
        if path.suffix in (".sh", ".bash"):
            found.append(path)
            continue
        with path.open("rb") as f:
            first = f.readline(100).decode(errors="replace").strip()
        if first.startswith(SHEBANGS):
            found.append(path)
    return found


def shellcheck(*files: Path) -> subprocess.CompletedProcess[str]:
    # -x -P SCRIPTDIR: follow `. "$dir/rank_order.sh"` (its `# shellcheck source=` line) next to the script
    command = ["shellcheck", "-x", "-P", "SCRIPTDIR", "-f", "gcc", *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_shell_files_are_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in shell_files()}
    expected = {
        f"inpod/sh/{n}" for n in ("startup.sh", "sshd.sh", "ssh-session.sh", "idle-warning.sh", "rank_order.sh", "checkpoint_stop.sh")
    }
    assert expected | {"tools/lock.sh", "tools/verify_base_lock.sh", ".ci/run"} <= names, names


def test_shellcheck_finds_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\nfor f in $(ls *.txt); do rm $f; done\n")
    proc = shellcheck(bad)
    assert proc.returncode != 0 and "SC2045" in proc.stdout, proc.stdout + proc.stderr


def test_every_shell_file_passes_shellcheck() -> None:
    proc = shellcheck(*shell_files())
    assert proc.returncode == 0, f"shellcheck findings (fix, or disable in place with the reason):\n{proc.stdout}{proc.stderr}"
