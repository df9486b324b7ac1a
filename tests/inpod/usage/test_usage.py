"""Who holds the GPUs: the usage recorder (inpod/usage.py) against a stand-in API that enforces the rendered Role,
and the status table over live objects taken from the real renders of barcelona and its two environments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from core import naming
from inpod import usage
from tests.conftest import ROOT, run_objects, stack_objects
from tests.inpod.mount import remove
from tests.podsim.layout import AtomicVolume

DAY = 86400.0
NOW = 1_780_000_000.0  # a fixed instant (UTC 2026-05-28)


def test_pods_times_gpus_times_time_into_todays_bucket() -> None:
    data = usage.add_usage({usage.LAST: str(int(NOW - 600))}, pods=2, gpus_per_pod=4, now=NOW, period=600)
    assert data[usage.BUCKET + usage.day(NOW)] == str(2 * 4 * 600)
    assert data[usage.LAST] == str(int(NOW))
    again = usage.add_usage(data, pods=2, gpus_per_pod=4, now=NOW + 300, period=600)
    assert int(again[usage.BUCKET + usage.day(NOW)]) == 2 * 4 * 900


def test_suspended_time_adds_nothing_and_a_gap_counts_at_most_two_periods() -> None:
    start = {usage.LAST: str(int(NOW - 600))}
    assert usage.add_usage(start, pods=0, gpus_per_pod=4, now=NOW, period=600)[usage.BUCKET + usage.day(NOW)] == "0"
    late = usage.add_usage({usage.LAST: str(int(NOW - 5 * 3600))}, pods=1, gpus_per_pod=1, now=NOW, period=600)
    assert late[usage.BUCKET + usage.day(NOW)] == "1200"


def test_old_days_are_dropped_and_the_week_sums_seven_days() -> None:
    data = {usage.BUCKET + usage.day(NOW - d * DAY): "3600" for d in range(20)}
    kept = usage.add_usage(data, pods=0, gpus_per_pod=1, now=NOW, period=600)
    assert sorted(k for k in kept if k.startswith(usage.BUCKET))[0] == usage.BUCKET + usage.day(NOW - usage.KEEP_DAYS * DAY)
    assert usage.week_hours(kept, NOW) == 7.0


# ------------------------------------------------------------------------------- against a stand-in API


def allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str | None) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and resource in r.get("resources", [])
        and verb in r.get("verbs", [])
        and (not r.get("resourceNames") or name in r["resourceNames"])
        for r in rules
    )


@pytest.fixture(scope="module")
def alice() -> Any:
    result = run_objects("barcelona-alice", stack_objects("barcelona-alice"))
    assert result.error is None, result.error
    return result


@pytest.fixture(scope="module")
def barcelona() -> Any:
    result = run_objects("barcelona", stack_objects("barcelona"))
    assert result.error is None, result.error
    return result


def recorder_grants(result: Any, of: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rules the render grants the recorder's ServiceAccount (that of the render `of`, else its own) beyond its
    Role: on the nodes (ClusterRoles bound to it by a ClusterRoleBinding) and in kube-node-lease (Roles there bound to
    it by a RoleBinding there)."""
    sts = (of or result).one("kubernetes:apps/v1:StatefulSet").inputs
    me = {"kind": "ServiceAccount", "name": naming.usage_recorder(sts["metadata"]["name"]), "namespace": sts["metadata"]["namespace"]}
    rbac = [r for r in result.resources if r.kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    kinds = {r.inputs["metadata"]["name"] + "/" + r.kind: r.inputs for r in rbac}
    cluster: list[dict[str, Any]] = []
    leases: list[dict[str, Any]] = []
    for binding, role_kind, out in (("ClusterRoleBinding", "ClusterRole", cluster), ("RoleBinding", "Role", leases)):
        for obj in (r.inputs for r in rbac if r.kind == binding and me in r.inputs.get("subjects", [])):
            if binding == "RoleBinding" and obj["metadata"].get("namespace") != "kube-node-lease":
                continue
            role = kinds.get(obj["roleRef"]["name"] + "/" + role_kind)
            if role is not None and role["metadata"].get("namespace") == obj["metadata"].get("namespace"):
                out.extend(role["rules"])
    return cluster, leases


def fake_api(result: Any, tmp_path: Path, granted_by: Any = None) -> Iterator[tuple[dict[str, Any], str, Path]]:
    """The API as the render's RBAC lets the recorder (its token `recorder-token`) and the pods (`sa-token`) use it,
    the nodes and Leases as `granted_by`'s render (its cluster stack's; else its own) binds them to the recorder:
    `state` holds the pods, the record, the nodes and Leases, what was denied and the patches."""
    sts = result.one("kubernetes:apps/v1:StatefulSet").inputs
    ns, app = sts["metadata"]["namespace"], sts["metadata"]["name"]
    roles = {r.inputs["metadata"]["name"]: r.inputs for r in result.resources if r.kind == "Role"}
    recorder, reader = roles[naming.usage_recorder(app)], roles[f"{naming.usage_recorder(app)}-reader"]
    cluster_rules, lease_rules = recorder_grants(granted_by or result, of=result)
    state: dict[str, Any] = {
        "replicas": 1, "data": {}, "denied": [], "patches": [], "pods": [bound_pod(f"{app}-0", namespace=ns)], "nodes": [], "leases": []
    }  # fmt: skip

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def answer(self, code: int, body: Any) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def handle_any(self) -> None:
            # the token says who calls: the recorder's ServiceAccount (its Role) or the pods' (the reader Role)
            who = self.headers["Authorization"]
            role = {"Bearer recorder-token": recorder, "Bearer sa-token": reader}[who]
            url = urlsplit(self.path)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            if url.path == "/api/v1/nodes" and who == "Bearer recorder-token" and allowed(cluster_rules, "", "nodes", "list", None):
                self.answer(200, {"kind": "NodeList", "items": state["nodes"]})
            elif (
                url.path == usage.NODE_LEASES
                and who == "Bearer recorder-token"
                and allowed(lease_rules, "coordination.k8s.io", "leases", "list", None)
            ):
                self.answer(200, {"kind": "LeaseList", "items": state["leases"]})
            elif url.path == f"/api/v1/namespaces/{ns}/pods" and allowed(role["rules"], "", "pods", "list", None):
                state["pod_selector"] = parse_qs(url.query)["labelSelector"][0]
                self.answer(200, {"kind": "PodList", "items": state["pods"]})
            elif url.path == f"/api/v1/namespaces/{ns}/configmaps/{app}-usage":
                verb = {"GET": "get", "PATCH": "patch"}[self.command]
                if not allowed(role["rules"], "", "configmaps", verb, f"{app}-usage"):
                    state["denied"].append(self.path)
                    self.answer(403, {})
                    return
                if verb == "patch":
                    assert self.headers["Content-Type"] == "application/merge-patch+json"
                    state["patches"].append(body)
                    for k, v in body["data"].items():
                        if v is None:
                            state["data"].pop(k, None)
                        else:
                            state["data"][k] = v
                self.answer(200, {"kind": "ConfigMap", "data": dict(state["data"])})
            elif url.path == f"/apis/apps/v1/namespaces/{ns}/statefulsets" and allowed(role["rules"], "apps", "statefulsets", "list", None):
                state["selector"] = parse_qs(url.query)["labelSelector"][0]
                self.answer(200, {"items": [{**sts, "spec": {**sts["spec"], "replicas": state["replicas"]}}]})
            elif url.path == f"/api/v1/namespaces/{ns}/configmaps" and allowed(role["rules"], "", "configmaps", "list", None):
                self.answer(200, {"items": [{"metadata": {"name": f"{app}-usage", "namespace": ns}, "data": state["data"]}]})
            else:
                state["denied"].append(self.path)
                self.answer(403, {})

        do_GET = do_PATCH = handle_any

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    state["recorder_sa"] = tmp_path / "recorder"
    state["recorder_sa"].mkdir()
    (state["recorder_sa"] / "token").write_text("recorder-token\n")
    state.update(ns=ns, app=app, gpus=int(sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]))
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}", sa
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api(alice: Any, tmp_path: Path) -> Iterator[tuple[dict[str, Any], str, Path]]:
    """alice's environment before its cluster stack's next `up`: its recorder has its Role only (an environment stack
    creates no cluster-scoped binding; the cluster's binds it)."""
    yield from fake_api(alice, tmp_path)


