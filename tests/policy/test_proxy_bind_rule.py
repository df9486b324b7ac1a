"""Policy `proxies-bind-pod-ip`: OAuth proxies bind the pod IP, never a wildcard.

A failing example per forbidden shape, the committed stacks' rendered proxies pass, and the args the stacks
rendered before (`--http-address=:<port>`) fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from policy.rules import evaluate
from tests.policy.objects import UNKNOWN, container, oauth_proxy, stack_items, statefulset

POLICY = "proxies-bind-pod-ip"
POD_IP_ENV = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def messages(args: list[str], env: list[dict[str, Any]] | None = POD_IP_ENV) -> list[str]:
    proxy = {**oauth_proxy(), "args": ["--provider=openshift", *args]}
    if env is None:
        proxy.pop("env", None)
    else:
        proxy["env"] = env
    return [v.message for v in evaluate([statefulset("app", [container(), proxy])], policies=[POLICY])]


@pytest.mark.parametrize(
    "args",
    [
        ["--http-address=[$(POD_IP)]:18080", "--https-address="],
        ["--http-address=http://[$(POD_IP)]:18080", "--https-address="],
        ["--http-address", "10.128.0.10:18080", "--https-address", ""],
        ["--http-address=[fd01:0:0:1::a]:18080", "--https-address="],
        ["--https-address="],  # oauth-proxy's HTTP default is 127.0.0.1:4180
        ["--http-address=unix:///tmp/proxy.sock", "--https-address="],
    ],
)
def test_named_addresses_pass(args: list[str]) -> None:
    assert messages(args) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--http-address=:18080", "--https-address="], "--http-address=:18080 listens on every interface"),
        (["--http-address=0.0.0.0:18080", "--https-address="], "--http-address=0.0.0.0:18080 listens on every interface"),
        (["--http-address=[::]:18080", "--https-address="], "--http-address=[::]:18080 listens on every interface"),
        (["--http-address=http://:18080", "--https-address="], "listens on every interface"),
        (["--http-address=[$(POD_IP)]:18080"], "no --https-address (oauth-proxy's default ':8443') listens on every interface"),
        (["--http-address=[$(POD_IP)]:18080", "--https-address=:8443"], "--https-address=:8443 listens on every interface"),
        (["--http-address=[10.0.0.1]:1", "--http-address=:18080", "--https-address="], "--http-address=:18080"),  # last wins
    ],
)
def test_wildcards_fail(args: list[str], expected: str) -> None:
    found = messages(args)
    assert len(found) == 1 and expected in found[0] and "Fix:" in found[0], found


def test_an_undefined_pod_ip_fails() -> None:
    [found] = messages(["--http-address=[$(POD_IP)]:18080", "--https-address="], env=None)
    assert "names $(POD_IP) but the container defines no env POD_IP" in found


def test_unknown_args_are_not_judged() -> None:
    assert messages([UNKNOWN, "--https-address="]) == []


def test_other_containers_are_not_proxies() -> None:
    server = container("web", args=["--http-address=:8080"])
    assert evaluate([statefulset("app", [server])], policies=[POLICY]) == []


@pytest.mark.parametrize("stack", ["barcelona", "nerc-production"])
def test_every_stacks_rendered_proxies_pass_and_name_the_pod_ip(stack: str) -> None:
    items = stack_items(stack)
    assert evaluate(items, policies=[POLICY]) == []
    proxies = [
        c
        for typ, obj, _ in items
        if typ.endswith(":StatefulSet")
        for c in obj["spec"]["template"]["spec"]["containers"]
        if "--provider=openshift" in (c.get("args") or [])
    ]
    assert proxies, f"{stack} renders no OAuth proxy"
    for proxy in proxies:
        address = next(a for a in proxy["args"] if a.startswith("--http-address="))
        assert address.startswith("--http-address=[$(POD_IP)]:")
        assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in proxy["env"]
        # the stacks' rendering before this rule fails it
        before = [*(a for a in proxy["args"] if not a.startswith("--http-address=")), "--http-address=:" + address.rsplit(":", 1)[1]]
        old = statefulset("app", [container(), {**proxy, "args": before}])
        assert evaluate([old], policies=[POLICY]), "the old `:<port>` binding passes"
