"""Run the real startup script with stub binaries, as pod 0 and as a worker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from components.pod import STARTUP_SCRIPT
from core import naming

SERVERS = ("code-server", "jupyter", "tensorboard")
STUBS = {
    # dev servers: record PID, argv and environment, then stay up like a server (exec keeps the PID)
    **{
        name: f'out="$(dirname "$0")/../{name}"; echo $$ > "$out.pid"; env | sort > "$out.env.tmp" && mv "$out.env.tmp" "$out.env"\n'
        "exec sleep 60"
        for name in SERVERS
    },
    "nvidia-smi": 'echo "0, NVIDIA H100 80GB HBM3, 81559 MiB"',
    "ibv_devinfo": r'printf "4 HCAs found:\n\tmlx5_7\n\tmlx5_6\n\tmlx5_9\n\tmlx5_8\n"',
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
RANK_KEYS = (
    "ML_DEV_POD",
    "NODE_RANK",
    "NNODES",
    "GPUS_PER_NODE",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "DEEPSPEED_HOSTFILE",
    "ML_DEV_HOSTS",
    "ML_DEV_PODS",
)


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


def expected_rank(pod: str, hostfile: Path, nnodes: int = 2, gpus: int = 4) -> dict[str, str]:
    """The rank contract for `pod`, built from the naming helpers the Pulumi program uses."""
    rank, master = str(int(pod.rsplit("-", 1)[1])), naming.pod_dns(APP, NAMESPACE, 0)
    return {
        "ML_DEV_POD": pod,
        "NODE_RANK": rank,
        "NNODES": str(nnodes),
        "GPUS_PER_NODE": str(gpus),
        "WORLD_SIZE": str(nnodes * gpus),
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
        "PET_NNODES": str(nnodes),
        "PET_NODE_RANK": rank,
        "PET_NPROC_PER_NODE": str(gpus),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": "29500",
        "DEEPSPEED_HOSTFILE": str(hostfile),
        "ML_DEV_HOSTS": " ".join(naming.pod_dns(APP, NAMESPACE, i) for i in range(nnodes)),
        "ML_DEV_PODS": " ".join(naming.pod_names(APP, nnodes)),
    }


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


def recorded_env(path: Path) -> dict[str, str]:
    """The environment a server stub recorded (`env | sort`)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def world_readable_copy() -> tuple[Path, Path, Path]:
    """Script and stubs in a fresh world-readable directory: a dropped-privilege process cannot read a
    checkout inside a mode-700 directory. Returns (directory, script, stub bin dir)."""
    tmp = Path(tempfile.mkdtemp(prefix="ml-dev-env-startup-"))
    tmp.chmod(0o755)
    script = tmp / "startup.sh"
    shutil.copyfile(STARTUP_SCRIPT, script)
    script.chmod(0o755)
    bin_dir, _ = make_stubs(tmp)
    return tmp, script, bin_dir


def test_pod0_computes_rank_writes_hostfile_and_starts_servers_on_loopback(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, calls = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-0")
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    lines = wait_for_calls(calls, 4)
    assert wait_until(lambda: all((tmp_path / f"{name}.env").exists() for name in SERVERS), timeout=5)
    out = stop(proc)

    hostfile = tmp_path / "workspace" / ".deepspeed" / "hostfile"
    assert hostfile.read_text() == naming.hostfile(APP, NAMESPACE, 2, 4)
    assert hostfile.read_text().splitlines()[1] == "ml-dev-env-1.ml-dev-env-headless.nccl-test.svc.cluster.local slots=4"
    assert rank_env(tmp_path / "state") == expected_rank("ml-dev-env-0", hostfile)
    servers = {line.split()[0]: line for line in lines if not line.startswith("nvidia-smi")}
    assert set(servers) == {"code-server", "jupyter", "tensorboard"}
    assert "--bind-addr 127.0.0.1:8080 --auth none" in servers["code-server"]
    assert "lab --no-browser --allow-root --ip=127.0.0.1 --port=8888" in servers["jupyter"]
    assert "--host 127.0.0.1 --port 6006" in servers["tensorboard"]
    # the servers start without the rank values (kernels and terminals read rank.env when they start)
    for name in SERVERS:
        server_env = recorded_env(tmp_path / f"{name}.env")
        assert not set(RANK_KEYS) & set(server_env), name
        assert server_env["ML_DEV_STATE_DIR"] == str(tmp_path / "state") and server_env["NCCL_IB_HCA"], name
    env_sh = sourced(tmp_path / "state" / "env.sh")
    assert env_sh["NCCL_IB_HCA"] == "mlx5_6,mlx5_7,mlx5_8,mlx5_9" and env_sh["NODE_RANK"] == "0"
    assert "NODE_RANK=0 of NNODES=2" in out
    # the servers were stopped with the pod
    pids = [int((tmp_path / f"{name}.pid").read_text()) for name in SERVERS]
    assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10), pids


