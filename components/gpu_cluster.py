"""GPU cluster (SPEC.md §5.1, §5.3, §5.4): StatefulSet, services, routes, RBAC and dev-server access."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
from pydantic import BaseModel, ConfigDict

from components import crds, fabric, fabric_rbac, lifecycle, naming, pod
from components.storage import WorkspaceStorage, WorkspaceStorageArgs
from stacks.config import StackConfig

OAUTH_REDIRECT = "serviceaccounts.openshift.io/oauth-redirectreference."


class GpuClusterArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    config: StackConfig
    image: Any
    """`pulumi.Input[str]`: the image the pods run (a configured reference, or the built runtime image)."""
    secrets: dict[str, Any] = {}
    """Secret config values (`pulumi.Output[str]`) by key."""
    statefulset_annotations: dict[str, str] = {}
    """Extra StatefulSet annotations (e.g. OpenShift's image-change trigger)."""


def labels(config: StackConfig) -> dict[str, str]:
    return {
        **selector_labels(config),
        "app.kubernetes.io/part-of": "ml-dev-env",
        "app.kubernetes.io/managed-by": "pulumi",
        "ml-dev-env/cluster": config.cluster.name,
    }


def selector_labels(config: StackConfig) -> dict[str, str]:
    return {"app.kubernetes.io/name": "ml-dev-env", "app.kubernetes.io/instance": config.cluster.app_name}


def rollout_timeout(config: StackConfig) -> int:
    """Seconds `pulumi up` waits for the pods: image pulls and start, plus pod 0's fabric check hold
    (fabricCheck.onDeploy keeps it un-Ready for up to onDeployTimeoutSeconds).

    A stack that builds switches the pods to a new tag only once it exists (ImageBuild's wait Job, awaited
    before the StatefulSet changes), so the builds are not part of this wait (tests/test_waits.py).
    """
    fabric = config.fabric_check.on_deploy_timeout_seconds if config.fabric_check.on_deploy else 0
    return 1800 + fabric


def scc_role_name(scc: str) -> str:
    return f"system:openshift:scc:{scc}"


class GpuCluster(pulumi.ComponentResource):
    """One pod per GPU node with rank wiring, RDMA or TCP, storage and authenticated dev servers."""

    statefulset: k8s.apps.v1.StatefulSet
    urls: dict[str, str]
    """Full https URL per exposed dev server."""
    master_addr: str
    pod_names: list[str]
    world_size: int
    network_mode: str
    """Effective transport: 'rdma' or 'tcp' (after the RDMA→TCP fallback)."""
    lifecycle: dict[str, object]
    """Suspend state, what a suspend frees, how to resume (the `lifecycle` stack output)."""

    def __init__(self, name: str, args: GpuClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-dev-env:cluster:GpuCluster", name, None, opts)
        cfg = args.config
        app, ns = cfg.cluster.app_name, cfg.cluster.namespace
        common = labels(cfg)
        selector = selector_labels(cfg)
        child = pulumi.ResourceOptions(parent=self)
        rdma = cfg.network.effective_mode == "rdma"
        memlock = cfg.security.memlock
        oauth = cfg.access.auth == "oauth-proxy" and bool(cfg.access.servers)
        depends: list[pulumi.Resource] = []

        def meta(obj_name: str, **extra: object) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(name=obj_name, namespace=ns, labels=common, **extra)  # type: ignore[arg-type]

        # --- identity -------------------------------------------------------------------------
        sa_name = cfg.security.service_account
        redirects = {
            f"{OAUTH_REDIRECT}{server}": json.dumps(
                {"kind": "OAuthRedirectReference", "apiVersion": "v1",
                 "reference": {"kind": "Route", "name": naming.route_name(app, server)}},
                separators=(",", ":"),
            )
            for server in (cfg.access.servers if oauth else [])
        }
        if cfg.security.create_service_account:
            depends.append(k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=meta(sa_name, annotations=redirects or None), opts=child))
        elif redirects:
            # Adopted service account: add only the OAuth redirect annotations (server-side apply patch).
            depends.append(k8s.core.v1.ServiceAccountPatch(f"{name}-sa-oauth", metadata=meta(sa_name, annotations=redirects), opts=child))

        # --- memlock privileges (RDMA only) ---------------------------------------------------
        if rdma and memlock.mode in ("scc", "privileged"):
            configured_scc = memlock.scc_name if memlock.mode == "scc" else "privileged"
            assert configured_scc is not None  # guaranteed by MemlockConfig
            scc = configured_scc
            role_kind = "ClusterRole"
            if memlock.mode == "scc" and memlock.create_scc:
                # A created SCC is cluster-scoped: named per stack (namespace and app) so a second
                # environment in the cluster neither collides with nor deletes this one's.
                scc = naming.stack_scc_name(configured_scc, ns, app)
                scc_obj = crds.TopLevelObject(
                    f"{name}-scc",
                    api_version="security.openshift.io/v1",
                    kind="SecurityContextConstraints",
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        name=scc,
                        labels=common,
                        annotations={"kubernetes.io/description": "ml-dev-env: unlimited memlock for NCCL/RDMA (IPC_LOCK, SYS_RESOURCE)"},
                    ),
                    fields=crds.SccFields(allowed_capabilities=list(memlock.capabilities)).dump(),
                    opts=child,
                )
                # A namespaced Role named like OpenShift's per-SCC ClusterRoles grants `use` of our SCC.
                role_kind = "Role"
                depends.append(
                    k8s.rbac.v1.Role(
                        f"{name}-scc-role",
                        metadata=meta(scc_role_name(scc)),
                        rules=[k8s.rbac.v1.PolicyRuleArgs(
                            api_groups=["security.openshift.io"], resources=["securitycontextconstraints"],
                            resource_names=[scc], verbs=["use"],
                        )],
                        opts=pulumi.ResourceOptions(parent=self, depends_on=[scc_obj]),
                    )
                )
            # The binding's name stays the configured one; a changed roleRef (immutable) makes
            # pulumi-kubernetes replace it, deleting first since the name is unchanged
            # (provider/pkg/provider/diff.go: roleBinding force-new `.roleRef`; provider.go, kubeProvider.Diff).
            depends.append(
                k8s.rbac.v1.RoleBinding(
                    f"{name}-scc-binding",
                    metadata=meta(f"{app}-scc-{configured_scc}"),
                    role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind=role_kind, name=scc_role_name(scc)),
                    subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=sa_name, namespace=ns)],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends)),
                )
            )

        # --- rack-aware ranks read the pods' nodes (fabricCheck.nodeRacks; README "Fabric check") -----
        depends += fabric_rbac.pod_reader(name, cfg, common, child)

        # --- SR-IOV attachments (optional) ----------------------------------------------------
        if rdma and cfg.network.rdma.create_attachments:
            r = cfg.network.rdma
            for attachment, resource, subnet in zip(r.attachments, r.sriov_resources, r.subnets, strict=True):
                depends.append(
                    crds.custom_resource(
                        f"{name}-nad-{attachment}",
                        "k8s.cni.cncf.io/v1",
                        "NetworkAttachmentDefinition",
                        k8s.meta.v1.ObjectMetaArgs(
                            name=attachment, namespace=r.attachment_namespace or ns, labels=common,
                            annotations={"k8s.v1.cni.cncf.io/resourceName": resource},
                        ),
                        crds.NadSpec(config=crds.sriov_nad_config(attachment, subnet, r.mtu)),
                        child,
                    )
                )

        # --- storage ----------------------------------------------------------------------------
        self.storage = WorkspaceStorage(
            f"{name}-storage",
            WorkspaceStorageArgs(app=app, namespace=ns, labels=common, storage=cfg.storage),
            opts=child,
        )

        # --- startup script and secrets ------------------------------------------------------
        script = pod.startup_script()
        # lifecycle scripts and the fabric check (fabric_check.py, fabric.json, rank_order.sh; README "Fabric check")
        # ride along; the directory mount updates them in place
        startup = k8s.core.v1.ConfigMap(
            f"{name}-startup", metadata=meta(f"{app}-startup"),
            data={"startup.sh": script, **lifecycle.scripts(), **fabric.configmap_files(cfg)}, opts=child,
        )
        depends.append(startup)
        # Count-dependent facts (NNODES, …) live here, not in the pod template: a new `nodes.count`
        # updates this ConfigMap and the StatefulSet's `replicas`, so running pods are not restarted. Both
        # are in-place updates only because the provider sets enableConfigMapMutable (__main__.py): by
        # default pulumi-kubernetes replaces a ConfigMap whose data changed (diff.go `forceNewProperties`),
        # which for this fixed name is a delete-before-replace under the running pods. Its content is
        # deliberately not hashed into the template (the startup script's is: a script change rolls the pods).
        cluster_cm = k8s.core.v1.ConfigMap(
            f"{name}-cluster", metadata=meta(f"{app}-cluster"), data={"cluster.env": pod.cluster_env(cfg)}, opts=child
        )
        # Updated before the StatefulSet (dependency order), so new pods of a scale-up read the new count.
        depends.append(cluster_cm)
        # --- lifecycle: idle-agent settings (in place, no restart), stop record, agent RBAC ----------
        depends.append(k8s.core.v1.ConfigMap(
            f"{name}-lifecycle", metadata=meta(lifecycle.settings_configmap(app)),
            data={lifecycle.SETTINGS_KEY: lifecycle.settings_json(cfg)}, opts=child,
        ))
        # The agent writes the record; Pulumi only creates the object (its data is the agent's).
        k8s.core.v1.ConfigMap(
            f"{name}-idle-stop", metadata=meta(lifecycle.record_configmap(app)), data={},
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["data"]),
        )
        if cfg.lifecycle.idle_stop.enabled:
            agent_role = k8s.rbac.v1.Role(
                f"{name}-idle-agent", metadata=meta(lifecycle.agent_role(app)), rules=lifecycle.agent_rules(app), opts=child
            )
            depends.append(k8s.rbac.v1.RoleBinding(
                f"{name}-idle-agent",
                metadata=meta(lifecycle.agent_role(app)),
                role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=lifecycle.agent_role(app)),
                subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=sa_name, namespace=ns)],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[agent_role]),
            ))
        volumes = [
            *self.storage.volumes,
            k8s.core.v1.VolumeArgs(
                name="dshm", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium="Memory", size_limit=cfg.nodes.shm_size)
            ),
            k8s.core.v1.VolumeArgs(
                name="startup", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=f"{app}-startup", default_mode=0o555)
            ),
            k8s.core.v1.VolumeArgs(
                name=pod.CLUSTER_VOLUME, config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=f"{app}-cluster", default_mode=0o444)
            ),
            lifecycle.settings_volume(app),
        ]
        tokens_secret = None
        if oauth:
            cookie = random.RandomPassword(f"{name}-oauth-cookie", length=32, special=False, opts=child)
            depends.append(
                k8s.core.v1.Secret(
                    f"{name}-oauth-cookie",
                    metadata=meta(f"{app}-oauth-cookie"),
                    type="Opaque",
                    string_data={"cookie-secret": cookie.result},
                    opts=child,
                )
            )
            volumes.append(
                k8s.core.v1.VolumeArgs(name="oauth-cookie", secret=k8s.core.v1.SecretVolumeSourceArgs(secret_name=f"{app}-oauth-cookie"))
            )
        elif cfg.access.auth == "token" and cfg.access.servers:
            tokens_secret = f"{app}-dev-tokens"
            keys = {"vscodePassword": cfg.access.vscode, "jupyterToken": cfg.access.jupyter}
            depends.append(
                k8s.core.v1.Secret(
                    f"{name}-dev-tokens",
                    metadata=meta(tokens_secret),
                    type="Opaque",
                    string_data={k: args.secrets[k] for k, on in keys.items() if on},
                    opts=child,
                )
            )

        # --- headless service and StatefulSet ---------------------------------------------------
        headless = k8s.core.v1.Service(
            f"{name}-headless",
            metadata=meta(naming.headless_service(app), annotations={"pulumi.com/skipAwait": "true"}),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None",
                publish_not_ready_addresses=True,
                selector=selector,
                ports=[k8s.core.v1.ServicePortArgs(name="master", port=naming.MASTER_PORT, target_port="master")],
            ),
            opts=child,
        )
        pod_annotations = {
            "ml-dev-env/startup-sha256": pod.content_hash(script),
            "ml-dev-env/idle-agent-sha256": pod.content_hash("".join(lifecycle.scripts().values())),
        }
        if rdma:
            pod_annotations["k8s.v1.cni.cncf.io/networks"] = pod.multus_annotation(cfg)
        mounts = [*self.storage.mounts, lifecycle.settings_mount()]
        containers = [pod.main_container(cfg, args.image, mounts, tokens_secret), *pod.proxy_containers(cfg, "oauth-cookie")]
        pod_security = k8s.core.v1.PodSecurityContextArgs(
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")
        )
        self.statefulset = k8s.apps.v1.StatefulSet(
            f"{name}-statefulset",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=app,
                namespace=ns,
                labels={**common, **lifecycle.statefulset_labels(cfg)},
                annotations={
                    "pulumi.com/timeoutSeconds": str(rollout_timeout(cfg)),
                    **lifecycle.statefulset_annotations(),
                    **args.statefulset_annotations,
                },
            ),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                service_name=naming.headless_service(app),
                # An in-place update: `.spec.replicas` is not among pulumi-kubernetes' force-new StatefulSet
                # fields (provider/pkg/provider/diff.go, `statefulSet`), and the template does not change.
                replicas=lifecycle.replicas(cfg),  # 0 while suspended (lifecycle)
                pod_management_policy="Parallel",
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                persistent_volume_claim_retention_policy=k8s.apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicyArgs(
                    when_deleted="Retain", when_scaled="Retain"
                ),
                volume_claim_templates=self.storage.claim_templates or None,
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=common, annotations=pod_annotations),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=sa_name,
                        restart_policy="Always",
                        termination_grace_period_seconds=30,
                        affinity=pod.affinity(cfg, selector),
                        node_selector=pod.node_selector(cfg),
                        tolerations=pod.tolerations(cfg),
                        security_context=pod_security,
                        containers=containers,
                        volumes=volumes,
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[*depends, headless, self.storage],
                # The name is fixed, so a replacement (e.g. a storage-layout change) must delete first;
                # per-pod claims are retained and re-bound by the new StatefulSet.
                delete_before_replace=True,
            ),
        )

        # --- pod-0 service and routes ---------------------------------------------------------
        self.urls = {}
        if cfg.access.servers:
            k8s.core.v1.Service(
                f"{name}-dev",
                # Not awaited: pulumi-kubernetes waits (default 10 min) for a selector Service's endpoints
                # (provider/pkg/await/service.go, serviceInitAwaiter.Await), i.e. for pod 0 to be ready, which the
                # StatefulSet's own await already covers with rollout_timeout().
                metadata=meta(app, annotations={"pulumi.com/skipAwait": "true"}),
                spec=k8s.core.v1.ServiceSpecArgs(
                    selector={**selector, "statefulset.kubernetes.io/pod-name": naming.pod_name(app, 0)},
                    ports=[
                        k8s.core.v1.ServicePortArgs(
                            name=server,
                            port=pod.SERVER_PORTS[server],
                            target_port=pod.proxy_port_name(server) if oauth else server,
                        )
                        for server in cfg.access.servers
                    ],
                ),
                opts=child,
            )
            for server in cfg.access.servers:
                host = naming.route_host(app, server, ns, cfg.cluster.apps_domain)
                crds.custom_resource(
                    f"{name}-route-{server}",
                    "route.openshift.io/v1",
                    "Route",
                    meta(naming.route_name(app, server)),
                    crds.RouteSpec(host=host, to=crds.RouteTargetReference(name=app), port=crds.RoutePort(target_port=server)),
                    child,
                )
                self.urls[server] = f"https://{host}"

        self.master_addr = naming.pod_dns(app, ns, 0)
        self.pod_names = naming.pod_names(app, cfg.nodes.count)
        self.world_size = cfg.nodes.count * cfg.nodes.gpus_per_pod
        self.network_mode = cfg.network.effective_mode
        self.lifecycle = lifecycle.summary(cfg)
        self.register_outputs({
            "lifecycle": self.lifecycle,
            "urls": self.urls,
            "master_addr": self.master_addr,
            "pod_names": self.pod_names,
            "world_size": self.world_size,
            "network_mode": self.network_mode,
        })
