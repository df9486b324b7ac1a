"""The start ledger end to end on simulated pods (root): `ml-dev status --start` in pod 0 of barcelona (2 pods, from the
render, its node's tools) reads a scripted resume from an API stand-in and the pods' own real marks.

* The API (tests/podsim/idlestop.py serve_api: HTTPS at the `kubernetes` Service, the pods' service-account token and
  CA) serves the pods, their events and Kueue's Workload as the API server, the kubelet and Kueue write them: whole
  second timestamps; the kubelet's `Pulled` texts of tests/inpod/lib/data/kubelet_events.json (kubernetes
  pkg/kubelet/images/image_manager.go EnsureImageExists; the event reasons pkg/kubelet/events/event.go PulledImage
  "Pulled"); the Workload Kueue's StatefulSet integration builds, owned by the StatefulSet and named on each pod
  (kubernetes-sigs/kueue pkg/controller/jobs/statefulset: statefulset_reconciler.go constructWorkload,
  statefulset_pod_reconciler.go setDefault). The resume: admitted 20 s after the pods were created (the queue), pod 0
  on a node holding the pinned image ("already present"), pod 1 pulling it.
* The in-pod phases are real: sshd.sh marks sshd listening, the fabric gate (fabric_check.py gate, the node's
  nccl-tests stand-ins) passes on pod 0, `ml-dev run` starts the first rank on both pods.

The phases of each pod add up to its wall time, which is the measured time from its creation to its first rank (± 2 s:
the API's whole seconds); the ledger is kept with the environment's records, and the home page's card shows it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inpod import contract
from tests.podsim.idlestop import IdleSim, no_dev_servers, wait_for
from tests.podsim.nodetools import Node
from tests.podsim.pods import missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(420)]

DATA = Path(__file__).parents[1] / "inpod" / "lib" / "data" / "kubelet_events.json"
TOKEN = "sha256~start-ledger-token"
ML_DEV = "python3 /opt/ml-dev-env/ml-dev"
PROJECT = "/workspace/proj"
QUEUE = "team-gpu"
RUNTIME = "image-registry.openshift-image-registry.svc:5000/nccl-test/ml-dev-env:runtime-3f9c2a1b"


def rfc3339(ts: float) -> str:
    """metav1.Time as the API server writes it: whole seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(ts)))