@pytest.fixture
def bound_api(alice: Any, barcelona: Any, tmp_path: Path) -> Iterator[tuple[dict[str, Any], str, Path]]:
    """alice's environment after its cluster stack's `up`: barcelona's node reader is bound to alice's recorder too."""
    yield from fake_api(alice, tmp_path, granted_by=barcelona)


@pytest.fixture
def cluster_api(barcelona: Any, tmp_path: Path) -> Iterator[tuple[dict[str, Any], str, Path]]:
    """barcelona's own environment: the cluster stack grants its recorder the nodes and their Leases."""
    yield from fake_api(barcelona, tmp_path)


def stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def bound_pod(
    name: str, bound: float = NOW - 3 * DAY, phase: str = "Running", waiting: str | None = None, namespace: str = "ns"
) -> dict[str, Any]:
    """A pod as the API lists it: bound to a node at `bound` (its PodScheduled condition)."""
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(bound)}],
    }
    if waiting:
        status["containerStatuses"] = [{"name": "ml-dev", "restartCount": 7, "state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"nodeName": "moc-r4pcc02u25-nairr"}, "status": status}


def pending_pod(name: str, reason: str = "Unschedulable", gated: bool = False) -> dict[str, Any]:
    message = "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    pod: dict[str, Any] = {"metadata": {"name": name}, "spec": {}, "status": {"phase": "Pending"}}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    else:
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]
    return pod


def test_the_recorder_writes_its_record_with_the_rendered_role(api: tuple[dict[str, Any], str, Path], alice: Any) -> None:
    state, url, _ = api
    client = usage.Api(url, state["recorder_sa"])
    selector = "app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance=" + state["app"]
    state["data"] = {usage.LAST: str(int(NOW - 600))}
    line = usage.record(client, state["ns"], state["app"], f"{state['app']}-usage", state["gpus"], 600, now=NOW, selector=selector)
    # the nodes are cluster-scoped: the rendered Role cannot grant them; the recorder reads the pods alone then
    assert f"{state['app']}: 1 pod(s) holding 4 GPU(s) each" in line and state["denied"] == ["/api/v1/nodes"]
    assert state["pod_selector"] == selector
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(4 * 600)
    state["pods"] = []  # suspended: nothing more
    usage.record(client, state["ns"], state["app"], f"{state['app']}-usage", state["gpus"], 600, now=NOW + 600, selector=selector)
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(4 * 600)
    # the rendered recorder runs exactly this program with these arguments, as its own ServiceAccount
    (dep,) = [r.inputs for r in alice.resources if r.kind == "Deployment"]
    command = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["python3", f"{naming.STARTUP_MOUNT}/usage.py"]
    spec = dep["spec"]["template"]["spec"]
    (volume,) = spec["volumes"]
    assert spec["containers"][0]["volumeMounts"] == [{"name": volume["name"], "mountPath": naming.STARTUP_MOUNT, "readOnly": True}]
    assert {i["path"] for i in volume["configMap"]["items"]} >= {"usage.py", "inpod/__init__.py", "inpod/usage.py"}
    assert command[2:] == [
        "loop",
        "--namespace",
        state["ns"],
        "--statefulset",
        state["app"],
        "--configmap",
        f"{state['app']}-usage",
        "--gpus-per-pod",
        "4",
        "--period",
        "600",
        "--selector",
        selector,
    ]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == f"{state['app']}-usage"


POD_LISTS: list[tuple[str, list[dict[str, Any]], int]] = [
    ("bound and running", [bound_pod("x-0"), bound_pod("x-1")], 2),
    ("both unschedulable", [pending_pod("x-0"), pending_pod("x-1")], 0),
    ("Kueue-gated", [pending_pod("x-0", gated=True), pending_pod("x-1", gated=True)], 0),
    ("one bound, one pending", [bound_pod("x-0"), pending_pod("x-1")], 1),
    ("crash-looping holds its GPUs", [bound_pod("x-0", waiting="CrashLoopBackOff"), bound_pod("x-1")], 2),
    ("finished holds none", [bound_pod("x-0", phase="Succeeded"), bound_pod("x-1", phase="Failed")], 0),
    ("another StatefulSet's pod is not counted", [bound_pod("x-0"), bound_pod("x-alice-0"), bound_pod("x-usage-5d8f")], 1),
]


@pytest.mark.parametrize(("what", "pods", "held"), POD_LISTS, ids=[p[0] for p in POD_LISTS])
def test_only_pods_bound_to_a_node_and_not_finished_hold_gpus(what: str, pods: list[dict[str, Any]], held: int) -> None:
    """A day of two unschedulable or gated 8-GPU pods is 0 GPU-hours, not 384."""
    mine = usage.own_pods(pods, "x")
    bound = [usage.bound_at(p, NOW - 600) for p in mine if usage.holds_gpus(p)]
    assert len(bound) == held
    data = usage.add_usage({usage.LAST: str(int(NOW - DAY))}, len(bound), 8, NOW, 600, bound_at=bound)
    assert int(data[usage.BUCKET + usage.day(NOW)]) == held * 8 * int(DAY)


def test_a_gap_of_the_recorder_is_counted_from_each_pods_binding() -> None:
    """The recorder missed an hour: a pod bound before the last record counts the whole hour, one bound since then
    counts from its binding (today: 4 GPU-hours and 1 GPU-hour on 4 GPUs, not 1.33)."""
    last = NOW - 3600
    bound = [usage.bound_at(bound_pod("x-0", bound=NOW - 2 * 3600), 0), usage.bound_at(bound_pod("x-1", bound=NOW - 900), 0)]
    data = usage.add_usage({usage.LAST: str(int(last))}, 2, 4, NOW, 600, bound_at=bound)
    assert int(data[usage.BUCKET + usage.day(NOW)]) == 4 * 3600 + 4 * 900


def test_no_environment_pod_can_write_the_record(alice: Any) -> None:
    """Every Role bound to the pods' ServiceAccount (in any RoleBinding of the render) lacks write verbs on the record."""
    (sts,) = [r.inputs for r in alice.resources if r.kind == "StatefulSet"]
    pods_sa = sts["spec"]["template"]["spec"]["serviceAccountName"]
    record = f"{sts['metadata']['name']}-usage"
    roles = {r.inputs["metadata"]["name"]: r.inputs for r in alice.resources if r.kind == "Role"}
    bound = [
        b.inputs["roleRef"]["name"]
        for b in alice.resources
        if b.kind == "RoleBinding" and any(s.get("name") == pods_sa for s in b.inputs.get("subjects") or [])
    ]
    assert "ml-dev-env-alice-usage-reader" in bound
    for name in bound:
        for verb in ("patch", "update", "delete"):
            assert not allowed(roles.get(name, {}).get("rules", []), "", "configmaps", verb, record), (name, verb)
    usage_binding = alice.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "gpu-usage-binding").inputs
    assert usage_binding["subjects"] == [{"kind": "ServiceAccount", "name": record, "namespace": sts["metadata"]["namespace"]}]


