"""What the suite runs is declared: every external program the test code invokes has a row in
tests/fixtures/programs.py (its Debian package, or a stub), `make system-deps` installs each package that is
not Essential, and every skip guard names the package of a program it misses."""

from __future__ import annotations

import ast
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures import images, programs, registry
from tests.images import conftest as images_conftest
from tests.podsim import netpol, pods
from tests.steps import conftest as steps_conftest

TESTS = ROOT / "tests"
BARE = re.compile(r"^[A-Za-z0-9_.+-]+$")
RUNNERS = {"run", "Popen", "check_output", "check_call", "call", "exec"}
"""Calls whose first argument is an argv (subprocess's, and a simulated pod's `exec`)."""


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        value = node.value
        if value.startswith("/") and BARE.match(value.rsplit("/", 1)[-1]):
            return value.rsplit("/", 1)[-1]
        return value if BARE.match(value) else None
    return None


def programs_in(source: str) -> set[str]:
    """The programs a test module invokes by name: `shutil.which("x")` and `programs.missing("x", …)` literals,
    argv heads (a literal list or tuple as the first argument of subprocess's calls or a pod's `exec`), and the
    items of a module-level `*TOOLS` tuple (podsim's `TOOLS`: what its pods take from this machine)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "which" and node.args:
                found.update(filter(None, [_literal(node.args[0])]))
            elif name == "missing":
                found.update(filter(None, map(_literal, node.args)))
            elif name in RUNNERS and node.args and isinstance(node.args[0], ast.List | ast.Tuple) and node.args[0].elts:
                found.update(filter(None, [_literal(node.args[0].elts[0])]))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple | ast.List):
            if any(isinstance(t, ast.Name) and t.id.endswith("TOOLS") for t in node.targets):
                found.update(filter(None, map(_literal, node.value.elts)))
    return found


def suite_programs() -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue  # this gate's own examples
        for program in programs_in(path.read_text()):
            used.setdefault(program, []).append(str(path.relative_to(ROOT)))
    return used


def apt_packages() -> list[str]:
    found = re.search(r"^APT_PACKAGES := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile sets APT_PACKAGES"
    return found.group(1).split()


def test_the_scan_finds_each_kind_of_use() -> None:
    source = """
import shutil, subprocess
TOOLS = ("alpha", "/usr/bin/beta")
X = shutil.which("gamma")
subprocess.run(["delta", "-v"], check=True)
subprocess.Popen(("/sbin/epsilon",))
pod.exec(["zeta"])
reason = programs.missing("eta", "theta")
subprocess.run([variable, "x"])  # not a literal: not a program name
subprocess.run(["not a name"])
"""
    assert programs_in(source) == {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}


def test_every_program_the_suite_invokes_is_in_the_table() -> None:
    used = suite_programs()
    assert {"ip", "mpirun", "orted", "unshare", "buildah", "chromium"} <= set(used), "the scan sees the suite's programs"
    unknown = {p: where for p, where in used.items() if p not in programs.PROGRAMS}
    assert not unknown, f"programs without a row in tests/fixtures/programs.py (add their Debian package): {unknown}"


def test_every_row_of_the_table_is_used() -> None:
    stale = sorted(set(programs.PROGRAMS) - set(suite_programs()))
    assert not stale, f"rows of tests/fixtures/programs.py no test invokes: {stale}"


def test_every_package_is_installed_by_make_or_essential() -> None:
    apt, essential = set(apt_packages()), programs.essential_packages()
    assert {"coreutils", "util-linux", "dash"} <= essential, "dpkg reports the Essential set"
    needed = {pkg for pkg in programs.PROGRAMS.values() if pkg not in (programs.STUB, programs.PIP)}
    loose = sorted(needed - apt - essential)
    assert not loose, f"packages the suite needs that APT_PACKAGES (Makefile) lacks and Debian does not install always: {loose}"


def absent(monkeypatch: pytest.MonkeyPatch, program: str) -> None:
    """`program` looks absent to every guard (shutil.which finds it nowhere); the rest stays as it is."""
    real = shutil.which

    def which(cmd: str | os.PathLike[str], mode: int = os.F_OK | os.X_OK, path: str | None = None) -> str | None:
        return None if os.path.basename(os.fspath(cmd)) == program else real(cmd, mode, path)

    monkeypatch.setattr(shutil, "which", which)


def cases() -> Iterable[tuple[str, Callable[[], str | None], str]]:
    for program in (*pods.TOOLS, *pods.MACHINE_TOOLS):
        yield "podsim", pods.missing_requirements, program
    for program in ("iptables-restore", "ping"):
        yield "netpol", netpol.missing_requirements, program
    for program in images_conftest.REQUIRED_TOOLS:
        yield "image rig", images_conftest.missing_tools, program
    yield "steps chroot", steps_conftest.chroot_missing, "chroot"
    yield "registry", registry.registry_missing, "docker-registry"
    yield "registry", registry.registry_missing, "htpasswd"
    yield "skopeo", images.skopeo_missing, "skopeo"


@pytest.mark.parametrize(("guard", "check", "program"), [pytest.param(*c, id=f"{c[0]}-{c[2]}") for c in cases()])
def test_each_guard_names_the_package_of_a_missing_program(
    monkeypatch: pytest.MonkeyPatch, guard: str, check: Callable[[], str | None], program: str
) -> None:
    absent(monkeypatch, program)
    reason = check()
    assert reason is not None, f"{guard}: no reason to skip although {program} is missing"
    assert program in reason and programs.package(program) in reason, f"{guard}: {reason!r}"
    assert "make system-deps" in reason


def test_the_reason_lists_every_missing_program_and_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda cmd, mode=0, path=None: None)
    assert programs.missing("ssh", "sshd", "ip", path="/nowhere") == (
        "needs ssh, sshd, ip on /nowhere (Debian: iproute2 openssh-client openssh-server; as root: make system-deps)"
    )
    with pytest.raises(KeyError, match=re.escape("not-in-the-table is not in tests/fixtures/programs.py PROGRAMS")):
        programs.missing("not-in-the-table")
