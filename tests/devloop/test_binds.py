"""Our listeners bind the pod IP and loopback, never a wildcard: checked in real network namespaces.

A minimal two-namespace fixture (not the pod simulation): namespace `pod` has `eth0` (the pod IP, 10.128.0.2)
and `net1` (an SR-IOV-like secondary interface, 192.168.50.2), each a veth whose peer lives in namespace
`other` (another pod: 10.128.0.3 on the pod network, 192.168.50.3 on the secondary one). The real programs run
inside `pod`; connections are attempted from `other` and from `pod` itself, and the listening sockets are read
from the namespace's own /proc/net/tcp. Addresses exist only inside the namespaces the test creates.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POD_IP, POD_NET1, OTHER_IP, OTHER_NET1 = "10.128.0.2", "192.168.50.2", "10.128.0.3", "192.168.50.3"
UID = 1000770000  # an OpenShift-style arbitrary UID without a passwd entry


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces and veth pairs)"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


REASON = _missing()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network namespaces: {REASON}")


@dataclass
class Netns:
    holder: subprocess.Popen[bytes]

    def argv(self, *cmd: str) -> list[str]:
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--", *cmd]

    def sh(self, *cmd: str) -> None:
        subprocess.run(self.argv(*cmd), check=True, timeout=20, capture_output=True)

    def listeners(self) -> set[tuple[str, int]]:
        """(address, port) of every listening TCP socket in this namespace (IPv4 and IPv6)."""
        found = set()
        for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
            path = Path(f"/proc/{self.holder.pid}/net/{name}")
            for line in path.read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] != "0A":  # TCP_LISTEN
                    continue
                hexaddr, hexport = fields[1].split(":")
                raw = bytes.fromhex(hexaddr)
                # /proc prints the address as host-order 32-bit words
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add((socket.inet_ntop(family, raw), int(hexport, 16)))
        return found

    def kill_all(self) -> None:
        """Every process in this namespace but its holder (ours: the namespace exists only for this test)."""
        inode = os.readlink(f"/proc/{self.holder.pid}/ns/net")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.holder.pid:
                continue
            try:
                if os.readlink(entry / "ns" / "net") == inode:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass

    def reaches(self, host: str, port: int) -> bool:
        probe = "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)\nexcept OSError:\n sys.exit(1)"
        return subprocess.run(self.argv(sys.executable, "-c", probe, host, str(port)), timeout=20).returncode == 0


def _holder() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["unshare", "--net", "--", "sleep", "600"], start_new_session=True)
    deadline = time.monotonic() + 10
    mine = os.readlink("/proc/self/ns/net")
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/net") != mine and Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep":
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("unshare --net did not start")


@pytest.fixture(scope="module")
def pods() -> Iterator[tuple[Netns, Netns]]:
    pod, other = Netns(_holder()), Netns(_holder())
    try:
        for ns in (pod, other):
            ns.sh("ip", "link", "set", "lo", "up")
        for name in ("eth0", "net1"):
            pod.sh("ip", "link", "add", name, "type", "veth", "peer", "name", name, "netns", str(other.holder.pid))
        for ns, eth0, net1 in ((pod, POD_IP, POD_NET1), (other, OTHER_IP, OTHER_NET1)):
            ns.sh("ip", "addr", "add", f"{eth0}/24", "dev", "eth0")
            ns.sh("ip", "addr", "add", f"{net1}/24", "dev", "net1")
            ns.sh("ip", "link", "set", "eth0", "up")
            ns.sh("ip", "link", "set", "net1", "up")
        yield pod, other
    finally:
        for ns in (pod, other):
            ns.kill_all()
            ns.holder.kill()
            ns.holder.wait(timeout=10)


def _stop(proc: subprocess.Popen[bytes], ns: Netns) -> None:
    """The program, then whatever it left in the namespace (the rank's own session, the debugpy adapter)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    ns.kill_all()
    deadline = time.monotonic() + 10
    while ns.listeners() and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_listening(ns: Netns, port: int, proc: subprocess.Popen[bytes], count: int = 1) -> set[tuple[str, int]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = {a for a in ns.listeners() if a[1] == port}
        if len(found) >= count:
            return found
        assert proc.poll() is None, f"exited {proc.returncode}: {proc.stdout.read().decode() if proc.stdout else ''}"
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}: {ns.listeners()}")


WILDCARDS = {"0.0.0.0", "::"}

# A debug adapter client's first request (what VS Code sends after `oc port-forward`), answered by debugpy.
DAP_INITIALIZE = r"""
import json, socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
body = json.dumps({"seq": 1, "type": "request", "command": "initialize", "arguments": {"adapterID": "test"}}).encode()
sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
buf = b""
for _ in range(20):  # events may come first
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, buf = buf.partition(b"\r\n\r\n")
    size = int(head.split(b":")[1])
    while len(buf) < size:
        buf += sock.recv(65536)
    msg, buf = json.loads(buf[:size]), buf[size:]
    if msg.get("type") == "response" and msg.get("command") == "initialize":
        sys.exit(0 if msg.get("success") else 1)
sys.exit(1)
"""


def test_idle_agent_answers_the_pod_ip_and_loopback_only(pods: tuple[Netns, Netns], tmp_path: Path) -> None:
    pod, other = pods
    settings = tmp_path / "idle.json"
    settings.write_text(json.dumps({"enabled": False, "intervalSeconds": 5, "activityPort": 9099, "servers": []}))
    env = {"PATH": os.environ["PATH"], "POD_IP": POD_IP, "ML_DEV_STATE_DIR": str(tmp_path), "ML_DEV_IDLE_SETTINGS": str(settings)}
    proc = subprocess.Popen(
        pod.argv(sys.executable, str(ROOT / "inpod" / "idle_agent.py"), "run"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert _wait_listening(pod, 9099, proc, count=2) == {(POD_IP, 9099), ("127.0.0.1", 9099)}
        assert other.reaches(POD_IP, 9099), "another pod of the stack reaches /activity on the pod IP"
        assert pod.reaches("127.0.0.1", 9099), "local clients and oc port-forward reach it on loopback"
        assert not other.reaches(POD_NET1, 9099), "nothing answers on the secondary interface"
        assert not pod.reaches(POD_NET1, 9099)
        assert not {a for a in pod.listeners() if a[0] in WILDCARDS}
    finally:
        _stop(proc, pod)


def test_idle_agent_refuses_a_wildcard_listen_address(tmp_path: Path) -> None:
    settings = tmp_path / "idle.json"
    settings.write_text(json.dumps({"enabled": False, "intervalSeconds": 5, "activityPort": 9099, "servers": []}))
    env = {"PATH": os.environ["PATH"], "ML_DEV_STATE_DIR": str(tmp_path), "ML_DEV_IDLE_SETTINGS": str(settings)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "inpod" / "idle_agent.py"), "run", "--listen", "0.0.0.0:0", "--rounds", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0 and "not a wildcard" in out.stderr


@pytest.mark.parametrize("host", ["localhost", "pod"])
def test_debugger_listens_on_loopback_unless_debug_host_pod(pods: tuple[Netns, Netns], tmp_path: Path, host: str) -> None:
    pytest.importorskip("debugpy", reason="needs debugpy importable here (requirements-dev.txt)")
    pod, other = pods
    env = {"PATH": os.environ["PATH"], "POD_IP": POD_IP, "ML_DEV_STATE_DIR": str(tmp_path), "HOME": str(tmp_path)}
    rank = [sys.executable, str(ROOT / "inpod" / "ml_dev.py"), "_rank", "--cwd", str(tmp_path), "--debug-port", "5678"]
    rank += ["--debug-host", host, "--no-stdin-watch", "--", sys.executable, "-c", "print('ran')"]
    proc = subprocess.Popen(pod.argv(*rank), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        bound = _wait_listening(pod, 5678, proc)
        if host == "pod":
            assert bound == {(POD_IP, 5678)}
            assert other.reaches(POD_IP, 5678), "--debug-host pod: another pod attaches on the pod IP"
            assert not pod.reaches("127.0.0.1", 5678), "port-forward does not reach it (the launch line says so)"
        else:
            assert bound == {("127.0.0.1", 5678)}
            # oc port-forward dials 127.0.0.1:5678 inside the pod (debugpy serves one client: this is it)
            dap = subprocess.run(pod.argv(sys.executable, "-c", DAP_INITIALIZE, "127.0.0.1", "5678"), timeout=30)
            assert dap.returncode == 0, "the debugger answers a DAP initialize through the pod's loopback"
            assert not other.reaches(POD_IP, 5678), "no other pod reaches the debugger by default"
        assert not other.reaches(POD_NET1, 5678)
        assert not {a for a in pod.listeners() if a[0] in WILDCARDS}, pod.listeners()
    finally:
        _stop(proc, pod)


def test_sshd_listens_on_the_pod_ip_and_loopback_only(pods: tuple[Netns, Netns]) -> None:
    """inpod/sshd.sh as the pod runs it (an arbitrary UID, GID 0): its ListenAddress lines, seen from both sides."""
    if shutil.which("sshd", path="/usr/sbin:/usr/bin") is None or shutil.which("ssh-keygen") is None or shutil.which("setpriv") is None:
        pytest.skip("needs openssh-server, ssh-keygen and setpriv")
    pod, other = pods
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        secret, state = base / "secret", base / "state"
        secret.mkdir()
        state.mkdir()
        os.chown(state, UID, 0)
        for key in ("host_ed25519_key", "id_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(secret / key)], check=True, timeout=30)
        (secret / "authorized_keys").write_text((secret / "id_ed25519.pub").read_text())
        for f in secret.iterdir():
            f.chmod(0o444)
        env = {
            "PATH": "/usr/sbin:/usr/bin:/bin",
            "POD_IP": POD_IP,
            "HOME": str(state),
            "ML_DEV_STATE_DIR": str(state),
            "ML_DEV_SSH_SECRET_DIR": str(secret),
            "APP_NAME": "app",
            "HEADLESS_SERVICE": "app-headless",
            "POD_NAMESPACE": "team",
        }
        cmd = ["setpriv", f"--reuid={UID}", "--regid=0", "--clear-groups", "bash", str(ROOT / "inpod" / "sshd.sh")]
        proc = subprocess.Popen(pod.argv(*cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert _wait_listening(pod, 2222, proc, count=2) == {(POD_IP, 2222), ("127.0.0.1", 2222)}
            assert other.reaches(POD_IP, 2222) and pod.reaches("127.0.0.1", 2222)
            assert not other.reaches(POD_NET1, 2222) and not pod.reaches(POD_NET1, 2222)
            assert not {a for a in pod.listeners() if a[0] in WILDCARDS}, pod.listeners()
        finally:
            _stop(proc, pod)
