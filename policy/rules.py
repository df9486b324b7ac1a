"""The product's invariants as pure functions over (resource type token, inputs, options) triples.

No pulumi-policy import here: the same rules run offline (`evaluate()` over the mock engine's
recording, called by `make render`) and inside the policy pack (`policy/__main__.py` adapts each rule
to a `ResourceValidationPolicy` or `StackValidationPolicy` for `pulumi preview --policy-pack policy`).

Inputs are the objects exactly as Kubernetes receives them (camelCase: apiVersion, kind, metadata,
spec, ...). Values not known yet (the engine's "unknown during preview" sentinels) are never judged:
a rule that needs such a value stays quiet for that resource, so a preview never fails on them.

Levels (see `POLICIES`): everything the product promises is **mandatory** (an unauthenticated route,
an ungranted privilege, GPU over-commit, data loss on destroy, a Tekton field that v1 silently drops,
a floating image, a credential in plain text). Plain-HTTP exposure of a route that is authenticated
anyway is **advisory** (`route-tls-redirect`).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

Level = Literal["mandatory", "advisory"]
MANDATORY: Level = "mandatory"
ADVISORY: Level = "advisory"
PACK_NAME = "ml-dev-env-guardrails"

# The engine's "value unknown during preview" sentinels (pulumi_policy.proxy / pulumi.runtime.rpc).
UNKNOWN_SENTINELS = frozenset({
    "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",  # boolean
    "3eeb2bf0-c639-47a8-9e75-3b44932eb421",  # number
    "04da6b54-80e4-46f7-96ec-b56ff0331ba9",  # string
    "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",  # array
    "030794c1-ac77-496b-92df-f27374a8bd58",  # asset
    "e48ece36-62e2-4504-bad9-02848725956a",  # archive
    "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",  # object
})
# What the offline recorder (tools/mock_engine.py) writes in place of a Pulumi secret's value.
REDACTED = "REDACTED"


def is_unknown(value: Any) -> bool:
    return isinstance(value, str) and value in UNKNOWN_SENTINELS


# ------------------------------------------------------------------------------ tolerant accessors


def _m(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _str(value: Any) -> str | None:
    """A known string (None for missing, unknown or non-string values)."""
    return value if isinstance(value, str) and not is_unknown(value) else None


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


# ---------------------------------------------------------------------------------- the resources


@dataclass(frozen=True)
class Resource:
    """One evaluated resource: its position in the input, type token, inputs and options."""

    index: int
    type: str
    inputs: Mapping[str, Any]
    options: Mapping[str, Any]

    @property
    def kind(self) -> str:
        """`StatefulSet` for `kubernetes:apps/v1:StatefulSet` (a `...Patch` keeps its suffix)."""
        return self.type.rsplit(":", 1)[-1]

    @property
    def base_kind(self) -> str:
        return self.kind[: -len("Patch")] if self.is_patch else self.kind

    @property
    def api_version(self) -> str:
        parts = self.type.split(":")
        return parts[1] if len(parts) == 3 else ""

    @property
    def group(self) -> str:
        """API group ("" for the core group, which type tokens spell `core/v1`)."""
        group = self.api_version.rsplit("/", 1)[0] if "/" in self.api_version else ""
        return "" if group == "core" else group

    @property
    def is_kubernetes(self) -> bool:
        return self.type.startswith("kubernetes:")

    @property
    def is_patch(self) -> bool:
        return self.type.endswith("Patch")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return _m(self.inputs.get("metadata"))

    @property
    def name(self) -> str:
        return _str(self.metadata.get("name")) or _str(self.options.get("name")) or "<unnamed>"

    @property
    def namespace(self) -> str | None:
        return _str(self.metadata.get("namespace"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return _m(self.inputs.get("spec"))

    @property
    def label(self) -> str:
        ns = self.namespace
        return f"{self.kind} {ns}/{self.name}" if ns else f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Violation:
    policy: str
    level: Level
    resource_type: str
    resource: str
    """`<Kind> <namespace>/<name>` of the offending object."""
    message: str
    """What is wrong and how to fix it."""
    index: int | None = field(default=None, compare=False)
    """Position of the offending resource in the evaluated sequence (the pack maps it to a URN)."""


def _same_ns(a: str | None, b: str | None) -> bool:
    """Namespaces match; a missing one is the provider's default namespace, so it matches any."""
    return a is None or b is None or a == b


# --------------------------------------------------------------------------- shared walkers

POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "DeploymentConfig": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers", "sidecars", "steps")
TEKTON_KINDS = ("Task", "ClusterTask", "TaskRun", "Pipeline", "PipelineRun", "StepAction")


def pod_spec(res: Resource) -> Mapping[str, Any] | None:
    path = POD_SPEC_PATHS.get(res.kind)
    if path is None or not res.is_kubernetes:
        return None
    spec = _get(res.inputs, *path)
    return spec if isinstance(spec, Mapping) else None


def pod_labels(res: Resource) -> Mapping[str, Any]:
    if res.kind == "Pod":
        return _m(res.metadata.get("labels"))
    path = (*POD_SPEC_PATHS[res.kind][:-1], "metadata", "labels")
    return _m(_get(res.inputs, *path))


def pod_containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in _seq(spec.get(key)):
            if isinstance(container, Mapping):
                yield container


def _item_name(item: Mapping[str, Any], index: int) -> str:
    return _str(item.get("name")) or str(index)


