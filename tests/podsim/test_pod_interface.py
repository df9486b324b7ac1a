"""Our listeners on a pod whose pod-network interface is not called eth0 (`ens3`: a CNI names it; cri-o/ocicni's
DefaultInterfaceName is only the runtime's default), nerc-production's render with one secondary interface net1 and
a VLAN peer on net1's network (another tenant of the same SR-IOV network, NET_ADMIN in its own namespace) that
routes pod 0's IP via pod 0's net1 address:

* sshd, the idle agent, the home page and the debugger (`--debug-host pod`) bind the pod IP to the interface that
  holds it (`ens3`), never to no device: the peer's SYN for the pod IP arriving on net1 finds no listener;
* the same route reaches a listener bound without a device (a stand-in), so the route works and the binding is
  what refuses ours;
* the OAuth proxies (sidecars: stand-ins on 127.0.0.1, their rendered address) are reached on the pod IP through the
  forward startup.sh starts, bound to `ens3`: the pod network gets through, the VLAN peer's route via net1 does not;
* a listener asked for an address no interface holds refuses to start, naming the address (never an unbound one), the
  forward included.
"""

from __future__ import annotations

import select
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from core import naming
from tests.podsim import netpol
from tests.podsim.pods import PodSim, leftovers, missing_requirements, render_stack
from tests.podsim.test_reach import LISTEN, STANDIN, kill_in_pod, listeners, proxy_addresses, wait_listening

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]
PORT_STANDIN = 29511


@pytest.fixture(scope="module")
def ens3() -> Iterator[tuple[PodSim, netpol.Enforcement, netpol.Peer]]:
    sim = PodSim(render_stack("nerc-production"), count=2, python_packages=("debugpy",), pod_interface="ens3")
    net = netpol.Enforcement(sim)
    try:
        sim.start()
        for pod in sim.pods:
            sim.add_interfaces(pod.index, {"net1": f"10.0.103.{10 + pod.index}/24"})
        peer = net.add_peer("other-team", {}, networks=["net1"])
        wait_listening(sim, 0, 8090, 2)  # the home page (pod 0) starts after Ready
        yield sim, net, peer
    finally:
        net.close()
        sim.stop()
    assert not [x for x in leftovers() if sim.run_id in x], "the simulation left namespaces or directories behind"


def test_listeners_bind_the_interface_that_holds_the_pod_ip_whatever_its_name(ens3: tuple[PodSim, netpol.Enforcement, netpol.Peer]) -> None:
    sim, net, peer = ens3
    pod = sim.pods[0]
    assert not pod.path("/sys/class/net/eth0").exists() and pod.path("/sys/class/net/ens3").exists()
    rank = f"ml-dev _rank --cwd /tmp --debug-port {naming.DEBUG_PORT} --debug-host pod --no-stdin-watch -- python3 -c 'print(1)'"
    proc = sim.popen(0, rank)
    standin = sim.popen(0, ["python3", "-c", LISTEN, f"{STANDIN} unbound", f"{pod.ip}:{PORT_STANDIN}"])
    try:
        assert standin.stdout is not None and select.select([standin.stdout], [], [], 30)[0], "the stand-in did not start"
        assert standin.stdout.readline().strip() == "listening"
        wait_listening(sim, 0, naming.DEBUG_PORT, 1)
        ours = [x for x in listeners(sim, 0) if x.ours and x.host == pod.ip and x.proto == "tcp" and STANDIN not in x.cmdline]
        assert {2222, 9099, 8090, naming.DEBUG_PORT} <= {x.port for x in ours}, ours
        assert all(x.device == "ens3" for x in ours), [(x.name, x.port, x.device) for x in ours]
        targets = [(pod.ip, x.port) for x in ours] + [(pod.ip, PORT_STANDIN)]
        via = pod.interfaces["net1"].split("/")[0]
        subprocess.run(peer.argv("ip", "route", "add", f"{pod.ip}/32", "via", via, "dev", "net1"), check=True, timeout=30)
        try:
            reached = net.reaches(peer.argv(), targets)
        finally:
            subprocess.run(peer.argv("ip", "route", "del", f"{pod.ip}/32"), check=True, timeout=30)
        assert reached[(pod.ip, PORT_STANDIN)], f"the route via net1 reaches a listener without a device: {reached}"
        assert not [t for t, ok in reached.items() if ok and t[1] != PORT_STANDIN], reached
        # the stack's own pods reach them on the pod network
        assert all(net.reaches(["ip", "netns", "exec", sim.pods[1].netns], [(pod.ip, x.port) for x in ours]).values())
    finally:
        for p in (proc, standin):
            sim.interrupt(p, signal.SIGKILL)
            p.wait(timeout=30)
        kill_in_pod(sim, 0, r"debugpy|_rank|print\(1\)")
        deadline = time.monotonic() + 20
        while any(x.port == naming.DEBUG_PORT for x in listeners(sim, 0)) and time.monotonic() < deadline:
            time.sleep(0.1)


