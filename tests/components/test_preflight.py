"""Adoption of objects that already exist: provider options, and the preflight stop before a foreign
StatefulSet that server-side apply cannot adopt (immutable selector / claim templates)."""

from __future__ import annotations

import contextlib
import http.server
import json
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from components import preflight
from tests.conftest import PLACEHOLDER_SECRETS, ROOT, STACKS, run_objects, stack_objects
from tools import mock_engine

# The original tool's StatefulSet: another selector, a different headless Service, no claim templates.
ORIGINAL = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {"name": "ml-dev-env", "namespace": "nccl-test", "labels": {"app": "ml-dev-env"}},
    "spec": {
        "selector": {"matchLabels": {"app": "ml-dev-env"}},
        "serviceName": "ml-dev-env",
        "replicas": 2,
        "podManagementPolicy": "Parallel",
        "template": {"metadata": {"labels": {"app": "ml-dev-env"}}, "spec": {}},
    },
}


def ours(stack: str = "barcelona") -> dict[str, Any]:
    """The StatefulSet the stack itself renders (what a previous `pulumi up` left live)."""
    result = run_objects(stack, stack_objects(stack))
    assert result.error is None, result.error
    return result.one("kubernetes:apps/v1:StatefulSet").inputs


@pytest.mark.parametrize("stack", STACKS)
def test_provider_adopts_existing_objects_with_forced_server_side_apply(stack: str) -> None:
    result = run_objects(stack, stack_objects(stack))
    (provider,) = result.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["enableServerSideApply"] == "true"
    assert provider.inputs["upsertExistingObjects"] == "true"
    # upsert alone forces field conflicts only in preview (pulumi-kubernetes await.go patchForce)
    assert provider.inputs["enablePatchForce"] == "true"


@pytest.mark.parametrize("stack", STACKS)
def test_provider_updates_configmaps_in_place(stack: str) -> None:
    """A `nodes.count` change rewrites `<app>-cluster`'s data: without enableConfigMapMutable the provider
    replaces a ConfigMap whose data changed (pulumi-kubernetes diff.go forceNewProperties), i.e. deletes it."""
    result = run_objects(stack, stack_objects(stack))
    (provider,) = result.of_type("pulumi:providers:kubernetes")
    assert provider.inputs.get("enableConfigMapMutable") == "true"


# ------------------------------------------------------------------------------- the decision


def conflict(live: dict[str, Any] | None, stack: str = "barcelona") -> str | None:
    sts = ours(stack)
    return preflight.statefulset_conflict(
        live,
        owner_labels={"app.kubernetes.io/managed-by": "pulumi", "ml-dev-env/cluster": stack_objects(stack)["cluster"]["name"]},
        selector=sts["spec"]["selector"]["matchLabels"],
        service_name=sts["spec"]["serviceName"],
        claim_templates=[t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])],
    )


def test_the_original_statefulset_stops_with_one_line_that_keeps_the_data() -> None:
    line = conflict(ORIGINAL)
    assert line is not None and "\n" not in line
    assert "StatefulSet nccl-test/ml-dev-env" in line and "spec.selector" in line and "spec.volumeClaimTemplates" in line
    assert "`oc delete statefulset ml-dev-env -n nccl-test --cascade=orphan`" in line
    assert "`oc delete pod -n nccl-test -l app=ml-dev-env`" in line


def test_our_own_or_a_compatible_statefulset_is_no_conflict() -> None:
    assert conflict(None) is None
    live = {**ours(), "metadata": {**ours()["metadata"]}}
    assert conflict(live) is None
    # our own with other immutable fields (a storage change): Pulumi replaces it, no stop
    changed = json.loads(json.dumps(live))
    changed["spec"]["volumeClaimTemplates"] = []
    assert conflict(changed) is None
    # not ours, but identical immutable fields: the server-side apply adopts it
    foreign = json.loads(json.dumps(live))
    foreign["metadata"]["labels"] = {"app": "something-else"}
    assert conflict(foreign) is None
    foreign["spec"]["serviceName"] = "other"
    assert "spec.serviceName" in (conflict(foreign) or "")


# ------------------------------------------------------------------------- through the program


