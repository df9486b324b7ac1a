"""The idle stop on simulated pods started from the render: one harness for the idle and stop tests (root only).

    sim = IdleSim(settings={"intervalSeconds": 1}, api=FakeApiServer(rules), token=TOKEN)
    # barcelona, idle stop on, no dev servers, the node's tools; idle.json edited before the pods start; the API
    # stand-in at the `kubernetes` Service (HTTPS) from before the pods start, the pods' token and CA its own
    with sim.start():                               # startup.sh starts the idle agent on every pod, as rendered
        sim.node.gpu(sim, 1, util=97)               # pod 1's GPUs busy (tests/podsim/nodetools.py, live)
        sim.quicken(unreachableSeconds=4)           # the idle settings' ConfigMap updated (the kubelet's swap)
        wait_for("stop", api.stopped, 60, sim.agent_log)     # the scale, the record, the Event
        sim.decision()                              # pod 0's idle-status.json (what `ml-dev status` reads)

The stack's bounds (stacks/config.py: interval >= 15 s, unreachableAfter >= 2 min) keep a rendered stack's values
slow; `quicken` edits the rendered idle.json as a ConfigMap update delivers it, and the agent takes it up within a
second (it looks at idle.json between rounds). The pods' GPUs are the node's (`Node`: nvidia-smi's real `--format=csv` layout).
"""

from __future__ import annotations

import ctypes
import datetime
import ipaddress
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from components import lifecycle
from core import naming
from tests.podsim.nodetools import Node
from tests.podsim.pods import PREFIX, PodSim, leftovers, render_stack

STATE = "/tmp/ml-dev-env"  # the pods' state directory (ML_DEV_STATE_DIR of the render)
API_IP = "172.30.0.1"  # the `kubernetes` Service (KUBERNETES_SERVICE_HOST in every pod: tests/podsim/render.py)


def no_dev_servers(objects: dict[str, Any]) -> None:
    """No dev servers (none is installed on these pods; the idle agent would count their failed probes as activity)."""
    objects["access"] = {**objects["access"], "vscode": False, "jupyter": False, "tensorboard": False}


def with_idle_stop(objects: dict[str, Any]) -> None:
    no_dev_servers(objects)
    objects.setdefault("lifecycle", {})["idleStop"] = {"enabled": True, "interval": "15s", "unreachableAfter": "2m"}


def with_grace(grace: int) -> Callable[[dict[str, Any]], None]:
    def mutate(objects: dict[str, Any]) -> None:
        no_dev_servers(objects)
        objects.setdefault("lifecycle", {}).update(checkpointGraceSeconds=grace)

    return mutate


def wait_for(what: str, check: Callable[[], Any], timeout: float, log: Callable[[], str] = lambda: "", step: float = 0.2) -> Any:
    """`check()`'s first true value within `timeout` s, else an AssertionError naming `what` with `log()`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{log()}")
        time.sleep(step)


def mine(sim: PodSim) -> list[str]:
    """Namespaces and directories of this simulation still here (other simulations may run beside it)."""
    return [item for item in leftovers() if f"{PREFIX}{sim.run_id}-" in item]


def complete(path: Path) -> bool:
    """A checkpoint of tests/podsim/stopjob.py's job written whole (its first and last line)."""
    lines = path.read_text().splitlines()
    return len(lines) == 12 and lines[0].startswith("step=") and lines[-1] == "END"


class IdleSim(PodSim):
    """PodSim of barcelona (or `result`) with the idle stop on and the node's tools (`self.node`).

    `settings`: idle.json values changed in the rendered ConfigMap before the pods start (the agent starts with
    them). `api` (with `token`): an API stand-in (tests/inpod/idle/conftest.py FakeApiServer) served over HTTPS at
    the `kubernetes` Service address from before the pods start, the pods' service-account volume holding `token`
    and its CA, as the kubelet mounts them (the agent's in-cluster client: inpod/lib/kube.py)."""

    def __init__(
        self,
        result: Any = None,
        count: int = 2,
        node: Node | None = None,
        settings: dict[str, Any] | None = None,
        api: Any = None,
        token: str = "",
        **kw: Any,
    ) -> None:
        result = result if result is not None else render_stack("barcelona", with_idle_stop)
        super().__init__(result, count=count, node=node or Node(), **kw)
        self.settings_configmap = naming.lifecycle_configmap(self.app)
        if settings:
            self.configmaps[self.settings_configmap][lifecycle.SETTINGS_KEY] = json.dumps({**self.settings(), **settings})
        self.api, self.token = api, token
        self.api_server: ThreadingHTTPServer | None = None
        self.api_ca = ""

    def start(self, timeout: float = 90, wait: bool = True) -> IdleSim:
        super().start(timeout, wait)
        return self

    def __enter__(self) -> IdleSim:
        return self if self._started else self.start()

    def settings(self) -> dict[str, Any]:
        """The idle settings as rendered or last swapped (idle.json of the lifecycle ConfigMap)."""
        return dict(json.loads(self.configmaps[self.settings_configmap][lifecycle.SETTINGS_KEY]))

    def quicken(self, **values: Any) -> None:
        """idle.json with `values` changed, delivered as a ConfigMap update (..data swapped on every pod)."""
        self.swap_configmap(self.settings_configmap, {lifecycle.SETTINGS_KEY: json.dumps({**self.settings(), **values})})

    def agent_log(self, index: int = 0) -> str:
        try:
            return self.pods[index].path(f"{STATE}/logs/idle-agent.log").read_text()
        except OSError as exc:
            return f"(no idle agent log on pod {index}: {exc})"

    def decision(self) -> dict[str, Any]:
        """Pod 0's idle-status.json (its agent's last decision), {} while there is none."""
        try:
            return dict(json.loads(self.pods[0].path(f"{STATE}/idle-status.json").read_text()))
        except (OSError, ValueError):
            return {}

    # ------------------------------------------------------------------------------ the API stand-in

    def _network(self) -> None:
        super()._network()
        if self.api is not None:
            self.api_server, self.api_ca = serve_api(self, self.api.httpd.RequestHandlerClass, self.base)

    def _volume_dirs(self, pod: Any) -> dict[str, tuple[str, Path | None]]:
        out = super()._volume_dirs(pod)
        if self.api is not None:  # the service-account volume with the stand-in's token and CA
            pod.volumes["kube-api-access"].write({"token": self.token, "ca.crt": self.api_ca, "namespace": self.namespace})
        return out

    def stop(self) -> None:
        if self.api_server is not None:
            self.api_server.shutdown()
            self.api_server.server_close()
            self.api_server = None
        super().stop()


def write_self_signed(key: Path, cert: Path, ip: str) -> None:
    """A one-day self-signed CA certificate for `ip` (its subjectAltName): the API server's cert and the pods' ca.crt."""
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


def serve_api(sim: PodSim, handler: Any, tmp: Path) -> tuple[ThreadingHTTPServer, str]:
    """`handler` over HTTPS on API_IP:443 in the pod network (a thread of this process in the cluster's network
    namespace); the server and its CA certificate (PEM)."""
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
            httpd = ThreadingHTTPServer((API_IP, 443), handler)
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
