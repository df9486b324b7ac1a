"""A worker whose nvidia-smi hangs, on pods started from the render (tests/podsim): issue 35 item 7.

Pod 1's nvidia-smi never answers (a driver stuck in NVML). Its idle agent answers pod 0's GET /activity in time
with a failed GPU check, so pod 0 counts it as active ("ml-dev-env-1/gpu: probe failed") and never lists it as
unreachable; `ml-dev status` shows it reachable. Pod 0's own GPUs are idle (nvidia-smi's real CSV).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from components import lifecycle
from core import naming, pod_contract
from tests.podsim.pods import PREFIX, PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")

STATE = "/tmp/ml-dev-env"
IDLE_GPU = """#!/bin/bash
case "$*" in
  *--query-compute-apps=*) echo "gpu_uuid, pid, process_name, used_gpu_memory [MiB]" ;;
  *--query-gpu=index,uuid,*) echo "index, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB]"
                             echo "0, GPU-00000000-4d87-49d1-2eb9-39ec2baddf9b, 0 %, 0 %, 0 MiB" ;;
  *) exec /usr/bin/nvidia-smi.podsim "$@" ;;
esac
"""
HUNG = """#!/bin/bash
case "$*" in
  *--query-gpu=index,uuid,*|*--query-compute-apps=*) exec sleep 3600 ;;  # stuck in the driver
  *) exec /usr/bin/nvidia-smi.podsim "$@" ;;
esac
"""


def with_idle_stop(objects: dict[str, Any]) -> None:
    objects["access"] = {**objects["access"], "vscode": False, "jupyter": False, "tensorboard": False}
    objects.setdefault("lifecycle", {})["idleStop"] = {"enabled": True, "interval": "15s", "unreachableAfter": "2m"}


def wait_for(what: str, check: Callable[[], Any], timeout: float, log: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{log()}")
        time.sleep(0.5)


@pytest.mark.timeout(300)
def test_a_worker_with_a_hung_nvidia_smi_is_active_never_unreachable() -> None:
    sim = PodSim(render_stack("barcelona", with_idle_stop), count=2)
    with sim.start():
        for pod, tool in zip(sim.pods, (IDLE_GPU, HUNG), strict=True):
            path = pod.path("/usr/bin/nvidia-smi")
            path.rename(pod.path("/usr/bin/nvidia-smi.podsim"))
            path.write_text(tool)
            path.chmod(0o755)
        cm = naming.lifecycle_configmap("ml-dev-env")
        settings = json.loads(sim.configmaps[cm][lifecycle.SETTINGS_KEY])
        # a quicker round; the bound for an unreachable pod stays far above the test's length
        sim.swap_configmap(cm, {lifecycle.SETTINGS_KEY: json.dumps({**settings, "intervalSeconds": 2, "unreachableSeconds": 600})})
        log = lambda: sim.pods[0].path(f"{STATE}/logs/idle-agent.log").read_text()  # noqa: E731

        def decision() -> dict[str, Any]:
            try:
                return dict(json.loads(sim.pods[0].path(f"{STATE}/idle-status.json").read_text()))
            except (OSError, ValueError):
                return {}

        seen = wait_for(
            "pod 0 counts pod 1's hung GPU check as activity",
            lambda: "ml-dev-env-1/gpu: probe failed (`nvidia-smi --query-gpu" in decision().get("reason", "") and decision(),
            60 + 2 * pod_contract.ACTIVITY_FETCH_SECONDS,
            log,
        )
        assert f"did not answer within {pod_contract.GPU_PROBE_SECONDS} s" in seen["reason"], seen["reason"]
        assert seen["unreachable"] == {}, seen
        # and it keeps answering: a few rounds later still active for the same reason, never unreachable
        later = wait_for("more rounds", lambda: decision().get("lastActive", 0) > seen["lastActive"] + 4 and decision(), 60, log)
        assert later["unreachable"] == {} and "did not answer within" in later["reason"], later
        assert "Pod ml-dev-env-1 unreachable" not in log()
    assert not [item for item in leftovers() if f"{PREFIX}{sim.run_id}-" in item]
