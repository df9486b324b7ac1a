"""What a stack needs before `pulumi up`: secrets, cluster prerequisites, objects that need admin rights.

Pure functions of the validated config and the rendered objects (plain dicts), used by `make render`
and tested directly. Everything is derived from what the program would apply — a new component that
mounts a new storage class, requests a new extended resource or creates an object in another
namespace shows up here without a change to this file.

Why one module: one reading of the rendered objects (what they reference that the stack does not create) with its
table of kinds; the kinds' rules share the walk.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import inpod
from core.quantity import format_gib, parse_quantity
from stacks.config import StackConfig
from stacks.errors import PREFIX
from stacks.loader import SECRET_KEYS, required_secrets

# Kinds the API server keeps outside any namespace (rendered or plausible for this program).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "Project",
        "ClusterRole",
        "ClusterRoleBinding",
        "SecurityContextConstraints",
        "CustomResourceDefinition",
        "StorageClass",
        "PersistentVolume",
        "PriorityClass",
        "RuntimeClass",
        "IngressClass",
        "ClusterResourceQuota",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "MachineConfig",
        "MachineConfigPool",
        "Node",
        "ClusterTask",
        "PinnedImageSet",
    }
)
# Container resources every cluster has; any other is an extended resource some operator must advertise.
CORE_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
GPU_RESOURCE = "nvidia.com/gpu"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
POD_OWNERS = frozenset({"StatefulSet", "Deployment", "DaemonSet", "ReplicaSet", "Job"})
# OpenShift names the ClusterRole granting `use` of an SCC `system:openshift:scc:<scc>`, and ships one only
# for its own SCCs; these and the default project roles exist on every OpenShift cluster.
SCC_ROLE_PREFIX = "system:openshift:scc:"
DEFAULT_SCCS = frozenset(
    {
        "anyuid",
        "hostaccess",
        "hostmount-anyuid",
        "hostnetwork",
        "hostnetwork-v2",
        "machine-api-termination-handler",
        "nonroot",
        "nonroot-v2",
        "privileged",
        "restricted",
        "restricted-v2",
        "node-exporter",
    }
)
DEFAULT_CLUSTER_ROLES = frozenset(
    {
        "admin",
        "edit",
        "view",
        "system:image-builder",
        "system:image-puller",
        "system:image-pusher",
        "system:deployer",
        *(SCC_ROLE_PREFIX + scc for scc in DEFAULT_SCCS),
    }
)


@dataclass(frozen=True)
class SecretStatus:
    key: str
    purpose: str
    needed: bool
    is_set: bool

    @property
    def command(self) -> str:
        return f"pulumi config set --secret {PREFIX}{self.key} …"


SRIOV_OPERATOR_NAMESPACE = "openshift-sriov-network-operator"


def sriov_network_recipe(config: StackConfig, namespace: str, names: list[str]) -> str:
    """How an admin makes the attachments of `namespace`: one SriovNetwork each, in the operator's namespace, whose
    `spec.networkNamespace` is `namespace` (k8snetworkplumbingwg/sriov-network-operator api/v1/sriovnetwork_types.go
    SriovNetworkSpec: NetworkNamespace, the namespace the operator renders its NetworkAttachmentDefinition into, under
    the SriovNetwork's name; ResourceName, the device plugin's resource without its `openshift.io/` prefix)."""
    rdma = config.network.rdma
    resources = dict(zip(rdma.attachments, rdma.sriov_resources, strict=False))
    specs = [f"{name} (resourceName {resources.get(name, '<resource>').split('/')[-1]})" for name in names]
    return f"an admin creates them as SriovNetworks in {SRIOV_OPERATOR_NAMESPACE} with spec.networkNamespace: {namespace}: " + ", ".join(
        specs
    )


@dataclass(frozen=True)
class Need:
    """One thing outside the stack that must hold: `what`, who asks for it (`why`), how to look (`check`)."""

    what: str
    why: str
    check: str = ""


def secret_status(config: StackConfig, stack_file_config: Mapping[str, Any]) -> list[SecretStatus]:
    """Every secret key: needed by this config or not, and set (a `secure:` value in the stack file) or not."""
    needed = required_secrets(config)
    out = []
    for key, purpose in SECRET_KEYS.items():
        value = stack_file_config.get(PREFIX + key)
        is_set = isinstance(value, dict) and "secure" in value
        if key in needed or is_set:
            out.append(SecretStatus(key, purpose, key in needed, is_set))
    return out


def _name(obj: Mapping[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name', '?')}"


def _users(names: Sequence[str]) -> str:
    """`StatefulSet/x, 4 PipelineRuns`: objects by name, or counted per kind when a kind has more than two."""
    by_kind: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        by_kind.setdefault(name.split("/", 1)[0], []).append(name)
    return ", ".join(", ".join(found) if len(found) <= 2 else f"{len(found)} {kind}s" for kind, found in by_kind.items())


def _pod_specs(obj: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        yield spec
    elif obj.get("kind") in POD_OWNERS:
        yield (spec.get("template") or {}).get("spec") or {}


def _pod_annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    if obj.get("kind") == "Pod":
        return obj.get("metadata", {}).get("annotations") or {}
    template = (obj.get("spec") or {}).get("template") or {}
    return (template.get("metadata") or {}).get("annotations") or {}


def _networks(value: str, default_namespace: str) -> list[tuple[str, str]]:
    """(namespace, name) of a Multus networks annotation: `ns/name@if, name` or its JSON list form."""
    text = value.strip()
    if text.startswith("["):
        return [(n.get("namespace", default_namespace), n["name"]) for n in json.loads(text)]
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        item = item.split("@", 1)[0]
        namespace, _, name = item.rpartition("/")
        out.append((namespace or default_namespace, name))
    return out


def _claim_specs(node: Any, owner: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every PersistentVolumeClaim spec inside an object (claims, claim templates, workspace templates)."""
    if isinstance(node, Mapping):
        if "accessModes" in node and "resources" in node:
            yield owner, node
        for value in node.values():
            yield from _claim_specs(value, owner)
    elif isinstance(node, list):
        for value in node:
            yield from _claim_specs(value, owner)


