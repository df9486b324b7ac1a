"""The NetworkPolicy evaluator of tests/podsim/netpol.py on hand-made policies (no namespaces needed).

Each case is a rule of the NetworkPolicy API (kubernetes pkg/apis/networking/types.go) the evaluator must get
right before its verdicts on the rendered policy mean anything (tests/podsim/test_reach.py enforces those).
"""

from __future__ import annotations

from typing import Any

from tests.podsim.netpol import (
    HOST_NETWORK_NAMESPACE,
    OTHER_NODE_MANAGEMENT_IP,
    ROUTER_LABEL,
    Allow,
    Endpoint,
    allowed,
    iptables_rules,
    selects,
)

NS = "team"
APP = {"app": "a"}
ME = Endpoint("a-0", NS, {"kubernetes.io/metadata.name": NS}, APP, "10.128.0.10")
MATE = Endpoint("a-1", NS, {"kubernetes.io/metadata.name": NS}, APP, "10.128.0.11")
NEIGHBOUR = Endpoint("b-0", NS, {"kubernetes.io/metadata.name": NS}, {"app": "b"}, "10.128.0.12")
FOREIGN = Endpoint("x-0", "other", {"kubernetes.io/metadata.name": "other"}, APP, "10.128.0.200")
ROUTER = Endpoint("r-0", "openshift-ingress", {"kubernetes.io/metadata.name": "openshift-ingress", ROUTER_LABEL: ""}, {}, "10.128.0.201")
HOST_NS = {"kubernetes.io/metadata.name": HOST_NETWORK_NAMESPACE, ROUTER_LABEL: ""}
# a host-network router on another node: its source, that node's management-port IP
NODE = Endpoint("node-1", HOST_NETWORK_NAMESPACE, HOST_NS, {}, OTHER_NODE_MANAGEMENT_IP, host_network=True)
EVERYONE = [ME, MATE, NEIGHBOUR, FOREIGN, ROUTER, NODE]


