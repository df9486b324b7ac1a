"""Shared fixtures: run the real program through the recording mock engine (fresh loop per run)."""

from __future__ import annotations

import copy
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from components import preflight
from stacks.loader import SECRET_KEYS

# the suite leaves nothing behind: subreaper, per-module notes, the session-end check (tests/fixtures/leftovers.py)
from tests.fixtures import leftovers
from tests.fixtures.leftovers import (  # noqa: F401  (hooks and an autouse fixture, found by name)
    _nothing_left_behind_by_module,
    pytest_configure,
    pytest_sessionfinish,
    pytest_testnodedown,
)
from tools import mock_engine
from tools.mock_engine import RunResult, run_program, stack_config

ROOT = Path(__file__).resolve().parent.parent

STACKS = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
VALIDATOR = ROOT / "tools" / "schema_check.py"
"""The project's strict schema check (schemas/ and upstream's rules; tests/fixtures/schema_check.py runs it in-process)."""


@pytest.fixture(autouse=True)
def _each_test_meets_an_answering_api() -> Iterator[None]:
    """components/preflight.py remembers an unanswered API read for the rest of its process (one Pulumi run): each test
    is a run of its own."""
    yield
    preflight.UNANSWERED.clear()


def stack_objects(stack: str) -> dict[str, Any]:
    """`ml-dev-env:<key>` objects of a committed stack file, keyed without the prefix (deep copy)."""
    return {k.split(":", 1)[1]: copy.deepcopy(v) for k, v in stack_config(ROOT / f"Pulumi.{stack}.yaml").items()}


# What `pulumi config set --secret` would hold for the models of the committed stacks.
MODEL_SECRETS = {"quayDockerConfigJson": '{"auths":{"quay.io":{"auth":"cm9ib3Q6dG9rZW4="}}}', "hfToken": "hf_placeholder_token"}
# A placeholder for every secret any stack may need, derived from the config schema (stacks.loader.SECRET_KEYS: the
# dev servers' and the pipeline credentials' keys), so a new stack file that renders also runs in the suite.
PLACEHOLDER_SECRETS = {**{key: f"test-placeholder-{key}" for key in SECRET_KEYS}, **MODEL_SECRETS}


def run_objects(stack: str, objects: dict[str, Any], secrets: Mapping[str, str | None] | None = None) -> RunResult:
    """Run the program; every secret is set (placeholders; tests about secrets pass their own values, None = not set)."""
    chosen = {**PLACEHOLDER_SECRETS, **(secrets or {})}
    return run_program(stack, {f"ml-dev-env:{k}": v for k, v in objects.items()}, {k: v for k, v in chosen.items() if v is not None})


ONLY_MODEL_SECRETS: dict[str, str | None] = {key: None for key in SECRET_KEYS if key not in MODEL_SECRETS}
"""`secrets=` for a run where only the models' secrets are set (tests of what a missing secret does)."""


@pytest.fixture
def run() -> Callable[..., RunResult]:
    """run(stack, mutate=None, secrets=None): load the stack file, let `mutate` edit it, run the program."""

    def _run(
        stack: str, mutate: Callable[[dict[str, Any]], None] | None = None, secrets: Mapping[str, str | None] | None = None
    ) -> RunResult:
        objects = stack_objects(stack)
        if mutate:
            mutate(objects)
        return run_objects(stack, objects, secrets)

    return _run


def tcp_shared_variant(objects: dict[str, Any]) -> None:
    """barcelona, but TCP transport and shared RWX storage."""
    objects["network"] = {"mode": "tcp"}
    objects["security"] = {"serviceAccount": "ml-dev-sa", "memlock": {"mode": "none"}}
    objects["storage"] = {
        "mode": "shared",
        "volumes": [
            {"name": "workspace", "mountPath": "/workspace", "size": "100Gi", "storageClass": "nfs-csi"},
            {"name": "datasets", "mountPath": "/datasets", "size": "500Gi", "storageClass": "nfs-csi"},
        ],
    }


# ------------------------------------------------------------------------------------------- root tests

ROOT_FIXTURES = frozenset({"fabric", "fabrics", "image_rig", "full_disk"})
"""Fixtures that need root (simulated pods, buildah's vfs storage, a tmpfs mount): a test using one is a `root` test."""
NEEDS_ROOT = re.compile(r"\bneeds? root\b")


# ------------------------------------------------------------------------------------------ the fast lane

