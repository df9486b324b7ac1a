"""Stub cluster DNS for the simulated pods (a program: `python3 dns.py ADDRESS RECORDS.json`).

Answers A queries for the names in RECORDS ({"name": ["ip", ...]}, read again on every query, so a test can
change records while pods run) like the cluster DNS answers a headless Service's records
(`<pod>.<headless>.<ns>.svc.cluster.local` and `<headless>.<ns>.svc.cluster.local`); a known name with another
type gets an empty NOERROR answer, anything else NXDOMAIN (what CoreDNS's kubernetes plugin does for names in
its zone: coredns/coredns plugin/kubernetes/kubernetes.go Records/findPods). Standard library only, UDP, port 53
of ADDRESS inside the simulation's own network namespace. Prints "ready" once bound.
"""

from __future__ import annotations

import json
import socket
import struct
import sys


def question(packet: bytes) -> tuple[str, int, int]:
    """(name, qtype, offset after the question) of the first question."""
    labels, i = [], 12
    while packet[i]:
        n = packet[i]
        labels.append(packet[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype = struct.unpack("!H", packet[i + 1 : i + 3])[0]
    return ".".join(labels).lower(), qtype, i + 5


def answer(packet: bytes, records: dict[str, list[str]]) -> bytes:
    ident, flags = struct.unpack("!HH", packet[:4])
    name, qtype, end = question(packet)
    addresses = records.get(name.rstrip("."))
    rcode = 3 if addresses is None else 0  # NXDOMAIN for names the zone does not have
    answers = [a for a in addresses or [] if qtype == 1]
    header = struct.pack("!HHHHHH", ident, 0x8400 | (flags & 0x0100) | rcode, 1, len(answers), 0, 0)
    body = packet[12:end]
    for address in answers:
        body += struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(address)  # TTL 5 s, like CoreDNS's default
    return header + body


def main() -> int:
    address, records_path = sys.argv[1], sys.argv[2]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    print("ready", flush=True)
    while True:
        packet, peer = sock.recvfrom(4096)
        try:
            with open(records_path, encoding="utf-8") as f:
                records = {k.lower(): v for k, v in json.load(f).items()}
            sock.sendto(answer(packet, records), peer)
        except (ValueError, IndexError, OSError, struct.error) as exc:  # a malformed query: no answer
            print(f"dropped a query from {peer}: {exc}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