def policy(ingress: list[dict[str, Any]], selector: dict[str, Any] | None = None, types: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": {"matchLabels": APP} if selector is None else selector, "ingress": ingress}
    if types is not None:
        spec["policyTypes"] = types
    return {"metadata": {"name": "p", "namespace": NS}, "spec": spec}


def sources(allows: list[Allow] | None) -> set[str | None]:
    assert allows is not None
    return {a.source for a in allows}


def test_selectors() -> None:
    assert selects({}, {}) and selects(None, {"a": "b"})
    assert selects({"matchLabels": {"a": "b"}}, {"a": "b", "c": "d"}) and not selects({"matchLabels": {"a": "b"}}, {"a": "c"})
    expr = {"matchExpressions": [{"key": "t", "operator": "In", "values": ["x", "y"]}, {"key": "n", "operator": "DoesNotExist"}]}
    assert selects(expr, {"t": "y"}) and not selects(expr, {"t": "z"}) and not selects(expr, {"t": "x", "n": ""})
    assert selects({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["x"]}]}, {})
    assert not selects({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {})


def test_an_unselected_pod_or_an_egress_only_policy_isolates_nothing() -> None:
    assert allowed(NEIGHBOUR, [policy([])], EVERYONE, {}) is None
    assert allowed(ME, [policy([], types=["Egress"])], EVERYONE, {}) is None
    assert allowed(ME, [policy([], types=["Ingress", "Egress"])], EVERYONE, {}) == []  # isolated, nothing admitted
    assert iptables_rules(None) == "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"


def test_peers() -> None:
    own = policy([{"from": [{"podSelector": {"matchLabels": APP}}]}])
    assert sources(allowed(ME, [own], EVERYONE, {})) == {ME.ip, MATE.ip}  # podSelector alone: this namespace only
    every_pod_here = policy([{"from": [{"podSelector": {}}]}])
    assert sources(allowed(ME, [every_pod_here], EVERYONE, {})) == {ME.ip, MATE.ip, NEIGHBOUR.ip}
    router = policy([{"from": [{"namespaceSelector": {"matchLabels": {ROUTER_LABEL: ""}}, "podSelector": {}}]}])
    assert sources(allowed(ME, [router], EVERYONE, {})) == {ROUTER.ip}
    anywhere = policy([{}])  # no `from`: every source
    assert sources(allowed(ME, [anywhere], EVERYONE, {})) == {None}
    block = policy([{"from": [{"ipBlock": {"cidr": "10.128.0.0/24", "except": ["10.128.0.200/31"]}}]}])
    assert sources(allowed(ME, [block], EVERYONE, {})) == {ME.ip, MATE.ip, NEIGHBOUR.ip}
    assert sources(allowed(ME, [own, router], EVERYONE, {})) == {ME.ip, MATE.ip, ROUTER.ip}  # policies add up


def test_ports() -> None:
    ports = [{"protocol": "TCP", "port": 1, "endPort": 2221}, {"protocol": "UDP"}, {"port": "web"}, {"port": "nope"}]
    allows = allowed(ME, [policy([{"from": [{"podSelector": {}}], "ports": ports}])], [MATE], {"web": 18080})
    assert allows == [Allow(MATE.ip, "TCP", 1, 2221), Allow(MATE.ip, "UDP", None, None), Allow(MATE.ip, "TCP", 18080, 18080)]
    text = iptables_rules(allows)
    assert f"-A INPUT -i eth0 -s {MATE.ip}/32 -p tcp -m tcp --dport 1:2221 -j ACCEPT" in text
    assert f"-A INPUT -i eth0 -s {MATE.ip}/32 -p udp -j ACCEPT" in text
    assert f"-A INPUT -i eth0 -s {MATE.ip}/32 -p tcp -m tcp --dport 18080 -j ACCEPT" in text
    lines = text.splitlines()
    assert lines.index("-A INPUT -i eth0 -s 10.128.0.1/32 -j ACCEPT") < lines.index("-A INPUT -i eth0 -j DROP")
    assert "-A INPUT -i eth0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT" in lines


def test_the_range_policy_the_stack_rendered_before_admits_a_foreign_pod() -> None:
    """The `<app>-ssh` policy before issue 25 (2222 from the stack, 1-2221/2223-65535/UDP from anywhere)."""
    old = policy(
        [
            {"from": [{"podSelector": {"matchLabels": APP}}], "ports": [{"protocol": "TCP", "port": 2222}]},
            {
                "ports": [
                    {"protocol": "TCP", "port": 1, "endPort": 2221},
                    {"protocol": "TCP", "port": 2223, "endPort": 65535},
                    {"protocol": "UDP"},
                ]
            },
        ]
    )
    allows = allowed(ME, [old], EVERYONE, {})
    assert allows is not None
    foreign = [a for a in allows if a.source is None]
    assert any(a.low is not None and a.high is not None and a.low <= 9099 <= a.high for a in foreign)
    assert not any(a.low is not None and a.high is not None and a.low <= 2222 <= a.high for a in foreign)


def test_a_nil_pod_selector_is_the_namespaces_address_set_and_an_empty_one_is_not() -> None:
    """OVN-Kubernetes base_network_controller_policy.go useNamespaceAddrSet: namespaceSelector + nil podSelector uses
    the namespace address sets (the host-network namespace's holds every node's management-port IP, master.go
    addIPToHostNetworkNamespaceAddrSet); any podSelector, `{}` included, holds pod-network pods only."""
    router_ns = {"matchLabels": {ROUTER_LABEL: ""}}
    nil = policy([{"from": [{"namespaceSelector": router_ns}]}])
    empty = policy([{"from": [{"namespaceSelector": router_ns, "podSelector": {}}]}])
    assert sources(allowed(ME, [nil], EVERYONE, {})) == {ROUTER.ip, NODE.ip}
    assert sources(allowed(ME, [empty], EVERYONE, {})) == {ROUTER.ip}  # the host-network router's source is not in it
    labelled = policy([{"from": [{"namespaceSelector": router_ns, "podSelector": {"matchLabels": {}}}]}])
    assert sources(allowed(ME, [labelled], EVERYONE, {})) == {ROUTER.ip}
    # an empty namespaceSelector with a nil podSelector: every namespace's set, the host-network one included
    every_namespace = policy([{"from": [{"namespaceSelector": {}}]}])
    assert sources(allowed(ME, [every_namespace], EVERYONE, {})) == {e.ip for e in EVERYONE}
    every_pod = policy([{"from": [{"namespaceSelector": {}, "podSelector": {}}]}])
    assert sources(allowed(ME, [every_pod], EVERYONE, {})) == {e.ip for e in EVERYONE} - {NODE.ip}
    # a podSelector alone never holds a host-network address, even one in the policy's own namespace
    host_here = Endpoint("node-2", NS, ME.namespace_labels, APP, "10.128.4.2", host_network=True)
    own = policy([{"from": [{"podSelector": {"matchLabels": APP}}]}])
    assert sources(allowed(ME, [own], [*EVERYONE, host_here], {})) == {ME.ip, MATE.ip}
    # an ipBlock matches addresses, whoever holds them
    block = policy([{"from": [{"ipBlock": {"cidr": "10.128.2.0/23"}}]}])
    assert sources(allowed(ME, [block], EVERYONE, {})) == {NODE.ip}
    ports = [{"protocol": "TCP", "port": 8443}]
    text = iptables_rules(allowed(ME, [policy([{"from": [{"namespaceSelector": router_ns}], "ports": ports}])], EVERYONE, {}))
    assert f"-A INPUT -i eth0 -s {NODE.ip}/32 -p tcp -m tcp --dport 8443 -j ACCEPT" in text
    empty_with_ports = policy([{"from": [{"namespaceSelector": router_ns, "podSelector": {}}], "ports": ports}])
    text = iptables_rules(allowed(ME, [empty_with_ports], EVERYONE, {}))
    assert f"-s {NODE.ip}/32" not in text and f"-s {ROUTER.ip}/32 -p tcp -m tcp --dport 8443 -j ACCEPT" in text
