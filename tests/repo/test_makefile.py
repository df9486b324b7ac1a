"""The Makefile's entry points on machines that lack something: an old Python, root, the Debian packages.

Each test runs the real Makefile in a temporary copy with stand-in commands (shell scripts) on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures import programs

MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason=programs.missing("make") or "")


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile and the requirement files it depends on, in an empty directory."""
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copy(ROOT / "Makefile", work / "Makefile")
    for name in ("requirements.txt", "requirements-dev.txt"):
        (work / name).write_text("")
    return work


def fake_python(path: Path, version: str, venv_ok: bool = True, ensurepip: bool = True) -> Path:
    """A `python3` that reports `version` and, asked for `-m venv DIR`, makes DIR (a stand-in interpreter in it);
    without `ensurepip` (Debian without python3-venv) `-c 'import ensurepip'` fails."""
    make_venv = (
        'mkdir -p "$3/bin"; printf \'#!/bin/sh\\nexit 0\\n\' > "$3/bin/python"; chmod +x "$3/bin/python"; exit 0'
        if venv_ok
        else 'mkdir -p "$3/bin"; echo "Error: ensurepip is not available" >&2; exit 1'
    )
    return script(
        path,
        f"""\
case "$1" in
  --version) echo "Python {version}" ;;
  -m) {make_venv} ;;
  -c) {"exit 0" if ensurepip else 'echo "ModuleNotFoundError: No module named ensurepip" >&2; exit 1'} ;;
  *) exit 0 ;;
esac
""",
    )


