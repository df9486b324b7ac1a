"""Policy rule: the OAuth proxies listen on the pod IP, never on a wildcard address.

An OpenShift OAuth proxy (`--provider=openshift`) in a pod template names the address it binds:
`--http-address=[$(POD_IP)]:<port>` (or another literal address), never `:<port>`, `0.0.0.0:<port>` or
`[::]:<port>`: a wildcard also answers on the pod's secondary interfaces (the SR-IOV `net1..N` of RDMA pods),
which NetworkPolicy does not cover. `$(POD_IP)` needs an env var POD_IP defined on that container (the kubelet
expands `$(VAR)` in args from the container's own env and leaves an undefined one as it is). The HTTPS listener
is off (`--https-address=` empty) or names an address too: openshift/oauth-proxy main.go defaults
`https-address` to ":8443", every interface. Policy `proxies-bind-pod-ip` (`POLICY` below).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .query import MANDATORY, PolicySpec, Resource, _seq, _str, is_unknown, pod_containers, pod_spec
from .routes_authenticated import is_oauth_proxy

WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")
FIX = (
    "Fix: `--http-address=[$(POD_IP)]:<port>` with env POD_IP from fieldRef status.podIP on that container and "
    "`--https-address=` (components/pod.py proxy_containers)."
)


def _flag(argv: list[str], name: str) -> str | None:
    """The last value of `--name=value` or `--name value` (Go's flag package: the last one wins)."""
    found = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            found = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            found = argv[i + 1]
    return found


def _host(address: str) -> str | None:
    """The host of `[scheme://]host:port` (None for a unix:// socket: no network listener)."""
    scheme, sep, rest = address.partition("://")
    if sep and scheme not in ("http", "https", "tcp", "tcp4", "tcp6"):
        return None
    rest = rest if sep else address
    host = rest.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _defines(container: Mapping[str, Any], name: str) -> bool:
    return any(isinstance(e, Mapping) and e.get("name") == name for e in _seq(container.get("env")))


def _problems(container: Mapping[str, Any]) -> Iterator[str]:
    argv = [a for a in _seq(container.get("command")) + _seq(container.get("args")) if isinstance(a, str)]
    if any(is_unknown(a) for a in _seq(container.get("args"))):
        return
    for flag, default in (("http-address", "127.0.0.1:4180"), ("https-address", ":8443")):
        value = _flag(argv, flag)
        address = default if value is None else value
        if flag == "https-address" and value == "":
            continue  # the HTTPS listener is off
        host = _host(address)
        if host is None:
            continue
        if host in WILDCARDS:
            shown = f"--{flag}={value}" if value is not None else f"no --{flag} (oauth-proxy's default {default!r})"
            yield f"{shown} listens on every interface of the pod"
            continue
        for var in re.findall(r"\$\((\w+)\)", host):
            if not _defines(container, var):
                yield f"--{flag}={value} names $({var}) but the container defines no env {var} (the kubelet leaves it unexpanded)"


def check_proxies_bind_pod_ip(res: Resource) -> Iterator[str]:
    spec = pod_spec(res)
    if spec is None:
        return
    for container in pod_containers(spec):
        if not is_oauth_proxy(container):
            continue
        name = _str(container.get("name")) or "?"
        for problem in _problems(container):
            yield f"OAuth proxy container {name!r}: {problem}. {FIX}"


POLICY = PolicySpec(
    "proxies-bind-pod-ip",
    MANDATORY,
    "resource",
    "Every OpenShift OAuth proxy (--provider=openshift) in a pod template binds a named address (the pod IP), "
    "never a wildcard: --http-address is not ':<port>', '0.0.0.0:<port>' or '[::]:<port>', --https-address is "
    "empty or named too (oauth-proxy's default ':8443' is every interface), and a $(VAR) in the address is an env "
    "var of that container.",
    "Render `--http-address=[$(POD_IP)]:<port>` with env POD_IP (fieldRef status.podIP) on the proxy container and "
    "`--https-address=` (components/pod.py proxy_containers).",
    check_proxies_bind_pod_ip,
    order=12,
)
