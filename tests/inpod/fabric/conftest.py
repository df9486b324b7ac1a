"""The fabric check on pods started from the render (tests/podsim) with the node tools of tests/podsim/nodetools.py.

`fabric(n, stack=, mutate=)` gives a running set of n pods of a committed stack (barcelona: RDMA/SR-IOV; nerc-production:
TCP) or a variant; pods are kept for the module and every test starts from a healthy node and no gate result.
The real fabric_check.py runs in pod `host` through `oc exec`; between pods it uses the real sshd/ssh and the real
Open MPI mpirun; `settings=` hands it a changed copy of the rendered fabric.json (its ML_DEV_FABRIC_CONFIG).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from components import fabric as fabric_component
from stacks.config import StackConfig
from tests.conftest import stack_objects
from tests.inpod import mount
from tests.podsim.nodetools import Node
from tests.podsim.pods import PodSim, missing_requirements, render_stack

PROGRAM = mount.shipped() / fabric_component.PROGRAM_KEY  # the launcher, in the pod's layout
REASON = missing_requirements()


def needs_pods(test: Callable[..., None]) -> Callable[..., None]:
    """A test on simulated pods: marked `root` (CI's sudo pass runs it) and skipped when the simulation cannot run."""
    return pytest.mark.root(pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")(test))


OPT = "/opt/ml-dev-env"
WORKSPACE = "/workspace"
STATE = "/tmp/ml-dev-env"


def barcelona_settings(**fabric_check: Any) -> dict:
    """fabric.json as barcelona renders it (for tests of the program's pure parts)."""
    objects = stack_objects("barcelona")
    objects["fabricCheck"] = {**objects.get("fabricCheck", {}), **fabric_check}
    return fabric_component.pod_settings(StackConfig.model_validate(objects))


class Fabric:
    """n pods of one render with their node; the fabric check's program run in them."""

    def __init__(self, sim: PodSim, node: Node) -> None:
        self.sim, self.node = sim, node
        self.settings: dict = json.loads(next(c["fabric.json"] for c in sim.configmaps.values() if "fabric.json" in c))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.sim.pods]

    @property
    def hosts(self) -> list[str]:
        return [self.sim.fqdn(i) for i in range(self.sim.count)]

    def state(self, i: int) -> dict[str, Any]:
        return self.node.state(self.sim, i)

    def apply(self, *pods: int) -> None:
        for i in pods or range(self.sim.count):
            self.node.apply(self.sim, i)

    def command(self, *args: str, settings: dict | None = None, prefix: str = "") -> str:
        cmd = f"cd {WORKSPACE} && "
        if settings is not None:
            cmd += f"printf '%s' {shlex.quote(json.dumps(settings))} > /tmp/fabric-test.json && ML_DEV_FABRIC_CONFIG=/tmp/fabric-test.json "
        return cmd + f"exec {prefix}python3 {OPT}/fabric_check.py {shlex.join(args)}"

    def run(
        self, *args: str, host: int = 0, settings: dict | None = None, prefix: str = "", timeout: float = 240
    ) -> subprocess.CompletedProcess[str]:
        return self.sim.exec(host, self.command(*args, settings=settings, prefix=prefix), timeout=timeout)

    def start(self, *args: str, host: int = 0, settings: dict | None = None) -> subprocess.Popen[str]:
        return self.sim.popen(host, self.command(*args, settings=settings))

    def calls(self, tool: str) -> list[dict[str, Any]]:
        return self.node.calls(self.sim, tool)

    def result(self, host: int = 0, where: str = "workspace") -> dict:
        if where == "workspace":
            return json.loads(self.sim.records(host, "fabric/latest.json", WORKSPACE).read_text())
        return json.loads(self.sim.pods[host].path(f"{STATE}/fabric/latest.json").read_text())

    def reset(self) -> None:
        self.node.reset(self.sim)
        for i in range(self.sim.count):
            self.sim.exec(i, f"rm -rf {WORKSPACE}/.ml-dev-env {STATE}/fabric /tmp/fabric-test.json", timeout=60)


def start_fabric(stack: str, n: int, mutate: Callable[[dict], None] | None = None, **kw: Any) -> Fabric:
    def variant(objects: dict) -> None:
        objects["nodes"] = {**objects["nodes"], "count": n}
        if mutate:
            mutate(objects)

    node = Node()
    sim = PodSim(render_stack(stack, variant), count=n, node=node, **kw)
    sim.start()
    return Fabric(sim, node)


@pytest.fixture(scope="module")
def fabrics() -> Iterator[dict[Any, Fabric]]:
    started: dict[Any, Fabric] = {}
    try:
        yield started
    finally:
        for f in started.values():
            f.sim.stop()


@pytest.fixture
def fabric(fabrics: dict[Any, Fabric]) -> Callable[..., Fabric]:
    """fabric(n=2, stack="barcelona", mutate=None, key=None): the module's pods for that key, reset to healthy."""
    if REASON is not None:
        pytest.skip(f"simulated pods: {REASON}")

    def get(n: int = 2, stack: str = "barcelona", mutate: Callable[[dict], None] | None = None, key: str = "") -> Fabric:
        k = (stack, n, key)
        if k not in fabrics:
            fabrics[k] = start_fabric(stack, n, mutate)
        f = fabrics[k]
        f.reset()
        return f

    return get
