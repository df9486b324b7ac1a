"""fabricCheck.onDeploy: pod 0 holds its dev servers until the fabric check passes (bounded retries, then a
manual pass or `release`), and the startup script's hook honours it; on pods started from the render."""

from __future__ import annotations

import time
from typing import IO, Any

import pytest

from tests.inpod.fabric.conftest import Fabric, needs_pods
from tests.podsim.nodetools import Node
from tests.podsim.pods import PodSim, render_stack

pytestmark = pytest.mark.timeout(300)


def read_until(stream: IO[str], needle: str, limit: int = 400) -> list[str]:
    """Lines from a child's stdout up to the first containing `needle` (the child blocks until then)."""
    lines = []
    for _ in range(limit):
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} never printed:\n{''.join(lines)}")


def test_hold_returns_at_once_without_on_deploy(fabric) -> None:
    f: Fabric = fabric(2)
    res = f.run("hold")
    assert res.returncode == 0 and res.stdout == ""
    assert not f.calls("ibstat") and not f.calls("all_reduce_perf"), "no preflight, no gate"


def test_hold_runs_preflight_and_gate_and_releases_on_pass(fabric) -> None:
    f: Fabric = fabric(2)
    res = f.run("hold", "--interval", "0.1", settings={**f.settings, "onDeploy": True})
    assert res.returncode == 0, res.stdout
    assert "fabric gate PASS" in res.stdout
    assert f.result(where="state")["status"] == "pass"
    assert {c["pod"] for c in f.calls("ibstat")} == set(f.names), "preflight ran on every pod"


def test_hold_keeps_holding_after_the_timeout_until_release(fabric) -> None:
    f: Fabric = fabric(2)
    f.state(1)["ports"]["mlx5_7"] = {"state": "Active", "rate": 100}
    f.apply(1)
    proc = f.start("hold", "--timeout", "1", "--interval", "0.2", settings={**f.settings, "onDeploy": True})
    try:
        assert proc.stdout is not None
        lines = read_until(proc.stdout, "did not pass within 1 s")
        assert any("FAIL ml-dev-env-1 (node node-1) mlx5_7: port 1 Active at 100 Gb/s" in line for line in lines), lines
        assert proc.poll() is None, "still holding after the timeout"
        release = f.run("release")
        assert release.returncode == 0
        assert proc.wait(timeout=60) == 0
    finally:
        PodSim.interrupt(proc, 9)
        proc.kill()
        proc.wait(timeout=30)


def test_a_release_between_attempts_is_seen_without_waiting_for_the_next(fabric) -> None:
    """Attempts 600 s apart: the release ends the hold during the wait after the first failed attempt (the deadline
    below is a tenth of the interval, so only a hold that looks between attempts passes)."""
    f: Fabric = fabric(2)
    f.state(1)["ports"]["mlx5_7"] = {"state": "Active", "rate": 100}
    f.apply(1)
    proc = f.start("hold", "--interval", "600", settings={**f.settings, "onDeploy": True})
    try:
        assert proc.stdout is not None
        read_until(proc.stdout, "preflight failed; retrying in 600 s")
        assert proc.poll() is None, "holding"
        assert f.run("release").returncode == 0
        assert proc.wait(timeout=60) == 0
    finally:
        PodSim.interrupt(proc, 9)
        proc.kill()
        proc.wait(timeout=30)


def test_hold_ends_when_a_manual_gate_passes(fabric) -> None:
    f: Fabric = fabric(2)
    for i in range(2):
        f.state(i)["busbw"] = 40.0
    f.apply()
    settings = {**f.settings, "onDeploy": True}
    proc = f.start("hold", "--timeout", "1", "--interval", "0.2", settings=settings)
    try:
        assert proc.stdout is not None
        read_until(proc.stdout, "did not pass within")
        assert f.result(where="state")["status"] == "fail"
        for i in range(2):  # the operator fixed the fabric and reruns the gate on pod 0
            f.state(i)["busbw"] = 197.0
        f.apply()
        assert f.run("gate").returncode == 0
        assert proc.wait(timeout=60) == 0
    finally:
        PodSim.interrupt(proc, 9)
        proc.kill()
        proc.wait(timeout=30)


def on_deploy(objects: dict[str, Any]) -> None:
    objects["nodes"] = {**objects["nodes"], "count": 2}
    objects["fabricCheck"] = {**objects.get("fabricCheck", {}), "onDeploy": True, "onDeployTimeoutSeconds": 60}


@needs_pods
def test_startup_hook_holds_pod_0_dev_servers_until_release() -> None:
    """barcelona with fabricCheck.onDeploy; pod 1's node shows 2 of its 4 GPUs. Pod 0's startup holds: not Ready, no
    dev server, until `fabric_check.py release`; pod 1 turns Ready on its own."""
    result = render_stack("barcelona", on_deploy)
    sts = next(r.inputs for r in result.resources if r.kind == "StatefulSet")
    # the program's retry interval (default 30 s), set on the container as `oc set env` would: the only change
    sts["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "ML_DEV_FABRIC_INTERVAL", "value": "0.2"})
    sim = PodSim(result, count=2, node=Node(overrides={1: {"gpus": 2}}))
    with sim.start(wait=False):
        sim.wait_ready(1)
        log = sim.pods[0].log
        deadline = time.monotonic() + 120
        while "GPUs: 2 visible, expected 4" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert "FAIL ml-dev-env-1 (node node-1) GPUs: 2 visible, expected 4" in log.read_text()
        time.sleep(1)
        assert not sim.probe(0), "pod 0 is held: not Ready"
        assert "starting vscode" not in log.read_text(), "pod 0 is held: no dev servers"
        assert sim.exec(0, "python3 /opt/ml-dev-env/fabric_check.py release", timeout=60).returncode == 0
        sim.wait_ready(0, timeout=120)
        assert "starting vscode: code-server" in log.read_text()
