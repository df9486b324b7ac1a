"""Typed stack configuration: one pydantic model per `ml-dev-env:<key>` object.

Keys are camelCase in `Pulumi.<stack>.yaml` (`pulumi config set --path 'ml-dev-env:nodes.count' 2`).
Every model is frozen and rejects unknown keys; cross-field rules (`@rule` methods) yield a
`ConfigProblem` per mistake, naming the exact key path, and all of them are reported in one run
(a `@model_validator` that raises one `ConfigProblem` also works, but stops that model at the first).

Why one module: the stack's schema is one pydantic model tree whose validators cross-reference each other's fields
(a rule reads several sections); the generated reference (docs/ref/configuration.md) is read in its order.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import ipaddress
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, create_model, model_validator

from core import naming, nccl
from core.model_sizing import preflight
from core.presets import presets_file
from core.quantity import parse_quantity
from core.servers import DEV_SERVERS, DevServer, longest_routed_name, routed_servers
from inpod import contract
from stacks.base import (
    IPV6_HOST,
    AbsPath,
    Cidr,
    ConfigProblem,
    DnsLabel,
    DnsSubdomain,
    EnvValue,
    ImageRef,
    Labels,
    LabelValue,
    Model,
    Quantity,
    Size,
    duplicates,
    rule,
)
from steps.lib.model import DEFAULT_INCLUDE

# --------------------------------------------------------------------------------------- cluster


class ClusterConfig(Model):
    """Where the environment lives."""

    name: DnsLabel = Field(description="Cluster name (used in labels and messages).")
    namespace: DnsLabel = Field(description="Namespace (project) the stack deploys into.")
    create_namespace: bool = Field(False, description="Create the namespace (kept on destroy) instead of adopting an existing one.")
    apps_domain: DnsSubdomain = Field(description="OpenShift apps domain; Route hosts (and URL outputs) derive from it.")
    kube_context: str | None = Field(None, description="kubeconfig context; unset = current context.")
    app_name: DnsLabel = Field("ml-dev-env", description="Name of the StatefulSet and prefix of every object.")
    render_yaml_to_directory: str | None = Field(
        None, description="GitOps mode: render manifests to this directory instead of applying them."
    )
    image_volumes: bool = Field(
        False,
        description="The cluster serves image volumes with subPath (Kubernetes 1.33 or later with the ImageVolume feature "
        "gate on the API servers and kubelets, and a runtime that mounts them, e.g. CRI-O 1.33): models[].mountInEnv "
        'needs it; checked against the API server\'s version at preview (docs: Models, "Models in every rank").',
    )

    @rule
    def _apps_domain_is_a_host(self) -> Iterator[ConfigProblem]:
        # Route hosts end in it: OpenShift's route validation (openshift/api route/v1 Route `spec.host` pattern, and
        # openshift/router's host admission) wants every DNS label of a host at most 63 characters (RFC 1123), which a
        # Kubernetes DNS subdomain (IsDNS1123Subdomain) does not limit.
        long = [label for label in self.apps_domain.split(".") if len(label) > 63]
        if long:
            yield ConfigProblem("appsDomain", self.apps_domain, "a host name: each '.'-separated label at most 63 characters")

    @rule
    def _app_name_fits(self) -> Iterator[ConfigProblem]:
        # pod names `<app>-<ordinal>` and `<app>-<server>-<namespace>` hosts must stay DNS labels (the
        # longest server name of core/servers.py makes the longest host).
        if len(self.app_name) > 40:
            yield ConfigProblem("appName", self.app_name, "at most 40 characters (pod and route names derive from it)")
            return
        if not self.app_name[:1].isalpha():
            # Services are named after it: kubernetes pkg/apis/core/validation/validation.go ValidateServiceName
            # (apimachinery IsDNS1035Label) wants a leading letter where a DNS label takes a digit.
            yield ConfigProblem("appName", self.app_name, "must start with a letter: the Services named after it are DNS-1035 labels")
            return
        longest = f"{self.app_name}-{longest_routed_name()}-{self.namespace}"
        if len(longest) > 63:
            yield ConfigProblem(
                "appName",
                self.app_name,
                f"route hosts start with '<appName>-<server>-<namespace>', which must fit a 63-character DNS label "
                f"('{longest}' has {len(longest)}); choose a shorter appName",
            )


# ----------------------------------------------------------------------------------------- nodes


class Toleration(Model):
    """A Kubernetes toleration of a node taint."""

    key: str | None = Field(None, description="Taint key to tolerate; unset with operator Exists = every taint.")
    operator: Literal["Exists", "Equal"] = Field("Exists", description="Exists: any value; Equal: the taint's value must be `value`.")
    value: str | None = Field(None, description="Taint value (operator Equal only).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to tolerate; unset = every effect."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute only: how long the pod stays after the taint appears.")

    @rule
    def _value_matches_operator(self) -> Iterator[ConfigProblem]:
        if self.operator == "Exists" and self.value is not None:
            yield ConfigProblem("value", self.value, "must be unset when operator is 'Exists'")


GPU_TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


class CpuMemory(Model):
    """CPU and memory of a container."""

    cpu: Quantity = Field(description="CPU, a Kubernetes quantity (`16`, `500m`).")
    memory: Size = Field(description="Memory, a Kubernetes quantity (`64Gi`).")


class Resources(Model):
    """CPU and memory of the main container (GPUs come from gpusPerPod)."""

    requests: CpuMemory = Field(description="What the scheduler reserves on the node for each pod.")
    limits: CpuMemory = Field(description="The most each pod may use (memory above it is OOM-killed).")

    @rule
    def _requests_within_limits(self) -> Iterator[ConfigProblem]:
        for kind in ("cpu", "memory"):
            request = getattr(self.requests, kind)
            limit = getattr(self.limits, kind)
            if parse_quantity(request) > parse_quantity(limit):
                yield ConfigProblem(f"requests.{kind}", request, f"must not exceed limits.{kind} ({limit})")


def _check_count(value: int) -> int:
    if value < 1:
        raise ValueError("at least 1; to stop the environment and keep its data, set lifecycle.suspended: true instead")
    return value


class NodesConfig(Model):
    """GPU nodes, pods and their size."""

    gpu_nodes: list[DnsSubdomain] = Field(default_factory=list, description="Ordered GPU node names; empty = any GPU node.")
    count: Annotated[int, AfterValidator(_check_count)] = Field(1, le=64, description="Number of pods (one per node).")
    gpus_per_pod: int = Field(1, ge=1, le=16, description="GPUs requested (= limit) by each pod.")
    gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=16,
        description="GPUs each GPU node has (nvidia.com/gpu capacity). Declared: gpusPerPod above it is refused (the pods "
        "would stay Pending). Unset: a warning, nothing checked.",
    )
    gpu_product: LabelValue | None = Field(
        None, description="Value of the node label nvidia.com/gpu.product to require, e.g. NVIDIA-H100-80GB-HBM3."
    )
    resources: Resources = Field(description="CPU/memory requests and limits of the main container.")
    shm_size: Size = Field("32Gi", description="Size of the memory-backed /dev/shm.")
    node_selector: Labels = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"}, description="GPU node selector.")
    tolerations: list[Toleration] = Field(default_factory=lambda: [GPU_TOLERATION])

    @rule
    def _gpus_fit_the_node(self) -> Iterator[ConfigProblem]:
        if self.gpus_per_node is not None and self.gpus_per_pod > self.gpus_per_node:
            yield ConfigProblem(
                "gpusPerPod",
                self.gpus_per_pod,
                f"at most nodes.gpusPerNode ({self.gpus_per_node}): a pod asking for more GPUs than a node has stays Pending",
            )

    @rule
    def _shm_within_memory(self) -> Iterator[ConfigProblem]:
        # /dev/shm is a memory-backed emptyDir: its pages count against the container's memory limit. Only a
        # size the stack sets is judged (the default stands for "as much as the image needs").
        if "shm_size" in self.model_fields_set and parse_quantity(self.shm_size) > parse_quantity(self.resources.limits.memory):
            yield ConfigProblem(
                "shmSize",
                self.shm_size,
                f"at most resources.limits.memory ({self.resources.limits.memory}): /dev/shm is memory and counts against "
                "that limit (a full /dev/shm would OOM-kill the pod)",
            )

    @rule
    def _node_list(self) -> Iterator[ConfigProblem]:
        dups = duplicates(self.gpu_nodes)
        if dups:
            yield ConfigProblem("gpuNodes", dups, "each node may be listed once")
        if self.gpu_nodes and self.count > len(self.gpu_nodes):
            yield ConfigProblem(
                "count",
                self.count,
                f"at most {len(self.gpu_nodes)} (the number of listed gpuNodes): pods use required anti-affinity, one pod per node",
            )


# --------------------------------------------------------------------------------------- network

_NCCL_KEY = re.compile(r"^(NCCL|TORCH_NCCL|UCX)_[A-Z0-9_]+$")
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_HCA = re.compile(r"^[A-Za-z0-9_]+(:[0-9]+)?$")
_IFACE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")


class RdmaConfig(Model):
    """RoCE/InfiniBand over SR-IOV with Multus."""

    enabled: bool = Field(True, description="Whether this cluster supports RDMA; false makes mode 'rdma' fall back to TCP.")
    attachments: list[DnsLabel] = Field(default_factory=list, description="NetworkAttachmentDefinition names, one per NIC.")
    attachment_namespace: DnsLabel | None = Field(None, description="Namespace of the attachments; default: the stack's.")
    sriov_resources: list[str] = Field(default_factory=list, description="SR-IOV resource names, one per NIC.")
    sriov_resource_count: int = Field(1, ge=1, le=8, description="VFs requested per SR-IOV resource.")
    hca_mode: Literal["explicit", "auto"] = Field(
        "explicit", description="explicit: NCCL_IB_HCA from `hcas`; auto: detected at pod start (opt-in)."
    )
    hcas: list[str] = Field(default_factory=list, description="RDMA devices (NCCL_IB_HCA), one per NIC.")
    socket_interfaces: list[str] = Field(default_factory=list, description="Pod interfaces (NCCL_SOCKET_IFNAME).")
    gid_index: int = Field(3, ge=0, le=255, description="NCCL_IB_GID_INDEX (3 = RoCEv2 IPv4).")
    gdr_level: int | Literal["LOC", "PIX", "PXB", "PHB", "SYS"] = Field(5, description="NCCL_NET_GDR_LEVEL.")
    cross_nic: Literal[0, 1, 2] = Field(0, description="NCCL_CROSS_NIC (0 for isolated per-NIC subnets).")
    create_attachments: bool = Field(False, description="Create the NetworkAttachmentDefinitions in the namespace.")
    subnets: list[Cidr] = Field(default_factory=list, description="Whereabouts range per NIC (with createAttachments).")
    mtu: int = Field(9000, ge=1280, le=9216, description="MTU of the created NetworkAttachmentDefinitions (with createAttachments).")
    multi_network_policy: bool = Field(
        False,
        description="The cluster enforces MultiNetworkPolicy on secondary networks (OpenShift: `useMultiNetworkPolicy: "
        "true` in networks.operator.openshift.io `cluster`): one per attachment admits only the stack's own pods on "
        "net1..N. Unset: any pod on the same SR-IOV network reaches the pods there (docs/use/teams.md).",
    )

    @rule
    def _shapes(self) -> Iterator[ConfigProblem]:
        for field, items, pattern, what in (
            ("sriovResources", self.sriov_resources, _RESOURCE_NAME, "'<domain>/<name>' such as 'openshift.io/eno5np0rdma'"),
            ("hcas", self.hcas, _HCA, "an RDMA device name such as 'mlx5_6' (optionally ':<port>')"),
            ("socketInterfaces", self.socket_interfaces, _IFACE, "an interface name such as 'net1'"),
        ):
            for i, item in enumerate(items):
                if not pattern.match(item):
                    yield ConfigProblem(f"{field}[{i}]", item, f"must be {what}")
        if isinstance(self.gdr_level, int) and not 0 <= self.gdr_level <= 5:
            yield ConfigProblem("gdrLevel", self.gdr_level, f"0..5 or one of {', '.join(GDR_LEVELS)}")

    def usable_problems(self) -> Iterator[ConfigProblem]:
        """Rules that only apply when RDMA is the effective mode (every mismatch, not just the first)."""
        n = len(self.attachments)
        if n == 0:
            yield ConfigProblem("attachments", self.attachments, "RDMA needs at least one NetworkAttachmentDefinition")
            return
        # The per-NIC lists, and why each must have one entry per NIC.
        per_nic: dict[str, tuple[list[str], str]] = {
            "attachments": (self.attachments, "one NetworkAttachmentDefinition per NIC"),
            "sriovResources": (self.sriov_resources, "one SR-IOV resource per attachment"),
        }
        if self.hca_mode == "explicit":
            per_nic["hcas"] = (self.hcas, "with hcaMode 'explicit', one HCA per attachment")
        per_nic["socketInterfaces"] = (self.socket_interfaces, "one pod interface per attachment")
        if self.create_attachments:
            per_nic["subnets"] = (self.subnets, "createAttachments needs one subnet per attachment")
        for field, (items, _) in per_nic.items():
            dups = duplicates(items) if field != "subnets" else []  # overlapping subnets: one rule below
            if dups:
                yield ConfigProblem(field, dups, "entries must be unique")
        if self.hca_mode == "auto" and self.hcas:
            yield ConfigProblem("hcas", self.hcas, "must be empty with hcaMode 'auto' (the pod detects them)")
        # One line per list whose length differs from the NIC count most lists agree on (on a tie:
        # the attachments'); every line shows all lengths, so one run tells what to change.
        lengths = {field: len(items) for field, (items, _) in per_nic.items()}
        votes = Counter(lengths.values())
        nics = n if votes[n] == max(votes.values()) else votes.most_common(1)[0][0]
        table = ", ".join(f"{field} {length}" for field, length in lengths.items())
        hints = {
            "hcas": "; auto-detection is opt-in with hcaMode: auto",
            "socketInterfaces": f"; Multus names them net1..net{nics}",
        }
        for field, (items, why) in per_nic.items():
            if lengths[field] != nics:
                yield ConfigProblem(field, items, f"{why}: expected {nics} entries (per-NIC lists: {table}{hints.get(field, '')})")
        if self.create_attachments:
            networks = [ipaddress.ip_network(s) for s in self.subnets]
            overlaps = [(i, j) for i, a in enumerate(networks) for j in range(i) if a.overlaps(networks[j])]
            if overlaps:
                i, j = overlaps[0]
                more = sorted({f"subnets[{k}]" for k, _ in overlaps} - {f"subnets[{i}]"})
                yield ConfigProblem(
                    f"subnets[{i}]",
                    self.subnets[i],
                    f"overlaps subnets[{j}] ({self.subnets[j]}): each NIC needs its own subnet"
                    + (f" (also overlapping: {', '.join(more)})" if more else ""),
                )


class TcpConfig(Model):
    """NCCL over TCP sockets (mode tcp, or the fallback when RDMA is not enabled)."""

    interface_exclude: str = Field("^lo,docker0", description="NCCL_SOCKET_IFNAME in TCP mode.")
    p2p_level: Literal["LOC", "NVL", "PIX", "PXB", "PHB", "SYS"] = Field("NVL", alias="p2pLevel", description="NCCL_P2P_LEVEL in TCP mode.")


class NetworkConfig(Model):
    """How the pods talk to each other for NCCL."""

    mode: Literal["tcp", "rdma"] = Field("tcp", description="Requested transport.")
    rdma: RdmaConfig = Field(default_factory=RdmaConfig, description="RDMA settings (mode rdma).")
    tcp: TcpConfig = Field(default_factory=TcpConfig, description="TCP settings (mode tcp, or the fallback).")
    nccl_env: dict[str, EnvValue] = Field(
        default_factory=dict, description="NCCL variables that override the validated defaults (core/nccl.py) and the typed settings above."
    )

    @rule
    def _env_keys(self) -> Iterator[ConfigProblem]:
        for key in self.nccl_env:
            if not _NCCL_KEY.match(key):
                yield ConfigProblem(f"ncclEnv.{key}", self.nccl_env[key], "keys must be NCCL_*, TORCH_NCCL_* or UCX_* variables")

    @rule
    def _env_not_twice(self) -> Iterator[ConfigProblem]:
        typed = nccl.RDMA_TYPED_KEYS if self.effective_mode == "rdma" else nccl.TCP_TYPED_KEYS
        for key, value in self.nccl_env.items():
            if key in typed:
                yield ConfigProblem(
                    f"ncclEnv.{key}", value, f"{key} comes from {typed[key]} in {self.effective_mode} mode: set it there, once"
                )
        if self.effective_mode == "tcp" and self.nccl_env.get("NCCL_IB_DISABLE", "1") != "1":
            yield ConfigProblem("ncclEnv.NCCL_IB_DISABLE", self.nccl_env["NCCL_IB_DISABLE"], "must be 1 in TCP mode")

    @rule
    def _rdma_usable(self) -> Iterator[ConfigProblem]:
        if self.effective_mode == "rdma":
            yield from (problem.under("rdma") for problem in self.rdma.usable_problems())

    @property
    def effective_mode(self) -> Literal["tcp", "rdma"]:
        return "rdma" if self.mode == "rdma" and self.rdma.enabled else "tcp"


# -------------------------------------------------------------------------------------- security

# SYS_CHROOT: root's sshd (dev-loop SSH fabric) chroots for privilege separation; CRI-O does not grant it by default.
Capability = Literal["IPC_LOCK", "SYS_RESOURCE", "SYS_CHROOT"]


MEMLOCK_CAPABILITIES: tuple[Capability, ...] = ("IPC_LOCK", "SYS_RESOURCE")

SSHD_CAPABILITIES: tuple[Capability, ...] = ("SYS_CHROOT",)
"""What the pods' root sshd needs beyond CRI-O's default capabilities; an SCC the stack writes allows it, its pods add it."""


class MemlockConfig(Model):
    """How RDMA pods get unlimited locked memory (registering GPU memory with the NIC needs it)."""

    mode: Literal["none", "scc", "privileged"] = Field("none", description="How RDMA gets unlimited memlock.")
    scc_name: DnsSubdomain | None = Field(None, description="SCC granting the capabilities (mode scc).")
    create_scc: bool = Field(False, description="Create the SCC (cluster-admin) instead of binding to an existing one.")
    capabilities: list[Capability] = Field(
        default_factory=lambda: list(MEMLOCK_CAPABILITIES),
        description="Capabilities the main container adds (mode scc); with createScc also SYS_CHROOT (root sshd), which the SCC allows.",
    )

    @rule
    def _consistent(self) -> Iterator[ConfigProblem]:
        if self.mode == "scc" and not self.scc_name:
            yield ConfigProblem("sccName", self.scc_name, "required with mode 'scc' (e.g. 'nccl-rdma-scc')")
        if self.mode != "scc" and self.create_scc:
            yield ConfigProblem("createScc", self.create_scc, "only valid with mode 'scc'")
        if self.mode == "scc" and not self.capabilities:
            yield ConfigProblem("capabilities", self.capabilities, "mode 'scc' needs IPC_LOCK and/or SYS_RESOURCE")

    @property
    def pod_capabilities(self) -> list[Capability]:
        """What the main container adds (mode scc): the configured capabilities and, where the stack writes the SCC
        (createScc), what its own root sshd needs, so SSH between pods works with the defaults."""
        return list(dict.fromkeys([*self.capabilities, *(SSHD_CAPABILITIES if self.create_scc else ())]))


class SecurityConfig(Model):
    """Identity and privileges of the GPU pods."""

    service_account: DnsLabel = Field("ml-dev-sa", description="ServiceAccount the pods run as.")
    create_service_account: bool = Field(True, description="Create the ServiceAccount (else it must exist).")
    memlock: MemlockConfig = Field(default_factory=MemlockConfig, description="Unlimited memlock for RDMA.")


# ---------------------------------------------------------------------------------------- access

# One on/off key per dev server of the table (core/servers.py), in table order, ahead of the other access keys.
_ServerToggles = create_model(  # type: ignore[call-overload]
    "_ServerToggles",
    __base__=Model,
    **{
        s.name: (
            bool,
            Field(
                True,
                description=f"Run {s.title} on pod 0 (port {s.port}), reachable at an https Route."
                + ("" if s.on_under_token_auth else " Off under auth 'token' unless set (then refused: no login of its own)."),
            ),
        )
        for s in DEV_SERVERS
        if s.routed
    },
)

_TOKEN_SECRETS = [s.secret_key for s in DEV_SERVERS if s.routed and s.secret_key]


class AccessConfig(_ServerToggles):
    """The dev servers on pod 0 (core/servers.py) and how users log in to them."""

    auth: Literal["oauth-proxy", "token"] = Field(
        "oauth-proxy",
        description=f"oauth-proxy: OpenShift login; token: per-server secrets (ml-dev-env:{', '.join(_TOKEN_SECRETS)}).",
    )
    oauth_proxy_image: ImageRef = Field(
        "registry.redhat.io/openshift4/ose-oauth-proxy-rhel9:v4.20",
        description="OpenShift OAuth proxy image (the cluster's global pull secret covers registry.redhat.io).",
    )
    tensorboard_log_dir: AbsPath | None = Field(
        None,
        description="Directory TensorBoard reads its event files from (default: `<workspace>/tensorboard/<appName>`, the "
        "environment's own: another environment may mount the same workspace claim).",
    )

    @rule
    def _servers_without_auth_need_proxy(self) -> Iterator[ConfigProblem]:
        for s in routed_servers():
            explicit = s.on_under_token_auth or s.name in self.model_fields_set
            if self.auth == "token" and getattr(self, s.name) and not s.has_own_auth and explicit:
                yield ConfigProblem(
                    s.name,
                    True,
                    f"{s.title} has no authentication of its own: with auth 'token' set {s.name}: false, or use auth 'oauth-proxy'",
                )

    @property
    def servers(self) -> list[str]:
        """Names of the enabled routed servers, in table order."""
        return [s.name for s in self.enabled()]

    def enabled(self) -> list[DevServer]:
        """The enabled routed servers (rows of core/servers.py), in table order; under auth 'token' never one
        without its own login (the rule above refuses those that are on explicitly)."""
        return [s for s in routed_servers() if getattr(self, s.name) and (self.auth != "token" or s.has_own_auth)]


# --------------------------------------------------------------------------------------- storage

RESERVED_MOUNTS = ("/dev/shm", contract.STARTUP_MOUNT, "/tmp")


class VolumeConfig(Model):
    """One volume mounted into every GPU pod."""

    name: DnsLabel = Field(description="Volume name; the PVC is `<appName>-<name>` (per-pod: `<name>-<appName>-<ordinal>`).")
    mount_path: AbsPath = Field(description="Where the volume is mounted in the main container.")
    size: Size = Field(description="Requested size (a Kubernetes quantity, e.g. 500Gi).")
    storage_class: DnsSubdomain | None = Field(None, description="StorageClass of the claim; unset = the cluster's default.")
    scope: Literal["shared", "per-pod"] | None = Field(
        None, description="shared = one RWX PVC for all pods; per-pod = a volumeClaimTemplate (hybrid mode needs it)."
    )
    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] | None = Field(
        None, description="Access modes of the claim; unset = ReadWriteMany when shared, ReadWriteOnce when per-pod."
    )


class StorageConfig(Model):
    """The volumes of the GPU pods; claims are kept on destroy."""

    mode: Literal["shared", "per-pod", "hybrid"] = Field(
        description="shared: every volume is one RWX claim for all pods; per-pod: every volume is a claim per pod "
        "(volumeClaimTemplates); hybrid: each volume's `scope` decides (per-pod when unset)."
    )
    volumes: Annotated[
        list[VolumeConfig], Field(min_length=1, description="At least one; the one named `workspace` (else the first) is ML_DEV_WORKSPACE.")
    ]

    @rule
    def _volumes(self) -> Iterator[ConfigProblem]:
        for field, values in (("name", [v.name for v in self.volumes]), ("mountPath", [v.mount_path for v in self.volumes])):
            dups = duplicates(values)
            if dups:
                yield ConfigProblem(f"volumes[].{field}", dups, "must be unique")
        for i, volume in enumerate(self.volumes):
            for reserved in RESERVED_MOUNTS:
                if volume.mount_path == reserved or volume.mount_path.startswith(reserved + "/"):
                    yield ConfigProblem(f"volumes[{i}].mountPath", volume.mount_path, f"{reserved} is reserved")
            if self.mode == "hybrid" and volume.scope is None:
                yield ConfigProblem(f"volumes[{i}].scope", None, "hybrid mode needs 'shared' or 'per-pod' on every volume")
            if self.mode != "hybrid" and volume.scope not in (None, self.mode):
                yield ConfigProblem(
                    f"volumes[{i}].scope", volume.scope, f"must be unset or '{self.mode}' in mode '{self.mode}' (use mode 'hybrid' to mix)"
                )
            if self.scope_of(volume) == "shared" and volume.access_modes == ["ReadWriteOnce"]:
                yield ConfigProblem(
                    f"volumes[{i}].accessModes",
                    volume.access_modes,
                    "a shared volume is mounted by pods on different nodes: use ReadWriteMany",
                )

    def scope_of(self, volume: VolumeConfig) -> Literal["shared", "per-pod"]:
        if volume.scope is not None:
            return volume.scope
        return "shared" if self.mode == "shared" else "per-pod"


# ----------------------------------------------------------------------------------------- image


class BuildNodesConfig(Model):
    """Where builds run (image builds and model packaging)."""

    node_selector: Labels = Field(default_factory=dict, description="Node labels a build pod requires.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints of the build nodes that build pods tolerate.")


class GitSource(Model):
    """Where the build reads the Containerfiles (source git)."""

    uri: str = Field(description="Repository (this one or a fork) holding the Containerfiles.")
    ref: str = Field("main", description="Branch, tag or commit to build.")
    context_dir: str = Field("images", description="Build context inside the repository (holds <stage>.Containerfile).")
    requirements_file: str = Field(
        "runtime-requirements.txt", description="Application requirements file in the context, for the runtime stage."
    )


class BuildResources(Model):
    """CPU and memory of the build pods (compiling Flash-Attention needs plenty)."""

    requests: CpuMemory = Field(CpuMemory(cpu="4", memory="16Gi"), description="Reserved for each build pod.")
    limits: CpuMemory = Field(CpuMemory(cpu="16", memory="64Gi"), description="The most a build pod may use.")

    @rule
    def _requests_within_limits(self) -> Iterator[ConfigProblem]:
        yield from Resources._requests_within_limits(self)  # type: ignore[arg-type]  # same fields, same rule


class ImageBuildConfig(Model):
    """On-cluster two-stage build: base (CUDA/PyTorch/FA/RDMA/dev servers) and runtime (images/README.md)."""

    preset: str | None = Field(None, description="Architecture preset from images/presets.yaml (default: its `default`).")
    image_stream: DnsLabel = Field("ml-dev-env", description="ImageStream receiving both stages' tags.")
    source: Literal["inline", "git"] = Field(
        "inline", description="inline: Containerfiles embedded in the BuildConfig; git: built from `git`."
    )
    git: GitSource | None = None
    runtime_requirements: list[str] = Field(
        default_factory=list,
        description="Application pins for the runtime stage (default for inline source: images/runtime-requirements.txt).",
    )
    max_jobs: int = Field(8, ge=1, le=256, description="Flash-Attention compile parallelism (MAX_JOBS build arg).")
    resources: BuildResources = Field(default_factory=BuildResources, description="Build pod requests/limits.")
    completion_deadline_seconds: int = Field(3600, ge=600, le=6 * 3600, description="Build deadline (builds take 15–35 min).")

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "rolloutOnNewImage" in data:
            raise ConfigProblem(
                "rolloutOnNewImage",
                data["rolloutOnNewImage"],
                "removed: every input change gives a new runtime tag and `pulumi up` rolls the pods to it; delete the key",
            )
        return data

    @rule
    def _source(self) -> Iterator[ConfigProblem]:
        presets = sorted(presets_file()["presets"])
        if self.preset is not None and self.preset not in presets:
            yield ConfigProblem("preset", self.preset, f"allowed: {', '.join(presets)} (images/presets.yaml)")
        if self.source == "git" and self.git is None:
            yield ConfigProblem("git", None, "source 'git' needs git.uri (and ref/contextDir)")
        if self.source == "inline" and self.git is not None:
            yield ConfigProblem("git", "set", "only used with source 'git'")
        for i, req in enumerate(self.runtime_requirements):
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._\[\],-]*\s*(===?|~=|>=|<=|<|>|!=)\s*[A-Za-z0-9.*+!_-]+$", req):
                yield ConfigProblem(f"runtimeRequirements[{i}]", req, "must be a pinned requirement such as 'peft==0.17.1'")


class ImageConfig(Model):
    """The image the GPU pods run: an existing reference, or one built on the cluster."""

    reference: ImageRef | None = Field(None, description="Existing image for the pods (when the stack does not build).")
    build: ImageBuildConfig | None = Field(None, description="Build the image on the cluster; the pods use the runtime stage.")
    pre_pull: Literal["off", "daemonSet", "pinnedImageSet"] = Field(
        "off",
        description="Put the pods' image on the GPU nodes before it is needed (cluster stack): daemonSet (a pre-pull "
        "DaemonSet on the GPU nodes, no GPU, ~0 requests, awaited before the StatefulSet rolls), pinnedImageSet "
        "(OpenShift's PinnedImageSet: CRI-O pins the digest; cluster-admin, image.reference by @sha256) or off.",
    )
    machine_config_pool: DnsLabel = Field(
        "worker",
        description="prePull pinnedImageSet: the MachineConfigPool holding the GPU nodes (the set carries its "
        "`machineconfiguration.openshift.io/role` label; the pool's machineConfigSelector picks it).",
    )

    @rule
    def _has_source(self) -> Iterator[ConfigProblem]:
        if self.reference is None and self.build is None:
            yield ConfigProblem("reference", None, "set image.reference (registry/repo:tag or @sha256 digest) or image.build")
        if self.reference is not None and self.build is not None:
            yield ConfigProblem("reference", self.reference, "set either image.reference or image.build, not both")

    @rule
    def _pinned_by_digest(self) -> Iterator[ConfigProblem]:
        # A PinnedImageSet names images by digest only (openshift/api machineconfiguration/v1
        # types_pinnedimageset.go, PinnedImageRef.Name: "must end with a valid '@sha256:<digest>'").
        if self.pre_pull == "pinnedImageSet" and "@sha256:" not in (self.reference or ""):
            shown = self.reference if self.reference is not None else "image.build"
            yield ConfigProblem(
                "prePull",
                "pinnedImageSet",
                f"pinnedImageSet needs image.reference by @sha256 digest (got {shown}); daemonSet pulls a tag or a built image",
            )


# ---------------------------------------------------------------------------------------- models

_PINNED_IMAGE = re.compile(
    rf"^({IPV6_HOST}|[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?)(/[a-z0-9]+([._-][a-z0-9]+)*)+(:[\w][\w.-]{{0,127}})?@sha256:[a-f0-9]{{64}}$"
)
"""A registered modelcar as an image volume names it: by digest (a tag before it is allowed and ignored by the runtime)."""
_REPO = re.compile(rf"^({IPV6_HOST}|[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?)(/[a-z0-9]+([._-][a-z0-9]+)*)+$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


@dataclass(frozen=True)
class PipelineCredential:
    """A Secret the model pipeline creates from stack secrets; which models need it is `ModelConfig.credentials`."""

    secret: str
    """The Kubernetes Secret's name."""
    type: str
    keys: tuple[tuple[str, str, str], ...]
    """(key in the Secret, which is also the steps' environment variable; the stack secret; what it is)."""


