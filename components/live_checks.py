"""The live reads a `pulumi preview`/`up` makes before it declares anything: what the cluster already holds that the
apply could not adopt or that the pods need (components/preflight.py reads; components/environment.py guards).

Each check reads only where there is a cluster to read (`preflight.live_reads_enabled`: not in an offline render, the
tests or GitOps), warns with one line and goes on when the read fails, and stops the run with one line (a
`pulumi.RunError`) on a conflict. Moved here from __main__.py as they were: the program is config -> components ->
exports, and these are the components' checks.
"""

from __future__ import annotations

import re
from typing import Any

import pulumi

from components import environment as layers
from components import preflight, prepull
from components.crds import SSHD_NEEDS
from components.gpu_cluster import rollout_timeout, selector_labels
from components.storage import claim_template_names
from core import naming
from stacks.config import StackConfig
from stacks.gpus import Tally


def live_reader(cfg: StackConfig) -> Any:
    """GET one object (None: absent or unreadable) with one client; None when there is no cluster to read, or when it
    does not answer its first check (one warning, no more reads: components/environment.py guarded_reader)."""
    if not preflight.live_reads_enabled(cfg.cluster.render_yaml_to_directory):
        return None
    return layers.guarded_reader(lambda: preflight.KubeClient(cfg.cluster.kube_context), pulumi.log.warn)


def check_statefulset(cfg: StackConfig) -> None:
    """Stop (one line) before a foreign StatefulSet of our name that the apply could not adopt; see components/preflight.py."""
    app, ns = cfg.cluster.app_name, cfg.cluster.namespace
    if not preflight.live_reads_enabled(cfg.cluster.render_yaml_to_directory):
        return  # offline render / tests, or GitOps: no cluster to read
    try:
        live = preflight.read_statefulset(cfg.cluster.kube_context, ns, app)
    except preflight.LiveReadError as exc:
        pulumi.log.warn(f"could not check for an existing StatefulSet {ns}/{app} ({exc}); continuing")
        return
    problem = preflight.statefulset_conflict(
        live,
        owner_labels=naming.owner_labels(cfg.cluster.name),
        selector=selector_labels(cfg),
        service_name=naming.headless_service(app),
        claim_templates=claim_template_names(cfg.storage),
    )
    if problem:
        raise pulumi.RunError(problem)


def check_scc(cfg: StackConfig) -> None:
    """An SCC the stack only binds (createScc: false) must leave root's sshd SETUID/SETGID and allow what the pods add;
    see components/preflight.py."""
    memlock = cfg.security.memlock
    if memlock.mode != "scc" or memlock.create_scc or not memlock.scc_name:
        return
    if not preflight.live_reads_enabled(cfg.cluster.render_yaml_to_directory):
        return
    try:
        live = preflight.read_scc(cfg.cluster.kube_context, memlock.scc_name)
    except preflight.LiveReadError as exc:
        pulumi.log.warn(
            f"could not read SecurityContextConstraints {memlock.scc_name} ({exc}); check that its requiredDropCapabilities "
            f"lack SETUID and SETGID: oc get scc {memlock.scc_name} -o jsonpath='{{.requiredDropCapabilities}}'"
        )
        return
    problem = preflight.scc_drops_needed(live, memlock.scc_name, SSHD_NEEDS)
    problem = problem or preflight.scc_capabilities_refused(live, memlock.scc_name, list(memlock.pod_capabilities))
    if problem:
        raise pulumi.RunError(problem)


def check_attachments(cfg: StackConfig) -> None:
    """An RDMA environment in its own namespace: the attachments its pods name must exist there (components/environment.py)."""
    rdma, environment, ns = cfg.network.rdma, cfg.environment, cfg.cluster.namespace
    if environment is None or not environment.namespace or cfg.network.effective_mode != "rdma" or rdma.create_attachments:
        return
    if not preflight.live_reads_enabled(cfg.cluster.render_yaml_to_directory):
        return
    namespace = rdma.attachment_namespace or ns
    try:
        client = preflight.KubeClient(cfg.cluster.kube_context)
        problem = layers.attachments_problem(
            lambda path: client.get(path, timeout=layers.READ_TIMEOUT), namespace, list(rdma.attachments), rollout_timeout(cfg)
        )
    except preflight.LiveReadError as exc:
        pulumi.log.warn(f"could not check the NetworkAttachmentDefinitions of {namespace} ({exc}); continuing")
        return
    if problem:
        raise pulumi.RunError(problem)


def check_gpu_capacity(cfg: StackConfig) -> None:
    """Listed GPU nodes must have at least gpusPerPod allocatable GPUs (components/preflight.py gpu_capacity_problem)."""
    if not cfg.nodes.gpu_nodes or not preflight.live_reads_enabled(cfg.cluster.render_yaml_to_directory):
        return
    try:
        client = preflight.KubeClient(cfg.cluster.kube_context)
        problem = preflight.gpu_capacity_problem(
            lambda path: client.get(path, timeout=layers.READ_TIMEOUT), list(cfg.nodes.gpu_nodes), cfg.nodes.gpus_per_pod
        )
    except preflight.LiveReadError as exc:
        pulumi.log.warn(f"could not read the GPU nodes' allocatable nvidia.com/gpu ({exc}); nodes.gpusPerPod not checked against them")
        return
    if problem:
        raise pulumi.RunError(problem)


