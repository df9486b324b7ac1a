"""A small typed layer over the OpenShift/Multus kinds that pulumi-kubernetes has no typed classes for.

Route, NetworkAttachmentDefinition (and later BuildConfig/ImageStream/Tekton) are created with
`apiextensions.CustomResource`; SecurityContextConstraints keeps its fields at the top level (no
`spec`), so it gets a thin `pulumi.CustomResource` subclass. The pydantic models below catch typos
and wrong types at `pulumi preview` time, before the API server would silently prune them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
from pulumi_kubernetes import _utilities as k8s_utilities
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


# ------------------------------------------------------------------------------------------ Route


class RouteTargetReference(Spec):
    kind: Literal["Service"] = "Service"
    name: str
    weight: int = 100


class RoutePort(Spec):
    target_port: str | int


class RouteTls(Spec):
    termination: Literal["edge", "reencrypt", "passthrough"] = "edge"
    insecure_edge_termination_policy: Literal["Redirect", "None", "Allow"] = "Redirect"


class RouteSpec(Spec):
    host: str
    to: RouteTargetReference
    port: RoutePort
    tls: RouteTls = RouteTls()
    wildcard_policy: Literal["None"] = "None"


# ------------------------------------------------------------------- NetworkAttachmentDefinition


def sriov_nad_config(name: str, subnet: str, mtu: int) -> str:
    """CNI config of an SR-IOV attachment with whereabouts IPAM (k8s/network-attachments/base)."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": name,
            "type": "sriov",
            "mtu": mtu,
            "vlan": 0,
            "spoofchk": "off",
            "trust": "on",
            "link_state": "enable",
            "ipam": {"type": "whereabouts", "range": subnet},
        },
        sort_keys=True,
    )


class NadSpec(Spec):
    config: str


# ---------------------------------------------------------------------- SecurityContextConstraints


class SccStrategy(Spec):
    type: str


SSHD_KEEPS_DROPPABLE = ("KILL", "MKNOD")
"""The SCC's requiredDropCapabilities; a root sshd needs SETUID and SETGID (see SccFields)."""
SSHD_NEEDS = ("SETUID", "SETGID")
"""Capabilities an SCC must not require dropping for a UID-0 pod's sshd."""


class SccFields(Spec):
    """Top-level fields of security.openshift.io/v1 SecurityContextConstraints."""

    allow_privileged_container: bool = False
    allow_privilege_escalation: bool = True
    allow_host_dir_volume_plugin: bool = False
    allow_host_ipc: bool = Field(False, alias="allowHostIPC")
    allow_host_network: bool = False
    allow_host_pid: bool = Field(False, alias="allowHostPID")
    allow_host_ports: bool = False
    allowed_capabilities: list[str]
    default_add_capabilities: list[str] = []
    # Not SETUID/SETGID: admission adds required drops to the container's drop list, and the RDMA pods run
    # as UID 0, whose sshd always demotes its pre-authentication child (setgroups/setresuid: OpenSSH
    # sshd-session.c privsep_preauth_child; sshd.c in releases before 9.8), so without them every SSH
    # connection dies with "setgroups: Operation not permitted [preauth]".
    required_drop_capabilities: list[str] = list(SSHD_KEEPS_DROPPABLE)
    run_as_user: SccStrategy = SccStrategy(type="RunAsAny")
    se_linux_context: SccStrategy = SccStrategy(type="MustRunAs")
    fs_group: SccStrategy = SccStrategy(type="RunAsAny")
    supplemental_groups: SccStrategy = SccStrategy(type="RunAsAny")
    read_only_root_filesystem: bool = False
    # empty would forbid the pods' RuntimeDefault seccomp profile
    seccomp_profiles: list[str] = ["runtime/default"]
    volumes: list[str] = ["configMap", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"]
    priority: int = 10
    users: list[str] = []
    groups: list[str] = []


class TopLevelObject(pulumi.CustomResource):
    """A Kubernetes object whose fields sit at the top level (no `spec`), e.g. an SCC."""

    def __init__(
        self,
        resource_name: str,
        api_version: str,
        kind: str,
        metadata: k8s.meta.v1.ObjectMetaArgs,
        fields: dict[str, Any],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=k8s_utilities.get_version()))
        props = {"apiVersion": api_version, "kind": kind, "metadata": metadata, **fields}
        super().__init__(f"kubernetes:{api_version}:{kind}", resource_name, props, opts)


def custom_resource(
    resource_name: str,
    api_version: str,
    kind: str,
    metadata: k8s.meta.v1.ObjectMetaArgs,
    spec: Spec | dict[str, Any],
    opts: pulumi.ResourceOptions,
) -> k8s.apiextensions.CustomResource:
    return k8s.apiextensions.CustomResource(
        resource_name,
        api_version=api_version,
        kind=kind,
        metadata=metadata,
        spec=spec.dump() if isinstance(spec, Spec) else spec,
        opts=opts,
    )