PIPELINE_CREDENTIALS: dict[str, PipelineCredential] = {
    "quay": PipelineCredential(
        "model-pipeline-quay",
        "kubernetes.io/dockerconfigjson",
        ((".dockerconfigjson", "quayDockerConfigJson", "Quay push credentials, a dockerconfigjson document (models)"),),
    ),
    "hf": PipelineCredential(
        "model-pipeline-hf",
        "Opaque",
        (("HF_TOKEN", "hfToken", "Hugging Face token (models with a huggingFace source marked gated: true)"),),
    ),
    "s3": PipelineCredential(
        "model-pipeline-s3",
        "Opaque",
        (
            ("AWS_ACCESS_KEY_ID", "s3AccessKeyId", "S3 access key id (models with an s3 source or uploadToS3)"),
            ("AWS_SECRET_ACCESS_KEY", "s3SecretAccessKey", "S3 secret access key (models with an s3 source or uploadToS3)"),
        ),
    ),
}


# A Hub repository id: huggingface/huggingface_hub src/huggingface_hub/utils/_validators.py validate_repo_id
# (REPO_ID_REGEX: word characters, '-' and '.', name at most 96; no '--' or '..'); here with its owner, which the
# download URL `/<owner>/<name>/resolve/…` needs.
_HF_PART = r"[A-Za-z0-9_]([\w.-]*[A-Za-z0-9_])?"
_HF_REPO = re.compile(rf"^{_HF_PART}/{_HF_PART}$")