def test_worker_starts_no_dev_servers(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, calls = stubs
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-1"))
    wait_ready(proc, tmp_path / "state")
    out = stop(proc)
    assert [line for line in calls.read_text().splitlines() if not line.startswith("nvidia-smi")] == []
    assert "worker pod: no dev servers" in out
    assert "NODE_RANK=1 of NNODES=2" in out
    hostfile = tmp_path / "workspace" / ".deepspeed" / "hostfile"
    assert hostfile.read_text() == naming.hostfile(APP, NAMESPACE, 2, 4)
    assert rank_env(tmp_path / "state") == expected_rank("ml-dev-env-1", hostfile)


def test_count_change_rewrites_rank_files_in_place_without_restarting(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    """nodes.count 2 → 3 → 2 changes only cluster.env: the running script rewrites rank.env and the
    hostfile, keeps running, and does not restart the dev servers."""
    bin_dir, calls = stubs
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-0"))
    state, hostfile = tmp_path / "state", tmp_path / "workspace" / ".deepspeed" / "hostfile"
    wait_ready(proc, state)
    servers_before = [line for line in wait_for_calls(calls, 4) if not line.startswith("nvidia-smi")]
    assert len(servers_before) == 3

    write_cluster_env(tmp_path / "cluster", NNODES="3")
    assert wait_until(lambda: rank_env(state).get("NNODES") == "3"), rank_env(state)
    assert rank_env(state) == expected_rank("ml-dev-env-0", hostfile, nnodes=3)
    assert hostfile.read_text() == naming.hostfile(APP, NAMESPACE, 3, 4)
    assert proc.poll() is None, "the startup script must keep running"

    write_cluster_env(tmp_path / "cluster", NNODES="2")
    assert wait_until(lambda: rank_env(state).get("NNODES") == "2"), rank_env(state)
    assert hostfile.read_text() == naming.hostfile(APP, NAMESPACE, 2, 4)
    out = stop(proc)
    assert [line for line in calls.read_text().splitlines() if not line.startswith("nvidia-smi")] == servers_before
    assert out.count("cluster.env changed") == 2 and "NODE_RANK=0 of NNODES=3" in out


def test_pod_outside_the_count_waits_for_the_configmap(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    """A scale-up pod that reads the old count (or a pod about to be removed) warns and stays up."""
    bin_dir, _ = stubs
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-2"))
    state = tmp_path / "state"
    wait_ready(proc, state)
    assert not (state / "rank.env").exists()
    write_cluster_env(tmp_path / "cluster", NNODES="3")
    assert wait_until(lambda: (state / "rank.env").exists() and rank_env(state).get("NODE_RANK") == "2")
    out = stop(proc)
    assert "WARNING: pod ml-dev-env-2 is not one of the NNODES=2 pods" in out
    assert rank_env(state) == expected_rank("ml-dev-env-2", tmp_path / "workspace" / ".deepspeed" / "hostfile", nnodes=3)


def test_home_is_persistent_per_pod_and_shells_see_the_rank(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, _ = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-0")
    home = Path(env["ML_DEV_HOME"])
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    assert wait_until(lambda: (tmp_path / "code-server.env").exists(), timeout=5)
    stop(proc)
    assert home.is_dir() and (home.stat().st_mode & 0o777) == 0o700
    # the servers keep their caches and state in HOME
    server_env = dict(line.split("=", 1) for line in (tmp_path / "code-server.env").read_text().splitlines() if "=" in line)
    assert server_env["HOME"] == str(home)
    for key in (
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "PIP_CACHE_DIR",
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_DATA_DIR",
        "HISTFILE",
    ):
        assert server_env[key].startswith(f"{home}/"), key
    args = next(line for line in (tmp_path / "calls.log").read_text().splitlines() if line.startswith("code-server"))
    assert f"--user-data-dir {home}/.local/share/code-server --extensions-dir {home}/.local/share/code-server/extensions" in args

    # what a user put in HOME survives a container restart (the script runs again on the same volume)
    (home / ".local" / "lib").mkdir(parents=True, exist_ok=True)
    (home / ".local" / "lib" / "installed-with-pip-user").write_text("kept")
    shutil.rmtree(tmp_path / "state")  # a restarted container has a fresh /tmp
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    stop(proc)
    assert (home / ".local" / "lib" / "installed-with-pip-user").read_text() == "kept"
    for rc in (".bashrc", ".profile"):
        assert sum("ml-dev-env: rank.env" in line for line in (home / rc).read_text().splitlines()) == 1, rc

    # login shells (ssh, `bash -l`), interactive shells (IDE terminals) and `oc rsh`'s /bin/sh ($ENV) see rank.env
    shell_env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    rsh_env = {"PATH": "/usr/bin:/bin", "ENV": str(tmp_path / "state" / "env.sh")}
    for argv, with_env in (
        (["bash", "-lc", "env -0"], shell_env),
        (["bash", "-ic", "env -0"], shell_env),
        (["sh", "-ic", "env -0"], rsh_env),
    ):
        seen = sourced(Path(), shell=argv, env=with_env)
        assert (seen.get("NODE_RANK"), seen.get("WORLD_SIZE"), seen.get("MASTER_ADDR")) == ("0", "8", naming.pod_dns(APP, NAMESPACE, 0)), (
            argv
        )
        assert seen["HOME"] == str(home) and f"{home}/.local/bin" in seen["PATH"].split(":"), argv


def test_token_mode_binds_the_pod_ip_with_auth(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, calls = stubs
    env = base_env(
        tmp_path,
        bin_dir,
        "ml-dev-env-0",
        ML_DEV_AUTH="token",
        ML_DEV_SERVERS="vscode jupyter",
        PASSWORD="pw",
        JUPYTER_TOKEN="tok",
        POD_IP="10.131.0.7",
    )
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    lines = wait_for_calls(calls, 3)
    stop(proc)
    servers = {line.split()[0]: line for line in lines if not line.startswith("nvidia-smi")}
    assert "--bind-addr 10.131.0.7:8080 --auth password" in servers["code-server"]
    assert "--ip=10.131.0.7 " in servers["jupyter"] and "--IdentityProvider.token=tok" in servers["jupyter"]


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
    assert sourced(tmp_path / "state" / "rank.env")["NCCL_IB_HCA"] == "mlx5_6,mlx5_7,mlx5_8,mlx5_9"
    assert "HCAs found" not in (tmp_path / "state" / "env.sh").read_text()


def test_bad_pod_name_is_a_clear_error(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    bin_dir, _ = stubs
    proc = start(base_env(tmp_path, bin_dir, "ml-dev-env-x"))
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 1 and "cannot derive the StatefulSet ordinal from pod name 'ml-dev-env-x'" in out


NEEDS_SETPRIV = pytest.mark.skipif(
    not (shutil.which("prlimit") and shutil.which("setpriv")) or os.geteuid() != 0,
    reason="needs root with util-linux prlimit/setpriv to drop privileges",
)
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]


@NEEDS_SETPRIV
def test_refused_memlock_cannot_kill_the_pod() -> None:
    """memlock 'scc' on a pod whose SCC grant is missing: `ulimit -l unlimited` fails, the pod still starts."""
    tmp_path, script, bin_dir = world_readable_copy()
    try:
        run_dir = tmp_path / "run"  # writable by the unprivileged user
        run_dir.mkdir(mode=0o777)
        run_dir.chmod(0o777)
        env = base_env(run_dir, bin_dir, "ml-dev-env-1", ML_DEV_MEMLOCK="scc")
        proc = start(env, ["prlimit", "--memlock=65536:65536", *AS_NOBODY], script=script, cwd=tmp_path)
        wait_ready(proc, run_dir / "state")
        out = stop(proc)
    finally:
        shutil.rmtree(tmp_path)
    assert "WARNING: could not raise memlock (now 64 KiB)" in out
    assert "ready" in out


def unwritable_warnings(pod: str, workspace: Path) -> list[str]:
    warnings = [f"WARNING: cannot write {workspace}/.deepspeed/hostfile", f"WARNING: cannot create or write HOME {workspace}/.home/{pod}"]
    if pod.endswith("-0"):
        warnings.append(f"WARNING: cannot create {workspace}/tensorboard")
    return warnings


@pytest.mark.parametrize("pod", ["ml-dev-env-0", "ml-dev-env-1"])
def test_unwritable_workspace_does_not_kill_the_pod(tmp_path: Path, stubs: tuple[Path, Path], pod: str) -> None:
    """A file where the workspace should be: unwritable even for root. Every use degrades with a warning."""
    bin_dir, _ = stubs
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the workspace should be")
    env = base_env(
        tmp_path,
        bin_dir,
        pod,
        ML_DEV_WORKSPACE=str(blocked),
        ML_DEV_HOME=f"{blocked}/.home/{pod}",
        TENSORBOARD_LOGDIR=f"{blocked}/tensorboard",
    )
    proc = start(env)
    wait_ready(proc, tmp_path / "state")
    out = stop(proc)
    for warning in unwritable_warnings(pod, blocked):
        assert warning in out
    state = tmp_path / "state"
    assert (state / "hostfile").read_text() == naming.hostfile(APP, NAMESPACE, 2, 4)
    assert rank_env(state) == expected_rank(pod, state / "hostfile")
    assert sourced(state / "env.sh")["HOME"] == str(state / "home")


@NEEDS_SETPRIV
@pytest.mark.parametrize("pod", ["ml-dev-env-0", "ml-dev-env-1"])
def test_random_uid_with_read_only_workspace_reaches_ready(pod: str) -> None:
    """OpenShift's arbitrary UID on a workspace it cannot write (NFS owned by someone else)."""
    tmp_path, script, bin_dir = world_readable_copy()
    try:
        workspace = tmp_path / "workspace"  # root-owned, mode 755: read-only for UID 65534
        workspace.mkdir()
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        run_dir.chmod(0o777)
        env = base_env(
            run_dir,
            bin_dir,
            pod,
            ML_DEV_WORKSPACE=str(workspace),
            ML_DEV_HOME=f"{workspace}/.home/{pod}",
            TENSORBOARD_LOGDIR=f"{workspace}/tensorboard",
        )
        proc = start(env, AS_NOBODY, script=script, cwd=tmp_path)
        state = run_dir / "state"
        wait_ready(proc, state)
        started = [line.split()[0] for line in wait_for_calls(tmp_path / "calls.log", 4 if pod.endswith("-0") else 1)]
        out = stop(proc)
        for warning in unwritable_warnings(pod, workspace):
            assert warning in out
        assert "ready" in out
        assert rank_env(state) == expected_rank(pod, state / "hostfile")
        assert state.stat().st_uid == 65534 and (state / "home").is_dir()
        assert sorted(set(started) - {"nvidia-smi"}) == (sorted(SERVERS) if pod.endswith("-0") else [])
    finally:
        shutil.rmtree(tmp_path)


def test_kernels_and_terminals_started_after_a_count_change_see_the_new_values(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    """The Jupyter server keeps its start-time environment; a kernel inherits it (also on restart) and then runs
    the IPython startup file, which loads the current rank.env. A terminal is bash: .bashrc -> env.sh -> rank.env."""
    bin_dir, _ = stubs
    env = base_env(tmp_path, bin_dir, "ml-dev-env-0")
    state, hostfile = tmp_path / "state", tmp_path / "workspace" / ".deepspeed" / "hostfile"
    proc = start(env)
    wait_ready(proc, state)
    assert wait_until(lambda: (tmp_path / "jupyter.env").exists(), timeout=5)
    write_cluster_env(tmp_path / "cluster", NNODES="3")
    assert wait_until(lambda: rank_env(state).get("NNODES") == "3"), rank_env(state)
    stop(proc)

    server_env = recorded_env(tmp_path / "jupyter.env")  # what the server hands to every kernel and terminal
    assert "NNODES" not in server_env
    startup = Path(server_env["IPYTHONDIR"]) / "profile_default" / "startup" / "00-ml-dev-env-rank.py"
    kernel = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, os, runpy, sys; runpy.run_path(sys.argv[1]); print(json.dumps(dict(os.environ)))",
            str(startup),
        ],
        env=server_env,
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(kernel.stdout)
    assert {k: seen.get(k) for k in RANK_KEYS} == expected_rank("ml-dev-env-0", hostfile, nnodes=3)
    terminal = sourced(Path(), shell=["bash", "-ic", "env -0"], env=server_env)
    assert {k: terminal.get(k) for k in RANK_KEYS} == expected_rank("ml-dev-env-0", hostfile, nnodes=3)


def test_ready_is_logged_before_the_ready_file(tmp_path: Path, stubs: tuple[Path, Path]) -> None:
    """Whoever sees the ready file (a test, a probe) and then stops the pod must find "ready" in the log."""
    bin_dir, _ = stubs
    log = tmp_path / "pod.log"
    checked = tmp_path / "touch-checked"
    touch = bin_dir / "touch"
    touch.write_text(f'#!/bin/bash\ngrep -qxF "[ml-dev-env] ready" "{log}" && echo logged > "{checked}"\nexec /usr/bin/touch "$@"\n')
    touch.chmod(0o755)
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", str(STARTUP_SCRIPT)], env=base_env(tmp_path, bin_dir, "ml-dev-env-1"), stdout=out, stderr=subprocess.STDOUT
        )
        try:
            assert wait_until(lambda: (tmp_path / "state" / "ready").exists(), timeout=15), log.read_text()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    assert checked.read_text().strip() == "logged", log.read_text()


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
    assert (tmp_path / "workspace" / ".deepspeed" / "hostfile").read_text() == naming.hostfile(APP, NAMESPACE, 2, 4)


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="root ignores mode 555; root runners cover this in test_random_uid_with_read_only_workspace_reaches_ready (UID 65534)",
)
@pytest.mark.parametrize("pod", ["ml-dev-env-0", "ml-dev-env-1"])
def test_read_only_workspace_as_non_root(tmp_path: Path, stubs: tuple[Path, Path], pod: str) -> None:
    """A workspace this (non-root) UID cannot write, as on NFS owned by someone else: warnings, ready."""
    bin_dir, _ = stubs
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    workspace.chmod(0o555)
    try:
        env = base_env(tmp_path, bin_dir, pod, TENSORBOARD_LOGDIR=f"{workspace}/tensorboard")
        proc = start(env)
        state = tmp_path / "state"
        wait_ready(proc, state)
        out = stop(proc)
    finally:
        workspace.chmod(0o755)
    for warning in unwritable_warnings(pod, workspace):
        assert warning in out
    assert rank_env(state) == expected_rank(pod, state / "hostfile")
    assert sourced(state / "env.sh")["HOME"] == str(state / "home")
