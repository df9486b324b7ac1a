"""An independent reading of the rendered objects: the main container's env as the kubelet makes it."""

from __future__ import annotations

import re
from collections.abc import Mapping
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


def container_env(container: Mapping[str, Any], pod: PodFacts, secrets: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The process env of `container` in `pod`: rendered env in order (fieldRefs, secretKeyRefs from `secrets`
    {secret: {key: value}}, `$(VAR)` expansion), then what the runtime and kubelet add."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
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
    return {"HOSTNAME": pod.name, **KUBERNETES_ADDED, **env}


def main_container(statefulset: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next(c for c in statefulset["spec"]["template"]["spec"]["containers"] if c["name"] == name)