def _check_hf_repo(value: str) -> str:
    name = value.rpartition("/")[2]
    if not _HF_REPO.match(value) or len(name) > 96 or "--" in value or ".." in value:
        hint = re.sub(r"\s+", "-", value.strip())
        suggestion = f": did you mean {hint!r}?" if hint != value and _HF_REPO.match(hint) else ""
        raise ValueError(
            "a Hugging Face repository '<owner>/<name>' (letters, digits, '-', '_' and '.'; no spaces, '--' or '..')" + suggestion
        )
    return value


# Hub revisions are git refs or commit ids: git's refs.c check_refname_component (Documentation/git-check-ref-format.txt):
# no control characters, space, ~ ^ : ? * [ \, no '..' or '@{', no component starting with '.' or ending in '.lock',
# no empty component, not ending in '/' or '.'; the Hub resolves `/resolve/<revision>/` by that name.
_GIT_REF_BAD = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^/|/$|\.$|^@$")


def _check_revision(value: str) -> str:
    if not value or _GIT_REF_BAD.search(value) or any(p.startswith(".") or p.endswith(".lock") for p in value.split("/")):
        hint = re.sub(r"[\s~^:?*\[\\]+", "-", value.strip()).strip("-/.")
        raise ValueError(
            "a branch, tag or commit as git names them (no spaces, '~', '^', ':', '?', '*', '[', '\\', '..' or '@{'; "
            "e.g. main, v1.0 or a commit id)" + (f": did you mean {hint!r}?" if hint and hint != value else "")
        )
    return value


