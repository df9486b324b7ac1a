"""Rack-aware ranks: consecutive ranks share a rack, pod 0 stays rank 0, placement read from the API (a stub API
server on the simulated pod network; the programs run in pods started from the render)."""

from __future__ import annotations

import ctypes
import json
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from inpod.fabric import util as fabric_util
from tests.conftest import run_objects, stack_objects
from tests.inpod.fabric.conftest import Fabric, needs_pods
from tests.inpod.fabric.test_gate import fc
from tests.podsim.nodetools import Node
from tests.podsim.pods import GATEWAY, PodSim, render_stack

PODS = [f"ml-dev-env-{i}" for i in range(6)]
RACKS = {"n-a1": "rack-a", "n-a2": "rack-a", "n-a3": "rack-a", "n-b1": "rack-b", "n-b2": "rack-b", "n-b3": "rack-b"}
# what the scheduler did: interleaved across racks
PLACED = {
    "ml-dev-env-0": "n-a1",
    "ml-dev-env-1": "n-b1",
    "ml-dev-env-2": "n-a2",
    "ml-dev-env-3": "n-b2",
    "ml-dev-env-4": "n-a3",
    "ml-dev-env-5": "n-b3",
}


def cross_rack_hops(order: list[str], placed: dict[str, str]) -> int:
    ring = [RACKS[placed[p]] for p in order]
    return sum(ring[i] != ring[(i + 1) % len(ring)] for i in range(len(ring)))


def test_interleaved_placement_is_regrouped_by_rack():
    order = fc.rack_order(PODS, PLACED, RACKS)
    assert order == ["ml-dev-env-0", "ml-dev-env-2", "ml-dev-env-4", "ml-dev-env-1", "ml-dev-env-3", "ml-dev-env-5"]
    assert cross_rack_hops(PODS, PLACED) == 6 and cross_rack_hops(order, PLACED) == 2  # the ring enters/leaves each rack once


def test_pod_0_stays_rank_0_and_its_rack_comes_first():
    placed = dict(PLACED, **{"ml-dev-env-0": "n-b1", "ml-dev-env-1": "n-a1"})
    order = fc.rack_order(PODS, placed, RACKS)
    assert order[0] == "ml-dev-env-0"
    assert [RACKS[placed[p]] for p in order] == ["rack-b"] * 3 + ["rack-a"] * 3


def test_unknown_nodes_rank_last_by_ordinal_and_no_racks_means_ordinals():
    placed = {"ml-dev-env-0": "n-a1", "ml-dev-env-1": None, "ml-dev-env-2": "n-b1", "ml-dev-env-3": "elsewhere"}
    assert fc.rack_order(PODS[:4], placed, RACKS) == ["ml-dev-env-0", "ml-dev-env-2", "ml-dev-env-1", "ml-dev-env-3"]
    assert fc.rack_order(PODS, PLACED, {}) == PODS


class FakeApi(BaseHTTPRequestHandler):
    items: ClassVar[list[dict]] = []
    seen: ClassVar[list[tuple[str, str]]] = []
    status: ClassVar[list[int]] = [200]

    def do_GET(self) -> None:
        FakeApi.seen.append((self.path, self.headers.get("Authorization", "")))
        if FakeApi.status[0] == 403:  # what the API server answers a service account without the Role
            body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}).encode()
        else:
            body = json.dumps({"kind": "PodList", "items": FakeApi.items}).encode()
        self.send_response(FakeApi.status[0])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


API_PORT = 6443  # the API server's port; fixed, as nothing else listens in the simulation's own namespace


@contextmanager
def api_in_the_cluster(sim: PodSim, started: bool = True) -> Iterator[str]:
    """The stub API server (FakeApi) on the pod network's gateway address, in the simulation's own network namespace
    (a thread that joins it and serves there): pods reach it over eth0, nothing outside the namespace can.
    `started=False`: the simulation is about to start; the server binds as soon as its network namespace exists
    (before the first pod starts: PodSim.start makes the network first)."""
    box: dict[str, HTTPServer] = {}
    ready = threading.Event()
    url = f"http://{GATEWAY}:{API_PORT}"

    def serve() -> None:
        deadline = time.monotonic() + 60
        while not Path(f"/run/netns/{sim.cluster_ns}").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/run/netns/{sim.cluster_ns}") as f:
            if libc.setns(f.fileno(), 0x40000000):  # CLONE_NEWNET, this thread only
                raise OSError(ctypes.get_errno(), "setns")
        while True:  # the gateway address is added to the bridge just after the namespace is made
            try:
                box["server"] = HTTPServer((GATEWAY, API_PORT), FakeApi)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        ready.set()
        box["server"].serve_forever()

    FakeApi.seen.clear()
    FakeApi.status[:] = [200]
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert not started or ready.wait(10), "the stub API server did not start"
    try:
        yield url
    finally:
        if ready.wait(10):
            box["server"].shutdown()
            box["server"].server_close()
        thread.join(10)