def test_status_says_why_a_running_environment_holds_no_gpus() -> None:
    sts = {
        "kind": "StatefulSet",
        "metadata": {"name": "x", "namespace": "ns", "labels": {usage.STACK_LABEL: "c-x"}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"resources": {"limits": {usage.GPU: "8"}}}]}}},
    }

    def state(*pods: dict[str, Any]) -> str:
        items = [sts, *({**p, "kind": "Pod", "metadata": {**p["metadata"], "namespace": "ns"}} for p in pods)]
        (row,) = usage.environments(items, NOW)
        return str(row["state"])

    assert state(bound_pod("x-0"), bound_pod("x-1")) == "running"
    assert state(pending_pod("x-0"), pending_pod("x-1")).startswith(
        "pending 0/2: x-0 pending: Unschedulable (0/5 nodes are available: 5 Insufficient nvidia.com/gpu.)"
    )
    assert state(pending_pod("x-0", gated=True), bound_pod("x-1")) == "running 1/2: x-0 pending: gated by kueue.x-k8s.io/admission"
    assert state(bound_pod("x-0", waiting="CrashLoopBackOff"), bound_pod("x-1")) == "running 2/2: x-0 crash-looping (7 restarts)"
    assert state(bound_pod("x-0")) == "running 1/2: 1 pod(s) not created (oc describe statefulset x)"