class HuggingFaceSource(Model):
    """Download the weights from Hugging Face (secret hfToken)."""

    repo: Annotated[str, AfterValidator(_check_hf_repo)] = Field(
        description="Hugging Face repository `<owner>/<name>`, e.g. mistralai/Mistral-Small-24B-Instruct-2501."
    )
    revision: Annotated[str, AfterValidator(_check_revision)] = Field(
        "main", description="Branch, tag or commit (pin a commit for reproducible runs)."
    )
    gated: bool = Field(False, description="The repository needs an accepted license / token: the hfToken secret is then required.")


_ENDPOINT = re.compile(r"^https?://(\[[0-9a-fA-F:]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?(/[^\s]*)?$")


def _check_endpoint(value: str) -> str:
    if not re.match(r"^https?://", value, re.IGNORECASE):
        bare = value.strip().split("://", 1)[-1]
        hint = f": did you mean 'https://{bare}' (or 'http://{bare}')?" if bare else " (http:// or https://)"
        raise ValueError(f"an endpoint URL with its scheme{hint}")
    match = _ENDPOINT.match(value[: value.index("://")].lower() + value[value.index("://") :])
    if not match:
        raise ValueError(
            "an endpoint URL 'http(s)://<host>[:<port>]': the host is a DNS name or an IP address, without spaces or other characters"
        )
    port = re.search(r"^https?://[^/]*?:([0-9]+)(/|$)", value, re.IGNORECASE)
    if port and not 1 <= int(port.group(1)) <= 65535:
        raise ValueError(f"an endpoint URL whose port is 1 to 65535, not {port.group(1)}")
    return value


HttpUrl = Annotated[str, AfterValidator(_check_endpoint)]
"""An http(s) URL as the steps open it (urllib): scheme, host, an optional port 1-65535 and path, no spaces."""


# S3 bucket names (AWS's rules; MinIO's client applies the same: minio/minio-go pkg/s3utils/utils.go
# CheckValidBucketNameStrict, validBucketNameStrict): 3 to 63 lower-case letters, digits, '.' and '-'.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def _check_bucket(value: str) -> str:
    if not _BUCKET.match(value) or ".." in value or re.match(r"^(\d+\.){3}\d+$", value):
        hint = re.sub(r"[\s_]+", "-", value.strip().lower())
        suggestion = f": did you mean {hint!r}?" if hint != value and _BUCKET.match(hint) else ""
        raise ValueError("a bucket name: 3 to 63 lower-case letters, digits, '.' and '-', no spaces" + suggestion)
    return value


