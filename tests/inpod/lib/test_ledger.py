"""The start ledger (inpod/lib/ledger.py): the kubelet's real event texts, Kueue's admission, the records, and the
phases of 10 simulated starts adding up to their measured wall time.

The simulated starts: a local API server (127.0.0.1, port chosen by the kernel) serves the pods, events and Kueue
Workloads that the test scripts in real time — as the API server and the kubelet would write them, timestamps in
whole seconds (RFC 3339, metav1.Time) — while the in-pod marks are written by the function the programs call
(`ledger.mark`). The ledger is read back through the programs' own API client (inpod/lib/kube.py).
"""

from __future__ import annotations

import http.server
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest

from inpod import contract
from inpod.lib import kube, ledger

DATA = Path(__file__).parent / "data" / "kubelet_events.json"
NS, APP = "team-a", "ml-dev-env"


def rfc3339(ts: float) -> str:
    """metav1.Time as the API server writes it: whole seconds (the fraction is dropped)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(ts)))


def test_the_kubelets_pulled_texts() -> None:
    fixtures = json.loads(DATA.read_text())
    for case in fixtures["pulled"]:
        event = {"reason": "Pulled", "message": case["message"], "involvedObject": {"uid": "u"}, "lastTimestamp": rfc3339(1e9)}
        at, detail = ledger.image_boundary([event], "u")
        assert at == 1e9
        took = ledger.go_duration(ledger.PULLED.match(case["message"]).group("took"))  # type: ignore[union-attr]
        assert took == pytest.approx(case["seconds"])
        assert detail.startswith(f"pulled {ledger.size_text(case['size'])} in {case['seconds']:.0f} s")
        assert ("with waiting" in detail) == (case["waiting"] - case["seconds"] >= 1)
    for message in fixtures["present"]:
        event = {"reason": "Pulled", "message": message, "involvedObject": {"uid": "u"}, "lastTimestamp": rfc3339(1e9)}
        assert ledger.image_boundary([event], "u") == (1e9, "image present")
    pulling = {"reason": "Pulling", "message": fixtures["pulling"], "involvedObject": {"uid": "u"}, "lastTimestamp": rfc3339(1e9)}
    assert ledger.image_boundary([pulling], "u") == (None, "")
    other_pod = {"reason": "Pulled", "message": fixtures["present"][0], "involvedObject": {"uid": "v"}, "lastTimestamp": rfc3339(1e9)}
    assert ledger.image_boundary([other_pod], "u") == (None, "")


def test_image_volumes_pulled_before_the_container_are_in_the_image_phase() -> None:
    """models[].mountInEnv: the kubelet pulls a pod's image volumes after the sandbox and before its containers
    (kuberuntime_manager.go SyncPod: getImageVolumes, then startContainer), each Pulled event on the pod itself (no
    fieldPath); the image phase ends at the last pull and names them. The texts are the kubelet's (the fixtures')."""
    fixtures = json.loads(DATA.read_text())
    model = "image-registry.openshift-image-registry.svc:5000/team-a/mistral@sha256:" + "cd" * 32
    # image_manager.go's format, filled in as the fixtures' real texts are: a 4.1 GB model image in 80.5 s
    volume_text = fixtures["pulled"][0]["message"].replace("nginx:1.27", model).replace("7.264s (7.264s", "1m20.5s (1m21.5s")
    volume_text = volume_text.replace("68857691", "4100000000")
    volume = {"reason": "Pulled", "message": volume_text, "involvedObject": {"uid": "u", "kind": "Pod"}, "lastTimestamp": rfc3339(1e9 + 90)}
    main = {
        "reason": "Pulled",
        "message": fixtures["present"][1],
        "involvedObject": {"uid": "u", "fieldPath": "spec.containers{ml-dev}"},
        "lastTimestamp": rfc3339(1e9 + 91),
    }
    sidecar = {**main, "involvedObject": {"uid": "u", "fieldPath": "spec.containers{oauth-proxy}"}, "lastTimestamp": rfc3339(1e9 + 99)}
    at, detail = ledger.image_boundary([volume, main, sidecar], "u")
    assert at == 1e9 + 91
    assert detail == f"image present; image volumes: mistral@sha256:{'cd' * 12}c pulled 4.1 GB in 80 s (82 s with waiting)"
    # a model pulled after the container's image was found (a second start): the phase ends at the model's pull
    late = {**volume, "lastTimestamp": rfc3339(1e9 + 95)}
    assert ledger.image_boundary([late, main], "u")[0] == 1e9 + 95


@pytest.mark.parametrize(
    ("text", "seconds"), [("313ms", 0.313), ("7.264s", 7.264), ("1m2.5s", 62.5), ("2h0m3s", 7203), ("850µs", 0.00085), ("7 s", None)]
)
def test_go_durations(text: str, seconds: float | None) -> None:
    got = ledger.go_duration(text)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


def test_a_pod_waiting_for_kueue_says_what_blocks_it_and_where_to_read_its_position() -> None:
    pod = {"metadata": {"name": f"{APP}-0", "namespace": NS, "uid": "p0", "creationTimestamp": rfc3339(1e9)}, "status": {}}
    workload = {
        "metadata": {"ownerReferences": [{"kind": "Pod", "uid": "p0"}]},
        "spec": {"queueName": "team-gpu"},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "message": "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor default",
                }
            ]
        },
    }
    row = ledger.pod_ledger(pod, [], {}, ledger.workload_of(pod, [workload]))
    [admitted] = [p for p in row["phases"] if p["phase"] == "admitted"]
    assert admitted["at"] is None and "queue team-gpu: couldn't assign flavors" in admitted["detail"]
    assert f"/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{NS}/localqueues/team-gpu/pendingworkloads" in admitted["detail"]
    assert not row["done"] and row["wall"] == 0
    no_queue = ledger.pod_ledger(pod, [], {}, None)
    assert no_queue["phases"][0] == {"phase": "admitted", "at": 1e9, "seconds": 0.0, "detail": "no queue"}


STS_WORKLOAD = "statefulset-ml-dev-env-6c2f3"  # jobframework GetWorkloadNameForOwnerWithGVK: statefulset-<name>-<hash>


def admitted_workload(name: str, owner: dict[str, Any], at: float) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": {"queueName": "team-gpu"},
        "status": {"conditions": [{"type": "Admitted", "status": "True", "lastTransitionTime": rfc3339(at)}]},
    }


@pytest.mark.parametrize("where", ["labels", "annotations"])
def test_a_statefulset_pod_is_admitted_by_the_workload_kueue_names_on_it(where: str) -> None:
    """Kueue's StatefulSet integration: one Workload owned by the StatefulSet, named on each pod (pod-group-name and
    prebuilt-workload-name, labels or under WorkloadIdentifierAnnotations annotations), never owned by the pods."""
    t0 = 1e9
    names = {ledger.KUEUE_GROUP_NAME: STS_WORKLOAD, ledger.KUEUE_PREBUILT_WORKLOAD: STS_WORKLOAD}
    sts_ref = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": APP, "uid": "sts-1", "controller": True}
    pod = {
        "metadata": {"name": f"{APP}-0", "namespace": NS, "uid": "p0", "creationTimestamp": rfc3339(t0), where: names},
        "status": {},
    }
    other = admitted_workload("statefulset-other-1a2b3", {"kind": "StatefulSet", "uid": "sts-2", "controller": True}, t0 + 1)
    mine = admitted_workload(STS_WORKLOAD, {**sts_ref, "blockOwnerDeletion": True}, t0 + 40)
    assert ledger.workload_of(pod, [other, mine]) is mine
    [admitted] = [p for p in ledger.pod_ledger(pod, [], {}, ledger.workload_of(pod, [other, mine]))["phases"] if p["phase"] == "admitted"]
    assert admitted["at"] == t0 + 40 and admitted["seconds"] == 40 and admitted["detail"] == "queue team-gpu"
    # a pod without Kueue's names (Kueue not yet at it): its controller's Workload
    bare = {"metadata": {"name": f"{APP}-1", "uid": "p1", "ownerReferences": [sts_ref]}}
    assert ledger.workload_of(bare, [other, mine]) is mine


def test_marks_are_written_once_per_container(tmp_path: Path) -> None:
    assert ledger.mark(contract.START_SSHD, tmp_path, now=100.0) and not ledger.mark(contract.START_SSHD, tmp_path, now=200.0)
    assert ledger.read_marks(tmp_path) == {contract.START_SSHD: 100.0}
    (tmp_path / contract.START_MARKS_DIR / contract.START_RANK).write_text("garbage\n")
    assert ledger.read_marks(tmp_path) == {contract.START_SSHD: 100.0}


def test_the_records_keep_the_last_starts(tmp_path: Path) -> None:
    for i in range(5):
        start = {"id": f"2026120{i}T000000Z", "wall": float(i), "pods": []}
        ledger.keep_start(tmp_path, start, last=3)
    assert [s["id"] for s in ledger.kept(tmp_path)] == ["20261202T000000Z", "20261203T000000Z", "20261204T000000Z"]
    assert not list((tmp_path / contract.START_LEDGER_DIR).glob(".*.tmp"))


# ----------------------------------------------------------------------------------- 10 simulated starts


class Api(http.server.BaseHTTPRequestHandler):
    objects: ClassVar[dict[str, Any]] = {}
    lock = threading.Lock()

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Bearer sa-token":
            self.send_response(401)
            self.end_headers()
            return
        with Api.lock:
            body = json.dumps(Api.objects.get(self.path, {"kind": "Status", "code": 404})).encode()
            code = 200 if self.path in Api.objects else 404
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[kube.Client]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "namespace").write_text(NS)
    yield kube.Client("ml-dev-env-status", base=f"http://127.0.0.1:{server.server_address[1]}", sa_dir=sa)
    server.shutdown()
    server.server_close()


SELECTOR = f"app.kubernetes.io/name%3Dml-dev-env%2Capp.kubernetes.io/instance%3D{APP}"
PODS = f"/api/v1/namespaces/{NS}/pods?labelSelector={SELECTOR}"
EVENTS = f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.kind%3DPod"
WORKLOADS = ledger.KUEUE_WORKLOADS.format(ns=NS)


class Start:
    """One start of one pod, scripted as the API server, Kueue, the scheduler and the kubelet write it."""

    def __init__(self, n: int, state: Path, queued: bool) -> None:
        self.uid, self.name, self.state, self.queued = f"uid-{n}", f"{APP}-0", state, queued
        self.pod: dict[str, Any] = {
            "metadata": {"name": self.name, "namespace": NS, "uid": self.uid, "creationTimestamp": rfc3339(time.time())},
            "spec": {},
            "status": {"conditions": [], "containerStatuses": []},
        }
        self.events: list[dict[str, Any]] = []
        self.workloads: list[dict[str, Any]] = []
        if queued:
            self.workloads = [
                {
                    "metadata": {"ownerReferences": [{"kind": "Pod", "uid": self.uid}]},
                    "spec": {"queueName": "team-gpu"},
                    "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "message": "insufficient quota"}]},
                }
            ]
        self.publish()

    def publish(self) -> None:
        with Api.lock:
            Api.objects = {PODS: {"items": [self.pod]}, EVENTS: {"items": self.events}, WORKLOADS: {"items": self.workloads}}

    def condition(self, kind: str) -> None:
        self.pod["status"]["conditions"].append({"type": kind, "status": "True", "lastTransitionTime": rfc3339(time.time())})
        self.publish()

    def admitted(self) -> None:
        if self.queued:
            self.workloads[0]["status"]["conditions"] = [{"type": "Admitted", "status": "True", "lastTransitionTime": rfc3339(time.time())}]
            self.publish()

    def pulled(self, message: str) -> None:
        self.events.append(
            {
                "reason": "Pulled",
                "message": message,
                "involvedObject": {"kind": "Pod", "uid": self.uid, "fieldPath": "spec.containers{ml-dev}"},
                "lastTimestamp": rfc3339(time.time()),
            }
        )
        self.publish()

    def started(self) -> None:
        running = {"startedAt": rfc3339(time.time())}
        self.pod["status"]["containerStatuses"] = [{"name": "ml-dev", "state": {"running": running}}]
        self.publish()


def test_the_phases_of_ten_starts_add_up_to_their_measured_wall_time(api: kube.Client, tmp_path: Path) -> None:
    fixtures = json.loads(DATA.read_text())
    rng = random.Random(49)
    sums = []
    for n in range(10):
        state = tmp_path / f"state-{n}"
        begun = time.time()  # before the API server stamps the pod's creation
        start = Start(n, state, queued=n % 2 == 0)
        pulled = rng.choice([fixtures["pulled"][0]["message"], *fixtures["present"]])
        steps: list[Callable[[], Any]] = [
            start.admitted,
            partial(start.condition, "PodScheduled"),
            partial(start.condition, "PodReadyToStartContainers"),
            partial(start.pulled, pulled),
            start.started,
            *(partial(ledger.mark, phase, state) for phase in contract.START_IN_POD),
        ]
        for step in steps:
            time.sleep(rng.uniform(0.0, 0.35))
            step()
        measured = time.time() - begun
        pods, events, workloads = ledger.read_api(lambda path: api.call("GET", path), NS, APP)
        built = ledger.build(pods, events, workloads, {start.name: ledger.read_marks(state)})
        [pod] = built["pods"]
        total = sum(p["seconds"] for p in pod["phases"])
        assert [p["phase"] for p in pod["phases"]] == list(contract.START_PHASES)
        assert all(p["at"] is not None for p in pod["phases"]) and pod["done"]
        assert total == pytest.approx(pod["wall"]) == pytest.approx(built["wall"])
        assert abs(total - measured) <= 2.0, (n, total, measured, pod["phases"])
        assert (pod["phases"][0]["detail"] == "queue team-gpu") == (n % 2 == 0)
        sums.append((round(total, 2), round(measured, 2)))
    print("phases sum vs measured wall (s):", sums)


def test_the_table_names_the_slowest_pod_and_its_dominant_phase() -> None:
    def pod(name: str, pull_seconds: int) -> dict[str, Any]:
        t0 = 1_000_000.0
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": rfc3339(t0 + dt)}
            for kind, dt in (("PodScheduled", 2), ("PodReadyToStartContainers", 5))
        ]
        running = {"startedAt": rfc3339(t0 + 6 + pull_seconds)}
        return {
            "metadata": {"name": name, "namespace": NS, "uid": name, "creationTimestamp": rfc3339(t0)},
            "spec": {"nodeName": f"node-{name[-1]}"},
            "status": {"conditions": conditions, "containerStatuses": [{"name": "ml-dev", "state": {"running": running}}]},
        }

    fixtures = json.loads(DATA.read_text())
    pods = [pod(f"{APP}-0", 1), pod(f"{APP}-1", 120)]
    events = [
        {"reason": "Pulled", "message": fixtures["present"][1], "involvedObject": {"uid": f"{APP}-0"}, "lastTimestamp": rfc3339(1_000_006)},
        {
            "reason": "Pulled",
            "message": fixtures["pulled"][0]["message"],
            "involvedObject": {"uid": f"{APP}-1"},
            "lastTimestamp": rfc3339(1_000_125),
        },
    ]
    sshd, rank = contract.START_SSHD, contract.START_RANK
    marks = {f"{APP}-0": {sshd: 1_000_010.0, rank: 1_000_020.0}, f"{APP}-1": {sshd: 1_000_130.0, rank: 1_000_140.0}}
    start = ledger.build(pods, events, [], marks)
    rows = ledger.start_table(start)
    assert len(rows) == 4 and rows[1].split()[:2] == [f"{APP}-0", "node-0"]
    assert rows[-1].endswith(f"slowest {APP}-1 (140 s), mostly image (120 s: pulled 68.9 MB in 7 s)")
    assert contract.START_FABRIC in rows[0] and rows[2].split()[-3] == "-"  # no fabric gate recorded: shown as such, 0 s


def test_the_home_page_shows_the_last_start_one_row_per_pod_and_the_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inpod.home import page

    monkeypatch.setenv(contract.WORKSPACE_ENV, str(tmp_path))
    monkeypatch.setenv("APP_NAME", APP)
    view = page.View(None, {}, time.time(), None)  # type: ignore[arg-type]  # the card reads the records only
    assert "no start recorded yet" in page.start_html(view)[0]
    records = Path(contract.records_dir(str(tmp_path), APP))
    fixtures = json.loads(DATA.read_text())
    t0 = 1_000_000.0

    def start(pull: int) -> dict[str, Any]:
        pods = [
            {
                "metadata": {"name": f"{APP}-{i}", "namespace": NS, "uid": f"u{i}", "creationTimestamp": rfc3339(t0 + pull)},
                "spec": {"nodeName": f"gpu-{i}"},
                "status": {
                    "containerStatuses": [{"name": "ml-dev", "state": {"running": {"startedAt": rfc3339(t0 + pull + 5 + i * pull)}}}]
                },
            }
            for i in range(2)
        ]
        event = {
            "reason": "Pulled",
            "message": fixtures["pulled"][0]["message"],
            "involvedObject": {"uid": "u1"},
            "lastTimestamp": rfc3339(t0 + 2 * pull + 5),
        }
        return ledger.build(pods, [event], [], {})

    ledger.keep_start(records, start(100))
    ledger.keep_start(records, start(300))
    body, _ = page.start_html(view)
    assert body.count("<tr>") == 3  # the header and one row per pod
    assert f"slowest {APP}-1 (305 s), mostly image (305 s: pulled 68.9 MB in 7 s)" in body
    assert "against the previous start 19700112T134820Z (105 s): 305 s, 200 s slower (image +" in body, body


def test_each_start_is_compared_with_the_one_before() -> None:
    """Wall times, the difference, and the slowest pods' phases that changed, largest first (a resume against a cold
    start: the image phase is what went)."""

    def start(ident: str, seconds: dict[str, float]) -> dict[str, Any]:
        phases: list[dict[str, Any]] = [
            {"phase": p, "at": 1.0, "seconds": seconds.get(p, 1.0), "detail": ""} for p in contract.START_PHASES
        ]
        wall = sum(seconds.get(p, 1.0) for p in contract.START_PHASES)
        pod = {"pod": f"{APP}-1", "phases": phases, "wall": wall}
        return {"id": ident, "wall": wall, "slowest": {"pod": f"{APP}-1"}, "pods": [pod]}

    cold = start("20261206T081502Z", {"admitted": 20, "image": 1800, contract.START_SSHD: 3})
    warm = start("20261207T090000Z", {"admitted": 45, "image": 1, contract.START_SSHD: 3.4})
    assert ledger.compare(warm, cold) == (
        "against the previous start 20261206T081502Z (1828 s): 54 s, 1774 s faster (image -1799 s, admitted +25 s)"
    )
    assert ledger.compare(cold, cold) == "against the previous start 20261206T081502Z (1828 s): 1828 s, same time"


def test_make_status_start_reads_the_ledger_with_oc_from_a_laptop(capsys: pytest.CaptureFixture[str]) -> None:
    """`make status START=<app>`: `oc get` the pods, events and Workloads, `oc exec` each pod's marks; no Kueue is fine."""
    import subprocess

    from tools import status

    fixtures = json.loads(DATA.read_text())
    t0 = 1_000_000.0
    pod = {
        "metadata": {"name": f"{APP}-0", "namespace": NS, "uid": "u0", "creationTimestamp": rfc3339(t0)},
        "spec": {"nodeName": "gpu-a"},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(t0 + 2)}],
            "containerStatuses": [{"name": "ml-dev", "state": {"running": {"startedAt": rfc3339(t0 + 9)}}}],
        },
    }
    event = {"reason": "Pulled", "message": fixtures["present"][1], "involvedObject": {"uid": "u0"}, "lastTimestamp": rfc3339(t0 + 8)}
    calls: list[list[str]] = []

    def oc(args: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        if args[:2] == ["get", "pods"]:
            return subprocess.CompletedProcess(args, 0, json.dumps({"items": [pod]}), "")
        if args[:2] == ["get", "events"]:
            return subprocess.CompletedProcess(args, 0, json.dumps({"items": [event]}), "")
        if args[0] == "exec":
            assert args[1:5] == ["-n", NS, f"{APP}-0", "-c"] and args[-1] == ledger.MARKS_SCRIPT
            return subprocess.CompletedProcess(args, 0, f"{contract.START_SSHD} {t0 + 10}\n{contract.START_RANK} {t0 + 30}\n", "")
        return subprocess.CompletedProcess(args, 1, "", 'error: the server doesn\'t have a resource type "workloads"')

    assert status.main(["barcelona", "--namespace", NS, "--start", APP], oc=oc) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:2] == [f"{APP}-0", "gpu-a"] and out[1].split()[-1] == "30s"
    assert out[-1].endswith(f"slowest {APP}-0 (30 s), mostly first-rank (20 s)")
    assert [c[:2] for c in calls] == [["get", "pods"], ["get", "events"], ["get", "workloads.kueue.x-k8s.io"], ["exec", "-n"]]
