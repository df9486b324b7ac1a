"""A TCP forwarder for the servers that cannot bind to an interface themselves (code-server, Jupyter with
`access.auth: token`): they listen on 127.0.0.1, and this listens on the pod IP, bound to the interface that holds it
(http.bind_to_interface: SO_BINDTODEVICE), and copies each connection to its loopback port. So nothing of ours answers
on net1..N, not even to a peer that routes the pod IP via its secondary network.

`forward.py <listen host>:<port>[=<target port>] ...` (a host in brackets for IPv6); the target is 127.0.0.1. Refuses
to start, naming the address, when no interface holds it. Standard library only, Python 3.8+.
"""

from __future__ import annotations

import socket
import sys
import threading

from .http import bind_to_interface


def parse_pair(item: str) -> tuple[str, int, int]:
    """`host:port[=target]` -> (host, port, target port)."""
    listen, _, target = item.partition("=")
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not host or host in ("0.0.0.0", "::"):
        raise ValueError(f"{item!r}: name the address to listen on (the pod IP), not a wildcard")
    return host, int(port), int(target or port)


def pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def serve(listener: socket.socket, target: int) -> None:
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target), timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()  # the server is not up (yet): the caller sees a closed connection, as with no server
            continue

        def both(a: socket.socket = client, b: socket.socket = upstream) -> None:
            t = threading.Thread(target=pipe, args=(b, a), daemon=True)
            t.start()
            pipe(a, b)
            t.join()
            a.close()
            b.close()

        threading.Thread(target=both, daemon=True).start()


def listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    bind_to_interface(sock, host)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def main(argv: list[str] | None = None) -> int:
    items = sys.argv[1:] if argv is None else argv
    try:
        pairs = [parse_pair(item) for item in items]
        listeners = [(listen(host, port), host, port, target) for host, port, target in pairs]
    except (OSError, ValueError) as exc:
        print(f"forward: {exc}", file=sys.stderr, flush=True)
        return 1
    threads = []
    for sock, host, port, target in listeners:
        print(f"forward: {host}:{port} -> 127.0.0.1:{target}", flush=True)
        t = threading.Thread(target=serve, args=(sock, target), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return 0
