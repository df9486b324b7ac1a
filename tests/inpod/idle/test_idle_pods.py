"""The idle agents as the render starts them, one per pod, on simulated pods (tests/podsim/idlestop.py), in real time.

startup.sh starts the idle agent on every pod; pod 0's agent gathers the other pods' /activity through rank.env
and the cluster DNS and scales the StatefulSet to 0 through the API stand-in at the `kubernetes` Service address
(its mounted token and CA); the workers mirror pod 0's warning from its GET /decision at MASTER_ADDR (rank.env).
The GPUs are the node's nvidia-smi (tests/podsim/nodetools.py). The idle settings are the rendered ConfigMap's
with a quicker clock (a ConfigMap edit before the pods start: the stack's own bounds keep 15 s and more).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inpod.idle.conftest import APP, NS, TOKEN, FakeApiServer
from tests.inpod.idle.test_idle_agent import assert_event_shape
from tests.podsim.idlestop import STATE, IdleSim, mine, no_dev_servers, wait_for
from tests.podsim.pods import REPO, missing_requirements, render_stack
from tests.podsim.render import pod_rules

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")]

TIMEOUT, INTERVAL, LEAD = 6, 1, 3
QUICK = {"idleTimeoutSeconds": TIMEOUT, "intervalSeconds": INTERVAL, "warningLeadSeconds": LEAD}
PYTHON = (REPO / ".venv").resolve() / "bin" / "python"
H200 = REPO / "tests" / "data" / "tool_output" / "nvidia-smi-h200"
"""Real nvidia-smi output of an H200, idle and during a job (SOURCES.md there)."""
JUPYTER = f"#!/bin/sh\n# the image's JupyterLab (system pip): this checkout's\nexec {PYTHON} -m jupyter \"$@\"\n"
"""The image's `jupyter` (images/base.Containerfile), which this machine has only in the test environment."""
TERMINAL = r"""
import os, select, sys, time
# a terminal on the pod (an IDE's or `oc exec -t`'s): what the pod writes to it comes out here
master, slave = os.openpty()
print(os.ttyname(slave), flush=True)
end = time.monotonic() + 300
while time.monotonic() < end:
    if select.select([master], [], [], 1)[0]:
        sys.stdout.write(os.read(master, 65536).decode(errors="replace"))
        sys.stdout.flush()
"""


def idle_stop_on(objects: dict[str, Any]) -> None:
    """The idle stop with the stack's own defaults, no dev servers."""
    no_dev_servers(objects)
    objects.setdefault("lifecycle", {})["idleStop"] = {"enabled": True}


@pytest.fixture(scope="module")
def idle_render() -> Any:
    return render_stack("barcelona", idle_stop_on)


@pytest.fixture(scope="module")
def untouched(idle_render: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[IdleSim, FakeApiServer, float, float]]:
    """Two pods nobody touches, from their start until pod 0's agent has scaled to 0 and the worker shows the warning."""
    api = FakeApiServer(pod_rules(idle_render))  # the pods' ServiceAccount: the agent's Role, the reader's (the home page)
    sim = IdleSim(idle_render, settings={**QUICK, "servers": []}, api=api, token=TOKEN)
    try:
        started = time.time()
        sim.start()
        wait_for("pod 0's agent scales to 0 and records why", api.stopped, 60, sim.agent_log)
        stopped_at = time.time()
        wait_for("the worker mirrors the warning", sim.pods[1].path(f"{STATE}/idle-warning").exists, 30, lambda: sim.agent_log(1))
        yield sim, api, started, stopped_at
    finally:
        sim.stop()
        api.close()
        assert not mine(sim), mine(sim)