def _rendered(objects: Sequence[Mapping[str, Any]], kind: str, namespace: str | None = None) -> set[str]:
    return {
        o.get("metadata", {}).get("name", "")
        for o in objects
        if o.get("kind") == kind and (namespace is None or o.get("metadata", {}).get("namespace", namespace) == namespace)
    }


def prerequisites(config: StackConfig, objects: Sequence[Mapping[str, Any]], patches: Sequence[Mapping[str, Any]] = ()) -> list[Need]:
    """What the cluster must already have for these objects to work (one `Need` per thing).

    `objects` are what the stack creates; `patches` what it patches (server-side apply of a few fields
    of an object someone else created), which must therefore exist.

    Why one function: one walk over the objects, one `Need` per kind of thing referenced, as a table of cases.
    """
    ns = config.cluster.namespace
    needs: list[Need] = []
    for patch in patches:
        namespace = patch.get("metadata", {}).get("namespace") or ns
        name, kind = patch.get("metadata", {}).get("name"), patch.get("kind", "")
        where = "" if kind in CLUSTER_SCOPED else f"{namespace}/"
        needs.append(
            Need(
                f"{kind} {where}{name}",
                "the stack only patches it (created elsewhere)",
                f"oc get {kind.lower()} {name}" + ("" if kind in CLUSTER_SCOPED else f" -n {namespace}"),
            )
        )
    env = config.environment
    if env is not None and env.namespace:
        needs.append(Need(f"namespace {ns} exists", f"environment.namespace (create it: `oc new-project {ns}`)", f"oc get namespace {ns}"))
    elif ns not in _rendered(objects, "Namespace"):
        needs.append(Need(f"namespace {ns} exists", "cluster.createNamespace is false", f"oc get namespace {ns}"))
    creator = f"the cluster stack {env.cluster}" if env is not None else "an admin"

    nads: dict[tuple[str, str], list[str]] = {}
    extended: dict[str, list[str]] = {}
    gpu_labels: set[str] = set()
    service_accounts: dict[str, list[str]] = {}
    for obj in objects:
        for namespace, name in _networks(_pod_annotations(obj).get(NETWORKS_ANNOTATION, ""), ns):
            nads.setdefault((namespace, name), []).append(_name(obj))
        for pod in _pod_specs(obj):
            if pod.get("serviceAccountName"):
                service_accounts.setdefault(pod["serviceAccountName"], []).append(_name(obj))
            for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                resources = container.get("resources") or {}
                for resource in {**(resources.get("requests") or {}), **(resources.get("limits") or {})}:
                    if resource not in CORE_RESOURCES and not resource.startswith("hugepages-"):
                        extended.setdefault(resource, []).append(_name(obj))
                        if resource == GPU_RESOURCE:
                            gpu_labels |= {f"{k}={v}" for k, v in (pod.get("nodeSelector") or {}).items()}
        if obj.get("kind") == "PipelineRun":
            account = ((obj.get("spec") or {}).get("taskRunTemplate") or {}).get("serviceAccountName")
            if account:
                service_accounts.setdefault(account, []).append(_name(obj))

    rendered_nads = _rendered(objects, "NetworkAttachmentDefinition")
    missing_nads: dict[str, list[str]] = {}
    nad_users: list[str] = []
    for (namespace, name), users in sorted(nads.items()):
        if not (namespace == ns and name in rendered_nads):
            missing_nads.setdefault(namespace, []).append(name)
            nad_users += users
    for namespace, names in missing_nads.items():
        needs.append(
            Need(
                f"NetworkAttachmentDefinitions in namespace {namespace}: {', '.join(names)}",
                f"{_users(nad_users)} attach them"
                + ("" if config.network.rdma.create_attachments else " (network.rdma.createAttachments is false)")
                + "; "
                + sriov_network_recipe(config, namespace, names),
                f"oc get network-attachment-definitions -n {namespace}",
            )
        )

    classes: dict[str, tuple[set[str], set[str]]] = {}
    for obj in objects:
        for owner, claim in _claim_specs(obj.get("spec") or {}, _name(obj)):
            claim_users, modes = classes.setdefault(claim.get("storageClassName") or "", (set(), set()))
            claim_users.add(owner)
            modes.update(claim.get("accessModes") or [])
    for storage_class, (claim_users, modes) in sorted(classes.items()):
        what = f"StorageClass {storage_class}" if storage_class else "a default StorageClass"
        needs.append(
            Need(
                f"{what} ({', '.join(sorted(modes))})",
                f"claims of {_users(sorted(claim_users))}",
                f"oc get storageclass {storage_class}".strip(),
            )
        )

    if GPU_RESOURCE in extended:
        needs.append(
            Need(
                f"NVIDIA GPU operator: nodes advertise {GPU_RESOURCE}"
                + (f" and carry {', '.join(sorted(gpu_labels))}" if gpu_labels else ""),
                f"{_users(extended.pop(GPU_RESOURCE))} request GPUs",
                "oc get nodes -l nvidia.com/gpu.present=true"
                " -o custom-columns=NODE:.metadata.name,GPUS:.status.allocatable.nvidia\\.com/gpu",
            )
        )
    if config.nodes.gpu_nodes:
        needs.append(
            Need(
                f"nodes {', '.join(config.nodes.gpu_nodes)}",
                "nodes.gpuNodes pins the pods to them",
                f"oc get nodes {' '.join(config.nodes.gpu_nodes)}",
            )
        )
    if extended:
        needs.append(
            Need(
                f"SR-IOV network operator: nodes advertise {', '.join(sorted(extended))}",
                f"{_users([u for users in extended.values() for u in users])} request them (network.rdma.sriovResources)",
                "oc get sriovnetworknodepolicies -n openshift-sriov-network-operator",
            )
        )
    if config.network.effective_mode == "rdma" and config.network.rdma.multi_network_policy:
        needs.append(
            Need(
                "MultiNetworkPolicy enforced on secondary networks (the CRD, and `true` from the check)",
                "network.rdma.multiNetworkPolicy: the stack renders one per attachment, admitting only its own pods on "
                "net1..N; without enforcement the objects exist and admit everyone",
                "oc get crd multi-networkpolicies.k8s.cni.cncf.io && "
                "oc get networks.operator.openshift.io cluster -o jsonpath='{.spec.useMultiNetworkPolicy}'",
            )
        )

    rendered_accounts = _rendered(objects, "ServiceAccount", ns)
    patched = {(p.get("kind"), p.get("metadata", {}).get("name")) for p in patches}
    for account, users in sorted(service_accounts.items()):
        if account not in rendered_accounts and ("ServiceAccount", account) not in patched:
            needs.append(
                Need(
                    f"ServiceAccount {ns}/{account}",
                    f"{_users(users)} run as it",
                    f"oc get serviceaccount -n {ns} {account}",
                )
            )

    cluster_roles = _rendered(objects, "ClusterRole")
    for obj in objects:
        ref = obj.get("roleRef") or {}
        # a RoleBinding's Role is in the binding's own namespace (one in kube-node-lease: the usage recorder's)
        bns = (obj.get("metadata") or {}).get("namespace") or ns
        rendered = ref.get("name") in (_rendered(objects, "Role", bns) if ref.get("kind") == "Role" else cluster_roles)
        if obj.get("kind") == "RoleBinding" and not rendered and ref.get("name") not in DEFAULT_CLUSTER_ROLES:
            where = f"{bns}/" if ref.get("kind") == "Role" else ""
            needs.append(
                Need(
                    f"{ref.get('kind')} {where}{ref.get('name')} (created by {creator})",
                    f"{_name(obj)} binds it",
                    f"oc get {str(ref.get('kind')).lower()} {ref.get('name')}" + (f" -n {bns}" if where else ""),
                )
            )

    rendered_sccs = _rendered(objects, "SecurityContextConstraints")
    for obj in objects:
        for scc in _scc_grants(obj):
            if scc not in rendered_sccs:
                needs.append(
                    Need(
                        f"SecurityContextConstraints {scc} (created by {creator if env is not None else 'a cluster admin'})",
                        f"{_name(obj)} grants its use; its requiredDropCapabilities must not include SETUID or SETGID "
                        "(the pods' root sshd needs them)",
                        f"oc get scc {scc} -o jsonpath='{{.requiredDropCapabilities}}'",
                    )
                )

    needs += claim_needs(config, objects, creator)
    needs += registry_needs(objects)
    needs += api_needs(objects)
    tekton = sorted({o["kind"] for o in objects if str(o.get("apiVersion", "")).startswith("tekton.dev/")})
    if tekton:
        needs.append(
            Need(
                "OpenShift Pipelines operator (Tekton, tekton.dev/v1)",
                f"models are configured: {', '.join(tekton)}",
                "oc get crd pipelineruns.tekton.dev",
            )
        )
    needs += kueue_needs(config, objects)
    needs += pre_pull_needs(config, objects)
    needs += model_mount_needs(objects)
    needs += image_needs(config)
    if config.models:
        needs.append(
            Need(
                f"model registry at {config.model_pipeline.registry_url}",
                "models[].registration (modelPipeline.registryUrl)",
                "oc get modelregistries.modelregistry.opendatahub.io -A",
            )
        )
    return needs


