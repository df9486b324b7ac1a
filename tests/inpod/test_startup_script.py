"""The startup script as a plain process with stub binaries: only what a pod started from the render cannot show.

Its behaviour on pods lives in tests/inpod/sh/test_startup.py (rank, hostfile, servers, count changes, HOME, shells,
token auth, hcaMode auto, refused memlock, restricted-v2 on a read-only workspace, the idle agent). What stays here
cannot be expressed by any render: a pod name without an ordinal (a StatefulSet always names pods <app>-<n>), an
unwritable /tmp and $TMPDIR (no stack renders readOnlyRootFilesystem; the image's /tmp is writable) and a pod
without the idle settings (every render mounts the lifecycle ConfigMap's idle.json). The helpers are shared with
tests/inpod/ml_dev/test_checkpoint_stop.py and tests/components/test_gpu_cluster.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from core import naming
from inpod import contract as pod_contract
from tests.inpod import mount
from tests.podsim.nodetools import HostNode

SERVERS = ("code-server", "jupyter", "tensorboard")
STUBS = {
    # dev servers: record PID, argv and environment, then stay up like a server (exec keeps the PID)
    **{
        name: f'out="$(dirname "$0")/../{name}"; echo $$ > "$out.pid"; env | sort > "$out.env.tmp" && mv "$out.env.tmp" "$out.env"\n'
        "exec sleep 60"
        for name in SERVERS
    },
}
APP, NAMESPACE, HEADLESS = "ml-dev-env", "nccl-test", "ml-dev-env-headless"
CLUSTER = {
    "NNODES": "2",
    "GPUS_PER_NODE": "4",
    "APP_NAME": APP,
    "HEADLESS_SERVICE": HEADLESS,
    "POD_NAMESPACE": NAMESPACE,
    "MASTER_PORT": "29500",
}
STARTUP_SCRIPT = mount.shipped() / "startup.sh"  # the startup ConfigMap as the pod has it (its siblings beside it)
RANK_KEYS = pod_contract.RANK_ENV  # what rank.env holds: the one contract (inpod/contract.py)


def make_stubs(tmp_path: Path) -> tuple[Path, Path]:
    """The stubs in `tmp_path`/bin, each logging its calls to `tmp_path`/calls.log; nvidia-smi is the node's
    (tests/podsim/nodetools.py `HostNode`: what nodetool.py prints on a simulated pod), GPUS_PER_NODE idle GPUs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    node = HostNode(tmp_path / "node", gpus=int(CLUSTER["GPUS_PER_NODE"]))
    node_tools = {"nvidia-smi": node.nvidia_smi}
    bodies = {**STUBS, **{name: f'exec {shlex.quote(str(tool))} "$@"' for name, tool in node_tools.items()}}
    for name, body in bodies.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/bash\necho "{name} $*" >> "{calls}"\n{body}\n')
        path.chmod(0o755)
    calls.touch()
    calls.chmod(0o666)
    return bin_dir, calls


@pytest.fixture
def stubs(tmp_path: Path) -> tuple[Path, Path]:
    return make_stubs(tmp_path)


