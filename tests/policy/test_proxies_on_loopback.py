"""Policy `proxies-on-loopback`: OAuth proxies listen on loopback, and the forward's list names each proxy port.

A failing example per forbidden shape (a wildcard, the pod IP: what the stacks rendered before, a port no forward
owns), the committed stacks' rendered proxies pass, and their rendering before this rule (`[$(POD_IP)]:<port>`) fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from inpod import contract
from policy.rules import evaluate, proxies_on_loopback
from tests.policy.objects import UNKNOWN, container, oauth_proxy, stack_items, statefulset

POLICY = "proxies-on-loopback"
POD_IP_ENV = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def main(ports: str | None = "18080") -> dict[str, Any]:
    return container(env=[] if ports is None else [{"name": contract.PROXY_PORTS_ENV, "value": ports}])


def messages(args: list[str], ports: str | None = "18080") -> list[str]:
    proxy = {**oauth_proxy(), "args": ["--provider=openshift", *args], "env": POD_IP_ENV}
    return [v.message for v in evaluate([statefulset("app", [main(ports), proxy])], policies=[POLICY])]


@pytest.mark.parametrize(
    "args",
    [
        ["--http-address=127.0.0.1:18080", "--https-address="],
        ["--http-address=http://127.0.0.1:18080", "--https-address="],
        ["--http-address", "127.0.0.1:18080", "--https-address", ""],
        ["--http-address=[::1]:18080", "--https-address="],
        ["--http-address=127.0.0.1:18080", "--https-address=127.0.0.1:18443"],
        ["--http-address=unix:///tmp/proxy.sock", "--https-address="],
    ],
)
def test_loopback_addresses_pass(args: list[str]) -> None:
    assert messages(args) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--http-address=:18080", "--https-address="], "--http-address=:18080 listens on every interface"),
        (["--http-address=0.0.0.0:18080", "--https-address="], "--http-address=0.0.0.0:18080 listens on every interface"),
        (["--http-address=[::]:18080", "--https-address="], "--http-address=[::]:18080 listens on every interface"),
        (["--http-address=http://:18080", "--https-address="], "listens on every interface"),
        (["--http-address=[$(POD_IP)]:18080", "--https-address="], "listens on '$(POD_IP)', not on loopback"),
        (["--http-address=10.128.0.10:18080", "--https-address="], "listens on '10.128.0.10', not on loopback"),
        (["--http-address=localhost:18080", "--https-address="], "listens on 'localhost', not on loopback"),
        (["--http-address=127.0.0.1:18080"], "no --https-address (oauth-proxy's default ':8443') listens on every interface"),
        (["--http-address=127.0.0.1:18080", "--https-address=:8443"], "--https-address=:8443 listens on every interface"),
        (["--http-address=127.0.0.1:1", "--http-address=:18080", "--https-address="], "--http-address=:18080"),  # last wins
    ],
)
def test_other_addresses_fail(args: list[str], expected: str) -> None:
    found = messages(args)
    assert len(found) == 1 and expected in found[0] and "Fix:" in found[0], found


@pytest.mark.parametrize("ports", [None, "", "18888", "180800"])
def test_a_port_no_forward_owns_fails(ports: str | None) -> None:
    [found] = messages(["--http-address=127.0.0.1:18080", "--https-address="], ports)
    assert f"port 18080 is in no container's env {contract.PROXY_PORTS_ENV}" in found, found


def test_oauth_proxys_default_http_address_is_loopback_and_needs_its_port_forwarded() -> None:
    assert messages(["--https-address="], "4180") == []  # main.go: http-address defaults to 127.0.0.1:4180
    assert messages(["--https-address="], "18080")


def test_the_rule_reads_the_contracts_env_name() -> None:
    assert proxies_on_loopback.PROXY_PORTS_ENV == contract.PROXY_PORTS_ENV


def test_unknown_args_are_not_judged() -> None:
    assert messages([UNKNOWN, "--https-address="]) == []


def test_other_containers_are_not_proxies() -> None:
    server = container("web", args=["--http-address=:8080"])
    assert evaluate([statefulset("app", [server])], policies=[POLICY]) == []


@pytest.mark.parametrize("stack", ["barcelona", "nerc-production"])
def test_every_stacks_rendered_proxies_pass_and_are_forwarded(stack: str) -> None:
    items = stack_items(stack)
    assert evaluate(items, policies=[POLICY]) == []
    pods = [obj["spec"]["template"]["spec"] for typ, obj, _ in items if typ.endswith(":StatefulSet")]
    proxies = [(pod, c) for pod in pods for c in pod["containers"] if "--provider=openshift" in (c.get("args") or [])]
    assert proxies, f"{stack} renders no OAuth proxy"
    for pod, proxy in proxies:
        address = next(a for a in proxy["args"] if a.startswith("--http-address="))
        port = address.rsplit(":", 1)[1]
        assert address == f"--http-address=127.0.0.1:{port}"
        [forwarded] = [e["value"] for c in pod["containers"] for e in c.get("env") or [] if e["name"] == contract.PROXY_PORTS_ENV]
        assert port in forwarded.split()
        # the stacks' rendering before this rule (the pod IP, no forward) fails
        before = [*(a for a in proxy["args"] if not a.startswith("--http-address=")), f"--http-address=[$(POD_IP)]:{port}"]
        old = statefulset("app", [container(), {**proxy, "args": before, "env": POD_IP_ENV}])
        assert evaluate([old], policies=[POLICY]), "the old `[$(POD_IP)]:<port>` binding passes"
