"""The idle agent against real signal sources: a real JupyterLab server, stub nvidia-smi printing the real
CSV format, code-server heartbeat files, real processes behind SSH/launcher activity records, real ptys,
and simulated pods (one agent process per pod) talking to a validating API stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inpod.lib import http
from tests.conftest import VALIDATOR
from tests.inpod.idle.conftest import APP, NS, FakeApiServer, Jupyter, SimPod, load_agent, write_settings

agent = load_agent()

# What `nvidia-smi --query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used --format=csv` prints on an
# H100 node (values chosen; the layout with header and units as the driver prints it; real outputs of other
# GPUs are in tests/data/tool_output and test_real_output.py).
WITH_UNITS = (
    "index, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB]\n"
    "0, GPU-8f6c2d4e-3a1b-4c5d-9e7f-0a1b2c3d4e50, 97 %, 41 %, 61234 MiB\n1, GPU-8f6c2d4e-3a1b-4c5d-9e7f-0a1b2c3d4e51, 0 %, 0 %, 4 MiB\n"
)
MIG = (
    "index, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB]\n"
    "0, GPU-8f6c2d4e-3a1b-4c5d-9e7f-0a1b2c3d4e50, [N/A], [N/A], 61234 MiB\n"
)


def test_gpu_rows_in_the_real_csv_format() -> None:
    gpus = agent.parse_gpu_csv(WITH_UNITS)
    assert [(g["index"], g["util"], g["memUtil"], g["memUsedMiB"]) for g in gpus] == [(0, 97, 41, 61234), (1, 0, 0, 4)]
    # a value the GPU does not report is no evidence, not a failure
    assert [(g["util"], g["memUtil"], g["memUsedMiB"]) for g in agent.parse_gpu_csv(MIG)] == [(None, None, 61234)]
    with pytest.raises(ValueError):
        agent.parse_gpu_csv("")
    with pytest.raises(ValueError):
        agent.parse_gpu_csv("index, uuid\n0, GPU-x, 3\n")  # a row that does not fit its header


# ------------------------------------------------------------------------- one decision, in process


@pytest.fixture
def pods(tmp_path: Path) -> list[SimPod]:
    names = [f"{APP}-0", f"{APP}-1"]
    return [SimPod(tmp_path, i, names) for i in range(2)]


class Answer:
    """A tiny HTTP server answering every GET with a fixed status/body (a broken Jupyter, an unhealthy peer)."""

    def __init__(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's method name
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = f"127.0.0.1:{self.httpd.server_address[1]}"
        import threading

        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def decide(
    pod: SimPod,
    settings: Path,
    api: FakeApiServer,
    monkeypatch: pytest.MonkeyPatch,
    idle_for: float = 3600,
    env: Mapping[str, str] | None = None,
    **extra: str,
) -> tuple[str, Any]:
    """One round of pod 0's decision when nothing was seen for `idle_for` seconds; `env` and `extra`: the agent's
    environment variables (a mapping in `env`, so that it cannot be mistaken for `idle_for`)."""
    extra = {**(env or {}), **extra}
    for key, value in pod.env(settings, api, **extra).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False) if "JUPYTER_TOKEN" not in extra else None
    decider = agent.Decider(now=time.time() - idle_for)
    return agent.tick(agent.load_settings(), decider), decider


@pytest.fixture
def peer(pods: list[SimPod], tmp_path: Path) -> Any:
    """The worker pod's agent, serving its real /activity."""
    worker = pods[1]
    worker.start(worker.env(write_settings(tmp_path / "worker.json"), None))
    yield worker
    worker.stop()