def make(checkout: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    env.pop("MAKEFLAGS", None)
    assert MAKE is not None, "the module is skipped without make"
    return subprocess.run([MAKE, "-C", str(checkout), *args], capture_output=True, text=True, env=env, check=False)


def test_old_python_gets_a_clear_message_and_no_venv(checkout: Path, tmp_path: Path) -> None:
    python = fake_python(tmp_path / "python3.9", "3.9.18")
    proc = make(checkout, "venv", f"PYTHON={python}")
    assert proc.returncode != 0
    assert f"error: ml-dev-env needs Python 3.11 or newer; {python} is: Python 3.9.18" in proc.stderr
    assert "run: make venv PYTHON=python3.11 (or newer)" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (checkout / ".venv").exists()


def test_failed_venv_creation_leaves_no_venv(checkout: Path, tmp_path: Path) -> None:
    python = fake_python(tmp_path / "python3.12", "3.12.1", venv_ok=False)
    proc = make(checkout, "venv", f"PYTHON={python}")
    assert proc.returncode != 0
    assert "-m venv failed; no .venv left behind" in proc.stderr
    assert not (checkout / ".venv").exists()


def test_supported_python_builds_the_venv(checkout: Path, tmp_path: Path) -> None:
    python = fake_python(tmp_path / "python3.11", "3.11.2")
    proc = make(checkout, "venv", f"PYTHON={python}")
    assert proc.returncode == 0, proc.stderr
    assert (checkout / ".venv" / ".installed").exists()


def test_a_venv_this_user_cannot_run_is_made_again(checkout: Path, tmp_path: Path) -> None:
    """A .venv made by another user: its interpreter is a link into their home (e.g. /root/.pyenv, mode 700),
    which cannot run here. `make venv` says so and makes it again with $(PYTHON) instead of failing later."""
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").symlink_to(tmp_path / "elsewhere" / "bin" / "python3")
    (checkout / ".venv" / ".installed").write_text("")
    python = fake_python(tmp_path / "python3.11", "3.11.2")
    proc = make(checkout, "venv", f"PYTHON={python}")
    assert proc.returncode == 0, proc.stderr
    assert "note: .venv/bin/python cannot run as" in proc.stderr and "making .venv again with" in proc.stderr
    assert not (checkout / ".venv" / "bin" / "python").is_symlink() and (checkout / ".venv" / ".installed").exists()
    again = make(checkout, "venv", f"PYTHON={python}")
    assert again.returncode == 0 and "cannot run" not in again.stderr


def stand_ins(tmp_path: Path, uid: int, sudo: bool) -> tuple[str, Path]:
    """A PATH with only stand-ins: dpkg (nothing installed), id, apt-get and optionally a password-less sudo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    script(bin_dir / "dpkg", "exit 1\n")
    script(bin_dir / "id", f"echo {uid}\n")
    script(bin_dir / "apt-get", f'echo "apt-get $*" >> {calls}\n')
    if sudo:
        script(bin_dir / "sudo", f'[ "$1" = -n ] && shift; [ "$1" = true ] && exit 0; echo "sudo $*" >> {calls}; "$@"\n')
    return str(bin_dir), calls


def apt_packages() -> str:
    found = re.search(r"^APT_PACKAGES := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile sets APT_PACKAGES"
    return " ".join(found.group(1).split())


def venv_stand_ins(tmp_path: Path, uid: int, sudo: bool) -> tuple[str, Path]:
    """stand_ins() in front of this machine's PATH (the venv recipe needs sed, rm, test); sudo refuses unless asked."""
    path, calls = stand_ins(tmp_path, uid, sudo)
    if not sudo:
        script(Path(path) / "sudo", "exit 1\n")
    return f"{path}:{os.environ['PATH']}", calls


def test_venv_without_ensurepip_and_without_root_names_python3_venv(checkout: Path, tmp_path: Path) -> None:
    python = fake_python(tmp_path / "python3", "3.11.2", ensurepip=False)
    path, calls = venv_stand_ins(tmp_path, uid=1000, sudo=False)
    proc = make(checkout, "venv", f"PYTHON={python}", path=path)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:") or "python3-venv" in line]
    assert errors == [
        f"error: {python} -m venv needs Debian's python3-venv (ensurepip), not installed; as root: apt-get install python3-venv"
    ]
    assert not calls.exists() and not (checkout / ".venv").exists()


@pytest.mark.parametrize(("uid", "sudo"), [(0, False), (1000, True)], ids=["root", "password-less-sudo"])
def test_venv_installs_python3_venv_first_as_root(checkout: Path, tmp_path: Path, uid: int, sudo: bool) -> None:
    python = fake_python(tmp_path / "python3", "3.11.2", ensurepip=False)
    path, calls = venv_stand_ins(tmp_path, uid=uid, sudo=sudo)
    proc = make(checkout, "venv", f"PYTHON={python}", path=path)
    assert proc.returncode == 0, proc.stderr
    installs = [line for line in calls.read_text().splitlines() if line.startswith("apt-get install")]
    assert installs == ["apt-get install -y -qq --no-install-recommends python3-venv"]
    assert (checkout / ".venv" / ".installed").exists()


def test_system_deps_without_root_or_sudo_says_what_it_skips(checkout: Path, tmp_path: Path) -> None:
    path, calls = stand_ins(tmp_path, uid=1000, sudo=False)
    proc = make(checkout, "system-deps", path=path)
    assert proc.returncode == 0, proc.stderr
    assert f"not root and no password-less sudo: not installing the Debian packages {apt_packages()};" in proc.stdout
    assert "tests that need them are skipped" in proc.stdout
    assert not calls.exists(), "apt-get must not run"


def test_system_deps_uses_password_less_sudo(checkout: Path, tmp_path: Path) -> None:
    path, calls = stand_ins(tmp_path, uid=1000, sudo=True)
    proc = make(checkout, "system-deps", path=path)
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text().splitlines()[:2] == ["sudo apt-get update -qq", "apt-get update -qq"]


def test_system_deps_as_root_installs(checkout: Path, tmp_path: Path) -> None:
    path, calls = stand_ins(tmp_path, uid=0, sudo=False)
    proc = make(checkout, "system-deps", path=path)
    assert proc.returncode == 0, proc.stderr
    assert f"apt-get install -y -qq --no-install-recommends {apt_packages()}" in calls.read_text()
    assert apt_packages().startswith("python3-venv "), "what the venv needs comes first"


def test_pytest_prints_the_skip_reasons(tmp_path: Path) -> None:
    """`make test` runs plain `pytest -q`: the project's pytest options must list skipped tests with reasons."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text().replace('testpaths = ["tests"]', ""))
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n\n@pytest.mark.skip(reason='needs skopeo (apt: skopeo)')\ndef test_a():\n    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert "SKIPPED [1] test_skips.py:4: needs skopeo (apt: skopeo)" in proc.stdout, proc.stdout
