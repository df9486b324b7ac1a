"""The pods' image on the GPU nodes before it is needed (`image.prePull`): a pre-pull DaemonSet or a PinnedImageSet.

Why its own module: two ways to one end (the runtime image in every GPU node's image store before a pod needs it),
one decision over the same config, and nothing else of the StatefulSet's.

* **daemonSet** — one pod per GPU node (the GPU pods' nodeSelector, node affinity and tolerations; no GPU, requests
  of 1m CPU / 16Mi), whose only container is the pods' image sleeping: the kubelet pulls it once per node and keeps
  it while a container uses it. A changed image (a rebuilt runtime tag) updates the DaemonSet's template; the
  StatefulSet depends on the DaemonSet, and pulumi-kubernetes awaits its rollout (provider/pkg/await/daemonset.go,
  dsAwaiter.rolloutComplete: kstatus Current, every pod updated and available) before the StatefulSet changes, so
  the rebuilt image is on every GPU node before the StatefulSet rolls to it. `maxSurge: 100%`, `maxUnavailable: 0`:
  the DaemonSet controller starts the new pod beside the old on every node at once and deletes the old one when the
  new is available (kubernetes pkg/controller/daemon/update.go, rollingUpdate: past `if maxSurge == 0 {…}`, "When
  surging", a node whose old pod is available is a surge candidate, up to maxSurge of them get a new pod
  (newNodesToCreate), and an old pod is deleted once its node's new pod is available: "we're available, delete the old
  pod"), so the old image stays in use, hence not garbage-collected, until the new one is on the node.
* **pinnedImageSet** — OpenShift's `PinnedImageSet` (machineconfiguration.openshift.io/v1): the machine-config
  daemon pulls the digest on every node of the pool and CRI-O pins it (never garbage-collected):
  openshift/machine-config-operator pkg/daemon/pinned_image_set.go, PinnedImageSetManager.prefetchImageSets and
  ensureCrioPinnedImagesConfigFile. The pool picks the set by its labels: pkg/controller/pinnedimageset/
  pinned_image_set.go, syncMachineConfigPool lists the sets matching the pool's `machineConfigSelector`, hence the
  `machineconfiguration.openshift.io/role: <image.machineConfigPool>` label. The daemon pulls with the node's pull
  secret (newRegistryAuth reads the kubelet's auth file), not the namespace's. Served on OpenShift 4.20 behind the
  PinnedImages feature gate (openshift/api release-4.20 types_pinnedimageset.go: `+openshift:enable:FeatureGate=
  PinnedImages`), ungated later: where the CRD is not served the live check says so in one line and the DaemonSet
  is used instead (components/live_checks.py check_pinned_image_set).

Only the cluster stack renders either: an environment runs the cluster's image on the same GPU nodes.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components import crds, pod
from core import naming
from stacks.config import StackConfig

PINNED_IMAGE_SET_API = "machineconfiguration.openshift.io/v1"
POOL_ROLE_LABEL = "machineconfiguration.openshift.io/role"
CONTAINER = "prepull"
REQUESTS = {"cpu": "1m", "memory": "16Mi"}
LIMITS = {"cpu": "10m", "memory": "32Mi"}
# The image's own shell sleeps (no second image to pin); `exec` so the kubelet's SIGTERM ends it at once.
COMMAND = ["/bin/sh", "-c", "exec sleep infinity"]


def selector_labels(app: str) -> dict[str, str]:
    """The DaemonSet's pods: never the GPU pods' selector (their anti-affinity and Services must not see them)."""
    return {"app.kubernetes.io/name": "ml-dev-env-prepull", "app.kubernetes.io/instance": app}


def node_affinity(config: StackConfig) -> k8s.core.v1.AffinityArgs | None:
    """The GPU pods' node affinity (nodes.gpuNodes), without their pod anti-affinity."""
    affinity = pod.affinity(config, naming.selector_labels(config.cluster.app_name))
    return k8s.core.v1.AffinityArgs(node_affinity=affinity.node_affinity) if config.nodes.gpu_nodes else None


