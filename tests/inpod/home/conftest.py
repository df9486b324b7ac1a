"""The home page's server on simulated pods, fed only by the real programs that write its data.

* two `SimPod`s (tests/inpod/idle/conftest.py) each run the real idle agent (`idle_agent.py run`) on
  127.0.0.1 (port 0, address from `activity.addr`), with the stub `nvidia-smi` printing the real CSV;
* the fabric gate's result and curve come from the real `fabric_check.py gate` (barcelona's fabric.json from
  components/fabric.py), its `mpirun` a stub printing nccl-tests' report at a slow plateau (tests/inpod/home/pods.py
  MPIRUN), written where the gate writes them (the workspace's `.ml-dev-env/fabric/`);
* an `ml-dev run` record is written by ml-dev's own `Heartbeat` (inpod/ml_dev/launch.py), an SSH session record by the real
  `ssh-session.sh` (its ForceCommand), so the files have exactly the launcher's and the fabric's shape;
* the home page runs as a plain process (`home_page.py serve --listen 127.0.0.1:0`) with pod 0's state
  directory, `ML_DEV_HOME_AGENTS` naming the agents' loopback addresses (no cluster DNS here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from components import fabric
from inpod import contract
from stacks.config import StackConfig
from tests.conftest import ROOT, stack_objects
from tests.inpod import mount
from tests.inpod.home.pods import INJECTED, MPIRUN, NCCL, SLOW_BUSBW
from tests.inpod.idle.conftest import SimPod, write_settings

HOME_PAGE = mount.shipped() / "home_page.py"
__all__ = ["INJECTED", "Environment", "fabric_result", "load"]


def load(name: str, path: Path, **environ: str) -> ModuleType:
    """Import an in-pod program as the pod runs it (module-level settings read from the environment)."""
    saved = {k: os.environ.get(k) for k in environ}
    os.environ.update(environ)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_for(path: Path, proc: subprocess.Popen[Any], log: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared: {log.read_text()}")


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Environment:
    """Pods, their agents, a failed fabric gate and the home page, all on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root = root
        names = ["ml-dev-env-0", "ml-dev-env-1"]
        self.pods = [SimPod(root / "pods", i, names) for i in range(2)]
        # idle stop on, a one-hour timeout whose warning starts after 1 s idle: an idle environment shows its stop time
        self.settings = write_settings(root / "idle.json", idleTimeoutSeconds=3600, warningLeadSeconds=3599, intervalSeconds=1, servers=[])
        self.procs: list[subprocess.Popen[Any]] = []
        self.workspace = root / "workspace"
        self.workspace.mkdir()

    def start(self, program: Path = HOME_PAGE, pod_env: dict[str, str] | None = None) -> str:
        """Run the gate, the agents and the page; `program`/`pod_env`: the page as a pod would start it."""
        gate = self.gate()
        assert gate.returncode == 1, gate.stdout + gate.stderr
        for pod in reversed(self.pods):
            extra = {"NODE_NAME": f"gpu-node-{pod.index}"}
            if pod.index == 0:
                extra["ML_DEV_ACTIVITY_PEERS"] = f"{self.pods[1].name}={self.pods[1].address()}"
            pod.start(pod.env(self.settings, None, **extra))
            assert pod.proc is not None, f"{pod.name}: start() leaves its agent process"
            self.procs.append(pod.proc)
        agents = " ".join(f"{p.name}={p.address()}" for p in self.pods)
        pod0 = self.pods[0]
        env = {
            **(pod_env or {"APP_NAME": "ml-dev-env", "POD_NAMESPACE": "nccl-test"}),
            **pod0.env(self.settings, None),
            "ML_DEV_WORKSPACE": str(self.workspace),
            "ML_DEV_HOME_AGENTS": agents,
            "ML_DEV_HOME_INTERVAL": "1",
            "ML_DEV_HOME_REFRESH": "1",
        }
        self.page_program, self.page_env = program, env
        return self.start_page()

    def start_page(self) -> str:
        """The page's server (again: a restart keeps nothing but what it saved)."""
        self.log = self.root / "home.log"
        addr = self.pods[0].state / "home.addr"
        addr.unlink(missing_ok=True)
        with open(self.log, "a") as out:
            proc = subprocess.Popen(
                [sys.executable, str(self.page_program), "serve", "--listen", "127.0.0.1:0"],
                env=self.page_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self.page = proc
        self.url = "http://" + wait_for(addr, proc, self.log) + "/"
        return self.url

    def restart_page(self) -> str:
        stop(self.page)
        return self.start_page()

    def gate(self) -> subprocess.CompletedProcess[str]:
        """The real `fabric_check.py gate` on pod 0's rank.env: every all-reduce slow, so it fails (fabric-wide)."""
        config = self.root / "fabric.json"
        config.write_text(json.dumps(fabric.pod_settings(StackConfig.model_validate(stack_objects("barcelona")))))
        mpirun = self.root / "mpirun"
        mpirun.write_text(MPIRUN.replace("@NCCL@", str(NCCL)).replace("@BUSBW@", repr(SLOW_BUSBW)))
        mpirun.chmod(0o755)
        env = {
            "PATH": "/usr/bin:/bin",
            "POD_NAME": self.pods[0].name,
            "ML_DEV_STATE_DIR": str(self.pods[0].state),
            "ML_DEV_WORKSPACE": str(self.workspace),
            "ML_DEV_FABRIC_CONFIG": str(config),
            "ML_DEV_MPIRUN": str(mpirun),
        }
        return subprocess.run(
            [sys.executable, str(mount.shipped() / fabric.PROGRAM_KEY), "gate"], env=env, capture_output=True, text=True, timeout=120
        )

    def get(self, path: str = "") -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return response.read().decode()

    def busy(self) -> None:
        """GPU work on pod 0, a live `ml-dev run` whose command line carries a script, an SSH session."""
        self.pods[0].gpu(87)
        # Heartbeat lives in inpod/ml_dev/launch.py; loaded inside the inpod package so that its
        # sibling imports resolve, with the pod's state directory in place of the one read at import
        # (Any: a module loaded from its file, one of its globals set here)
        ml_dev: Any = load("inpod.ml_dev.launch_under_test", ROOT / "inpod" / "ml_dev" / "launch.py")
        ml_dev.STATE_DIR = self.pods[0].state
        self.heartbeat = ml_dev.Heartbeat("run", {"command": ["python", "train.py", INJECTED], "cwd": "/workspace/x", "pods": ["a", "b"]})
        self.heartbeat.__enter__()
        self.ssh_session(0, "<b>alice</b>", "10.128.2.7 50122 2222")

    def ssh_session(self, index: int, user: str, client: str, run: str = "") -> subprocess.Popen[Any]:
        """A live SSH session on pod `index` as sshd starts it: the real ForceCommand (ssh-session.sh) with the
        session's env (`run`: the ML_DEV_RUN an `ml-dev` launcher sends, AcceptEnv)."""
        sessions = self.pods[index].state / "ssh-sessions"
        sessions.mkdir(exist_ok=True)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.root),
            "ML_DEV_STATE_DIR": str(self.pods[index].state),
            "SSH_ORIGINAL_COMMAND": "exec sleep 120",
            "USER": user,
            "SSH_CLIENT": client,
            **({contract.RUN_ENV: run} if run else {}),
        }
        ssh = subprocess.Popen(["bash", str(mount.shipped() / "ssh-session.sh")], env=env)
        self.procs.append(ssh)
        deadline = time.monotonic() + 10
        while not (sessions / str(ssh.pid)).exists():
            assert time.monotonic() < deadline, "ssh-session.sh wrote no session record"
            time.sleep(0.05)
        return ssh

    def close(self) -> None:
        if getattr(self, "heartbeat", None) is not None:
            self.heartbeat.__exit__(None, None, None)
        for proc in self.procs:
            stop(proc)
        for pod in self.pods:
            pod.stop()


@pytest.fixture
def environment(tmp_path: Path) -> Iterator[Environment]:
    env = Environment(tmp_path)
    try:
        yield env
    finally:
        env.close()


def fabric_result(env: Environment) -> dict[str, Any]:
    return json.loads((env.workspace / ".ml-dev-env" / "fabric" / "latest.json").read_text())
