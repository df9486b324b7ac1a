"""Idle rules a user can predict (issue 35 item 7), with a real JupyterLab kernel and a stub nvidia-smi.

* A GPU held only by kernels Jupyter reports idle does not veto: a kernel holding a GPU device open (a model
  loaded: nvidia-smi lists a process and 14.5 GiB at 0 %) while Jupyter says `idle` leaves the GPU idle, judged
  by Jupyter's last activity; any other process holding a GPU, or the kernel busy, keeps it busy. The rule never
  matches NVML's PIDs (host PIDs in a container: NVIDIA/nvidia-docker#1483): it reads which of the pod's own
  processes hold /dev/nvidia<N> open (here a file standing for it, ML_DEV_GPU_DEVICE_PREFIX).
* A worker whose nvidia-smi hangs answers /activity within pod 0's fetch timeout, with a failed GPU check
  (active), never an unreachable pod.
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

from core import pod_contract
from tests.lifecycle.conftest import APP, Jupyter, SimPod, agent_module, load_agent
from tools.capture_jupyter_status import message, wait_for

agent = load_agent()
MODEL_MIB = 14848  # 14.5 GiB: a 7B model in bf16
GPU_CSV = "index, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB]\n0, GPU-0c1d, 0 %, 0 %, {mib} MiB\n"
APPS_CSV = "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\nGPU-0c1d, 4011893, /usr/bin/python3, {mib} MiB\n"
STUB = """#!/bin/bash
case "$*" in
  *--query-gpu=*) cat "$SMI_DIR/gpu.csv" ;;
  *--query-compute-apps=*) cat "$SMI_DIR/apps.csv" ;;
