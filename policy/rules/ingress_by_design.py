"""Policy rule: the stack's NetworkPolicies admit the stack's own pods and the router, nothing else.

Every ingress rule of every NetworkPolicy the stack renders names its sources (`from`), and each source is either
the pods the policy protects (a `podSelector` equal to the policy's own, no namespace selector) or the
OpenShift router (`namespaceSelector` = {policy-group.network.openshift.io/ingress: ""} and no `podSelector`); router
sources reach only ports that a rendered Route leads to (Route -> Service -> pod port), never a range.

A router peer with any `podSelector`, `{}` included, fails: OVN-Kubernetes admits a host-network router (the
default on bare metal) only through the namespace address set, which it uses for a peer whose podSelector is nil
(ovn-org/ovn-kubernetes go-controller/pkg/ovn/base_network_controller_policy.go, useNamespaceAddrSet).
Policy `ingress-by-design` (`POLICY` below).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .query import MANDATORY, PolicySpec, Resource, _get, _m, _same_ns, _seq, _str, _Workload, _workloads, is_unknown
from .routes_authenticated import _container_ports, _selects, _service_ports

ROUTER_LABEL = "policy-group.network.openshift.io/ingress"
FIX = (
    "Fix: keep the stack's NetworkPolicy as components/devloop.py network_policy_spec renders it: one rule "
    "from podSelector = the policy's own podSelector (every port), one rule from namespaceSelector "
    f"{{{ROUTER_LABEL}: ''}} (no podSelector) for the routed proxies' ports only (core/servers.py router_ports)."
)
HOST_NETWORK = (
    "on OVN-Kubernetes a peer with a podSelector, even {}, holds the router pods' own IPs only, never the node "
    "addresses a host-network router's traffic arrives from (ovn-org/ovn-kubernetes "
    "go-controller/pkg/ovn/base_network_controller_policy.go, useNamespaceAddrSet: namespace address sets serve "
    "only a nil podSelector), so every Route answers 503 unless a router replica runs on the pod's node"
)


def _port(value: Any) -> int | str | None:
    """A port as a number or a name; the served pack sees numbers as floats (protobuf Struct), 18080.0 is 18080."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value) if value.isdigit() else value
    return None


def _routed_ports(resources: Sequence[Resource], workloads: list[_Workload]) -> set[int | str]:
    """Pod ports (numbers and names) that a rendered Route leads to through its Service."""
    services = [r for r in resources if r.is_kubernetes and r.kind == "Service"]
    found: set[int | str] = set()
    for route in resources:
        if not route.is_kubernetes or route.kind != "Route":
            continue
        target = _get(route.spec, "port", "targetPort")
        for backend in [_m(route.spec.get("to")), *map(_m, _seq(route.spec.get("alternateBackends")))]:
            name = _str(backend.get("name"))
            for service in (s for s in services if s.name == name and _same_ns(s.namespace, route.namespace)):
                selector = _m(service.spec.get("selector"))
                selected = [w for w in workloads if selector and _same_ns(w.res.namespace, service.namespace) and _selects(selector, w)]
                for port in _service_ports(service, target):
                    pod_port = port.get("targetPort", port.get("port"))
                    for workload in selected:
                        for _, cport in _container_ports(workload.spec, pod_port):
                            found |= {p for p in (_port(cport.get("name")), _port(cport.get("containerPort"))) if p is not None}
    return found


def _is_own(peer: Mapping[str, Any], own: Mapping[str, Any]) -> bool:
    keys = set(peer)
    match = _m(_m(peer.get("podSelector")).get("matchLabels"))
    return keys == {"podSelector"} and not _seq(_m(peer.get("podSelector")).get("matchExpressions")) and bool(own) and match == own


def _is_router_namespace(peer: Mapping[str, Any]) -> bool:
    """The peer selects exactly the router's namespaces (whatever its podSelector)."""
    ns = _m(peer.get("namespaceSelector"))
    labels = dict(_m(ns.get("matchLabels")))
    return set(peer) <= {"namespaceSelector", "podSelector"} and set(ns) == {"matchLabels"} and labels == {ROUTER_LABEL: ""}


