"""GPU cluster: the StatefulSet (one pod per GPU node), its Services and Routes, RBAC/SCC and dev-server access.

Why one module: one Pulumi component, the StatefulSet and the objects only it needs (Services, Routes, RBAC, SCC),
declared together so that one reading shows what a pod gets; the parts with logic of their own live in pod.py,
devloop.py, lifecycle.py, fabric.py.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
from pydantic import BaseModel, ConfigDict

import inpod
from components import crds, devloop, fabric, fabric_rbac, lifecycle, pod, prepull
from components.storage import WorkspaceStorage, WorkspaceStorageArgs
from core import naming, servers
from inpod import contract
from stacks.config import ModelConfig, StackConfig
from stacks.environment import ClusterFacts

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
    cluster: ClusterFacts | None = None
    """An environment stack: its cluster's facts as its checkout computes them (the shape of its objects: SCC or none,
    which shared claims)."""
    deployed: Any = None
    """An environment stack: `pulumi.Output[ClusterFacts]`, what the cluster stack deployed (checked against `cluster`'s
    shape): the names of the SCC, Role and shared claims the environment's objects refer to."""
    pinned_image_sets_served: bool | None = None
    """image.prePull pinnedImageSet: whether the cluster serves PinnedImageSet (None: not read; False: the DaemonSet)."""
    models: list[ModelConfig] = []
    """The cluster stack's models (an environment's: its cluster's): those with mountInEnv are mounted in every pod."""
    node_readers: tuple[str, ...] = ()
    """A cluster stack: `<namespace>/<ServiceAccount>` of its environment stacks' usage recorders that its node reader
    is bound to as well (stacks/gpus.py Tally.node_readers); its own recorder always is."""


def labels(config: StackConfig) -> dict[str, str]:
    return {**selector_labels(config), **naming.stack_labels(config.cluster.name)}


def selector_labels(config: StackConfig) -> dict[str, str]:
    return naming.selector_labels(config.cluster.app_name)


ROLLOUT_BASE_SECONDS = 1800
"""Image pulls and container start of the pods (a multi-GB image on every node)."""


def rollout_timeout(config: StackConfig) -> int:
    """Seconds `pulumi up` waits for the pods, and `pulumi destroy` for them to go (`pulumi.com/timeoutSeconds`).

    * Image pulls and start (ROLLOUT_BASE_SECONDS), plus pod 0's fabric check hold (fabricCheck.onDeploy keeps
      it un-Ready for up to onDeployTimeoutSeconds).
    * The stops of a rolling update: a template change deletes the pods one at a time, from the largest
      ordinal, and waits for each replacement to be healthy before the next (kubernetes
      pkg/controller/statefulset/stateful_set_control.go, updateStatefulSet: "we terminate the Pod with the
      largest ordinal that does not match the update revision"; `podManagementPolicy: Parallel` changes
      scaling only). Each stop may take the pod's whole terminationGracePeriodSeconds (checkpoint grace +
      STOP_MARGIN_SECONDS), so nodes.count x that.
    * `pulumi destroy` reads the same annotation: pulumi-kubernetes provider/pkg/await/await.go `Deletion`
      waits `metadata.TimeoutDuration` (this annotation, else 10 minutes) for a foreground deletion
      (provider/pkg/metadata/overrides.go `DeletionPropagation`, Foreground by default), which lasts until
      the pods are gone: up to one termination grace, as the garbage collector deletes them together.

    A stack that builds switches the pods to a new tag only once it exists (ImageBuild's wait Job, awaited
    before the StatefulSet changes), so the builds are not part of this wait (tests/components/test_waits.py).
    """
    fabric = config.fabric_check.on_deploy_timeout_seconds if config.fabric_check.on_deploy else 0
    stops = config.nodes.count * lifecycle.termination_grace_seconds(config)
    return ROLLOUT_BASE_SECONDS + fabric + stops


def scc_role_name(scc: str) -> str:
    return f"system:openshift:scc:{scc}"