def walk(node: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """Every (path, key, value) of every mapping in a nested structure, depth first, in order."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield path, str(key), value
            yield from walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            label = _item_name(item, i) if isinstance(item, Mapping) else str(i)
            yield from walk(item, f"{path}[{label}]")


def container_likes(res: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every container-shaped object of any kind: pod-template containers, init containers, Tekton
    steps, sidecars and step templates (also inline task specs), containers of CRDs such as KServe.
    Yields (path, object)."""
    for path, key, value in walk(res.inputs):
        where = f"{path}.{key}" if path else key
        if key in CONTAINER_LISTS:
            for i, item in enumerate(_seq(value)):
                if isinstance(item, Mapping):
                    yield f"{where}[{_item_name(item, i)}]", item
        elif key == "stepTemplate" and isinstance(value, Mapping):
            yield where, value


def task_specs(res: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Tekton task specs of a Task/ClusterTask/TaskRun/Pipeline/PipelineRun (inline ones included)."""
    if res.group != "tekton.dev":
        return
    spec = res.spec
    if res.base_kind in ("Task", "ClusterTask", "StepAction"):
        yield "spec", spec
    elif res.base_kind == "TaskRun":
        if isinstance(spec.get("taskSpec"), Mapping):
            yield "spec.taskSpec", spec["taskSpec"]
    elif res.base_kind in ("Pipeline", "PipelineRun"):
        pipeline, base = (spec, "spec") if res.base_kind == "Pipeline" else (_m(spec.get("pipelineSpec")), "spec.pipelineSpec")
        for section in ("tasks", "finally"):
            for i, task in enumerate(_seq(pipeline.get(section))):
                if isinstance(task, Mapping) and isinstance(task.get("taskSpec"), Mapping):
                    yield f"{base}.{section}[{_item_name(task, i)}].taskSpec", task["taskSpec"]


def _pipeline_specs(res: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if res.group != "tekton.dev":
        return
    if res.base_kind == "Pipeline":
        yield "spec", res.spec
    elif res.base_kind == "PipelineRun" and isinstance(res.spec.get("pipelineSpec"), Mapping):
        yield "spec.pipelineSpec", res.spec["pipelineSpec"]


# ------------------------------------------------------------------------------------ quantities

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number (None if unknown or unparsable)."""
    if isinstance(value, bool) or value is None or is_unknown(value):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        return None


def is_extended_resource(name: str) -> bool:
    """Device-plugin resources (`nvidia.com/gpu`, `openshift.io/<sriov>`, `rdma/<dev>`, ...): a
    domain-prefixed name outside `kubernetes.io` (those can't be over-committed)."""
    return "/" in name and not name.split("/", 1)[0].endswith("kubernetes.io")


# ======================================================================================= the rules
# Resource rules: Resource -> messages.   Stack rules: all resources -> (resource, message).

ResourceCheck = Callable[[Resource], Iterable[str]]
StackCheck = Callable[[Sequence[Resource]], Iterable[tuple[Resource, str]]]


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
CONTROLLER_LABELS = frozenset({
    "statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index", "controller-revision-hash",
    "pod-template-hash", "job-name", "controller-uid", "batch.kubernetes.io/job-name",
    "batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-completion-index", "deployment", "deploymentconfig",
})


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


@dataclass(frozen=True)
class _Workload:
    res: Resource
    spec: Mapping[str, Any]
    labels: Mapping[str, Any]


def _workloads(resources: Sequence[Resource]) -> list[_Workload]:
    out = []
    for res in resources:
        if res.is_patch:
            continue
        spec = pod_spec(res)
        if spec is not None:
            out.append(_Workload(res, spec, pod_labels(res)))
    return out


def _selects(selector: Mapping[str, Any], workload: _Workload) -> bool:
    res = workload.res
    for key, value in selector.items():
        if key in workload.labels:
            if workload.labels[key] != value:
                return False
        elif key == "statefulset.kubernetes.io/pod-name" and res.kind == "StatefulSet":
            match = re.fullmatch(re.escape(res.name) + r"-(\d+)", str(value))
            replicas = res.spec.get("replicas", 1)
            if not match or (isinstance(replicas, int) and int(match.group(1)) >= replicas):
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
        yield route, (
            f"targets Service {service_name!r}, which this stack does not create, so nothing proves the route is "
            f"authenticated. {ROUTE_FIX}"
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
        yield route, (
            f"port {target!r} matches no port of Service {service_name!r}, so the route has no backend (set "
            f"spec.port.targetPort to a port name of the Service). {ROUTE_FIX}"
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


# -------------------------------------------------------------- 2. privileges need an SCC binding

SCC_ROLE_PREFIX = "system:openshift:scc:"
RESTRICTED_CAPS = frozenset({"NET_BIND_SERVICE"})  # restricted-v2 lets any pod add these
# OpenShift's built-in SCCs (4.x) that may be bound without being declared: what each allows.
BUILTIN_SCCS: dict[str, dict[str, Any]] = {
    "privileged": {"privileged": True, "caps": {"*"}, "host": {"hostNetwork", "hostPID", "hostIPC"}},
    "hostaccess": {"privileged": False, "caps": set(), "host": {"hostNetwork", "hostPID", "hostIPC"}},
    "hostnetwork": {"privileged": False, "caps": set(), "host": {"hostNetwork"}},
    "hostnetwork-v2": {"privileged": False, "caps": set(), "host": {"hostNetwork"}},
    **{n: {"privileged": False, "caps": set(), "host": set()} for n in (
        "restricted", "restricted-v2", "nonroot", "nonroot-v2", "anyuid", "hostmount-anyuid", "machine-api-termination-handler",
    )},
}
SCC_HOST_FIELDS = {"hostNetwork": "allowHostNetwork", "hostPID": "allowHostPID", "hostIPC": "allowHostIPC"}


def _cap(name: str) -> str:
    name = name.upper()
    return name[4:] if name.startswith("CAP_") else name


@dataclass
class _Needs:
    privileged: list[str] = field(default_factory=list)
    caps: dict[str, list[str]] = field(default_factory=dict)
    host: list[str] = field(default_factory=list)

    def add_container(self, where: str, container: Mapping[str, Any]) -> None:
        ctx = _m(container.get("securityContext"))
        if _true(ctx.get("privileged")):
            self.privileged.append(where)
        for cap in _seq(_get(ctx, "capabilities", "add")):
            if _str(cap) and _cap(cap) not in RESTRICTED_CAPS:
                self.caps.setdefault(_cap(cap), []).append(where)

    def add_pod(self, spec: Mapping[str, Any]) -> None:
        self.host += [f for f in SCC_HOST_FIELDS if _true(spec.get(f))]

    def __bool__(self) -> bool:
        return bool(self.privileged or self.caps or self.host)

    def describe(self) -> str:
        parts = []
        if self.privileged:
            parts.append(f"privileged containers ({', '.join(sorted(set(self.privileged)))})")
        if self.caps:
            parts.append("added capabilities " + ", ".join(f"{c} ({', '.join(sorted(set(w)))})" for c, w in sorted(self.caps.items())))
        if self.host:
            parts.append("host namespaces " + ", ".join(sorted(set(self.host))))
        return "; ".join(parts)


def _scc_allows(scc: str, needs: _Needs, sccs: dict[str, Mapping[str, Any]]) -> str | None:
    """None if SCC `scc` admits everything in `needs`; else what it lacks."""
    if scc in sccs:
        obj = sccs[scc]
        allowed_caps = {_cap(c) for c in _seq(obj.get("allowedCapabilities")) + _seq(obj.get("defaultAddCapabilities")) if _str(c)}
        privileged = _true(obj.get("allowPrivilegedContainer"))
        host = {f for f, k in SCC_HOST_FIELDS.items() if _true(obj.get(k))}
    elif scc in BUILTIN_SCCS:
        builtin = BUILTIN_SCCS[scc]
        allowed_caps, privileged, host = set(builtin["caps"]), builtin["privileged"], set(builtin["host"])
    else:
        return None  # a cluster SCC the stack binds to but doesn't declare: trusted as named
    missing = []
    if needs.privileged and not privileged:
        missing.append("allowPrivilegedContainer")
    if "*" not in allowed_caps:
        lacking = sorted(c for c in needs.caps if c not in allowed_caps)
        if lacking:
            missing.append(f"allowedCapabilities {', '.join(lacking)}")
    missing += [SCC_HOST_FIELDS[h] for h in sorted(set(needs.host) - host)]
    return ", ".join(missing) or None


def _bound_sccs(sa: str, ns: str | None, resources: Sequence[Resource]) -> tuple[list[str], list[str]]:
    """SCCs the stack lets service account `sa` use, and notes on bindings that grant nothing."""
    roles = {(r.namespace, r.name): r for r in resources if r.is_kubernetes and r.kind == "Role" and not r.is_patch}
    bound: list[str] = []
    notes: list[str] = []
    for binding in resources:
        if not binding.is_kubernetes or binding.kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if binding.kind == "RoleBinding" and not _same_ns(binding.namespace, ns):
            continue
        ref = _m(binding.inputs.get("roleRef"))
        role_name = _str(ref.get("name")) or ""
        if not role_name.startswith(SCC_ROLE_PREFIX):
            continue
        subject_ok = False
        for subject in _seq(binding.inputs.get("subjects")):
            subject = _m(subject)
            if subject.get("kind") == "ServiceAccount" and subject.get("name") == sa:
                subject_ok |= _same_ns(_str(subject.get("namespace")) or binding.namespace, ns)
            elif subject.get("kind") == "Group" and subject.get("name") in ("system:serviceaccounts", f"system:serviceaccounts:{ns}"):
                subject_ok = True
        if not subject_ok:
            continue
        scc = role_name[len(SCC_ROLE_PREFIX):]
        if ref.get("kind") == "Role":
            role = roles.get((binding.namespace, role_name)) or next(
                (r for (rns, rname), r in roles.items() if rname == role_name and _same_ns(rns, binding.namespace)), None
            )
            if role is None:
                notes.append(f"{binding.label} refers to Role {role_name!r}, which the stack does not create")
                continue
            if not any(
                "use" in _seq(rule.get("verbs")) and "securitycontextconstraints" in _seq(rule.get("resources"))
                and (not _seq(rule.get("resourceNames")) or scc in _seq(rule.get("resourceNames")))
                for rule in map(_m, _seq(role.inputs.get("rules")))
            ):
                notes.append(f"Role {role_name!r} does not grant `use` of SCC {scc!r}")
                continue
        # kind ClusterRole: OpenShift provides system:openshift:scc:<name> for its SCCs; a custom one is the admin's.
        bound.append(scc)
    for scc_res in resources:
        if scc_res.is_kubernetes and scc_res.kind == "SecurityContextConstraints":
            if f"system:serviceaccount:{ns}:{sa}" in _seq(scc_res.inputs.get("users")):
                bound.append(scc_res.name)
    return bound, notes


def _privilege_violation(
    sa: str, ns: str | None, needs: _Needs, resources: Sequence[Resource], sccs: dict[str, Mapping[str, Any]], what: str
) -> str | None:
    bound, notes = _bound_sccs(sa, ns, resources)
    problems = []
    for scc in bound:
        lacking = _scc_allows(scc, needs, sccs)
        if lacking is None:
            return None
        problems.append(f"SCC {scc!r} is bound but does not set {lacking}")
    detail = "; ".join(problems + notes) or f"no RoleBinding in the stack grants service account {sa!r} an SCC"
    return (
        f"{what} needs {needs.describe()}, but {detail}. Fix: declare the privilege the way the memlock setting does "
        f"(security.memlock.mode scc|privileged): a RoleBinding of service account {sa!r} to "
        f"'{SCC_ROLE_PREFIX}<scc>' (a Role granting `use` of the SCC, or the ClusterRole OpenShift provides), and, when "
        f"the stack creates the SCC, list the capabilities in its allowedCapabilities; otherwise drop the privileges "
        f"(TCP mode needs none and runs under restricted-v2)."
    )


def check_privileges_bound(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    sccs = {r.name: r.inputs for r in resources if r.is_kubernetes and r.kind == "SecurityContextConstraints"}
    for workload in _workloads(resources):
        needs = _Needs()
        for container in pod_containers(workload.spec):
            needs.add_container(f"container {container.get('name')}", container)
        needs.add_pod(workload.spec)
        if not needs:
            continue
        sa = workload.spec.get("serviceAccountName", workload.spec.get("serviceAccount")) or "default"
        if _str(sa) is None:
            continue
        msg = _privilege_violation(sa, workload.res.namespace, needs, resources, sccs, "the pod template")
        if msg:
            yield workload.res, msg
    yield from _tekton_privileges(resources, sccs)


def _tekton_privileges(resources: Sequence[Resource], sccs: dict[str, Mapping[str, Any]]) -> Iterator[tuple[Resource, str]]:
    """Privileged Tekton steps run in TaskRun pods as the run's service account: that account needs the SCC."""
    tasks = {(r.namespace, r.name, r.kind): r for r in resources if r.group == "tekton.dev" and r.kind in ("Task", "ClusterTask")}
    pipelines = {(r.namespace, r.name): r for r in resources if r.group == "tekton.dev" and r.kind == "Pipeline"}

    def lookup_task(ref: Mapping[str, Any], ns: str | None) -> Mapping[str, Any] | None:
        kind = _str(ref.get("kind")) or "Task"
        for (tns, tname, tkind), task in tasks.items():
            if tname == ref.get("name") and tkind == kind and (kind == "ClusterTask" or _same_ns(tns, ns)):
                return task.spec
        return None

    def task_needs(task_spec: Mapping[str, Any]) -> _Needs:
        needs = _Needs()
        for key in ("steps", "sidecars"):
            for i, step in enumerate(_seq(task_spec.get(key))):
                if isinstance(step, Mapping):
                    needs.add_container(f"{key[:-1]} {_item_name(step, i)}", step)
        if isinstance(task_spec.get("stepTemplate"), Mapping):
            needs.add_container("stepTemplate", task_spec["stepTemplate"])
        return needs

    for run in resources:
        if run.group != "tekton.dev" or run.is_patch or run.kind not in ("PipelineRun", "TaskRun"):
            continue
        spec, ns = run.spec, run.namespace
        if run.kind == "TaskRun":
            task_spec = _m(spec.get("taskSpec")) or lookup_task(_m(spec.get("taskRef")), ns) or {}
            needs = task_needs(task_spec)
            needs.add_pod(_m(spec.get("podTemplate")))
            sa = _str(spec.get("serviceAccountName")) or "default"
            if needs:
                msg = _privilege_violation(sa, ns, needs, resources, sccs, "the TaskRun's steps")
                if msg:
                    yield run, msg
            continue
        pipeline = _m(spec.get("pipelineSpec"))
        if not pipeline:
            ref_name = _get(spec, "pipelineRef", "name")
            found = next((p for (pns, pname), p in pipelines.items() if pname == ref_name and _same_ns(pns, ns)), None)
            pipeline = found.spec if found else {}
        template = _m(spec.get("taskRunTemplate"))
        overrides = {_str(t.get("pipelineTaskName")): _m(t) for t in map(_m, _seq(spec.get("taskRunSpecs")))}
        for task in map(_m, _seq(pipeline.get("tasks")) + _seq(pipeline.get("finally"))):
            task_spec = _m(task.get("taskSpec")) or lookup_task(_m(task.get("taskRef")), ns) or {}
            needs = task_needs(task_spec)
            override = overrides.get(_str(task.get("name")), {})
            needs.add_pod(_m(override.get("podTemplate")) or _m(template.get("podTemplate")))
            if not needs:
                continue
            sa = _str(override.get("serviceAccountName")) or _str(template.get("serviceAccountName")) or "default"
            msg = _privilege_violation(sa, ns, needs, resources, sccs, f"pipeline task {task.get('name')!r}")
            if msg:
                yield run, msg


# ---------------------------------------------------------------------- 3. GPU requests == limits


def check_gpu_requests_equal_limits(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes:
        return
    for where, container in container_likes(res):
        for field_name in ("resources", "computeResources"):
            block = container.get(field_name)
            if not isinstance(block, Mapping):
                continue
            requests, limits = _m(block.get("requests")), _m(block.get("limits"))
            for name in sorted(set(requests) | set(limits)):
                if not is_extended_resource(name) or is_unknown(requests.get(name)) or is_unknown(limits.get(name)):
                    continue
                if name not in limits:
                    yield (
                        f"{where}: {name} is requested ({requests[name]}) without a limit. Fix: set "
                        f"{field_name}.limits[{name!r}] equal to the request (device resources are whole devices "
                        "and can't be over-committed; the API server rejects a request without a limit)."
                    )
                elif name in requests and quantity(requests[name]) != quantity(limits[name]):
                    yield (
                        f"{where}: {name} requests {requests[name]} but limits {limits[name]}. Fix: make "
                        f"{field_name}.requests and .limits of {name!r} equal (e.g. both = GPUs per pod); "
                        "the scheduler reserves the request, the device plugin allocates the limit."
                    )


# -------------------------------------------------------------------- 4. persistent data retained


def check_persistent_data_retained(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes or res.is_patch:
        return
    if res.kind in ("PersistentVolumeClaim", "Namespace") and res.group == "":
        retain, protect = res.options.get("retain_on_delete"), res.options.get("protect")
        if protect is True or retain is True or retain is None:
            return  # None: the caller can't see retainOnDelete (the policy-pack protocol doesn't carry it)
        what = "its claims' data" if res.kind == "PersistentVolumeClaim" else "every PVC in it"
        yield (
            f"is deleted by `pulumi destroy` (and by a replacement), which deletes {what}. Fix: create it with "
            "`opts=pulumi.ResourceOptions(retain_on_delete=True)` (or protect=True) so the data outlives the stack."
        )
    elif res.kind == "StatefulSet":
        templates = res.spec.get("volumeClaimTemplates")
        if is_unknown(templates) or not _seq(templates):
            return
        policy = _m(res.spec.get("persistentVolumeClaimRetentionPolicy"))
        wrong = {k: policy.get(k) for k in ("whenDeleted", "whenScaled") if policy.get(k) != "Retain" and not is_unknown(policy.get(k))}
        if wrong:
            shown = ", ".join(f"{k}={v!r}" if v is not None else f"{k} unset" for k, v in wrong.items())
            yield (
                f"has volumeClaimTemplates but persistentVolumeClaimRetentionPolicy {shown}. Fix: set "
                "spec.persistentVolumeClaimRetentionPolicy {whenDeleted: Retain, whenScaled: Retain} explicitly, so "
                "per-pod claims survive deletion/replacement of the StatefulSet and a smaller pod count."
            )


# ------------------------------------------------------------ 5. Tekton v1: computeResources only


def check_tekton_compute_resources(res: Resource) -> Iterator[str]:
    if res.group != "tekton.dev" or res.base_kind not in TEKTON_KINDS:
        return
    version = res.api_version.rsplit("/", 1)[-1]
    if version != "v1":
        yield (
            f"uses tekton.dev/{version}. Fix: write tekton.dev/v1 objects (v1 renamed step `resources` to "
            "`computeResources`, PipelineRun `timeout` to `timeouts`, `serviceAccountName`/`podTemplate` to `taskRunTemplate`)."
        )
    fix = (
        "Fix: rename it to `computeResources` — tekton.dev/v1 has no `resources` on steps, sidecars or stepTemplate "
        "and silently drops it, so the step runs without its memory/ephemeral-storage requests (the original "
        "model pipeline was evicted this way)."
    )
    for path, task_spec in task_specs(res):
        if "resources" in task_spec:
            yield f"{path}.resources: v1beta1 PipelineResources don't exist in tekton.dev/v1. Fix: use workspaces, params and results."
        for key in ("steps", "sidecars"):
            for i, step in enumerate(_seq(task_spec.get(key))):
                if isinstance(step, Mapping) and "resources" in step:
                    yield f"{path}.{key}[{_item_name(step, i)}] carries `resources`. {fix}"
        if "resources" in _m(task_spec.get("stepTemplate")):
            yield f"{path}.stepTemplate carries `resources`. {fix}"
    for path, pipeline in _pipeline_specs(res):
        if "resources" in pipeline:
            yield f"{path}.resources: v1beta1 PipelineResources don't exist in tekton.dev/v1. Fix: use workspaces, params and results."
        for section in ("tasks", "finally"):
            for i, task in enumerate(_seq(pipeline.get(section))):
                if isinstance(task, Mapping) and "resources" in task:
                    yield f"{path}.{section}[{_item_name(task, i)}].resources: v1beta1 PipelineResources. Fix: use workspaces and params."


# -------------------------------------------------------------------------------- 6. images pinned

_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}$")
IMAGE_FIX = "Fix: pin a version tag (e.g. quay.io/org/image:1.2.3) or a digest (image@sha256:<64 hex>)."


def image_problem(ref: str) -> str | None:
    """None if `ref` is pinned by a non-`latest` tag or a digest; else what is wrong with it."""
    ref = ref.strip()
    if "$(" in ref or "${" in ref:
        return None  # substituted at run time (Tekton params, shell): checked where the value is set
    if not ref:
        return "is empty"
    if "@" in ref:
        return None if _DIGEST.match(ref.split("@", 1)[1]) else "has a malformed digest"
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (it means :latest, which moves)"
    if last.split(":", 1)[1] in ("", "latest"):
        return "uses the floating :latest tag"
    return None


def _image_stream_tag_problem(name: str) -> str | None:
    if "@" in name:
        return None
    if ":" not in name:
        return "names no tag (ImageStreamTag names are <stream>:<tag>)"
    return "uses the floating :latest tag" if name.split(":", 1)[1] == "latest" else None


def _object_ref_problem(ref: Mapping[str, Any]) -> tuple[str, str | None] | None:
    kind, name = _str(ref.get("kind")), _str(ref.get("name"))
    if name is None:
        return None
    if kind == "DockerImage":
        return name, image_problem(name)
    if kind == "ImageStreamTag":
        return name, _image_stream_tag_problem(name)
    return None


def check_images_pinned(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes:
        return
    triggered = "image.openshift.io/triggers" in _m(res.metadata.get("annotations"))
    for where, container in container_likes(res):
        image = container.get("image")
        if "image" not in container or is_unknown(image) or not isinstance(image, str):
            continue
        if not image.strip() and triggered:
            continue  # set by the OpenShift image trigger
        problem = image_problem(image)
        if problem:
            yield f"{where}: image {image!r} {problem}. {IMAGE_FIX}"
    if res.kind == "BuildConfig":
        strategy = _m(res.spec.get("strategy"))
        refs = [(f"spec.strategy.{k}.from", _m(_get(strategy, k, "from"))) for k in ("dockerStrategy", "sourceStrategy", "customStrategy")]
        refs.append(("spec.output.to", _m(_get(res.spec, "output", "to"))))
        for i, trigger in enumerate(map(_m, _seq(res.spec.get("triggers")))):
            refs.append((f"spec.triggers[{i}].imageChange.from", _m(_get(trigger, "imageChange", "from"))))
        for where, ref in refs:
            found = _object_ref_problem(ref)
            if found and found[1]:
                yield f"{where}: {ref.get('kind')} {found[0]!r} {found[1]}. {IMAGE_FIX}"
    if res.kind == "ImageStream":
        for i, tag in enumerate(map(_m, _seq(res.spec.get("tags")))):
            found = _object_ref_problem(_m(tag.get("from")))
            if found and found[1] and _m(tag.get("from")).get("kind") == "DockerImage":
                yield f"spec.tags[{tag.get('name') or i}].from: {found[0]!r} {found[1]}. {IMAGE_FIX}"
    for path, key, value in walk(res.spec, "spec"):
        if key == "storageUri" and isinstance(value, str) and value.startswith("oci://"):
            problem = image_problem(value[len("oci://"):])
            if problem:
                yield f"{path}.storageUri {value!r} {problem}. Fix: register the modelcar by digest (oci://...@sha256:<digest>)."


# --------------------------------------------------------------------- 7. no plaintext credentials

SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "token", "secret", "apikey", "credential", "credentials", "privatekey"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("client", "secret")})
NOT_A_VALUE = frozenset({"file", "path", "dir", "name", "ref", "url", "uri", "endpoint", "mount", "type", "header", "env", "len", "length"})
CREDENTIAL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,})\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----\s*[A-Za-z0-9+/=\s]{40,}")),
    ("registry credentials (dockerconfigjson auths)",
     re.compile(r'"auths"\s*:\s*\{.*?"(?:auth|password|identitytoken)"\s*:\s*"[^"]{4,}"', re.S)),
    ("an AWS secret access key", re.compile(r"(?i)aws_secret_access_key\s*[=:]\s*[\"']?[A-Za-z0-9/+]{40}\b")),
)
# `NAME=literal` / `name: literal` lines of env files, properties and YAML configs (not `$VAR` expansions).
_ASSIGNMENT = re.compile(r"""^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*[=:]\s*(["']?)([^\s"'$`{}()<>|;&]{8,})\2\s*$""", re.M)


def _words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def looks_secret_name(name: str) -> bool:
    """`HF_TOKEN`, `PASSWORD`, `aws_secret_access_key`, `apiKey`... but not `NCCL_*`,
    `HF_TOKEN_FILE`/`*_PATH`/`*_NAME` (references, not values) or `TOKENIZERS_PARALLELISM`."""
    if name.upper().startswith("NCCL_"):
        return False
    words = _words(name)
    if not words or words[-1] in NOT_A_VALUE:
        return False
    return any(w in SECRET_WORDS for w in words) or any(pair in SECRET_PAIRS for pair in itertools.pairwise(words))


def credential_in(text: str) -> str | None:
    """What credential `text` contains (never the value itself), or None."""
    for what, pattern in CREDENTIAL_PATTERNS:
        if pattern.search(text):
            return what
    for match in _ASSIGNMENT.finditer(text):
        name, value = match.group(1), match.group(3)
        if looks_secret_name(name) and not value.startswith("/") and value != REDACTED:
            return f"a literal value for {name}"
    return None


SECRET_FIX = (
    "Fix: keep the value in a Secret (declared by the stack from a Pulumi secret: `pulumi config set --secret`) and "
    "reference it with env valueFrom.secretKeyRef or a secret volume; if the value is not a credential (a file path "
    "or an object name), name the variable *_FILE/*_PATH/*_NAME."
)


def check_no_plaintext_credentials(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes:
        return
    if res.base_kind == "ConfigMap" and res.group == "":
        for section in ("data", "binaryData"):
            for key, value in _m(res.inputs.get(section)).items():
                text = _str(value)
                if text is None:
                    continue
                if section == "binaryData":
                    try:
                        text = base64.b64decode(text, validate=True).decode("utf-8", "replace")
                    except (binascii.Error, ValueError):
                        continue
                if looks_secret_name(key) and text.strip():
                    yield (
                        f"{section}[{key!r}] holds a credential-named value in a ConfigMap (readable by anyone who "
                        f"can read ConfigMaps). {SECRET_FIX}"
                    )
                elif text == REDACTED:
                    yield f"{section}[{key!r}] embeds a Pulumi secret in a plain ConfigMap. {SECRET_FIX}"
                else:
                    found = credential_in(text)
                    if found:
                        yield f"{section}[{key!r}] contains {found}. {SECRET_FIX}"
    for path, key, value in walk(res.inputs):
        if key not in ("env", "buildArgs"):  # container/step env; Docker build args end up in image history
            continue
        where = f"{path}.{key}" if path else key
        for item in _seq(value):
            item = _m(item)
            name, literal = _str(item.get("name")), item.get("value")
            if name is None:
                continue
            if isinstance(literal, str) and not is_unknown(literal) and literal:
                if looks_secret_name(name):
                    yield f"{where}[{name}] sets a credential-named variable from a literal value. {SECRET_FIX}"
                elif literal == REDACTED:
                    yield f"{where}[{name}] embeds a Pulumi secret as a literal env value (visible in the pod spec). {SECRET_FIX}"
                else:
                    found = credential_in(literal)
                    if found:
                        yield f"{where}[{name}] contains {found}. {SECRET_FIX}"
            elif looks_secret_name(name) and isinstance(_get(item, "valueFrom", "configMapKeyRef"), Mapping):
                yield f"{where}[{name}] reads a credential-named variable from a ConfigMap. {SECRET_FIX}"
    for where, container in container_likes(res):
        argv = [a for a in _seq(container.get("command")) + _seq(container.get("args")) if isinstance(a, str) and not is_unknown(a)]
        script = _str(container.get("script"))
        for text in [*argv, *([script] if script else [])]:
            found = next((w for w, p in CREDENTIAL_PATTERNS if p.search(text)), None)
            if found:
                yield f"{where}: command/args/script contain {found}. {SECRET_FIX}"
                break


# ------------------------------------------------------------------- 8. routes redirect to TLS (advisory)


def check_route_tls(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes or res.kind != "Route" or res.group != "route.openshift.io":
        return
    tls = res.spec.get("tls")
    if is_unknown(tls):
        return
    if not isinstance(tls, Mapping) or not tls.get("termination"):
        yield "serves plain HTTP (no spec.tls). Fix: set spec.tls {termination: edge, insecureEdgeTerminationPolicy: Redirect}."
    elif tls.get("insecureEdgeTerminationPolicy") == "Allow":
        yield (
            "allows plain HTTP next to HTTPS (insecureEdgeTerminationPolicy: Allow), exposing session cookies. "
            "Fix: set insecureEdgeTerminationPolicy: Redirect."
        )


# ============================================================================== policy catalogue


@dataclass(frozen=True)
class PolicySpec:
    name: str
    level: Level
    scope: Literal["resource", "stack"]
    description: str
    remediation: str
    check: ResourceCheck | StackCheck
    """A ResourceCheck for scope "resource", a StackCheck for scope "stack"."""


POLICIES: tuple[PolicySpec, ...] = (
    PolicySpec(
        "routes-require-authentication", MANDATORY, "stack",
        "Every OpenShift Route reaches only an OpenShift OAuth proxy (--provider=openshift) or a dev server that "
        "requires its own credential from a Secret (code-server PASSWORD/HASHED_PASSWORD, Jupyter JUPYTER_TOKEN), "
        "resolved Route -> Service port -> selected pod template -> container port.",
        "Expose dev servers through the OAuth proxy sidecar (access.auth: oauth-proxy) or give each exposed server its "
        "token from a Secret (access.auth: token); never route to a server started with --auth none.",
        check_routes_authenticated,
    ),
    PolicySpec(
        "privileges-require-scc-binding", MANDATORY, "stack",
        "Privileged containers, added capabilities (beyond NET_BIND_SERVICE) and host namespaces appear only in pods "
        "whose service account the stack binds to an SCC (RoleBinding to system:openshift:scc:<scc>) that allows them: "
        "the RDMA memlock setting, declared, never granted out of band.",
        "Set security.memlock (scc with the SCC's capabilities, or privileged) so the stack declares the RoleBinding "
        "(and the SCC when it may create it), or remove the privileges.",
        check_privileges_bound,
    ),
    PolicySpec(
        "gpu-requests-equal-limits", MANDATORY, "resource",
        "In every container (pod templates, Tekton steps) device resources - nvidia.com/gpu, openshift.io/* SR-IOV, "
        "rdma/* and any other extended resource - have requests equal to limits.",
        "Set requests and limits of each device resource to the same value.",
        check_gpu_requests_equal_limits,
    ),
    PolicySpec(
        "persistent-data-retained", MANDATORY, "resource",
        "Data survives `pulumi destroy` and replacements: PersistentVolumeClaims and a created Namespace are "
        "retain_on_delete (or protected); StatefulSets with volumeClaimTemplates set "
        "persistentVolumeClaimRetentionPolicy whenDeleted/whenScaled: Retain. (The policy-pack protocol does not "
        "carry retainOnDelete, so `pulumi preview --policy-pack` checks protect and the StatefulSet policy; "
        "`make render` checks retain_on_delete.)",
        "Create claims and namespaces with ResourceOptions(retain_on_delete=True); set the StatefulSet's "
        "persistentVolumeClaimRetentionPolicy to Retain/Retain.",
        check_persistent_data_retained,
    ),
    PolicySpec(
        "tekton-v1-compute-resources", MANDATORY, "resource",
        "Tekton objects are tekton.dev/v1 and no step, sidecar or stepTemplate (of a Task, or an inline taskSpec of a "
        "Pipeline/PipelineRun/TaskRun) carries `resources`: v1 calls it computeResources and silently drops the old name.",
        "Rename step `resources` to `computeResources`; use tekton.dev/v1.",
        check_tekton_compute_resources,
    ),
    PolicySpec(
        "images-pinned", MANDATORY, "resource",
        "Every image - containers, init containers, Tekton steps/sidecars/stepTemplate, BuildConfig from/output/"
        "ImageChange triggers, ImageStream DockerImage imports, KServe oci:// storageUri - is pinned by a tag other "
        "than latest or by a digest.",
        "Pin a version tag or a digest.",
        check_images_pinned,
    ),
    PolicySpec(
        "no-plaintext-credentials", MANDATORY, "resource",
        "No credential in a ConfigMap or a literal env value: credential-named keys/variables (password, token, "
        "secret, api key, access key, private key; not NCCL_* or *_FILE/*_PATH/*_NAME) come from a Secret, and no "
        "value looks like a credential (AWS/Hugging Face/GitHub tokens, private keys, dockerconfigjson auths).",
        "Move the value into a Secret created from a Pulumi secret and reference it with valueFrom.secretKeyRef.",
        check_no_plaintext_credentials,
    ),
    PolicySpec(
        "route-tls-redirect", ADVISORY, "resource",
        "Routes terminate TLS and redirect plain HTTP (edge + Redirect). Advisory: the authentication policy already "
        "keeps unauthenticated users out; this one keeps session cookies off plain HTTP.",
        "Set spec.tls {termination: edge, insecureEdgeTerminationPolicy: Redirect}.",
        check_route_tls,
    ),
)
POLICY_NAMES = tuple(p.name for p in POLICIES)


def evaluate(
    resources: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
    policies: Iterable[str] | None = None,
) -> list[Violation]:
    """Check (type token, inputs, options) triples against every policy (or the named ones).

    `options` may hold `retain_on_delete`, `protect` (and `name`, used when an object has no
    metadata.name); a missing `retain_on_delete` means "not known", never "false".
    """
    items = [
        Resource(i, str(item[0]), _m(item[1]), _m(item[2]) if len(item) > 2 else {})
        for i, item in enumerate(resources)
    ]
    wanted = set(POLICY_NAMES if policies is None else policies)
    unknown = wanted - set(POLICY_NAMES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; known: {', '.join(POLICY_NAMES)}")
    violations: list[Violation] = []
    for spec in POLICIES:
        if spec.name not in wanted:
            continue
        if spec.scope == "resource":
            check: Callable[[Any], Iterable[Any]] = spec.check
            found = [(res, msg) for res in items for msg in check(res)]
        else:
            found = list(spec.check(items))  # type: ignore[arg-type]
        for res, msg in found:
            violations.append(Violation(spec.name, spec.level, res.type, res.label, msg, res.index))
    return violations


def has_mandatory(violations: Iterable[Violation]) -> bool:
    return any(v.level == MANDATORY for v in violations)


def format_report(violations: Sequence[Violation]) -> str:
    """A human report: one block per violation, mandatory first, then a one-line verdict."""
    if not violations:
        return f"policy {PACK_NAME}: {len(POLICIES)} policies, no violations"
    order = {MANDATORY: 0, ADVISORY: 1}
    mandatory = sum(v.level == MANDATORY for v in violations)
    lines = [
        f"policy {PACK_NAME}: {len(violations)} violation(s) ({mandatory} mandatory, {len(violations) - mandatory} advisory)"
    ]
    for v in sorted(violations, key=lambda v: (order[v.level], POLICY_NAMES.index(v.policy) if v.policy in POLICY_NAMES else 99,
                                               v.index if v.index is not None else -1, v.message)):
        lines.append(f"  [{v.level}] {v.policy}: {v.resource}")
        lines.append(f"      {v.message}")
    return "\n".join(lines)


# ------------------------------------------------------------- workload RBAC (lifecycle: idle agent)
try:
    from policy.workload_rbac import check_workload_rbac
except ImportError:  # run by the CLI as `python policy/`: the pack directory itself is on sys.path
    from workload_rbac import check_workload_rbac  # type: ignore[no-redef]

POLICIES = (
    *POLICIES,
    PolicySpec(
        "workload-rbac-scale-only", MANDATORY, "resource",
        "Roles and ClusterRoles the stack declares grant no write verb on workload objects (StatefulSets, "
        "Deployments, pods, jobs, ...), no pods/exec-style entry and no wildcards; scaling goes through "
        "<workload>/scale limited by resourceNames (the idle agent's `statefulsets/scale` on its one StatefulSet).",
        "Grant get/update on `statefulsets/scale` with resourceNames: [<the StatefulSet>] instead of patch on statefulsets.",
        check_workload_rbac,
    ),
)
POLICY_NAMES = tuple(p.name for p in POLICIES)
