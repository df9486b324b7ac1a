"""A worker whose nvidia-smi hangs or fails, on pods started from the render (tests/podsim): issue 35 item 7.

Pod 1's nvidia-smi never answers (a driver stuck in NVML), or fails (the driver gone): the node's tool
(tests/podsim/nodetools.py). Its idle agent answers pod 0's GET /activity in time with a failed GPU check, so pod 0
counts it as active ("ml-dev-env-1/gpu: probe failed") and never lists it as unreachable; nothing is scaled, no
warning shown. Pod 0's own GPUs are idle (nvidia-smi's real CSV).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from inpod import contract as pod_contract
from tests.inpod.idle.conftest import TOKEN, FakeApiServer, load_agent
from tests.podsim.idlestop import STATE, IdleSim, mine, wait_for, with_idle_stop
from tests.podsim.pods import missing_requirements, render_stack
from tests.podsim.render import pod_rules

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")]

# GET /activity of pod 1 from pod 0, as pod 0's gather asks it (inpod/lib/http.py fetch_json with the contract's
# fetch timeout), timed: prints the seconds and the report
FETCH = """
import json, sys, time
from inpod.lib.http import fetch_json
t0 = time.monotonic()
report = fetch_json(sys.argv[1], timeout=float(sys.argv[2]))
print(json.dumps({"seconds": time.monotonic() - t0, "report": report}))
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[IdleSim, FakeApiServer]]:
    """Two pods, the idle stop on, a round every 2 s; the bound for an unreachable pod far above the tests' length."""
    result = render_stack("barcelona", with_idle_stop)
    api = FakeApiServer(pod_rules(result))  # the pods' ServiceAccount: the agent's Role, the reader's (the home page)
    sim = IdleSim(result, settings={"intervalSeconds": 2, "unreachableSeconds": 600}, api=api, token=TOKEN)
    try:
        sim.start()
        yield sim, api
    finally:
        sim.stop()
        api.close()
        assert not mine(sim), mine(sim)


def broken_worker(sim: IdleSim, api: FakeApiServer, smi: str, error: str) -> dict[str, Any]:
    """Pod 1's nvidia-smi `smi`: pod 0 counts its failed GPU check as activity for a few rounds, never unreachable."""
    sim.node.gpu(sim, 1, smi=smi)
    seen = wait_for(
        f"pod 0 counts pod 1's {smi} GPU check as activity",
        lambda: error in sim.decision().get("reason", "") and sim.decision(),
        60 + 2 * pod_contract.ACTIVITY_FETCH_SECONDS,
        sim.agent_log,
    )
    # either query of the probe (inpod/idle/probes.py probe_gpu: --query-gpu, then --query-compute-apps): the tool may
    # break between the two queries of one round (seen once in CI: the first answered, the second hung)
    assert re.search(r"ml-dev-env-1/gpu: probe failed \(`nvidia-smi --query-(gpu|compute-apps)=", seen["reason"]), seen["reason"]
    assert seen["unreachable"] == {}, seen
    # and it keeps answering: a few rounds later still active for the same reason, never unreachable
    rounds_later = lambda: sim.decision().get("lastActive", 0) > seen["lastActive"] + 4 and sim.decision()  # noqa: E731
    later = wait_for("more rounds", rounds_later, 60, sim.agent_log)
    assert later["unreachable"] == {} and error in later["reason"], later
    assert "Pod ml-dev-env-1 unreachable" not in sim.agent_log()
    # nothing stopped, nothing warned
    assert api.scales == [] and api.events == [], (api.scales, api.events)
    assert not sim.pods[0].path(f"{STATE}/idle-warning").exists()
    return later


@pytest.mark.timeout(300)
def test_a_worker_with_a_hung_nvidia_smi_is_active_never_unreachable(sim: tuple[IdleSim, FakeApiServer]) -> None:
    pods, api = sim
    broken_worker(pods, api, "hang", f"did not answer within {pod_contract.GPU_PROBE_SECONDS} s")


@pytest.mark.timeout(300)
def test_a_hung_workers_activity_answers_within_the_fetch_timeout(sim: tuple[IdleSim, FakeApiServer]) -> None:
    """Pod 1's agent (its own process, /activity over HTTP) with an nvidia-smi that never answers: pod 0's GET gets its
    answer within the fetch timeout, a failed GPU check that holds the stop as activity (the decider, in process)."""
    pods, _ = sim
    pods.node.gpu(pods, 1, smi="hang")
    url = f"http://{pods.fqdn(1)}:{pods.settings()['activityPort']}/activity"
    res = pods.exec(0, ["python3", "-c", FETCH, url, str(pod_contract.ACTIVITY_FETCH_SECONDS)], cwd="/opt/ml-dev-env", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(res.stdout)
    assert got["seconds"] < pod_contract.ACTIVITY_FETCH_SECONDS, got["seconds"]
    report = got["report"]
    gpu = next(s for s in report["signals"] if s["name"] == "gpu")
    assert not gpu["ok"] and "did not answer within" in gpu["detail"]["error"], gpu
    agent = load_agent()
    decider = agent.Decider(now=0)
    decider.observe([report], now=time.time())
    assert decider.reason.startswith("ml-dev-env-1/gpu: probe failed"), decider.reason
    assert decider.unreachable_since == {}


@pytest.mark.timeout(300)
def test_a_worker_whose_nvidia_smi_fails_is_active(sim: tuple[IdleSim, FakeApiServer]) -> None:
    """The driver gone on pod 1 (nvidia-smi exits 9): a failed probe of a worker counts as active."""
    pods, api = sim
    broken_worker(pods, api, "fail", "exit 9: NVIDIA-SMI has failed")
