"""Pod template pieces of the GPU StatefulSet (pure builders of typed pulumi-kubernetes args)."""

from __future__ import annotations

import hashlib
import json

import pulumi
import pulumi_kubernetes as k8s

import inpod
from components import lifecycle, storage
from core import naming, nccl
from inpod import contract
from stacks.config import ModelConfig, StackConfig
from steps.lib.model import MODEL_ROOT

STARTUP_SCRIPT = inpod.path("startup.sh")
STARTUP_MOUNT = naming.STARTUP_MOUNT
STATE_DIR = contract.STATE_DIR
CLUSTER_MOUNT = contract.CLUSTER_MOUNT
CLUSTER_VOLUME = "cluster"
HOME_DIRNAME = ".home"
COOKIE_MOUNT = "/etc/oauth-proxy"


READINESS = (
    f"test -f {STATE_DIR}/{contract.READY_FILE} && "
    f'{{ test ! -f {STATE_DIR}/ssh/wanted || kill -0 "$(cat {STATE_DIR}/ssh/sshd.pid 2>/dev/null)" 2>/dev/null; }}'
)
"""The main container's readiness: the startup script's ready file, and sshd alive where the image has one
(startup.sh writes ssh/wanted; sshd writes its PidFile once its sockets listen, inpod/sh/sshd.sh)."""


def startup_script() -> str:
    return inpod.text("startup.sh")


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def effective_nccl_env(config: StackConfig) -> dict[str, str]:
    net = config.network
    if net.effective_mode == "rdma":
        rdma = net.rdma
        return nccl.rdma_env(
            hcas=rdma.hcas if rdma.hca_mode == "explicit" else None,
            socket_interfaces=rdma.socket_interfaces,
            gid_index=rdma.gid_index,
            gdr_level=rdma.gdr_level,
            cross_nic=rdma.cross_nic,
            overrides=net.nccl_env,
        )
    return nccl.tcp_env(interface_exclude=net.tcp.interface_exclude, p2p_level=net.tcp.p2p_level, overrides=net.nccl_env)


def _field_env(name: str, path: str) -> k8s.core.v1.EnvVarArgs:
    return k8s.core.v1.EnvVarArgs(
        name=name, value_from=k8s.core.v1.EnvVarSourceArgs(field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path=path))
    )


def _plain(name: str, value: str | int) -> k8s.core.v1.EnvVarArgs:
    return k8s.core.v1.EnvVarArgs(name=name, value=str(value))


def cluster_env(config: StackConfig) -> str:
    """`cluster.env` of the `<app>-cluster` ConfigMap: every count-dependent fact, as KEY=value lines.

    The pod template must not change with `nodes.count` (a changed template rolls every pod): the
    ranks, world size and hostfile come from this file, which the kubelet updates in place in running
    pods because it is mounted as a directory (no subPath), and the startup script re-reads it.
    """
    app, ns = config.cluster.app_name, config.cluster.namespace
    values: dict[str, object] = {
        "NNODES": config.nodes.count,
        "GPUS_PER_NODE": config.nodes.gpus_per_pod,
        "APP_NAME": app,
        "HEADLESS_SERVICE": naming.headless_service(app),
        "POD_NAMESPACE": ns,
        "MASTER_PORT": naming.MASTER_PORT,
    }
    assert tuple(values) == contract.CLUSTER_ENV
    return "".join(f"{key}={value}\n" for key, value in values.items())


def home_dir(config: StackConfig) -> str:
    """Persistent per-pod HOME: `<a per-pod volume, else a shared one>/.home/<pod>` (`$(POD_NAME)` expands in the pod)."""
    return f"{storage.home_volume(config.storage).mount_path}/{HOME_DIRNAME}/$(POD_NAME)"


def workspace_path(config: StackConfig) -> str:
    """$ML_DEV_WORKSPACE: the volume named `workspace`, else the first volume."""
    return next((v.mount_path for v in config.storage.volumes if v.name == "workspace"), config.storage.volumes[0].mount_path)


