"""Who reaches what, on pods started from the render of both committed stacks (tests/podsim, tests/podsim/netpol.py).

barcelona: RDMA pods (root + SCC) with the SR-IOV attachments as net1..net4; nerc-production: TCP pods
(restricted-v2), given one secondary interface net1 here so that "nothing answers on a secondary interface"
means the same on both. The rendered NetworkPolicy is enforced inside each pod's network namespace (iptables
from an evaluator of its own); two non-stack pods sit on the same bridge: one in a foreign namespace (attached
to every net1..N bridge as well, as another tenant on the same VLAN would be) and one in the router's namespace
(a router on the pod network). A third source is a host-network router on another node: that node's
management-port IP, no pod's address, which OVN-Kubernetes admits only through the address set of the labelled
`openshift-host-network` namespace, i.e. for a peer with a nil podSelector (tests/podsim/netpol.py).

Stand-ins (what the simulation does not run): the OAuth proxies are sidecars (not simulated); each is a plain
listener on every pod at the address its rendered `--http-address` expands to with that container's env (the kubelet's
`$(VAR)` expansion), split as Go's net.SplitHostPort does: 127.0.0.1, behind the forward startup.sh starts on the pod
IP (real, `forward.py`). A stand-in answers each connection with its name, so a test sees what it reached. torch's
TCPStore (29500; torch is not installed here) is a listener on every interface, as torch binds it.
"""

from __future__ import annotations

import copy
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from core import naming
from tests.podsim import netpol
from tests.podsim.pods import PodSim, leftovers, missing_requirements, render_stack
from tests.podsim.render import PodFacts, container_env, expand

REASON = missing_requirements() or netpol.missing_requirements()
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(REASON is not None, reason=f"simulated pods with NetworkPolicy: {REASON}"),
    pytest.mark.timeout(300),
]

STACKS = ("barcelona", "nerc-production")
WILDCARDS = {"0.0.0.0", "::", "*"}
STANDIN = "podsim-standin"
# Every listener a pod may have, named by its command line: (name, pattern, ours). A listener matching none fails.
KNOWN = (
    ("sshd", r"(^|/)sshd\b", True),
    ("idle agent", r"idle_agent\.py", True),
    ("home page", r"home_page\.py", True),
    ("debugger (debugpy)", r"debugpy|ml-dev _rank|ml_dev.* _rank", True),
    ("OAuth proxy (stand-in)", rf"{STANDIN} oauth-proxy", True),
    ("forward (the proxies' pod-IP side)", r"forward\.py", True),
    ("torch TCPStore (stand-in)", rf"{STANDIN} tcpstore", False),
)
LISTEN = r"""
import select, socket, sys
socks = []
for item in sys.argv[2:]:
    host, _, port = item.rpartition(":")
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(16)
    socks.append(s)
print("listening", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        c = s.accept()[0]
        try:
            c.sendall(sys.argv[1].encode() + b"\n")
        except OSError:
            pass
        c.close()
"""
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


@dataclass(frozen=True)
class Listener:
    proto: str
    host: str
    port: int
    cmdline: str
    name: str
    ours: bool
    device: str = ""  # SO_BINDTODEVICE (`ss` shows `address%device`)


def go_split_host_port(hostport: str) -> tuple[str, int]:
    """golang/go src/net/ipsock.go SplitHostPort for the shapes we render: `[host]:port` (any host) or `host:port`."""
    if hostport.startswith("["):
        host, _, port = hostport[1:].partition("]:")
    else:
        host, _, port = hostport.rpartition(":")
        assert ":" not in host, f"{hostport}: too many colons"
    return host, int(port)