class StartApi:
    """The namespace's API as the ledger reads it: pods (label selector), Pod events, Kueue Workloads."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.workloads: list[dict[str, Any]] = []
        self.seen: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api.seen.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    code, body = 401, {"kind": "Status", "code": 401}
                elif "/pods?" in self.path and "labelSelector=" in self.path:
                    code, body = 200, {"items": api.pods}
                elif "/events?" in self.path:
                    code, body = 200, {"items": api.events}
                elif "/workloads" in self.path and "kueue.x-k8s.io" in self.path:
                    code, body = 200, {"items": api.workloads}
                else:
                    code, body = 404, {"kind": "Status", "code": 404}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # its handler class is served in the pod network

    def script(self, sim: IdleSim, started: float, cold: bool, generation: int) -> float:
        """One start up to the containers' start (`started`, when the simulated containers started), as the API would
        record it; returns the pods' creation time. Both starts: created together (podManagementPolicy Parallel),
        admitted by the queue 20 s later, scheduled +1 s, volumes +3 s. Cold (the first start): every node pulls the
        image (34 s), containers start at +60 s. A resume on nodes holding the pinned image: "already present" 1 s after
        the volumes, containers at +26 s."""
        fixtures = json.loads(DATA.read_text())
        lead = 60 if cold else 26
        created = float(int(started) - lead)
        workload = f"statefulset-{sim.app}-5d1c9"
        sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sim.app, "uid": "sts-uid", "controller": True}
        self.workloads = [
            {
                "metadata": {"name": workload, "namespace": sim.namespace, "ownerReferences": [sts]},
                "spec": {"queueName": QUEUE},
                "status": {"conditions": [{"type": "Admitted", "status": "True", "lastTransitionTime": rfc3339(created + 20)}]},
            }
        ]
        present = fixtures["present"][1].replace("busybox:1.36", RUNTIME)
        pulled = fixtures["pulled"][0]["message"].replace("nginx:1.27", RUNTIME).replace("7.264s (7.264s", "33.9s (34.1s")
        pulled = pulled.replace("68857691", "21474836480")
        self.pods, self.events = [], []
        for i, pod in enumerate(sim.pods):
            uid = f"uid-{generation}-{i}"
            conditions = [("PodScheduled", 21), ("PodReadyToStartContainers", 24), ("Initialized", 24)]
            self.pods.append(
                {
                    "metadata": {
                        "name": pod.name,
                        "namespace": sim.namespace,
                        "uid": uid,
                        "creationTimestamp": rfc3339(created),
                        "labels": {"kueue.x-k8s.io/pod-group-name": workload, "kueue.x-k8s.io/prebuilt-workload-name": workload},
                        "ownerReferences": [sts],
                    },
                    "spec": {"nodeName": f"gpu-node-{i}"},
                    "status": {
                        "conditions": [
                            {"type": kind, "status": "True", "lastTransitionTime": rfc3339(created + at)} for kind, at in conditions
                        ],
                        "containerStatuses": [{"name": "ml-dev", "state": {"running": {"startedAt": rfc3339(started)}}}],
                    },
                }
            )
            self.events.append(
                {
                    "reason": "Pulled",
                    "type": "Normal",
                    "message": pulled if cold else present,
                    "involvedObject": {"kind": "Pod", "name": pod.name, "uid": uid, "fieldPath": "spec.containers{ml-dev}"},
                    "lastTimestamp": rfc3339(created + (58 if cold else 25)),
                }
            )
        return created


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[IdleSim, StartApi]]:
    api = StartApi()
    simulated = IdleSim(render_stack("barcelona", no_dev_servers), count=2, node=Node(), api=api, token=TOKEN)
    try:
        yield simulated, api
    finally:
        simulated.stop()
        api.httpd.server_close()


def one_start(sim: IdleSim, api: StartApi, cold: bool, generation: int) -> tuple[dict[str, Any], list[str], float, float, float]:
    """Start the containers (the first start, or a restart of both: fresh /tmp, the workspace kept), script the API's
    side, run the in-pod phases for real, then `ml-dev status --start` on pod 0: (the kept start, its printed lines,
    created, when `ml-dev run` was called, when it returned)."""
    started = time.time()
    if generation == 0:
        sim.start()
    else:
        for i in range(sim.count):
            sim.restart(i)
    created = api.script(sim, started, cold, generation)
    marks = [sim.pods[i].path(f"{contract.STATE_DIR}/{contract.START_MARKS_DIR}/{contract.START_SSHD}") for i in range(2)]
    wait_for("sshd's mark on both pods", lambda: all(m.exists() for m in marks), 60, sim.agent_log)
    gate = sim.exec(0, "cd /workspace && python3 /opt/ml-dev-env/fabric_check.py gate", timeout=240)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    sim.write(0, f"{PROJECT}/job.py", "print('rank up', flush=True)\n")
    launched = time.time()
    run = sim.exec(0, f"{ML_DEV} run -- python3 job.py", cwd=PROJECT, timeout=180)
    ranked = time.time()
    assert run.returncode == 0, run.stdout + run.stderr
    shown = sim.exec(0, f"{ML_DEV} status --start", timeout=180)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    print(shown.stdout)  # docs/use/suspend-and-idle.md shows this output
    records = sim.records(0, contract.START_LEDGER_DIR, "/workspace")
    kept = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    assert len(kept) == generation + 1, [k["id"] for k in kept]
    return kept[-1], shown.stdout.strip().splitlines(), created, launched, ranked


def check_start(sim: IdleSim, start: dict[str, Any], lines: list[str], created: float, launched: float, ranked: float, cold: bool) -> None:
    assert [p["pod"] for p in start["pods"]] == [p.name for p in sim.pods]
    for i, pod in enumerate(start["pods"]):
        phases = {p["phase"]: p for p in pod["phases"]}
        assert [p["phase"] for p in pod["phases"]] == list(contract.START_PHASES)
        assert phases["admitted"]["seconds"] == 20 and phases["admitted"]["detail"] == f"queue {QUEUE}"
        assert phases["scheduled"]["detail"] == f"gpu-node-{i}"
        assert phases["image"]["detail"] == ("pulled 21.5 GB in 34 s" if cold else "image present")
        assert phases["image"]["seconds"] == (34 if cold else 1)
        # the in-pod phases: read from each pod's own marks (pod 1's over SSH)
        assert phases[contract.START_SSHD]["at"] is not None and phases[contract.START_RANK]["at"] is not None, pod
        assert (phases[contract.START_FABRIC]["at"] is not None) == (i == 0), "the gate ran on pod 0"
        assert pod["done"], pod
        # the phases add up to the pod's wall time, and that is its measured creation-to-first-rank time (± 2 s)
        assert sum(p["seconds"] for p in pod["phases"]) == pytest.approx(pod["wall"], abs=1e-6)
        assert launched - created - 2 <= pod["wall"] <= ranked - created + 2, (pod["wall"], launched - created, ranked - created)
    rows = [line for line in lines if line.split()[:1] in ([p.name] for p in sim.pods)]
    assert len(rows) == 2 and lines[-1 if cold else -2].startswith("start "), lines
    assert f"slowest {start['slowest']['pod']}" in "\n".join(lines)


def test_a_first_start_and_a_resume_on_pinned_nodes_each_add_up_to_their_measured_wall(sim: tuple[IdleSim, StartApi]) -> None:
    simulated, api = sim
    first = one_start(simulated, api, cold=True, generation=0)
    check_start(simulated, *first[:5], cold=True)
    assert "mostly image (34 s: pulled 21.5 GB in 34 s)" in first[1][-1]
    assert any(p.startswith(f"/api/v1/namespaces/{simulated.namespace}/pods?labelSelector=") for p in api.seen)
    resume = one_start(simulated, api, cold=False, generation=1)
    check_start(simulated, *resume[:5], cold=False)
    start = resume[0]
    # the goal for a real resume (docs/use/suspend-and-idle.md): every rank reachable within 60 s on nodes holding the
    # pinned image, the image phase at most 5 % of the wall
    assert start["wall"] <= 60 and all(
        next(p["seconds"] for p in pod["phases"] if p["phase"] == "image") <= 0.05 * pod["wall"] for pod in start["pods"]
    )
    # the previous start named beside it, by `ml-dev status --start` and on the home page
    compared = f"against the previous start {first[0]['id']} ({first[0]['wall']:.0f} s): {start['wall']:.0f} s, "
    assert resume[1][-1].startswith(compared) and "s faster (image -33 s" in resume[1][-1], resume[1]
    page = simulated.exec(0, ["python3", "-c", HOME_CARD], timeout=60)
    assert page.returncode == 0, page.stderr
    assert compared in page.stdout and start["slowest"]["pod"] in page.stdout, page.stdout


HOME_CARD = """
import sys, time
sys.path.insert(0, "/opt/ml-dev-env")
from inpod.home import page
body, _ = page.start_html(page.View(None, {}, time.time(), None))
print(body)
"""