def pod_env(config: StackConfig) -> list[k8s.core.v1.EnvVarArgs]:
    """Count-independent pod identity and paths; the rank values are in `$ML_DEV_STATE_DIR/rank.env`."""
    workspace = workspace_path(config)
    return [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_IP", "status.podIP"),
        _field_env("NODE_NAME", "spec.nodeName"),  # fabric check: rack-aware ranks and failure lines name the node
        _plain(contract.WORKSPACE_ENV, workspace),
        _plain(contract.STATE_DIR_ENV, STATE_DIR),
        _plain(contract.CLUSTER_DIR_ENV, CLUSTER_MOUNT),
        # `$(VAR)` refers to a variable defined earlier in this list (the kubelet expands it).
        _plain("ML_DEV_HOME", home_dir(config)),
        _plain("HOME", "$(ML_DEV_HOME)"),
        # `oc rsh` starts `/bin/sh`, which as an interactive shell reads the file named by $ENV
        # (POSIX sh; bash reads ~/.bashrc and ~/.profile, where the startup script adds the same line).
        _plain("ENV", f"{STATE_DIR}/env.sh"),
        # programs hand other pods this path, never their resolved one (inpod/contract.py)
        _plain(contract.STARTUP_DIR_ENV, STARTUP_MOUNT),
    ]


def server_env(config: StackConfig, tokens_secret: str | None) -> list[k8s.core.v1.EnvVarArgs]:
    access = config.access
    env = [
        _plain("ML_DEV_SERVERS", " ".join(access.servers)),
        _plain("ML_DEV_AUTH", access.auth),
        _plain("TENSORBOARD_LOGDIR", access.tensorboard_log_dir or f"{workspace_path(config)}/tensorboard/{config.cluster.app_name}"),
        _plain("ML_DEV_MEMLOCK", config.security.memlock.mode if config.network.effective_mode == "rdma" else "none"),
        _plain("ML_DEV_HCA_MODE", config.network.rdma.hca_mode if config.network.effective_mode == "rdma" else "explicit"),
    ]
    if access.auth == "oauth-proxy" and access.enabled():
        # the ports startup.sh's forward.py owns on the pod IP, for the proxies on loopback (proxy_containers)
        env.append(_plain(contract.PROXY_PORTS_ENV, " ".join(str(s.proxy_port) for s in access.enabled())))
    if access.auth == "token" and tokens_secret:
        for server in access.enabled():
            if server.credential_env and server.secret_key:
                env.append(
                    k8s.core.v1.EnvVarArgs(
                        name=server.credential_env,
                        value_from=k8s.core.v1.EnvVarSourceArgs(
                            secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=tokens_secret, key=server.secret_key)
                        ),
                    )
                )
    return env


RESTRICTED_CONTAINER = k8s.core.v1.SecurityContextArgs(
    allow_privilege_escalation=False,
    capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
)


def main_security_context(config: StackConfig) -> k8s.core.v1.SecurityContextArgs:
    """TCP: restricted-v2 admissible. RDMA: capabilities through the SCC, or privileged."""
    if config.network.effective_mode == "tcp":
        return RESTRICTED_CONTAINER
    memlock = config.security.memlock
    if memlock.mode == "privileged":
        return k8s.core.v1.SecurityContextArgs(privileged=True)
    if memlock.mode == "scc":
        # Capabilities an SCC grants are only effective for UID 0 (the SCC's RunAsAny admits it).
        return k8s.core.v1.SecurityContextArgs(run_as_user=0, capabilities=k8s.core.v1.CapabilitiesArgs(add=memlock.pod_capabilities))
    return RESTRICTED_CONTAINER


def resources(config: StackConfig) -> k8s.core.v1.ResourceRequirementsArgs:
    n = config.nodes
    gpu = {"nvidia.com/gpu": str(n.gpus_per_pod)}
    sriov: dict[str, str] = {}
    if config.network.effective_mode == "rdma":
        sriov = {r: str(config.network.rdma.sriov_resource_count) for r in config.network.rdma.sriov_resources}
    return k8s.core.v1.ResourceRequirementsArgs(
        requests={"cpu": n.resources.requests.cpu, "memory": n.resources.requests.memory, **gpu, **sriov},
        limits={"cpu": n.resources.limits.cpu, "memory": n.resources.limits.memory, **gpu, **sriov},
    )


