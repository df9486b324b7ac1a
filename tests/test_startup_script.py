"""Run the real startup script with stub binaries, as pod 0 and as a worker."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from components import naming
from components.pod import STARTUP_SCRIPT

STUBS = {
    # dev servers: record argv, then stay up like a server
    "code-server": "exec sleep 60",
    "jupyter": "exec sleep 60",
    "tensorboard": "exec sleep 60",
    "nvidia-smi": 'echo "0, NVIDIA H100 80GB HBM3, 81559 MiB"',
    "ibv_devinfo": r'printf "4 HCAs found:\n\tmlx5_7\n\tmlx5_6\n\tmlx5_9\n\tmlx5_8\n"',
}


def make_stubs(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for name, body in STUBS.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/bash\necho "{name} $*" >> "{calls}"\n{body}\n')
        path.chmod(0o755)
    calls.touch()
    calls.chmod(0o666)
    return bin_dir, calls


@pytest.fixture
def stubs(tmp_path: Path) -> tuple[Path, Path]:
    return make_stubs(tmp_path)


def base_env(tmp_path: Path, bin_dir: Path, pod: str, **extra: str) -> dict[str, str]:
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOSTNAME": pod,
        "POD_NAME": pod,
        "APP_NAME": "ml-dev-env",
        "HEADLESS_SERVICE": "ml-dev-env-headless",
        "POD_NAMESPACE": "nccl-test",
        "NNODES": "2",
        "GPUS_PER_NODE": "4",
        "MASTER_ADDR": naming.pod_dns("ml-dev-env", "nccl-test", 0),
        "MASTER_PORT": "29500",
        "ML_DEV_WORKSPACE": str(tmp_path / "workspace"),
        "ML_DEV_STATE_DIR": str(tmp_path / "state"),
        "ML_DEV_SERVERS": "vscode jupyter tensorboard",
        "ML_DEV_AUTH": "oauth-proxy",
        "ML_DEV_MEMLOCK": "none",
        "NCCL_IB_HCA": "mlx5_6,mlx5_7,mlx5_8,mlx5_9",
        "NCCL_SOCKET_IFNAME": "net1,net2,net3,net4",
    }
    env.update(extra)
    return env


def start(env: dict[str, str], prefix: list[str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*(prefix or []), "bash", str(STARTUP_SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_ready(proc: subprocess.Popen[str], state: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (state / "ready").exists():
            return
        if proc.poll() is not None:
            raise AssertionError(f"startup script exited {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("startup script never became ready")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    return out


def wait_for_calls(calls: Path, count: int, timeout: float = 5) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = calls.read_text().splitlines()
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    return calls.read_text().splitlines()


def test_pod0_computes_rank_writes_hostfile_and_starts_servers_on_loopback(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, calls = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-0")
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    lines = wait_for_calls(calls, 4)
    out = stop(proc)

    hostfile = (tmp_path / "workspace" / ".deepspeed" / "hostfile").read_text()
    assert hostfile == naming.hostfile("ml-dev-env", "nccl-test", 2, 4)
    assert hostfile.splitlines()[1] == "ml-dev-env-1.ml-dev-env-headless.nccl-test.svc.cluster.local slots=4"
    servers = {line.split()[0]: line for line in lines if not line.startswith("nvidia-smi")}
    assert set(servers) == {"code-server", "jupyter", "tensorboard"}
    assert "--bind-addr 127.0.0.1:8080 --auth none" in servers["code-server"]
    assert "lab --no-browser --allow-root --ip=127.0.0.1 --port=8888" in servers["jupyter"]
    assert "--host 127.0.0.1 --port 6006" in servers["tensorboard"]
    env_sh = (tmp_path / "state" / "env.sh").read_text()
    assert "export NODE_RANK=0 NNODES=2 GPUS_PER_NODE=4 WORLD_SIZE=8" in env_sh
    assert "export NCCL_IB_HCA=mlx5_6\\,mlx5_7\\,mlx5_8\\,mlx5_9" in env_sh or "NCCL_IB_HCA=mlx5_6,mlx5_7" in env_sh
    assert "NODE_RANK=0 of NNODES=2" in out
    # the servers were stopped with the pod
    time.sleep(0.2)
    assert subprocess.run(["pgrep", "-f", f"{bin_dir}/code-server"], check=False).returncode == 1


def test_worker_starts_no_dev_servers(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, calls = stubs
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-1", NODE_RANK="1"))
    wait_ready(proc, tmp_path / "state")
    out = stop(proc)
    assert [line for line in calls.read_text().splitlines() if not line.startswith("nvidia-smi")] == []
    assert "worker pod: no dev servers" in out
    assert "NODE_RANK=1 of NNODES=2" in out
    assert (tmp_path / "workspace" / ".deepspeed" / "hostfile").read_text() == naming.hostfile("ml-dev-env", "nccl-test", 2, 4)


def test_token_mode_binds_all_interfaces_with_auth(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, calls = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-0", ML_DEV_AUTH="token", ML_DEV_SERVERS="vscode jupyter",
                   PASSWORD="pw", JUPYTER_TOKEN="tok")
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    lines = wait_for_calls(calls, 3)
    stop(proc)
    servers = {line.split()[0]: line for line in lines if not line.startswith("nvidia-smi")}
    assert "--bind-addr 0.0.0.0:8080 --auth password" in servers["code-server"]
    assert "--IdentityProvider.token=tok" in servers["jupyter"]


def test_token_mode_without_password_fails_fast(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, _ = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-0", ML_DEV_AUTH="token", ML_DEV_SERVERS="vscode")
    proc = start(env)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode != 0 and "token mode needs PASSWORD" in out


def test_auto_hca_detection_drops_the_header(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, _ = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-1", ML_DEV_HCA_MODE="auto")
    del env["NCCL_IB_HCA"]
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    out = stop(proc)
    assert "NCCL_IB_HCA auto-detected: mlx5_6,mlx5_7,mlx5_8,mlx5_9" in out
    assert "HCAs found" not in (tmp_path / "state" / "env.sh").read_text()


def test_bad_pod_name_is_a_clear_error(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, _ = stubs
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-x"))
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 1 and "cannot derive the StatefulSet ordinal from pod name 'ml-dev-env-x'" in out


@pytest.mark.skipif(not (shutil.which("prlimit") and shutil.which("setpriv")) or os.geteuid() != 0,
                    reason="needs root with util-linux prlimit/setpriv to drop privileges")
def test_refused_memlock_cannot_kill_the_pod() -> None:
    """memlock 'scc' on a pod whose SCC grant is missing: `ulimit -l unlimited` fails, the pod still starts."""
    tmp_path = Path(tempfile.mkdtemp(prefix="ml-dev-env-memlock-"))  # reachable by the unprivileged user
    tmp_path.chmod(0o777)
    bin_dir, _ = make_stubs(tmp_path)
    env = base_env(tmp_path, bin_dir, "ml-dev-env-1", ML_DEV_MEMLOCK="scc")
    prefix = ["prlimit", "--memlock=65536:65536", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    proc = start(env, prefix)
    wait_ready(proc, tmp_path / "state")
    out = stop(proc)
    shutil.rmtree(tmp_path)
    assert "WARNING: could not raise memlock (now 64 KiB)" in out
    assert "ready" in out


def test_unwritable_workspace_does_not_kill_the_pod(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, _ = stubs
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the workspace should be")
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-1", ML_DEV_WORKSPACE=str(blocked), HOME=str(blocked)))
    wait_ready(proc, tmp_path / "state")
    out = stop(proc)
    assert f"WARNING: cannot write {blocked}/.deepspeed/hostfile" in out
    assert (tmp_path / "state" / "hostfile").read_text() == naming.hostfile("ml-dev-env", "nccl-test", 2, 4)
    assert f"DEEPSPEED_HOSTFILE={tmp_path}/state/hostfile" in (tmp_path / "state" / "env.sh").read_text()