def test_state_shows_the_latest_stop() -> None:
    """The idle agent stopped it, then its owner suspended it with `pulumi up`: suspended, not idle-stopped for ever."""
    record = {"kind": "ConfigMap", "metadata": {"name": "x-idle-stop", "namespace": "ns"}, "data": {"stoppedAt": "2026-05-27T10:00:00Z"}}

    def state(manager: str) -> str:
        managed = [{"manager": manager, "operation": "Update", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
        sts = {"kind": "StatefulSet", "metadata": {"name": "x", "namespace": "ns", "managedFields": managed}, "spec": {"replicas": 0}}
        (row,) = usage.environments([sts, record], NOW)
        return str(row["state"])

    assert state(usage.IDLE_AGENT) == "idle-stopped 2026-05-27T10:00:00Z"
    assert state("pulumi-kubernetes-1a2b3c") == "suspended"


def test_the_recorder_field_manager_is_the_idle_agents() -> None:
    from inpod.idle import probes as idle_probes

    assert usage.IDLE_AGENT == idle_probes.AGENT


def test_the_recorder_runs_the_program_its_volume_mounts(api: tuple[dict[str, Any], str, Path], alice: Any, tmp_path: Path) -> None:
    """The rendered recorder, its mount built from its volume's items alone (as the kubelet does): one round of its
    command (`record` for `loop`) writes the record, so the items hold every module the program imports."""
    state, url, _ = api
    spec = next(r.inputs for r in alice.resources if r.kind == "Deployment")["spec"]["template"]["spec"]
    (volume,) = spec["volumes"]
    data = next(
        r.inputs["data"] for r in alice.resources if r.kind == "ConfigMap" and r.inputs["metadata"]["name"] == volume["configMap"]["name"]
    )
    mount = tmp_path / "opt-ml-dev-env"
    AtomicVolume(mount, mode=volume["configMap"]["defaultMode"]).write_volume(volume["configMap"], data)
    command = [c.replace(naming.STARTUP_MOUNT, str(mount)) for c in spec["containers"][0]["command"]]
    assert command[2] == "loop"
    env = {"PATH": "/usr/bin:/bin", "ML_DEV_KUBE_API": url, "ML_DEV_SA_DIR": str(state["recorder_sa"])}  # its own ServiceAccount
    try:
        done = subprocess.run([sys.executable, command[1], "record", *command[3:]], env=env, capture_output=True, text=True, timeout=60)
    finally:
        remove(mount)
    assert done.returncode == 0, done.stderr
    assert usage.BUCKET + usage.day(time.time()) in state["data"] and state["denied"] == ["/api/v1/nodes"], done.stdout


def test_status_in_a_pod_lists_the_namespace_with_the_pods_token(api: tuple[dict[str, Any], str, Path]) -> None:
    state, url, sa = api
    state["data"] = {usage.BUCKET + usage.day(NOW): str(3 * 3600)}
    rows = usage.environments(usage.read_live(usage.Api(url, sa), None, [state["ns"]]), NOW)
    assert state["selector"] == "app.kubernetes.io/part-of=ml-dev-env" and not state["denied"]
    assert rows == [
        {
            "owner": "barcelona-alice",
            "namespace": state["ns"],
            "environment": state["app"],
            "size": "1 × 4 GPU",
            "state": "running",
            "gpuHoursWeek": 3.0,
        }
    ]


def live_list(tmp_path: Path) -> Path:
    """The three renders' StatefulSets and ConfigMaps as `oc get -A -o json` would list them, with live state."""
    items = []
    for stack in ("barcelona", "barcelona-alice", "barcelona-bob"):
        result = run_objects(stack, stack_objects(stack))
        assert result.error is None, result.error
        items += [dict(r.inputs) for r in result.resources if r.kind in ("StatefulSet", "ConfigMap") and "kind" in r.inputs]
    for item in items:
        name = item["metadata"]["name"]
        if name == "ml-dev-env-alice":
            item["spec"] = {**item["spec"], "replicas": 0}  # idle-stopped
        if name == "ml-dev-env-alice-idle-stop":
            item["data"] = {"stoppedAt": "2026-05-28T10:00:00Z"}
        if name == "ml-dev-env-bob":
            item["spec"] = {**item["spec"], "replicas": 0}  # suspended
        if name.endswith("-usage"):
            item["data"] = {usage.BUCKET + usage.day(NOW - DAY): "7200", usage.BUCKET + usage.day(NOW - 9 * DAY): "99999"}
    path = tmp_path / "live.json"
    path.write_text(json.dumps({"kind": "List", "items": items}))
    return path


def test_every_environment_of_the_cluster_in_one_table(tmp_path: Path) -> None:
    rows = {r["environment"]: r for r in usage.environments(json.loads(live_list(tmp_path).read_text())["items"], NOW)}
    assert set(rows) == {"ml-dev-env", "ml-dev-env-alice", "ml-dev-env-bob"}
    assert rows["ml-dev-env"]["owner"] == "barcelona" and rows["ml-dev-env"]["state"] == "running"
    assert rows["ml-dev-env-alice"]["state"] == "idle-stopped" and rows["ml-dev-env-bob"]["state"] == "suspended"
    assert rows["ml-dev-env-bob"]["namespace"] == "bob-dev" and rows["ml-dev-env-bob"]["size"] == "0 × 2 GPU"
    assert all(r["gpuHoursWeek"] == 2.0 for r in rows.values())  # the 9-day-old bucket is not this week


OC_STUB = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STUB_OC_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
items = json.load(open(os.environ["STUB_OC_LIVE"]))["items"]
if args[:2] == ["get", "nodes"]:  # a team member: no right to list the cluster's nodes
    sys.stderr.write('Error from server (Forbidden): nodes is forbidden: User "carol" cannot list resource "nodes"\\n')
    sys.exit(1)
if "-n" in args:
    ns = args[args.index("-n") + 1]
    if ns in os.environ.get("STUB_OC_FORBIDDEN", "").split():
        sys.stderr.write('Error from server (Forbidden): statefulsets.apps is forbidden: User "carol" cannot list '
                         'resource "statefulsets" in API group "apps" in the namespace "%s"\\n' % ns)
        sys.exit(1)
    items = [i for i in items if i["metadata"].get("namespace") == ns]
selector = args[args.index("-l") + 1].split("=", 1)[1]
items = [i for i in items if i["metadata"].get("labels", {}).get("ml-dev-env/cluster") == selector]
print(json.dumps({"kind": "List", "items": items}))
"""


def make_status(tmp_path: Path, *variables: str, forbidden: str = "") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`make status …` with a stub `oc` that lists the live objects per namespace (refusing `forbidden` ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    oc = bin_dir / "oc"
    oc.write_text(OC_STUB.replace("{python}", sys.executable))
    oc.chmod(0o755)
    log = tmp_path / "oc.log"
    log.unlink(missing_ok=True)
    # as a user's shell runs it: no flags of a make this suite runs under (`make test`, `make bench-tests`)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STUB_OC_LOG": str(log),
                "STUB_OC_LIVE": str(live_list(tmp_path)), "STUB_OC_FORBIDDEN": forbidden})  # fmt: skip
    proc = subprocess.run(["make", "-s", "status", *variables], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc, log.read_text().splitlines() if log.exists() else []


def rows_of(table: str) -> dict[str, list[str]]:
    lines = [line for line in table.splitlines() if not line.startswith("note: ")]
    assert lines and lines[0].split()[:2] == ["OWNER", "(STACK)"], table
    return {line.split()[2]: line.split() for line in lines[1:]}


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


@needs_make
def test_make_status_reads_only_the_namespaces_of_the_clusters_stacks(tmp_path: Path) -> None:
    proc, calls = make_status(tmp_path, "CLUSTER=barcelona")
    assert proc.returncode == 0, proc.stderr
    selector = "-l ml-dev-env/cluster=barcelona -o json"
    # barcelona and alice deploy to nccl-test, bob to bob-dev; nerc-production is another cluster
    assert calls == [
        f"get statefulsets,configmaps,pods -n bob-dev {selector} --show-managed-fields",
        f"get statefulsets,configmaps,pods -n nccl-test {selector} --show-managed-fields",
        "get nodes -o json",  # where the login may list them: a pod on a lost node shows `lost`
    ]
    assert proc.stdout.splitlines()[-1] == usage.NOTE
    rows = rows_of(proc.stdout)
    assert set(rows) == {"ml-dev-env", "ml-dev-env-alice", "ml-dev-env-bob"}
    assert rows["ml-dev-env-bob"][:2] == ["barcelona-bob", "bob-dev"] and "suspended" in rows["ml-dev-env-bob"]


@needs_make
def test_make_status_shows_what_it_can_read_and_names_what_it_cannot(tmp_path: Path) -> None:
    """A team member with list rights in bob-dev only: one line for nccl-test, bob's row, exit 1."""
    proc, _ = make_status(tmp_path, "CLUSTER=barcelona", forbidden="nccl-test")
    assert proc.returncode != 0
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING:")]
    assert warnings == [
        'WARNING: namespace nccl-test: not read: Error from server (Forbidden): statefulsets.apps is forbidden: User "carol" '
        'cannot list resource "statefulsets" in API group "apps" in the namespace "nccl-test"'
    ]
    assert set(rows_of(proc.stdout)) == {"ml-dev-env-bob"}
    proc, _ = make_status(tmp_path, "CLUSTER=barcelona", forbidden="nccl-test bob-dev")
    assert proc.returncode != 0 and proc.stdout == "" and proc.stderr.count("not read: Error from server (Forbidden)") == 2


@needs_make
def test_make_status_all_namespaces_or_named_ones(tmp_path: Path) -> None:
    proc, calls = make_status(tmp_path, "CLUSTER=barcelona", "ALL=1")
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        "get statefulsets,configmaps,pods --all-namespaces -l ml-dev-env/cluster=barcelona -o json --show-managed-fields",
        "get nodes -o json",
    ]
    assert len(rows_of(proc.stdout)) == 3
    proc, calls = make_status(tmp_path, "CLUSTER=barcelona", "NAMESPACES=bob-dev")
    assert proc.returncode == 0, proc.stderr
    assert [c.split()[2:4] for c in calls] == [["-n", "bob-dev"], ["-o", "json"]] and set(rows_of(proc.stdout)) == {"ml-dev-env-bob"}
    proc, calls = make_status(tmp_path, "CLUSTER=cairo")
    assert proc.returncode != 0 and calls == []
    assert "ERROR: no stack file in" in proc.stderr and "has cluster.name 'cairo'" in proc.stderr


# ------------------------------------------------------------------------------- a lost node


def node(name: str, ready: str, heartbeat: float) -> dict[str, Any]:
    """A Node as the API lists it: its Ready condition (Unknown: the node lifecycle controller's word for a kubelet
    that stopped posting) and the kubelet's last heartbeat."""
    cond = {"type": "Ready", "status": ready, "lastHeartbeatTime": stamp(heartbeat), "lastTransitionTime": stamp(heartbeat)}
    return {"kind": "Node", "metadata": {"name": name}, "status": {"conditions": [cond]}}


def stuck(name: str, deleted: float, grace: int = 30, node_name: str = "moc-r4pcc02u25-nairr") -> dict[str, Any]:
    """A pod the taint manager deleted on a NotReady node: Terminating for ever (no kubelet confirms it)."""
    pod = bound_pod(name)
    pod["spec"]["nodeName"] = node_name
    pod["metadata"].update(deletionTimestamp=stamp(deleted), deletionGracePeriodSeconds=grace)
    return pod


def lease(name: str, renewed: float) -> dict[str, Any]:
    """A node's Lease as the API lists it: renewTime a MicroTime (microseconds), renewed by the kubelet every 10 s."""
    micro = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(renewed))) + ".250000Z"
    return {"metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": {"holderIdentity": name, "renewTime": micro}}


