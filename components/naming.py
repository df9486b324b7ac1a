"""Deterministic names, DNS names and URLs (pure functions, no Pulumi)."""

from __future__ import annotations

import hashlib
import re

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

MASTER_PORT = 29500
DEBUG_PORT = 5678
INTERNAL_REGISTRY = "image-registry.openshift-image-registry.svc:5000"


def headless_service(app: str) -> str:
    return f"{app}-headless"


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


def route_host(app: str, server: str, namespace: str, apps_domain: str) -> str:
    """Route host following OpenShift's default `<route>-<namespace>.<apps domain>` pattern."""
    return f"{route_name(app, server)}-{namespace}.{apps_domain}"


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