MODEL_VOLUME_PREFIX = "model-"


def mounted_models(models: list[ModelConfig]) -> list[dict[str, str]]:
    """The models of the cluster stack that every pod mounts (models[].mountInEnv), as the pods read them (MODELS_ENV)."""
    return [
        {"name": m.name, "path": str(m.mount_in_env), "image": str(m.registered_image).removeprefix("oci://")}
        for m in models
        if m.mount_in_env is not None and m.registered_image is not None
    ]


def model_volumes(models: list[ModelConfig]) -> tuple[list[k8s.core.v1.VolumeArgs], list[k8s.core.v1.VolumeMountArgs]]:
    """models[].mountInEnv: each model's registered modelcar image as a Kubernetes image volume (KEP-4639), its
    `models/` folder mounted read-only at the path (subPath, served from Kubernetes 1.33: kubernetes/website
    content/en/docs/tasks/configure-pod-container/image-volumes.md, its subPath section, the 1.33 beta of
    KEP-4639), pinned by digest so every pod mounts the same bytes, `IfNotPresent`: one pull per node, kept in the node's
    image store. The kubelet mounts an image volume read-only whatever the mount says; `readOnly` says so here too.
    Where the API server's ImageVolume gate is off it drops the volume and its mounts without a word (kubernetes
    pkg/api/pod/util.go dropImageVolumes), hence the cluster.imageVolumes key and `ml-dev status`'s check of each path."""
    volumes, mounts = [], []
    for i, model in enumerate(mounted_models(models)):
        name = f"{MODEL_VOLUME_PREFIX}{i}"
        volumes.append(
            k8s.core.v1.VolumeArgs(name=name, image=k8s.core.v1.ImageVolumeSourceArgs(reference=model["image"], pull_policy="IfNotPresent"))
        )
        mounts.append(k8s.core.v1.VolumeMountArgs(name=name, mount_path=model["path"], sub_path=MODEL_ROOT, read_only=True))
    return volumes, mounts


def main_container(
    config: StackConfig,
    image: pulumi.Input[str],
    mounts: list[k8s.core.v1.VolumeMountArgs],
    tokens_secret: str | None,
    models: list[ModelConfig] | None = None,
) -> k8s.core.v1.ContainerArgs:
    env = pod_env(config) + [_plain(k, v) for k, v in effective_nccl_env(config).items()] + server_env(config, tokens_secret)
    if mounted_models(models or []):
        env.append(_plain(contract.MODELS_ENV, json.dumps(mounted_models(models or []), separators=(",", ":"))))
    env += [_plain(k, v) for k, v in lifecycle.stop_env(config).items()]
    ports = [k8s.core.v1.ContainerPortArgs(name="master", container_port=naming.MASTER_PORT)]
    ports.append(k8s.core.v1.ContainerPortArgs(name="debug", container_port=naming.DEBUG_PORT))
    if config.access.auth == "token":
        ports += [k8s.core.v1.ContainerPortArgs(name=s.name, container_port=s.port) for s in config.access.enabled()]
    return k8s.core.v1.ContainerArgs(
        name=naming.MAIN_CONTAINER,
        image=image,
        image_pull_policy="IfNotPresent",
        command=["/bin/bash", f"{STARTUP_MOUNT}/startup.sh"],
        env=env,
        ports=ports,
        resources=resources(config),
        security_context=main_security_context(config),
        lifecycle=lifecycle.pre_stop(),
        readiness_probe=k8s.core.v1.ProbeArgs(
            exec_=k8s.core.v1.ExecActionArgs(command=["/bin/sh", "-c", READINESS]),
            period_seconds=10,
        ),
        volume_mounts=[
            *mounts,
            k8s.core.v1.VolumeMountArgs(name="dshm", mount_path="/dev/shm"),
            k8s.core.v1.VolumeMountArgs(name="startup", mount_path=STARTUP_MOUNT, read_only=True),
            # A directory mount, never subPath: the kubelet swaps the files in place when the ConfigMap
            # changes (kubernetes pkg/volume/util/atomic_writer.go, AtomicWriter.Write: a `..data` symlink
            # swap); a subPath mount would keep the old file.
            k8s.core.v1.VolumeMountArgs(name=CLUSTER_VOLUME, mount_path=CLUSTER_MOUNT, read_only=True),
        ],
    )