def listeners(sim: PodSim, index: int) -> list[Listener]:
    """Every listening TCP/UDP socket of pod `index` (`ss -ltunp` in its netns), each named by its process."""
    out = subprocess.run(["ip", "netns", "exec", sim.pods[index].netns, "ss", "-ltunpH"], capture_output=True, text=True, timeout=30)
    found = []
    for line in out.stdout.splitlines():
        fields = line.split()
        host, _, port = fields[4].rpartition(":")
        host, _, device = host.strip("[]").partition("%")
        pids = re.findall(r"pid=(\d+)", line)
        cmdline = ""
        for pid in pids[:1]:
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmdline = "?"
        name, ours = next(((n, o) for n, pattern, o in KNOWN if re.search(pattern, cmdline)), ("UNKNOWN", False))
        found.append(Listener(fields[0], host, int(port), cmdline, name, ours, device))
    return found


def kill_in_pod(sim: PodSim, index: int, pattern: str) -> None:
    """SIGKILL every process of pod `index` whose command line matches (what a test started there)."""
    for pid in sim.pod_pids(index):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            if re.search(pattern, cmdline):
                os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


@dataclass
class Env:
    stack: str
    sim: PodSim
    net: netpol.Enforcement
    foreign: netpol.Peer
    router: netpol.Peer
    node_router: netpol.Peer  # a host-network router on another node (its SNATed source)
    proxies: dict[str, tuple[str, int]]  # proxy container -> its expanded (host, port) on pod 0

    def ns(self, index: int) -> list[str]:
        return ["ip", "netns", "exec", self.sim.pods[index].netns]

    def secondary(self, index: int) -> list[str]:
        return [a.split("/")[0] for a in self.sim.pods[index].interfaces.values()]


def proxy_addresses(sim: PodSim) -> dict[str, tuple[str, int]]:
    """Each rendered OAuth proxy's `--http-address`, expanded as the kubelet does with that container's env on pod 0."""
    out = {}
    pod = sim.pods[0]
    for c in sim.pod_spec["containers"]:
        args = c.get("args") or []
        if "--provider=openshift" not in args:
            continue
        env = container_env(c, PodFacts(pod.name, sim.namespace, pod.ip, "node-0"), sim.secrets)
        raw = next(a.split("=", 1)[1] for a in args if a.startswith("--http-address="))
        out[c["name"]] = go_split_host_port(expand(raw, env))  # the kubelet expands $(VAR) in args from the env
    return out


def wait_listening(sim: PodSim, index: int, port: int, count: int, timeout: float = 60) -> set[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hosts = {x.host for x in listeners(sim, index) if x.port == port and x.proto == "tcp"}
        if len(hosts) >= count:
            return hosts
        time.sleep(0.2)
    raise AssertionError(f"{sim.pods[index].name}: {count} listener(s) on {port} expected: {listeners(sim, index)}")


@pytest.fixture(scope="module", params=STACKS)
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    sim = PodSim(render_stack(request.param), count=2, python_packages=("debugpy",))
    stand_ins: list[subprocess.Popen[str]] = []
    net = netpol.Enforcement(sim)
    try:
        sim.start()
        if not any(p.interfaces for p in sim.pods):  # a TCP stack: one secondary interface all the same
            for pod in sim.pods:
                sim.add_interfaces(pod.index, {"net1": f"10.0.103.{10 + pod.index}/24"})
        networks = sorted(sim.pods[0].interfaces)
        foreign = net.add_peer("other-team", {}, networks=networks)
        router = net.add_peer("openshift-ingress", {netpol.ROUTER_LABEL: ""})
        node_router = net.add_host_network_source(netpol.HOST_NETWORK_NAMESPACE, {netpol.ROUTER_LABEL: ""})
        net.apply()
        proxies = proxy_addresses(sim)
        items = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in proxies.values()]
        # the proxy sidecars run on every pod; TCPStore on pod 0 (MASTER_ADDR)
        roles = ((0, "oauth-proxy", items), (1, "oauth-proxy", items), (0, "tcpstore", [f"0.0.0.0:{naming.MASTER_PORT}"]))
        for index, role, addresses in roles:
            proc = sim.popen(index, ["python3", "-c", LISTEN, f"{STANDIN} {role}", *addresses])
            stand_ins.append(proc)
            assert proc.stdout is not None and select.select([proc.stdout], [], [], 30)[0], f"{role} stand-in did not start"
            assert proc.stdout.readline().strip() == "listening", role
        wait_listening(sim, 0, 8090, 2)  # the home page (pod 0) starts after Ready
        yield Env(request.param, sim, net, foreign, router, node_router, proxies)
    finally:
        net.close()
        for proc in stand_ins:
            sim.interrupt(proc, signal.SIGKILL)
            proc.wait(timeout=30)
        sim.stop()
    assert not [x for x in leftovers() if sim.run_id in x], "the simulation left namespaces or directories behind"


