"""Workspace storage: shared RWX PVCs, per-pod volumeClaimTemplates, or both.

Data is never lost by the program: shared PVCs are `retain_on_delete` (they outlive `pulumi destroy`
and any replacement), and per-pod claims are owned by the StatefulSet controller with a `Retain`
retention policy on deletion and scale-down, so a replaced StatefulSet re-binds the same claims.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pydantic import BaseModel, ConfigDict

from stacks.config import StorageConfig, VolumeConfig

STORAGE_LABEL = "ml-dev-env/volume"


class WorkspaceStorageArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    app: str
    namespace: str
    labels: dict[str, str]
    storage: StorageConfig
    existing_claims: dict[str, Any] = {}
    """Shared volume → a claim (`pulumi.Input[str]`) another stack owns in this namespace (an environment's cluster
    stack, as deployed): mounted, not created."""


def claim_name(app: str, volume: str) -> str:
    """Name of a shared PVC."""
    return f"{app}-{volume}"


def access_modes(storage: StorageConfig, volume: VolumeConfig) -> list[str]:
    if volume.access_modes:
        return list(volume.access_modes)
    return ["ReadWriteMany"] if storage.scope_of(volume) == "shared" else ["ReadWriteOnce"]


def claim_spec(storage: StorageConfig, volume: VolumeConfig) -> k8s.core.v1.PersistentVolumeClaimSpecArgs:
    return k8s.core.v1.PersistentVolumeClaimSpecArgs(
        access_modes=access_modes(storage, volume),
        storage_class_name=volume.storage_class,
        resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": volume.size}),
    )


def volume_mounts(storage: StorageConfig) -> list[k8s.core.v1.VolumeMountArgs]:
    return [k8s.core.v1.VolumeMountArgs(name=v.name, mount_path=v.mount_path) for v in storage.volumes]


def home_volume(storage: StorageConfig) -> VolumeConfig:
    """The volume that holds the users' HOMEs: a per-pod volume when there is one, else a shared one.

    Per-pod first: a HOME full of caches and IDE state is per-pod data, and a block volume is faster
    for it than NFS; `workspace` is preferred within the chosen scope, else the first volume listed.
    """
    per_pod = [v for v in storage.volumes if storage.scope_of(v) == "per-pod"]
    pool = per_pod or list(storage.volumes)
    return next((v for v in pool if v.name == "workspace"), pool[0])


def pod_volumes(app: str, storage: StorageConfig, existing: dict[str, Any] | None = None) -> list[k8s.core.v1.VolumeArgs]:
    """Pod-level volumes for the shared claims (per-pod claims come from volumeClaimTemplates)."""
    return [
        k8s.core.v1.VolumeArgs(
            name=v.name,
            persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                claim_name=(existing or {}).get(v.name) or claim_name(app, v.name)
            ),
        )
        for v in storage.volumes
        if storage.scope_of(v) == "shared"
    ]


def claim_template_names(storage: StorageConfig) -> list[str]:
    """Names of the StatefulSet's volumeClaimTemplates: the per-pod volumes."""
    return [v.name for v in storage.volumes if storage.scope_of(v) == "per-pod"]


def volume_claim_templates(storage: StorageConfig, labels: dict[str, str]) -> list[k8s.core.v1.PersistentVolumeClaimArgs]:
    return [
        k8s.core.v1.PersistentVolumeClaimArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(name=v.name, labels={**labels, STORAGE_LABEL: v.name}),
            spec=claim_spec(storage, v),
        )
        for v in storage.volumes
        if storage.scope_of(v) == "per-pod"
    ]


class WorkspaceStorage(pulumi.ComponentResource):
    """Creates the shared PVCs; exposes mounts, pod volumes and claim templates for the StatefulSet."""

    claims: dict[str, k8s.core.v1.PersistentVolumeClaim]
    """Shared PVCs by volume name."""
    claim_names: pulumi.Output[list[str]]

    def __init__(self, name: str, args: WorkspaceStorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-dev-env:storage:WorkspaceStorage", name, None, opts)
        storage = args.storage
        self.mounts = volume_mounts(storage)
        self.volumes = pod_volumes(args.app, storage, args.existing_claims)
        self.claim_templates = volume_claim_templates(storage, args.labels)
        self.claims = {}
        for volume in storage.volumes:
            if storage.scope_of(volume) != "shared" or volume.name in args.existing_claims:
                continue
            self.claims[volume.name] = k8s.core.v1.PersistentVolumeClaim(
                f"{name}-{volume.name}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=claim_name(args.app, volume.name),
                    namespace=args.namespace,
                    labels={**args.labels, STORAGE_LABEL: volume.name},
                    # An unbound claim (WaitForFirstConsumer) must not block `pulumi up`.
                    annotations={"pulumi.com/skipAwait": "true"},
                ),
                spec=claim_spec(storage, volume),
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
        self.claim_names = pulumi.Output.all(*[c.metadata.name for c in self.claims.values()]).apply(lambda names: [n for n in names if n])
        self.register_outputs({"claim_names": self.claim_names})