def claim_needs(config: StackConfig, objects: Sequence[Mapping[str, Any]], creator: str) -> list[Need]:
    """Claims the pods mount that the stack does not create (an environment's shared volumes: its cluster stack's)."""
    ns = config.cluster.namespace
    made = _rendered(objects, "PersistentVolumeClaim", ns)
    templates = {
        str((t.get("metadata") or {}).get("name"))
        for o in objects
        if o.get("kind") == "StatefulSet"
        for t in (o.get("spec") or {}).get("volumeClaimTemplates") or []
    }
    used: dict[str, list[str]] = {}
    for obj in objects:
        for pod in _pod_specs(obj):
            for volume in pod.get("volumes") or []:
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if claim and claim not in made and volume.get("name") not in templates:
                    used.setdefault(claim, []).append(_name(obj))
    if not used:
        return []
    return [
        Need(
            f"PersistentVolumeClaims in namespace {ns}: {', '.join(sorted(used))} (created by {creator})",
            f"{_users(sorted({u for users in used.values() for u in users}))} mount them (shared volumes the stack does not create)",
            f"oc get pvc -n {ns} {' '.join(sorted(used))}",
        )
    ]


INTERNAL_REGISTRY = "image-registry.openshift-image-registry.svc:5000"


def registry_needs(objects: Sequence[Mapping[str, Any]]) -> list[Need]:
    """Images pulled from, or built and pushed into, OpenShift's internal registry need it enabled (it is Removed on some
    installs, e.g. bare metal without storage: openshift/cluster-image-registry-operator, spec.managementState)."""
    users = []
    for obj in objects:
        images = [c.get("image", "") for pod in _pod_specs(obj) for c in [*pod.get("initContainers", []), *pod.get("containers", [])]]
        output = ((obj.get("spec") or {}).get("output") or {}).get("to") or {}
        if any(str(i).startswith(INTERNAL_REGISTRY) for i in images) or output.get("kind") == "ImageStreamTag":
            users.append(_name(obj))
    if not users and not any(o.get("kind") == "ImageStream" for o in objects):
        return []
    return [
        Need(
            f"OpenShift's internal image registry ({INTERNAL_REGISTRY}) is enabled (managementState Managed, with storage)",
            f"{_users(users) if users else 'ImageStreams'} pull from or push to it",
            "oc get configs.imageregistry.operator.openshift.io cluster -o jsonpath='{.spec.managementState}'",
        )
    ]