def test_no_listener_of_ours_binds_a_wildcard_and_each_is_named(env: Env) -> None:
    """ss -ltunp in each pod's netns: every listener is one of KNOWN; ours bind the pod IP and/or loopback only."""
    for pod in env.sim.pods:
        found = listeners(env.sim, pod.index)
        assert not [x for x in found if x.name == "UNKNOWN"], found
        ours = [x for x in found if x.ours]
        assert not [x for x in ours if x.host in WILDCARDS], ours
        assert {x.host for x in ours} <= {pod.ip, "127.0.0.1"}, ours
        by: dict[tuple[str, int], set[str]] = {(x.name, x.port): set() for x in ours}
        for x in ours:
            by[(x.name, x.port)].add(x.host)
        assert by[("sshd", 2222)] == {pod.ip, "127.0.0.1"}
        assert by[("idle agent", 9099)] == {pod.ip, "127.0.0.1"}
        # every pod: each proxy on loopback, its port on the pod IP the forward's, bound to the pod network's interface
        ports = [port for _, port in env.proxies.values()]
        assert ports and all(by[("OAuth proxy (stand-in)", port)] == {"127.0.0.1"} for port in ports), by
        forwards = [x for x in ours if x.name.startswith("forward")]
        assert sorted(x.port for x in forwards) == sorted(ports) and {(x.host, x.device) for x in forwards} == {(pod.ip, "eth0")}, forwards
        if pod.index == 0:
            assert by[("home page", 8090)] == {pod.ip, "127.0.0.1"}
            tcpstore = [x for x in found if x.name.startswith("torch")]
            assert tcpstore and {x.host for x in tcpstore} <= WILDCARDS, "the stand-in binds as torch does (not ours)"


def test_the_proxies_listen_on_loopback_and_the_pod_ip_reaches_them_through_the_forward(env: Env) -> None:
    for name, (host, port) in env.proxies.items():
        assert host == "127.0.0.1", (name, host)
        # the Service, the Route and the httpGet probe dial the pod IP (the kubelet's probe comes from the node): the
        # forward copies the connection to the proxy on loopback, which answers
        for index in range(2):
            with env.sim.connect(index, port) as sock:
                sock.settimeout(10)
                assert sock.makefile("rb").readline() == f"{STANDIN} oauth-proxy\n".encode(), (name, index)


def test_nothing_of_ours_answers_on_a_secondary_interface_from_anywhere(env: Env) -> None:
    ports = sorted({x.port for i in range(2) for x in listeners(env.sim, i) if x.ours})
    assert {2222, 9099, 8090} <= set(ports)
    for index in range(2):
        targets = [(a, p) for a in env.secondary(index) for p in ports]
        assert targets
        for where, argv in (
            ("another stack pod", env.ns(1 - index)),
            ("another tenant on the VLAN", env.foreign.argv()),
            ("the pod itself", env.ns(index)),
        ):
            reached = {t for t, ok in env.net.reaches(argv, targets).items() if ok}
            assert not reached, f"{env.sim.pods[index].name}: {where} reaches {sorted(reached)} on net1..N"
    # the test can fail: the TCPStore stand-in (every interface, as torch binds it) does answer there
    tcpstore = [(a, naming.MASTER_PORT) for a in env.secondary(0)]
    assert all(env.net.reaches(env.foreign.argv(), tcpstore).values())


