"""fabricCheck.onDeploy: pod 0 holds its dev servers until the fabric check passes (bounded retries, then a
manual pass or `release`), and the startup script's hook honours it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import inpod
from components.pod import STARTUP_SCRIPT
from tests.fabric.conftest import Sim


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


def test_hold_returns_at_once_without_on_deploy(sim) -> None:
    s: Sim = sim(2)
    res = s.run("hold")
    assert res.returncode == 0 and res.stdout == ""
    assert not s.calls("ssh") and not s.calls("mpirun")


def test_hold_runs_preflight_and_gate_and_releases_on_pass(sim) -> None:
    s: Sim = sim(2)
    s.settings = {**s.settings, "onDeploy": True}
    res = s.run("hold", "--interval", "0.1")
    assert res.returncode == 0, res.stdout
    assert "fabric gate PASS" in res.stdout
    assert s.result(where="state")["status"] == "pass"
    assert {c["args"][-2] for c in s.calls("ssh") if "preflight" in c["args"][-1]} == set(s.cluster.names)


def test_hold_keeps_holding_after_the_timeout_until_release(sim) -> None:
    s: Sim = sim(2)
    s.settings = {**s.settings, "onDeploy": True}
    s.cluster.build()
    s.cluster.host(1)["ibstat"]["mlx5_7"] = {"state": "Active", "rate": 100}
    proc = s.start("hold", "--timeout", "1", "--interval", "0.2")
    try:
        assert proc.stdout is not None
        lines = read_until(proc.stdout, "did not pass within 1 s")
        assert any("FAIL ml-dev-env-1 (node gpu-node-1) mlx5_7: port 1 Active at 100 Gb/s" in line for line in lines)
        assert proc.poll() is None, "still holding after the timeout"
        assert s.result(where="state")["status"] == "fail"
        release = s.run("release")
        assert release.returncode == 0
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()


def test_hold_ends_when_a_manual_gate_passes(sim) -> None:
    s: Sim = sim(2)
    s.settings = {**s.settings, "onDeploy": True}
    s.cluster.build()
    s.cluster.allreduce["busbw"] = 40.0
    proc = s.start("hold", "--timeout", "1", "--interval", "0.2")
    try:
        assert proc.stdout is not None
        read_until(proc.stdout, "did not pass within")
        s.cluster.allreduce["busbw"] = 197.0  # the operator fixed the fabric and reruns the gate on pod 0
        assert s.run("gate").returncode == 0
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()


def test_startup_hook_holds_pod_0_dev_servers_until_release(sim, tmp_path: Path) -> None:
    s: Sim = sim(2)
    s.settings = {**s.settings, "onDeploy": True, "onDeployTimeoutSeconds": 1}
    env = s.env(0)
    s.cluster.host(1)["gpus"] = 2
    s.cluster.build()
    opt = tmp_path / "opt"  # what the startup ConfigMap mounts at /opt/ml-dev-env
    opt.mkdir()
    shutil.copy(STARTUP_SCRIPT, opt / STARTUP_SCRIPT.name)
    for key, text in inpod.group("fabric").items():  # the program and its modules, as the ConfigMap ships them
        (opt / key).write_text(text)
    shutil.copy(env.pop("ML_DEV_FABRIC_CONFIG"), opt / "fabric.json")
    state = Path(env["ML_DEV_STATE_DIR"])
    env.update(
        APP_NAME="ml-dev-env",
        HEADLESS_SERVICE="ml-dev-env-headless",
        POD_NAMESPACE="nccl-test",
        NNODES="2",
        GPUS_PER_NODE="4",
        MASTER_ADDR=s.cluster.names[0],
        MASTER_PORT="29500",
        ML_DEV_SERVERS="vscode",
        ML_DEV_AUTH="oauth-proxy",
        HOSTNAME="ml-dev-env-0",
        ML_DEV_FABRIC_INTERVAL="0.2",
    )
    proc = subprocess.Popen(
        ["/bin/bash", str(opt / "startup.sh")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        lines = read_until(proc.stdout, "did not pass within")
        assert any("FAIL ml-dev-env-1 (node gpu-node-1) GPUs: 2 visible, expected 4" in line for line in lines), "".join(lines)
        assert not (state / "ready").exists() and not s.calls("code-server"), "pod 0 is held: no servers, not ready"
        assert s.run("release").returncode == 0
        after = read_until(proc.stdout, "] ready")
        assert any("starting vscode: code-server" in line for line in after)
        for _ in range(300):  # the script logs "ready" just before it creates the file
            if (state / "ready").exists():
                break
            time.sleep(0.1)
        assert (state / "ready").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
