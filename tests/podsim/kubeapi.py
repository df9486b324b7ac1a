"""The API stand-in of a test (tests/inpod/idle/conftest.py FakeApiServer) where the pods reach the API: HTTPS on the
`kubernetes` Service's address (KUBERNETES_SERVICE_HOST in every pod, tests/podsim/render.py) in the simulation's pod
network, with a self-signed certificate the pods' service-account volume carries as its ca.crt."""

from __future__ import annotations

import ctypes
import ssl
import subprocess
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.podsim.pods import PodSim


def wait_for(what: str, ok: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ok()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


API_IP = "172.30.0.1"  # the `kubernetes` Service (KUBERNETES_SERVICE_HOST in every pod: tests/podsim/render.py)


def write_self_signed(key: Path, cert: Path, ip: str) -> None:
    """A one-day self-signed CA certificate for `ip` (its subjectAltName): the API server's cert and the pods' ca.crt."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
        .sign(private, hashes.SHA256())
    )
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def serve_api(sim: PodSim, api: Any, tmp: Path) -> tuple[ThreadingHTTPServer, str]:
    """The API stand-in's handler over HTTPS on API_IP:443 in the pod network; returns the server and its CA."""
    subprocess.run(["ip", "-n", sim.cluster_ns, "addr", "add", f"{API_IP}/32", "dev", "br0"], check=True, timeout=30)
    key, cert = tmp / "api.key", tmp / "api.crt"
    write_self_signed(key, cert, API_IP)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    made: list[Any] = []

    def work() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{sim.cluster_ns}") as f:
                if libc.setns(f.fileno(), 0x40000000):  # CLONE_NEWNET, this thread only
                    raise OSError(ctypes.get_errno(), "setns")
            httpd = ThreadingHTTPServer((API_IP, 443), api.httpd.RequestHandlerClass)
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        except BaseException as exc:  # handed to the test
            made.append(exc)
            return
        made.append(httpd)
        httpd.serve_forever()

    threading.Thread(target=work, daemon=True).start()
    server = wait_for("the API stand-in listens", lambda: made and made[0], 30)
    if isinstance(server, BaseException):
        raise server
    return server, cert.read_text()
