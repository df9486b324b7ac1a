"""The home page's environment on simulated pods built from the render (tests/podsim), shared by its tests.

* barcelona with the idle stop on, 2 pods (`HomePods`): startup.sh starts the idle agent on every pod and the
  page (`home` dev server: `home_page.py serve` on the pod IP and 127.0.0.1, port 8090, behind its OAuth proxy) on pod 0;
  the page finds the agents through rank.env and the stub cluster DNS, as on a cluster;
* the node behind the pods (tests/podsim/nodetools.py `Node`, bus bandwidth SLOW_BUSBW): the gate's REAL
  `mpirun` starts the all_reduce_perf stubs on both pods over the pods' sshd, they print nccl-tests' report at a
  slow plateau, and the real `fabric_check.py gate` judges it, localises, and writes its JSON and curve (SVG);
* the node's `nvidia-smi` (the same `Node`) answers the idle agent's queries in the real `--format=csv` layout
  (header with units), GPU 0's utilisation set per pod (`gpu`);
* test speed: the idle settings' ConfigMap is edited before the pods start (a round a second, the warning
  after 1 s idle; the admin bounds of stacks/config.py keep a stack's own values at 15 s and more; no IDE
  probes, the IDEs are not in the simulated image); the page's own settings are the render's (its env adds
  nothing: it refreshes every 10 s, each `/fragment` from a round of the agents at most 5 s old).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import naming
from core.servers import DEV_SERVERS
from tests.podsim.nodetools import Node
from tests.podsim.pods import PodSim, render_stack

HERE = Path(__file__).resolve().parent
INJECTED = "<script>window.__xss = 1</script>"
HOME_PORT = next(s.port for s in DEV_SERVERS if s.name == "home")  # where it listens, behind its OAuth proxy
SLOW_BUSBW = 60.0  # GB/s at the plateau, far below barcelona's pass line (175.1 GB/s): the gate fails
FAST_BUSBW = 197.0  # an H100 node pair's plateau over RoCE, above the pass line: the gate passes
STATE = "/tmp/ml-dev-env"
PROJECT = "/workspace/proj"


def idle_stop_on(objects: dict[str, Any]) -> None:
    objects["lifecycle"] = {**objects.get("lifecycle", {}), "idleStop": {"enabled": True}}


class HomePods(PodSim):
    """PodSim of barcelona (idle stop on, the idle agent's round each second): the pods' env is the render's."""

    def __init__(self, count: int = 2, busbw: float = SLOW_BUSBW) -> None:
        super().__init__(render_stack("barcelona", idle_stop_on), count=count, node=Node(busbw=busbw))
        settings = naming.lifecycle_configmap(self.app)
        idle = json.loads(self.configmaps[settings]["idle.json"])
        # the IDE servers are not in the simulated image (this machine's root): their probes would fail, which counts
        # as activity (inpod/idle/probes.py guarded), so the agent leaves them out here
        idle.update(intervalSeconds=1, warningLeadSeconds=idle["idleTimeoutSeconds"] - 1, servers=[])
        self.configmaps[settings]["idle.json"] = json.dumps(idle)

    def start(self, timeout: float = 90, wait: bool = True) -> HomePods:
        super().start(timeout, wait)
        try:
            self.write(0, f"{PROJECT}/train.py", "import time\ntime.sleep(300)\n")
            self.wait_for(0, f"{STATE}/home.addr")
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for(self, index: int, path: str, timeout: float = 30) -> str:
        target = self.pods[index].path(path)
        deadline = time.monotonic() + timeout
        while not (target.exists() and target.read_text().strip()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} never appeared on pod {index}: {self.log_of(index, 'home')}")
            time.sleep(0.1)
        return target.read_text().strip()

    def log_of(self, index: int, name: str) -> str:
        try:
            return self.pods[index].path(f"{STATE}/logs/{name}.log").read_text()
        except OSError:
            return f"(no {name} log)"

    def gate(self, passes: bool = False) -> dict[str, Any]:
        """The real fabric gate on pod 0 (`oc exec`), as `fabric_check.py gate` runs there; its latest.json."""
        res = self.exec(0, "python3 /opt/ml-dev-env/fabric_check.py gate", timeout=120)
        assert res.returncode == (0 if passes else 1), res.stdout + res.stderr
        return json.loads(self.records(0, "fabric/latest.json").read_text())

    def restart_page(self, between: Callable[[], object] | None = None) -> Any:
        """The page's server on pod 0 stopped and started again on the loopback (as the OAuth proxy reaches it);
        `between` runs while it is stopped."""
        ps = self.exec(0, "ps -o pid=,args= -e").stdout
        (pid,) = [line.split()[0] for line in ps.splitlines() if "home_page.py serve" in line]
        assert self.exec(0, f"kill {pid}").returncode == 0
        addr = self.pods[0].path(f"{STATE}/home.addr")
        deadline = time.monotonic() + 30
        while pid in self.exec(0, "ps -o pid= -e").stdout.split():
            assert time.monotonic() < deadline, f"the page's server {pid} did not stop"
            time.sleep(0.1)
        addr.unlink(missing_ok=True)
        if between is not None:
            between()
        proc = self.popen(0, f"exec python3 /opt/ml-dev-env/home_page.py serve --listen 127.0.0.1:{HOME_PORT}")
        self.wait_for(0, f"{STATE}/home.addr")
        return proc

    def gpu(self, index: int, util: int) -> None:
        """GPU 0 of pod `index` at `util` % (the node's nvidia-smi, tests/podsim/nodetools.py)."""
        self.node.gpu_util(self, index, util)

    def run(self, *argv: str) -> Any:
        """`ml-dev run -- argv...` started from pod 0's project directory (a terminal's `oc exec`)."""
        return self.popen(0, f"exec python3 /opt/ml-dev-env/ml-dev run -- {shlex.join(argv)}", cwd=PROJECT)