NODE = "moc-r4pcc02u25-nairr"


def test_the_cluster_stack_grants_its_and_its_environments_recorders_the_nodes_and_their_leases_only(barcelona: Any, alice: Any) -> None:
    cluster, leases = recorder_grants(barcelona)
    assert cluster == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    assert leases == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list"]}]
    assert recorder_grants(alice) == ([], []), "an environment stack creates no cluster-scoped binding"
    assert recorder_grants(barcelona, of=alice) == (cluster, leases), "its cluster stack binds the environment's recorder"
    nerc = run_objects("nerc-production", stack_objects("nerc-production"))
    assert recorder_grants(nerc) == ([], []), "lifecycle.usageReadsNodes: false (a namespace admin's cluster)"


def test_a_pod_on_a_notready_node_is_charged_until_the_nodes_last_heartbeat(cluster_api: tuple[dict[str, Any], str, Path]) -> None:
    """A pod stuck Terminating on a NotReady node for a day: GPU-hours stop at the node's last heartbeat, its Lease's
    last renewal (the Ready condition, posted every 5 min while nothing changes, is older), not 96 GPU-hours a day
    for a 4-GPU pod shown running; a Ready node charges as before."""
    state, url, _ = cluster_api
    client, seen = usage.Api(url, state["recorder_sa"]), usage.Nodes()
    app, ns, gpus = state["app"], state["ns"], state["gpus"]
    sel = "app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance=" + app
    beat = NOW - 20 * 60
    state["nodes"], state["leases"] = [node(NODE, "Unknown", beat - 240)], [lease(NODE, beat)]
    state["pods"] = [stuck(f"{app}-0", deleted=beat + 5 * 60)]
    state["data"] = {usage.LAST: str(int(NOW - 3600))}
    usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW, selector=sel, nodes_seen=seen)
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(int(gpus * (40 * 60 + 0.25))), "charged to the Lease's renewal"
    for hour in range(1, 25):  # a day later the pod is still there: nothing more
        usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW + hour * 3600, selector=sel, nodes_seen=seen)
    charged = sum(int(state["data"].get(usage.BUCKET + usage.day(NOW + d), "0")) for d in (0, DAY))
    assert charged == int(gpus * (40 * 60 + 0.25))
    assert state["denied"] == []
    # without a Lease (another kubelet's, or none listed): the Ready condition's heartbeat
    state["leases"], state["data"] = [], {usage.LAST: str(int(NOW - 3600))}
    usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW, selector=sel)
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(gpus * 36 * 60)
    # a Ready node charges as before
    state["nodes"], state["leases"] = [node(NODE, "True", NOW + DAY)], [lease(NODE, NOW + DAY)]
    state["pods"] = [bound_pod(f"{app}-0", namespace=ns)]
    state["data"] = {usage.LAST: str(int(NOW - 600))}
    usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW, selector=sel)
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(gpus * 600)


