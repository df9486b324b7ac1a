"""The home page served over HTTP from what the real agents, launcher, SSH fabric and fabric gate write."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import inpod
from inpod.home.page import ago
from inpod.lib.http import fetch_json
from inpod.lib.pod import clock
from tests.conftest import ROOT
from tests.inpod import mount
from tests.inpod.home.conftest import INJECTED, Environment, fabric_result, load, stop
from tests.inpod.home.numbers import USAGE, check, idle_truth, shown, status_hours
from tests.inpod.home.pods import idle_stop_on
from tests.inpod.idle.conftest import APP, NS, FakeApiServer
from tests.inpod.test_pythons import interpreter
from tests.podsim.pods import render_stack
from tests.podsim.render import pod_rules

SVG = "{http://www.w3.org/2000/svg}"


def until(env: Environment, ok: Callable[[str], bool], what: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    page = ""
    while time.monotonic() < deadline:
        page = env.get("fragment")
        if ok(page):
            return page
        time.sleep(0.2)
    raise AssertionError(f"the page never showed {what}:\n{page}\n--- log:\n{env.log.read_text()}")


def test_every_number_on_the_page_is_what_the_test_made(environment: Environment) -> None:
    """Known ground truth on live agents, the real ForceCommand and launcher heartbeats, a usage record served under
    the render's RBAC of the pods' ServiceAccount; every value the page shows is enumerated and checked; then a
    connection closes, the run ends, and the page follows; a restarted page keeps its history."""
    env = environment
    rules = pod_rules(render_stack("barcelona", idle_stop_on))
    api = FakeApiServer(rules)
    api.usage = dict(USAGE)
    try:
        env.start(pod_env={"APP_NAME": APP, "POD_NAMESPACE": NS, "ML_DEV_KUBE_API": api.url})
        env.busy()  # GPUs of pod 0 at 87 %, a run launched on pod 0, alice's connection into pod 0
        alice = env.procs[-1]
        second = env.ssh_session(0, "<b>alice</b>", "10.128.2.7 50122 2222")  # the same connection, a second session
        env.ssh_session(0, "bob", "10.128.2.9 40000 2222")
        env.ssh_session(1, "carol", "10.128.0.10 41000 2222")
        env.ssh_session(1, "ml-dev", "10.128.0.10 42000 2222", run="811")  # ml-dev's own (rank start): not a person's
        launch: Any = load("inpod.ml_dev.launch_rank_under_test", ROOT / "inpod" / "ml_dev" / "launch.py")
        launch.STATE_DIR = env.pods[1].state
        rank = launch.Heartbeat("rank", {"command": ["python", "train.py"], "cwd": "/workspace/x", "pgid": 1})
        rank.__enter__()
        try:
            truth = ground_truth(env, ssh={0: 2, 1: 1}, ranks={0: 0, 1: 1}, runs=1)
            truth["conn:ml-dev-env-0"] = ["<b>alice</b> from 10.128.2.7", "bob from 10.128.2.9"]
            truth["conn-sessions:ml-dev-env-0"] = "2"
            truth["conn:ml-dev-env-1"] = ["carol from 10.128.0.10"]
            truth["conn-pod"] = ["ml-dev-env-0", "ml-dev-env-0", "ml-dev-env-1"]
            page = settle(env, truth)
            assert INJECTED not in page and "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page and "<b>alice" not in page
            first = page[page.index("<svg") : page.index("</svg>") + 6]
            ET.fromstring(first)
            # the page's only API call (the agents here have no API), and the render lets the pods' ServiceAccount make it
            read = ("GET", f"/api/v1/namespaces/{NS}/configmaps?fieldSelector=metadata.name%3D{APP}-usage")
            assert set(api.requests) == {read} and api.denied == [], (api.denied, set(api.requests))
        finally:
            rank.__exit__(None, None, None)
        # one connection closes (both its sessions), the run ends: the page follows
        since = shown(env.get("fragment"))[0]["since:ml-dev-env-0"]
        env.restart_page()  # a restarted page keeps the samples it held: the same "since"
        for proc in (alice, second):
            stop(proc)
        env.heartbeat.__exit__(None, None, None)
        env.heartbeat = None
        truth = ground_truth(env, ssh={0: 1, 1: 1}, ranks={0: 0, 1: 0}, runs=0)
        truth.update({"conn:ml-dev-env-0": ["bob from 10.128.2.9"], "conn:ml-dev-env-1": ["carol from 10.128.0.10"]})
        truth["conn-pod"] = ["ml-dev-env-0", "ml-dev-env-1"]
        truth["since:ml-dev-env-0"] = since
        settle(env, truth)
    finally:
        api.close()


def ground_truth(env: Environment, ssh: dict[int, int], ranks: dict[int, int], runs: int) -> dict[str, Any]:
    """What the page must show, from what the test made (the page's own `now` and samples only where they are the
    page's: its update time, the start of the history it holds)."""
    result = fabric_result(env)
    settings = json.loads(env.settings.read_text())
    names = [p.name for p in env.pods]
    truth: dict[str, Any] = {
        "gpu-hours-7d": status_hours(USAGE, APP, NS),
        "usage-days": "7",
        "fabric-time": result["time"],
        "plateau": str(result["plateauBusbw"]),
        "pass": str(result["expectation"]["pass_busbw_gbs"]),
        "diagnosis": list(result["diagnosis"]),
    }
    for i, pod in enumerate(env.pods):
        util = int((pod.bin / "gpu-util").read_text())
        busy = "busy" if util >= settings["gpuUtilThreshold"] else "idle"
        truth.update({f"rank:{pod.name}": str(i), f"pod:{i}": pod.name, f"node:{pod.name}": f"gpu-node-{i}"})
        truth.update({f"gpu:{pod.name}:{g}": f"GPU {g}: {util}% {busy}" for g in range(4)})  # the stub's 4 GPUs
        truth.update({f"ssh:{pod.name}": str(ssh[i]), f"ranks:{pod.name}": str(ranks[i])})
        # its plot: the busiest GPU (all four alike: the first), since the first sample the page holds
        truth.update({f"busiest:{pod.name}": "GPU 0", f"gpus:{pod.name}": "4", f"since:{pod.name}": first_sample(env, pod.name)})
    beats = sorted((env.pods[0].state / "heartbeat").glob("run-*.json"))
    assert len(beats) == runs, beats
    for n, beat in enumerate(beats):
        info = json.loads(beat.read_text())
        truth.update(
            {
                f"run:{n}:command": shlex.join(info["command"]),
                f"run:{n}:cwd": info["cwd"],
                f"run:{n}:on": names[0],
                f"run:{n}:pods": str(len(info["pods"])),
                f"run:{n}:age": lambda v, started=info["started"]: len(v) == 1 and v[0] in AGES(started),
            }
        )
    return truth


def first_sample(env: Environment, pod: str) -> Callable[[list[str]], bool]:
    """The plot's "since": the first sample of the history the page keeps (its file in the workspace)."""

    def ok(shown: list[str]) -> bool:
        samples = json.loads((env.workspace / ".ml-dev-env" / "home" / "history.json").read_text())["samples"][pod]
        return shown == [clock(samples[0][0])]

    return ok


def AGES(started: float) -> set[str]:
    """The run's age as the page may show it between two reads (the page's `now` is checked separately)."""
    return {ago(time.time() - started - d) for d in range(0, 4)}


def settle(env: Environment, truth: dict[str, Any], timeout: float = 30) -> str:
    """The fragment once every value is the truth: the idle card against pod 0's agent's decision read around it,
    the page's time against the clock; the last differences in the message when it never settles."""
    deadline = time.monotonic() + timeout
    problems: list[str] = ["never read"]
    page = ""
    settings = json.loads(env.settings.read_text())
    seen: list[dict[str, Any]] = []  # pod 0's agent's recent decisions: the page shows the one it sampled
    while time.monotonic() < deadline:
        seen = [*seen[-8:], fetch_json(f"http://{env.pods[0].address()}/decision")]
        page = env.get("fragment")
        now = float(re.search(r'data-now="([0-9.]+)"', page).group(1))  # type: ignore[union-attr]
        values, stray = shown(page)
        problems = ["the page's time is not now"] if abs(now - time.time()) > 5 else []
        base = {**truth, "updated": clock(now)}
        options = [check(values, stray, {**base, **idle_truth(d, settings, now)}) for d in seen if d.get("lastActive")]
        problems += sorted(options, key=len)[0] if options else ["pod 0's agent has decided nothing yet"]
        if not problems:
            return page
        time.sleep(0.3)
    raise AssertionError(
        "the page's numbers are not what the test made:\n" + "\n".join(problems) + f"\n{page}\n--- log:\n{env.log.read_text()}"
    )


def test_full_page_loads_nothing_from_elsewhere(environment: Environment) -> None:
    env = environment
    env.start()
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


def test_page_runs_on_the_oldest_python(environment: Environment, tmp_path: Path) -> None:
    """The whole page, on live agents and the real gate's files, under inpod.MIN_PYTHON (the units of
    tests/inpod/pod_units.py cover the pieces on every version)."""
    version = ".".join(map(str, inpod.MIN_PYTHON))
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no CPython {version} here (pyenv versions/{version}.*, python{version} on PATH)")
    env = environment
    env.start()
    rendered = subprocess.run(
        [python, str(mount.shipped() / "home_page.py"), "render"],
        env={"PATH": "/usr/bin:/bin", "ML_DEV_STATE_DIR": str(env.pods[0].state), "ML_DEV_WORKSPACE": str(env.workspace),
             "ML_DEV_IDLE_SETTINGS": str(env.settings), "ML_DEV_HOME_AGENTS": " ".join(f"{p.name}={p.address()}" for p in env.pods)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    assert "ml-dev-env-1" in rendered.stdout and 'id="fabric-status" class="bad">FAIL' in rendered.stdout
    curve = subprocess.run(
        [python, "-c", "import json, sys; from inpod.home import svgplot; sys.stdout.write(svgplot.gate_curve(json.load(sys.stdin)))"],
        input=json.dumps(fabric_result(env)), cwd=mount.shipped(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert curve.returncode == 0, curve.stderr
    assert ET.fromstring(curve.stdout).tag == f"{SVG}svg"