FAST_LANE = (
    "tests/repo/",
    "tests/core/",
    "tests/stacks/",
    "tests/components/",
    "tests/policy/",
    "tests/tools/",
    "tests/bench/",
    "tests/inpod/test_delivery.py",
    "tests/inpod/test_startup_script.py",
    "tests/images/test_presets.py",
    "tests/images/test_containerfiles.py",
    "tests/images/test_base_matrix_logic.py",
    "tests/steps/test_embed.py",
    "tests/steps/test_step_units.py",
)
"""`make test-fast` (-m fast): the repository gates, the units and the renders. No simulated pod, no root, no real
service and no program of a Debian package a fresh machine lacks (tests/repo/test_fast_lane.py holds it to that)."""
SLOW = (
    "tests/repo/test_shellcheck.py",  # shellcheck
    "tests/repo/test_docs_site.py",  # chromium
    "tests/tools/test_diagram.py",  # Graphviz's dot
)
"""Modules of the lane's folders that run a program of a Debian package: `make test` runs them."""


def in_fast_lane(path: str) -> bool:
    """Whether a test module (its path from the repository root) belongs to `make test-fast`."""
    from fnmatch import fnmatch

    return not any(fnmatch(path, s) for s in SLOW) and any(path.startswith(p) if p.endswith("/") else fnmatch(path, p) for p in FAST_LANE)


# ---------------------------------------------------------------------------------------- longest first

LONGEST_FIRST = (
    "tests/podsim/test_stop_matrix.py",
    "tests/inpod/fabric/test_gate.py",
    "tests/steps/test_package.py",
    "tests/images/test_container_builds.py",
    "tests/stacks/test_one_edit_mistakes.py",
    "tests/inpod/home/test_browser.py",
    "tests/inpod/idle/test_idle_agent.py",
    "tests/podsim/test_idle_hang.py",
)
"""The modules that take longest on one worker (pytest --durations summed per module, `make bench-tests`), longest
first. pytest-xdist hands out a module whole (--dist loadfile) and, by default, the modules with the most tests first
(the Makefile turns that off: --no-loadscope-reorder), which left long modules of few tests to start last and run
alone. In this order they start first and the many short modules fill every worker to the end.
(tests/repo/test_test_order.py holds the list and the Makefile to that.)"""


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item]) -> None:
    """LONGEST_FIRST's modules in its order, then the others with the most tests first; a module's tests stay together
    and in their order (a stable sort, the same in every worker: pytest-xdist checks that their collections agree)."""
    tests = Counter(module_of(item) for item in items)
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (rank.get(module_of(item), len(rank)), -tests[module_of(item)], module_of(item)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items)
    for item in items:
        if ROOT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.root)
        path = Path(str(item.path)).resolve()
        if path.is_relative_to(ROOT) and in_fast_lane(path.relative_to(ROOT).as_posix()) and not item.get_closest_marker("root"):
            item.add_marker(pytest.mark.fast)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures (module-scoped renders included) are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    # One render per stack, variant and secrets per process (tools/mock_engine.py: each caller gets a deep copy); a
    # test that patches the program's modules (monkeypatch) renders afresh, and its renders are not kept.
    mock_engine.cache_renders("monkeypatch" not in getattr(item, "fixturenames", ()))
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root (marker `root`: CI's sudo pass runs it; as root: make test)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test that skips because it needs root must carry the `root` marker (or CI's passes would run it in neither)."""
    report = yield
    if report.skipped and not item.get_closest_marker("root") and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if NEEDS_ROOT.search(reason):
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} skips for root ({reason}) but has no `root` marker: add @pytest.mark.root"
    return report


# --------------------------------------------------------------------------------------- the run's summary

MISSING_PYTHON = re.compile(r"no CPython (3\.\d+) here")
# The other thing of the test matrix that neither Debian's packages nor PyPI provide: distribution 3's registry
# (tests/fixtures/registry.py REGISTRY3_MISSING; `make registry3` builds it from a source tree). Like a missing
# CPython, its cells skip with their reason and the run ends with one line naming it.
MISSING_REGISTRY3 = "needs distribution 3's registry"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The leftover report, then one line naming the CPythons of the in-pod matrix this machine lacks."""
    leftovers.pytest_terminal_summary(terminalreporter)
    missing: set[str] = set()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and (found := MISSING_PYTHON.search(str(longrepr[2]))):
            missing.add(found.group(1))
    registry3 = 0
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and MISSING_REGISTRY3 in str(longrepr[2]):
            registry3 += 1
    if missing:
        versions = ", ".join(sorted(missing, key=lambda v: tuple(map(int, v.split(".")))))
        terminalreporter.write_line(
            f"CPython missing here of the in-pod matrix (neither Debian's packages nor PyPI provide it): {versions}", yellow=True
        )
    if registry3:
        terminalreporter.write_line(
            f"distribution 3's registry missing here (neither Debian's packages nor PyPI provide it): {registry3} restart "
            "cells skipped; `make registry3 DIST3_SRC=<its source tree>` builds it",
            yellow=True,
        )