def test_an_environments_recorder_bound_by_its_cluster_stack_charges_until_the_nodes_last_heartbeat(
    bound_api: tuple[dict[str, Any], str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """alice's recorder, with the rights barcelona's render binds to it: a pod stuck on a NotReady node for a day is
    charged until the node's Lease renewal, not until its deletion, and the recorder has nothing to say."""
    state, url, _ = bound_api
    client = usage.Api(url, state["recorder_sa"])
    app, ns, gpus = state["app"], state["ns"], state["gpus"]
    beat = NOW - 20 * 60
    state["nodes"], state["leases"] = [node(NODE, "Unknown", beat - 240)], [lease(NODE, beat)]
    state["pods"] = [stuck(f"{app}-0", deleted=beat + 5 * 60)]
    state["data"] = {usage.LAST: str(int(NOW - 3600))}
    sel = "app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance=" + app
    seen = usage.Nodes()
    for hour in range(25):
        usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW + hour * 3600, selector=sel, nodes_seen=seen)
    charged = sum(int(state["data"].get(usage.BUCKET + usage.day(NOW + d), "0")) for d in (0, DAY))
    assert charged == int(gpus * (40 * 60 + 0.25)), "charged to the Lease's renewal"
    assert state["denied"] == [] and "note: cannot read" not in capsys.readouterr().out


def test_a_pod_on_a_node_that_is_gone_is_charged_until_its_last_heartbeat_seen(cluster_api: tuple[dict[str, Any], str, Path]) -> None:
    """The node object deleted (its Lease goes with it): the charge ends at the last heartbeat the recorder saw of it,
    or at the pod's last Ready change when that is later (the node lifecycle controller marked it not ready)."""
    state, url, _ = cluster_api
    client, seen = usage.Api(url, state["recorder_sa"]), usage.Nodes()
    app, ns, gpus = state["app"], state["ns"], state["gpus"]
    sel = "app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance=" + app
    pod = bound_pod(f"{app}-0", namespace=ns)
    state["pods"], state["data"] = [pod], {usage.LAST: str(int(NOW - 1800))}
    state["nodes"], state["leases"] = [node(NODE, "True", NOW - 1400)], [lease(NODE, NOW - 1210)]
    usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW - 1200, selector=sel, nodes_seen=seen)
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(gpus * 600)
    state["nodes"], state["leases"] = [], []  # deleted; its pod still listed (pod GC has not run yet)
    usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW - 600, selector=sel, nodes_seen=seen)
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(gpus * 600), "nothing after the last heartbeat seen"
    # the pod's Ready condition went False after it (MarkPodsNotReady): charged until then
    pod["status"]["conditions"].append({"type": "Ready", "status": "False", "lastTransitionTime": stamp(NOW - 300)})
    state["data"] = {usage.LAST: str(int(NOW - 600))}
    usage.record(client, ns, app, f"{app}-usage", gpus, 600, now=NOW, selector=sel, nodes_seen=seen)
    assert state["data"][usage.BUCKET + usage.day(NOW)] == str(gpus * 300)


