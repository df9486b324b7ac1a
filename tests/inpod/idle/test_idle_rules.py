"""Idle rules a user can predict (issue 35 item 7), with a real JupyterLab kernel and the node's nvidia-smi
(tests/podsim/nodetools.py `HostNode`: the stub the simulated pods run), the agent's functions called in process.

* A GPU held only by kernels Jupyter reports idle does not veto: a kernel holding a GPU device open (a model
  loaded: nvidia-smi lists a process and 14.5 GiB at 0 %) while Jupyter says `idle` leaves the GPU idle, judged
  by Jupyter's last activity; any other process holding a GPU, or the kernel busy, keeps it busy. The rule never
  matches NVML's PIDs (host PIDs in a container: NVIDIA/nvidia-docker#1483): it reads which of the pod's own
  processes hold /dev/nvidia<N> open (here a file standing for it, ML_DEV_GPU_DEVICE_PREFIX).
* A hung nvidia-smi is a failed GPU check answered within the probe's budget. A worker whose nvidia-smi hangs
  answers /activity within pod 0's fetch timeout, with a failed GPU check (active), never an unreachable pod: on
  simulated pods, tests/podsim/test_idle_hang.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inpod import contract as pod_contract
from tests.inpod.idle.conftest import AgentInputs, Jupyter, agent_module, load_agent
from tools.capture_jupyter_status import message, wait_for

agent = load_agent()
MODEL_MIB = 14848  # 14.5 GiB: a 7B model in bf16
PID, PROCESS = 4011893, "/usr/bin/python3"  # the compute process nvidia-smi lists (a host PID: NVML's view)


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AgentInputs:
    """Pod 0's inputs for the probes: its node's one GPU with one process at 14.5 GiB, 0 %; the GPU device a file
    standing for /dev/nvidia0 (`device`, ML_DEV_GPU_DEVICE_PREFIX)."""
    inputs = AgentInputs(tmp_path, gpus=1)
    inputs.node.gpu(used=MODEL_MIB, apps=[(0, PID, PROCESS, MODEL_MIB)])
    (tmp_path / "dev").mkdir()
    device(inputs).write_text("")
    env = inputs.env(tmp_path / "idle.json", None, ML_DEV_GPU_DEVICE_PREFIX=str(tmp_path / "dev" / "nvidia"))
    for key, value in env.items():
        if key not in ("PATH", "HOME", "ML_DEV_IDLE_SETTINGS"):
            monkeypatch.setenv(key, value)
    return inputs


def device(pod: AgentInputs) -> Path:
    return pod.root / "dev" / "nvidia0"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jupyter]:
    server = Jupyter(tmp_path_factory.mktemp("lab"))
    try:
        yield server
    finally:
        server.close()


async def run_cell(lab: Jupyter, kernel: str, code: str, wait: bool = True) -> None:
    """`code` in the kernel as a notebook tab sends it (the kernel's websocket, execute_request)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    url = lab.url.replace("http://", "ws://") + f"/api/kernels/{kernel}/channels?session_id={session}"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {lab.token}"}, connect_timeout=30))
    try:
        text = message(session, "execute_request", {"code": code, "silent": False})
        await ws.write_message(text)
        sent = json.loads(text)["header"]["msg_id"]
        while wait:
            got = await asyncio.wait_for(ws.read_message(), timeout=60)
            assert got is not None, "kernel websocket closed"
            msg = json.loads(got)
            if msg.get("parent_header", {}).get("msg_id") == sent and msg.get("channel") == "shell":
                return
    finally:
        if wait:
            ws.close()


def signals(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in agent.local_activity(settings)["signals"]}


@pytest.mark.timeout(300)
def test_a_gpu_held_only_by_an_idle_kernel_does_not_veto(lab: Jupyter, pod: AgentInputs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ML_DEV_JUPYTER_URL", lab.url)
    monkeypatch.setenv("JUPYTER_TOKEN", lab.token)
    settings = {**agent.DEFAULTS, "servers": ["jupyter"]}
    notebook = {"path": "model.ipynb", "name": "model.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    kernel = lab.json("POST", "/api/sessions", notebook)["kernel"]["id"]
    try:
        # the notebook loads a model: the kernel holds the GPU device open from now on
        asyncio.run(run_cell(lab, kernel, f"model = open({str(device(pod))!r})"))
        wait_for(lab, kernel, "idle")
        got = signals(settings)
        assert got["gpu"]["ok"] and not got["gpu"]["active"], got["gpu"]
        assert got["gpu"]["detail"]["heldByIdleKernels"] == [kernel]
        assert not got["jupyter"]["active"] and got["jupyter"]["age"] is not None  # the idle clock: Jupyter's activity
        # the same GPU without the rule (no Jupyter signal: a worker, or Jupyter off) is busy: 14.5 GiB, a process
        assert signals({**agent.DEFAULTS, "servers": []})["gpu"]["active"]

        # another process of the pod holding the GPU: busy again
        other = subprocess.Popen(
            [sys.executable, "-c", f"import time; f = open({str(device(pod))!r}); time.sleep(120)"],
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while other.pid not in agent_module("idle_probes").gpu_holders() and time.monotonic() < deadline:
                time.sleep(0.1)
            got = signals(settings)
            assert got["gpu"]["active"] and got["gpu"]["detail"]["heldByIdleKernels"] == [], got["gpu"]
        finally:
            other.kill()
            other.wait(30)

        # the kernel busy: the GPU counts (and Jupyter's busy kernel is activity by itself)
        async def busy() -> dict[str, dict[str, Any]]:
            task = asyncio.ensure_future(run_cell(lab, kernel, "import time; time.sleep(6)"))
            await asyncio.to_thread(wait_for, lab, kernel, "busy")
            seen = await asyncio.to_thread(signals, settings)
            await task
            return seen

        got = asyncio.run(busy())
        assert got["gpu"]["active"] and got["jupyter"]["active"], got
        assert f"compute process {PID} ({PROCESS})" in got["gpu"]["detail"]["why"]["0"]
        # utilisation still counts with only an idle kernel holding the GPU
        wait_for(lab, kernel, "idle")
        pod.node.gpu(util=87, mem=40)
        got = signals(settings)
        assert got["gpu"]["active"] and got["gpu"]["detail"]["why"]["0"] == ["utilization.gpu 87 %", "utilization.memory 40 %"]
    finally:
        lab.raw("DELETE", f"/api/kernels/{kernel}")


@pytest.mark.timeout(120)
def test_a_hung_nvidia_smi_is_a_failed_gpu_check_answered_in_time(pod: AgentInputs) -> None:
    pod.node.gpu(smi="hang")
    t0 = time.monotonic()
    got = agent.probe_gpu(dict(agent.DEFAULTS))
    elapsed = time.monotonic() - t0
    assert not got["ok"] and "did not answer within" in got["detail"]["error"], got
    assert elapsed < agent.ACTIVITY_FETCH_SECONDS, elapsed


def test_the_contract_holds_the_idle_numbers() -> None:
    assert agent.GPU_PROBE_SECONDS == pod_contract.GPU_PROBE_SECONDS
    assert agent.ACTIVITY_FETCH_SECONDS == pod_contract.ACTIVITY_FETCH_SECONDS
    assert pod_contract.GPU_PROBE_SECONDS + 5 <= pod_contract.ACTIVITY_FETCH_SECONDS
    assert agent.GPU_DEVICE_PREFIX == pod_contract.GPU_DEVICE_PREFIX
    docs = " ".join((Path(__file__).resolve().parents[3] / "docs" / "use" / "suspend-and-idle.md").read_text().split())
    assert f"A **hung** `nvidia-smi` gets {pod_contract.GPU_PROBE_SECONDS} s" in docs
    assert f"well within pod 0's {pod_contract.ACTIVITY_FETCH_SECONDS} s" in docs


# ------------------------------------------------------------------------------ Jupyter culling


def startup_jupyter_args(tmp_path: Path, settings: dict[str, Any]) -> list[str]:
    """The `jupyter lab` argv the real startup.sh passes (a stub jupyter records it), with these idle settings."""
    from tests.inpod.test_startup_script import base_env, make_stubs, start, stop, wait_for_calls, wait_ready

    bin_dir, calls = make_stubs(tmp_path)
    path = tmp_path / "idle.json"
    path.write_text(json.dumps(settings))
    env = base_env(
        tmp_path, bin_dir, "ml-dev-env-0", ML_DEV_SERVERS="jupyter", ML_DEV_IDLE_SETTINGS=str(path), ML_DEV_ACTIVITY_LISTEN="127.0.0.1:0"
    )
    proc = start(env)
    try:
        wait_ready(proc, tmp_path / "state")
        # the jupyter call itself, however long a loaded machine takes to reach it (a count of calls within 5 s was not)
        deadline = time.monotonic() + 60
        while not (found := [c for c in wait_for_calls(calls, 3) if c.startswith("jupyter ")]) and time.monotonic() < deadline:
            assert proc.poll() is None, "startup.sh ended before it started jupyter"
            time.sleep(0.1)
        assert found, calls.read_text()
        line = found[0]
    finally:
        stop(proc)
    return line.split()[1:]


@pytest.mark.parametrize("enabled", [True, False])
def test_startup_culls_idle_kernels_only_with_the_idle_stop(tmp_path: Path, enabled: bool) -> None:
    args = startup_jupyter_args(tmp_path, {**agent.DEFAULTS, "enabled": enabled, "idleTimeoutSeconds": 1800})
    culling = [a for a in args if a.startswith("--MappingKernelManager.")]
    if enabled:
        assert culling == [
            "--MappingKernelManager.cull_idle_timeout=1800",
            "--MappingKernelManager.cull_connected=True",
            "--MappingKernelManager.cull_interval=60",
        ]
    else:
        assert culling == []


@pytest.mark.timeout(300)
def test_the_real_jupyterlab_culls_a_forgotten_notebook_with_those_flags(tmp_path: Path) -> None:
    """startup.sh's flags (a 3 s idle timeout, checked every second) on a real JupyterLab: a kernel with a tab
    connected and nothing run culls itself; its process (and what it held) is gone."""
    args = startup_jupyter_args(tmp_path, {**agent.DEFAULTS, "enabled": True, "idleTimeoutSeconds": 3})
    culling = [a.replace("cull_interval=60", "cull_interval=1") for a in args if a.startswith("--MappingKernelManager.")]
    (tmp_path / "lab").mkdir()
    lab = Jupyter(tmp_path / "lab", extra=culling)
    try:
        notebook = {"path": "forgotten.ipynb", "name": "forgotten.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
        kernel = lab.json("POST", "/api/sessions", notebook)["kernel"]["id"]

        async def forgotten_tab() -> None:  # the tab stays open (its websocket connected) while the kernel idles
            from tornado.httpclient import HTTPRequest
            from tornado.websocket import websocket_connect

            session = uuid.uuid4().hex
            url = lab.url.replace("http://", "ws://") + f"/api/kernels/{kernel}/channels?session_id={session}"
            ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {lab.token}"}, connect_timeout=30))
            try:
                await ws.write_message(message(session, "execute_request", {"code": "model = 'loaded'", "silent": False}))
                deadline = time.monotonic() + 60
                while any(k["id"] == kernel for k in await asyncio.to_thread(lab.json, "GET", "/api/kernels?no_track_activity=1")):
                    assert time.monotonic() < deadline, lab.log_path.read_text()[-2000:]
                    await asyncio.sleep(0.5)
            finally:
                ws.close()

        asyncio.run(forgotten_tab())
        log = lab.log_path.read_text()
        # jupyter_server kernelmanager.py cull_kernel_if_idle's line: culled with the tab connected (cull_connected)
        assert f"Culling 'idle' kernel 'python3' ({kernel}) with 1 connections due to" in log, log[-2000:]
    finally:
        lab.close()


def holding(pod: AgentInputs, *tail: str) -> subprocess.Popen[bytes]:
    """A process of the pod holding the GPU device open; `tail`: the last words of its argv."""
    code = f"import time; f = open({str(device(pod))!r}); time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", code, *tail], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while proc.pid not in agent_module("idle_probes").gpu_holders() and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc


def test_a_gpu_held_only_by_warm_ranks_without_a_cell_does_not_veto(pod: AgentInputs) -> None:
    """Warm ranks (`ml-dev ranks`) with a model loaded and no cell: judged by their cells (the warm signal), not by
    the GPU memory they hold; a cell running makes both count, and any other holder keeps the GPU busy."""
    settings = {**agent.DEFAULTS, "servers": []}
    # a worker as its node starts it (warm.py: `python3 -c ... <fd> _warm-worker`), holding the GPU
    worker = holding(pod, "5", pod_contract.WARM_WORKER_COMMAND)
    record = pod.state / pod_contract.WARM_DIR / pod_contract.WARM_ACTIVITY_FILE
    record.parent.mkdir(parents=True)

    def warm(running: list[int]) -> None:  # the node's record (its pid: the worker's here, a live process)
        record.write_text(json.dumps({"pid": worker.pid, "ranks": [0], "running": running, "last": time.time() - 7200}))

    try:
        warm([])
        got = signals(settings)
        assert got["gpu"]["ok"] and not got["gpu"]["active"], got["gpu"]
        assert got["gpu"]["detail"]["heldByIdleKernels"] == ["warm ranks"]
        assert not got["warm"]["active"] and got["warm"]["age"] >= 7000, got["warm"]
        warm([3])  # a cell runs: the GPU counts again, and the cell is activity by itself
        got = signals(settings)
        assert got["gpu"]["active"] and got["warm"]["active"], got
        warm([])
        other = holding(pod)  # another process of the pod holding the GPU: busy
        try:
            got = signals(settings)
            assert got["gpu"]["active"] and got["gpu"]["detail"]["heldByIdleKernels"] == [], got["gpu"]
        finally:
            other.kill()
            other.wait(30)
    finally:
        worker.kill()
        worker.wait(30)
