"""Policy `ssh-only-from-stack-pods`: the SSH port of the stack's pods is reachable from those pods only."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from components import devloop
from policy.rules import evaluate
from tests.policy.objects import NS, Item, container, item, meta, statefulset

POLICY = "ssh-only-from-stack-pods"
SELECTOR = {"app": "app"}


def sshd_workload(annotated: bool = True, port_name: bool = False) -> Item:
    ports = [{"name": "ssh", "containerPort": 2222}] if port_name else []
    typ, obj, opts = statefulset("app", [container("main", ports=ports)])
    if annotated:
        obj["spec"]["template"]["metadata"]["annotations"] = {"ml-dev-env/ssh-port": "2222"}
    return typ, obj, opts


def network_policy(spec: dict[str, Any], name: str = "app-ssh", namespace: str = NS) -> Item:
    return item(
        "kubernetes:networking.k8s.io/v1:NetworkPolicy",
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {**meta(name), "namespace": namespace},
            "spec": spec,
        },
    )


def good() -> dict[str, Any]:
    return devloop.network_policy_spec(SELECTOR, (18080,))


def messages(*items: Item) -> list[str]:
    return [v.message for v in evaluate(items, policies=[POLICY])]


def test_the_stacks_policy_admits_ssh_from_its_own_pods_only() -> None:
    assert messages(sshd_workload(), network_policy(good())) == []
    assert messages(sshd_workload(port_name=True), network_policy(good())) == []


def test_pods_without_sshd_are_not_judged() -> None:
    assert messages(sshd_workload(annotated=False)) == []


@pytest.mark.parametrize("namespace", [NS, "elsewhere"])
def test_sshd_pods_without_a_selecting_policy_fail(namespace: str) -> None:
    items = [sshd_workload()] + ([network_policy(good(), namespace=namespace)] if namespace != NS else [])
    found = messages(*items)
    assert len(found) == 1 and "no NetworkPolicy with Ingress rules selects its pods" in found[0]
    other = copy.deepcopy(good())
    other["podSelector"] = {"matchLabels": {"app": "other"}}
    assert len(messages(sshd_workload(), network_policy(other))) == 1


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ({"namespaceSelector": {}}, "other namespaces"),
        ({"ipBlock": {"cidr": "0.0.0.0/0"}}, "IP block 0.0.0.0/0"),
        ({"podSelector": {}}, "empty podSelector"),
        ({"podSelector": {"matchLabels": {"team": "x"}}}, "not exactly this stack's pods"),
    ],
)
def test_a_wider_ssh_peer_fails(peer: dict[str, Any], expected: str) -> None:
    spec = good()
    spec["ingress"][0]["from"] = [peer]
    found = messages(sshd_workload(), network_policy(spec))
    assert len(found) == 1 and expected in found[0] and "ingress[0]" in found[0]


@pytest.mark.parametrize(
    "ports",
    [
        None,  # no ports: every port, SSH included
        [{"protocol": "TCP", "port": 1, "endPort": 65535}],
        [{"protocol": "TCP", "port": 2222}],
        [{"port": "ssh"}],
    ],
)
def test_an_other_ports_rule_that_covers_ssh_fails(ports: list[dict[str, Any]] | None) -> None:
    spec = good()
    spec["ingress"][1] = {} if ports is None else {"ports": ports}
    found = messages(sshd_workload(port_name=True), network_policy(spec))
    assert len(found) == 1 and "admits every source (no `from`)" in found[0] and "ingress[1]" in found[0]


def test_udp_and_ranges_around_the_ssh_port_pass() -> None:
    spec = good()
    spec["ingress"][1] = {
        "from": [{"podSelector": {}}],
        "ports": [{"protocol": "UDP", "port": 2222}, {"protocol": "TCP", "port": 1, "endPort": 2221}, {"protocol": "TCP", "port": 2223}],
    }
    assert messages(sshd_workload(), network_policy(spec)) == []
