"""The idle agent's decision and probes called in this process, against real signal sources: a real JupyterLab
server, the node's nvidia-smi (tests/podsim/nodetools.py, the real CSV format), code-server heartbeat files, real
processes behind SSH/launcher activity records, and a validating API stand-in. The agents as processes, one per
pod, run on simulated pods started from the render: tests/inpod/idle/test_idle_pods.py."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inpod import contract
from inpod.lib import http
from tests.fixtures import schema_check
from tests.inpod.idle.conftest import APP, NS, AgentInputs, FakeApiServer, Jupyter, load_agent, write_settings

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
def pod0(tmp_path: Path) -> AgentInputs:
    """Pod 0's inputs (its decision runs here, in process); rank.env names no other pod unless a test adds one."""
    return AgentInputs(tmp_path / "pod0")


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
        self.port = int(self.httpd.server_address[1])
        self.addr = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def decide(
    pod: AgentInputs,
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


# core/v1 Event fields (k8s.io/api/core/v1 types.go `Event`); schemas/ has no Event schema.
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


def test_scale_request_and_record_pass_the_official_schemas(
    pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = write_settings(tmp_path / "idle.json", servers=[])
    outcome, decider = decide(pod0, settings, api, monkeypatch)
    assert outcome == "stop", decider.reason
    count = api.write_bodies(tmp_path / "bodies")
    proc = schema_check.check(str(tmp_path / "bodies"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "autoscaling/v1 Scale" in proc.stdout and f"summary: {count} ok, 0 invalid" in proc.stdout
    # PUT on the scale subresource with the agent's field manager; never a PATCH of the StatefulSet itself
    writes = [(m, p) for m, p in api.requests if m != "GET"]
    assert ("PUT", f"/apis/apps/v1/namespaces/{NS}/statefulsets/{APP}/scale?fieldManager=ml-dev-env-idle-agent") in writes
    assert not any(
        p.startswith(f"/apis/apps/v1/namespaces/{NS}/statefulsets/{APP}?") or p.endswith(f"statefulsets/{APP}") for _, p in api.requests
    )


def test_already_scaled_to_zero_is_left_alone(
    pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    api.replicas = 0
    outcome, _ = decide(pod0, write_settings(tmp_path / "idle.json", servers=[]), api, monkeypatch)
    assert outcome == "stop" and api.scales == [] and api.events == []


FAILURES = [
    "nvidia-smi fails",
    "nvidia-smi hangs",
    "worker unreachable",
    "rank.env unreadable",
    "jupyter answers 500",
]
"""Pod 0's own probes failing, and a worker that does not answer. A worker whose probe fails (its agent answers with a
failed GPU check) runs on simulated pods: tests/podsim/test_idle_hang.py."""


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_probe_counts_as_active(
    failure: str, pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    overrides: dict[str, Any] = {"servers": ["jupyter"] if "jupyter" in failure else []}
    extra: dict[str, str] = {}
    broken: Answer | None = None
    if failure == "nvidia-smi fails":
        pod0.node.gpu(smi="fail")
    elif failure == "nvidia-smi hangs":
        pod0.node.gpu(smi="hang")
    elif failure == "worker unreachable":
        # rank.env names the worker, whose address answers 503 on the activity port (a Service without endpoints)
        broken = Answer(503, {"error": "no endpoints"})
        pod0.rank_env({f"{APP}-1": "127.0.0.1"})
        overrides["activityPort"] = broken.port
    elif failure == "rank.env unreadable":
        pod0.state.joinpath("rank.env").unlink()
        extra["NODE_RANK"] = "0"
    elif failure == "jupyter answers 500":
        broken = Answer(500, {"message": "Internal Server Error"})
        extra["ML_DEV_JUPYTER_URL"] = f"http://{broken.addr}"
    settings = write_settings(tmp_path / "idle.json", **overrides)
    try:
        outcome, decider = decide(pod0, settings, api, monkeypatch, env=extra)
    finally:
        if broken:
            broken.close()
    assert outcome == "active", decider.reason
    assert "probe failed" in decider.reason
    assert api.scales == [] and api.requests == []
    assert not pod0.state.joinpath("idle-warning").exists()


def test_a_worker_unreachable_past_the_bound_is_reported_and_no_longer_holds_the_stop(
    pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Within unreachableSeconds the worker holds the stop; past it: an Event, the stop, the record names it."""
    broken = Answer(503, {"error": "no endpoints"})  # the worker's address (rank.env) on the activity port
    pod0.rank_env({f"{APP}-1": "127.0.0.1"})
    settings = write_settings(tmp_path / "idle.json", servers=[], unreachableSeconds=5, activityPort=broken.port)
    try:
        for key, value in pod0.env(settings, api).items():
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
    view = json.loads(pod0.state.joinpath("idle-status.json").read_text())
    assert view["unreachable"][f"{APP}-1"]["since"] == t0 and view["unreachable"][f"{APP}-1"]["writtenOff"]


def test_activity_records_real_processes_and_heartbeats(
    pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pod = pod0
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
    pod.node.gpu(util=0, mem=60)
    outcome, decider = decide(pod, settings, api, monkeypatch)
    assert (outcome, decider.reason) == ("active", f"{APP}-0/gpu: active")
    pod.node.gpu(util=4, mem=4)  # below both thresholds
    assert api.scales == []
    outcome, decider = decide(pod, settings, api, monkeypatch)
    assert outcome == "stop", decider.reason
    signals = json.loads(api.configmap["data"]["signals.json"])
    assert signals[f"{APP}-0/launcher"]["age"] >= 7000 and signals[f"{APP}-0/vscode"]["age"] >= 7000


def test_the_ssh_fabric_and_launcher_record_formats(
    pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ssh-sessions/<pid> (first line: the process start time) and heartbeat/{run,rank}-<pid>.json, as the
    SSH fabric's ForceCommand and the `ml-dev` launcher write them."""
    pod = pod0
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
    pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pod = pod0
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


def test_disabled_agent_decides_nothing(pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    outcome, _ = decide(pod0, write_settings(tmp_path / "idle.json", enabled=False), api, monkeypatch)
    assert outcome == "off" and api.requests == []


# ------------------------------------------------------------------------------- real JupyterLab


def test_jupyter_idle_server_polled_by_the_agent_stays_idle(
    jupyter: Jupyter, pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pod = pod0
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


def test_the_warning_says_how_to_hook_in(pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The idle warning names the pod's checkpoint signal and grace (its container env) and the docs section."""
    settings = write_settings(tmp_path / "idle.json", servers=[])
    extra = {"ML_DEV_CHECKPOINT_SIGNAL": "SIGUSR1", "ML_DEV_CHECKPOINT_GRACE_SECONDS": "120"}
    outcome, decider = decide(pod0, settings, api, monkeypatch, idle_for=4, env=extra)
    assert outcome == "warn", decider.reason
    text = pod0.state.joinpath("idle-warning").read_text()
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


def test_a_settings_change_starts_a_round_at_once_not_an_interval_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between rounds the agent looks at idle.json every second: a ConfigMap update (here the file rewritten, as
    the kubelet's ..data swap shows it) ends the wait for the next round, however long the interval."""
    path = write_settings(tmp_path / "idle.json", intervalSeconds=3600)
    monkeypatch.setenv(contract.IDLE_SETTINGS_ENV, str(path))
    settings = agent.load_settings()
    assert agent.until_next_round(time.monotonic() + 1.5, settings) is True  # nothing changed: the whole wait
    changer = threading.Timer(0.5, lambda: write_settings(path, intervalSeconds=3600, unreachableSeconds=4))
    changer.start()
    try:
        # a wait of a minute ends with the change (were it missed, it would end at its time and answer True)
        assert agent.until_next_round(time.monotonic() + 60, settings) is False
    finally:
        changer.cancel()
    assert agent.load_settings()["unreachableSeconds"] == 4


# ------------------------------------------------------------------ warm ranks (`ml-dev ranks`, issue 51)

WARM_NODE = ["python3", "/opt/ml-dev-env/ml-dev", contract.WARM_NODE_COMMAND, "--nproc", "2"]


def titled(title: str) -> subprocess.Popen[bytes]:
    """A live process whose argv is `title` (what /proc/<pid>/cmdline shows)."""
    proc = subprocess.Popen(["bash", "-c", f'exec -a "{title}" sleep 60'])
    deadline = time.monotonic() + 10
    while title.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_warm_ranks_count_by_their_cells_only(
    pod0: AgentInputs, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cell running is activity; warm ranks without a cell for idleTimeout are idle, whatever their rank agents'
    heartbeats, their hub's run heartbeat and their hub's SSH session (a bridge) say: real processes behind every
    record, in the formats the programs write (warm.py write_activity, launch.py Heartbeat, ssh-session.sh)."""
    pod = pod0
    settings = write_settings(tmp_path / "idle.json", servers=[])
    (pod.state / "heartbeat").mkdir(exist_ok=True)
    (pod.state / contract.SSH_SESSIONS_DIR).mkdir(exist_ok=True)
    node = titled(" ".join(WARM_NODE))
    rank_agent = titled("python3 /opt/ml-dev-env/ml-dev _rank --env-stdin --cwd /workspace -- " + " ".join(WARM_NODE))
    bridge = titled(f"python3 /opt/ml-dev-env/ml-dev {contract.WARM_BRIDGE_COMMAND}")
    try:
        now = time.time()
        for name, pid in (("rank", rank_agent.pid), ("run", node.pid)):  # the agent's and the hub's heartbeats, fresh
            beat = pod.state / "heartbeat" / f"{name}-{pid}.json"
            beat.write_text(json.dumps({"command": WARM_NODE, "cwd": "/workspace", "pid": pid, "started": now, "alive_at": now}))
        start = Path(f"/proc/{bridge.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (pod.state / contract.SSH_SESSIONS_DIR / str(bridge.pid)).write_text(f"{start}\ndev\n10.128.2.7 51234 22\n4242\n")
        record = pod.state / contract.WARM_DIR / contract.WARM_ACTIVITY_FILE
        record.parent.mkdir(parents=True, exist_ok=True)

        def warm(running: list[int], last: float) -> None:
            cell = {"id": 7, "state": "running" if running else "ok", "ranks": [0, 1], "started": last}
            record.write_text(json.dumps({"pid": node.pid, "ranks": [0, 1], "running": running, "last": last, "last_cell": cell}))

        warm([], now - 7200)  # warm, no cell for 2 h: idle (the heartbeats and the bridge's session count for nothing)
        outcome, decider = decide(pod, settings, api, monkeypatch, ML_DEV_SSH_PROCESS_SCAN="0")
        assert outcome == "stop", decider.reason
        api.scales.clear()
        warm([7], now - 7200)  # a cell runs (started 2 h ago): active
        outcome, decider = decide(pod, settings, api, monkeypatch, ML_DEV_SSH_PROCESS_SCAN="0")
        assert (outcome, decider.reason) == ("active", f"{APP}-0/warm: active")
        warm([], time.time() - 1)  # the last cell ended a second ago (idleTimeout: 6 s)
        outcome, decider = decide(pod, settings, api, monkeypatch, ML_DEV_SSH_PROCESS_SCAN="0")
        assert (outcome, decider.reason) == ("active", f"{APP}-0/warm: last activity")
        assert agent.probe_ssh()["detail"]["records"] == []  # the bridge's session is the warm ranks'
    finally:
        for proc in (node, rank_agent, bridge):
            proc.kill()
            proc.wait()
    warm_signal = agent.probe_warm(time.time())
    assert warm_signal["detail"]["ranks"] == [] and not warm_signal["active"]  # a node gone: its record is ignored