class GpuCluster(pulumi.ComponentResource):
    """One pod per GPU node with rank wiring, RDMA or TCP, storage and authenticated dev servers.

    `__init__` runs the named steps in dependency order; each step appends what the StatefulSet must
    wait for to `self._depends`. Pulumi resource names are `<name>-<suffix>` and never change (identity).
    """

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
        self._name, self._args, self._cfg = name, args, cfg
        self._app, self._ns = cfg.cluster.app_name, cfg.cluster.namespace
        self._labels = labels(cfg)
        self._selector = selector_labels(cfg)
        self._child = pulumi.ResourceOptions(parent=self)
        self._rdma = cfg.network.effective_mode == "rdma"
        self._oauth = cfg.access.auth == "oauth-proxy" and bool(cfg.access.servers)
        self._depends: list[pulumi.Resource] = []

        self._identity()
        self._memlock_privileges()
        self._sriov_attachments()
        # rack-aware ranks read the pods' nodes (fabricCheck.nodeRacks; docs/operate/fabric-check.md)
        self._depends += fabric_rbac.pod_reader(name, self._cfg, self._labels, self._child)
        self.storage = self._storage()
        script = pod.startup_script()
        # dev loop (components/devloop.py): SSH keys Secret + SSH NetworkPolicy; sshd.sh and the launcher ride in the startup ConfigMap
        self.ssh = devloop.SshFabric(f"{name}-ssh", cfg, self._labels, self._selector, opts=self._child)
        self._depends.append(self.ssh)
        self._startup_and_cluster_config(script)
        self._lifecycle()
        self._usage()
        self._pre_pull()
        credential_volumes, tokens_secret = self._dev_credentials()
        headless = self._headless_service()
        self.statefulset = self._statefulset(script, credential_volumes, tokens_secret, headless)
        self.urls = self._dev_service_and_routes()

        self.master_addr = naming.pod_dns(self._app, self._ns, 0)
        self.pod_names = naming.pod_names(self._app, cfg.nodes.count)
        self.world_size = cfg.nodes.count * cfg.nodes.gpus_per_pod
        self.network_mode = cfg.network.effective_mode
        self.lifecycle = lifecycle.summary(cfg)
        self.register_outputs(
            {
                "lifecycle": self.lifecycle,
                "urls": self.urls,
                "master_addr": self.master_addr,
                "pod_names": self.pod_names,
                "world_size": self.world_size,
                "network_mode": self.network_mode,
            }
        )

    def _meta(self, obj_name: str, **extra: object) -> k8s.meta.v1.ObjectMetaArgs:
        extra.setdefault("labels", self._labels)
        return k8s.meta.v1.ObjectMetaArgs(name=obj_name, namespace=self._ns, **extra)  # type: ignore[arg-type]

    def _identity(self) -> None:
        """The pods' ServiceAccount (created, or adopted and annotated with the OAuth redirects)."""
        cfg, name, app, child = self._cfg, self._name, self._app, self._child
        sa_name = cfg.security.service_account
        redirects = {
            f"{OAUTH_REDIRECT}{server}": json.dumps(
                {
                    "kind": "OAuthRedirectReference",
                    "apiVersion": "v1",
                    "reference": {"kind": "Route", "name": naming.route_name(app, server)},
                },
                separators=(",", ":"),
            )
            for server in (cfg.access.servers if self._oauth else [])
        }
        if cfg.security.create_service_account:
            self._depends.append(
                k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=self._meta(sa_name, annotations=redirects or None), opts=child)
            )
        elif redirects:
            # Adopted service account: add only the OAuth redirect annotations (server-side apply patch).
            self._depends.append(
                k8s.core.v1.ServiceAccountPatch(
                    f"{name}-sa-oauth",
                    metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=sa_name, namespace=self._ns, labels=self._labels, annotations=redirects),
                    opts=child,
                )
            )

    def _memlock_privileges(self) -> None:
        """RDMA only: the SCC (created per stack, or an existing one) and the binding that lets the pods use it.

        Why one function: the SCC and its binding are one decision per memlock mode (created, an existing
        one bound, none) over the same names and labels.
        """
        cfg, name, app, ns = self._cfg, self._name, self._app, self._ns
        memlock = cfg.security.memlock
        if not (self._rdma and memlock.mode in ("scc", "privileged")):
            return
        configured_scc = memlock.scc_name if memlock.mode == "scc" else "privileged"
        assert configured_scc is not None  # guaranteed by MemlockConfig
        scc = configured_scc
        role_kind = "ClusterRole"
        facts = self._args.cluster
        if facts is not None and facts.scc_role is not None and facts.scc == configured_scc:
            # An environment using the SCC its cluster stack created: the cluster's Role grants its use in the cluster
            # namespace; in its own namespace the environment needs a Role of its own (named after it, granting the same).
            # Both refer to the SCC and Role as deployed (a checkout computing other names still runs what is there).
            deployed = self._args.deployed
            deployed_scc: pulumi.Input[str] = deployed.apply(lambda f: f.scc) if deployed is not None else configured_scc
            role_kind = "Role"
            role_name: pulumi.Input[str] = deployed.apply(lambda f: f.scc_role) if deployed is not None else facts.scc_role
            if ns != facts.namespace:
                own_role = naming.scc_binding(app, configured_scc)
                role_name = own_role
                self._depends.append(
                    k8s.rbac.v1.Role(
                        f"{name}-scc-role",
                        metadata=self._meta(own_role),
                        rules=[
                            k8s.rbac.v1.PolicyRuleArgs(
                                api_groups=["security.openshift.io"],
                                resources=["securitycontextconstraints"],
                                resource_names=[deployed_scc],
                                verbs=["use"],
                            )
                        ],
                        opts=self._child,
                    )
                )
            # Policy pack (policy/rules/privileges_bound.py): the cluster stack's Role, named on the binding.
            owner = {"ml-dev-env/role-owner": facts.cluster} if ns == facts.namespace else None
            self._depends.append(
                k8s.rbac.v1.RoleBinding(
                    f"{name}-scc-binding",
                    metadata=self._meta(naming.scc_binding(app, configured_scc), annotations=owner),
                    role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind=role_kind, name=role_name),
                    subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=cfg.security.service_account, namespace=ns)],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=list(self._depends)),
                )
            )
            return
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
                    labels=self._labels,
                    annotations={
                        "kubernetes.io/description": "ml-dev-env: unlimited memlock for NCCL/RDMA and root's sshd "
                        f"({', '.join(memlock.pod_capabilities)})"
                    },
                ),
                # What the pods add, SYS_CHROOT for their sshd included: admission refuses a pod adding a capability
                # the SCC does not allow (apiserver-library-go pkg/securitycontextconstraints/capabilities/mustrunas.go
                # Validate: "capability may not be added").
                fields=crds.SccFields(allowed_capabilities=list[str](memlock.pod_capabilities)).dump(),
                # Kept on destroy, with its Role: every environment's new pod (a resume, a reschedule) is admitted
                # through them (openshift/apiserver-library-go pkg/securitycontextconstraints/sccadmission/admission.go
                # Admit: no SCC the pod's ServiceAccount may use admits it, the pod is refused). docs/use/teams.md.
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
            # A namespaced Role named like OpenShift's per-SCC ClusterRoles grants `use` of our SCC.
            role_kind = "Role"
            self._depends.append(
                k8s.rbac.v1.Role(
                    f"{name}-scc-role",
                    metadata=self._meta(scc_role_name(scc)),
                    rules=[
                        k8s.rbac.v1.PolicyRuleArgs(
                            api_groups=["security.openshift.io"],
                            resources=["securitycontextconstraints"],
                            resource_names=[scc],
                            verbs=["use"],
                        )
                    ],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[scc_obj], retain_on_delete=True),
                )
            )
        # The binding's name stays the configured one; a changed roleRef (immutable) makes
        # pulumi-kubernetes replace it, deleting first since the name is unchanged
        # (provider/pkg/provider/diff.go: roleBinding force-new `.roleRef`; provider.go, kubeProvider.Diff).
        self._depends.append(
            k8s.rbac.v1.RoleBinding(
                f"{name}-scc-binding",
                metadata=self._meta(naming.scc_binding(app, configured_scc)),
                role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind=role_kind, name=scc_role_name(scc)),
                subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=cfg.security.service_account, namespace=ns)],
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(self._depends)),
            )
        )

    def _sriov_attachments(self) -> None:
        """RDMA with createAttachments: one NetworkAttachmentDefinition per SR-IOV network. Retained on destroy: the
        environment stacks' pods name them (`k8s.v1.cni.cncf.io/networks`) and never get net1..N without them (Multus
        fails the pod sandbox when a named attachment is missing), so the cluster's destroy leaves them as it leaves the
        image stream, the SCC and the shared claims (docs/use/teams.md)."""
        r = self._cfg.network.rdma
        if not (self._rdma and r.create_attachments):
            return
        for attachment, resource, subnet in zip(r.attachments, r.sriov_resources, r.subnets, strict=True):
            self._depends.append(
                crds.custom_resource(
                    f"{self._name}-nad-{attachment}",
                    "k8s.cni.cncf.io/v1",
                    "NetworkAttachmentDefinition",
                    k8s.meta.v1.ObjectMetaArgs(
                        name=attachment,
                        namespace=r.attachment_namespace or self._ns,
                        labels=self._labels,
                        annotations={"k8s.v1.cni.cncf.io/resourceName": resource},
                    ),
                    crds.NadSpec(config=crds.sriov_nad_config(attachment, subnet, r.mtu)),
                    pulumi.ResourceOptions(parent=self, retain_on_delete=True),
                )
            )

    def _existing_claims(self) -> dict[str, Any]:
        """An environment in its cluster's namespace mounts the cluster's shared claims, by their deployed names."""
        facts, deployed = self._args.cluster, self._args.deployed
        if facts is None or facts.namespace != self._ns:
            return {}
        if deployed is None:
            return dict(facts.shared_claims)
        return {volume: deployed.apply(lambda f, v=volume: f.shared_claims[v]) for volume in facts.shared_claims}

    def _storage(self) -> WorkspaceStorage:
        return WorkspaceStorage(
            f"{self._name}-storage",
            WorkspaceStorageArgs(
                app=self._app,
                namespace=self._ns,
                labels=self._labels,
                storage=self._cfg.storage,
                # An environment in its cluster's namespace mounts the cluster's shared claims (claims cannot cross namespaces).
                existing_claims=self._existing_claims(),
            ),
            opts=self._child,
        )

    def _startup_data(self, script: str) -> dict[str, str]:
        """The startup ConfigMap's keys: the package (inpod.SHIPPED), the launchers and shell files, the settings files.
        + the fabric check (fabric_check.py, fabric.json, rank_order.sh; docs/operate/fabric-check.md),
        + usage.py (`ml-dev status --all`): not hashed into the pod template, like ml-dev it updates in place
        + the home page (home_page.py; always: its SVG plots, lib/svgplot.py, ship with the package, the fabric gate draws with them)"""
        return {
            "startup.sh": script,
            **inpod.group("package"),
            **inpod.group("servers"),  # forward.py (its code is the package's inpod/lib/forward.py)
            **devloop.scripts(self._cfg),
            **lifecycle.scripts(),
            **fabric.configmap_files(self._cfg),
            **inpod.group("usage"),
            **inpod.group("home"),
            # the page's links: read at every render (a ConfigMap update shows without a restart), so not hashed
            contract.HOME_LINKS_FILE: json.dumps(servers.page_links(self._cfg.access.enabled())) + "\n",
        }

    def _startup_and_cluster_config(self, script: str) -> None:
        """The startup script ConfigMap and the count-dependent `cluster.env` ConfigMap."""
        name, app = self._name, self._app
        startup = k8s.core.v1.ConfigMap(
            f"{name}-startup",
            metadata=self._meta(naming.startup_configmap(app)),
            data=self._startup_data(script),
            opts=self._child,
        )
        self._startup_configmap = startup  # the usage recorder mounts its program from it
        self._depends.append(startup)
        # Count-dependent facts (NNODES, …) live here, not in the pod template: a new `nodes.count`
        # updates this ConfigMap and the StatefulSet's `replicas`, so running pods are not restarted. Both
        # are in-place updates only because the provider sets enableConfigMapMutable (__main__.py): by
        # default pulumi-kubernetes replaces a ConfigMap whose data changed (diff.go `forceNewProperties`),
        # which for this fixed name is a delete-before-replace under the running pods. Its content is
        # deliberately not hashed into the template (the startup script's is: a script change rolls the pods).
        cluster_cm = k8s.core.v1.ConfigMap(
            f"{name}-cluster",
            metadata=self._meta(naming.cluster_configmap(app)),
            data={contract.CLUSTER_ENV_FILE: pod.cluster_env(self._cfg)},
            opts=self._child,
        )
        # Updated before the StatefulSet (dependency order), so new pods of a scale-up read the new count.
        self._depends.append(cluster_cm)

    def _lifecycle(self) -> None:
        """Idle-agent settings (updated in place, no restart), the stop record, and the agent's RBAC."""
        cfg, name, app, child = self._cfg, self._name, self._app, self._child
        self._depends.append(
            k8s.core.v1.ConfigMap(
                f"{name}-lifecycle",
                metadata=self._meta(naming.lifecycle_configmap(app)),
                data={lifecycle.SETTINGS_KEY: lifecycle.settings_json(cfg)},
                opts=child,
            )
        )
        # The agent writes the record; Pulumi only creates the object (its data is the agent's).
        k8s.core.v1.ConfigMap(
            f"{name}-idle-stop",
            metadata=self._meta(naming.idle_record_configmap(app)),
            data={},
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["data"]),
        )
        if cfg.lifecycle.idle_stop.enabled:
            agent_role = k8s.rbac.v1.Role(
                f"{name}-idle-agent", metadata=self._meta(naming.idle_agent_role(app)), rules=lifecycle.agent_rules(app), opts=child
            )
            self._depends.append(
                k8s.rbac.v1.RoleBinding(
                    f"{name}-idle-agent",
                    metadata=self._meta(naming.idle_agent_role(app)),
                    role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=naming.idle_agent_role(app)),
                    subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=cfg.security.service_account, namespace=self._ns)],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[agent_role]),
                )
            )

    def _usage(self) -> None:
        """Who holds the GPUs: the GPU-hours record (its own ConfigMap), the recorder that writes it, and their Role.

        The recorder runs inpod/usage.py every USAGE_PERIOD seconds as its own ServiceAccount (the only one its Role
        is bound to: nobody in a pod can write the record): GPUs held by bound pods × time, per UTC day; a suspended
        or idle-stopped environment has no pods and adds nothing. A reader Role lets `ml-dev status --all` (in a pod,
        the pods' ServiceAccount) list the environments, records and pods of the namespace.
        """
        cfg, name, app, child = self._cfg, self._name, self._app, self._child
        record = naming.usage_configmap(app)
        k8s.core.v1.ConfigMap(
            f"{name}-usage",
            metadata=self._meta(record, labels={**self._labels, lifecycle.USAGE_LABEL: "gpu-hours"}),
            data={},
            # The recorder writes the data; Pulumi only creates the object.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["data"]),
        )
        role_name = naming.usage_recorder(app)
        # Not awaited (like the Deployment): the recorder must not lengthen `pulumi up` (tests/components/test_waits.py).
        account = k8s.core.v1.ServiceAccount(
            f"{name}-usage-sa", metadata=self._meta(role_name, annotations={"pulumi.com/skipAwait": "true"}), opts=child
        )
        role = k8s.rbac.v1.Role(f"{name}-usage-role", metadata=self._meta(role_name), rules=lifecycle.usage_rules(app), opts=child)
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-usage-binding",
            metadata=self._meta(role_name),
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=role_name),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=role_name, namespace=self._ns)],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[role, account]),
        )
        if self._args.cluster is None and cfg.lifecycle.usage_reads_nodes:
            self._usage_node_reader(role_name, account)
        reader = f"{role_name}-reader"
        reader_role = k8s.rbac.v1.Role(
            f"{name}-usage-reader", metadata=self._meta(reader), rules=lifecycle.usage_reader_rules(), opts=child
        )
        k8s.rbac.v1.RoleBinding(
            f"{name}-usage-reader",
            metadata=self._meta(reader),
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=reader),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=cfg.security.service_account, namespace=self._ns)],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[reader_role]),
        )
        k8s.apps.v1.Deployment(
            f"{name}-usage-recorder",
            # Not awaited: a pull of a small Python image must not lengthen `pulumi up` (tests/components/test_waits.py).
            metadata=self._meta(role_name, annotations={"pulumi.com/skipAwait": "true"}),
            spec=lifecycle.usage_recorder_spec(cfg),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[binding, self._startup_configmap]),
        )

    def _usage_node_reader(self, account_name: str, account: k8s.core.v1.ServiceAccount) -> None:
        """A cluster stack (lifecycle.usageReadsNodes): the recorders may read the nodes and their Leases, so a pod on a
        NotReady or deleted node is charged until the node's last heartbeat (inpod/usage.py Nodes). Nodes are
        cluster-scoped (a ClusterRole and a ClusterRoleBinding: cluster-admin once, listed by `make render`); the Leases
        live in kube-node-lease (a Role and a RoleBinding there). Bound to this recorder's ServiceAccount and to the
        recorder of each environment stack of this cluster in the checkout (`node_readers`, the stacks the GPU tally
        reads): an environment stack cannot create cluster-scoped bindings. A binding's subjects may name a
        ServiceAccount of another namespace, or one not created yet (kubernetes pkg/apis/rbac/validation/validation.go
        ValidateRoleBindingSubject checks its shape only;
        pkg/registry/rbac/validation/rule.go appliesToUser matches by name and namespace only). An environment added
        after this stack's last `up` is bound by its next one; until then its preview says so (components/environment.py
        node_reader_line) and its recorder reads the pods alone (it says so once).
        """
        name, ns = self._name, self._ns
        reader = naming.node_reader(ns, self._app)
        accounts = dict.fromkeys([f"{ns}/{account_name}", *self._args.node_readers])
        subjects = [
            k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=who.split("/", 1)[1], namespace=who.split("/", 1)[0]) for who in accounts
        ]
        why = {
            "kubernetes.io/description": "ml-dev-env: the usage recorders (the cluster stack's and its environment stacks') "
            "read the nodes and their Leases, so a pod on a lost node is charged until its last heartbeat; "
            "lifecycle.usageReadsNodes: false leaves it out"
        }
        meta = k8s.meta.v1.ObjectMetaArgs(name=reader, labels=self._labels, annotations=why)
        cluster_role = k8s.rbac.v1.ClusterRole(f"{name}-usage-nodes", metadata=meta, rules=lifecycle.node_reader_rules(), opts=self._child)
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-usage-nodes",
            metadata=meta,
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=reader),
            subjects=subjects,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[cluster_role, account]),
        )
        lease_meta = k8s.meta.v1.ObjectMetaArgs(name=reader, namespace=lifecycle.NODE_LEASE_NAMESPACE, labels=self._labels, annotations=why)
        lease_role = k8s.rbac.v1.Role(f"{name}-usage-leases", metadata=lease_meta, rules=lifecycle.node_lease_rules(), opts=self._child)
        k8s.rbac.v1.RoleBinding(
            f"{name}-usage-leases",
            metadata=lease_meta,
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=reader),
            subjects=subjects,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[lease_role, account]),
        )

    def _pre_pull(self) -> None:
        """The pods' image on the GPU nodes before the StatefulSet needs it (image.prePull; components/prepull.py):
        the StatefulSet depends on it, so a changed image is on the nodes before the pods roll to it."""
        puller = prepull.pre_pull(self._name, self._cfg, self._args.image, self._labels, self._args.pinned_image_sets_served, self._child)
        if puller is not None:
            self._depends.append(puller)

    def _dev_credentials(self) -> tuple[list[k8s.core.v1.VolumeArgs], str | None]:
        """OAuth proxy cookie secret (oauth-proxy), or the per-server token Secret (token): volumes, token Secret name."""
        cfg, name, app, child = self._cfg, self._name, self._app, self._child
        if self._oauth:
            cookie = random.RandomPassword(f"{name}-oauth-cookie", length=32, special=False, opts=child)
            self._depends.append(
                k8s.core.v1.Secret(
                    f"{name}-oauth-cookie",
                    metadata=self._meta(naming.oauth_cookie_secret(app)),
                    type="Opaque",
                    string_data={"cookie-secret": cookie.result},
                    opts=child,
                )
            )
            volume = k8s.core.v1.VolumeArgs(
                name="oauth-cookie", secret=k8s.core.v1.SecretVolumeSourceArgs(secret_name=naming.oauth_cookie_secret(app))
            )
            return [volume], None
        if cfg.access.auth == "token" and cfg.access.servers:
            tokens_secret = naming.dev_tokens_secret(app)
            keys = [s.secret_key for s in cfg.access.enabled() if s.secret_key]
            self._depends.append(
                k8s.core.v1.Secret(
                    f"{name}-dev-tokens",
                    metadata=self._meta(tokens_secret),
                    type="Opaque",
                    string_data={k: self._args.secrets[k] for k in keys},
                    opts=child,
                )
            )
            return [], tokens_secret
        return [], None

    def _headless_service(self) -> k8s.core.v1.Service:
        """Stable pod DNS names (`<app>-<i>.<app>-headless…`), ready or not: the rendezvous of the ranks."""
        return k8s.core.v1.Service(
            f"{self._name}-headless",
            metadata=self._meta(naming.headless_service(self._app), annotations={"pulumi.com/skipAwait": "true"}),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None",
                publish_not_ready_addresses=True,
                selector=self._selector,
                ports=[k8s.core.v1.ServicePortArgs(name="master", port=naming.MASTER_PORT, target_port="master")],
            ),
            opts=self._child,
        )

    def _statefulset(
        self, script: str, credential_volumes: list[k8s.core.v1.VolumeArgs], tokens_secret: str | None, headless: k8s.core.v1.Service
    ) -> k8s.apps.v1.StatefulSet:
        """The StatefulSet. Why one function: its body is the object's shape (containers, volumes, probes,
        annotations) in manifest order; the parts with logic are helpers of pod.py."""
        cfg, app, args = self._cfg, self._app, self._args
        volumes = [
            *self.storage.volumes,
            k8s.core.v1.VolumeArgs(
                name="dshm", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium="Memory", size_limit=cfg.nodes.shm_size)
            ),
            k8s.core.v1.VolumeArgs(
                name="startup",
                # every key at its path in the pod (inpod.items): the package nested under inpod/, the rest at the root
                config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
                    name=naming.startup_configmap(app),
                    default_mode=0o555,
                    items=[k8s.core.v1.KeyToPathArgs(key=i["key"], path=i["path"]) for i in inpod.items(self._startup_data(script))],
                ),
            ),
            k8s.core.v1.VolumeArgs(
                name=pod.CLUSTER_VOLUME,
                config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=naming.cluster_configmap(app), default_mode=0o444),
            ),
            lifecycle.settings_volume(app),
            self.ssh.volume,
            *credential_volumes,
            *pod.user_secret_volumes(cfg)[0],
            *pod.model_volumes(args.models)[0],
        ]
        pod_annotations = {
            "ml-dev-env/startup-sha256": pod.content_hash(script),
            # the long-running programs read their package at start: a change of it (or of the shared package) rolls the pods
            "ml-dev-env/idle-agent-sha256": pod.content_hash("".join({**inpod.group("package"), **lifecycle.scripts()}.values())),
            # the home page also imports usage.py (its GPU-hours: usage.week_hours)
            "ml-dev-env/home-page-sha256": pod.content_hash(
                "".join({**inpod.group("package"), **inpod.group("usage"), **inpod.group("home")}.values())
            ),
            devloop.ANNOTATION_SSH_PORT: str(devloop.SSH_PORT),
            devloop.ANNOTATION_HASH: devloop.restart_hash(cfg),
        }
        if self._rdma:
            pod_annotations["k8s.v1.cni.cncf.io/networks"] = pod.multus_annotation(cfg)
        if cfg.env.secrets:
            pod_annotations[pod.USER_SECRETS_ANNOTATION] = ",".join(s.secret for s in cfg.env.secrets)
        mounts = [*self.storage.mounts, lifecycle.settings_mount(), self.ssh.mount, *pod.user_secret_volumes(cfg)[1]]
        mounts += pod.model_volumes(args.models)[1]
        containers = [pod.main_container(cfg, args.image, mounts, tokens_secret, args.models), *pod.proxy_containers(cfg, "oauth-cookie")]
        pod_security = k8s.core.v1.PodSecurityContextArgs(seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"))
        return k8s.apps.v1.StatefulSet(
            f"{self._name}-statefulset",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=app,
                namespace=self._ns,
                labels={**self._labels, **lifecycle.statefulset_labels(cfg)},
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
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector),
                persistent_volume_claim_retention_policy=k8s.apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicyArgs(
                    when_deleted="Retain", when_scaled="Retain"
                ),
                volume_claim_templates=self.storage.claim_templates or None,
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=self._labels, annotations=pod_annotations),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=cfg.security.service_account,
                        restart_policy="Always",
                        termination_grace_period_seconds=lifecycle.termination_grace_seconds(cfg),
                        affinity=pod.affinity(cfg, self._selector),
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
                depends_on=[*self._depends, headless, self.storage],
                # The name is fixed, so a replacement (e.g. a storage-layout change) must delete first;
                # per-pod claims are retained and re-bound by the new StatefulSet.
                delete_before_replace=True,
            ),
        )

    def _dev_service_and_routes(self) -> dict[str, str]:
        """The pod-0 Service (one port per enabled server) and one Route per server; returns the URLs."""
        cfg, name, app = self._cfg, self._name, self._app
        urls: dict[str, str] = {}
        if not cfg.access.servers:
            return urls
        k8s.core.v1.Service(
            f"{name}-dev",
            # Not awaited: pulumi-kubernetes waits (default 10 min) for a selector Service's endpoints
            # (provider/pkg/await/service.go, serviceInitAwaiter.Await), i.e. for pod 0 to be ready, which the
            # StatefulSet's own await already covers with rollout_timeout().
            metadata=self._meta(app, annotations={"pulumi.com/skipAwait": "true"}),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector={**self._selector, "statefulset.kubernetes.io/pod-name": naming.pod_name(app, 0)},
                ports=[
                    k8s.core.v1.ServicePortArgs(
                        name=server.name,
                        port=server.port,
                        target_port=naming.proxy_port_name(server.name) if self._oauth else server.name,
                    )
                    for server in cfg.access.enabled()
                ],
            ),
            opts=self._child,
        )
        for server in cfg.access.servers:
            host = naming.route_host(app, server, self._ns, cfg.cluster.apps_domain)
            crds.custom_resource(
                f"{name}-route-{server}",
                "route.openshift.io/v1",
                "Route",
                self._meta(naming.route_name(app, server)),
                crds.RouteSpec(host=host, to=crds.RouteTargetReference(name=app), port=crds.RoutePort(target_port=server)),
                self._child,
            )
            urls[server] = f"https://{host}"
        return urls