def test_without_the_right_to_read_nodes_the_recorder_reads_the_pods_alone_and_says_so_once(
    api: tuple[dict[str, Any], str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """An environment stack's recorder before its cluster stack's next `up` (alice's own render: no ClusterRole bound
    to it), or on a cluster with usageReadsNodes false: the nodes are there but forbidden to it; a pod
    deleted an hour ago and not ended is charged until its deletion, and the recorder's log says why once."""
    state, url, _ = api
    client = usage.Api(url, state["recorder_sa"])
    app, ns, gpus = state["app"], state["ns"], state["gpus"]
    state["nodes"], state["leases"] = [node(NODE, "Unknown", NOW - 7200)], [lease(NODE, NOW - 7200)]
    state["pods"] = [stuck(f"{app}-0", deleted=NOW - 3600)]
    state["data"] = {usage.LAST: str(int(NOW - 5400))}
    sel = "app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance=" + app
    usage.run_loop(client, ns, app, f"{app}-usage", gpus, 0.01, rounds=3, selector=sel)  # the recorder's loop: now is now
    out = capsys.readouterr().out
    assert out.count("note: cannot read the cluster's nodes (HTTP Error 403") == 1, out
    assert "lifecycle.usageReadsNodes" in out and out.count(" pod(s) holding ") == 3, out
    assert state["denied"].count("/api/v1/nodes") == 3
    charged = sum(int(v) for k, v in state["data"].items() if k.startswith(usage.BUCKET))
    assert charged == gpus * 1800, "charged until its deletion, not on"


def test_without_the_nodes_a_pod_deleted_past_its_grace_is_lost_since_its_deletion() -> None:
    deleted = NOW - 3600
    assert usage.lost(stuck("x-0", deleted), None, NOW) == (deleted, "on moc-r4pcc02u25-nairr, not ended 3600 s after its deletion")
    assert usage.lost(stuck("x-0", NOW - 30, grace=30), None, NOW) is None, "still inside its grace (+ margin): a live kubelet ends it"
    assert usage.lost(bound_pod("x-0"), None, NOW) is None


def test_status_shows_a_pod_on_a_lost_node_as_lost_never_running() -> None:
    sts = {
        "kind": "StatefulSet",
        "metadata": {"name": "x", "namespace": "ns", "labels": {usage.STACK_LABEL: "c-x"}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"resources": {"limits": {usage.GPU: "4"}}}]}}},
    }
    beat = NOW - 7200
    pods = [
        {**p, "kind": "Pod", "metadata": {**p["metadata"], "namespace": "ns"}}
        for p in (stuck("x-0", beat + 300, node_name="n0"), bound_pod("x-1"))
    ]
    pods[1]["spec"]["nodeName"] = "n1"
    nodes = [node("n0", "Unknown", beat), node("n1", "True", NOW)]
    (row,) = usage.environments([sts, *pods, *nodes], NOW)
    assert row["state"].startswith("lost 1/2: x-0 lost (on n0, NotReady; charged until ") and "running" not in row["state"], row
    (row,) = usage.environments([sts, *pods], NOW)  # `oc` may not list the nodes: the pods alone say it
    assert row["state"].startswith("lost 1/2: x-0 lost (on n0, not ended 6900 s after its deletion") and "running" not in row["state"], row