def test_an_address_no_interface_holds_is_refused_naming_it(ens3: tuple[PodSim, netpol.Enforcement, netpol.Peer]) -> None:
    sim, _, _ = ens3
    program = "import sys; sys.path.insert(0, '/opt/ml-dev-env'); from inpod.lib import http; " + (
        "http.bind([('10.9.9.9', 9199)], http.BaseHTTPRequestHandler)"
    )
    res = sim.exec(1, ["python3", "-c", program], timeout=60)
    assert res.returncode != 0 and "10.9.9.9: no interface of this pod holds this address" in res.stderr, res.stderr
    res = sim.exec(1, "ML_DEV_SSH_LISTEN=10.9.9.9 ML_DEV_STATE_DIR=/tmp/sshd-probe bash /opt/ml-dev-env/sshd.sh", timeout=60)
    assert res.returncode == 1 and "no interface of this pod holds 10.9.9.9" in res.stdout + res.stderr, res.stdout + res.stderr


def test_the_proxies_are_reached_through_the_forward_on_ens3_only(ens3: tuple[PodSim, netpol.Enforcement, netpol.Peer]) -> None:
    sim, net, peer = ens3
    pod = sim.pods[0]
    proxies = proxy_addresses(sim)
    assert proxies and {host for host, _ in proxies.values()} == {"127.0.0.1"}, proxies
    ports = sorted(port for _, port in proxies.values())
    standin = sim.popen(0, ["python3", "-c", LISTEN, f"{STANDIN} oauth-proxy", *(f"127.0.0.1:{p}" for p in ports)])
    try:
        assert standin.stdout is not None and select.select([standin.stdout], [], [], 30)[0], "the stand-in did not start"
        assert standin.stdout.readline().strip() == "listening"
        forwards = [x for x in listeners(sim, 0) if x.name.startswith("forward")]
        assert sorted(x.port for x in forwards) == ports and {(x.host, x.device) for x in forwards} == {(pod.ip, "ens3")}, forwards
        targets = [(pod.ip, p) for p in ports]
        assert all(net.reaches(["ip", "netns", "exec", sim.pods[1].netns], targets).values()), "the pod network reaches them"
        for port in ports:  # through the forward to the proxy on loopback
            with sim.connect(0, port) as sock:
                sock.settimeout(10)
                assert sock.makefile("rb").readline() == f"{STANDIN} oauth-proxy\n".encode()
        via = pod.interfaces["net1"].split("/")[0]
        subprocess.run(peer.argv("ip", "route", "add", f"{pod.ip}/32", "via", via, "dev", "net1"), check=True, timeout=30)
        try:
            reached = net.reaches(peer.argv(), [*targets, (pod.ip, PORT_STANDIN)])
            assert not any(reached[t] for t in targets), reached
        finally:
            subprocess.run(peer.argv("ip", "route", "del", f"{pod.ip}/32"), check=True, timeout=30)
    finally:
        sim.interrupt(standin, signal.SIGKILL)
        standin.wait(timeout=30)


def test_the_forward_refuses_an_address_no_interface_holds(ens3: tuple[PodSim, netpol.Enforcement, netpol.Peer]) -> None:
    sim, _, _ = ens3
    res = sim.exec(1, ["python3", "/opt/ml-dev-env/forward.py", "10.9.9.9:18080"], timeout=60)
    assert res.returncode == 1 and "10.9.9.9: no interface of this pod holds this address" in res.stderr, res.stdout + res.stderr
