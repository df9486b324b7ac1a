"""The rendered NetworkPolicies enforced on the simulated pods: iptables rules inside each selected pod's netns.

An evaluator of its own (nothing from components/ or policy/): the render's NetworkPolicy objects, the pods'
labels and namespaces -> per selected pod, the sources (IPs) and ports it admits on eth0. As OVN-Kubernetes does:

* a pod selected by a policy with `Ingress` in its `policyTypes` (absent: Ingress) is isolated for ingress; what
  the policies' rules admit adds up; a rule without `from` admits every source, without `ports` every port and
  protocol (ICMP too); `endPort` is a range; a peer's `podSelector` alone means the policy's namespace,
  `namespaceSelector` (+ `podSelector`) other namespaces by their labels, `ipBlock` a CIDR minus `except`
  (kubernetes pkg/apis/networking/types.go NetworkPolicySpec, NetworkPolicyPeer, NetworkPolicyPort);
* ARP/ND always pass (go-controller/pkg/ovn/base_network_controller_policy.go arpAllowPolicyMatch
  "(arp || nd)": iptables never sees ARP here, and the pods are IPv4 only); traffic from the node (its management
  port IP; here the gateway 10.128.0.1 on the bridge, where `PodSim.connect` and the probes' kubelet would dial
  from) is always admitted (same file, addAllowACLFromNode: `ip4.src==<mgmtPortIP>`, allow-related); ACLs are
  allow-related (stateful), so replies to the pod's own connections pass (conntrack ESTABLISHED,RELATED);
* only the pod network: NetworkPolicy does not cover the Multus interfaces net1..N (that is MultiNetworkPolicy),
  so rules match `-i eth0` only; loopback is not pod-network traffic;
* a nil and an empty (`{}`) `podSelector` differ next to a `namespaceSelector`, as OVN-Kubernetes keeps on purpose
  (go-controller/pkg/ovn/base_network_controller_policy.go, useNamespaceAddrSet: "nil and empty PodSelectors
  behave differently"; kept in PR #4086). Nil: the peer is the selected namespaces' address sets, which hold
  their pods' IPs and, for the host-network namespace, every node's management-port IP (go-controller/pkg/ovn/
  master.go, addIPToHostNetworkNamespaceAddrSet). `{}` (or any podSelector, or a podSelector alone): the peer is
  a pod-selector address set, which holds pod-network pods' IPs only. Host-network traffic to a pod on another
  node arrives SNATed to the sending node's management-port IP (go-controller/pkg/node/management-port_linux.go),
  so a host-network router on another node is a source that is no pod's (`Endpoint.host_network`): only a
  namespaceSelector-only peer matching its namespace (`openshift-host-network`, labelled with the ingress policy
  group by openshift/cluster-network-operator when the router is HostNetwork) admits it.

Non-stack "pods" (`Enforcement.add_peer`): a network namespace with eth0 on the same bridge (and optionally on the
net1..N bridges), a namespace and labels of its own; they exist only to be sources.

    with Enforcement(sim) as net:                       # after sim.start(); iptables in every selected pod
        foreign = net.add_peer("other-team", {})        # a pod in a namespace without labels
        router = net.add_peer("openshift-ingress", {ROUTER_LABEL: ""})
        node = net.add_host_network_source(HOST_NETWORK_NAMESPACE, {ROUTER_LABEL: ""})  # a host-network router
        net.apply()                                     # (again after adding peers: sources are IPs)
        net.reaches(foreign, [(ip, 2222), ...])         # {(ip, port): bool}, in parallel
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.podsim.pods import GATEWAY, POD_PREFIX, PREFIX, PodSim, run

ROUTER_LABEL = "policy-group.network.openshift.io/ingress"  # OpenShift's router namespace (openshift-ingress) label
NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server (NamespaceDefaultLabelName)
HOST_NETWORK_NAMESPACE = "openshift-host-network"  # OVN-Kubernetes' config.Kubernetes.HostNetworkNamespace on OpenShift
OTHER_NODE_MANAGEMENT_IP = "10.128.2.2"
"""Another node's management-port IP: the second address of its subnet (OVN-Kubernetes; OpenShift's hostPrefix 23
gives that node 10.128.2.0/23), inside the pod network's /14 (on-link here) and no pod's address."""


def missing_requirements() -> str | None:
    for tool in ("iptables-restore", "ping"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian: iptables, iputils-ping; `make system-deps`)"
    probe = subprocess.run(["unshare", "--net", "iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED", "-j", "ACCEPT"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    if probe.returncode:
        return f"iptables with conntrack does not work in a network namespace here: {probe.stderr.strip()}"
    return None


@dataclass(frozen=True)
class Endpoint:
    """A pod as the policy evaluator sees it: where it lives, its labels, its pod IP."""

    name: str
    namespace: str
    namespace_labels: Mapping[str, str]
    labels: Mapping[str, str]
    ip: str
    host_network: bool = False
    """An address in its namespace's address set that no pod selector ever holds (a node's management-port IP)."""


@dataclass(frozen=True)
class Allow:
    """One admitted (source, protocol, port range) on eth0; None = any."""

    source: str | None
    protocol: str | None
    low: int | None = None
    high: int | None = None


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels AND matchExpressions In/NotIn/Exists/DoesNotExist); {} selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_sources(peer: Mapping[str, Any], policy_ns: str, endpoints: Sequence[Endpoint]) -> list[str]:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        net = ipaddress.ip_network(block["cidr"], strict=False)
        excluded = [ipaddress.ip_network(c, strict=False) for c in block.get("except") or []]
        out = []
        for e in endpoints:
            ip = ipaddress.ip_address(e.ip)
            if ip in net and not any(ip in x for x in excluded):
                out.append(e.ip)
        return out
    pods = peer.get("podSelector")
    if "namespaceSelector" in peer:
        spaces = [e for e in endpoints if selects(peer["namespaceSelector"], e.namespace_labels)]
    else:
        spaces = [e for e in endpoints if e.namespace == policy_ns]
    if "namespaceSelector" in peer and pods is None:  # useNamespaceAddrSet: the namespaces' address sets
        return [e.ip for e in spaces]
    # a pod-selector address set (`{}` included): pod-network pods only, never a management-port IP
    return [e.ip for e in spaces if not e.host_network and selects(pods, e.labels)]


def _ports(rule: Mapping[str, Any], named: Mapping[str, int]) -> list[tuple[str, int | None, int | None]] | None:
    entries = rule.get("ports") or []
    if not entries:
        return None
    out: list[tuple[str, int | None, int | None]] = []
    for p in entries:
        proto = str(p.get("protocol") or "TCP")
        port = p.get("port")
        if port is None:
            out.append((proto, None, None))
            continue
        number = named.get(port) if isinstance(port, str) and not port.isdigit() else int(port)
        if number is None:
            continue  # a named port the pod does not have admits nothing
        out.append((proto, number, int(p.get("endPort") or number)))
    return out


def allowed(
    target: Endpoint, policies: Iterable[Mapping[str, Any]], endpoints: Sequence[Endpoint], named: Mapping[str, int]
) -> list[Allow] | None:
    """What `target` admits on the pod network: None when no policy isolates it (everything), else the allow list."""
    isolating = [
        p
        for p in policies
        if p["metadata"].get("namespace") == target.namespace
        and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
        and selects(p["spec"].get("podSelector"), target.labels)
    ]
    if not isolating:
        return None
    out: list[Allow] = []
    for policy in isolating:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            sources: Sequence[str | None] = [None]
            if peers:
                sources = sorted({ip for peer in peers for ip in _peer_sources(peer, target.namespace, endpoints)})
            ports = _ports(rule, named)
            for source in sources:
                if ports is None:
                    out.append(Allow(source, None))
                else:
                    out.extend(Allow(source, proto, low, high) for proto, low, high in ports)
    return out


def iptables_rules(allows: Sequence[Allow] | None, node_ip: str = GATEWAY) -> str:
    """iptables-restore input for the pod's netns: INPUT on eth0 = node, replies, then the allow list, else DROP."""
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    if allows is not None:
        lines += [
            "-A INPUT -i eth0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"-A INPUT -i eth0 -s {node_ip}/32 -j ACCEPT",
        ]
        for a in allows:
            rule = "-A INPUT -i eth0"
            if a.source:
                rule += f" -s {a.source}/32"
            if a.protocol:
                proto = a.protocol.lower()
                rule += f" -p {proto}"
                if a.low is not None:
                    rule += f" -m {proto} --dport {a.low}" + (f":{a.high}" if a.high != a.low else "")
            lines.append(rule + " -j ACCEPT")
        lines.append("-A INPUT -i eth0 -j DROP")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