@contextmanager
def routed_via_secondary(env: Env, index: int) -> Iterator[str]:
    """The VLAN peer (NET_ADMIN in its own namespace) routes pod `index`'s pod IP via the pod's net1 address: its
    packets to the pod IP arrive on net1, where NetworkPolicy does not apply (ip route add <pod IP>/32 via ...)."""
    pod = env.sim.pods[index]
    via = pod.interfaces["net1"].split("/")[0]
    route = ["ip", "route", "add", f"{pod.ip}/32", "via", via, "dev", "net1"]
    subprocess.run(env.foreign.argv(*route), check=True, timeout=30)
    try:
        yield pod.ip
    finally:
        subprocess.run(env.foreign.argv("ip", "route", "del", f"{pod.ip}/32"), check=True, timeout=30)


def test_a_vlan_peer_routing_the_pod_ip_via_net1_reaches_nothing_of_ours(env: Env) -> None:
    """sshd, the idle agent, the home page and the debugger (`--debug-host pod`) bind the pod IP on eth0 only
    (SO_BINDTODEVICE): a SYN for the pod IP arriving on net1 finds no listener. So do the OAuth proxies' ports: the
    proxies (Go sidecars, stand-ins here) listen on loopback and forward.py owns their port on the pod IP, bound to
    eth0. TCPStore binds every interface without a device: the same route reaches it (what only a MultiNetworkPolicy
    stops), which also shows the route works and the device binding is what refuses the others. Without the
    binding (checked by hand on the previous programs) the route reaches 2222, 9099, 8090 and 5678, and with the
    proxies on the pod IP (d462751's `--http-address=[$(POD_IP)]:<port>`) their ports."""
    sim, pod = env.sim, env.sim.pods[0]
    rank = f"ml-dev _rank --cwd /tmp --debug-port {naming.DEBUG_PORT} --debug-host pod --no-stdin-watch -- python3 -c 'print(1)'"
    proc = sim.popen(0, rank)
    try:
        wait_listening(sim, 0, naming.DEBUG_PORT, 1)
        ours = [x for x in listeners(sim, 0) if x.ours and x.host == pod.ip and x.proto == "tcp" and STANDIN not in x.cmdline]
        assert {2222, 9099, 8090, naming.DEBUG_PORT} <= {x.port for x in ours}, ours
        assert all(x.device == "eth0" for x in ours), [(x.name, x.port, x.device) for x in ours]
        assert {p for _, p in env.proxies.values()} <= {x.port for x in ours}, "the proxies' pod-IP side is the forward's"
        unbound = [naming.MASTER_PORT]
        targets = [(pod.ip, x.port) for x in ours] + [(pod.ip, p) for p in unbound]
        before = env.net.reaches(env.foreign.argv(), targets)
        assert not any(before.values()), f"the NetworkPolicy stops the foreign pod on eth0: {before}"
        with routed_via_secondary(env, 0):
            reached = env.net.reaches(env.foreign.argv(), targets)
        assert not [t for t, ok in reached.items() if ok and t[1] not in unbound], reached
        assert all(reached[(pod.ip, p)] for p in unbound), f"the route via net1 reaches a listener without a device: {reached}"
        # the stack's own pods still reach them on eth0
        assert all(env.net.reaches(env.ns(1), [(pod.ip, x.port) for x in ours]).values())
    finally:
        sim.interrupt(proc, signal.SIGKILL)
        proc.wait(timeout=30)
        kill_in_pod(sim, 0, r"debugpy|_rank|print\(1\)")
        deadline = time.monotonic() + 20
        while any(x.port == naming.DEBUG_PORT for x in listeners(sim, 0)) and time.monotonic() < deadline:
            time.sleep(0.1)