def pinned_image_set_served(cfg: StackConfig) -> bool | None:
    """image.prePull pinnedImageSet: whether the cluster serves PinnedImageSet (None: not read); where it does not,
    one line, and the stack pre-pulls with the DaemonSet (components/prepull.py)."""
    if cfg.image.pre_pull != "pinnedImageSet" or cfg.environment is not None:
        return None
    if not preflight.live_reads_enabled(cfg.cluster.render_yaml_to_directory):
        return None
    try:
        client = preflight.KubeClient(cfg.cluster.kube_context)
        served = prepull.serves_pinned_image_sets(client.get(prepull.DISCOVERY_PATH, timeout=layers.READ_TIMEOUT))
    except preflight.LiveReadError as exc:
        pulumi.log.warn(f"could not read {prepull.DISCOVERY_PATH} ({exc}); rendering the PinnedImageSet as configured")
        return None
    if not served:
        pulumi.log.warn(prepull.NOT_SERVED)
    return served


IMAGE_VOLUME_SUBPATH = (1, 33)
"""The first Kubernetes whose image volumes take `subPath`: KEP-4639's beta (kubernetes/enhancements
keps/sig-node/4639-oci-volume-source; kubernetes/website content/en/docs/tasks/configure-pod-container/image-volumes.md:
"subPath (or subPathExpr) … from Kubernetes v1.33"); alpha in 1.31 (pkg/features/kube_features.go ImageVolume), off by
default through 1.33."""


def image_volumes_problem(version: dict[str, Any] | None) -> str | None:
    """One line when the API server's `/version` is older than IMAGE_VOLUME_SUBPATH (None: new enough, or unknown)."""
    if not isinstance(version, dict):
        return None
    digits = [str(version.get(k) or "").rstrip("+") for k in ("major", "minor")]
    if not all(d.isdigit() for d in digits):
        return None
    have = (int(digits[0]), int(digits[1]))
    if have >= IMAGE_VOLUME_SUBPATH:
        return None
    return (
        f"ml-dev-env:cluster.imageVolumes: got true; the cluster's Kubernetes is {version.get('gitVersion') or '.'.join(digits)}, "
        f"and image volumes take a subPath (models[].mountInEnv mounts the image's models/ folder) from "
        f"{'.'.join(map(str, IMAGE_VOLUME_SUBPATH))}: set it false and remove mountInEnv until the cluster is upgraded"
    )


IMAGE_VOLUME_GATE = re.compile(r'^kubernetes_feature_enabled\{[^}]*name="ImageVolume"[^}]*\}\s+(\S+)', re.MULTILINE)
"""The API server's own record of its ImageVolume gate on `/metrics` (k8s.io/component-base metrics/prometheus/feature
metrics.go, RecordFeatureInfo: `kubernetes_feature_enabled{name, stage}` 1 or 0)."""


def image_volume_gate_problem(metrics: str | None) -> str | None:
    """One line when the API server's /metrics says its ImageVolume gate is off (None: on, or not said)."""
    found = IMAGE_VOLUME_GATE.search(metrics or "")
    if found is None or found.group(1) not in ("0", "0.0"):
        return None
    return (
        "ml-dev-env:cluster.imageVolumes: got true; the cluster's API server has its ImageVolume feature gate off "
        '(its /metrics: kubernetes_feature_enabled{name="ImageVolume"} 0), and it drops image volumes from a pod without '
        "a word: set it false and remove models[].mountInEnv, or ask the cluster admin to enable the gate"
    )


def check_image_volumes(cfg: StackConfig, cluster: StackConfig) -> None:
    """models[].mountInEnv (the cluster stack's models): the API server must be new enough for image volumes with subPath
    (`/version`, readable by every authenticated user: the system:public-info-viewer ClusterRole) and have the ImageVolume
    gate on where its `/metrics` is readable (few users may: a 403 there is no warning, the key stands, and `ml-dev
    status` names a model path a pod lacks)."""
    if not any(m.mount_in_env for m in cluster.models) or not cluster.cluster.image_volumes:
        return
    if not preflight.live_reads_enabled(cfg.cluster.render_yaml_to_directory):
        return
    try:
        client = preflight.KubeClient(cfg.cluster.kube_context)
        problem = image_volumes_problem(client.get("/version", timeout=layers.READ_TIMEOUT))
    except preflight.LiveReadError as exc:
        pulumi.log.warn(f"could not read the API server's /version ({exc}); models[].mountInEnv not checked against it")
        return
    if problem is None:
        try:
            metrics = client.get_bytes("/metrics", timeout=layers.READ_TIMEOUT, accept="text/plain")
            problem = image_volume_gate_problem(metrics.decode("utf-8", "replace") if metrics else None)
        except preflight.LiveReadError:
            pass  # no right to read /metrics (most users): cluster.imageVolumes is the admin's word
    if problem:
        raise pulumi.RunError(problem)


def check_all(cfg: StackConfig, gpus: Tally | None) -> None:
    """Every check above, in the order the program ran them, then the line on whether the cluster's GPUs fit every
    stack of the checkout (components/preflight.py report_gpu_fit)."""
    check_statefulset(cfg)
    check_scc(cfg)
    check_attachments(cfg)
    check_gpu_capacity(cfg)
    preflight.report_gpu_fit(gpus, cfg.cluster.kube_context, cfg.cluster.render_yaml_to_directory)
