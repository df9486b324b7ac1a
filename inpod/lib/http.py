"""HTTP of the programs: where a server listens (never a wildcard), binding it, and reading another pod's JSON.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SIOCGIFADDR = 0x8915
"""include/uapi/linux/sockios.h: an interface's IPv4 address (struct ifreq; any process may ask)."""


def interface_of(address: str) -> str | None:
    """The name of the interface that holds `address` (None: none does). The pod network's interface is whichever
    holds POD_IP: the runtime names it (cri-o/ocicni pkg/ocicni/types.go DefaultInterfaceName, `eth0`) but a CNI may
    name it otherwise (`ens3`), so the name is never assumed. IPv4: SIOCGIFADDR per interface
    (net/ipv4/devinet.c devinet_ioctl); IPv6: /proc/net/if_inet6 (net/ipv6/addrconf.c if6_seq_show)."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    if ip.version == 6:
        try:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    words = line.split()
                    if len(words) == 6 and words[0] == ip.packed.hex():
                        return words[5]
        except OSError:
            return None
        return None
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if answer[20:24] == ip.packed:
                return name
    return None


def bind_to_interface(sock: socket.socket, host: str) -> str | None:
    """Bind `sock` to the interface that holds `host` (SO_BINDTODEVICE, which an unprivileged process may set since
    Linux 5.7: net/core/sock.c sock_bindtoindex_locked); loopback and names: left as given (None). Linux accepts a
    packet for any local address on any interface (net/ipv4/route.c ip_route_input_slow, RTN_LOCAL): unbound, a pod on
    net1..N that routes this pod's IP via its secondary network would reach the listener; bound, it is refused. Raises
    OSError naming the address when no interface holds it or the kernel refuses: never a listener that answers on
    every interface without saying so."""
    try:
        loopback = ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return None  # a name: left as given
    if loopback:
        return None
    device = interface_of(host)
    if device is None:
        raise OSError(f"{host}: no interface of this pod holds this address; refusing to listen on it unbound")
    try:
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_BINDTODEVICE", 25), device.encode())
    except OSError as exc:
        raise OSError(f"{host}: cannot bind the listener to {device}, the interface that holds it ({exc})") from exc
    return device


class Server(ThreadingHTTPServer):
    """Bound to the interface that holds its address when that is not loopback (bind_to_interface)."""

    def server_bind(self) -> None:
        bind_to_interface(self.socket, str(self.server_address[0]))
        super().server_bind()


class Server6(Server):
    address_family = socket.AF_INET6


def listen_addresses(listen: str | None, port: int) -> list[tuple[str, int]]:
    """`host:port` items (`[v6]:port`), separated by spaces or commas; empty: the pod IP and 127.0.0.1 on `port`.

    Never a wildcard (0.0.0.0, ::): a wildcard also answers on the SR-IOV interfaces (net1..N), which NetworkPolicy
    does not cover; the pod IP is where the stack's pods reach each other (the NetworkPolicy admits only them), and
    127.0.0.1 serves local clients and `oc port-forward`."""
    items = (listen or "").replace(",", " ").split()
    if not items:
        items = [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in (os.environ.get("POD_IP", ""), "127.0.0.1") if ip]
    out = []
    for item in items:
        host, _, number = item.rpartition(":")
        host = host.strip("[]")
        if not host or host in ("0.0.0.0", "::"):
            raise ValueError(f"listen address {item!r}: name the address to bind (the pod IP, 127.0.0.1), not a wildcard")
        out.append((host, int(number)))
    return out


def bind(addresses: list[tuple[str, int]], handler: type[BaseHTTPRequestHandler]) -> list[ThreadingHTTPServer]:
    """One server per address (IPv6 ones on an AF_INET6 socket), each bound to the pod network's interface."""
    return [(Server6 if ":" in host else Server)((host, port), handler) for host, port in addresses]


def shown(servers: list[ThreadingHTTPServer]) -> list[str]:
    """`host:port` (`[v6]:port`) of each bound server, as the `*.addr` files list them."""
    bound = [(str(s.server_address[0]), int(s.server_address[1])) for s in servers]
    return [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in bound]


def serve_in_background(servers: list[ThreadingHTTPServer]) -> None:
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()


def fetch_json(url: str, timeout: float = 5, connect_timeout: float | None = None) -> Any:
    """GET `url` (http) and parse its JSON body; `timeout` bounds each read. `connect_timeout`, when given, bounds the
    connection alone: a pod whose node is gone (no answer to the SYN) fails within it, while one that is up but slow
    to answer (its probes run inline) still gets `timeout`. Every failure is an OSError (or ValueError: not JSON)."""
    if connect_timeout is None:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=connect_timeout)
    try:
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(timeout)
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise OSError(f"HTTP Error {response.status}: {response.reason}")  # urllib.error.HTTPError's words
        return json.loads(body)
    except http.client.HTTPException as exc:  # not an OSError: a malformed or cut-off answer
        raise OSError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
