"""Cluster and environment layers of one cluster (docs: Use, "Team environments").

* `cluster_facts`: what a cluster stack exports for its environments (`environment_facts`, versioned).
* `stack_label_transformation`: every Kubernetes object's own metadata carries `ml-dev-env/stack: <stack>`
  (pod templates are left alone, so adding it restarts nothing); at preview/up an object this stack would
  create that already carries another stack's label stops the run (`ownership_conflict`).
* `image_puller_binding`: an environment in its own namespace may pull the cluster's image.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.gpu_cluster import scc_role_name
from components.image_build import runtime_tag
from components.preflight import READ_CAP, UNANSWERED, ApiSilent, LiveReadError
from components.storage import claim_name
from core import naming
from inpod import contract
from stacks.config import StackConfig
from stacks.environment import ENVIRONMENT_KEY, FACTS_VERSION, ClusterFacts, read_facts

STACK_LABEL = contract.STACK_LABEL


def stack_label(stack: str) -> dict[str, str]:
    return {STACK_LABEL: stack}


def cluster_facts(cfg: StackConfig, node_readers: tuple[str, ...] = ()) -> ClusterFacts:
    """The facts a cluster stack (its config) gives its environments; `environment_facts` output, and what the
    environment expects from its cluster's file (a difference means the cluster stack is not deployed as written).
    `node_readers`: the usage recorders its node reader is bound to (stacks/gpus.py Tally.node_readers)."""
    ns, app = cfg.cluster.namespace, cfg.cluster.app_name
    build = cfg.image.build
    image = naming.internal_image(ns, build.image_stream, runtime_tag(build)) if build is not None else str(cfg.image.reference)
    memlock = cfg.security.memlock
    scc = role = None
    if cfg.network.effective_mode == "rdma" and memlock.mode == "scc" and memlock.scc_name:
        scc = naming.stack_scc_name(memlock.scc_name, ns, app) if memlock.create_scc else memlock.scc_name
        role = scc_role_name(scc) if memlock.create_scc else None
    elif cfg.network.effective_mode == "rdma" and memlock.mode == "privileged":
        scc = "privileged"
    claims = {v.name: claim_name(app, v.name) for v in cfg.storage.volumes if cfg.storage.scope_of(v) == "shared"}
    return ClusterFacts(
        version=FACTS_VERSION,
        cluster=cfg.cluster.name,
        namespace=ns,
        app_name=app,
        runtime_image=image,
        scc=scc,
        scc_role=role,
        shared_claims=claims,
        usage_node_readers=node_readers,
    )


def shape_differences(deployed: ClusterFacts, expected: ClusterFacts) -> list[str]:
    """What of the environment's own objects' shape the deployed cluster and this checkout disagree on.

    The shape is what names or places the environment's objects: its namespace and appName, whether its pods use an
    SCC (and a Role the cluster grants) or none, which shared claims they mount. Everything else the cluster deployed
    (its runtime image, the SCC's, Role's and claims' names) is used as deployed and never compared.
    """
    out = []
    for key, label in (("namespace", "namespace"), ("app_name", "appName")):
        if getattr(deployed, key) != getattr(expected, key):
            out.append(f"{label}: deployed {getattr(deployed, key)!r}, checkout {getattr(expected, key)!r}")
    for key, label in (("scc", "scc"), ("scc_role", "sccRole")):
        if (getattr(deployed, key) is None) != (getattr(expected, key) is None):
            out.append(f"{label}: deployed {getattr(deployed, key) or 'none'}, checkout {getattr(expected, key) or 'none'}")
    if set(deployed.shared_claims) != set(expected.shared_claims):
        out.append(f"sharedClaims: deployed {sorted(deployed.shared_claims)}, checkout {sorted(expected.shared_claims)}")
    return out


def checked_facts(deployed: Any, expected: ClusterFacts, stack_ref: str) -> tuple[ClusterFacts | None, str | None]:
    """The cluster stack's deployed `environment_facts`, or one line when they cannot serve this environment.

    A runtime image (a requirements bump, a stale checkout) or an SCC/claim name that differs from what the checkout
    computes never stops the environment: it runs what is deployed. Only a difference in its own objects' shape does.
    """
    facts, problem = read_facts(deployed, expected.cluster, stack_ref)
    if facts is None:
        return None, problem
    differ = shape_differences(facts, expected)
    if differ:
        return None, (
            f"{ENVIRONMENT_KEY}: your checkout differs from what is deployed on {expected.cluster} ({'; '.join(differ)}): "
            "git pull, or ask the cluster owner"
        )
    return facts, None


def node_reader_line(deployed: ClusterFacts, cfg: StackConfig, cluster: StackConfig, stack_ref: str) -> str | None:
    """One line when the deployed cluster stack did not let this environment's usage recorder read the nodes although
    both want it (an environment added after the cluster's last `up`, or a cluster deployed by an older program):
    until the cluster's next `up` the recorder reads the pods alone (inpod/usage.py Nodes says so once in its log)."""
    if not (cfg.lifecycle.usage_reads_nodes and cluster.lifecycle.usage_reads_nodes):
        return None
    me = f"{cfg.cluster.namespace}/{naming.usage_recorder(cfg.cluster.app_name)}"
    if me in deployed.usage_node_readers:
        return None
    return (
        f"lifecycle.usageReadsNodes: the cluster stack {stack_ref} was last deployed without this environment's usage "
        f"recorder ({me}) among its node readers: run `pulumi up` of {stack_ref} again (no change to it, cluster-admin) so a "
        "pod on a lost node is charged until the node's last heartbeat; until then it is charged until its deletion"
    )


# ------------------------------------------------------------------------------------------ ownership

# Kinds whose API resource name is not `<kind lowercased>s`.
PLURALS = {"NetworkPolicy": "networkpolicies", "SecurityContextConstraints": "securitycontextconstraints", "Ingress": "ingresses"}
CLUSTER_SCOPED = {"SecurityContextConstraints", "Namespace", "ClusterRole", "ClusterRoleBinding", "PinnedImageSet"}


def api_path(resource_type: str, namespace: str | None, name: str) -> str | None:
    """GET path of an object from its Pulumi type (`kubernetes:apps/v1:StatefulSet`), None for a non-object type."""
    parts = resource_type.split(":")
    if len(parts) != 3 or parts[0] != "kubernetes" or "/" not in parts[1]:
        return None
    group_version, kind = parts[1], parts[2]
    if group_version.startswith("core/"):
        group_version = group_version.removeprefix("core/")
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    plural = PLURALS.get(kind, f"{kind.lower()}s")
    if kind in CLUSTER_SCOPED or not namespace:
        return f"{base}/{plural}/{name}"
    return f"{base}/namespaces/{namespace}/{plural}/{name}"


def ownership_conflict(live: dict[str, Any] | None, stack: str, kind: str, namespace: str | None, name: str) -> str | None:
    """One line when the live object belongs to another stack (its `ml-dev-env/stack` label), else None.

    No live object, one without the label (made by hand, by the original tool or by this program before the
    label existed) or one of this stack: adopted or updated as before.
    """
    if live is None:
        return None
    owner = ((live.get("metadata") or {}).get("labels") or {}).get(STACK_LABEL)
    if not owner or owner == stack:
        return None
    where = f"{namespace}/{name}" if namespace else name
    return (
        f"ml-dev-env: {kind} {where} belongs to stack {owner!r} (label {STACK_LABEL}); stack {stack!r} would take it over. "
        f"Give this stack other names (cluster.appName, environment.name) or remove the object from {owner!r} first"
    )


LiveReader = Callable[[str], "dict[str, Any] | None"]

PROBE_PATH = "/version"
"""The guard's first read: any authenticated user may GET it (the API server's system:public-info-viewer role)."""
READ_TIMEOUT = READ_CAP
"""Seconds one guard read waits (components/preflight.py READ_CAP): the first unanswered read ends every live read of the
run, the probe's included, so a silent API costs one read in all."""


def guarded_reader(connect: Callable[[], Any], warn: Callable[[str], None], timeout: float = READ_TIMEOUT) -> LiveReader | None:
    """The ownership guard's reader, failing fast: one check first (`PROBE_PATH`); no answer → one warning, no reads.

    `connect()` gives a client with `get(path, timeout=)` (components/preflight.py KubeClient); a read that fails later
    warns once and turns every further read into None (absent), so an API that stops answering costs one timeout, not
    one per object.
    """
    try:
        client = connect()
        client.get(PROBE_PATH, timeout=timeout)
    except LiveReadError as exc:
        if UNANSWERED:  # no answer at all: every live check of the run is off (components/preflight.py READ_CAP)
            warn(
                f"could not reach the cluster's API ({exc}); no live check reads anything this run: the ownership guard (another "
                "stack's objects go unnoticed), an existing StatefulSet, the SCC, the attachments and the GPU nodes are not checked"
            )
        else:  # an answer that refuses (401, 403): the other checks read and say what they could not
            warn(
                f"could not reach the cluster's API ({exc}); the ownership guard reads nothing this run "
                "(another stack's objects go unnoticed)"
            )
        return None
    failed: list[str] = []

    def read(path: str) -> dict[str, Any] | None:
        if failed:
            return None
        try:
            result: dict[str, Any] | None = client.get(path, timeout=timeout)
            return result
        except ApiSilent:
            failed.append("silent")  # another live check met the silent API and warned: nothing more to say
            return None
        except LiveReadError as exc:
            failed.append(str(exc))
            warn(f"could not check who owns the objects of this stack ({exc}); the guard reads nothing more this run")
            return None

    return read


def _metadata_of(props: Mapping[str, Any]) -> tuple[str, Any] | None:
    meta = props.get("metadata")
    return None if meta is None else ("metadata", meta)


def _get(meta: Any, key: str) -> Any:
    return meta.get(key) if isinstance(meta, dict) else getattr(meta, key, None)


def _with_labels(meta: Any, labels: dict[str, str]) -> Any:
    current = _get(meta, "labels")
    if current is not None and not isinstance(current, dict):
        return meta  # an Output: leave it as it is
    merged = {**(current or {}), **labels}
    if isinstance(meta, dict):
        return {**meta, "labels": merged}
    out = copy.copy(meta)
    pulumi.set(out, "labels", merged)
    return out


def stack_label_transformation(stack: str, reader: LiveReader | None) -> Callable[[pulumi.ResourceTransformationArgs], Any]:
    """A stack transformation: label every object this stack owns; with a live `reader`, stop before another stack's object.

    Patches (`…Patch` types) only annotate objects they do not own: neither labelled nor checked. The reader raises
    nothing: it returns the live object or None (a failed read is a warning in components/live_checks.py's reader).
    """

    def transform(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if not args.type_.startswith("kubernetes:") or args.type_.endswith("Patch") or args.type_.startswith("pulumi:providers"):
            return None
        found = _metadata_of(args.props)
        if found is None:
            return None
        key, meta = found
        name, namespace = _get(meta, "name"), _get(meta, "namespace")
        if reader is not None and isinstance(name, str) and (namespace is None or isinstance(namespace, str)):
            path = api_path(args.type_, namespace, name)
            if path:
                problem = ownership_conflict(reader(path), stack, args.type_.rsplit(":", 1)[-1], namespace, name)
                if problem:
                    raise pulumi.RunError(problem)
        props = dict(args.props)
        props[key] = _with_labels(meta, stack_label(stack))
        return pulumi.ResourceTransformationResult(props=props, opts=args.opts)

    return transform


# ------------------------------------------------------------------------------------- environment


def nad_path(namespace: str, name: str) -> str:
    return f"/apis/k8s.cni.cncf.io/v1/namespaces/{namespace}/network-attachment-definitions/{name}"


def attachments_problem(get: Callable[[str], Any], namespace: str, names: list[str], wait_seconds: int) -> str | None:
    """One line when an environment's own namespace lacks attachments its pods name (None: all there).

    `get` returns the live object or None when it does not exist (a read that fails raises; the caller warns). Multus
    refuses a pod whose `k8s.v1.cni.cncf.io/networks` names an attachment it cannot find, so its pods would never start:
    the run stops before the StatefulSet's wait instead of after it.
    """
    missing = [name for name in names if get(nad_path(namespace, name)) is None]
    if not missing:
        return None
    return (
        f"ml-dev-env:environment.namespace: {namespace} has no NetworkAttachmentDefinition {', '.join(missing)}: the pods "
        f"could not start (the up would wait {wait_seconds}s and fail); an admin creates one SriovNetwork per attachment in "
        f"openshift-sriov-network-operator with spec.networkNamespace: {namespace} (`make render` lists them with their "
        "resourceName), then run again"
    )


def image_puller_binding(
    name: str, cfg: StackConfig, facts: ClusterFacts, labels: dict[str, str], opts: pulumi.ResourceOptions
) -> k8s.rbac.v1.RoleBinding | None:
    """An environment in its own namespace: its ServiceAccount may pull the cluster's ImageStreams.

    OpenShift's `system:image-puller` ClusterRole grants `get` on `imagestreams/layers` (openshift/origin,
    bootstrappolicy `ImagePullerRoleName`: rule `get` on `imagestreams/layers` in groups "" and image.openshift.io);
    bound in the cluster's namespace it lets pods of another namespace pull that namespace's images.
    """
    ns = cfg.cluster.namespace
    if ns == facts.namespace:
        return None
    app = cfg.cluster.app_name
    return k8s.rbac.v1.RoleBinding(
        f"{name}-image-puller",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{app}-image-puller", namespace=facts.namespace, labels=labels),
        role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="system:image-puller"),
        subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=cfg.security.service_account, namespace=ns)],
        opts=opts,
    )