# Who serves each API group a rendered object needs beyond Kubernetes' own (tekton.dev and Kueue have their own lines).
API_PROVIDERS = {
    "route.openshift.io": "openshift-apiserver",
    "build.openshift.io": "openshift-apiserver (the Build capability)",
    "image.openshift.io": "openshift-apiserver",
    "security.openshift.io": "OpenShift's SecurityContextConstraints CRD",
    "k8s.cni.cncf.io": "Multus (OpenShift's cluster network operator)",
    "serving.kserve.io": "KServe (OpenShift AI)",
    "machineconfiguration.openshift.io": "the machine config operator",
}
KUBERNETES_GROUPS = frozenset({"", "apps", "batch", "rbac.authorization.k8s.io", "networking.k8s.io", "autoscaling", "policy"})


def api_needs(objects: Sequence[Mapping[str, Any]]) -> list[Need]:
    """One line per API group (beyond Kubernetes' own) a rendered object is of: what serves it and its check."""
    kinds: dict[str, set[str]] = {}
    versions: dict[str, str] = {}
    for obj in objects:
        group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
        if group in KUBERNETES_GROUPS or group == "tekton.dev":
            continue
        kinds.setdefault(group, set()).add(str(obj.get("kind")))
        versions[group] = version
    return [
        Need(
            f"API {group}/{versions[group]} served by {API_PROVIDERS.get(group, 'its operator')}",
            f"the stack creates {', '.join(sorted(names))}",
            # every served group-version has an APIService, CRD-backed ones too (kube-aggregator's autoregister controller)
            f"oc get apiservice {versions[group]}.{group}",
        )
        for group, names in sorted(kinds.items())
    ]


