"""The home page's server on simulated pods started from the barcelona render (tests/inpod/home/pods.py `HomePods`),
fed only by the real programs that write its data.

* startup.sh starts the real idle agent on both pods and the page on pod 0 (127.0.0.1:8090, behind its OAuth
  proxy); the page finds the agents through rank.env and the cluster DNS; the node's `nvidia-smi`
  (tests/podsim/nodetools.py) prints the real CSV;
* the fabric gate's result and curve come from the real `fabric_check.py gate` on pod 0, the real `mpirun`
  starting the node's all_reduce_perf on both pods at a slow plateau (HomePods.gate), written where the gate
  writes them (the environment's records folder of the workspace, `.ml-dev-env/env/<app>/fabric/`);
* an `ml-dev run` record is written by a real `ml-dev run` on pod 0, an SSH session record by the real
  `ssh-session.sh` (its ForceCommand, run with the session's environment), so the files have exactly the
  launcher's and the fabric's shape;
* `get` reads the page on pod 0's loopback from inside the pod, where the OAuth proxy sidecar reaches it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.inpod.home.pods import HOME_PORT, INJECTED, STATE, HomePods
from tests.podsim.pods import leftovers, missing_requirements

__all__ = ["INJECTED", "Environment", "environment", "fabric_result", "load", "pods_required"]
REASON = missing_requirements()
pods_required = pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")
"""A test on simulated pods needs root and the machine's tools (with `pytest.mark.root`)."""
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"


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


class Environment:
    """HomePods started, the real fabric gate run on pod 0 (it fails: slow everywhere), and what a test does to them."""

    def __init__(self) -> None:
        self.pods = HomePods()
        self.procs: list[subprocess.Popen[str]] = []
        self.result: dict[str, Any] = {}

    def start(self) -> None:
        self.pods.start()
        self.result = self.pods.gate()

    def log(self) -> str:
        return self.pods.log_of(0, "home")

    def get(self, path: str = "") -> str:
        """GET on pod 0's loopback from inside the pod (where the OAuth proxy sidecar reaches the page)."""
        res = self.pods.exec(0, ["python3", "-c", FETCH, f"http://127.0.0.1:{HOME_PORT}/{path}"], timeout=30)
        assert res.returncode == 0, res.stderr + self.log()
        return res.stdout

    def busy(self) -> None:
        """GPU work on pod 0, a live `ml-dev run` whose command line carries a script, an SSH session."""
        self.pods.gpu(0, 87)
        self.procs.append(self.pods.run("python3", "train.py", INJECTED))
        # the SSH fabric's ForceCommand as sshd runs it for a session of user <b>alice</b> from 10.128.2.7
        session = {"SSH_ORIGINAL_COMMAND": "exec sleep 120", "USER": "<b>alice</b>", "SSH_CLIENT": "10.128.2.7 50122 2222"}
        ssh = self.pods.popen(0, "exec bash /opt/ml-dev-env/ssh-session.sh", env=session)
        self.procs.append(ssh)
        sessions = self.pods.pods[0].path(f"{STATE}/ssh-sessions")
        deadline = time.monotonic() + 30
        while not (sessions.is_dir() and any(sessions.iterdir())):
            assert time.monotonic() < deadline and ssh.poll() is None, "ssh-session.sh wrote no session record"
            time.sleep(0.1)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.pods.interrupt(proc)
                try:
                    proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate(timeout=30)
        self.pods.stop()


@pytest.fixture
def environment() -> Iterator[Environment]:
    env = Environment()
    try:
        env.start()
        yield env
    finally:
        env.close()
    assert not [x for x in leftovers() if env.pods.run_id in x], "the simulation left namespaces or directories behind"


def fabric_result(env: Environment) -> dict[str, Any]:
    """The gate's latest.json as pod 0's workspace holds it."""
    return dict(json.loads(env.pods.records(0, "fabric/latest.json").read_text()))