def daemonset_spec(config: StackConfig, image: pulumi.Input[str]) -> k8s.apps.v1.DaemonSetSpecArgs:
    app = config.cluster.app_name
    selector = selector_labels(app)
    return k8s.apps.v1.DaemonSetSpecArgs(
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
        update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(
            type="RollingUpdate",
            rolling_update=k8s.apps.v1.RollingUpdateDaemonSetArgs(max_surge="100%", max_unavailable=0),
        ),
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels={**selector, **naming.stack_labels(config.cluster.name)}),
            spec=k8s.core.v1.PodSpecArgs(
                # The GPU pods' account: it pulls from where they pull (the namespace's registry credentials).
                service_account_name=config.security.service_account,
                automount_service_account_token=False,
                termination_grace_period_seconds=1,
                node_selector=pod.node_selector(config),
                affinity=node_affinity(config),
                tolerations=pod.tolerations(config),
                security_context=k8s.core.v1.PodSecurityContextArgs(seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")),
                containers=[
                    k8s.core.v1.ContainerArgs(
                        name=CONTAINER,
                        image=image,
                        image_pull_policy="IfNotPresent",
                        command=COMMAND,
                        resources=k8s.core.v1.ResourceRequirementsArgs(requests=REQUESTS, limits=LIMITS),
                        security_context=k8s.core.v1.SecurityContextArgs(
                            allow_privilege_escalation=False,
                            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
                        ),
                    )
                ],
            ),
        ),
    )


DISCOVERY_PATH = f"/apis/{PINNED_IMAGE_SET_API}"
NOT_SERVED = (
    "image.prePull: got 'pinnedImageSet'; this cluster does not serve machineconfiguration.openshift.io/v1 "
    "pinnedimagesets (OpenShift 4.20: feature gate PinnedImages), so the GPU nodes pre-pull with a DaemonSet instead"
)


def serves_pinned_image_sets(discovery: dict[str, Any] | None) -> bool:
    """Whether an API group discovery document (`GET /apis/machineconfiguration.openshift.io/v1`; None: 404) lists
    pinnedimagesets. Discovery is readable by every authenticated user (the system:discovery ClusterRole)."""
    return any(r.get("name") == "pinnedimagesets" for r in (discovery or {}).get("resources") or [])


def pinned_image_set_fields(image: str) -> dict[str, Any]:
    return {"spec": {"pinnedImages": [{"name": image}]}}


def pre_pull(
    name: str, config: StackConfig, image: pulumi.Input[str], labels: dict[str, str], served: bool | None, opts: pulumi.ResourceOptions
) -> pulumi.Resource | None:
    """The object that puts `image` on the GPU nodes (None: prePull off, or an environment stack).

    `served`: whether the cluster serves PinnedImageSet (None: not read, e.g. an offline render); False makes a
    pinnedImageSet stack pre-pull with the DaemonSet.
    """
    mode = config.image.pre_pull
    if mode == "off" or config.environment is not None:
        return None
    app, ns = config.cluster.app_name, config.cluster.namespace
    if mode == "pinnedImageSet" and served is not False:
        assert config.image.reference is not None  # ImageConfig._pinned_by_digest
        return crds.TopLevelObject(
            f"{name}-pinned-image-set",
            api_version=PINNED_IMAGE_SET_API,
            kind="PinnedImageSet",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=naming.pinned_image_set(ns, app),
                labels={**labels, POOL_ROLE_LABEL: config.image.machine_config_pool},
            ),
            fields=pinned_image_set_fields(config.image.reference),
            opts=opts,
        )
    return k8s.apps.v1.DaemonSet(
        f"{name}-prepull",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=naming.pre_pull_daemonset(app),
            namespace=ns,
            labels=labels,
            # the pull of a multi-GB image on every GPU node: the pods' own budget (components/gpu_cluster.py)
            annotations={"pulumi.com/timeoutSeconds": str(ROLLOUT_SECONDS)},
        ),
        spec=daemonset_spec(config, image),
        opts=opts,
    )


ROLLOUT_SECONDS = 1800
"""How long `pulumi up` waits for the image on every GPU node (gpu_cluster.ROLLOUT_BASE_SECONDS, the pods' pull)."""