def rank_order_in_pod(f: Fabric, api: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = f"ML_DEV_KUBE_API={api}"
    return f.sim.exec(0, f"{env} python3 /opt/ml-dev-env/fabric_check.py {shlex.join(extra)}", timeout=60)


def test_rank_order_command_reads_spec_node_name_from_the_api(fabric, tmp_path: Path) -> None:
    f: Fabric = fabric(2)
    FakeApi.items = [{"metadata": {"name": p}, "spec": {"nodeName": n}} for p, n in PLACED.items()]
    with api_in_the_cluster(f.sim) as api:
        f.sim.write(0, "/tmp/racks.json", json.dumps({**f.settings, "nodeRacks": RACKS}))
        res = rank_order_in_pod(f, api, "--config", "/tmp/racks.json", "rank-order", "--pods", " ".join(PODS), "--from-api")
        seen = list(FakeApi.seen)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ml-dev-env-0", "ml-dev-env-2", "ml-dev-env-4", "ml-dev-env-1", "ml-dev-env-3", "ml-dev-env-5"]
    path, auth = seen[0]
    assert path.startswith("/api/v1/namespaces/nccl-test/pods?labelSelector=")
    # the pod's own service-account token (the kubelet's projected volume)
    assert "app.kubernetes.io%2Finstance%3Dml-dev-env" in path and auth == "Bearer test-service-account-token"


def test_rank_order_command_falls_back_to_ordinals_without_api_access(fabric) -> None:
    f: Fabric = fabric(2)
    with api_in_the_cluster(f.sim) as api:
        FakeApi.status[:] = [403]
        f.sim.write(0, "/tmp/racks.json", json.dumps({**f.settings, "nodeRacks": RACKS}))
        res = rank_order_in_pod(f, api, "--config", "/tmp/racks.json", "rank-order", "--pods", " ".join(PODS), "--from-api")
    assert res.returncode == 0 and res.stdout.split() == PODS
    assert "cannot read pod placement (HTTP Error 403: Forbidden)" in res.stderr


def test_node_racks_add_a_pod_reader_role_for_the_service_account():
    objects = stack_objects("barcelona")
    nodes = objects["nodes"]["gpuNodes"]
    objects["fabricCheck"]["nodeRacks"] = {n: ("r2" if i < 3 else "r4") for i, n in enumerate(nodes)}
    result = run_objects("barcelona", objects)
    assert result.error is None, result.error
    role = next(r for r in result.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role") if r.name.endswith("-pod-reader"))
    assert role.inputs["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    binding = next(r for r in result.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding") if r.name.endswith("-pod-reader"))
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "ml-dev-sa", "namespace": "nccl-test"}]
    assert binding.inputs["roleRef"]["name"] == role.inputs["metadata"]["name"] == "ml-dev-env-pod-reader"
    plain = run_objects("barcelona", stack_objects("barcelona"))
    assert not [r for r in plain.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role") if r.name.endswith("-pod-reader")]


def rank_order_sh(f: Fabric, api: str, settings: dict, *pods: str, path: str = "") -> subprocess.CompletedProcess[str]:
    """Source rank_order.sh from a copy of the ConfigMap directory (its fabric.json replaced) in pod 0 and call it,
    as the startup script does."""
    f.sim.exec(0, "rm -rf /tmp/opt && mkdir /tmp/opt && cp -rL /opt/ml-dev-env/* /tmp/opt/", timeout=60)
    f.sim.write(0, "/tmp/opt/fabric.json", json.dumps(settings))
    script = '. /tmp/opt/rank_order.sh; read -r -a RANK_PODS <<<"$(ml_dev_rank_order nccl-test "$@")"; echo "${RANK_PODS[*]}"'
    prefix = f"PATH={path} " if path else ""
    return f.sim.exec(0, f"ML_DEV_KUBE_API={api} {prefix}/bin/bash -c {shlex.quote(script)} sh {shlex.join(pods)}", timeout=60)


def test_rank_order_shell_function_for_the_startup_script(fabric) -> None:
    f: Fabric = fabric(2)
    FakeApi.items = [{"metadata": {"name": p}, "spec": {"nodeName": n}} for p, n in PLACED.items()]
    with api_in_the_cluster(f.sim) as api:
        plain = rank_order_sh(f, api, f.settings, *PODS)
        assert plain.stdout.split() == PODS and FakeApi.seen == [], "no nodeRacks: ordinals, no API call"
        racked = rank_order_sh(f, api, {**f.settings, "nodeRacks": RACKS}, *PODS)
        assert racked.stdout.split() == fc.rack_order(PODS, PLACED, RACKS) != PODS
        FakeApi.items = FakeApi.items[:3]  # pods 3..5 not scheduled yet: they rank last until they are
        partial = rank_order_sh(f, api, {**f.settings, "nodeRacks": RACKS}, *PODS)
        assert partial.stdout.split() == ["ml-dev-env-0", "ml-dev-env-2", "ml-dev-env-1", "ml-dev-env-3", "ml-dev-env-4", "ml-dev-env-5"]
        assert "node of ml-dev-env-3, ml-dev-env-4, ml-dev-env-5 not known yet" in partial.stderr
        assert rank_order_sh(f, api, {**f.settings, "nodeRacks": RACKS}, *PODS, path="/nonexistent").stdout.split() == PODS


@needs_pods
@pytest.mark.timeout(300)
def test_startup_script_writes_rack_aware_ranks_and_follows_placement() -> None:
    """Six pods of barcelona with fabricCheck.nodeRacks; the API places them interleaved across two racks. Every pod's
    startup writes the rack-aware order; when placement changes, the poll loop rewrites rank.env."""

    def racks(objects: dict) -> None:
        objects["nodes"] = {**objects["nodes"], "count": 6, "gpuNodes": sorted(RACKS)}
        objects["fabricCheck"] = {**objects.get("fabricCheck", {}), "nodeRacks": RACKS}

    FakeApi.items = [{"metadata": {"name": p}, "spec": {"nodeName": n}} for p, n in PLACED.items()]
    result = render_stack("barcelona", racks)
    sim = PodSim(result, count=6, node=Node())
    env = next(r.inputs for r in result.resources if r.kind == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"]
    try:
        with api_in_the_cluster(sim, started=False) as api:
            # where the API server is and how often the startup script polls (and asks for the rack order): set on the
            # container as `oc set env` would (the only changes to the render; the real API server is
            # https://$KUBERNETES_SERVICE_HOST)
            env += [
                {"name": "ML_DEV_KUBE_API", "value": api},
                {"name": "ML_DEV_POLL_SECONDS", "value": "0.2"},
                {"name": "ML_DEV_RACK_POLL_SECONDS", "value": "0"},
            ]
            sim.start()
            order = fc.rack_order(PODS, PLACED, RACKS)
            rank = fabric_util.read_rank_env(sim.pods[1].path("/tmp/ml-dev-env/rank.env"))
            assert FakeApi.seen, "the startup script asked the API"
            assert rank["ML_DEV_PODS"].split() == order and rank["NODE_RANK"] == str(order.index("ml-dev-env-1")) == "3"
            assert rank["MASTER_ADDR"].startswith("ml-dev-env-0."), "pod 0 stays rank 0"
            hostfile = sim.pods[1].path(rank["DEEPSPEED_HOSTFILE"]).read_text().split()
            assert [h.split(".")[0] for h in hostfile[::2]] == order == [h.split(".")[0] for h in rank["ML_DEV_HOSTS"].split()]
            # pods 1 and 2 swap nodes (rescheduled): the poll loop rewrites rank.env
            FakeApi.items = [
                {"metadata": {"name": p}, "spec": {"nodeName": n}}
                for p, n in dict(PLACED, **{"ml-dev-env-1": "n-a2", "ml-dev-env-2": "n-b1"}).items()
            ]
            deadline = time.monotonic() + 60
            while True:
                rank = fabric_util.read_rank_env(sim.pods[1].path("/tmp/ml-dev-env/rank.env"))
                if rank["NODE_RANK"] == "1" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert rank["ML_DEV_PODS"].split()[:3] == ["ml-dev-env-0", "ml-dev-env-1", "ml-dev-env-4"] and rank["NODE_RANK"] == "1"
            assert "pod placement changed the rack-aware rank order" in sim.pods[1].log.read_text()
    finally:
        sim.stop()
