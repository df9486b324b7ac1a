"""The home page served over HTTP from what the real agents, launcher, SSH fabric and fabric gate write, on simulated
pods started from the barcelona render (tests/inpod/home/conftest.py)."""

from __future__ import annotations

import html
import json
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest

import inpod
from tests.conftest import ROOT
from tests.inpod.home.conftest import INJECTED, Environment, fabric_result, load, pods_required
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


@pytest.mark.root
@pytest.mark.timeout(300)
@pods_required
def test_idle_then_busy_environment(environment: Environment) -> None:
    env = environment
    last = f"GPU {env.pods.gpus - 1}: 0%"
    page = until(env, lambda p: "ml-dev-env-1" in p and "idle: stops at" in p and last in p, "both pods, idle")
    assert re.search(r'id="idle-state" class="warn">idle: stops at \d\d:\d\d:\d\d UTC', page)
    assert "node node-1" in page, "the agent's report names the node (spec.nodeName)"
    # the failed gate, red, with its diagnosis from the real program
    result = fabric_result(env)
    assert result["status"] == "fail"
    assert f'id="fabric-status" class="bad">FAIL at {result["time"]}: plateau {result["plateauBusbw"]} GB/s' in page
    assert all(html.escape(d) in page for d in result["diagnosis"]), result["diagnosis"]
    env.busy()
    # the GPU table follows the page's own sampling, the idle state pod 0's agent's next round: wait for both. Pod 0's
    # row: alice's session, and the run with its rank on pod 0 (`ml-dev run` writes run- and rank- heartbeats there)
    busy = ("GPU 0: 87% busy", 'class="run"', 'class="ssh"', 'id="idle-state" class="ok">in use', "<td>1 SSH, 2 ml-dev</td>")
    page = until(env, lambda p: all(b in p for b in busy), "pod 0 busy")
    assert INJECTED not in page and "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page
    assert "&lt;b&gt;alice&lt;/b&gt; from 10.128.2.7" in page and "<b>alice" not in page
    # GPU plots of the sampled hour: one SVG per pod once two samples exist
    page = until(env, lambda p: p.count("<svg") >= 2, "the utilisation plots")
    first = page[page.index("<svg") : page.index("</svg>") + 6]
    ET.fromstring(first)
    assert re.search(r"GPU-hours since \d\d:\d\d:\d\d UTC: \d+\.\d\d held", page)


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
    svgplot = load("inpod.home.svgplot_under_test", ROOT / "inpod" / "home" / "svgplot.py")
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
        [python, "-c", "import json, sys; from inpod.home import svgplot; sys.stdout.write(svgplot.gate_curve(json.load(sys.stdin)))"],
        cwd="/opt/ml-dev-env",
        input=json.dumps(fabric_result(env)),
        timeout=60,
    )
    assert curve.returncode == 0, curve.stderr
    assert ET.fromstring(curve.stdout).tag == f"{SVG}svg"