CONNECT = r"""
import json, socket, sys, threading
targets = json.loads(sys.argv[1])
result = {}
def one(host, port):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(float(sys.argv[2]))
    try:
        s.connect((host, port))
        result["%s:%d" % (host, port)] = True
    except OSError:
        result["%s:%d" % (host, port)] = False
    finally:
        s.close()
threads = [threading.Thread(target=one, args=(h, p)) for h, p in targets]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(result))
"""


@dataclass
class Peer:
    """A non-stack pod: a network namespace with eth0 on the pod bridge (and netK on netK's bridge, if asked)."""

    endpoint: Endpoint
    netns: str
    interfaces: dict[str, str] = field(default_factory=dict)

    @property
    def ip(self) -> str:
        return self.endpoint.ip

    def argv(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *cmd]


class Enforcement:
    """The simulation's NetworkPolicies as iptables rules in its pods, plus peers from other namespaces."""

    def __init__(self, sim: PodSim, namespace_labels: Mapping[str, str] | None = None) -> None:
        self.sim = sim
        self.policies = [r.inputs for r in sim.resources if r.kind == "NetworkPolicy"]
        self.namespace_labels = {NAME_LABEL: sim.namespace, **(namespace_labels or {})}
        labels = dict(sim.statefulset["spec"]["template"]["metadata"].get("labels") or {})
        self.stack = [Endpoint(p.name, sim.namespace, self.namespace_labels, labels, p.ip) for p in sim.pods]
        self.peers: list[Peer] = []
        self.named_ports = {
            str(port["name"]): int(port["containerPort"])
            for c in sim.pod_spec["containers"]
            for port in c.get("ports") or []
            if port.get("name")
        }
        self.rules: dict[str, str] = {}

    def __enter__(self) -> Enforcement:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def endpoints(self) -> list[Endpoint]:
        return [*self.stack, *(p.endpoint for p in self.peers)]

    def add_peer(self, namespace: str, namespace_labels: Mapping[str, str], labels: Mapping[str, str] | None = None,
                 networks: Sequence[str] = ()) -> Peer:  # fmt: skip
        """A pod of `namespace` (labels: `namespace_labels` + kubernetes.io/metadata.name) on the pod bridge, with
        10.128.0.(200+k); `networks` (e.g. ["net1"]) also attaches it to those Multus bridges as 10.0.(103+j).(200+k)."""
        k = len(self.peers)
        ip = f"10.128.0.{200 + k}"
        netns = f"{PREFIX}{self.sim.run_id}-x{k}"
        peer = Peer(
            Endpoint(f"{namespace}-peer-{k}", namespace, {NAME_LABEL: namespace, **namespace_labels}, dict(labels or {}), ip), netns
        )
        return self._attach(peer, networks)

    def _attach(self, peer: Peer, networks: Sequence[str]) -> Peer:
        k, netns, ip = len(self.peers), peer.netns, peer.ip
        c = self.sim.cluster_ns
        run(["ip", "netns", "add", netns])
        self.peers.append(peer)
        run(["ip", "-n", netns, "link", "set", "lo", "up"])
        run(["ip", "-n", c, "link", "add", f"x{k}", "type", "veth", "peer", "name", "eth0", "netns", netns])
        run(["ip", "-n", c, "link", "set", f"x{k}", "master", "br0", "up"])
        run(["ip", "-n", netns, "addr", "add", f"{ip}/{POD_PREFIX}", "dev", "eth0"])
        run(["ip", "-n", netns, "link", "set", "eth0", "up"])
        for name in networks:
            j = int(name.removeprefix("net")) - 1
            bridge, outer = f"b{name}"[:15], f"{name}x{k}"[:15]
            run(["ip", "-n", c, "link", "add", outer, "type", "veth", "peer", "name", name, "netns", netns])
            run(["ip", "-n", c, "link", "set", outer, "master", bridge, "up"])
            address = f"10.0.{103 + j}.{200 + k}/24"
            run(["ip", "-n", netns, "addr", "add", address, "dev", name])
            run(["ip", "-n", netns, "link", "set", name, "up"])
            peer.interfaces[name] = address
        return peer

    def add_host_network_source(self, namespace: str, namespace_labels: Mapping[str, str], ip: str = OTHER_NODE_MANAGEMENT_IP) -> Peer:
        """Host-network traffic from another node (e.g. a host-network router there): a netns on the pod bridge with
        that node's management-port IP, which is no pod's; in `namespace`'s address set only (`Endpoint.host_network`)."""
        k = len(self.peers)
        netns = f"{PREFIX}{self.sim.run_id}-x{k}"
        endpoint = Endpoint(f"{namespace}-node-{k}", namespace, {NAME_LABEL: namespace, **namespace_labels}, {}, ip, host_network=True)
        return self._attach(Peer(endpoint, netns), ())

    def apply(self, policies: Sequence[Mapping[str, Any]] | None = None) -> dict[str, str]:
        """(Re)write every stack pod's INPUT rules from the rendered policies (or `policies` in their place, to show
        what another shape would do); returns pod name -> rules."""
        everyone = self.endpoints()
        chosen = self.policies if policies is None else list(policies)
        for pod, target in zip(self.sim.pods, self.stack, strict=True):
            text = iptables_rules(allowed(target, chosen, everyone, self.named_ports))
            res = subprocess.run(
                ["ip", "netns", "exec", pod.netns, "iptables-restore"], input=text, capture_output=True, text=True, timeout=30
            )
            if res.returncode:
                raise RuntimeError(f"iptables-restore in {pod.name}: {res.stderr.strip()}\n{text}")
            self.rules[pod.name] = text
        return self.rules

    def reaches(self, argv_prefix: Sequence[str], targets: Iterable[tuple[str, int]], timeout: float = 3) -> dict[tuple[str, int], bool]:
        """TCP connects from a namespace (`peer.argv()`, `["ip", "netns", "exec", pod.netns]`), all in parallel."""
        wanted = sorted(set(targets))
        out = subprocess.run(
            [*argv_prefix, sys.executable, "-c", CONNECT, json.dumps(wanted), str(timeout)],
            capture_output=True, text=True, timeout=timeout + 30,
        )  # fmt: skip
        if out.returncode:
            raise RuntimeError(out.stderr)
        found = json.loads(out.stdout)
        return {(h, p): found[f"{h}:{p}"] for h, p in wanted}

    def pings(self, argv_prefix: Sequence[str], host: str) -> bool:
        """One ICMP echo (root's raw socket in that namespace: the path is what is tested, not the pod's caps)."""
        return subprocess.run([*argv_prefix, "ping", "-c", "1", "-W", "2", host], capture_output=True, timeout=30).returncode == 0

    def close(self) -> None:
        for peer in self.peers:
            subprocess.run(["ip", "netns", "del", peer.netns], capture_output=True, timeout=30)
        self.peers.clear()