Bucket = Annotated[str, AfterValidator(_check_bucket)]


def same_registry(repository: str) -> str:
    """The repository as the registry sees it: `quay.io:443/org/m` is `quay.io/org/m` (registries are reached over
    HTTPS, whose port is 443: distribution/reference keeps the port in the name, but it is the same registry and image)."""
    host, slash, rest = repository.partition("/")
    return (host.removesuffix(":443") + slash + rest) if slash else repository


def _check_quay_repository(value: str) -> str:
    # a reference's first component is a registry host only with a '.' or ':' or as 'localhost'
    # (distribution/reference normalize.go splitDockerDomain); without one the push goes to docker.io
    if re.search(r"\s", value):
        hint = re.sub(r"\s+", "-", value.strip()).lower()
        raise ValueError(f"a repository without spaces (lower-case letters, digits, '.', '_', '-' and '/'): did you mean {hint!r}?")
    if value != value.lower() and not value.startswith("["):
        raise ValueError(f"a repository in lower case (registries refuse upper case in a path): did you mean {value.lower()!r}?")
    first, _, rest = value.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        raise ValueError(f"a repository with its registry host: did you mean 'quay.io/{value}'?")
    if ":" in rest or "@" in rest:
        raise ValueError("the repository without tag or digest (the tag goes in `tag`)")
    return value


class S3Source(Model):
    """Download the weights from S3 (secrets s3AccessKeyId, s3SecretAccessKey)."""

    endpoint: Annotated[str, AfterValidator(_check_endpoint)] = Field(
        description="S3 endpoint URL, e.g. http://minio.model-storage.svc:9000."
    )
    bucket: Bucket = Field(description="Bucket holding the weight files.")
    prefix: str = Field("", description="Key prefix of the weight files in the bucket.")
    region: str = Field("us-east-1", description="Region of the bucket (any value for most S3-compatible stores).")


class ModelSource(Model):
    """Where the weights come from: exactly one of huggingFace or s3."""

    hugging_face: HuggingFaceSource | None = Field(None, description="A Hugging Face repository.")
    s3: S3Source | None = Field(None, description="An S3 bucket and prefix.")

    @model_validator(mode="after")
    def _one(self) -> ModelSource:
        if (self.hugging_face is None) == (self.s3 is None):
            raise ConfigProblem("huggingFace", "both" if self.hugging_face else None, "set exactly one of huggingFace or s3")
        return self


class Registration(Model):
    """How the packaged model is recorded in the model registry."""

    model_name: str = Field(description="Registered model name in the model registry.")
    version_name: str = Field(description="Model version name.")
    description: str = Field("", description="Description of the registered model.")
    base_model: str | None = Field(None, description="The model this one derives from (recorded as the base_model property).")


class S3Upload(Model):
    """Where the weight files are uploaded (secrets s3AccessKeyId, s3SecretAccessKey)."""

    endpoint: Annotated[str, AfterValidator(_check_endpoint)] = Field(description="S3 endpoint URL.")
    bucket: Bucket = Field(description="Destination bucket.")
    prefix: str = Field(description="Key prefix the weight files are uploaded under.")
    region: str = Field("us-east-1", description="Region of the bucket.")


class ModelConfig(Model):
    """One model to package as a KServe modelcar (docs: Models, "Packaging pipeline")."""

    name: DnsLabel = Field(description="Short name; the PipelineRun and internal ImageStream derive from it.")
    source: ModelSource = Field(description="Where the weights come from.")
    include: list[str] = Field(
        default_factory=lambda: list(DEFAULT_INCLUDE),
        description="File patterns to download (the download step's own default). consolidated* weights are skipped when "
        "sharded ones exist, *.bin weights when *.safetensors ones do; code that config.json's auto_map needs must be included.",
    )
    retry: int = Field(
        0,
        ge=0,
        description="Raise by one to start a new run of an unchanged model (a new run name); blobs already in "
        "the registry are not sent again.",
    )
    size_gi: float = Field(gt=0, le=4096, description="Approximate size of the weights in GiB (sizes PVC and timeouts).")
    quantization: str = Field("none", description="Quantization scheme recorded in the registry, e.g. w4a16 or none.")
    quay_repository: Annotated[str, AfterValidator(_check_quay_repository)] = Field(
        description="Destination repository with its registry host, e.g. quay.io/org/mistral-small-24b."
    )
    tag: str = Field(description="Image tag for both the Quay and the internal image.")
    internal_image_stream: DnsLabel | None = Field(None, description="Internal ImageStream name (default: name).")
    registration: Registration = Field(description="Model registry entry.")
    upload_to_s3: S3Upload | None = Field(None, description="Also upload the weight files to S3.")
    workspace_size: Quantity | None = Field(
        None, description="Workspace PVC size, for a model that downloads (stream: false or uploadToS3); default: computed from sizeGi."
    )
    mount_in_env: AbsPath | None = Field(
        None,
        description="Mount the model's registered modelcar image (registeredImage) read-only at this path in every pod "
        "of every environment of the cluster: a Kubernetes image volume, subPath `models` (one pull per node, no claim "
        "bytes). Needs cluster.imageVolumes.",
    )
    registered_image: str | None = Field(
        None,
        description="The image mountInEnv mounts, pinned by digest: `<registry>/<repo>@sha256:<64 hex>`, as the register "
        "step records it (its log line `registered: oci://…`, the model registry's artifact URI without `oci://`, or the "
        "PipelineRun's INTERNAL_IMAGE result).",
    )
    stream: bool = Field(
        True,
        description="Package straight from the source (S3 or Hugging Face) into the registry: no download task, no PVC "
        "for the weights; layer digest and the source's checksum computed on the way. The default, except with uploadToS3 "
        "(which uploads the downloaded files: default false there, true refused); false: download onto a workspace PVC first.",
    )

    def credentials(self) -> dict[str, bool]:
        """The `PIPELINE_CREDENTIALS` this model uses, each with whether the stack must set its secrets."""
        used = {"quay": True}
        if self.source.hugging_face:
            # Only gated repositories need the token; when it is set, every Hugging Face download uses it.
            used["hf"] = self.source.hugging_face.gated
        if self.source.s3 or self.upload_to_s3:
            used["s3"] = True
        return used

    @model_validator(mode="before")
    @classmethod
    def _stream_default(cls, data: Any) -> Any:
        """`stream` unset (or null): stream, unless the model uploads its downloaded files to S3."""
        if isinstance(data, dict) and data.get("stream") is None:
            upload = data.get("uploadToS3", data.get("upload_to_s3"))
            return {**data, "stream": upload is None}
        return data

    @rule
    def _mountable(self) -> Iterator[ConfigProblem]:
        image = self.registered_image
        if image is not None:
            bare = image.removeprefix("oci://")
            if not _PINNED_IMAGE.match(bare):
                yield ConfigProblem(
                    "registeredImage",
                    image,
                    "an image pinned by digest, '<registry>/<repo>@sha256:<64 hex>' (a tag can move: every pod must mount "
                    "the same bytes); the register step logs it as 'registered: oci://…@sha256:…'"
                    + (f": did you mean {bare!r}?" if bare != image and _PINNED_IMAGE.match(bare) else ""),
                )
        if self.mount_in_env is not None and image is None:
            yield ConfigProblem(
                "mountInEnv",
                self.mount_in_env,
                "needs registeredImage, the model's image by digest ('<registry>/<repo>@sha256:<64 hex>', logged by the "
                "register step as 'registered: oci://…')",
            )
        if self.mount_in_env is not None:
            for reserved in RESERVED_MOUNTS:
                if self.mount_in_env == reserved or self.mount_in_env.startswith(reserved + "/"):
                    yield ConfigProblem("mountInEnv", self.mount_in_env, f"{reserved} is reserved")

    @model_validator(mode="after")
    def _destination(self) -> ModelConfig:
        if self.stream and self.upload_to_s3 is not None:
            raise ConfigProblem("stream", "stream: true", "not with uploadToS3 (the upload reads the downloaded files); set one of them")
        if not _REPO.match(self.quay_repository):
            raise ConfigProblem("quayRepository", self.quay_repository, "must be '<registry>/<org>/<repo>' without tag")
        if not _TAG.match(self.tag):
            hint = re.sub(r"[^\w.-]+", "-", self.tag).strip(".-")
            raise ConfigProblem(
                "tag",
                self.tag,
                "a tag of at most 128 letters, digits, '_', '.' and '-', not starting with '.' or '-' (':' separates a "
                "repository from its tag: the repository goes in quayRepository)" + (f": did you mean {hint!r}?" if hint else ""),
            )
        if self.tag == "latest":
            raise ConfigProblem("tag", self.tag, "a version tag, not 'latest' (a moving tag: a rerun could package over it)")
        return self


class ModelRegistryAccess(Model):
    """A secured RHOAI model registry (kube-rbac-proxy) admits a service account that may `get` its
    Service: the operator's Role `registry-user-<name>` in the registry's namespace grants exactly that."""

    namespace: DnsLabel = Field(description="Namespace of the model registry (where its Role `registry-user-<name>` lives).")
    name: DnsLabel = Field(description="Name of the ModelRegistry (its Service), e.g. modelregistry-public.")