@pytest.mark.parametrize("host", ["localhost", "pod"])
def test_debugger_is_on_loopback_unless_debug_host_pod(env: Env, host: str) -> None:
    sim, pod = env.sim, env.sim.pods[0]
    rank = "ml-dev _rank --cwd /tmp --debug-port 5678 --debug-host " + host + " --no-stdin-watch -- python3 -c 'print(1)'"
    proc = sim.popen(0, rank)
    try:
        wait_listening(sim, 0, naming.DEBUG_PORT, 1)
        time.sleep(0.3)  # a second bind would show by now
        bound = {x.host for x in listeners(sim, 0) if x.port == naming.DEBUG_PORT}
        other = env.net.reaches(env.ns(1), [(pod.ip, naming.DEBUG_PORT)])[(pod.ip, naming.DEBUG_PORT)]
        secondary = env.net.reaches(env.foreign.argv(), [(a, naming.DEBUG_PORT) for a in env.secondary(0)])
        assert not any(secondary.values()), secondary
        listening = [x for x in listeners(sim, 0) if x.name.startswith("debugger")]
        assert listening and not [x for x in listening if x.host in WILDCARDS], listening
        if host == "pod":
            assert bound == {pod.ip}
            assert other, "--debug-host pod: another pod of the stack attaches on the pod IP"
        else:
            assert bound == {"127.0.0.1"}
            assert not other, "no other pod reaches the debugger by default"
            # oc port-forward dials 127.0.0.1:5678 inside the pod (debugpy serves one client: this is it)
            dap = sim.exec(0, ["python3", "-c", DAP_INITIALIZE, "127.0.0.1", str(naming.DEBUG_PORT)], timeout=60)
            assert dap.returncode == 0, f"no DAP initialize answer through the pod's loopback: {dap.stderr}"
    finally:
        sim.interrupt(proc, signal.SIGKILL)
        proc.wait(timeout=30)
        kill_in_pod(sim, 0, r"debugpy|_rank|print\(1\)")
        deadline = time.monotonic() + 20
        while any(x.port == naming.DEBUG_PORT for x in listeners(sim, 0)) and time.monotonic() < deadline:
            time.sleep(0.1)


def _pod_ip_targets(env: Env, index: int) -> list[tuple[str, int]]:
    """Every listening port of pod `index` that answers on its pod IP (bound to it or to a wildcard)."""
    ip = env.sim.pods[index].ip
    return sorted({(ip, x.port) for x in listeners(env.sim, index) if x.proto == "tcp" and x.host in {ip, *WILDCARDS}})


def test_a_foreign_namespace_reaches_nothing_on_the_pod_ips(env: Env) -> None:
    for index in range(2):
        targets = _pod_ip_targets(env, index)
        ports = {p for _, p in targets}
        assert {2222, 9099} <= ports and (index or naming.MASTER_PORT in ports), targets
        reached = {t for t, ok in env.net.reaches(env.foreign.argv(), targets).items() if ok}
        assert not reached, f"a pod of another namespace reaches {sorted(reached)}"
    assert not env.net.pings(env.foreign.argv(), env.sim.pods[0].ip)


def test_without_the_policy_the_foreign_pod_would_reach_them(env: Env) -> None:
    """The enforcement is what stops it (the test above can fail): with no rules, 2222 and 9099 answer it."""
    pod = env.sim.pods[1]
    subprocess.run(["ip", "netns", "exec", pod.netns, "iptables", "-F", "INPUT"], check=True, timeout=30)
    try:
        assert all(env.net.reaches(env.foreign.argv(), [(pod.ip, 2222), (pod.ip, 9099)]).values())
    finally:
        env.net.apply()
    assert not any(env.net.reaches(env.foreign.argv(), [(pod.ip, 2222), (pod.ip, 9099)]).values())


def test_the_stacks_pods_reach_each_other_on_every_port_and_ping(env: Env) -> None:
    for index in range(2):
        targets = _pod_ip_targets(env, index)
        reached = env.net.reaches(env.ns(1 - index), targets)
        assert all(reached.values()), reached
        assert env.net.pings(env.ns(1 - index), env.sim.pods[index].ip), "ICMP between the stack's pods"
    # the node (kubelet probes, PodSim.connect) is always admitted
    with env.sim.connect(1, 2222):
        pass