def _is_router(peer: Mapping[str, Any]) -> bool:
    """The router as OVN-Kubernetes admits it from the host network too: its namespaces, podSelector absent (nil)."""
    return _is_router_namespace(peer) and "podSelector" not in peer


def _peer_unknown(peer: Mapping[str, Any]) -> bool:
    return any(is_unknown(v) for _, v in _walk(peer))


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, node


def _describe(peer: Mapping[str, Any]) -> str:
    if "ipBlock" in peer:
        return f"the IP block {_m(peer.get('ipBlock')).get('cidr', '?')}"
    if "namespaceSelector" in peer:
        return f"namespaces {dict(_m(_m(peer.get('namespaceSelector')).get('matchLabels'))) or 'of any label'} (not the router's)"
    match = _m(_m(peer.get("podSelector")).get("matchLabels"))
    return f"pods labelled {dict(match)}" if match else "every pod of the namespace (empty podSelector)"


def _router_port_problems(rule: Mapping[str, Any], routed: set[int | str]) -> Iterator[str]:
    ports = [p for p in _seq(rule.get("ports")) if isinstance(p, Mapping)]
    if not ports:
        yield "admits the router on every port (no `ports`)"
        return
    for entry in ports:
        if is_unknown(entry.get("port")) or is_unknown(entry.get("endPort")):
            continue
        port, end = _port(entry.get("port")), _port(entry.get("endPort"))
        if port is None:
            yield f"admits the router on every {entry.get('protocol', 'TCP')} port (a ports entry without `port`)"
        elif end is not None and end != port:
            yield f"admits the router on the range {port}-{end}"
        elif entry.get("protocol", "TCP") != "TCP":
            yield f"admits the router on {entry.get('protocol')} port {port}"
        elif port not in routed:
            yield f"admits the router on port {port!r}, which no Route of the stack leads to"


def check_ingress_by_design(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    workloads = _workloads(resources)
    routed = _routed_ports(resources, workloads)
    for pol in resources:
        if not pol.is_kubernetes or pol.kind != "NetworkPolicy" or pol.is_patch:
            continue
        own_sel = _m(pol.spec.get("podSelector"))
        if is_unknown(own_sel) or any(is_unknown(v) for v in _m(own_sel.get("matchLabels")).values()):
            continue
        own = _m(own_sel.get("matchLabels"))
        for i, rule in enumerate(_seq(pol.spec.get("ingress"))):
            if is_unknown(rule) or not isinstance(rule, Mapping):
                continue
            peers = [p for p in _seq(rule.get("from")) if isinstance(p, Mapping)]
            if not peers:
                yield pol, f"ingress[{i}] has no `from`: it admits every source (every namespace, any routed address). {FIX}"
                continue
            for peer in peers:
                if _peer_unknown(peer) or _is_own(peer, own):
                    continue
                if _is_router(peer):
                    for problem in _router_port_problems(rule, routed):
                        yield pol, f"ingress[{i}] {problem}. {FIX}"
                    continue
                if _is_router_namespace(peer):
                    yield pol, f"ingress[{i}] names the router's namespaces with a podSelector: {HOST_NETWORK}. {FIX}"
                    continue
                yield pol, f"ingress[{i}] admits {_describe(peer)}: only the policy's own pods and the router may be sources. {FIX}"


POLICY = PolicySpec(
    "ingress-by-design",
    MANDATORY,
    "stack",
    "Every ingress rule of the stack's NetworkPolicies names its sources; each source is the policy's own pods "
    f"(podSelector equal to the policy's) or the router (namespaceSelector {ROUTER_LABEL}: '' and no podSelector), "
    "and the router reaches only pod ports that a rendered Route leads to (no ranges, no rule without ports).",
    "Keep the stack's <app>-ssh NetworkPolicy as components/devloop.py network_policy_spec renders it; a new routed "
    "server gets its router port from its row in core/servers.py.",
    check_ingress_by_design,
    order=11,
)