CHUNK_FLOOR = 1 << 20
"""The smallest modelPipeline.chunkSize (1 MiB): the package step's own floor when a registry refuses a chunk."""


class ModelPipelineConfig(Model):
    """Shared settings of the model-packaging pipeline."""

    service_account: DnsLabel = Field("model-pipeline", description="ServiceAccount of the pipeline pods (created by the stack).")
    modelcar_base_image: ImageRef = Field(
        "registry.access.redhat.com/ubi9/ubi-micro:9.6", description="Runnable base (with a shell) of every modelcar."
    )
    tools_base_image: ImageRef = Field(
        "registry.access.redhat.com/ubi9/python-311:9.6", description="Base of the step tools image (Python + skopeo)."
    )
    registry_url: HttpUrl = Field(
        "http://model-registry.rhoai-model-registries.svc.cluster.local:8080", description="Model registry REST endpoint."
    )
    registry_ca_file: str = Field(
        f"{contract.SA_DIR}/service-ca.crt",
        description="CA bundle (path in the step) for an https registryUrl; the default, the service CA, verifies an "
        "in-cluster secured registry's serving certificate. Empty: the image's system trust store.",
    )
    registry_access: ModelRegistryAccess | None = Field(
        None,
        description="Opt-in: bind the pipeline's service account to the registry's `registry-user-<name>` Role "
        "(a RoleBinding in the registry's namespace; needs admin rights there).",
    )
    storage_class: DnsSubdomain | None = Field(None, description="Storage class of the per-run workspace PVC.")
    node_ephemeral_free: Quantity = Field(
        "13Gi", description="Smallest free node ephemeral storage on build nodes (preflight: step scratch must fit)."
    )
    chunk_threshold: Quantity = Field(
        "2G",
        description="Blobs above this are uploaded as several PATCH requests of chunkSize, so a failure costs one chunk, "
        "not the blob (chunking does not get past maxLayerSize). At least chunkSize.",
    )
    chunk_size: Quantity = Field(
        "1Gi",
        description="Size of each PATCH request of a chunked upload (package --chunk-size): lower it when a proxy in front "
        "of the registry limits request bodies (HTTP 413/416). At least 1 byte, at most chunkThreshold.",
    )
    max_layer_size: Quantity = Field(
        "20G",
        description="Largest layer (one model file + ~1.5 KiB of tar headers) the registry accepts: Quay's "
        "MAXIMUM_LAYER_SIZE, default 20G, applies to the whole blob, chunked or not. The download task refuses a "
        "larger file before transferring anything.",
    )
    max_model_size_gi: float = Field(64, gt=0, le=4096, description="Largest model the Pipeline's per-task timeouts are sized for (GiB).")

    @rule
    def _chunks_the_package_step_accepts(self) -> Iterator[ConfigProblem]:
        # What `steps/package.py` (parse_args) refuses, refused here by key: the steps take whole bytes
        # (components/model_pipeline.py renders each size as its integer byte count).
        chunk, threshold = int(parse_quantity(self.chunk_size)), int(parse_quantity(self.chunk_threshold))
        if chunk < CHUNK_FLOOR:
            # The API server has no say here; the package step does: each chunk is a PATCH and a record rewrite, so
            # chunkSize 256 took 107 s for a 256 KiB file (1,083 PATCHes; 1.3 s at 64 KiB), and the step itself never
            # shrinks a refused chunk below 1 MiB (steps/package.py, on HTTP 413).
            yield ConfigProblem(
                "chunkSize",
                self.chunk_size,
                "at least 1Mi (each chunk is one PATCH and one record rewrite: 256 bytes made a 256 KiB file take 107 s; "
                "the package step never shrinks a chunk below 1 MiB); a size such as 256Mi or 1Gi",
            )
        elif chunk > threshold:
            yield ConfigProblem(
                "chunkSize", self.chunk_size, f"at most chunkThreshold ({self.chunk_threshold}): only blobs above it are chunked"
            )
        if int(parse_quantity(self.max_layer_size)) < 1:  # 0 bytes would reach the steps as "no limit"
            yield ConfigProblem("maxLayerSize", self.max_layer_size, "at least 1 byte (Quay's default is 20G)")


# ------------------------------------------------------------------------------------- lifecycle

