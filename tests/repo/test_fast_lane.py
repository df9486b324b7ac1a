"""`make test-fast` needs nothing a fresh machine lacks: its modules (tests/conftest.py FAST_LANE) run no program of a
Debian package beyond what the venv needs, start no simulated pod or real service, and the lane lists no stale path."""

from __future__ import annotations

import ast
from fnmatch import fnmatch

from tests.conftest import FAST_LANE, ROOT, SLOW, in_fast_lane
from tests.fixtures import programs
from tests.repo.test_programs import programs_in

GIVEN = {"python3", "make", "git", "python3-venv"}
"""What a fresh machine has before `make` (python3, make, git) and what `make venv` installs first."""
STARTERS = {"PodSim", "run_registry", "run_s3", "push_base", "run_model_registry", "run_hub", "run_proxy"}
"""What starts a simulated pod or a real service (tests/podsim, tests/fixtures)."""
SELF = "tests/repo/test_programs.py"  # its examples name programs that exist nowhere; it calls the guards, starts nothing


def lane_modules() -> list[str]:
    found = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    return [m for m in found if in_fast_lane(m)]


def imports(source: str) -> set[tuple[str, str]]:
    """(module, name) of each `from … import name` of a source."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.update((node.module, a.name) for a in node.names)
    return found


def module_programs(module: str) -> set[str]:
    """The Debian packages whose programs a test module runs, itself or through the tests' modules it imports."""
    if module == SELF:
        return set()
    source = (ROOT / module).read_text()
    sources = [source]
    for name in {m for m, _ in imports(source) if m.startswith("tests.")}:
        path = ROOT / (name.replace(".", "/") + ".py")
        sources += [path.read_text()] if path.exists() and path != ROOT / SELF else []
    return {programs.package(p) for text in sources for p in programs_in(text)}


def test_the_lane_runs_no_program_a_fresh_machine_lacks() -> None:
    allowed = programs.essential_packages() | GIVEN | {programs.STUB, programs.PIP}
    modules = lane_modules()
    assert len(modules) > 20, modules
    needs = {m: sorted(module_programs(m) - allowed) for m in modules}
    assert not {m: n for m, n in needs.items() if n}, "fast-lane modules that run a Debian package's program (list them in SLOW)"


def test_the_lane_starts_no_simulated_pod_or_real_service() -> None:
    starts = {m: sorted(n for _, n in imports((ROOT / m).read_text()) if n in STARTERS) for m in lane_modules()}
    assert not {m: s for m, s in starts.items() if s}


def test_every_path_of_the_lane_is_there_and_every_slow_one_is_needed() -> None:
    every = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    stale = [p for p in FAST_LANE if not any(m.startswith(p) if p.endswith("/") else fnmatch(m, p) for m in every)]
    assert not stale, f"FAST_LANE paths without a test module: {stale}"
    allowed = programs.essential_packages() | GIVEN | {programs.STUB, programs.PIP}
    for module in SLOW:
        if (ROOT / module).exists():
            assert module_programs(module) - allowed, f"{module} is kept out of the fast lane but runs no Debian package's program"