USER_SECRETS_ANNOTATION = "ml-dev-env/user-secrets"
"""Pod-template annotation: the env.secrets names (comma-separated), which the policy rule
user-secrets-stay-the-users holds the stack to (never created, read or put in a container env)."""

USER_SECRET_MODE = 0o440
"""The files of env.secrets' volumes: owner and group read, never world. A Secret volume is read-only
(kubernetes pkg/volume/secret/secret.go secretVolumeMounter.GetAttributes: ReadOnly true); after AtomicWriter.Write
(pkg/volume/util/atomic_writer.go: each file gets its item's mode, else defaultMode) the plugin's setPerms hook calls
volume.SetVolumeOwnership (pkg/volume/volume_linux.go), which with an fsGroup chowns every file to group fsGroup and
ORs roMask (0440) into its mode: on restricted-v2 (nerc-production: an arbitrary UID, fsGroup the namespace's first
supplemental group, which the container process has as a supplementary group) the files are root:<fsGroup> 0440 and
the rank reads them through the group; with no fsGroup (barcelona's SCC, UID 0) they stay root:root 0440 and UID 0
reads them as owner. Another UID of the pod without the group cannot."""


def user_secret_volumes(config: StackConfig) -> tuple[list[k8s.core.v1.VolumeArgs], list[k8s.core.v1.VolumeMountArgs]]:
    """env.secrets: one Secret volume per named Secret at `<contract.SECRETS_MOUNT>/<secret>`, only the listed keys
    (`items`), read-only, never subPath (an updated Secret reaches the running pods through the atomic writer's
    `..data` swap: the next run reads the new value without a restart). `optional`: a Secret or key not (yet) there
    leaves the pod running without it (pkg/volume/secret/secret.go SetUpAt: an optional Secret that is not found is
    an empty payload; MakePayload skips an optional volume's absent item) and `ml-dev` names what is missing before a
    rank starts, instead of the pod hanging in ContainerCreating. The stack holds the names only."""
    volumes, mounts = [], []
    for i, ref in enumerate(config.env.secrets):
        name = f"user-secret-{i}"
        volumes.append(
            k8s.core.v1.VolumeArgs(
                name=name,
                secret=k8s.core.v1.SecretVolumeSourceArgs(
                    secret_name=ref.secret,
                    default_mode=USER_SECRET_MODE,
                    optional=True,
                    items=[k8s.core.v1.KeyToPathArgs(key=key, path=key) for key in ref.keys],
                ),
            )
        )
        mounts.append(k8s.core.v1.VolumeMountArgs(name=name, mount_path=f"{contract.SECRETS_MOUNT}/{ref.secret}", read_only=True))
    return volumes, mounts


def oauth_sar(namespace: str) -> str:
    """Who may pass the proxy: users allowed to create pods in the namespace (they could exec anyway)."""
    return json.dumps({"namespace": namespace, "resource": "pods", "verb": "create"}, separators=(",", ":"))