_DURATION = re.compile(r"^([0-9]+)(s|m|h)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(value: str) -> int:
    """'90s' / '45m' / '2h' as seconds."""
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a duration such as '90s', '45m' or '2h'")
    return int(match[1]) * _UNIT_SECONDS[match[2]]


def idle_default(key: str) -> str:
    """An idle.json default of the contract (inpod/contract.py IDLE_DEFAULTS, seconds) as the schema's duration."""
    seconds = int(contract.IDLE_DEFAULTS[key])
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds // 60}m" if seconds % 60 == 0 and seconds > 60 else f"{seconds}s"


def _check_duration(value: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration such as '90s', '45m' or '2h' (a quoted string with a unit)")
    duration_seconds(value)
    return value


def _bare_duration(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        n = int(value) if float(value).is_integer() else value
        low, high = DURATION_BOUNDS.get(info.field_name or "", (1, 10**9))
        fits = [f"'{n}{unit}'" for unit, seconds in _UNIT_SECONDS.items() if low <= n * seconds <= high]
        if fits:
            hint = f"did you mean {' or '.join(fits)}?"
        else:
            hint = f"between {_shown(low)} and {_shown(high)} here, e.g. '{_shown(max(low, min(high, 3600)))}'"
        raise ValueError(f"a duration needs a unit (a quoted string such as '90s', '45m', '2h'): {hint}")
    return value


def _shown(seconds: int) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


Duration = Annotated[str, BeforeValidator(_bare_duration), AfterValidator(_check_duration)]

# Admin bounds of the idle stop (a stack cannot configure a stop that is more eager or lazier than this).
IDLE_TIMEOUT_BOUNDS = (15 * 60, 24 * 3600)
IDLE_INTERVAL_BOUNDS = (15, 5 * 60)
IDLE_WARNING_BOUNDS = (60, 3600)
IDLE_UNREACHABLE_BOUNDS = (120, 3600)
DURATION_BOUNDS = {
    "idle_timeout": IDLE_TIMEOUT_BOUNDS,
    "interval": IDLE_INTERVAL_BOUNDS,
    "warning_lead": IDLE_WARNING_BOUNDS,
    "unreachable_after": IDLE_UNREACHABLE_BOUNDS,
}
"""The bounds a bare number's suggestion keeps to, by field (only idleStop's fields carry these names)."""


class IdleStopConfig(Model):
    """GPU-aware idle auto-stop: the whole environment is suspended (scaled to 0) after `idleTimeout` without activity."""

    enabled: bool = Field(
        contract.IDLE_DEFAULTS["enabled"],
        description="Run the idle agent's stop decision (opt-in); the agent on pod 0 scales the StatefulSet to 0.",
    )
    idle_timeout: Duration = Field(
        idle_default("idleTimeoutSeconds"), description="Inactivity after which the environment is stopped (admin bounds: 15m to 24h)."
    )
    interval: Duration = Field(
        idle_default("intervalSeconds"), description="How often every pod's signals are sampled (admin bounds: 15s to 5m)."
    )
    warning_lead: Duration = Field(
        idle_default("warningLeadSeconds"),
        description="How long before the stop the warning file and terminal banner appear (1m to 1h, less than idleTimeout).",
    )
    gpu_util_threshold: int = Field(
        contract.IDLE_DEFAULTS["gpuUtilThreshold"],
        ge=1,
        le=50,
        description="A GPU whose utilization.gpu (percent, nvidia-smi) is at or above this counts as busy.",
    )
    gpu_memory_util_threshold: int = Field(
        contract.IDLE_DEFAULTS["gpuMemoryUtilThreshold"],
        ge=1,
        le=50,
        description="A GPU whose utilization.memory (memory-controller activity, %) at or above this counts as busy.",
    )
    gpu_memory_floor_mib: int = Field(
        contract.IDLE_DEFAULTS["gpuMemoryFloorMiB"],
        ge=64,
        le=65536,
        description="A GPU with at least this much memory.used (MiB) counts as busy, whatever its utilisation (a job in a "
        "CPU phase keeps its memory); a GPU with a compute process always does.",
    )
    unreachable_after: Duration = Field(
        idle_default("unreachableSeconds"),
        description="A worker pod unreachable this long (Pending, no network) is reported (an Event) and no longer holds "
        "the stop (2m to 1h; until then it counts as active).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> IdleStopConfig:
        for key, value, (low, high) in (
            ("idleTimeout", self.idle_timeout, IDLE_TIMEOUT_BOUNDS),
            ("interval", self.interval, IDLE_INTERVAL_BOUNDS),
            ("warningLead", self.warning_lead, IDLE_WARNING_BOUNDS),
            ("unreachableAfter", self.unreachable_after, IDLE_UNREACHABLE_BOUNDS),
        ):
            if not low <= duration_seconds(value) <= high:
                raise ConfigProblem(key, value, f"between {low}s and {high}s (admin bounds of the idle stop)")
        if duration_seconds(self.warning_lead) >= duration_seconds(self.idle_timeout):
            raise ConfigProblem("warningLead", self.warning_lead, f"must be shorter than idleTimeout ({self.idle_timeout})")
        if duration_seconds(self.interval) * 2 > duration_seconds(self.warning_lead):
            raise ConfigProblem("interval", self.interval, f"at most half of warningLead ({self.warning_lead}) so the warning is seen")
        return self


# Kueue's own default of waitForPodsReady.timeout (kubernetes-sigs/kueue apis/config/v1beta1/defaults.go,
# SetDefaults_Configuration: `defaultPodsReadyTimeout = 5 * time.Minute`).
KUEUE_PODS_READY_TIMEOUT_DEFAULT = "5m"


class KueueConfig(Model):
    queue_name: DnsLabel | None = Field(
        None, description="Kueue LocalQueue: the StatefulSet gets kueue.x-k8s.io/queue-name and is admitted as one workload (opt-in)."
    )
    wait_for_pods_ready_timeout: Duration = Field(
        KUEUE_PODS_READY_TIMEOUT_DEFAULT,
        description="The cluster's Kueue `waitForPodsReady.timeout` (Kueue's default 5m; ask the Kueue admin): with "
        "fabricCheck.onDeploy it must exceed the image pull time plus onDeployTimeoutSeconds, else Kueue evicts the workload.",
    )
    image_pull_seconds: int = Field(
        600, ge=0, le=6 * 3600, description="How long the pods may take to pull the image (checked against waitForPodsReadyTimeout)."
    )


class LifecycleConfig(Model):
    """Suspend / resume, idle auto-stop and gang admission."""

    suspended: bool = Field(
        False, description="Scale the StatefulSet to 0 (frees GPUs and NICs); claims, routes, secrets and settings stay. false resumes."
    )
    idle_stop: IdleStopConfig = Field(default_factory=IdleStopConfig)
    kueue: KueueConfig = Field(default_factory=KueueConfig)
    checkpoint_grace_seconds: int = Field(
        contract.GRACE_DEFAULT,
        ge=5,
        le=3600,
        description="On every stop (idle stop, suspend, destroy, pod deletion) each rank of a running `ml-dev run` gets "
        "checkpointSignal and this long to save and exit before it is killed; the pods' termination grace follows it.",
    )
    checkpoint_signal: Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"] = Field(
        contract.SIGNAL_DEFAULT, description="The signal the ranks get on a stop (the job's handler saves a checkpoint and exits)."
    )
    usage_reads_nodes: bool = Field(
        True,
        description="Cluster stack: let its usage recorder and those of its environment stacks in the checkout read the "
        "nodes (a ClusterRole and its binding, a Role in kube-node-lease: cluster-admin once; an environment added later "
        "is bound by the cluster's next `up`, its preview says so meanwhile), so a pod on a NotReady or deleted node is "
        "charged until the node's last heartbeat. false (a namespace admin's cluster): no cluster-scoped objects, the "
        "recorders read the pods alone and say so once. An environment stack's false leaves its own recorder out.",
    )
    stall_verdict_seconds: int = Field(
        contract.STALL_DEFAULT,
        ge=0,
        le=86400,
        description="When a running `ml-dev run` makes no progress this long (no output line from any rank, no touch of "
        "$ML_DEV_PROGRESS_FILE) it runs `ml-dev why` itself, prints the verdict once per stall and keeps it with the "
        f"run; 0 never does. At least {contract.STALL_MIN} when set.",
    )

    @rule
    def _stall(self) -> Iterator[ConfigProblem]:
        if 0 < self.stall_verdict_seconds < contract.STALL_MIN:
            yield ConfigProblem(
                "stallVerdictSeconds",
                self.stall_verdict_seconds,
                f"0 (never) or {contract.STALL_MIN} to 86400 seconds (the verdict itself takes a few seconds)",
            )


# ------------------------------------------------------------------------------------------- ssh

SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
SSH_PUBLIC_KEY = re.compile(r"^(?P<type>[a-z0-9@.-]+) (?P<blob>[A-Za-z0-9+/]+={0,2})( [^\n]*)?$")


def _ssh_blob_type(blob: str) -> str | None:
    """The key type an OpenSSH public key blob names in its first field (uint32 length + name)."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return None
    size = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else -1
    return raw[4 : 4 + size].decode("ascii", "replace") if 0 < size <= len(raw) - 4 else None


class SshConfig(Model):
    """The SSH fabric between the pods (and from laptops through `oc`): who may log in besides the stack's own key."""

    authorized_keys: list[str] = Field(
        default_factory=list,
        description="Users' OpenSSH public keys ('ssh-ed25519 AAAA... comment'), allowed to log in to every pod.",
    )

    @model_validator(mode="after")
    def _keys(self) -> SshConfig:
        for i, key in enumerate(self.authorized_keys):
            m = SSH_PUBLIC_KEY.match(key.strip())
            if not m or m["type"] not in SSH_KEY_TYPES or _ssh_blob_type(m["blob"]) != m["type"]:
                shown = key if len(key) <= 40 else key[:37] + "..."
                raise ConfigProblem(
                    f"authorizedKeys[{i}]",
                    shown,
                    f"one OpenSSH public key line '<type> <base64> [comment]' (as in ~/.ssh/id_ed25519.pub) of type "
                    f"{', '.join(SSH_KEY_TYPES)}; never a private key",
                )
        return self


# ---------------------------------------------------------------------------------- fabric check


class FabricCheckConfig(Model):
    """RDMA preflight, NCCL bandwidth gate and rack-aware ranks (docs: Operate, "Fabric check")."""

    link_gbps: float | None = Field(
        None,
        gt=0,
        le=3200,
        description="RDMA: link rate of each NIC in Gbit/s (e.g. 400). Preflight checks every HCA runs at it; the gate's "
        "expected bus bandwidth derives from it. Unset: no rate check and no expectation (the gate only reports).",
    )
    efficiency: float | None = Field(
        None,
        gt=0,
        le=1,
        description="RDMA: fraction of the NICs' line rate NCCL's ring all-reduce reaches as bus bandwidth. Unset: 0.973, "
        "calibrated on barcelona (194.6 GB/s bus bandwidth with 4 × 400 Gbit/s NICs).",
    )
    tcp_link_gbps: float | None = Field(
        None,
        gt=0,
        le=3200,
        description="TCP: link rate of the pod's primary interface in Gbit/s. "
        "Unset: TCP stacks get no expectation (the gate only reports).",
    )
    tcp_efficiency: float | None = Field(
        None,
        gt=0,
        le=1,
        description="TCP: fraction of tcpLinkGbps expected as bus bandwidth; "
        "required with tcpLinkGbps (sockets have no calibration point).",
    )
    threshold_fraction: float = Field(
        0.9, gt=0, le=1, description="The gate passes when the plateau bus bandwidth is at least this fraction of the expectation."
    )
    plateau_min_bytes: int = Field(
        4 << 30,
        ge=1 << 20,
        le=8 << 30,
        description="Message sizes from this many bytes up to 8 GiB form the plateau the gate judges (smaller sizes are reported only).",
    )
    on_deploy: bool = Field(
        False, description="Pod 0 holds its dev servers (and readiness) until the preflight and gate pass after a deploy."
    )
    on_deploy_timeout_seconds: int = Field(
        1800,
        ge=60,
        le=6 * 3600,
        description="How long pod 0 retries the check at start before it stops trying (it keeps holding until a passing "
        "`fabric-check gate` or `fabric-check release`).",
    )
    node_racks: dict[DnsSubdomain, DnsLabel] = Field(
        default_factory=dict,
        description="Node name → rack (or leaf switch). Set: ranks are ordered so consecutive ranks share a rack "
        "(pod 0 stays rank 0). Empty: rank = pod ordinal. `make racks LABEL=<node label>` writes it from a node topology label.",
    )

    @rule
    def _tcp_expectation(self) -> Iterator[ConfigProblem]:
        if self.tcp_link_gbps is not None and self.tcp_efficiency is None:
            yield ConfigProblem(
                "tcpEfficiency",
                None,
                "required with tcpLinkGbps: the 0.973 efficiency is calibrated for RDMA only (or unset tcpLinkGbps)",
            )


# ------------------------------------------------------------------------------------------- env

ENV_NAME = re.compile(f"^{contract.ENV_NAME_PATTERN}$")  # the one rule (config, pod library, shell)
RESERVED_ENV = (
    *contract.CONTAINER_ENV,
    *contract.SERVER_ENV,
    *contract.STOP_ENV,
    *contract.RANK_ENV,
    *contract.CLUSTER_ENV,
    *contract.DEVLOOP_ENV,
    *contract.PER_POD_ENV,
    "RANK",
    "LOCAL_RANK",
    "PATH",
    "LD_*",
    "ML_DEV_*",
    "NCCL_*",
    "TORCH_NCCL_*",
    "UCX_*",
)
"""Names a Secret key may not take (glob patterns): what the pod, the rank contract or network.ncclEnv sets."""


def _check_env_name(value: str) -> str:
    if not ENV_NAME.match(value):
        raise ValueError("an environment variable name: letters, digits and '_', not starting with a digit (e.g. WANDB_API_KEY)")
    taken = next((p for p in RESERVED_ENV if fnmatch.fnmatchcase(value, p)), None)
    if taken:
        raise ValueError(f"a name the pod sets itself ({taken}): choose another key name (e.g. WANDB_API_KEY)")
    return value


EnvName = Annotated[str, AfterValidator(_check_env_name)]


class SecretRef(Model):
    """One existing Secret of the namespace and the keys of it every rank gets as environment variables."""

    secret: DnsSubdomain = Field(
        description="Name of a Secret that exists in the namespace (`oc create secret generic ...`); never created or read by the stack."
    )
    keys: list[EnvName] = Field(
        min_length=1, description="Its keys to export, each an environment variable name (the key in the Secret and the variable)."
    )

    @rule
    def _unique(self) -> Iterator[ConfigProblem]:
        if duplicates(self.keys):
            yield ConfigProblem("keys", duplicates(self.keys), "each key once")


class EnvConfig(Model):
    """What every rank's environment gets besides the pod's own (docs: Use, "Secrets on every rank")."""

    secrets: list[SecretRef] = Field(
        default_factory=list,
        description="Existing Secrets mounted read-only in every pod; their keys are exported to every rank by `ml-dev run`/`exec` "
        "and to every SSH session. Names only: the stack never holds a value.",
    )

    @rule
    def _once(self) -> Iterator[ConfigProblem]:
        names = [s.secret for s in self.secrets]
        if duplicates(names):
            yield ConfigProblem("secrets[].secret", duplicates(names), "each Secret once (list all its keys in one entry)")
        across = duplicates([k for s in self.secrets for k in dict.fromkeys(s.keys)])  # twice in one entry: _unique
        if across:
            yield ConfigProblem("secrets[].keys", across, "a variable comes from one Secret only")

    def listed(self) -> list[tuple[str, str]]:
        """(secret, key) in order."""
        return [(s.secret, k) for s in self.secrets for k in s.keys]


# ----------------------------------------------------------------------------------- environment


class EnvironmentConfig(Model):
    """Makes the stack an environment stack: one person's environment on a cluster stack's cluster (docs: Use, "Team environments")."""

    cluster: DnsLabel = Field(
        description="The cluster stack (its `Pulumi.<cluster>.yaml` in this project) whose image, storage and network it uses."
    )
    name: DnsLabel = Field(
        description="Environment name (usually the person's): every object's name carries it (`<cluster appName>-<name>`)."
    )
    namespace: DnsLabel | None = Field(
        None,
        description="Own namespace (stronger isolation: nobody with `pods/exec` in the cluster's namespace can enter "
        "its pods); unset = the cluster's.",
    )
    stack_reference: str | None = Field(
        None, description="Pulumi stack holding the cluster's `environment_facts` output; unset = `<organization>/ml-dev-env/<cluster>`."
    )


# ----------------------------------------------------------------------------------------- stack


class StackConfig(Model):
    """Everything under `ml-dev-env:` in a stack file."""

    cluster: ClusterConfig
    nodes: NodesConfig
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    access: AccessConfig = Field(default_factory=AccessConfig)
    storage: StorageConfig
    image: ImageConfig
    build_nodes: BuildNodesConfig = Field(default_factory=BuildNodesConfig)
    model_pipeline: ModelPipelineConfig = Field(default_factory=ModelPipelineConfig)
    models: list[ModelConfig] = Field(default_factory=list)
    lifecycle: LifecycleConfig = Field(default_factory=LifecycleConfig)
    ssh: SshConfig = Field(default_factory=SshConfig)
    fabric_check: FabricCheckConfig = Field(
        default_factory=FabricCheckConfig,
        description='RDMA preflight, NCCL bandwidth gate and rack-aware ranks (docs: Operate, "Fabric check").',
    )
    env: EnvConfig = Field(
        default_factory=EnvConfig,
        description='Existing Secrets exported to every rank and SSH session (docs: Use, "Secrets on every rank").',
    )
    environment: EnvironmentConfig | None = Field(
        None,
        description="Set only in an environment stack (`Pulumi.<cluster>-<env>.yaml`): the cluster and the environment "
        '(docs: Use, "Team environments").',
    )

    @rule
    def _fabric_racks(self) -> Iterator[ConfigProblem]:
        racks = self.fabric_check.node_racks
        if racks and self.nodes.gpu_nodes:
            missing = [n for n in self.nodes.gpu_nodes if n not in racks]
            if missing:
                yield ConfigProblem(
                    "fabricCheck.nodeRacks", missing, "every node in nodes.gpuNodes needs a rack (or leave nodeRacks empty)"
                )
            unknown = [n for n in racks if n not in self.nodes.gpu_nodes]
            if unknown:
                yield ConfigProblem(
                    "fabricCheck.nodeRacks",
                    unknown,
                    f"not in nodes.gpuNodes ({', '.join(self.nodes.gpu_nodes)}): a typo of a node name? "
                    "nodeRacks maps each listed GPU node to its rack",
                )

    def stack_secrets(self) -> dict[str, str]:
        """{name or glob: what it is} of the Secrets the stacks create in this namespace: this stack's, its cluster
        stack's (an environment stack's cluster) and every other environment's of that cluster, and the model
        pipeline's (components/devloop.py, gpu_cluster.py _dev_credentials, model_pipeline.py)."""
        app = self.cluster.app_name
        cluster_app = app.removesuffix(f"-{self.environment.name}") if self.environment else app
        out: dict[str, str] = {}
        for name, what in (
            (naming.ssh_secret, "SSH keys"),
            (naming.oauth_cookie_secret, "OAuth cookie"),
            (naming.dev_tokens_secret, "dev server tokens"),
        ):
            out[name(app)] = f"this stack's {what}"
            if cluster_app != app:
                out[name(cluster_app)] = f"the cluster stack's {what}"
            out[name(f"{cluster_app}-*")] = f"another environment's {what}"
        for cred in PIPELINE_CREDENTIALS.values():
            out[cred.secret] = "the model pipeline's (made from the cluster stack's secrets)"
        return out

    @rule
    def _user_secrets_not_ours(self) -> Iterator[ConfigProblem]:
        owned = self.stack_secrets()
        for i, ref in enumerate(self.env.secrets):
            what = next((w for pattern, w in owned.items() if fnmatch.fnmatchcase(ref.secret, pattern)), None)
            if what:
                yield ConfigProblem(
                    f"env.secrets[{i}].secret",
                    ref.secret,
                    f"a Secret the stacks create ({what}), not yours: its keys are never a rank's. Make your own with "
                    f"`oc create secret generic <name> --from-literal=<KEY>=...` and list that one (a value you need from "
                    f"{ref.secret}: copy it into your Secret)",
                )

    @rule
    def _kueue_pods_ready(self) -> Iterator[ConfigProblem]:
        kueue = self.lifecycle.kueue
        if kueue.queue_name and self.fabric_check.on_deploy:
            have = duration_seconds(kueue.wait_for_pods_ready_timeout)
            need = kueue.image_pull_seconds + self.fabric_check.on_deploy_timeout_seconds
            if have <= need:
                yield ConfigProblem(
                    "lifecycle.kueue.waitForPodsReadyTimeout",
                    kueue.wait_for_pods_ready_timeout,
                    f"Kueue evicts a workload whose pods are not all Ready within it ({have}s), and pod 0 stays un-Ready while "
                    f"fabricCheck.onDeploy holds it: it must exceed imagePullSeconds ({kueue.image_pull_seconds}) + "
                    f"fabricCheck.onDeployTimeoutSeconds ({self.fabric_check.on_deploy_timeout_seconds}) = {need}s. "
                    "Set it to the cluster's Kueue waitForPodsReady.timeout (ask the Kueue admin to raise it), or lower "
                    "onDeployTimeoutSeconds",
                )

    @rule
    def _cross(self) -> Iterator[ConfigProblem]:
        # Rules of one object live in its model (route host length: ClusterConfig; RDMA per-NIC lists:
        # NetworkConfig), so they are reported even when another object has a mistake.
        names = [m.name for m in self.models]
        if duplicates(names):
            yield ConfigProblem("models[].name", duplicates(names), "model names must be unique")
        pushed: dict[str, int] = {}
        for i, model in enumerate(self.models):
            image = f"{same_registry(model.quay_repository)}:{model.tag}"
            if image in pushed and model.name not in duplicates(names):  # a model given twice is reported above
                yield ConfigProblem(
                    f"models[{i}].tag",
                    model.tag,
                    f"models[{pushed[image]}] ({self.models[pushed[image]].name}) pushes {image} too: the later push would "
                    "replace the other model's image; give each model its own tag or quayRepository",
                )
            pushed.setdefault(image, i)
        for i, model in enumerate(self.models):
            problem = preflight(model, self.model_pipeline)
            if problem:
                yield ConfigProblem(f"models[{i}]", model.name, problem)
        yield from self._model_mounts()

    def _model_mounts(self) -> Iterator[ConfigProblem]:
        mounted = [(i, m) for i, m in enumerate(self.models) if m.mount_in_env is not None]
        if mounted and not self.cluster.image_volumes:
            for i, model in mounted:
                yield ConfigProblem(
                    f"models[{i}].mountInEnv",
                    model.mount_in_env,
                    "the cluster does not serve image volumes (cluster.imageVolumes is false): set it true where Kubernetes "
                    "is 1.33 or later with the ImageVolume feature gate on, else remove mountInEnv and copy the model "
                    "onto a volume",
                )
        taken = {v.mount_path: f"storage volume {v.name}" for v in self.storage.volumes}
        for i, model in mounted:
            path = str(model.mount_in_env)
            clash = next((w for p, w in taken.items() if path == p or path.startswith(p + "/") or p.startswith(path + "/")), None)
            if clash:
                yield ConfigProblem(f"models[{i}].mountInEnv", path, f"overlaps the mount of {clash}: give the model a path of its own")
            taken[path] = f"model {model.name}"
