"""Policy 1: routes need authentication."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .query import (
    MANDATORY,
    PolicySpec,
    Resource,
    _get,
    _m,
    _same_ns,
    _seq,
    _str,
    _Workload,
    _workloads,
    is_unknown,
    pod_containers,
)

# ------------------------------------------------------------------ 1. routes need authentication

SERVICE_PORT_AUTH: dict[str, tuple[str, frozenset[str]]] = {
    # container port name -> (server, env vars that make the server require a credential)
    "vscode": ("code-server", frozenset({"PASSWORD", "HASHED_PASSWORD"})),
    "code-server": ("code-server", frozenset({"PASSWORD", "HASHED_PASSWORD"})),
    "jupyter": ("Jupyter", frozenset({"JUPYTER_TOKEN"})),
    "notebook": ("Jupyter", frozenset({"JUPYTER_TOKEN"})),
}
SERVICE_PORT_NUMBERS = {8080: "vscode", 8888: "jupyter"}
# Labels a controller adds to the pods it creates (a Service may select on them).
CONTROLLER_LABELS = frozenset(
    {
        "statefulset.kubernetes.io/pod-name",
        "apps.kubernetes.io/pod-index",
        "controller-revision-hash",
        "pod-template-hash",
        "job-name",
        "controller-uid",
        "batch.kubernetes.io/job-name",
        "batch.kubernetes.io/controller-uid",
        "batch.kubernetes.io/job-completion-index",
        "deployment",
        "deploymentconfig",
    }
)


def is_oauth_proxy(container: Mapping[str, Any]) -> bool:
    """An OpenShift OAuth proxy: its command/args contain `--provider=openshift` (or `--provider openshift`)."""
    argv = [a for a in _seq(container.get("command")) + _seq(container.get("args")) if isinstance(a, str)]
    return "--provider=openshift" in argv or any(a == "--provider" and b == "openshift" for a, b in itertools.pairwise(argv))


def _secret_env_names(container: Mapping[str, Any]) -> set[str]:
    names = set()
    for env in _seq(container.get("env")):
        ref = _get(env, "valueFrom", "secretKeyRef")
        if isinstance(ref, Mapping) and _str(env.get("name")) and _str(ref.get("name")) and _str(ref.get("key")):
            names.add(env["name"])
    return names


def self_authenticated(container: Mapping[str, Any], port: Mapping[str, Any]) -> str | None:
    """None if the container's server on `port` requires its own credential; else why not."""
    number = _numeric(port.get("containerPort"))
    port_name = _str(port.get("name")) or (SERVICE_PORT_NUMBERS.get(number, "") if number is not None else "")
    known = SERVICE_PORT_AUTH.get(port_name)
    if known is None:
        return "is neither an OpenShift OAuth proxy (--provider=openshift) nor a dev server with its own authentication"
    server, env_names = known
    if _secret_env_names(container) & env_names:
        return None
    wanted = " or ".join(sorted(env_names))
    return f"is {server} without its own credential (no {wanted} from a valueFrom.secretKeyRef) and not an OAuth proxy"


def _selects(selector: Mapping[str, Any], workload: _Workload) -> bool:
    res = workload.res
    for key, value in selector.items():
        if key in workload.labels:
            if workload.labels[key] != value:
                return False
        elif key == "statefulset.kubernetes.io/pod-name" and res.kind == "StatefulSet":
            match = re.fullmatch(re.escape(res.name) + r"-(\d+)", str(value))
            replicas = res.spec.get("replicas", 1)
            # replicas 0 (a suspended stack): no pod now, and the template is what the route reaches once it
            # is scaled back up, so the template is judged; otherwise the ordinal must be one of the pods
            if not match or (isinstance(replicas, int) and 0 < replicas <= int(match.group(1))):
                return False
        elif key not in CONTROLLER_LABELS:
            return False
    return True


def _service_ports(service: Resource, target: Any) -> list[Mapping[str, Any]]:
    ports = [p for p in _seq(service.spec.get("ports")) if isinstance(p, Mapping)]
    if target is None:
        return ports
    if _numeric(target) is None:
        named = [p for p in ports if p.get("name") == target]
        return named or [p for p in ports if p.get("targetPort") == target]
    number = _numeric(target)
    return [p for p in ports if number is not None and number in (p.get("targetPort", p.get("port")), p.get("port"))]


def _numeric(target: Any) -> int | None:
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    return int(target) if isinstance(target, str) and target.isdigit() else None