def test_the_program_stops_before_a_foreign_statefulset(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def read(context: str | None, namespace: str, name: str) -> dict[str, Any]:
        calls.append((context, namespace, name))
        return ORIGINAL

    monkeypatch.setattr(preflight, "live_reads_enabled", lambda render_dir: True)
    monkeypatch.setattr(preflight, "read_statefulset", read)
    result = run_objects("barcelona", stack_objects("barcelona"))
    assert calls == [(None, "nccl-test", "ml-dev-env")]
    assert result.error is not None and "--cascade=orphan" in result.error
    assert not result.of_type("kubernetes:apps/v1:StatefulSet"), "nothing may be applied after the stop"


def test_an_unreadable_cluster_only_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    def read(context: str | None, namespace: str, name: str) -> dict[str, Any]:
        raise preflight.LiveReadError("GET …: HTTP 403")

    monkeypatch.setattr(preflight, "live_reads_enabled", lambda render_dir: True)
    monkeypatch.setattr(preflight, "read_statefulset", read)
    result = run_objects("barcelona", stack_objects("barcelona"))
    assert result.error is None, result.error
    assert any("could not check for an existing StatefulSet nccl-test/ml-dev-env (GET …: HTTP 403)" in w for w in result.warnings)


def test_the_offline_render_never_reads_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    def read(*args: Any) -> None:
        raise AssertionError("the mock render must not contact a cluster")

    monkeypatch.setattr(preflight, "read_statefulset", read)
    assert run_objects("barcelona", stack_objects("barcelona")).error is None
    assert preflight.live_reads_enabled("/tmp/gitops") is False


# ----------------------------------------------------------------- the reader, against a local API


class FakeApi(http.server.BaseHTTPRequestHandler):
    objects: ClassVar[dict[str, Any]] = {}
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        FakeApi.seen.append((self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") not in ("Bearer sha256~token", "Bearer from-plugin"):
            self.send_response(401)
            self.end_headers()
            return
        if self.path.endswith("/forbidden"):
            self.send_response(403)
            self.end_headers()
            return
        obj = FakeApi.objects.get(self.path)
        body = obj.encode() if isinstance(obj, str) else json.dumps(obj if obj else {"kind": "Status", "code": 404}).encode()
        self.send_response(200 if obj else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    FakeApi.objects = {"/apis/apps/v1/namespaces/nccl-test/statefulsets/ml-dev-env": ORIGINAL}
    FakeApi.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def kubeconfig(path: Path, server: str, user: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "admin",
                "clusters": [{"name": "barcelona", "cluster": {"server": server}}],
                "users": [{"name": "admin", "user": user}, {"name": "other", "user": {"token": "wrong"}}],
                "contexts": [
                    {"name": "admin", "context": {"cluster": "barcelona", "user": "admin"}},
                    {"name": "other", "context": {"cluster": "barcelona", "user": "other"}},
                ],
            }
        )
    )
    return path


def test_reader_uses_the_kubeconfig_token_and_context(api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", api, {"token": "sha256~token"})))
    assert preflight.read_statefulset(None, "nccl-test", "ml-dev-env") == ORIGINAL
    assert preflight.read_statefulset(None, "nccl-test", "absent") is None
    assert FakeApi.seen[0] == ("/apis/apps/v1/namespaces/nccl-test/statefulsets/ml-dev-env", "Bearer sha256~token")
    with pytest.raises(preflight.LiveReadError, match="HTTP 401"):
        preflight.read_statefulset("other", "nccl-test", "ml-dev-env")
    with pytest.raises(preflight.LiveReadError, match="HTTP 403"):
        preflight.KubeClient().get("/forbidden")
    with pytest.raises(preflight.LiveReadError, match="context 'missing' not found"):
        preflight.read_statefulset("missing", "nccl-test", "ml-dev-env")


def test_reader_runs_exec_credential_plugins(api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': 'from-plugin'}}))\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "args": []}}
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", api, user)))
    assert preflight.read_statefulset(None, "nccl-test", "ml-dev-env") == ORIGINAL
    assert FakeApi.seen[-1][1] == "Bearer from-plugin"


def test_reader_reports_an_unreachable_cluster_and_a_missing_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(preflight.LiveReadError, match="no kubeconfig"):
        preflight.read_statefulset(None, "nccl-test", "ml-dev-env")
    # a port nothing listens on: bound here and never listened on, so no other process can take it meanwhile
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", f"http://127.0.0.1:{port}", {"token": "t"})))
        with pytest.raises(preflight.LiveReadError, match="GET /apis/apps/v1/"):
            preflight.read_statefulset(None, "nccl-test", "ml-dev-env")


@pytest.mark.parametrize(
    ("scc", "refused"),
    [
        ({"allowedCapabilities": ["IPC_LOCK", "SYS_RESOURCE"]}, '[{"op":"add","path":"/allowedCapabilities/-","value":"SYS_CHROOT"}]'),
        ({"allowedCapabilities": None}, '[{"op":"add","path":"/allowedCapabilities","value":["IPC_LOCK","SYS_RESOURCE","SYS_CHROOT"]}]'),
        ({"allowedCapabilities": ["IPC_LOCK", "SYS_RESOURCE", "SYS_CHROOT"]}, None),
        ({"allowedCapabilities": ["CAP_IPC_LOCK", "sys_resource"], "defaultAddCapabilities": ["SYS_CHROOT"]}, None),
        ({"allowedCapabilities": ["*"]}, None),
    ],
    ids=["lacks-sys-chroot", "allows-nothing", "allows-all-three", "default-add", "wildcard"],
)
def test_an_admins_scc_must_allow_what_the_pods_add(monkeypatch: pytest.MonkeyPatch, scc: dict[str, Any], refused: str | None) -> None:
    """createScc false: preview reads the admin's SCC; one that neither allows nor adds by default a capability the pods
    add would have admission refuse every pod (mustrunas.go Validate): the program stops with the `oc patch` that
    allows it. The render alone cannot know, so it warns whenever SYS_CHROOT is not listed."""
    objects = stack_objects("barcelona")
    objects["security"]["memlock"]["createScc"] = False  # barcelona lists IPC_LOCK, SYS_RESOURCE, SYS_CHROOT
    live = {"metadata": {"name": "nccl-rdma-scc"}, "requiredDropCapabilities": ["KILL", "MKNOD"], **scc}
    monkeypatch.setattr(preflight, "live_reads_enabled", lambda render_dir: True)
    monkeypatch.setattr(preflight, "read_statefulset", lambda *args: None)
    monkeypatch.setattr(preflight, "read_scc", lambda context, name: live if name == "nccl-rdma-scc" else None)
    result = run_objects("barcelona", objects)
    if refused is None:
        assert result.error is None, result.error
        return
    assert result.error is not None and "SecurityContextConstraints nccl-rdma-scc does not allow" in result.error
    assert f"`oc patch scc nccl-rdma-scc --type=json -p '{refused}'`" in result.error, result.error
    assert not result.of_type("kubernetes:apps/v1:StatefulSet"), "nothing may be applied after the stop"


# ------------------------------------------------------------------------ an API that never answers


@pytest.mark.parametrize("stack", ["barcelona", "barcelona-alice"])
def test_a_silent_api_costs_one_read_and_one_warning_in_all(stack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preview against an API that accepts connections and never answers: the first read waits READ_CAP, warns once,
    and no live check (guard, StatefulSet, SCC, attachments, GPU nodes) reads or warns again."""
    import socket
    import time

    assert preflight.READ_CAP <= 8.0  # one read, connection included: ≤ 10 s in all with the run's own work
    config = {f"ml-dev-env:{k}": v for k, v in stack_objects(stack).items()}
    secrets = {k: v for k, v in PLACEHOLDER_SECRETS.items() if v is not None}
    # an environment's preview reads its cluster stack's outputs; the mock engine would run that stack in this process
    outputs = mock_engine.cluster_outputs(config, secrets, mock_engine.ROOT / "__main__.py")
    monkeypatch.setattr(preflight, "READ_CAP", 0.5)  # the test's own bound; the count of reads is what it measures
    monkeypatch.setattr(preflight, "_offline", lambda render_dir: False)
    waited: list[float] = []
    real_get = preflight.KubeClient.get

    def timed(self: preflight.KubeClient, path: str, timeout: float = 8.0) -> dict[str, Any] | None:
        start = time.monotonic()
        try:
            return real_get(self, path, timeout)
        finally:
            waited.append(time.monotonic() - start)

    monkeypatch.setattr(preflight.KubeClient, "get", timed)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        monkeypatch.setenv(
            "KUBECONFIG", str(kubeconfig(tmp_path / "config", f"http://127.0.0.1:{server.getsockname()[1]}", {"token": "t"}))
        )
        result = mock_engine.run_program(stack, config, secrets, stack_outputs=outputs)
        server.setblocking(False)
        connections = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                server.accept()[0].close()
                connections += 1
    assert result.error is None, result.error
    api_warnings = [w for w in result.warnings if "GET " in w or "API" in w or "could not" in w]
    assert len(api_warnings) == 1, api_warnings
    assert "could not reach the cluster's API" in api_warnings[0] and "timed out" in api_warnings[0]
    assert connections == 1 and len([w for w in waited if w > 0.1]) == 1, (connections, waited)
    assert sum(waited) < 0.5 + 0.5  # one capped read; the skipped ones cost nothing


# ------------------------------------------------------------------------------ GPUs that fit, live


def _node(name: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def _gpu_pod(ns: str, name: str, gpus: int, owner: str | None = None, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name}
    if owner:
        meta["ownerReferences"] = [{"kind": "StatefulSet", "name": owner}]
    return {
        "metadata": meta,
        "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase},
    }


def test_the_live_gpu_line_names_the_pods_that_hold_them() -> None:
    from stacks import gpus

    fit = gpus.tally(ROOT, "barcelona")
    assert fit is not None and fit.asked == 16 and len(fit.nodes) == 5
    pods: dict[str, list[dict[str, Any]]] = {name: [] for name in fit.nodes}
    pods[fit.nodes[0]] = [_gpu_pod("nccl-test", "ml-dev-env-0", 4, owner="ml-dev-env")]  # ours: counted in the ask
    pods[fit.nodes[1]] = [_gpu_pod("team-b", "trainer-0", 4), _gpu_pod("team-b", "done", 4, phase="Succeeded")]
    pods[fit.nodes[2]] = [_gpu_pod("team-c", "notebook", 2)]
    reads: list[str] = []

    def get(path: str) -> dict[str, Any] | None:
        reads.append(path)
        if path.startswith("/api/v1/nodes/"):
            return _node(path.rsplit("/", 1)[1], 4)
        node = path.rsplit("%3D", 1)[1]
        return {"items": pods[node]}

    line, fits = preflight.gpu_fit_line(get, fit)
    assert not fits and len(reads) == 10
    assert line.startswith("GPUs on cluster barcelona (live): 16 asked by this checkout's stacks, 20 allocatable on 5 GPU nodes: ")
    assert "fits once 2 GPUs free; other pods hold 6: team-b/trainer-0 (4), team-c/notebook (2) (list them: oc get pods -A" in line
    pods[fit.nodes[2]] = []
    assert preflight.gpu_fit_line(get, fit) == (
        "GPUs on cluster barcelona (live): 16 asked by this checkout's stacks, 20 allocatable on 5 GPU nodes, 4 held by other pods: fits",
        True,
    )
    few = {name: 2 for name in fit.nodes}
    line, fits = preflight.gpu_fit_line(
        lambda p: _node(p.rsplit("/", 1)[1], few[p.rsplit("/", 1)[1]]) if "/nodes/" in p else {"items": []}, fit
    )
    assert line.endswith("10 allocatable on 5 GPU nodes: never fits, 6 more than the nodes have") and not fits


def test_a_preview_tells_whether_the_gpus_fit_from_the_live_nodes(api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the program against the local API: the GPU nodes' allocatable and what other pods hold, in one warning."""
    nodes = stack_objects("barcelona")["nodes"]["gpuNodes"]
    FakeApi.objects = {f"/api/v1/nodes/{name}": _node(name, 4) for name in nodes}
    FakeApi.objects["/version"] = {"major": "1", "minor": "33"}
    for name in nodes:
        FakeApi.objects[f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}"] = {"items": []}
    FakeApi.objects[f"/api/v1/pods?fieldSelector=spec.nodeName%3D{nodes[0]}"] = {"items": [_gpu_pod("team-b", "trainer-0", 4)]}
    FakeApi.objects[f"/api/v1/pods?fieldSelector=spec.nodeName%3D{nodes[1]}"] = {"items": [_gpu_pod("team-b", "trainer-1", 4)]}
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", api, {"token": "sha256~token"})))
    monkeypatch.setattr(preflight, "_offline", lambda render_dir: False)
    result = run_objects("barcelona", stack_objects("barcelona"))
    assert result.error is None, result.error
    [line] = [w for w in result.warnings if w.startswith("GPUs on cluster barcelona (live)")]
    assert "16 asked by this checkout's stacks, 20 allocatable on 5 GPU nodes: fits once 4 GPUs free; other pods hold 8: " in line
    assert "team-b/trainer-0 (4), team-b/trainer-1 (4)" in line