def test_the_router_reaches_only_the_routed_proxy_ports(env: Env) -> None:
    proxy_ports = {port for _, port in env.proxies.values()}
    targets = _pod_ip_targets(env, 0)
    reached = {p for (_, p), ok in env.net.reaches(env.router.argv(), targets).items() if ok}
    assert reached == proxy_ports, f"router reaches {sorted(reached)}; routed proxies {sorted(proxy_ports)}"
    assert not {2222, 9099, naming.MASTER_PORT, 8090} & reached
    # every pod has the proxy sidecars and their forward; only pod 0's are behind the Service
    assert {p for (_, p), ok in env.net.reaches(env.router.argv(), _pod_ip_targets(env, 1)).items() if ok} == proxy_ports


def with_empty_router_pod_selector(policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The router peer as issue 25 rendered it: the same namespaceSelector plus `podSelector: {}`."""
    out = copy.deepcopy(policies)
    changed = 0
    for policy in out:
        for rule in policy["spec"].get("ingress") or []:
            for peer in rule.get("from") or []:
                if netpol.ROUTER_LABEL in ((peer.get("namespaceSelector") or {}).get("matchLabels") or {}):
                    assert "podSelector" not in peer, f"the rendered router peer has a podSelector: {peer}"
                    peer["podSelector"] = {}
                    changed += 1
    assert changed, "the render has a router peer"
    return out


def test_a_host_network_router_on_another_node_reaches_the_routed_ports(env: Env) -> None:
    """The default router on bare metal is HostNetwork and rarely on pod 0's node: its traffic arrives from that
    node's management-port IP. The rendered peer (namespaceSelector only) admits it on the routed ports; the
    `podSelector: {}` shape issue 25 rendered admits it nowhere (every Route 503), the pod-network router either way."""
    proxy_ports = {port for _, port in env.proxies.values()}
    targets = _pod_ip_targets(env, 0)

    def reached(source: netpol.Peer) -> set[int]:
        return {p for (_, p), ok in env.net.reaches(source.argv(), targets).items() if ok}

    assert reached(env.node_router) == proxy_ports
    others = {p for (_, p), ok in env.net.reaches(env.node_router.argv(), _pod_ip_targets(env, 1)).items() if ok}
    assert others == proxy_ports, "pod 1's proxies too (they are on every pod)"
    env.net.apply(with_empty_router_pod_selector(env.net.policies))
    try:
        assert reached(env.node_router) == set(), "with podSelector: {} the host-network router gets nowhere"
        assert reached(env.router) == proxy_ports, "the pod-network router gets in with either shape"
    finally:
        env.net.apply()
    assert reached(env.node_router) == proxy_ports


def test_the_enforced_rules_come_from_the_rendered_policy(env: Env) -> None:
    """What iptables holds: the stack's pods on everything, the router on its ports only, the rest dropped."""
    rules: dict[str, Any] = env.net.rules
    for pod in env.sim.pods:
        text = rules[pod.name]
        for other in env.sim.pods:
            assert f"-A INPUT -i eth0 -s {other.ip}/32 -j ACCEPT" in text
        assert f"-s {env.foreign.ip}/32" not in text
        router = re.findall(rf"-s {re.escape(env.router.ip)}/32 -p tcp -m tcp --dport (\d+) -j ACCEPT", text)
        assert {int(p) for p in router} == {port for _, port in env.proxies.values()}
        node = re.findall(rf"-s {re.escape(env.node_router.ip)}/32 -p tcp -m tcp --dport (\d+) -j ACCEPT", text)
        assert {int(p) for p in node} == {port for _, port in env.proxies.values()}
        assert text.rstrip().endswith("-A INPUT -i eth0 -j DROP\nCOMMIT")