@pytest.mark.timeout(300)
def test_untouched_environment_is_stopped_and_the_reason_recorded(untouched: tuple[IdleSim, FakeApiServer, float, float]) -> None:
    sim, api, _, _ = untouched
    assert api.replicas == 0 and [s["spec"]["replicas"] for s in api.scales] == [0]
    assert api.denied == []
    # the record: on the ConfigMap ...
    data = api.configmap["data"]
    assert data["replicasBefore"] == "2" and int(data["idleSeconds"]) >= TIMEOUT
    signals = json.loads(data["signals.json"])
    idle = [0] * sim.gpus
    assert signals[f"{APP}-0/gpu"]["util"] == idle and signals[f"{APP}-1/gpu"]["util"] == idle, signals
    assert signals[f"{APP}-1/ssh"] == {"ok": True, "active": False, "age": None, "records": []}, signals
    # ... and as an Event on the StatefulSet
    (event,) = api.events
    assert event["involvedObject"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": APP,
        "namespace": NS,
        "uid": "0d7a9c1e-5f0b-4c55-9d3e-2b1f4e6a8c01",
    }
    assert event["reason"] == "IdleStop" and event["type"] == "Normal" and "replicas 2 -> 0" in event["message"]
    assert f'"{APP}-1/gpu"' in event["message"]
    assert_event_shape(event)


@pytest.mark.timeout(300)
def test_untouched_environment_stops_within_idle_timeout_plus_two_intervals(untouched: tuple[IdleSim, FakeApiServer, float, float]) -> None:
    sim, api, started, stopped_at = untouched
    record = api.configmap["data"]
    assert TIMEOUT <= int(record["idleSeconds"]) <= TIMEOUT + 2 * INTERVAL, (record, sim.agent_log())
    assert stopped_at - started < 60  # generous wall-clock bound, from before the pods (and their agents) start
    assert api.denied == [] and len(api.events) == 1
    assert "will be SUSPENDED" in sim.pods[1].path(f"{STATE}/idle-warning").read_text(), "the worker mirrors pod 0's warning"


@pytest.mark.timeout(300)
def test_busy_gpu_that_prints_nothing_is_never_stopped_then_idle_stops_in_time(tmp_path: Path) -> None:
    """A silent training job on the worker only (its GPUs busy: no output, no IDE, no shell) holds the stop; once it
    ends the environment is warned (a banner on pod 0's open terminal, the warning on the worker) and stopped within
    idleTimeout + 2 intervals of the last activity. Pod 0 runs the image's JupyterLab as startup.sh starts it."""

    def jupyter_on(objects: dict[str, Any]) -> None:
        idle_stop_on(objects)
        objects["access"]["jupyter"] = True

    render = render_stack("barcelona", jupyter_on)
    api = FakeApiServer(pod_rules(render))  # the pods' ServiceAccount: the agent's Role, the reader's (the home page)
    programs = {"/usr/local/bin/jupyter": JUPYTER}
    sim = IdleSim(
        render,
        settings={**QUICK, "servers": ["jupyter"]},
        api=api,
        token=TOKEN,
        image_programs=programs,
        image_paths=[PYTHON.parent.parent],  # the virtualenv JupyterLab lives in, wherever the checkout is
    )
    sim.node.overrides[1] = {"gpu_util": {str(i): 97 for i in range(sim.gpus)}, "gpu_mem_util": {str(i): 40 for i in range(sim.gpus)}}
    terminal = None
    try:
        sim.start()
        terminal = sim.popen(0, ["python3", "-c", TERMINAL])
        assert terminal.stdout is not None
        assert terminal.stdout.readline().startswith("/dev/pts/"), "a terminal on pod 0"
        # the whole window: more than idleTimeout + 2 x interval after pod 0's agent reads its first round
        busy = lambda: f"{APP}-1/gpu: active" in sim.decision().get("reason", "")  # noqa: E731
        wait_for("pod 0's agent sees the worker busy", busy, 60, sim.agent_log)
        wait_for("Jupyter answers pod 0's agent", lambda: _signal(sim, "jupyter"), 240, lambda: sim.pods[0].log.read_text())
        time.sleep(TIMEOUT + 4 * INTERVAL)
        assert api.scales == [], sim.agent_log()
        assert not sim.pods[0].path(f"{STATE}/idle-warning").exists()
        # the job ends: from now on the environment is idle
        idle_since = time.time()
        sim.node.gpu(sim, 1, util=0, mem=0)
        wait_for("pod 0 warns", sim.pods[0].path(f"{STATE}/idle-warning").exists, 60, sim.agent_log)
        wait_for("the worker warns", sim.pods[1].path(f"{STATE}/idle-warning").exists, 30, lambda: sim.agent_log(1))
        warned_at = time.time()
        wait_for("pod 0's agent scales to 0 and records why", api.stopped, 60, sim.agent_log)
        stopped_at = time.time()
        warning = sim.pods[0].path(f"{STATE}/idle-warning").read_text()
    finally:
        if terminal is not None:
            sim.interrupt(terminal)
        sim.stop()
        api.close()
    banner = terminal.communicate(timeout=30)[0] if terminal is not None else ""
    assert not mine(sim), mine(sim)
    assert [s["spec"]["replicas"] for s in api.scales] == [0]
    assert warned_at <= stopped_at
    # the agent's own account: stopped after idleTimeout, within idleTimeout + 2 x interval of the last activity
    record = api.configmap["data"]
    assert TIMEOUT <= int(record["idleSeconds"]) <= TIMEOUT + 2 * INTERVAL, record
    assert record["lastActivityReason"] == f"{APP}-1/gpu: active", record
    assert stopped_at - idle_since < 60  # generous wall-clock bound (shared, loaded test machines)
    assert "will be SUSPENDED" in banner, banner
    assert "will be SUSPENDED" in warning
    signals = json.loads(record["signals.json"])
    assert signals[f"{APP}-1/gpu"]["util"] == [0] * sim.gpus and signals[f"{APP}-0/jupyter"]["ok"] is True, signals