def write_cluster_env(cluster_dir: Path, **overrides: str) -> None:
    """Replace cluster.env atomically, as the kubelet does for a ConfigMap mounted as a directory."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    cluster_dir.chmod(0o755)
    tmp = cluster_dir / ".cluster.env.tmp"
    tmp.write_text("".join(f"{k}={v}\n" for k, v in {**CLUSTER, **overrides}.items()))
    tmp.chmod(0o644)
    os.replace(tmp, cluster_dir / "cluster.env")


def base_env(tmp_path: Path, bin_dir: Path, pod: str, **extra: str) -> dict[str, str]:
    if not (tmp_path / "cluster" / "cluster.env").exists():
        write_cluster_env(tmp_path / "cluster")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOSTNAME": pod,
        "POD_NAME": pod,
        "ML_DEV_CLUSTER_DIR": str(tmp_path / "cluster"),
        "ML_DEV_WORKSPACE": str(tmp_path / "workspace"),
        "ML_DEV_STATE_DIR": str(tmp_path / "state"),
        "ML_DEV_HOME": str(tmp_path / "workspace" / ".home" / pod),
        "ML_DEV_POLL_SECONDS": "0.1",
        "ML_DEV_SERVERS": "vscode jupyter tensorboard",
        "ML_DEV_AUTH": "oauth-proxy",
        "ML_DEV_MEMLOCK": "none",
        "NCCL_IB_HCA": "mlx5_6,mlx5_7,mlx5_8,mlx5_9",
        "NCCL_SOCKET_IFNAME": "net1,net2,net3,net4",
    }
    env.update(extra)
    return env


def start(
    env: dict[str, str], prefix: list[str] | None = None, script: Path = STARTUP_SCRIPT, cwd: Path | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*(prefix or []), "bash", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
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


def sourced(path: Path, shell: list[str] | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a shell has after sourcing `path` (or, with `shell`, after that shell's own startup files)."""
    argv = shell or ["bash", "-c", '. "$0" && env -0', str(path)]
    out = subprocess.run(argv, env=env or {"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def rank_env(state: Path) -> dict[str, str]:
    values = sourced(state / "rank.env")
    return {k: values[k] for k in RANK_KEYS if k in values}


def wait_until(predicate: Callable[[], bool], timeout: float = 30) -> bool:
    """Poll for a condition with a generous bound (the script polls every 0.1 s in these tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_bad_pod_name_is_a_clear_error(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, _ = stubs
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-x"))
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 1 and "cannot derive the StatefulSet ordinal from pod name 'ml-dev-env-x'" in out


def test_no_writable_state_dir_nor_tmpdir_still_runs(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    """State dir and $TMPDIR both unwritable (below a regular file: even root cannot write there): warnings, no exit."""
    bin_dir, calls = stubs
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    log = tmp_path / "pod.log"
    env = base_env(tmp_path, bin_dir, "ml-dev-env-0", ML_DEV_STATE_DIR=f"{blocked}/state", TMPDIR=str(blocked))
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", str(STARTUP_SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            # the last line before the poll loop (after "ready")
            assert wait_until(lambda: f"cannot create {blocked}/state/ready" in log.read_text(), timeout=15), log.read_text()
            started = [line.split()[0] for line in wait_for_calls(calls, 4)]
            assert proc.poll() is None, log.read_text()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert f"WARNING: cannot write {blocked}/state nor {blocked}: no rank.env" in text
    assert f"WARNING: cannot create {blocked}/state/ready" in text
    assert sorted(set(started) - {"nvidia-smi"}) == sorted(SERVERS)
    # the rank is still computed and the hostfile (on the workspace) written
    assert (tmp_path / "workspace" / ".deepspeed" / APP / "hostfile").read_text() == naming.hostfile(APP, NAMESPACE, 2, 4)


def test_no_settings_no_agent(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    """Without idle settings at ML_DEV_IDLE_SETTINGS the script starts no idle agent (with the rendered
    settings: tests/inpod/sh/test_startup.py)."""
    bin_dir, calls = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-1", ML_DEV_IDLE_SETTINGS=str(tmp_path / "absent.json"))
    proc = start(env)
    try:
        wait_ready(proc, tmp_path / "state")
    finally:
        out = stop(proc)
    assert "idle-agent" not in out
    assert not (tmp_path / "state" / "activity.addr").exists()
    # the GPU list in the log is what the node's nvidia-smi prints for the script's query (its logged call)
    smi = shutil.which("nvidia-smi", path=str(bin_dir))
    query = next(line.split()[1:] for line in calls.read_text().splitlines() if line.startswith("nvidia-smi "))
    assert smi is not None and any(a.startswith("--query-gpu=") for a in query), query
    gpus = subprocess.run([smi, *query], capture_output=True, text=True, check=True, timeout=30).stdout
    assert len(gpus.splitlines()) == int(CLUSTER["GPUS_PER_NODE"]) and gpus in out, out


def test_the_proxies_forward_on_an_address_no_interface_holds_is_an_error_in_the_pod_log(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    """A pod whose POD_IP no interface holds (a render cannot express it: the kubelet's POD_IP is the pod network's
    address): forward.py refuses to listen unbound, and the pod log says so in one ERROR line naming the address and
    the ports; the script still reaches its ready file (no crash loop; the proxies' readiness probes keep the pod
    unready). On a pod (podsim) the forward binds the interface that holds the pod IP: tests/podsim/test_reach.py."""
    bin_dir, _ = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-1", POD_IP="192.0.2.77", **{pod_contract.PROXY_PORTS_ENV: "18080 18888"})
    env["PATH"] = f"{bin_dir}:{os.path.dirname(shutil.which('python3') or '/usr/bin/python3')}:/usr/bin:/bin"
    proc = start(env)
    try:
        wait_ready(proc, tmp_path / "state")
    finally:
        out = stop(proc)
    errors = [line for line in out.splitlines() if "ERROR" in line]
    assert errors == [
        "[ml-dev-env] ERROR: proxy-forward did not start: forward: 192.0.2.77: no interface of this pod holds this address; "
        "refusing to listen on it unbound (nothing answers on the pod IP's ports 192.0.2.77:18080 192.0.2.77:18888)"
    ], out
