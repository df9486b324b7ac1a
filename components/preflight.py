"""Preflight reads of live objects that adoption cannot handle, before Pulumi touches them.

The provider adopts existing objects (`upsertExistingObjects`: a server-side apply PATCH instead of a
create, pulumi/pulumi-kubernetes provider/pkg/await/await.go `Creation`). That cannot adopt a
StatefulSet whose immutable fields differ (selector, serviceName, podManagementPolicy,
volumeClaimTemplates): the API server refuses the apply — and a preview does not even show it, because
`Creation` retries a dry run that fails on immutable fields under a generated name. The original tool's
StatefulSet is such an object. So the program reads the live StatefulSet once (preview and update, a
plain GET with the provider's kubeconfig context) and stops with one line saying how to remove it
without losing its pods' data.

The reader is deliberately small (kubeconfig + HTTPS GET from the standard library): bearer tokens
(`oc login`), token files, client certificates, basic auth and exec credential plugins. Anything it
cannot read (no kubeconfig, unreachable cluster, no `get` right, an unsupported auth provider) is a
warning, never a failure — the apply then fails or succeeds on its own. It never runs under the
offline mock engine (`make render`, the tests) or in GitOps mode.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime.mocks import MockMonitor

from stacks.gpus import Tally


class LiveReadError(Exception):
    """The live object could not be read (reported as a warning)."""


class ApiSilent(LiveReadError):
    """Not read: the API did not answer an earlier read of this run (already warned about; nothing more is said)."""


READ_CAP = 8.0
"""The most seconds any one read waits for the API (connection and answer). The first read the API leaves unanswered
(a timeout, a refused or reset connection) marks it silent for the rest of the run (`UNANSWERED`): every later read is
skipped without waiting or warning, so an API that never answers costs one read, at most READ_CAP s, ≤ 10 s in all."""

UNANSWERED: list[str] = []
"""The read the API left unanswered in this process (one Pulumi run), if any: then no check reads anything more."""


def _offline(render_yaml_to_directory: str | None) -> bool:
    return bool(render_yaml_to_directory) or isinstance(pulumi.runtime.settings.get_monitor(), MockMonitor)


def live_reads_enabled(render_yaml_to_directory: str | None) -> bool:
    """False under the offline mock engine (`make render`, tests), in GitOps mode (no cluster), and once the API left a
    read of this run unanswered (its one warning said so: the other live checks then stay quiet)."""
    return not _offline(render_yaml_to_directory) and not UNANSWERED


# ----------------------------------------------------------------------------------- kubeconfig


def _kubeconfig_files() -> list[Path]:
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return [Path.home() / ".kube" / "config"]


def load_kubeconfig() -> dict[str, Any]:
    """The merged kubeconfig (first file wins per name, like kubectl)."""
    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": None}
    found = False
    for path in _kubeconfig_files():
        if not path.is_file():
            continue
        found = True
        data = yaml.safe_load(path.read_text()) or {}
        for kind in ("clusters", "users", "contexts"):
            for item in data.get(kind) or []:
                entry = dict(item.get(kind[:-1]) or {})
                entry["_dir"] = str(path.parent)
                merged[kind].setdefault(item["name"], entry)
        merged["current-context"] = merged["current-context"] or data.get("current-context")
    if not found:
        raise LiveReadError("no kubeconfig found")
    return merged


def _file_or_data(entry: dict[str, Any], key: str) -> bytes | None:
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        path = Path(entry[key])
        return (path if path.is_absolute() else Path(entry["_dir"]) / path).read_bytes()
    return None


def _exec_credential(spec: dict[str, Any], cluster_server: str) -> dict[str, Any]:
    """Run an exec credential plugin (client.authentication.k8s.io ExecCredential) and return its status."""
    env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {
            "apiVersion": spec.get("apiVersion", "client.authentication.k8s.io/v1"),
            "kind": "ExecCredential",
            "spec": {"interactive": False, "cluster": {"server": cluster_server}},
        }
    )
    proc = subprocess.run([spec["command"], *(spec.get("args") or [])], capture_output=True, text=True, env=env, timeout=60, check=False)
    if proc.returncode != 0:
        raise LiveReadError(f"credential plugin {spec['command']} failed: {proc.stderr.strip()[:200]}")
    return json.loads(proc.stdout).get("status") or {}


class KubeClient:
    """GET-only client for one kubeconfig context."""

    def __init__(self, context: str | None = None, config: dict[str, Any] | None = None) -> None:
        cfg = config if config is not None else load_kubeconfig()
        name = context or cfg.get("current-context")
        if not name or name not in cfg["contexts"]:
            raise LiveReadError(f"kubeconfig context {name!r} not found")
        ctx = cfg["contexts"][name]
        cluster = cfg["clusters"].get(ctx.get("cluster"))
        if cluster is None:
            raise LiveReadError(f"cluster of context {name!r} not found")
        user = cfg["users"].get(ctx.get("user"), {})
        self.server = cluster["server"].rstrip("/")
        self.headers = {"Accept": "application/json"}
        self._scratch = tempfile.TemporaryDirectory(prefix="ml-dev-env-kube-")
        self.ssl = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            self.ssl.check_hostname = False
            self.ssl.verify_mode = ssl.CERT_NONE
        ca = _file_or_data(cluster, "certificate-authority")
        if ca:
            self.ssl.load_verify_locations(cadata=ca.decode())
        cert, key, token = _file_or_data(user, "client-certificate"), _file_or_data(user, "client-key"), user.get("token")
        if not token and user.get("tokenFile"):
            token = Path(user["tokenFile"]).read_text().strip()
        if user.get("exec"):
            status = _exec_credential(user["exec"], self.server)
            token = status.get("token") or token
            if status.get("clientCertificateData"):
                cert, key = status["clientCertificateData"].encode(), status["clientKeyData"].encode()
        if user.get("auth-provider"):
            raise LiveReadError(f"auth-provider {user['auth-provider'].get('name')!r} is not supported by the preflight reader")
        if cert and key:
            cert_file, key_file = Path(self._scratch.name) / "cert.pem", Path(self._scratch.name) / "key.pem"
            for path, data in ((cert_file, cert), (key_file, key)):
                path.touch(mode=0o600)
                path.write_bytes(data)
            self.ssl.load_cert_chain(str(cert_file), str(key_file))
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif user.get("username"):
            basic = base64.b64encode(f"{user['username']}:{user.get('password', '')}".encode()).decode()
            self.headers["Authorization"] = f"Basic {basic}"

    def get(self, path: str, timeout: float = READ_CAP) -> dict[str, Any] | None:
        """GET an API path; None when the object does not exist. Waits at most READ_CAP s; after an unanswered read of
        this run, raises ApiSilent at once (see READ_CAP)."""
        body = self.get_bytes(path, timeout)
        if body is None:
            return None
        try:
            return json.loads(body)
        except ValueError as exc:
            raise LiveReadError(f"GET {path}: {exc}") from None

    def get_bytes(self, path: str, timeout: float = READ_CAP, accept: str = "application/json") -> bytes | None:
        """GET an API path as it is sent (`/metrics` is text); None on 404; the same limits as `get`."""
        if UNANSWERED:
            raise ApiSilent(f"GET {path}: not read, the API left {UNANSWERED[0]} unanswered")
        context = self.ssl if self.server.startswith("https://") else None
        try:
            request = urllib.request.Request(self.server + path, headers={**self.headers, "Accept": accept})
            with urllib.request.urlopen(request, timeout=min(timeout, READ_CAP), context=context) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise LiveReadError(f"GET {path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            UNANSWERED.append(f"GET {path}")  # no answer at all (timeout, refused, reset): read nothing more this run
            raise LiveReadError(f"GET {path}: {getattr(exc, 'reason', None) or exc}") from None
        except ValueError as exc:
            raise LiveReadError(f"GET {path}: {exc}") from None


def read_statefulset(context: str | None, namespace: str, name: str) -> dict[str, Any] | None:
    return KubeClient(context).get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}")


# ----------------------------------------------------------------------------- the decision


def statefulset_conflict(
    live: dict[str, Any] | None,
    *,
    owner_labels: dict[str, str],
    selector: dict[str, str],
    service_name: str,
    claim_templates: list[str],
    pod_management_policy: str = "Parallel",
) -> str | None:
    """One line when `live` is a StatefulSet this stack did not create and cannot adopt, else None.

    Our own StatefulSet (carrying `owner_labels`) is never a conflict: a change of its immutable fields
    is a Pulumi replacement (delete-before-replace). A foreign one whose immutable fields equal ours is
    adopted by the server-side apply.
    """
    if live is None:
        return None
    meta, spec = live.get("metadata", {}), live.get("spec", {})
    labels = meta.get("labels") or {}
    if all(labels.get(k) == v for k, v in owner_labels.items()):
        return None
    differ = []
    if (spec.get("selector") or {}) != {"matchLabels": selector}:
        differ.append("spec.selector")
    if spec.get("serviceName") != service_name:
        differ.append("spec.serviceName")
    if spec.get("podManagementPolicy", "OrderedReady") != pod_management_policy:
        differ.append("spec.podManagementPolicy")
    if sorted(t.get("metadata", {}).get("name", "") for t in spec.get("volumeClaimTemplates") or []) != sorted(claim_templates):
        differ.append("spec.volumeClaimTemplates")
    if not differ:
        return None
    name, ns = meta.get("name"), meta.get("namespace")
    old_selector = ",".join(f"{k}={v}" for k, v in sorted(((spec.get("selector") or {}).get("matchLabels") or {}).items()))
    return (
        f"ml-dev-env: StatefulSet {ns}/{name} exists but was not created by this stack and its immutable "
        f"{', '.join(differ)} differ, so it cannot be adopted; remove it without deleting its pods' data: "
        f"`oc delete statefulset {name} -n {ns} --cascade=orphan` (the pods keep running and claims are never deleted), "
        f"copy off what you need, `oc delete pod -n {ns} -l {old_selector or '<its selector>'}`, then `pulumi up` again"
    )


def read_scc(context: str | None, name: str) -> dict[str, Any] | None:
    return KubeClient(context).get(f"/apis/security.openshift.io/v1/securitycontextconstraints/{name}")


def scc_drops_needed(live: dict[str, Any] | None, name: str, needed: tuple[str, ...]) -> str | None:
    """One line when the existing SCC `name` requires dropping a capability of `needed` (root's sshd: SETUID,
    SETGID), else None. SCC admission adds requiredDropCapabilities to every container's drop list
    (openshift/apiserver-library-go pkg/securitycontextconstraints/capabilities mustrunas.go defaultCapabilities.Generate)."""
    if live is None:
        return None  # missing: reported with the prerequisites
    drops = {str(c).upper().removeprefix("CAP_") for c in live.get("requiredDropCapabilities") or []}
    bad = [c for c in needed if c in drops or "ALL" in drops]
    if not bad:
        return None
    return (
        f"ml-dev-env: SecurityContextConstraints {name} requires dropping {', '.join(bad)}, which the pods' root sshd "
        f"needs (every SSH connection would fail with `setgroups: Operation not permitted`); ask its admin to remove "
        f"{', '.join(bad)} from its requiredDropCapabilities (check: oc get scc {name} -o jsonpath='{{.requiredDropCapabilities}}'), "
        f"or set ml-dev-env:security.memlock.createScc true"
    )


def scc_capabilities_refused(live: dict[str, Any] | None, name: str, adds: list[str]) -> str | None:
    """One line when the existing SCC `name` does not allow a capability the pods add (security.memlock.capabilities),
    naming the `oc patch` that allows it, else None: admission refuses a container adding a capability that is in
    neither the SCC's allowedCapabilities nor its defaultAddCapabilities, `*` allowing any
    (openshift/apiserver-library-go pkg/securitycontextconstraints/capabilities/mustrunas.go Validate: "capability may
    not be added"), so no pod of the StatefulSet would be created."""
    if live is None:
        return None  # missing: reported with the prerequisites
    listed = live.get("allowedCapabilities")
    allowed = {str(c).upper().removeprefix("CAP_") for c in [*(listed or []), *(live.get("defaultAddCapabilities") or [])]}
    missing = [c for c in adds if c not in allowed]
    if "*" in allowed or not missing:
        return None
    ops = (
        [{"op": "add", "path": "/allowedCapabilities/-", "value": c} for c in missing]
        if listed
        else [{"op": "add", "path": "/allowedCapabilities", "value": missing}]
    )
    patch = json.dumps(ops, separators=(",", ":"))
    return (
        f"ml-dev-env: SecurityContextConstraints {name} does not allow {', '.join(missing)}, which the pods add "
        f"(security.memlock.capabilities): admission would refuse every pod (capability may not be added); its admin "
        f"runs `oc patch scc {name} --type=json -p '{patch}'`, or remove {', '.join(missing)} from "
        "ml-dev-env:security.memlock.capabilities"
    )


# ------------------------------------------------------------------------------------- GPU capacity


def gpu_capacity_problem(get: Callable[[str], dict[str, Any] | None], nodes: list[str], gpus_per_pod: int) -> str | None:
    """One line when a listed GPU node's allocatable `nvidia.com/gpu` is below nodes.gpusPerPod (None: all fit, or unknown).

    The scheduler's NodeResourcesFit filter compares a pod's requests with the node's `status.allocatable` (kubernetes
    pkg/scheduler/framework/plugins/noderesources/fit.go fitsRequest): a pod asking for more stays Pending. `get` reads a
    node (None: absent); a failed read raises LiveReadError, which the caller turns into a warning.
    """
    short = []
    for node in nodes:
        live = get(f"/api/v1/nodes/{node}")
        if live is None:
            continue  # a missing node is the scheduler's to report
        have = ((live.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")
        try:
            count = int(str(have))
        except ValueError:
            count = 0
        if count < gpus_per_pod:
            short.append(f"{node} ({count})")
    if not short:
        return None
    return (
        f"ml-dev-env:nodes.gpusPerPod: got {gpus_per_pod}; the nodes' allocatable nvidia.com/gpu is lower on "
        f"{', '.join(short)}: such a pod stays Pending; ask for at most that many, or choose other nodes.gpuNodes"
    )


# ------------------------------------------------------------------------- GPUs that fit, read live

GPU = "nvidia.com/gpu"
_DONE = ("Succeeded", "Failed")


def _pod_gpus(pod: dict[str, Any]) -> int:
    """A pod's nvidia.com/gpu request as the scheduler counts it (kubernetes pkg/api/v1/resource/helpers.go
    PodRequests: the sum of the containers', or the largest init container's when larger)."""
    spec = pod.get("spec") or {}

    def of(container: dict[str, Any]) -> int:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(GPU) or (resources.get("limits") or {}).get(GPU) or 0
        try:
            return int(str(value))
        except ValueError:
            return 0

    return max(sum(of(c) for c in spec.get("containers") or []), max((of(c) for c in spec.get("initContainers") or []), default=0))


def gpu_fit_line(get: Callable[[str], dict[str, Any] | None], fit: Tally) -> tuple[str, bool]:
    """The live half of stacks/gpus.py's tally: the GPU nodes' allocatable `nvidia.com/gpu` and what pods other than
    this checkout's stacks' hold on them. (line, fits now). Reads the listed gpuNodes (else every node labelled
    nvidia.com/gpu.present=true) and the pods on each; a failed read raises LiveReadError."""
    if fit.nodes:
        nodes = [n for n in (get(f"/api/v1/nodes/{name}") for name in fit.nodes) if n is not None]
    else:
        nodes = list((get("/api/v1/nodes?labelSelector=nvidia.com%2Fgpu.present%3Dtrue") or {}).get("items") or [])
    ours = {(a.namespace, a.app) for a in fit.asks}
    allocatable, held = 0, []
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        try:
            allocatable += int(str(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0)))
        except ValueError:
            pass
        pods = (get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}") or {}).get("items") or []
        for pod in pods:
            meta = pod.get("metadata") or {}
            owners = {(meta.get("namespace"), o.get("name")) for o in meta.get("ownerReferences") or [] if o.get("kind") == "StatefulSet"}
            gpus = _pod_gpus(pod)
            if gpus and (pod.get("status") or {}).get("phase") not in _DONE and not owners & ours:
                held.append((f"{meta.get('namespace')}/{meta.get('name')}", gpus))
    others = sum(g for _, g in held)
    free = allocatable - others
    head = f"GPUs on cluster {fit.cluster} (live): {fit.asked} asked by this checkout's stacks"
    head += f", {allocatable} allocatable on {len(nodes)} GPU nodes"
    if fit.asked <= free:
        return f"{head}, {others} held by other pods: fits", True
    if fit.asked <= allocatable:
        holders = ", ".join(f"{name} ({gpus})" for name, gpus in sorted(held, key=lambda h: -h[1])[:8])
        more = f" and {len(held) - 8} more" if len(held) > 8 else ""
        return (
            f"{head}: fits once {fit.asked - free} GPUs free; other pods hold {others}: {holders}{more} "
            "(list them: oc get pods -A --field-selector spec.nodeName=<node> -o custom-columns="
            "NS:.metadata.namespace,POD:.metadata.name,GPUS:.spec.containers[*].resources.requests.nvidia\\.com/gpu)"
        ), False
    return f"{head}: never fits, {fit.asked - allocatable} more than the nodes have", False


def report_gpu_fit(fit: Tally | None, context: str | None, render_yaml_to_directory: str | None) -> None:
    """At preview and up: one line on whether the cluster's GPUs fit every stack of the checkout (info when they do,
    a warning when not), from the live nodes and pods when the API answers, else from the stack files alone.
    Offline (`make render` prints the tally itself) and without a tally: nothing."""
    if fit is None or _offline(render_yaml_to_directory):
        return
    line, fits = fit.line, fit.fits
    if live_reads_enabled(render_yaml_to_directory):
        try:
            client = KubeClient(context)
            line, fits = gpu_fit_line(client.get, fit)
        except ApiSilent:
            pass
        except LiveReadError as exc:
            line = f"{line} (the live nodes and pods could not be read: {exc})"
    (pulumi.log.info if fits else pulumi.log.warn)(line)