def image_programs(config: StackConfig) -> tuple[list[str], list[str]]:
    """What the pods' image must carry for the programs that ship into the pods, and for the fabric check."""
    minimum = ".".join(map(str, inpod.MIN_PYTHON))
    # startup.sh and sshd.sh (bash, awk), the SSH fabric, `ml-dev sync`/`run`, the Python programs
    always = ["bash", "awk", f"python3 (>= {minimum})", "sshd", "ssh", "rsync"]
    always += [s.program for s in config.access.enabled() if s.program]
    fabric = ["mpirun", "all_reduce_perf"] + (["ib_write_bw"] if config.network.effective_mode == "rdma" else [])
    return always, fabric


def image_needs(config: StackConfig) -> list[Need]:
    """A stack that runs an image it does not build (`image.reference`) relies on what that image carries."""
    reference = config.image.reference  # an environment's is its cluster stack's, with its own dev servers
    if reference is None:
        return []
    always, fabric = image_programs(config)
    probe = " ".join(p.split()[0] for p in always + fabric)
    # --command: kubectl's `run` puts what follows `--` into the container's `args` (the image's ENTRYPOINT stays)
    # unless --command makes it the `command` (kubectl pkg/cmd/run/run.go, the "command" flag)
    check = (
        f"oc run image-check --rm -i --restart=Never -n {config.cluster.namespace} --image={reference} --command -- "
        f"sh -c 'PATH=$PATH:/usr/sbin:/usr/local/sbin; for p in {probe}; do command -v $p >/dev/null || echo missing: $p; done; "
        'python3 -c "import sys; print(sys.version)"\''
    )
    return [
        Need(
            f"image {reference} carries {', '.join(always)}; for the fabric check {', '.join(fabric)}",
            "image.reference: the pods run it as it is (the stack builds nothing); the startup, SSH fabric, `ml-dev`, "
            "idle agent and home page ship into the pods and call these (the images a stack builds have them all: "
            "images/base.Containerfile)",
            check,
        )
    ]


