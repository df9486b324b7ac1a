"""Policy `ingress-by-design`: the stack's NetworkPolicy admits its own pods and the router's routed ports, nothing else.

One failing example per forbidden shape, the stacks' own rendered policies pass, and the policy the stack
rendered before (SSH from the stack's pods, every other port from anywhere) fails.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from components import devloop
from core import servers
from policy.rules import evaluate
from tests.policy.objects import NS, UNKNOWN, Item, container, item, meta, oauth_proxy, route, service, stack_items, statefulset

POLICY = "ingress-by-design"
SELECTOR = {"app": "app"}
ROUTER = {"namespaceSelector": {"matchLabels": {devloop.ROUTER_NAMESPACE_LABEL: ""}}}


def network_policy(spec: dict[str, Any]) -> Item:
    return item(
        "kubernetes:networking.k8s.io/v1:NetworkPolicy",
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("app-ssh"), "spec": spec},
    )


def routed_app() -> list[Item]:
    """A pod with a main container (2222, 29500) and an OAuth proxy on 18080, routed through Service `app`."""
    main = container("main", ports=[{"name": "master", "containerPort": 29500}, {"name": "ssh", "containerPort": 2222}])
    return [
        statefulset("app", [main, oauth_proxy("p-web", 18080)]),
        service("app", SELECTOR, [{"name": "web", "port": 8080, "targetPort": "p-web"}]),
        route("app-web", "app", "web"),
    ]


def good() -> dict[str, Any]:
    return devloop.network_policy_spec(SELECTOR, (18080,))


def messages(spec: dict[str, Any], items: list[Item] | None = None) -> list[str]:
    return [v.message for v in evaluate([*(routed_app() if items is None else items), network_policy(spec)], policies=[POLICY])]


def test_the_designed_policy_passes() -> None:
    assert messages(good()) == []


def test_named_router_port_of_a_routed_proxy_passes() -> None:
    spec = good()
    spec["ingress"][1]["ports"] = [{"protocol": "TCP", "port": "p-web"}]
    assert messages(spec) == []


@pytest.mark.parametrize("stack", ["barcelona", "nerc-production"])
def test_every_stacks_rendered_policy_passes_and_admits_only_its_router_ports(stack: str) -> None:
    items = stack_items(stack)
    assert [v.message for v in evaluate(items, policies=[POLICY])] == []
    (pol,) = [obj for typ, obj, _ in items if typ.endswith(":NetworkPolicy")]
    own, router = pol["spec"]["ingress"]
    assert own == {"from": [{"podSelector": pol["spec"]["podSelector"]}]}, "every port and protocol from the stack's pods"
    assert router["from"] == [ROUTER]
    routed = {obj["spec"]["port"]["targetPort"] for typ, obj, _ in items if typ.endswith(":Route")}
    assert routed, "the stacks route their dev servers"
    assert sorted(p["port"] for p in router["ports"]) == sorted(
        s.router_port("oauth-proxy") for s in servers.DEV_SERVERS if s.name in routed
    )


def test_numbers_as_the_served_pack_sees_them_are_ports() -> None:
    """pulumi-policy hands numbers over as floats (protobuf Struct)."""
    items = routed_app()
    items[0][1]["spec"]["template"]["spec"]["containers"][1]["ports"][0]["containerPort"] = 18080.0
    spec = good()
    spec["ingress"][1]["ports"] = [{"protocol": "TCP", "port": 18080.0}]
    assert messages(spec, items) == []
    spec["ingress"][1]["ports"] = [{"protocol": "TCP", "port": 2222.0}]
    assert len(messages(spec, items)) == 1


def test_no_routed_server_means_no_router_rule() -> None:
    assert devloop.network_policy_spec(SELECTOR, ())["ingress"] == [{"from": [{"podSelector": {"matchLabels": SELECTOR}}]}]


def test_token_mode_opens_the_servers_own_ports_to_the_router() -> None:
    rows = [s for s in servers.DEV_SERVERS if s.name in ("vscode", "jupyter")]
    assert servers.router_ports(rows, "token") == (8080, 8888)
    assert servers.router_ports(rows, "oauth-proxy") == (18080, 18888)


def test_the_policy_rendered_before_fails() -> None:
    """SSH from the stack's pods, every other TCP port and all UDP from anywhere."""
    old = {
        "podSelector": {"matchLabels": SELECTOR},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": SELECTOR}}], "ports": [{"protocol": "TCP", "port": 2222}]},
            {
                "ports": [
                    {"protocol": "TCP", "port": 1, "endPort": 2221},
                    {"protocol": "TCP", "port": 2223, "endPort": 65535},
                    {"protocol": "UDP", "port": 1, "endPort": 65535},
                ]
            },
        ],
    }
    found = messages(old)
    assert len(found) == 1 and "ingress[1] has no `from`" in found[0], found


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ({"podSelector": {}}, "every pod of the namespace"),
        ({"podSelector": {"matchLabels": {"team": "x"}}}, "pods labelled {'team': 'x'}"),
        ({"podSelector": {"matchLabels": {"app": "app", "extra": "1"}}}, "pods labelled"),
        ({"namespaceSelector": {}}, "namespaces of any label"),
        ({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}, "namespaces {'kubernetes.io/metadata.name'"),
        ({"namespaceSelector": {}, "podSelector": {"matchLabels": SELECTOR}}, "namespaces of any label"),
        ({"ipBlock": {"cidr": "0.0.0.0/0"}}, "the IP block 0.0.0.0/0"),
        ({"ipBlock": {"cidr": "10.128.0.0/14"}}, "the IP block 10.128.0.0/14"),
    ],
)
def test_a_peer_other_than_the_stacks_pods_or_the_router_fails(peer: dict[str, Any], expected: str) -> None:
    spec = good()
    spec["ingress"][0]["from"] = [peer]
    found = messages(spec)
    assert len(found) == 1 and found[0].startswith(f"ingress[0] admits {expected}"), found


