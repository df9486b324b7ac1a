"""Policy rule: the SSH port of the stack's pods admits only the stack's own pods (dev loop).

Pods running the stack's sshd (pod-template annotation `ml-dev-env/ssh-port`, or a container port named `ssh`)
must be selected by a NetworkPolicy whose every ingress rule that admits the SSH port admits only podSelector
peers at least as specific as the workload's own selector. Policy `ssh-only-from-stack-pods` (`POLICY` below).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .query import (
    MANDATORY,
    POD_SPEC_PATHS,
    PolicySpec,
    Resource,
    _get,
    _m,
    _same_ns,
    _seq,
    _Workload,
    _workloads,
    is_unknown,
    pod_containers,
)

SSH_PORT_ANNOTATION = "ml-dev-env/ssh-port"


def _template_annotations(res: Resource) -> Mapping[str, Any]:
    if res.kind == "Pod":
        return _m(res.metadata.get("annotations"))
    path = (*POD_SPEC_PATHS[res.kind][:-1], "metadata", "annotations")
    return _m(_get(res.inputs, *path))


def _ssh_ports(workload: _Workload) -> set[int | str]:
    """The SSH port of a workload: the annotation's number, and the name/number of a container port named `ssh`."""
    ports: set[int | str] = set()
    raw = _template_annotations(workload.res).get(SSH_PORT_ANNOTATION)
    if isinstance(raw, str) and raw.isdigit():
        ports.add(int(raw))
    for container in pod_containers(workload.spec):
        for port in _seq(container.get("ports")):
            if isinstance(port, Mapping) and port.get("name") == "ssh":
                ports.add("ssh")
                if isinstance(port.get("containerPort"), int):
                    ports.add(port["containerPort"])
    return ports


def _label_selector_selects(selector: Any, labels: Mapping[str, Any]) -> bool | None:
    """True/False for a matchLabels-only selector; None when it has matchExpressions (not judged) or is unknown."""
    sel = _m(selector)
    if _seq(sel.get("matchExpressions")) or any(is_unknown(v) for v in _m(sel.get("matchLabels")).values()):
        return None
    return all(labels.get(k) == v for k, v in _m(sel.get("matchLabels")).items())


def _rule_admits(rule: Mapping[str, Any], ports: set[int | str]) -> bool:
    """Whether an ingress rule's `ports` admit one of the SSH ports (no `ports`: every port)."""
    entries = [p for p in _seq(rule.get("ports")) if isinstance(p, Mapping)]
    if not entries:
        return True
    numbers = {p for p in ports if isinstance(p, int)}
    for entry in entries:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        port, end = entry.get("port"), entry.get("endPort")
        if port is None or port in ports:
            return True
        if isinstance(port, int) and any(port <= n <= (end if isinstance(end, int) else port) for n in numbers):
            return True
    return False


def _peer_problem(peer: Mapping[str, Any], workload: _Workload, own_selector: Mapping[str, Any]) -> str | None:
    if "ipBlock" in peer:
        return f"admits the IP block {_m(peer.get('ipBlock')).get('cidr', '?')}"
    if "namespaceSelector" in peer:
        return "admits pods of other namespaces (namespaceSelector)"
    if "podSelector" not in peer:
        return "has a peer that selects nothing specific"
    match = _m(_m(peer.get("podSelector")).get("matchLabels"))
    if _seq(_m(peer.get("podSelector")).get("matchExpressions")):
        return None  # expressions: not judged
    if not match:
        return "admits every pod of the namespace (empty podSelector)"
    if any(is_unknown(v) for v in match.values()):
        return None
    if not all(workload.labels.get(k) == v for k, v in match.items()) or not all(match.get(k) == v for k, v in own_selector.items()):
        return f"admits pods labelled {dict(match)}, not exactly this stack's pods {dict(own_selector)}"
    return None


def check_ssh_only_from_stack_pods(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    policies = [r for r in resources if r.is_kubernetes and r.kind == "NetworkPolicy" and not r.is_patch]
    for workload in _workloads(resources):
        ports = _ssh_ports(workload)
        if not ports:
            continue
        own = _m(_get(workload.res.spec, "selector", "matchLabels")) or workload.labels
        shown = "/".join(str(p) for p in sorted(ports, key=str))
        selecting, undecided = [], False
        for pol in policies:
            if not _same_ns(pol.namespace, workload.res.namespace):
                continue
            types = _seq(pol.spec.get("policyTypes"))
            if types and "Ingress" not in types:
                continue
            selects = _label_selector_selects(pol.spec.get("podSelector"), workload.labels)
            undecided = undecided or selects is None
            if selects:
                selecting.append(pol)
        if undecided:
            continue  # a selector with unknowns or expressions: not judged
        if not selecting:
            yield (
                workload.res,
                (
                    f"runs sshd on port {shown} but no NetworkPolicy with Ingress rules selects its pods, so every pod in the "
                    "cluster can reach it. Fix: a NetworkPolicy selecting these pods whose only rule for the SSH port admits "
                    "podSelector = the workload's selector (components/devloop.py network_policy_spec)."
                ),
            )
            continue
        for pol in selecting:
            for i, rule in enumerate(_seq(pol.spec.get("ingress"))):
                if not isinstance(rule, Mapping) or not _rule_admits(rule, ports):
                    continue
                peers = [p for p in _seq(rule.get("from")) if isinstance(p, Mapping)]
                problems = (
                    ["admits every source (no `from`)"]
                    if not peers
                    else [msg for msg in (_peer_problem(p, workload, own) for p in peers) if msg]
                )
                for problem in problems:
                    yield (
                        pol,
                        (
                            f"ingress[{i}] {problem} on the SSH port {shown} of {workload.res.label}. Fix: admit the SSH port only "
                            f"from podSelector {dict(own)}, and leave it out of the router's rule (devloop.py network_policy_spec)."
                        ),
                    )


POLICY = PolicySpec(
    "ssh-only-from-stack-pods",
    MANDATORY,
    "stack",
    "Pods running the stack's sshd (pod-template annotation ml-dev-env/ssh-port, or a container port named ssh) are "
    "selected by a NetworkPolicy, and every ingress rule that admits the SSH port admits only podSelector peers "
    "at least as specific as the workload's own selector (no namespaceSelector, ipBlock or empty selector).",
    "Keep the stack's <app>-ssh NetworkPolicy (components/devloop.py network_policy_spec): every port from the "
    "stack's pods; the router's rule lists only the routed proxies' ports, never the SSH port.",
    check_ssh_only_from_stack_pods,
    order=10,
)
