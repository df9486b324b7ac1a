"""An independent reading of the rendered objects: the main container's env as the kubelet makes it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KUBERNETES_ADDED = {
    "KUBERNETES_SERVICE_HOST": "172.30.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_SERVICE_PORT_HTTPS": "443",
    "KUBERNETES_PORT": "tcp://172.30.0.1:443",
    "KUBERNETES_PORT_443_TCP": "tcp://172.30.0.1:443",
    "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
    "KUBERNETES_PORT_443_TCP_PORT": "443",
    "KUBERNETES_PORT_443_TCP_ADDR": "172.30.0.1",
}
"""The default `kubernetes` Service's variables (pkg/kubelet/envvars/envvars.go FromServices);
address: OpenShift's default service network."""


SERVICE_NETWORK_PREFIX = "172.30.1."
"""Where the simulation's ClusterIPs come from (OpenShift's default service network 172.30.0.0/16)."""


def service_links(resources: Sequence[Any], pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """The variables the kubelet adds for every Service of the pod's namespace with a ClusterIP (headless ones are
    skipped) when `enableServiceLinks` is true, its default (pkg/kubelet/kubelet_pods.go getServiceEnvVarMap;
    pkg/kubelet/envvars/envvars.go FromServices, makeLinkVariables): `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT`
    (first port), `<SVC>_SERVICE_PORT_<NAME>` per named port, `<SVC>_PORT` (first port as proto://ip:port) and
    `<SVC>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]` per port; `<SVC>` is the name upper-cased, `-` as `_`.
    The render's Services only: in a shared namespace the other stacks' Services add theirs as well. ClusterIPs:
    assigned in name order from SERVICE_NETWORK_PREFIX (the API server allocates them)."""
    if pod_spec.get("enableServiceLinks", True) is False:
        return {}
    services = sorted(
        (r.inputs for r in resources if r.kind == "Service" and (r.inputs.get("spec") or {}).get("clusterIP") not in ("None",)),
        key=lambda svc: str(svc["metadata"]["name"]),
    )
    out: dict[str, str] = {}
    for k, svc in enumerate(services):
        ip, ports = f"{SERVICE_NETWORK_PREFIX}{10 + k}", svc["spec"].get("ports") or []
        if not ports:
            continue
        prefix = str(svc["metadata"]["name"]).upper().replace("-", "_")
        out[f"{prefix}_SERVICE_HOST"] = ip
        out[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                out[f"{prefix}_SERVICE_PORT_{str(port['name']).upper().replace('-', '_')}"] = str(port["port"])
        for i, port in enumerate(ports):
            proto = str(port.get("protocol") or "TCP")
            url = f"{proto.lower()}://{ip}:{port['port']}"
            if i == 0:
                out[f"{prefix}_PORT"] = url
            base = f"{prefix}_PORT_{port['port']}_{proto.upper()}"
            out.update({base: url, f"{base}_PROTO": proto.lower(), f"{base}_PORT": str(port["port"]), f"{base}_ADDR": ip})
    return out


@dataclass(frozen=True)
class PodFacts:
    name: str
    namespace: str
    ip: str
    node: str


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, defined: Mapping[str, str]) -> str:
    """`$(VAR)` from `defined`, `$$` -> `$`, an undefined reference kept as written (expansion.Expand)."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return defined[name] if name in defined else m.group(0)

    return _REF.sub(one, value)


def field(path: str, pod: PodFacts) -> str:
    values = {"metadata.name": pod.name, "metadata.namespace": pod.namespace, "status.podIP": pod.ip, "spec.nodeName": pod.node}
    if path not in values:
        raise KeyError(f"fieldRef {path} is not simulated; simulated: {', '.join(values)}")
    return values[path]


def container_env(
    container: Mapping[str, Any], pod: PodFacts, secrets: Mapping[str, Mapping[str, str]], links: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The process env of `container` in `pod`: rendered env in order (fieldRefs, secretKeyRefs from `secrets`
    {secret: {key: value}}, `$(VAR)` expansion, which may also name a service link), then what the runtime and
    kubelet add (`links`: `service_links`); a rendered name wins over a service link
    (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables)."""
    env: dict[str, str] = {}
    services = {**KUBERNETES_ADDED, **(links or {})}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), {**services, **env})
        elif "valueFrom" in item:
            source = item["valueFrom"]
            if "fieldRef" in source:
                env[name] = field(source["fieldRef"]["fieldPath"], pod)
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env[name] = secrets[ref["name"]][ref["key"]]
            else:
                raise KeyError(f"env {name}: valueFrom {sorted(source)} is not simulated")
        else:
            env[name] = ""
    return {"HOSTNAME": pod.name, **services, **env}


def main_container(statefulset: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next(c for c in statefulset["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def pod_rules(result: Any) -> list[dict[str, Any]]:
    """The RBAC rules of the pods' ServiceAccount in a render: every rule of every Role that a RoleBinding of the render
    binds to the StatefulSet's serviceAccountName (what the API would allow a pod, the home page's reads included)."""
    resources = list(result.resources)
    sts = next(r.inputs for r in resources if r.kind == "StatefulSet")
    account = sts["spec"]["template"]["spec"].get("serviceAccountName", "default")
    roles = {r.inputs["metadata"]["name"]: r.inputs.get("rules") or [] for r in resources if r.kind == "Role"}
    rules: list[dict[str, Any]] = []
    for b in (r.inputs for r in resources if r.kind == "RoleBinding"):
        if any(s.get("kind") == "ServiceAccount" and s.get("name") == account for s in b.get("subjects") or []):
            rules += roles[b["roleRef"]["name"]]
    return rules
