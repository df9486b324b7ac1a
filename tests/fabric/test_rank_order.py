"""Rack-aware ranks: consecutive ranks share a rack, pod 0 stays rank 0, placement read from the API."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

import inpod
from inpod import fabric_util
from tests.conftest import run_objects, stack_objects
from tests.fabric.conftest import Sim
from tests.fabric.test_gate import fc

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


@pytest.fixture
def api():
    server = HTTPServer(("127.0.0.1", 0), FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeApi.seen.clear()
    FakeApi.status[:] = [200]
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_rank_order_command_reads_spec_node_name_from_the_api(sim, api, tmp_path: Path) -> None:
    s: Sim = sim(1)
    s.settings = {**s.settings, "nodeRacks": RACKS}
    FakeApi.items = [{"metadata": {"name": p}, "spec": {"nodeName": n}} for p, n in PLACED.items()]
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok3n\n")
    env = s.env(0)
    env.update(ML_DEV_KUBE_API=api, ML_DEV_SA_DIR=str(sa), POD_NAMESPACE="nccl-test")
    res = subprocess.run(
        [sys.executable, str(fc.__file__), "rank-order", "--pods", " ".join(PODS), "--from-api"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ml-dev-env-0", "ml-dev-env-2", "ml-dev-env-4", "ml-dev-env-1", "ml-dev-env-3", "ml-dev-env-5"]
    path, auth = FakeApi.seen[0]
    assert path.startswith("/api/v1/namespaces/nccl-test/pods?labelSelector=")
    assert "app.kubernetes.io%2Finstance%3Dml-dev-env" in path and auth == "Bearer tok3n"


def test_rank_order_command_falls_back_to_ordinals_without_api_access(sim, api, tmp_path: Path) -> None:
    s: Sim = sim(1)
    s.settings = {**s.settings, "nodeRacks": RACKS}
    FakeApi.status[:] = [403]
    env = s.env(0)
    env.update(ML_DEV_KUBE_API=api, ML_DEV_SA_DIR=str(tmp_path), POD_NAMESPACE="nccl-test")
    res = subprocess.run(
        [sys.executable, str(fc.__file__), "rank-order", "--pods", " ".join(PODS), "--from-api"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
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


def rank_order_sh(tmp_path: Path, settings: dict, env: dict, *pods: str) -> subprocess.CompletedProcess:
    """Source rank_order.sh from a copy of the ConfigMap directory and call it, as the startup script does."""
    opt = tmp_path / "opt"
    opt.mkdir(exist_ok=True)
    for key, text in inpod.group("fabric").items():  # the program, its modules and rank_order.sh, as shipped
        (opt / key).write_text(text)
    (opt / "fabric.json").write_text(json.dumps(settings))
    script = f'. {opt}/rank_order.sh; read -r -a RANK_PODS <<<"$(ml_dev_rank_order nccl-test "$@")"; echo "${{RANK_PODS[*]}}"'
    return subprocess.run(["/bin/bash", "-c", script, "sh", *pods], env=env, capture_output=True, text=True, timeout=60)


def test_rank_order_shell_function_for_the_startup_script(sim, api, tmp_path: Path) -> None:
    s: Sim = sim(1)
    FakeApi.items = [{"metadata": {"name": p}, "spec": {"nodeName": n}} for p, n in PLACED.items()]
    env = s.env(0)
    env.pop("ML_DEV_FABRIC_CONFIG")
    env.update(ML_DEV_KUBE_API=api, ML_DEV_SA_DIR=str(tmp_path), POD_NAMESPACE="nccl-test")
    plain = rank_order_sh(tmp_path, s.settings, env, *PODS)
    assert plain.stdout.split() == PODS and FakeApi.seen == [], "no nodeRacks: ordinals, no API call"
    racked = rank_order_sh(tmp_path, {**s.settings, "nodeRacks": RACKS}, env, *PODS)
    assert racked.stdout.split() == fc.rack_order(PODS, PLACED, RACKS) != PODS
    FakeApi.items = FakeApi.items[:3]  # pods 3..5 not scheduled yet: they rank last until they are
    partial = rank_order_sh(tmp_path, {**s.settings, "nodeRacks": RACKS}, env, *PODS)
    assert partial.stdout.split() == ["ml-dev-env-0", "ml-dev-env-2", "ml-dev-env-1", "ml-dev-env-3", "ml-dev-env-4", "ml-dev-env-5"]
    assert "node of ml-dev-env-3, ml-dev-env-4, ml-dev-env-5 not known yet" in partial.stderr
    env["PATH"] = "/nonexistent"
    assert rank_order_sh(tmp_path, {**s.settings, "nodeRacks": RACKS}, env, *PODS).stdout.split() == PODS


def test_startup_script_writes_rack_aware_ranks_and_follows_placement(sim, api, tmp_path: Path) -> None:
    import os
    import signal

    from components.pod import STARTUP_SCRIPT
    from tests.fabric.test_hold import read_until

    s: Sim = sim(1)
    FakeApi.items = [{"metadata": {"name": p}, "spec": {"nodeName": n}} for p, n in PLACED.items()]
    opt = tmp_path / "opt"
    opt.mkdir()
    (opt / STARTUP_SCRIPT.name).write_text(STARTUP_SCRIPT.read_text())
    for key, text in inpod.group("fabric").items():
        (opt / key).write_text(text)
    (opt / "fabric.json").write_text(json.dumps({**s.settings, "nodeRacks": RACKS}))
    env = s.env(0)
    env.pop("ML_DEV_FABRIC_CONFIG")
    state = tmp_path / "pod1-state"
    env.update(
        POD_NAME="ml-dev-env-1",
        HOSTNAME="ml-dev-env-1",
        NODE_NAME="n-b1",
        APP_NAME="ml-dev-env",
        HEADLESS_SERVICE="ml-dev-env-headless",
        POD_NAMESPACE="nccl-test",
        NNODES="6",
        GPUS_PER_NODE="4",
        MASTER_PORT="29500",
        ML_DEV_STATE_DIR=str(state),
        ML_DEV_CLUSTER_DIR=str(tmp_path / "no-cluster-dir"),
        ML_DEV_POLL_SECONDS="0.2",
        ML_DEV_KUBE_API=api,
        ML_DEV_SA_DIR=str(tmp_path),
        ML_DEV_SERVERS="",
    )
    proc = subprocess.Popen(
        ["/bin/bash", str(opt / "startup.sh")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        read_until(proc.stdout, "] ready")
        rank = fabric_util.read_rank_env(state / "rank.env")
        order = fc.rack_order(PODS, PLACED, RACKS)
        assert rank["ML_DEV_PODS"].split() == order and rank["NODE_RANK"] == str(order.index("ml-dev-env-1")) == "3"
        assert rank["MASTER_ADDR"].startswith("ml-dev-env-0."), "pod 0 stays rank 0"
        hostfile = Path(rank["DEEPSPEED_HOSTFILE"]).read_text().split()
        assert [h.split(".")[0] for h in hostfile[::2]] == order == [h.split(".")[0] for h in rank["ML_DEV_HOSTS"].split()]
        # pod 1 moves to rack a (rescheduled): the poll loop rewrites rank.env
        FakeApi.items = [
            {"metadata": {"name": p}, "spec": {"nodeName": n}}
            for p, n in dict(PLACED, **{"ml-dev-env-1": "n-a2", "ml-dev-env-2": "n-b1"}).items()
        ]
        read_until(proc.stdout, "pod placement changed the rack-aware rank order")
        read_until(proc.stdout, "NODE_RANK=")
        rank = fabric_util.read_rank_env(state / "rank.env")
        assert rank["ML_DEV_PODS"].split()[:3] == ["ml-dev-env-0", "ml-dev-env-1", "ml-dev-env-4"] and rank["NODE_RANK"] == "1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