def pre_pull_needs(config: StackConfig, objects: Sequence[Mapping[str, Any]]) -> list[Need]:
    """image.prePull (components/prepull.py): the rights and cluster features the object that pins or pre-pulls the
    pods' image on the GPU nodes needs."""
    ns = config.cluster.namespace
    needs: list[Need] = []
    for obj in objects:
        kind, name = obj.get("kind"), _name(obj)
        if kind == "DaemonSet":
            needs.append(
                Need(
                    f"the right to create DaemonSets in {ns}",
                    f"image.prePull daemonSet: {name} pulls the pods' image on every GPU node (a project admin or editor holds it)",
                    f"oc auth can-i create daemonsets.apps -n {ns}",
                )
            )
        elif kind == "PinnedImageSet":
            pool = config.image.machine_config_pool
            image = ((obj.get("spec") or {}).get("pinnedImages") or [{}])[0].get("name", "")
            registry = image.split("/", 1)[0]
            needs += [
                Need(
                    "PinnedImageSet served (machineconfiguration.openshift.io/v1; OpenShift 4.20: the PinnedImages feature gate)",
                    f"image.prePull pinnedImageSet: {name}; where it is not served, `pulumi preview` says so in one "
                    "line and the stack pre-pulls with a DaemonSet instead",
                    "oc api-resources --api-group=machineconfiguration.openshift.io | grep pinnedimagesets",
                ),
                Need(
                    "the right to create PinnedImageSets (cluster-scoped)",
                    f"image.prePull pinnedImageSet: {name}",
                    "oc auth can-i create pinnedimagesets.machineconfiguration.openshift.io",
                ),
                Need(
                    f"MachineConfigPool {pool} holds the GPU nodes and selects machineconfiguration.openshift.io/role={pool}",
                    "image.machineConfigPool: the pool's machineConfigSelector picks the set by that label (openshift/"
                    "machine-config-operator pkg/controller/pinnedimageset/pinned_image_set.go, syncMachineConfigPool)",
                    f"oc get mcp {pool} -o jsonpath='{{.spec.machineConfigSelector.matchLabels}} {{.status.machineCount}}'",
                ),
                Need(
                    f"the nodes' pull secret can pull from {registry}",
                    "the machine-config daemon pulls with the kubelet's auth file, the cluster pull secret, not the "
                    "namespace's (pkg/daemon/pinned_image_set.go, newRegistryAuth)",
                    "oc get secret pull-secret -n openshift-config -o jsonpath='{.data.\\.dockerconfigjson}' | base64 -d "
                    f"| grep -c '\"{registry}\"'",
                ),
            ]
    return needs