@pytest.mark.timeout(300)
def test_a_worker_replaying_a_real_h200_is_busy_then_idle(idle_render: Any) -> None:
    """Pod 1's node replays the real nvidia-smi of an H200 (tests/data/tool_output/nvidia-smi-h200, SOURCES.md there).
    During the capture's job pod 0's agent sees the worker's GPU busy, and the worker's own probe names the job's
    process; with the capture of the idle GPU the worker's probe finds it idle and pod 0's clock runs."""
    api = FakeApiServer(pod_rules(idle_render))
    sim = IdleSim(idle_render, settings={**QUICK, "idleTimeoutSeconds": 3600, "servers": []}, api=api, token=TOKEN)
    try:
        sim.start()
        sim.node.gpu(sim, 1, replay={"gpu": H200 / "gpu-busy-1.csv", "apps": H200 / "apps-busy-1.csv", "rc": 0})
        busy = lambda: f"{APP}-1/gpu: active" in sim.decision().get("reason", "")  # noqa: E731
        wait_for("pod 0's agent sees the worker's GPU busy", busy, 60, sim.agent_log)
        gpu = _signal(sim, "gpu", 1)
        with (H200 / "apps-busy-1.csv").open(newline="") as f:
            (job,) = list(csv.DictReader(f, skipinitialspace=True))
        assert gpu is not None and gpu["active"] and gpu["detail"]["processes"] == 1, gpu
        assert f"compute process {job['pid']} ({job['process_name']})" in gpu["detail"]["why"]["0"], gpu
        sim.node.gpu(sim, 1, replay={"gpu": H200 / "gpu-idle.csv", "apps": H200 / "apps-idle.csv", "rc": 0})
        gpu = _signal(sim, "gpu", 1)
        assert gpu is not None and not gpu["active"] and gpu["detail"]["processes"] == 0, gpu
        assert [g["uuid"] for g in gpu["detail"]["gpus"]] == [job["gpu_uuid"]]  # the captured GPU, not the node's default
        quiet = lambda: sim.decision().get("idleSeconds", 0) >= 3 * INTERVAL  # noqa: E731
        wait_for("pod 0's agent sees nothing active", quiet, 60, sim.agent_log)
        assert api.scales == []
    finally:
        sim.stop()
        api.close()
    assert not mine(sim), mine(sim)


def _signal(sim: IdleSim, name: str, index: int = 0) -> dict[str, Any] | None:
    """Pod `index`'s own signal `name` as its agent reports it (`idle_agent.py probe`: its GET /activity), when it is ok."""
    res = sim.exec(index, "python3 /opt/ml-dev-env/idle_agent.py probe", timeout=60)
    try:
        signals = {s["name"]: s for s in json.loads(res.stdout)["signals"]}
    except (ValueError, KeyError):
        return None
    return dict(signals[name]) if name in signals and signals[name]["ok"] else None