esac
"""
HANG = "#!/bin/bash\nexec sleep 300\n"


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pod 0's environment for the probes: rank.env, the stub nvidia-smi with one process at 14.5 GiB, 0 %."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "rank.env").write_text("export NODE_RANK=0\n")
    (tmp_path / "gpu.csv").write_text(GPU_CSV.format(mib=MODEL_MIB))
    (tmp_path / "apps.csv").write_text(APPS_CSV.format(mib=MODEL_MIB))
    smi = tmp_path / "nvidia-smi"
    smi.write_text(STUB)
    smi.chmod(0o755)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    for key, value in {
        "ML_DEV_STATE_DIR": str(state),
        "ML_DEV_NVIDIA_SMI": str(smi),
        "SMI_DIR": str(tmp_path),
        "ML_DEV_GPU_DEVICE_PREFIX": str(tmp_path / "dev" / "nvidia"),
        "ML_DEV_PTS_DIR": str(tmp_path),
        "ML_DEV_SSH_PROCESS_SCAN": "0",
    }.items():
        monkeypatch.setenv(key, value)
    return tmp_path


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
def test_a_gpu_held_only_by_an_idle_kernel_does_not_veto(lab: Jupyter, pod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ML_DEV_JUPYTER_URL", lab.url)
    monkeypatch.setenv("JUPYTER_TOKEN", lab.token)
    settings = {**agent.DEFAULTS, "servers": ["jupyter"]}
    notebook = {"path": "model.ipynb", "name": "model.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    kernel = lab.json("POST", "/api/sessions", notebook)["kernel"]["id"]
    try:
        # the notebook loads a model: the kernel holds the GPU device open from now on
        asyncio.run(run_cell(lab, kernel, f"model = open({str(pod / 'dev' / 'nvidia0')!r})"))
        wait_for(lab, kernel, "idle")
        got = signals(settings)
        assert got["gpu"]["ok"] and not got["gpu"]["active"], got["gpu"]
        assert got["gpu"]["detail"]["heldByIdleKernels"] == [kernel]
        assert not got["jupyter"]["active"] and got["jupyter"]["age"] is not None  # the idle clock: Jupyter's activity
        # the same GPU without the rule (no Jupyter signal: a worker, or Jupyter off) is busy: 14.5 GiB, a process
        assert signals({**agent.DEFAULTS, "servers": []})["gpu"]["active"]

        # another process of the pod holding the GPU: busy again
        other = subprocess.Popen(
            [sys.executable, "-c", f"import time; f = open({str(pod / 'dev' / 'nvidia0')!r}); time.sleep(120)"],
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
        assert "compute process 4011893 (/usr/bin/python3)" in got["gpu"]["detail"]["why"]["0"]
        # utilisation still counts with only an idle kernel holding the GPU
        wait_for(lab, kernel, "idle")
        (pod / "gpu.csv").write_text(GPU_CSV.format(mib=MODEL_MIB).replace("0 %, 0 %", "87 %, 40 %"))
        got = signals(settings)
        assert got["gpu"]["active"] and got["gpu"]["detail"]["why"]["0"] == ["utilization.gpu 87 %", "utilization.memory 40 %"]
    finally:
        lab.raw("DELETE", f"/api/kernels/{kernel}")


@pytest.mark.timeout(120)
def test_a_hung_nvidia_smi_is_a_failed_gpu_check_answered_in_time(pod: Path) -> None:
    (pod / "nvidia-smi").write_text(HANG)
    t0 = time.monotonic()
    got = agent.probe_gpu(dict(agent.DEFAULTS))
    elapsed = time.monotonic() - t0
    assert not got["ok"] and "did not answer within" in got["detail"]["error"], got
    assert elapsed < agent.ACTIVITY_FETCH_SECONDS, elapsed


@pytest.mark.timeout(120)
def test_a_worker_with_a_hung_nvidia_smi_is_active_never_unreachable(tmp_path: Path) -> None:
    """Pod 1's agent (its own process, /activity over HTTP) with an nvidia-smi that never answers: pod 0's gather
    gets its answer within the fetch timeout, a failed GPU check that holds the stop as activity."""
    pods = [SimPod(tmp_path, i, [f"{APP}-0", f"{APP}-1"]) for i in range(2)]
    worker = pods[1]
    (worker.bin / "nvidia-smi").write_text(HANG)
    settings = tmp_path / "idle.json"
    settings.write_text(json.dumps({**agent.DEFAULTS, "enabled": True, "intervalSeconds": 60}))
    worker.start(worker.env(settings, None))
    try:
        address = worker.address()
        t0 = time.monotonic()
        report = agent.fetch_json(f"http://{address}/activity")
        elapsed = time.monotonic() - t0
        assert elapsed < agent.ACTIVITY_FETCH_SECONDS, elapsed
        gpu = next(s for s in report["signals"] if s["name"] == "gpu")
        assert not gpu["ok"] and "did not answer within" in gpu["detail"]["error"], gpu
        decider = agent.Decider(now=0)
        decider.observe([report], now=time.time())
        assert decider.reason.startswith(f"{APP}-1/gpu: probe failed"), decider.reason
        assert decider.unreachable_since == {}
    finally:
        worker.stop()


def test_the_contract_holds_the_idle_numbers() -> None:
    assert agent.GPU_PROBE_SECONDS == pod_contract.GPU_PROBE_SECONDS
    assert agent.ACTIVITY_FETCH_SECONDS == pod_contract.ACTIVITY_FETCH_SECONDS
    assert pod_contract.GPU_PROBE_SECONDS + 5 <= pod_contract.ACTIVITY_FETCH_SECONDS
    assert agent.GPU_DEVICE_PREFIX == pod_contract.GPU_DEVICE_PREFIX
    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "use" / "suspend-and-idle.md").read_text().split())
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
        tmp_path, bin_dir, f"{APP}-0", ML_DEV_SERVERS="jupyter", ML_DEV_IDLE_SETTINGS=str(path), ML_DEV_ACTIVITY_LISTEN="127.0.0.1:0"
    )
    proc = start(env)
    try:
        wait_ready(proc, tmp_path / "state")
        line = next(c for c in wait_for_calls(calls, 3) if c.startswith("jupyter "))
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
