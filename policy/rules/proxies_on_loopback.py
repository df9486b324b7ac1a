"""Policy rule: the OAuth proxies listen on loopback; the pod IP's side of their ports is the forward's.

An OpenShift OAuth proxy (`--provider=openshift`) in a pod template listens on a loopback address
(`--http-address=127.0.0.1:<port>`, `[::1]:<port>`) or a unix socket, never on the pod IP or a wildcard: a Go
listener binds an address, not an interface, so on the pod IP it also answers a peer on an SR-IOV network (net1..N)
that routes the pod IP via its net1 (Linux accepts a packet for any local address on any interface, the weak host
model), and a wildcard answers on net1's own address; NetworkPolicy covers neither. The HTTPS listener is off
(`--https-address=` empty) or on loopback too: openshift/oauth-proxy main.go defaults `https-address` to ":8443",
every interface.

The router, the Service and the proxy's own readiness probe dial the pod IP: the pod's main container names each
proxy port in its env `ML_DEV_PROXY_PORTS` (inpod/contract.py PROXY_PORTS_ENV), the list inpod/sh/startup.sh hands
forward.py, which owns `<pod IP>:<port>` bound to the interface that holds the pod IP (SO_BINDTODEVICE) and copies
each connection to the proxy. A proxy port the list lacks answers nowhere on the pod network. Policy
`proxies-on-loopback` (`POLICY` below).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any

from .query import MANDATORY, PolicySpec, Resource, _seq, _str, is_unknown, pod_containers, pod_spec
from .routes_authenticated import is_oauth_proxy

PROXY_PORTS_ENV = "ML_DEV_PROXY_PORTS"
"""inpod/contract.py PROXY_PORTS_ENV (the pack is served on its own and imports nothing of the program; a test holds
the two equal)."""

FIX = (
    "Fix: `--http-address=127.0.0.1:<port>` and `--https-address=` on the proxy, and <port> in the main container's "
    f"env {PROXY_PORTS_ENV} (components/pod.py proxy_containers, server_env)."
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


def _host_port(address: str) -> tuple[str, str] | None:
    """(host, port) of `[scheme://]host:port` (None for a unix:// socket: no network listener)."""
    scheme, sep, rest = address.partition("://")
    if sep and scheme not in ("http", "https", "tcp", "tcp4", "tcp6"):
        return None
    rest = rest if sep else address
    host, _, port = rest.rpartition(":")
    return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), port


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (`localhost` resolves as /etc/hosts says), a wildcard, `$(POD_IP)`


def _forwarded(spec: Mapping[str, Any]) -> set[str]:
    """The ports some container of the pod names in PROXY_PORTS_ENV (the forward's list)."""
    ports: set[str] = set()
    for container in pod_containers(spec):
        for env in _seq(container.get("env")):
            if isinstance(env, Mapping) and env.get("name") == PROXY_PORTS_ENV and isinstance(env.get("value"), str):
                ports.update(env["value"].split())
    return ports


def _problems(container: Mapping[str, Any], forwarded: set[str]) -> Iterator[str]:
    argv = [a for a in _seq(container.get("command")) + _seq(container.get("args")) if isinstance(a, str)]
    if any(is_unknown(a) for a in _seq(container.get("args"))):
        return
    for flag, default in (("http-address", "127.0.0.1:4180"), ("https-address", ":8443")):
        value = _flag(argv, flag)
        address = default if value is None else value
        if flag == "https-address" and value == "":
            continue  # the HTTPS listener is off
        parts = _host_port(address)
        if parts is None:
            continue
        host, port = parts
        shown = f"--{flag}={value}" if value is not None else f"no --{flag} (oauth-proxy's default {default!r})"
        if not _loopback(host):
            yield f"{shown} listens on {'every interface' if host in ('', '0.0.0.0', '::', '*') else repr(host)}, not on loopback"
        elif flag == "http-address" and port not in forwarded:
            yield f"{shown}: port {port} is in no container's env {PROXY_PORTS_ENV} (no forward owns it on the pod IP)"


def check_proxies_on_loopback(res: Resource) -> Iterator[str]:
    spec = pod_spec(res)
    if spec is None:
        return
    forwarded = _forwarded(spec)
    for container in pod_containers(spec):
        if not is_oauth_proxy(container):
            continue
        name = _str(container.get("name")) or "?"
        for problem in _problems(container, forwarded):
            yield f"OAuth proxy container {name!r}: {problem}. {FIX}"


POLICY = PolicySpec(
    "proxies-on-loopback",
    MANDATORY,
    "resource",
    "Every OpenShift OAuth proxy (--provider=openshift) in a pod template listens on loopback: --http-address is "
    "127.0.0.1:<port> (or [::1], or a unix socket), never the pod IP or a wildcard, --https-address is empty or on "
    f"loopback too (oauth-proxy's default ':8443' is every interface), and a container's env {PROXY_PORTS_ENV} "
    "names the port (forward.py owns it on the pod IP, bound to the interface that holds it).",
    "Render `--http-address=127.0.0.1:<port>` and `--https-address=` on the proxy and the port in the main "
    f"container's env {PROXY_PORTS_ENV} (components/pod.py proxy_containers, server_env).",
    check_proxies_on_loopback,
    order=12,
)