def _container_ports(spec: Mapping[str, Any], target: Any) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(container, port) pairs of a pod spec that serve `target` (a port name or number)."""
    number = _numeric(target)
    found = []
    for container in pod_containers(spec):
        for port in map(_m, _seq(container.get("ports"))):
            if (number is None and port.get("name") == target) or (number is not None and port.get("containerPort") == number):
                found.append((container, port))
    return found


ROUTE_FIX = (
    "Fix: route only to the named port of an OpenShift OAuth proxy sidecar (args --provider=openshift; "
    "access.auth: oauth-proxy), or, with access.auth: token, to a dev server whose credential comes from a Secret "
    "(env PASSWORD for code-server, JUPYTER_TOKEN for Jupyter, via valueFrom.secretKeyRef); TensorBoard has no "
    "authentication of its own."
)


def check_routes_authenticated(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    services = [r for r in resources if r.is_kubernetes and r.kind == "Service"]
    workloads = _workloads(resources)
    for route in resources:
        if not route.is_kubernetes or route.kind != "Route" or route.group != "route.openshift.io":
            continue
        spec = route.spec
        backends = [_m(spec.get("to")), *[_m(b) for b in _seq(spec.get("alternateBackends"))]]
        target = _get(spec, "port", "targetPort")
        if is_unknown(target) or any(is_unknown(b.get("name")) for b in backends):
            continue
        for backend in backends:
            kind, name = _str(backend.get("kind")) or "Service", _str(backend.get("name"))
            if kind != "Service" or name is None:
                continue
            yield from _route_backend(route, name, target, services, workloads)


def _route_backend(
    route: Resource, service_name: str, target: Any, services: list[Resource], workloads: list[_Workload]
) -> Iterator[tuple[Resource, str]]:
    matches = [s for s in services if s.name == service_name and _same_ns(s.namespace, route.namespace)]
    if not matches:
        yield (
            route,
            (
                f"targets Service {service_name!r}, which this stack does not create, so nothing proves the route is "
                f"authenticated. {ROUTE_FIX}"
            ),
        )
        return
    service = matches[0]
    selector = service.spec.get("selector")
    if is_unknown(selector) or any(is_unknown(v) for v in _m(selector).values()):
        return
    if not _m(selector):
        yield route, f"targets Service {service_name!r}, which has no pod selector (its endpoints can't be checked). {ROUTE_FIX}"
        return
    ports = _service_ports(service, target)
    if not ports:
        yield (
            route,
            (
                f"port {target!r} matches no port of Service {service_name!r}, so the route has no backend (set "
                f"spec.port.targetPort to a port name of the Service). {ROUTE_FIX}"
            ),
        )
        return
    selected = [w for w in workloads if _same_ns(w.res.namespace, service.namespace) and _selects(_m(selector), w)]
    if not selected:
        yield route, f"Service {service_name!r} selects no pod template of this stack (selector {dict(_m(selector))}). {ROUTE_FIX}"
        return
    for port in ports:
        pod_port = port.get("targetPort", port.get("port"))
        if is_unknown(pod_port):
            continue
        for workload in selected:
            hits = _container_ports(workload.spec, pod_port)
            chain = f"Service {service_name} port {port.get('name') or port.get('port')} -> {workload.res.label} port {pod_port!r}"
            if not hits and _numeric(pod_port) is None:
                yield route, f"{chain}: no container has a port named {pod_port!r}, so the route has no backend. {ROUTE_FIX}"
                continue
            if not hits:
                yield route, f"{chain}: no container declares this port, so nothing shows who serves it. {ROUTE_FIX}"
                continue
            for container, cport in hits:
                if is_oauth_proxy(container):
                    continue
                why = self_authenticated(container, cport)
                if why is not None:
                    yield route, f"{chain}: container {container.get('name')!r} {why}. {ROUTE_FIX}"


POLICY = PolicySpec(
    "routes-require-authentication",
    MANDATORY,
    "stack",
    "Every OpenShift Route reaches only an OpenShift OAuth proxy (--provider=openshift) or a dev server that "
    "requires its own credential from a Secret (code-server PASSWORD/HASHED_PASSWORD, Jupyter JUPYTER_TOKEN), "
    "resolved Route -> Service port -> selected pod template -> container port.",
    "Expose dev servers through the OAuth proxy sidecar (access.auth: oauth-proxy) or give each exposed server its "
    "token from a Secret (access.auth: token); never route to a server started with --auth none.",
    check_routes_authenticated,
    order=1,
)