def test_untouched_environment_is_stopped_and_the_reason_recorded(
    pods: list[SimPod], peer: SimPod, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = write_settings(tmp_path / "idle.json", servers=[])
    outcome, decider = decide(pods[0], settings, api, monkeypatch, ML_DEV_ACTIVITY_PEERS=f"{APP}-1={peer.address()}")
    assert outcome == "stop", decider.reason
    assert api.replicas == 0 and [s["spec"]["replicas"] for s in api.scales] == [0]
    assert api.denied == []
    # the record: on the ConfigMap ...
    data = api.configmap["data"]
    assert data["replicasBefore"] == "2" and int(data["idleSeconds"]) >= 3600
    signals = json.loads(data["signals.json"])
    assert signals[f"{APP}-0/gpu"]["util"] == [0, 0, 0, 0] and signals[f"{APP}-1/gpu"]["util"] == [0, 0, 0, 0]
    assert signals[f"{APP}-1/ssh"] == {"ok": True, "active": False, "age": None, "records": []}
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


# core/v1 Event fields (k8s.io/api/core/v1 types.go `Event`); ../shared/schemas has no Event schema.
EVENT_FIELDS = {
    "apiVersion",
    "kind",
    "metadata",
    "involvedObject",
    "reason",
    "message",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "count",
    "type",
    "eventTime",
    "series",
    "action",
    "related",
    "reportingComponent",
    "reportingInstance",
}
OBJECT_REFERENCE_FIELDS = {"kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"}


def assert_event_shape(event: dict[str, Any]) -> None:
    assert set(event) <= EVENT_FIELDS, set(event) - EVENT_FIELDS
    assert set(event["involvedObject"]) <= OBJECT_REFERENCE_FIELDS
    assert set(event["source"]) <= {"component", "host"}
    assert event["apiVersion"] == "v1" and event["kind"] == "Event" and event["type"] in ("Normal", "Warning")
    assert event["metadata"]["namespace"] == NS and len(event["metadata"]["name"]) <= 253
    assert isinstance(event["count"], int) and len(event["message"]) <= 1024
    for key in ("firstTimestamp", "lastTimestamp"):
        time.strptime(event[key], "%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.skipif(not VALIDATOR.exists(), reason="../shared/tools/validate_manifests.py is not beside the repository")
def test_scale_request_and_record_pass_the_official_schemas(
    pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = write_settings(tmp_path / "idle.json", servers=[])
    outcome, _ = decide(pods[0], settings, api, monkeypatch, ML_DEV_ACTIVITY_PEERS="")
    pods[0].state.joinpath("rank.env").write_text(f"export NODE_RANK=0 ML_DEV_PODS='{APP}-0' ML_DEV_HOSTS='{APP}-0.x'\n")
    outcome, decider = decide(pods[0], settings, api, monkeypatch)
    assert outcome == "stop", decider.reason
    count = api.write_bodies(tmp_path / "bodies")
    proc = subprocess.run([sys.executable, str(VALIDATOR), str(tmp_path / "bodies")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "autoscaling/v1 Scale" in proc.stdout and f"summary: {count} ok, 0 invalid" in proc.stdout
    # PUT on the scale subresource with the agent's field manager; never a PATCH of the StatefulSet itself
    writes = [(m, p) for m, p in api.requests if m != "GET"]
    assert ("PUT", f"/apis/apps/v1/namespaces/{NS}/statefulsets/{APP}/scale?fieldManager=ml-dev-env-idle-agent") in writes
    assert not any(
        p.startswith(f"/apis/apps/v1/namespaces/{NS}/statefulsets/{APP}?") or p.endswith(f"statefulsets/{APP}") for _, p in api.requests
    )


def test_already_scaled_to_zero_is_left_alone(
    pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    api.replicas = 0
    pods[0].state.joinpath("rank.env").write_text(f"export NODE_RANK=0 ML_DEV_PODS='{APP}-0' ML_DEV_HOSTS='{APP}-0.x'\n")
    outcome, _ = decide(pods[0], write_settings(tmp_path / "idle.json", servers=[]), api, monkeypatch)
    assert outcome == "stop" and api.scales == [] and api.events == []


FAILURES = [
    "nvidia-smi fails",
    "worker unreachable",
    "worker probe fails",
    "rank.env unreadable",
    "jupyter answers 500",
]


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_probe_counts_as_active(
    failure: str, pods: list[SimPod], peer: SimPod, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = write_settings(tmp_path / "idle.json", servers=["jupyter"] if "jupyter" in failure else [])
    extra = {"ML_DEV_ACTIVITY_PEERS": f"{APP}-1={peer.address()}"}
    broken: Answer | None = None
    if failure == "nvidia-smi fails":
        pods[0].gpu(0, fail=True)
    elif failure == "worker unreachable":
        broken = Answer(503, {"error": "no endpoints"})
        extra["ML_DEV_ACTIVITY_PEERS"] = f"{APP}-1={broken.addr}"
    elif failure == "worker probe fails":
        peer.gpu(0, fail=True)
    elif failure == "rank.env unreadable":
        extra["ML_DEV_ACTIVITY_PEERS"] = ""
        pods[0].state.joinpath("rank.env").unlink()
        extra["NODE_RANK"] = "0"
    elif failure == "jupyter answers 500":
        broken = Answer(500, {"message": "Internal Server Error"})
        extra["ML_DEV_JUPYTER_URL"] = f"http://{broken.addr}"
    try:
        outcome, decider = decide(pods[0], settings, api, monkeypatch, env=extra)
    finally:
        if broken:
            broken.close()
    assert outcome == "active", decider.reason
    assert "probe failed" in decider.reason
    assert api.scales == [] and api.requests == []
    assert not pods[0].state.joinpath("idle-warning").exists()


def test_a_worker_unreachable_past_the_bound_is_reported_and_no_longer_holds_the_stop(
    pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Within unreachableSeconds the worker holds the stop; past it: an Event, the stop, the record names it."""
    settings = write_settings(tmp_path / "idle.json", servers=[], unreachableSeconds=5)
    broken = Answer(503, {"error": "no endpoints"})
    try:
        for key, value in pods[0].env(settings, api, ML_DEV_ACTIVITY_PEERS=f"{APP}-1={broken.addr}").items():
            monkeypatch.setenv(key, value)
        t0 = time.time()
        decider = agent.Decider(now=t0 - 3600, unreachable_seconds=5)
        assert agent.tick(agent.load_settings(), decider, now=t0) == "active"
        assert f"{APP}-1/reachable: probe failed" in decider.reason and api.events == []
        assert agent.tick(agent.load_settings(), decider, now=t0 + 10) == "stop"
    finally:
        broken.close()
    unreachable, stop = api.events
    assert unreachable["reason"] == "IdleAgentPodUnreachable" and unreachable["type"] == "Warning"
    assert unreachable["message"].startswith(f"Pod {APP}-1 unreachable for 10s (bound 5s: HTTP Error 503")
    assert f"oc describe pod {APP}-1" in unreachable["message"]
    assert stop["reason"] == "IdleStop" and f"Unreachable pods not waited for: {APP}-1." in stop["message"]
    assert api.configmap["data"]["unreachablePods"] == f"{APP}-1" and api.replicas == 0
    assert_event_shape(unreachable)
    # what `ml-dev status` and `idle_agent.py status` read on pod 0
    view = json.loads(pods[0].state.joinpath("idle-status.json").read_text())
    assert view["unreachable"][f"{APP}-1"]["since"] == t0 and view["unreachable"][f"{APP}-1"]["writtenOff"]


def test_activity_records_real_processes_and_heartbeats(
    pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pod = pods[0]
    pod.state.joinpath("rank.env").write_text(f"export NODE_RANK=0 ML_DEV_PODS='{APP}-0' ML_DEV_HOSTS='{APP}-0.x'\n")
    settings = write_settings(tmp_path / "idle.json", servers=["vscode"])
    activity = pod.state / "activity"

    # an SSH session: a record named after a live process
    session = subprocess.Popen(["sleep", "60"])
    try:
        (activity / "ssh" / str(session.pid)).write_text("")
        outcome, decider = decide(pod, settings, api, monkeypatch)
        assert (outcome, decider.reason) == ("active", f"{APP}-0/ssh: active")
    finally:
        session.kill()
        session.wait()
    # a launcher run: a fresh heartbeat of a live process
    run = subprocess.Popen(["sleep", "60"])
    try:
        (activity / "launcher.heartbeat").write_text(json.dumps({"pid": run.pid, "command": "torchrun train.py", "started": 1}) + "\n")
        outcome, decider = decide(pod, settings, api, monkeypatch)
        assert (outcome, decider.reason) == ("active", f"{APP}-0/launcher: active")
    finally:
        run.kill()
        run.wait()
    # both processes are gone: stale records are ignored ... but the heartbeat is still recent activity
    outcome, decider = decide(pod, settings, api, monkeypatch)
    assert (outcome, decider.reason) == ("active", f"{APP}-0/launcher: last activity")
    old = time.time() - 7200
    os.utime(activity / "launcher.heartbeat", (old, old))
    # code-server writes its heartbeat file while the IDE is used (coder/code-server src/node/heart.ts)
    beat = Path(pod.env(settings, api)["ML_DEV_CODE_SERVER_HEARTBEAT"])
    beat.parent.mkdir(parents=True)
    beat.write_text("")
    outcome, decider = decide(pod, settings, api, monkeypatch)
    assert (outcome, decider.reason) == ("active", f"{APP}-0/vscode: last activity")
    os.utime(beat, (old, old))
    # a busy memory controller alone is GPU activity
    pod.gpu(0, mem=60)
    outcome, decider = decide(pod, settings, api, monkeypatch)
    assert (outcome, decider.reason) == ("active", f"{APP}-0/gpu: active")
    pod.gpu(4, mem=4)  # below both thresholds
    assert api.scales == []
    outcome, decider = decide(pod, settings, api, monkeypatch)
    assert outcome == "stop", decider.reason
    signals = json.loads(api.configmap["data"]["signals.json"])
    assert signals[f"{APP}-0/launcher"]["age"] >= 7000 and signals[f"{APP}-0/vscode"]["age"] >= 7000


def test_the_ssh_fabric_and_launcher_record_formats(
    pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ssh-sessions/<pid> (first line: the process start time) and heartbeat/{run,rank}-<pid>.json, as the
    SSH fabric's ForceCommand and the `ml-dev` launcher write them."""
    pod = pods[0]
    pod.state.joinpath("rank.env").write_text(f"export NODE_RANK=0 ML_DEV_PODS='{APP}-0' ML_DEV_HOSTS='{APP}-0.x'\n")
    settings = write_settings(tmp_path / "idle.json", servers=[])
    sessions, beats = pod.state / "ssh-sessions", pod.state / "heartbeat"
    sessions.mkdir()
    beats.mkdir()
    shell = subprocess.Popen(["sleep", "60"])
    try:
        start = Path(f"/proc/{shell.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        record = sessions / str(shell.pid)
        record.write_text(f"{start}\ndev\n10.128.2.7 51234 22\n")
        outcome, decider = decide(pod, settings, api, monkeypatch)
        assert (outcome, decider.reason) == ("active", f"{APP}-0/ssh: active")
        record.write_text(f"{int(start) + 1}\ndev\n10.128.2.7 51234 22\n")  # the PID was reused by another process
        assert agent.probe_ssh()["active"] is False
        record.unlink()
        rank = beats / f"rank-{shell.pid}.json"
        rank.write_text(json.dumps({"command": "python train.py", "cwd": "/workspace", "pid": shell.pid, "started": 1.0, "alive_at": 2.0}))
        outcome, decider = decide(pod, settings, api, monkeypatch)
        assert (outcome, decider.reason) == ("active", f"{APP}-0/launcher: active")
        assert agent.probe_launcher(time.time())["detail"]["runs"] == [rank.name]
    finally:
        shell.kill()
        shell.wait()
    old = time.time() - 7200
    os.utime(rank, (old, old))  # a record the launcher left behind (killed): stale, its process is gone
    outcome, decider = decide(pod, settings, api, monkeypatch)
    assert outcome == "stop", decider.reason


def test_sshd_session_processes_count_without_records(
    pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pod = pods[0]
    pod.state.joinpath("rank.env").write_text(f"export NODE_RANK=0 ML_DEV_PODS='{APP}-0' ML_DEV_HOSTS='{APP}-0.x'\n")
    session = subprocess.Popen(["bash", "-c", 'exec -a "sshd: dev@pts/7" sleep 60'])
    try:
        deadline = time.monotonic() + 10
        while b"sshd: dev@pts/7" not in Path(f"/proc/{session.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        outcome, decider = decide(pod, write_settings(tmp_path / "idle.json", servers=[]), api, monkeypatch, ML_DEV_SSH_PROCESS_SCAN="1")
        assert (outcome, decider.reason) == ("active", f"{APP}-0/ssh: active")
        assert session.pid in agent.probe_ssh()["detail"]["sessionProcesses"]
    finally:
        session.kill()
        session.wait()


def test_disabled_agent_decides_nothing(pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    outcome, _ = decide(pods[0], write_settings(tmp_path / "idle.json", enabled=False), api, monkeypatch)
    assert outcome == "off" and api.requests == []


# ------------------------------------------------------------------------------- real JupyterLab


def test_jupyter_idle_server_polled_by_the_agent_stays_idle(
    jupyter: Jupyter, pods: list[SimPod], api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pod = pods[0]
    pod.state.joinpath("rank.env").write_text(f"export NODE_RANK=0 ML_DEV_PODS='{APP}-0' ML_DEV_HOSTS='{APP}-0.x'\n")
    settings = write_settings(tmp_path / "idle.json", servers=["jupyter"], idleTimeoutSeconds=2, warningLeadSeconds=1)
    env = {"ML_DEV_JUPYTER_URL": jupyter.url, "JUPYTER_TOKEN": jupyter.token}
    before = jupyter.json("GET", "/api/status")["last_activity"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    probe = agent.probe_jupyter(time.time())
    assert probe["ok"] and not probe["active"]
    assert jupyter.json("GET", "/api/status")["last_activity"] == before  # the agent's polling is not activity
    # an open terminal in Jupyter is activity ...
    term = jupyter.json("POST", "/api/terminals")
    try:
        outcome, decider = decide(pod, settings, api, monkeypatch, env=env)
        assert (outcome, decider.reason) == ("active", f"{APP}-0/jupyter: last activity")
        assert decider.last_reports[0]["signals"][-1]["detail"]["terminals"] >= 1
    finally:
        jupyter.json("DELETE", f"/api/terminals/{term['name']}")
    # ... and once nothing happens for idleTimeout (2 s), the environment stops: Jupyter may count the terminal's
    # DELETE as its last activity a moment after it returns, so ask until then (a busy machine may need longer)
    time.sleep(2.5)
    deadline = time.monotonic() + 20
    while True:
        outcome, decider = decide(pod, settings, api, monkeypatch, env=env)
        if outcome == "stop" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert outcome == "stop", decider.reason


# --------------------------------------------------------------------- simulated pods, real time


def wait_for(predicate: Any, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def start_env(pods: list[SimPod], settings: Path, api: FakeApiServer, jupyter: Jupyter, tmp_path: Path) -> None:
    """Pod 0 (decides; IDE servers) and pod 1 (reports, mirrors pod 0's warning), each its own agent process."""
    worker, master = pods[1], pods[0]
    peers = tmp_path / "peers"  # pod 0 treats the worker as unreachable (= active) until this file exists
    master.start(master.env(settings, api, ML_DEV_ACTIVITY_PEERS=f"@{peers}", ML_DEV_JUPYTER_URL=jupyter.url, JUPYTER_TOKEN=jupyter.token))
    worker.start(worker.env(settings, None, ML_DEV_MASTER_ACTIVITY=master.address()))
    peers.write_text(f"{worker.name}={worker.address()}\n")


def test_busy_gpu_that_prints_nothing_is_never_stopped_then_idle_stops_in_time(
    jupyter: Jupyter, pods: list[SimPod], api: FakeApiServer, tmp_path: Path
) -> None:
    timeout, interval, lead = 6, 1, 3
    settings = write_settings(tmp_path / "idle.json", idleTimeoutSeconds=timeout, intervalSeconds=interval, warningLeadSeconds=lead)
    worker, master = pods[1], pods[0]
    worker.gpu(97, mem=40)  # a silent training job on the worker only: no output, no IDE, no shell
    # a real terminal on pod 0 (an IDE terminal): it must receive the banner
    master_fd, slave_fd = os.openpty()
    os.symlink(os.ttyname(slave_fd), master.pts / "3")
    os.set_blocking(master_fd, False)
    try:
        start_env(pods, settings, api, jupyter, tmp_path)
        time.sleep(timeout + 4 * interval)  # the whole window: more than idleTimeout + 2 x interval
        assert api.scales == [], master.stop()
        assert not master.state.joinpath("idle-warning").exists()
        # the job ends: from now on the environment is idle
        idle_since = time.time()
        worker.gpu(0)
        assert wait_for(lambda: master.state.joinpath("idle-warning").exists(), 60), master.stop()
        assert wait_for(lambda: worker.state.joinpath("idle-warning").exists(), 30), worker.stop()
        warned_at = time.time()
        assert wait_for(lambda: api.scales != [], 60), master.stop()
        stopped_at = time.time()
    finally:
        log = master.stop() + worker.stop()
    try:
        banner = os.read(master_fd, 65536)
    except BlockingIOError:
        banner = b""
    finally:
        os.close(master_fd)
        os.close(slave_fd)
    assert [s["spec"]["replicas"] for s in api.scales] == [0], log
    assert warned_at <= stopped_at
    # the agent's own account: stopped after idleTimeout, within idleTimeout + 2 x interval of the last activity
    record = api.configmap["data"]
    assert timeout <= int(record["idleSeconds"]) <= timeout + 2 * interval, record
    assert record["lastActivityReason"] == f"{APP}-1/gpu: active", record
    assert stopped_at - idle_since < 60  # generous wall-clock bound (shared, loaded test machines)
    assert b"will be SUSPENDED" in banner
    assert "will be SUSPENDED" in master.state.joinpath("idle-warning").read_text()
    signals = json.loads(record["signals.json"])
    assert signals[f"{APP}-1/gpu"]["util"] == [0, 0, 0, 0] and signals[f"{APP}-0/jupyter"]["ok"] is True


def test_untouched_environment_stops_within_idle_timeout_plus_two_intervals(
    jupyter: Jupyter, pods: list[SimPod], api: FakeApiServer, tmp_path: Path
) -> None:
    timeout, interval, lead = 6, 1, 3
    settings = write_settings(tmp_path / "idle.json", idleTimeoutSeconds=timeout, intervalSeconds=interval, warningLeadSeconds=lead)
    worker, master = pods[1], pods[0]
    started = time.time()
    try:
        start_env(pods, settings, api, jupyter, tmp_path)
        assert wait_for(lambda: api.scales != [], 60), master.stop()
        stopped_at = time.time()
        assert wait_for(lambda: worker.state.joinpath("idle-warning").exists(), 30), worker.stop()
    finally:
        log = master.stop() + worker.stop()
    record = api.configmap["data"]
    assert timeout <= int(record["idleSeconds"]) <= timeout + 2 * interval, (record, log)
    assert stopped_at - started < 60
    assert api.denied == [] and len(api.events) == 1


def test_the_warning_says_how_to_hook_in(
    pods: list[SimPod], peer: SimPod, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The idle warning names the pod's checkpoint signal and grace (its container env) and the docs section."""
    settings = write_settings(tmp_path / "idle.json", servers=[])
    extra = {
        "ML_DEV_ACTIVITY_PEERS": f"{APP}-1={peer.address()}",
        "ML_DEV_CHECKPOINT_SIGNAL": "SIGUSR1",
        "ML_DEV_CHECKPOINT_GRACE_SECONDS": "120",
    }
    outcome, decider = decide(pods[0], settings, api, monkeypatch, idle_for=4, env=extra)
    assert outcome == "warn", decider.reason
    text = pods[0].state.joinpath("idle-warning").read_text()
    assert "Each rank of `ml-dev run` then gets SIGUSR1 and 120 s to save a checkpoint: handle that signal" in text
    assert "'Suspend, resume and idle stop', 'Checkpoint before a stop'" in text
    page = (Path(__file__).resolve().parents[3] / "docs" / "use" / "suspend-and-idle.md").read_text()
    assert page.startswith("# Suspend, resume and idle stop") and "\n## Checkpoint before a stop\n" in page


def test_shells_print_the_warning_at_each_prompt(tmp_path: Path) -> None:
    from components.lifecycle import WARNING_SNIPPET

    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / ".bashrc").write_text(f". {WARNING_SNIPPET}\n")
    env = {"HOME": str(tmp_path), "ML_DEV_STATE_DIR": str(state), "PATH": "/usr/bin:/bin", "TERM": "dumb"}
    show = 'eval "$PROMPT_COMMAND"; echo done'
    quiet = subprocess.run(["bash", "-i", "-c", show], env=env, capture_output=True, text=True, check=False)
    assert quiet.stdout.strip() == "done" and "SUSPENDED" not in quiet.stderr
    (state / "idle-warning").write_text("ml-dev-env: this environment will be SUSPENDED at 12:00:00 UTC\n")
    loud = subprocess.run(["bash", "-i", "-c", show], env=env, capture_output=True, text=True, check=False)
    assert "will be SUSPENDED at 12:00:00 UTC" in loud.stderr and loud.stdout.strip() == "done"


@pytest.mark.parametrize(
    ("pod_ip", "listen", "expected"),
    [
        ("10.131.0.7", None, [("10.131.0.7", 9099), ("127.0.0.1", 9099)]),
        ("fd02::7", None, [("fd02::7", 9099), ("127.0.0.1", 9099)]),
        ("", None, [("127.0.0.1", 9099)]),
        ("10.131.0.7", "127.0.0.2:0, [::1]:9100", [("127.0.0.2", 0), ("::1", 9100)]),
    ],
)
def test_the_agent_listens_on_the_pod_ip_and_loopback(
    monkeypatch: pytest.MonkeyPatch, pod_ip: str, listen: str | None, expected: list[tuple[str, int]]
) -> None:
    monkeypatch.setenv("POD_IP", pod_ip)
    assert http.listen_addresses(listen, 9099) == expected  # the agent binds through inpod/lib/http.py


@pytest.mark.parametrize("listen", ["0.0.0.0:9099", "[::]:9099", ":9099"])
def test_the_agent_refuses_a_wildcard(listen: str) -> None:
    with pytest.raises(ValueError, match="not a wildcard"):
        http.listen_addresses(listen, 9099)