def proxy_containers(config: StackConfig, cookie_secret_volume: str) -> list[k8s.core.v1.ContainerArgs]:
    """One OpenShift OAuth proxy per exposed server, on 127.0.0.1 as the server itself; forward.py (startup.sh, every pod)
    owns the pod IP's side of each proxy port."""
    if config.access.auth != "oauth-proxy":
        return []
    sa, ns = config.security.service_account, config.cluster.namespace
    containers = []
    for server in config.access.enabled():
        port = server.proxy_port
        containers.append(
            k8s.core.v1.ContainerArgs(
                name=naming.proxy_container(server.name),
                image=config.access.oauth_proxy_image,
                image_pull_policy="IfNotPresent",
                # Loopback only: the pod's containers share one network namespace, and startup.sh's forward.py owns
                # `<pod IP>:<port>` (the same port, another address: both binds are specific, neither conflicts), bound to
                # the interface that holds the pod IP (SO_BINDTODEVICE), and copies each connection here. A Go listener
                # binds an address, not an interface: on the pod IP it would also answer a peer on an SR-IOV network
                # (net1..N) that routes the pod IP via its net1 (Linux's weak host model), which NetworkPolicy does not
                # cover. openshift/oauth-proxy http.go Server.ServeHTTP hands the address (after any `scheme://`) to
                # net.Listen("tcp", ...); main.go's own default for --http-address is "127.0.0.1:4180". Who dials the pod
                # IP and reaches the proxy through the forward: the readiness probe (httpGet without host: the kubelet
                # dials the pod IP), the Service's targetPort (the named port below; the endpoints controller resolves a
                # named port over every container of the pod, kubernetes pkg/api/v1/pod/util.go FindPort) and so the
                # Route. The proxy sees the forward's loopback address as the client; the router's X-Forwarded-For and
                # the Host header pass unchanged (a TCP copy), so the OAuth redirect (oauthproxy.go GetRedirectURI: the
                # request's Host) is the route's.
                args=[
                    "--provider=openshift",
                    f"--http-address=127.0.0.1:{port}",
                    "--https-address=",
                    f"--upstream=http://127.0.0.1:{server.port}",
                    f"--openshift-service-account={sa}",
                    f"--cookie-secret-file={COOKIE_MOUNT}/cookie-secret",
                    f"--cookie-name=_oauth_{server.name}",
                    f"--openshift-sar={oauth_sar(ns)}",
                    "--skip-provider-button",
                    "--pass-basic-auth=false",
                ],
                ports=[k8s.core.v1.ContainerPortArgs(name=naming.proxy_port_name(server.name), container_port=port)],
                # the pod IP's port: the forward and the proxy behind it (oauthproxy.go ServeHTTP answers PingPath,
                # `<proxy-prefix>/healthz`, before any authentication); a pod whose forward refused to start (no
                # interface holds the pod IP) is never Ready
                readiness_probe=k8s.core.v1.ProbeArgs(
                    http_get=k8s.core.v1.HTTPGetActionArgs(path="/oauth/healthz", port=port), period_seconds=10
                ),
                resources=k8s.core.v1.ResourceRequirementsArgs(
                    requests={"cpu": "50m", "memory": "64Mi"}, limits={"cpu": "500m", "memory": "256Mi"}
                ),
                security_context=RESTRICTED_CONTAINER,
                volume_mounts=[k8s.core.v1.VolumeMountArgs(name=cookie_secret_volume, mount_path=COOKIE_MOUNT, read_only=True)],
            )
        )
    return containers


def affinity(config: StackConfig, selector: dict[str, str]) -> k8s.core.v1.AffinityArgs:
    node_affinity = None
    if config.nodes.gpu_nodes:
        node_affinity = k8s.core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                node_selector_terms=[
                    k8s.core.v1.NodeSelectorTermArgs(
                        match_expressions=[
                            k8s.core.v1.NodeSelectorRequirementArgs(
                                key="kubernetes.io/hostname", operator="In", values=list(config.nodes.gpu_nodes)
                            )
                        ]
                    )
                ]
            )
        )
    return k8s.core.v1.AffinityArgs(
        node_affinity=node_affinity,
        pod_anti_affinity=k8s.core.v1.PodAntiAffinityArgs(
            required_during_scheduling_ignored_during_execution=[
                k8s.core.v1.PodAffinityTermArgs(
                    label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                    topology_key="kubernetes.io/hostname",
                )
            ]
        ),
    )


def node_selector(config: StackConfig) -> dict[str, str]:
    selector = dict(config.nodes.node_selector)
    if config.nodes.gpu_product:
        selector["nvidia.com/gpu.product"] = config.nodes.gpu_product
    return selector


def multus_annotation(config: StackConfig) -> str:
    rdma = config.network.rdma
    ns = rdma.attachment_namespace or config.cluster.namespace
    return ", ".join(f"{ns}/{a}" for a in rdma.attachments)


def tolerations(config: StackConfig) -> list[k8s.core.v1.TolerationArgs]:
    return [
        k8s.core.v1.TolerationArgs(key=t.key, operator=t.operator, value=t.value, effect=t.effect, toleration_seconds=t.toleration_seconds)
        for t in config.nodes.tolerations
    ]
