"""Deterministic names, DNS names and URLs (pure functions, no Pulumi)."""

from __future__ import annotations

import hashlib
import re
import shlex

from inpod import contract

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

MASTER_PORT = contract.MASTER_PORT
DEBUG_PORT = 5678
"""debugpy's port in the main container (`oc port-forward` target)."""
INTERNAL_REGISTRY = "image-registry.openshift-image-registry.svc:5000"
MAIN_CONTAINER = "ml-dev"
"""The main container of every GPU pod (dev servers, training); `oc rsh -c ml-dev`."""
PART_OF = {contract.PART_OF_LABEL: contract.PART_OF}


def owner_labels(cluster: str) -> dict[str, str]:
    """Labels that say this stack (cluster name `cluster`) owns an object."""
    return {"app.kubernetes.io/managed-by": "pulumi", contract.CLUSTER_LABEL: cluster}


def stack_labels(cluster: str) -> dict[str, str]:
    """Labels of every object the stack creates."""
    return {**PART_OF, **owner_labels(cluster)}


def selector_labels(app: str) -> dict[str, str]:
    """Labels that select the GPU pods of `app` (StatefulSet selector, Services)."""
    return {"app.kubernetes.io/name": "ml-dev-env", "app.kubernetes.io/instance": app}


STARTUP_MOUNT = contract.STARTUP_MOUNT
"""Where the startup ConfigMap (startup.sh, the dev-loop, fabric and idle-agent programs) is mounted."""


def startup_configmap(app: str) -> str:
    return f"{app}-startup"


def cluster_configmap(app: str) -> str:
    """The count-dependent facts (`cluster.env`), see components/pod.py `cluster_env`."""
    return f"{app}-cluster"


def oauth_cookie_secret(app: str) -> str:
    return f"{app}-oauth-cookie"


def dev_tokens_secret(app: str) -> str:
    return f"{app}-dev-tokens"


def scc_binding(app: str, scc: str) -> str:
    return f"{app}-scc-{scc}"


def ssh_secret(app: str) -> str:
    """The dev loop's SSH host and client keys (components/devloop.py)."""
    return f"{app}-ssh"


def ssh_network_policy(app: str) -> str:
    """Who may reach the pods' sshd (components/devloop.py)."""
    return f"{app}-ssh"


def lifecycle_configmap(app: str) -> str:
    """The idle agent's settings (`idle.json`, components/lifecycle.py)."""
    return f"{app}-lifecycle"


def idle_record_configmap(app: str) -> str:
    """The ConfigMap the idle agent writes its stop record into (the only object it may update)."""
    return f"{app}-idle-stop"


def usage_configmap(app: str) -> str:
    """The environment's GPU-hours record (written by its usage Deployment, inpod/usage.py; read by the home page)."""
    return contract.usage_configmap(app)


def usage_recorder(app: str) -> str:
    """The usage Deployment and the Role/RoleBinding it (and `ml-dev status --all`) reads and writes with."""
    return f"{app}-usage"


def node_reader(namespace: str, app: str) -> str:
    """The usage recorder's ClusterRole and ClusterRoleBinding (the nodes) and Role and RoleBinding in kube-node-lease
    (the nodes' Leases): cluster-scoped or in another namespace, so the name carries the app and the namespace."""
    return f"{usage_recorder(app)}-nodes-{namespace}"


def idle_agent_role(app: str) -> str:
    return f"{app}-idle-agent"


def image_wait(image_stream: str) -> str:
    """ServiceAccount, Role and RoleBinding of the image wait Job (it lists its BuildConfigs' Builds)."""
    return f"{image_stream[:40]}-wait"


def headless_service(app: str) -> str:
    return f"{app}-headless"


def oc(context: str | None) -> str:
    """The `oc` every printed command starts with: `oc --context <cluster.kubeContext>` when it is set (a laptop with
    several clusters in its kubeconfig runs the command against this stack's, whatever its current context)."""
    return f"oc --context {shlex.quote(context)}" if context else "oc"


def laptop_alias(cluster: str, environment: str, ordinal: int) -> str:
    """A pod's SSH host alias on a laptop: `<cluster>-<environment>-<ordinal>`, unique per cluster and environment (a
    pod name alone, `<appName>-<ordinal>`, repeats on every cluster whose appName is the default)."""
    return f"{cluster}-{environment}-{ordinal}"


def pod_name(app: str, ordinal: int) -> str:
    return f"{app}-{ordinal}"


def pod_names(app: str, count: int) -> list[str]:
    return [pod_name(app, i) for i in range(count)]


def pod_dns(app: str, namespace: str, ordinal: int) -> str:
    """Stable DNS name of a StatefulSet pod behind its headless Service."""
    return f"{pod_name(app, ordinal)}.{headless_service(app)}.{namespace}.svc.cluster.local"


def hostfile(app: str, namespace: str, count: int, gpus_per_pod: int) -> str:
    """DeepSpeed hostfile content: one line per pod, `<pod-dns> slots=<gpus>`."""
    return "".join(f"{pod_dns(app, namespace, i)} slots={gpus_per_pod}\n" for i in range(count))


def route_name(app: str, server: str) -> str:
    return f"{app}-{server}"


def proxy_container(server: str) -> str:
    return f"{server}-proxy"


def proxy_port_name(server: str) -> str:
    return f"p-{server}"  # container port names are at most 15 characters


def route_host(app: str, server: str, namespace: str, apps_domain: str) -> str:
    """Route host following OpenShift's default `<route>-<namespace>.<apps domain>` pattern."""
    return f"{route_name(app, server)}-{namespace}.{apps_domain}"


def pre_pull_daemonset(app: str) -> str:
    """The DaemonSet that pulls the pods' image on the GPU nodes (image.prePull daemonSet)."""
    return f"{app}-prepull"


def pinned_image_set(namespace: str, app: str) -> str:
    """The PinnedImageSet of a stack (cluster-scoped: carries the namespace and app, like a created SCC)."""
    return stack_scc_name("ml-dev-env-runtime", namespace, app)


def stack_scc_name(base: str, namespace: str, app: str) -> str:
    """Name of an SCC a stack creates: SCCs are cluster-scoped, so the name carries the namespace and
    app, and two environments in one cluster never share (or delete) each other's SCC. A name over the
    DNS-subdomain limit (253) keeps a hashed suffix that still tells the stacks apart."""
    name = f"{base}-{namespace}-{app}"
    if len(name) <= 253:
        return name
    digest = short_hash(base, namespace, app)
    return f"{name[: 253 - len(digest) - 1].rstrip('-.')}-{digest}"


def short_hash(*parts: str, length: int = 10) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    return digest[:length]


def internal_image(namespace: str, name: str, tag: str) -> str:
    return f"{INTERNAL_REGISTRY}/{namespace}/{name}:{tag}"


# The words that follow `<appName>-` in the names a stack gives its objects (the functions above, the image builds'
# `<imageStream>-base|runtime|tools…` and the wait Job, the image-puller binding, the routed servers of core/servers.py,
# and `<appName>-<shared volume>` claims, which the caller adds). An environment's appName is `<cluster appName>-<env>`:
# an environment name none of whose `-`-separated words is one of these (or a number: pod ordinals) yields names that
# no other stack of the cluster can yield (tests/components/test_environment.py renders every one against every other stack).
APP_SUFFIX_WORDS = frozenset(
    {"base", "runtime", "tools", "wait", "cluster", "startup", "lifecycle", "idle", "usage", "ssh", "headless", "scc"}
    | {"oauth", "dev", "image"}
)
