"""Minimal Kubernetes/OpenShift/Tekton objects for the policy tests, as (type token, inputs, options)."""

from __future__ import annotations

import copy
import importlib
from typing import Any

from tools.mock_engine import run_stack

Item = tuple[str, dict[str, Any], dict[str, Any]]
NS = "team"
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's "unknown string" sentinel


def item(typ: str, obj: dict[str, Any], **options: Any) -> Item:
    return typ, obj, {"retain_on_delete": False, "protect": False, **options}


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, **extra}


def container(name: str = "main", image: str = "quay.io/org/tool:1.0", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **extra}


def oauth_proxy(port_name: str = "p-web", port: int = 18080) -> dict[str, Any]:
    return container(
        "proxy",
        "quay.io/openshift/origin-oauth-proxy:4.20",
        args=["--provider=openshift", f"--http-address=127.0.0.1:{port}", "--https-address=", "--upstream=http://127.0.0.1:8080"],
        ports=[{"name": port_name, "containerPort": port}],
    )


def statefulset(
    name: str = "app", containers: list[dict[str, Any]] | None = None, sa: str | None = "dev-sa", replicas: int = 2, **spec: Any
) -> Item:
    pod: dict[str, Any] = {"containers": containers if containers is not None else [container()]}
    if sa:
        pod["serviceAccountName"] = sa
    pod.update(spec.pop("pod", {}))
    return item(
        "kubernetes:apps/v1:StatefulSet",
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": meta(name),
            "spec": {
                "replicas": replicas,
                "serviceName": f"{name}-headless",
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
                **spec,
            },
        },
    )


def deployment(name: str, containers: list[dict[str, Any]], **pod: Any) -> Item:
    return item(
        "kubernetes:apps/v1:Deployment",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(name),
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": containers, **pod}},
            },
        },
    )


def service(name: str, selector: dict[str, str] | None, ports: list[dict[str, Any]]) -> Item:
    spec: dict[str, Any] = {"ports": ports}
    if selector is not None:
        spec["selector"] = selector
    return item("kubernetes:core/v1:Service", {"apiVersion": "v1", "kind": "Service", "metadata": meta(name), "spec": spec})


def route(name: str, to: str, target_port: Any = None, **spec: Any) -> Item:
    body: dict[str, Any] = {
        "host": f"{name}.apps.example.org",
        "to": {"kind": "Service", "name": to, "weight": 100},
        "tls": {"termination": "edge", "insecureEdgeTerminationPolicy": "Redirect"},
        **spec,
    }
    if target_port is not None:
        body["port"] = {"targetPort": target_port}
    return item(
        "kubernetes:route.openshift.io/v1:Route",
        {"apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": meta(name), "spec": body},
    )


def scc_binding(sa: str, scc: str, role_kind: str = "ClusterRole", name: str = "scc-binding") -> Item:
    return item(
        "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": f"system:openshift:scc:{scc}"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NS}],
        },
    )


def scc_role(scc: str) -> Item:
    return item(
        "kubernetes:rbac.authorization.k8s.io/v1:Role",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(f"system:openshift:scc:{scc}"),
            "rules": [
                {
                    "apiGroups": ["security.openshift.io"],
                    "resources": ["securitycontextconstraints"],
                    "resourceNames": [scc],
                    "verbs": ["use"],
                }
            ],
        },
    )


def scc(name: str, caps: list[str], privileged: bool = False) -> Item:
    return item(
        "kubernetes:security.openshift.io/v1:SecurityContextConstraints",
        {
            "apiVersion": "security.openshift.io/v1",
            "kind": "SecurityContextConstraints",
            "metadata": {"name": name},
            "allowPrivilegedContainer": privileged,
            "allowedCapabilities": caps,
        },
    )


def tekton(kind: str, name: str, spec: dict[str, Any], version: str = "v1") -> Item:
    return item(
        f"kubernetes:tekton.dev/{version}:{kind}",
        {"apiVersion": f"tekton.dev/{version}", "kind": kind, "metadata": meta(name), "spec": spec},
    )


def step(name: str = "run", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "quay.io/org/tools:1.0", "script": "echo hi", **extra}


def config_map(name: str, data: dict[str, str] | None = None, binary: dict[str, str] | None = None) -> Item:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name)}
    if data is not None:
        obj["data"] = data
    if binary is not None:
        obj["binaryData"] = binary
    return item("kubernetes:core/v1:ConfigMap", obj)


def with_env(*env: dict[str, Any]) -> Item:
    return deployment("envs", [container(env=list(env))])


def secret_placeholders() -> dict[str, str]:
    """Placeholder values for every secret config key the program may require (as `make render` does)."""
    loader = importlib.import_module("stacks.loader")
    keys = getattr(loader, "SECRET_KEYS", ("vscodePassword", "jupyterToken"))
    return {key: f"render-placeholder-{key}" for key in keys}


_STACK_CACHE: dict[str, list[Item]] = {}


def stack_items(stack: str) -> list[Item]:
    """The real program's resources for a committed stack (deep copies: tests may mutate them)."""
    if stack not in _STACK_CACHE:
        result = run_stack(stack, secrets=secret_placeholders())
        assert result.error is None, result.error
        _STACK_CACHE[stack] = [(r.typ, r.inputs, r.options) for r in result.resources]
    return copy.deepcopy(_STACK_CACHE[stack])
