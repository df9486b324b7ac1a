"""The home page served over HTTP from what the real agents, launcher, SSH fabric and fabric gate write, on simulated
pods started from the barcelona render (tests/inpod/home/conftest.py)."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import inpod
from inpod import contract
from tests.conftest import ROOT
from tests.inpod.home.conftest import INJECTED, Environment, fabric_result, load, pods_required
from tests.inpod.home.truth import PageTruth
from tests.inpod.test_pythons import interpreter

SVG = "{http://www.w3.org/2000/svg}"


def until(env: Environment, ok: Callable[[str], bool], what: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    page = ""
    while time.monotonic() < deadline:
        page = env.get("fragment")
        if ok(page):
            return page
        time.sleep(0.2)
    raise AssertionError(f"the page never showed {what}:\n{page}\n--- log:\n{env.log()}")


def session(env: Environment, index: int, user: str, client: str, run: str = "") -> None:
    """A live SSH session on pod `index` as sshd runs it: the SSH fabric's ForceCommand with the session's env
    (`run`: the ML_DEV_RUN an `ml-dev` launcher's ssh sends, AcceptEnv)."""
    before = len(env.pods.sessions(index))
    extra = {contract.RUN_ENV: run} if run else {}
    variables = {"SSH_ORIGINAL_COMMAND": "exec sleep 120", "USER": user, "SSH_CLIENT": client, **extra}
    proc = env.pods.popen(index, "exec bash /opt/ml-dev-env/ssh-session.sh", env=variables)
    env.procs.append(proc)
    deadline = time.monotonic() + 30
    while len(env.pods.sessions(index)) <= before:
        assert time.monotonic() < deadline and proc.poll() is None, "ssh-session.sh wrote no session record"
        time.sleep(0.1)


@pytest.mark.root
@pytest.mark.timeout(300)
@pods_required
def test_every_number_on_the_page_is_what_the_test_made(environment: Environment, tmp_path: Path) -> None:
    """Idle, then busy: a real `ml-dev run` (a rank on each pod), GPU 0 of pod 0 at 87 %, alice's connection into pod 0
    with two sessions, bob's, an `ml-dev` session into pod 1 (the launcher's own: not a person's), a usage record
    served under the render's RBAC of the pods' ServiceAccount. Every value the page shows is enumerated and equals
    the truth; the page's only API read is the one the render allows."""
    env = environment
    truth = PageTruth(env.pods, env.result)
    api = truth.serve_usage(tmp_path)
    try:
        nobody: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
        truth.settle(lambda: env.get("fragment"), lambda: truth.expected(nobody, {0: 0, 1: 0}, {0: 0, 1: 0}), "nothing running")
        env.busy()  # GPU 0 of pod 0 at 87 %, the run, alice's session into pod 0 from 10.128.2.7
        session(env, 0, "<b>alice</b>", "10.128.2.7 50122 2222")  # the same connection: a second session, counted once
        session(env, 0, "bob", "10.128.2.9 40000 2222")
        session(env, 1, "ml-dev", "10.128.0.10 42000 2222", run="811")  # ml-dev's own (a rank start)
        people = {0: [("<b>alice</b>", "10.128.2.7"), ("bob", "10.128.2.9")], 1: []}

        def busy() -> dict[str, Any]:
            return {**truth.expected(people, {0: 1, 1: 1}, {0: 87, 1: 0}), "conn-sessions:ml-dev-env-0": "2"}

        page = truth.settle(lambda: env.get("fragment"), busy, "busy")
        assert INJECTED not in page and "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page and "<b>alice" not in page
        first = page[page.index("<svg") : page.index("</svg>") + 6]
        ET.fromstring(first)
        # the page's one API call, which the render lets the pods' ServiceAccount make (the agents here make none)
        read = ("GET", f"/api/v1/namespaces/{env.pods.namespace}/configmaps?fieldSelector=metadata.name%3D{env.pods.app}-usage")
        assert set(api.requests) == {read} and api.denied == [], (api.denied, set(api.requests))
    finally:
        truth.close()


@pytest.mark.root
@pytest.mark.timeout(300)
@pods_required
def test_full_page_loads_nothing_from_elsewhere(environment: Environment) -> None:
    env = environment
    page = env.get()
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the page must not load anything from the internet"
    assert '<script src="app.js"></script>' in page and page.count("<script") == 1, "no inline script"
    assert "fetch('fragment'" in env.get("app.js")
    svg = ET.fromstring(env.get("fabric.svg"))
    assert svg.tag == f"{SVG}svg"
    labels = [t.text or "" for t in svg.iter(f"{SVG}text")]
    assert any(label.startswith("pass at 175.1 GB/s") for label in labels), labels
    assert any(label.startswith("fabric gate FAIL") for label in labels), labels


def test_plot_escapes_its_text() -> None:
    svgplot = load("inpod.lib.svgplot_under_test", ROOT / "inpod" / "lib" / "svgplot.py")
    out = svgplot.line_chart([{"label": INJECTED, "points": [(1, 2), (2, 3)]}], title='a "b" <c>', hlines=[(2.5, "<i>x</i>", "#000")])
    root = ET.fromstring(out)
    assert not list(root.iter(f"{SVG}script")) and not list(root.iter("script"))
    assert INJECTED in [t.text for t in root.iter(f"{SVG}text")], "shown as text"


@pytest.mark.root
@pytest.mark.timeout(300)
@pods_required
def test_page_runs_on_the_oldest_python(environment: Environment) -> None:
    """The whole page, on pod 0 with its live agents and the real gate's files, under inpod.MIN_PYTHON (the units of
    tests/inpod/pod_units.py cover the pieces on every version): that interpreter run in the pod (its image layer is
    this machine's root), on the shipped program where the pod mounts it."""
    version = ".".join(map(str, inpod.MIN_PYTHON))
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no CPython {version} here (pyenv versions/{version}.*, python{version} on PATH)")
    env = environment
    rendered = env.pods.exec(0, [python, "/opt/ml-dev-env/home_page.py", "render"], timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert "ml-dev-env-1" in rendered.stdout and 'id="fabric-status" class="bad">FAIL' in rendered.stdout
    curve = env.pods.exec(
        0,
        [python, "-c", "import json, sys; from inpod.lib import svgplot; sys.stdout.write(svgplot.gate_curve(json.load(sys.stdin)))"],
        cwd="/opt/ml-dev-env",
        input=json.dumps(fabric_result(env)),
        timeout=60,
    )
    assert curve.returncode == 0, curve.stderr
    assert ET.fromstring(curve.stdout).tag == f"{SVG}svg"