def test_the_rendered_router_peer_has_no_pod_selector() -> None:
    """Not even `{}`: OVN-Kubernetes serves a host-network router only to a nil podSelector (useNamespaceAddrSet)."""
    (router_rule,) = [r for r in good()["ingress"] if "ports" in r]
    assert router_rule["from"] == [ROUTER] and "podSelector" not in router_rule["from"][0]


@pytest.mark.parametrize("pods", [{}, {"matchLabels": {"ingresscontroller.operator.openshift.io/deployment-ingresscontroller": "default"}}])
def test_a_router_peer_with_any_pod_selector_fails_citing_ovn_kubernetes(pods: dict[str, Any]) -> None:
    """The shape issue 25 prescribed (`podSelector: {}`) admits only router pods on the pod network: 503 behind a
    host-network router (the default on bare metal)."""
    spec = good()
    spec["ingress"][1]["from"] = [{**ROUTER, "podSelector": pods}]
    found = messages(spec)
    assert len(found) == 1, found
    assert found[0].startswith("ingress[1] names the router's namespaces with a podSelector"), found
    assert "useNamespaceAddrSet" in found[0] and "503" in found[0]


@pytest.mark.parametrize(
    "router",
    [
        {"namespaceSelector": {"matchLabels": {devloop.ROUTER_NAMESPACE_LABEL: "", "more": "labels"}}},
        {"namespaceSelector": {"matchExpressions": [{"key": devloop.ROUTER_NAMESPACE_LABEL, "operator": "Exists"}]}},
    ],
)
def test_a_router_look_alike_is_not_the_router(router: dict[str, Any]) -> None:
    spec = good()
    spec["ingress"][1]["from"] = [router]
    found = messages(spec)
    assert len(found) == 1 and "ingress[1] admits namespaces" in found[0], found


def test_the_legacy_router_label_alone_is_not_the_router() -> None:
    spec = good()
    spec["ingress"][1]["from"] = [{"namespaceSelector": {"matchLabels": {"network.openshift.io/policy-group": "ingress"}}}]
    assert len(messages(spec)) == 1


@pytest.mark.parametrize(
    ("ports", "expected"),
    [
        (None, "admits the router on every port (no `ports`)"),
        ([{"protocol": "TCP", "port": 2222}], "router on port 2222, which no Route of the stack leads to"),
        ([{"protocol": "TCP", "port": 29500}], "router on port 29500"),
        ([{"protocol": "TCP", "port": "ssh"}], "router on port 'ssh'"),
        ([{"protocol": "TCP", "port": 18080, "endPort": 18090}], "router on the range 18080-18090"),
        ([{"protocol": "UDP", "port": 18080}], "router on UDP port 18080"),
        ([{"protocol": "TCP"}], "router on every TCP port"),
    ],
)
def test_router_access_to_a_port_that_is_not_a_routed_proxys_fails(ports: list[dict[str, Any]] | None, expected: str) -> None:
    spec = good()
    if ports is None:
        del spec["ingress"][1]["ports"]
    else:
        spec["ingress"][1]["ports"] = ports
    found = messages(spec)
    assert len(found) == 1 and expected in found[0], found


def test_a_router_port_is_routed_only_while_a_route_leads_to_it() -> None:
    unrouted = [i for i in routed_app() if not i[0].endswith(":Route")]
    found = messages(good(), unrouted)
    assert len(found) == 1 and "port 18080, which no Route" in found[0]


def test_a_rule_without_from_fails_whatever_its_ports() -> None:
    spec = good()
    spec["ingress"].append({"ports": [{"protocol": "TCP", "port": 18080}]})
    found = messages(spec)
    assert len(found) == 1 and found[0].startswith("ingress[2] has no `from`")


def test_every_mistake_of_a_policy_is_reported() -> None:
    spec = good()
    spec["ingress"] = [{}, {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, ROUTER], "ports": [{"protocol": "TCP", "port": 2222}]}]
    found = messages(spec)
    assert [m.split(":")[0].split(" admits")[0].split(" has")[0] for m in found] == ["ingress[0]", "ingress[1]", "ingress[1]"], found


def test_unknown_values_are_not_judged() -> None:
    spec = good()
    spec["ingress"][0]["from"] = [{"podSelector": {"matchLabels": {"app": UNKNOWN}}}]
    assert messages(spec) == []
    other = copy.deepcopy(good())
    other["podSelector"] = {"matchLabels": {"app": UNKNOWN}}
    assert messages(other) == []


def test_policies_of_another_namespace_are_judged_too() -> None:
    spec = good()
    spec["ingress"][0]["from"] = [{"podSelector": {}}]
    typ, obj, opts = network_policy(spec)
    obj["metadata"]["namespace"] = "elsewhere"
    assert obj["metadata"]["namespace"] != NS
    assert len([v for v in evaluate([*routed_app(), (typ, obj, opts)], policies=[POLICY])]) == 1