def model_mount_needs(objects: Sequence[Mapping[str, Any]]) -> list[Need]:
    """models[].mountInEnv (components/pod.py model_volumes): the StatefulSet's image volumes need the cluster to serve
    them, with subPath (cluster.imageVolumes)."""
    images = [
        str(v["image"].get("reference"))
        for o in objects
        if o.get("kind") == "StatefulSet"
        for v in o["spec"]["template"]["spec"].get("volumes", [])
        if v.get("image")
    ]
    if not images:
        return []
    return [
        Need(
            "image volumes with subPath: Kubernetes 1.33 or later, the ImageVolume feature gate on the API servers and "
            "kubelets, a runtime that mounts them (CRI-O 1.33)",
            f"models[].mountInEnv: {', '.join(images)}; with the gate off the API server drops the volume without a word "
            "(kubernetes pkg/api/pod/util.go dropImageVolumes) and `ml-dev status` says NOT MOUNTED",
            # OpenShift lists the enabled gates per version (openshift/api config/v1 types_feature.go, FeatureGateDetails)
            "oc version -o json | jq -r .serverVersion.gitVersion; "
            "oc get featuregate cluster -o jsonpath='{.status.featureGates[0].enabled[*].name}' | tr ' ' '\\n' | grep -x ImageVolume",
        )
    ]


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What Kueue charges one pod: the sum of its containers' requests, or an init container's when larger
    (kubernetes-sigs/kueue pkg/util/resource, the effective pod requests: max(sum(containers), max(init)))."""
    total: dict[str, Decimal] = {}
    for container in pod.get("containers", []):
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(value)
    for container in pod.get("initContainers", []):
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = max(total.get(name, Decimal(0)), parse_quantity(value))
    return total


def _amount(name: str, value: Decimal) -> str:
    if name == "memory" or name == "ephemeral-storage":
        return f"{name} {format_gib(value)}"
    return f"{name} {value.normalize():f}"


def kueue_needs(config: StackConfig, objects: Sequence[Mapping[str, Any]]) -> list[Need]:
    """With lifecycle.kueue.queueName: Kueue itself, the LocalQueue, and the quota its ClusterQueue must cover
    for the whole environment (every pod of each queued workload, all containers)."""
    queued = [o for o in objects if ((o.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)]
    if not queued:
        return []
    ns = config.cluster.namespace
    queue = config.lifecycle.kueue.queue_name or queued[0]["metadata"]["labels"][KUEUE_QUEUE_LABEL]
    quota: dict[str, Decimal] = {}
    for obj in queued:
        replicas = int((obj.get("spec") or {}).get("replicas") or config.nodes.count) or config.nodes.count
        for pod in _pod_specs(obj):
            for name, value in _pod_requests(pod).items():
                quota[name] = quota.get(name, Decimal(0)) + value * replicas
    cluster_queue = f"$(oc get localqueue {queue} -n {ns} -o jsonpath='{{.spec.clusterQueue}}')"
    needs = [
        Need(
            "Kueue (kueue.x-k8s.io) with its statefulset integration enabled",
            f"lifecycle.kueue.queueName labels {_users([_name(o) for o in queued])} for Kueue's admission",
            "oc get crd localqueues.kueue.x-k8s.io clusterqueues.kueue.x-k8s.io",
        ),
        Need(
            f"LocalQueue {ns}/{queue}",
            "lifecycle.kueue.queueName (without it the pods stay gated and `pulumi up` times out)",
            f"oc get localqueue {queue} -n {ns}",
        ),
        Need(
            f"quota for the whole environment in the ClusterQueue behind LocalQueue {queue}: "
            + ", ".join(_amount(k, v) for k, v in sorted(quota.items())),
            f"Kueue admits all {config.nodes.count} pods at once (requests of every container)",
            f"oc get clusterqueue {cluster_queue} -o yaml",
        ),
    ]
    if config.fabric_check.on_deploy:
        kueue = config.lifecycle.kueue
        needs.append(
            Need(
                f"Kueue waitForPodsReady.timeout at least {kueue.wait_for_pods_ready_timeout} (lifecycle.kueue.waitForPodsReadyTimeout)",
                f"fabricCheck.onDeploy holds pod 0 un-Ready for up to {config.fabric_check.on_deploy_timeout_seconds}s after "
                f"an image pull of up to {kueue.image_pull_seconds}s",
                "oc get configmap kueue-manager-config -n kueue-system -o yaml",
            )
        )
    return needs


def _scc_grants(obj: Mapping[str, Any]) -> list[str]:
    """SCC names a Role/ClusterRole grants `use` of (a RoleBinding: that its role grants, by OpenShift's naming)."""
    if obj.get("kind") == "RoleBinding":
        name = str((obj.get("roleRef") or {}).get("name", ""))
        return [name.removeprefix(SCC_ROLE_PREFIX)] if name.startswith(SCC_ROLE_PREFIX) else []
    if obj.get("kind") not in ("Role", "ClusterRole"):
        return []
    return [
        name
        for rule in obj.get("rules") or []
        if "securitycontextconstraints" in (rule.get("resources") or []) and "use" in (rule.get("verbs") or [])
        for name in rule.get("resourceNames") or []
    ]


def admin_needs(objects: Sequence[Mapping[str, Any]], namespace: str) -> list[Need]:
    """Objects that namespace-admin rights in the stack's namespace do not cover, and why.

    * cluster-scoped kinds (`CLUSTER_SCOPED`): cluster-admin;
    * objects in another namespace: rights in that namespace;
    * a Role granting `use` of an SCC, or a RoleBinding to such a role: the API server refuses to create a
      Role granting more than its creator holds (kubernetes/kubernetes pkg/registry/rbac/role/policybased/
      storage.go, `Storage.Create` → `ConfirmNoEscalation`), and a binding unless its creator holds the
      role's rules or `bind` on it (…/rolebinding/policybased/storage.go, `Storage.Create` →
      `BindingAuthorized`, else `ConfirmNoEscalation`).
    """
    out = []
    for obj in objects:
        kind = obj.get("kind", "")
        other = obj.get("metadata", {}).get("namespace")
        # what it is for, where the object says so (kubernetes.io/description)
        why = ((obj.get("metadata") or {}).get("annotations") or {}).get("kubernetes.io/description")
        why = f" ({why})" if why else ""
        if kind in CLUSTER_SCOPED:
            out.append(Need(_name(obj), f"cluster-scoped: needs cluster-admin{why}"))
        elif other and other != namespace:
            outside = f"outside the stack's namespace {namespace}: needs admin in {other}{why}"
            out.append(Need(f"{_name(obj)} in namespace {other}", outside))
        elif _scc_grants(obj):
            binding = kind == "RoleBinding"
            out.append(
                Need(
                    _name(obj),
                    f"{'binds a role granting' if binding else 'grants'} use of SCC {', '.join(_scc_grants(obj))}: "
                    f"its creator must hold that use{', or `bind` on the role,' if binding else ''} already "
                    "(RBAC escalation check): cluster-admin, or an admin grants it first",
                )
            )
    # by what, not by registration order: the mock engine registers resources as their inputs resolve, so the
    # render's object order differs run to run (seen: the generated prerequisites page reordered on a rerun)
    return sorted(out, key=lambda need: need.what)
