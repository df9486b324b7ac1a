"""Simulated pods started from a stack's rendered objects (root only; the rules are in the package docstring).

sim = PodSim(render_stack("barcelona"))          # or any RunResult (a variant config)
with sim.start():                                  # N pods, each Ready by its rendered probe
    sim.exec(0, "ml-dev exec -- hostname")         # `oc exec <pod-0> -- bash -c ...`
    sim.pods[1].ip, sim.pods[1].netns               # pod IP, network namespace (`ip netns exec`)
    sim.swap_configmap("ml-dev-env-startup")       # a ConfigMap update: ..data swapped on every pod
    sim.add_interfaces(1, {"net5": "10.0.200.11/24"})
    sim.terminate(1)                               # preStop, SIGTERM to PID 1, SIGKILL after the grace
# leaving the block (or sim.stop()) kills every process and removes every namespace and directory
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets as pysecrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.fixtures import programs
from tests.podsim import nodetools
from tests.podsim.admission import Identity, admit
from tests.podsim.layout import AtomicVolume
from tests.podsim.render import PodFacts, container_env, main_container, service_links

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PREFIX = "podsim-"
"""Every network namespace and directory the simulation makes starts with this (tests look for leftovers)."""
CLUSTER_DOMAIN = "cluster.local"
DNS_IP = "172.30.0.10"  # OpenShift's DNS Service address (the default service network 172.30.0.0/16)
GATEWAY = "10.128.0.1"  # the pod network's gateway (OVN-Kubernetes: the first address of the node's subnet)
POD_PREFIX = 14  # 10.128.0.0/14, OpenShift's default clusterNetwork
MEMLOCK_BYTES = 8 << 20  # the kernel's default RLIMIT_MEMLOCK (8 MiB since Linux 5.16), what CRI-O's containers inherit
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the base image's PATH (Debian/Ubuntu default)
TOOLS = ("unshare", "nsenter", "ip", "setpriv", "prlimit", "sshd", "ssh", "ssh-keygen", "rsync", "pdsh", "python3", "git")
MACHINE_TOOLS = ("mpirun", "orted")
"""Open MPI of this machine: the fabric check's launcher and daemon on the pods (tests/podsim/nodetools.py)."""
SERVICE_ACCOUNT = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run -> /run in the image
BASHRC_HOOK = "if [ -r /etc/profile.d/ml-dev-env.sh ]; then . /etc/profile.d/ml-dev-env.sh; fi"
"""The line images/base.Containerfile appends to /etc/bash.bashrc (tests/podsim/test_pods.py checks it is there)."""
MEMLOCK_LIMITS = ("* soft memlock unlimited", "* hard memlock unlimited")
"""images/base.Containerfile's /etc/security/limits.d/99-ml-dev-env-memlock.conf."""


RUN_IDS: list[str] = []
"""The run ids of the simulations this process started (the leftover check looks only for those: other test runs
on the same machine have their own)."""

TEST_SECRETS: dict[str, str | None] = {"vscodePassword": "test-password", "jupyterToken": "test-token"}


def render_stack(stack: str, mutate: Any = None) -> Any:
    """The recorded objects of a committed stack (`mutate(objects)` edits its config first), through the real program."""
    from tests.conftest import run_objects, stack_objects

    objects = stack_objects(stack)
    if mutate:
        mutate(objects)
    result = run_objects(stack, objects, TEST_SECRETS)
    if result.error is not None:
        raise RuntimeError(f"{stack}: the render failed: {result.error}")
    return result


def missing_requirements() -> str | None:
    """Why the simulation cannot run here (None when it can)."""
    absent = programs.missing(*TOOLS, *MACHINE_TOOLS, path=BASE_PATH)
    if absent:
        return absent
    if os.geteuid() != 0:
        return "needs root (network, PID, mount and UTS namespaces; other UIDs)"
    probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount", "--uts", "true"], capture_output=True, timeout=30)
    if probe.returncode:
        return f"unshare of net/pid/mount/uts namespaces is not permitted here: {probe.stderr.decode().strip()}"
    return None


CAPABILITY_BITS = {
    "CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
    "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10, "NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13,
    "IPC_LOCK": 14, "IPC_OWNER": 15, "SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20,
    "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25, "SYS_TTY_CONFIG": 26, "MKNOD": 27,
}  # fmt: skip
"""linux/capability.h"""


def capability_mask(status: str, field_name: str = "CapEff") -> set[str]:
    """Capability names set in a /proc/<pid>/status field."""
    found = re.search(rf"^{field_name}:\s*([0-9a-f]+)", status, re.M)
    assert found, f"/proc/<pid>/status has a {field_name} line: {status!r}"
    value = int(found.group(1), 16)
    return {name for name, bit in CAPABILITY_BITS.items() if value >> bit & 1}


def machine_has_capability(name: str) -> bool:
    return name in capability_mask(Path("/proc/self/status").read_text(), "CapBnd")


def image_env(containerfile: Path = REPO / "images" / "base.Containerfile") -> dict[str, str]:
    """The image's ENV instructions (in order; `${VAR}` from earlier values or the base image's PATH)."""
    env = {"PATH": BASE_PATH}
    text = containerfile.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if not line.startswith("ENV "):
            continue
        for item in shlex.split(line[4:]):
            key, _, value = item.partition("=")
            env[key] = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), value)
    return env


def image_workdir(containerfile: Path = REPO / "images" / "base.Containerfile") -> str:
    found = re.findall(r"^WORKDIR\s+(\S+)", containerfile.read_text(), re.M)
    return found[-1] if found else "/"


def run(argv: Sequence[str], timeout: float = 30) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if res.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def keygen(path: Path, comment: str) -> str:
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return Path(f"{path}.pub").read_text().strip()


@dataclass
class Pod:
    index: int
    name: str
    ip: str
    netns: str
    host_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    pid: int = 0  # PID 1 of the pod, as this machine numbers it
    volumes: dict[str, AtomicVolume] = field(default_factory=dict)
    interfaces: dict[str, str] = field(default_factory=dict)

    def path(self, inside: str) -> Path:
        """A path of the pod's filesystem as this machine sees it (through PID 1's root)."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    @property
    def log(self) -> Path:
        return self.host_dir / "pod.log"


class PodSim:
    """N pods of one stack's rendered StatefulSet; see the module docstring for the API."""

    def __init__(
        self,
        result: Any,
        count: int | None = None,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
        user_keys: Sequence[str] = (),
        grace_seconds: float | None = None,
        read_only_passwd: Sequence[int] = (),
        python_packages: Sequence[str] = (),
        node: Any = None,
        image_programs: Mapping[str, str | Path] | None = None,
        image_paths: Sequence[Path] = (),
        namespace_secrets: Mapping[str, Mapping[str, str]] | None = None,
        claims: Path | None = None,
        pod_interface: str = "eth0",
        images: Mapping[str, Path] | None = None,
    ) -> None:
        """`read_only_passwd`: pods whose image leaves /etc/passwd read-only (not the stack's base image: the
        programs fall back to nss_wrapper); `python_packages`: modules of this interpreter the image has
        (copied into the pods' site-packages, e.g. debugpy of images/base-requirements.in); `image_programs`:
        {path in the image: script, or a Path: that file's bytes, as the image ships them (py-spy's static binary of
        the base lock: a pod never reaches into this machine's tree, whose checkout may be mode 0700)} for programs
        the image has and this machine lacks (the dev servers code-server, jupyter, tensorboard of
        images/base.Containerfile), installed mode 0755 at those paths; they
        may record what they see under /run/podsim-image (mode 1777, the stubs' own directory); `namespace_secrets`:
        {name: {key: value}} of Secrets that exist in the namespace without the stack rendering them (env.secrets: the
        user made them with `oc create secret generic`); a Secret volume naming one that exists nowhere is empty when
        `optional` (kubernetes pkg/volume/secret/secret.go SetUpAt), else the pod does not start; `claims`: the
        namespace's claims (another PodSim's `claims`: two environments of one namespace mount one claim by name;
        that PodSim outlives this one); `pod_interface`: the name of each pod's pod-network interface (the runtime's
        default is eth0, cri-o/ocicni pkg/ocicni/types.go DefaultInterfaceName; a CNI may name it otherwise); `images`:
        {reference: the image's root filesystem on this machine (e.g. `buildah mount` of the pulled image)} for the
        render's image volumes (`volumes[].image`, models[].mountInEnv), mounted read-only as the kubelet's runtime
        mounts them (with the mount's `subPath`); an image volume whose reference is not given stops the pod's start."""
        self.result = result
        self.resources = list(result.resources)
        sts = next(r.inputs for r in self.resources if r.kind == "StatefulSet")
        self.statefulset = sts
        self.namespace = sts["metadata"]["namespace"]
        self.app = sts["metadata"]["name"]
        self.headless = sts["spec"]["serviceName"]
        self.pod_spec = sts["spec"]["template"]["spec"]
        self.container = self.pod_spec["containers"][0]
        self.main = main_container(sts, self.container["name"])
        self.count = int(count if count is not None else sts["spec"].get("replicas", 1))
        self.identity: Identity = admit(self.resources, self.pod_spec, self.main)
        # a capability this machine's own bounding set lacks cannot be given to a pod (e.g. SYS_RESOURCE in a container)
        self.missing_capabilities = tuple(c for c in self.identity.capabilities if not machine_has_capability(c))
        if self.missing_capabilities:
            warnings.warn(
                f"simulated pods lack {', '.join(self.missing_capabilities)} (not in this machine's bounding set): what needs "
                "them is skipped (PodSim.require_capabilities)",
                stacklevel=2,
            )
            self.identity = replace(
                self.identity, capabilities=tuple(c for c in self.identity.capabilities if c not in self.missing_capabilities)
            )
        self.grace = float(grace_seconds if grace_seconds is not None else self.pod_spec.get("terminationGracePeriodSeconds", 30))
        self.run_id = pysecrets.token_hex(3)
        RUN_IDS.append(self.run_id)
        self.base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{self.run_id}-", dir="/var/tmp"))
        self.base.chmod(0o755)
        self.claims = claims if claims is not None else self.base / "pvc"
        self.pod_interface = pod_interface
        self.cluster_ns = f"{PREFIX}{self.run_id}-c"
        self.dns: subprocess.Popen[str] | None = None
        self.keys = self.base / "keys"
        self.keys.mkdir(mode=0o700)
        self.secrets = self._secrets(secrets or {}, list(user_keys))
        for name, values in (namespace_secrets or {}).items():
            assert name not in self.secrets, f"Secret {name} is rendered by the stack; pass its values as secrets="
            self.secrets[name] = dict(values)
        self.configmaps = {r.inputs["metadata"]["name"]: dict(r.inputs.get("data") or {}) for r in self.resources if r.kind == "ConfigMap"}
        self.pods = [
            Pod(
                i,
                f"{self.app}-{i}",
                f"10.128.0.{10 + i}",
                f"{PREFIX}{self.run_id}-p{i}",
                self.base / f"pod{i}",
            )
            for i in range(self.count)
        ]
        self.images = dict(images or {})
        self.read_only_passwd = tuple(read_only_passwd)
        self.python_packages = self._packages(python_packages)
        self.gpus = int((self.main.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0))
        self._started = False
        # the node behind the pods (tests/podsim/nodetools.py Node): its `setup(sim, pod, root)` gives shell lines
        # run in the pod's mount and network namespaces before its root is pivoted (node tools, sysfs); None: the
        # two stubs above only
        self.node = node
        self.image_programs = dict(image_programs or {})
        # `image_paths`: directories of this machine the image has at the same path (a test's virtualenv standing in
        # for the image's pip installs, e.g. JupyterLab of images/base.Containerfile), bound read-only over the
        # image's empty /tmp and /var/tmp too: a checkout may lie there (CI clones into a mode-0700 mktemp -d).
        self.image_paths = [Path(p) for p in image_paths]

    def require_capabilities(self, *names: str, what: str) -> None:
        """Skip the calling test, saying why, when the pods lack one of `names` (`missing_capabilities`)."""
        lacking = [n for n in names if n in self.missing_capabilities]
        if lacking:
            import pytest

            pytest.skip(f"{what} needs {', '.join(lacking)}, which this machine's bounding set lacks (a pod's SCC gives it)")

    # ---------------------------------------------------------------------------------- inputs

    def _secrets(self, given: Mapping[str, Mapping[str, str]], user_keys: list[str]) -> dict[str, dict[str, str]]:
        """Test values for every rendered Secret (its values are secrets, redacted in the render); the stack's
        SSH Secret gets fresh ed25519 keys (pulumi-tls makes them in the real stack)."""
        from components import devloop  # the Secret's authorized_keys builder, as the stack calls it

        out: dict[str, dict[str, str]] = {}
        for r in self.resources:
            if r.kind != "Secret":
                continue
            name = r.inputs["metadata"]["name"]
            keys = list(r.inputs.get("stringData") or {}) + list(r.inputs.get("data") or {})
            values = dict.fromkeys(keys, "test-value")
            if {"host_ed25519_key", "id_ed25519", "authorized_keys"} <= set(keys):
                host_pub, client_pub = keygen(self.keys / "host", "host"), keygen(self.keys / "client", "stack")
                self.user_pub = keygen(self.keys / "user", "user@laptop")
                self.stranger_pub = keygen(self.keys / "stranger", "stranger")
                self.host_pub = host_pub
                values.update(
                    {
                        "host_ed25519_key": (self.keys / "host").read_text(),
                        "host_ed25519_key.pub": host_pub + "\n",
                        "id_ed25519": (self.keys / "client").read_text(),
                        "id_ed25519.pub": client_pub + "\n",
                        "authorized_keys": devloop.authorized_keys(client_pub, [self.user_pub, *user_keys]),
                    }
                )
            out[name] = {**values, **dict(given.get(name, {}))}
        return out

    def _packages(self, names: Sequence[str]) -> list[str]:
        import importlib

        site = self.base / "site"
        site.mkdir()
        found = []
        for name in names:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            shutil.copytree(Path(str(module.__file__)).parent, site / name)
            found.append(name)
        return found

    def facts(self, pod: Pod) -> PodFacts:
        return PodFacts(pod.name, self.namespace, pod.ip, f"node-{pod.index}")

    def fqdn(self, index: int) -> str:
        return f"{self.pods[index].name}.{self.headless}.{self.namespace}.svc.{CLUSTER_DOMAIN}"

    def container_env(self, pod: Pod) -> dict[str, str]:
        """The main container's process env: the image's ENV, the rendered env as the kubelet makes it, then what
        the device plugins of the requested extended resources hand the kubelet (`device_plugin_env`)."""
        links = service_links(self.resources, self.pod_spec)
        return {**image_env(), **container_env(self.main, self.facts(pod), self.secrets, links), **self.device_plugin_env(pod)}

    def device_plugin_env(self, pod: Pod) -> dict[str, str]:
        """Env the device plugins' Allocate answers add (the kubelet merges it into the container's env):
        * SR-IOV network device plugin, resource `<prefix>/<name>` (the SR-IOV operator's prefix openshift.io):
          PCIDEVICE_<PREFIX, `.` as `_`>_<NAME>, upper-cased, = the allocated VF's PCI address
          (k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/server.go getEnvs);
        * NVIDIA device plugin, nvidia.com/gpu (device-list-strategy envvar, the default): NVIDIA_VISIBLE_DEVICES =
          the allocated GPUs' UUIDs (NVIDIA/k8s-device-plugin internal/plugin/server.go)."""
        env: dict[str, str] = {}
        limits = (self.main.get("resources") or {}).get("limits") or {}
        sriov = sorted(r for r in limits if r.startswith("openshift.io/"))
        for k, resource in enumerate(sriov):
            prefix, _, name = resource.partition("/")
            env[f"PCIDEVICE_{prefix.replace('.', '_')}_{name}".upper()] = f"0000:{0x03 + 0x20 * k:02x}:00.{2 + pod.index % 4}"
        if self.gpus:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(f"GPU-{i:08x}-4d87-49d1-2eb9-39ec2baddf9b" for i in range(self.gpus))
        return env

    def _records(self) -> dict[str, list[str]]:
        svc = f"{self.headless}.{self.namespace}.svc.{CLUSTER_DOMAIN}"
        records = {f"{p.name}.{svc}": [p.ip] for p in self.pods}
        records[svc] = [p.ip for p in self.pods]  # publishNotReadyAddresses: every pod, ready or not
        records[f"kubernetes.default.svc.{CLUSTER_DOMAIN}"] = ["172.30.0.1"]
        return records

    def hosts_file(self, pod: Pod) -> str:
        """kubelet_pods.go managedHostsFileContent: localhost lines, then only the pod itself (hostname =
        pod name, subdomain = the StatefulSet's serviceName)."""
        return (
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            "fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n"
            f"{pod.ip}\t{pod.name}.{self.headless}.{self.namespace}.svc.{CLUSTER_DOMAIN}\t{pod.name}\n"
        )

    def resolv_conf(self) -> str:
        """pkg/kubelet/network/dns/dns.go (ClusterFirst): the cluster DNS, search <ns>.svc, svc, the domain; ndots:5."""
        ns = self.namespace
        return f"search {ns}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\nnameserver {DNS_IP}\noptions ndots:5\n"

    # ------------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 90, wait: bool = True) -> PodSim:
        """Network, DNS and every pod; with `wait`, until each is Ready (else call `wait_ready` per pod)."""
        self._started = True
        try:
            self._network()
            for pod in self.pods:
                self._start_pod(pod)
            for pod in self.pods if wait else ():
                self.wait_ready(pod.index, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> PodSim:
        return self if self._started else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _network(self) -> None:
        c = self.cluster_ns
        run(["ip", "netns", "add", c])
        run(["ip", "-n", c, "link", "set", "lo", "up"])
        run(["ip", "-n", c, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", c, "link", "set", "br0", "up"])
        run(["ip", "-n", c, "addr", "add", f"{GATEWAY}/{POD_PREFIX}", "dev", "br0"])
        run(["ip", "-n", c, "addr", "add", f"{DNS_IP}/32", "dev", "br0"])
        for pod in self.pods:
            run(["ip", "netns", "add", pod.netns])
            dev = self.pod_interface
            run(["ip", "-n", c, "link", "add", f"v{pod.index}", "type", "veth", "peer", "name", dev, "netns", pod.netns])
            run(["ip", "-n", c, "link", "set", f"v{pod.index}", "master", "br0", "up"])
            run(["ip", "-n", pod.netns, "link", "set", "lo", "up"])
            run(["ip", "-n", pod.netns, "addr", "add", f"{pod.ip}/{POD_PREFIX}", "dev", dev])
            run(["ip", "-n", pod.netns, "link", "set", dev, "up"])
            run(["ip", "-n", pod.netns, "route", "add", "default", "via", GATEWAY])
        records = self.base / "dns-records.json"
        records.write_text(json.dumps(self._records(), indent=1))
        with open(self.base / "dns.log", "wb") as log:
            self.dns = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{c}", sys.executable, "-u", str(HERE / "dns.py"), DNS_IP, str(records)],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        assert self.dns.stdout is not None
        ready, _, _ = select.select([self.dns.stdout], [], [], 30)
        if not ready or self.dns.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the stub DNS did not start: {(self.base / 'dns.log').read_text()}")
        # a pod with extra networks (Multus: k8s.v1.cni.cncf.io/networks) gets net1..netN
        networks = (self.statefulset["spec"]["template"]["metadata"].get("annotations") or {}).get("k8s.v1.cni.cncf.io/networks", "")
        for pod in self.pods:
            names = [n for n in networks.split(",") if n.strip()]
            self.add_interfaces(pod.index, {f"net{k + 1}": f"10.0.{103 + k}.{10 + pod.index}/24" for k in range(len(names))})

    def add_interfaces(self, index: int, interfaces: Mapping[str, str]) -> None:
        """Extra interfaces in pod `index`'s network namespace: {name: "address/prefix"}, up. Each is a veth whose
        other end is on a bridge of the simulation's own namespace, one bridge per interface name (what Multus
        attaches as net1..netN): netK of every pod reaches netK of the others, nothing else."""
        pod = self.pods[index]
        for name, address in interfaces.items():
            bridge, peer = f"b{name}"[:15], f"{name}p{index}"[:15]
            if subprocess.run(["ip", "-n", self.cluster_ns, "link", "show", bridge], capture_output=True, timeout=30).returncode:
                run(["ip", "-n", self.cluster_ns, "link", "add", bridge, "type", "bridge"])
                run(["ip", "-n", self.cluster_ns, "link", "set", bridge, "up"])
            run(["ip", "-n", self.cluster_ns, "link", "add", peer, "type", "veth", "peer", "name", name, "netns", pod.netns])
            run(["ip", "-n", self.cluster_ns, "link", "set", peer, "master", bridge, "up"])
            run(["ip", "-n", pod.netns, "addr", "add", address, "dev", name])
            run(["ip", "-n", pod.netns, "link", "set", name, "up"])
            pod.interfaces[name] = address

    def _volume_dirs(self, pod: Pod) -> dict[str, tuple[str, Path | None]]:
        """volume name -> (kind, host directory) for the pod; configMap/secret volumes in the atomic-writer layout."""
        fs_group = self.identity.fs_group
        out: dict[str, tuple[str, Path | None]] = {}
        vdir = pod.host_dir / "volumes"
        claims = {t["metadata"]["name"] for t in self.statefulset["spec"].get("volumeClaimTemplates") or []}
        for name in claims:  # one PVC per pod (volumeClaimTemplates)
            out[name] = ("pvc", self._pvc_dir(vdir / name))
        for v in self.pod_spec.get("volumes") or []:
            name = v["name"]
            if "persistentVolumeClaim" in v:
                out[name] = ("pvc", self._pvc_dir(self.claims / v["persistentVolumeClaim"]["claimName"]))
            elif "emptyDir" in v:
                kind = "tmpfs" if (v["emptyDir"] or {}).get("medium") == "Memory" else "emptyDir"
                d = vdir / name
                d.mkdir(parents=True, exist_ok=True)
                d.chmod(0o777)  # emptyDir: 0777 (pkg/volume/emptydir/empty_dir.go perm)
                out[name] = (kind, d)
            elif "configMap" in v or "secret" in v:
                src = v.get("configMap") or v["secret"]
                data = self._source_data(v)
                mode = int(src.get("defaultMode", 0o644))
                volume = AtomicVolume(vdir / name, mode=mode, gid=fs_group)
                volume.write_volume(src, data)
                pod.volumes[name] = volume
                out[name] = ("atomic", vdir / name)
            elif "image" in v:
                reference = v["image"]["reference"]
                if reference not in self.images:
                    raise KeyError(f"image volume {name}: {reference} is not given (PodSim images=): the kubelet could not pull it")
                out[name] = ("image", self.images[reference])
            else:
                raise KeyError(f"volume {name}: {sorted(v)} is not simulated")
        sa = AtomicVolume(vdir / "kube-api-access", mode=0o644, gid=fs_group)
        sa.write({"token": "test-service-account-token", "ca.crt": "test-ca\n", "namespace": self.namespace})
        pod.volumes["kube-api-access"] = sa
        return out

    def _source_data(self, volume: Mapping[str, Any]) -> dict[str, str]:
        """The object behind a configMap/secret volume; an absent one is empty when the volume is `optional`
        (pkg/volume/secret/secret.go and configmap/configmap.go SetUpAt: NotFound and optional -> an empty object)."""
        kind, key, objects = ("configMap", "name", self.configmaps) if "configMap" in volume else ("secret", "secretName", self.secrets)
        src = volume[kind]
        if src[key] in objects:
            return dict(objects[src[key]])
        if src.get("optional"):
            return {}
        raise KeyError(f"volume {volume['name']}: {kind} {src[key]} not found: the pod would stay in ContainerCreating")

    def delete_secret(self, name: str) -> None:
        """`oc delete secret <name>`: the kubelet's next sync of an optional volume writes an empty payload."""
        self.secrets.pop(name, None)
        self._resync(name)

    def _pvc_dir(self, path: Path) -> Path:
        """A fresh volume: root-owned 0755; with an fsGroup group-owned by it, g+rwx and setgid (volume_linux.go
        SetVolumeOwnership)."""
        if not path.exists():
            path.mkdir(parents=True)
            if self.identity.fs_group is not None:
                os.chown(path, 0, self.identity.fs_group)
                path.chmod(0o2775)
            else:
                path.chmod(0o755)
        return path

    def _start_pod(self, pod: Pod) -> None:
        pod.host_dir.mkdir(parents=True, exist_ok=True)
        pod.host_dir.chmod(0o755)
        volumes = self._volume_dirs(pod)
        pod.pid = 0
        etc = pod.host_dir / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "hosts").write_text(self.hosts_file(pod))
        (etc / "resolv.conf").write_text(self.resolv_conf())
        (etc / "hostname").write_text(pod.name + "\n")
        tools = pod.host_dir / "tools"
        tools.mkdir(exist_ok=True)
        pod.env = self.container_env(pod)
        for tool in ("nvidia-smi", "ibv_devinfo"):
            (tools / tool).write_text(nodetools.wrapper_script(tool))
        if self.node is None:  # the node's tools, its healthy defaults copied in (a `Node` mounts its live state)
            # the VFs the device plugin gave the pod are the ones its NCCL_IB_HCA names (none: no HCA visible)
            hcas = [h for h in pod.env.get("NCCL_IB_HCA", "").split(",") if h]
            nodetools.default_node(pod.host_dir / "node", pod.name, self.gpus, hcas)
        layer = pod.host_dir / "layer"
        layer.mkdir(exist_ok=True)
        root = f"{layer}/merged"
        q = shlex.quote
        lines = [
            "set -e",
            f"hostname {q(pod.name)}",
            # the container's writable layer over the image (this machine's root is the image layer)
            f"mount -t tmpfs -o mode=755 tmpfs {layer}",
            f"mkdir {layer}/upper {layer}/work {root}",
            f"mount -t overlay overlay -o lowerdir=/,upperdir={layer}/upper,workdir={layer}/work {root}",
            f"mount -t proc proc {root}/proc",
            f"mount -t sysfs -o ro sysfs {root}/sys",
            f"mount -t tmpfs -o mode=755,nosuid tmpfs {root}/dev",
            *(
                f"touch {root}/dev/{d} && mount --bind /dev/{d} {root}/dev/{d}"
                for d in ("null", "zero", "full", "random", "urandom", "tty")
            ),
            f"mkdir {root}/dev/pts {root}/dev/shm {root}/dev/mqueue",
            # the OCI runtime's default /dev/pts (runc libcontainer/specconv/example.go Example, which cri-o's defaults
            # follow): gid=5 makes a new pty group tty, so a non-root sshd's pty_setowner (openssh sshpty.c) has
            # nothing to chown and `ssh -t` into a pod works as in a real one
            f"mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts {root}/dev/pts",
            f"ln -s pts/ptmx {root}/dev/ptmx && ln -s /proc/self/fd {root}/dev/fd",
            f"ln -s /proc/self/fd/0 {root}/dev/stdin && ln -s /proc/self/fd/1 {root}/dev/stdout && ln -s /proc/self/fd/2 {root}/dev/stderr",
            f"mount -t mqueue mqueue {root}/dev/mqueue",
            # the image's empty /tmp, /var/tmp and /run
            f"mount -t tmpfs -o mode=1777 tmpfs {root}/tmp",
            f"mount -t tmpfs -o mode=1777 tmpfs {root}/var/tmp",
            f"mount -t tmpfs -o mode=755 tmpfs {root}/run",
            # the image's layout (images/base.Containerfile): /workspace g=u GID 0, /etc/passwd g=u, ml-dev on PATH
            f"mkdir -p {root}/workspace && chgrp 0 {root}/workspace && chmod g=u {root}/workspace",
            f"chgrp 0 {root}/etc/passwd && chmod {'644' if pod.index in self.read_only_passwd else 'g=u'} {root}/etc/passwd",
            f"site=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && mkdir -p {root}$site"
            f" && cp -a {self.base}/site/. {root}$site/",
            f"rm -f {root}/etc/ssh/ssh_host_*",
            f"printf '%s\\n' '#!/bin/sh' 'exec python3 /opt/ml-dev-env/ml-dev \"$@\"' > {root}/usr/local/bin/ml-dev",
            f"chmod 0755 {root}/usr/local/bin/ml-dev",
            f"printf '%s\\n' 'if [ -r \"${{ML_DEV_ENV_FILE:-/tmp/ml-dev-env/env.sh}}\" ]; then' "
            f"'    . \"${{ML_DEV_ENV_FILE:-/tmp/ml-dev-env/env.sh}}\"' 'fi' > {root}/etc/profile.d/ml-dev-env.sh",
            # the hook for interactive non-login bash (code-server and Jupyter terminals), the memlock limits of PAM
            # sessions, and HOME's ~/.local/bin (first on PATH), group 0 g=u
            f"printf '%s\\n' '' {q(BASHRC_HOOK)} >> {root}/etc/bash.bashrc",
            f"mkdir -p {root}/etc/security/limits.d && printf '%s\\n' {' '.join(q(x) for x in MEMLOCK_LIMITS)}"
            f" > {root}/etc/security/limits.d/99-ml-dev-env-memlock.conf",
            f"mkdir -p {root}/home/ml-dev/.local/bin && chgrp -R 0 {root}/home/ml-dev && chmod -R g=u {root}/home/ml-dev",
            # node tools (stubs): the NVIDIA toolkit's nvidia-smi (tests/podsim/nodetool.py), rdma-core's ibv_devinfo
            *(
                (f"mkdir -p {root}/run/podsim-node && cp -a {q(str(pod.host_dir / 'node'))}/. {root}/run/podsim-node/",)
                if self.node is None
                else ()
            ),
            f"install -m 0755 {tools}/nvidia-smi {root}/usr/bin/nvidia-smi",
            f"install -m 0755 {tools}/ibv_devinfo {root}/usr/bin/ibv_devinfo",
            *(self.node.setup(self, pod, root) if self.node is not None else ()),
            *self._image_program_lines(pod, root),
            *(
                f"mkdir -p {q(root + str(p))} && mount --bind {q(str(p))} {q(root + str(p))} && mount -o remount,bind,ro {q(root + str(p))}"
                for p in self.image_paths
            ),
        ]
        for m in self.main.get("volumeMounts") or []:
            kind, src = volumes[m["name"]]
            if src is not None and m.get("subPath"):  # the kubelet refuses absolute and `..` subPaths before this
                src = src / m["subPath"]
            target = root + m["mountPath"]
            lines.append(f"mkdir -p {q(target)}")
            if kind == "tmpfs":
                lines.append(f"mount -t tmpfs -o mode=1777 tmpfs {q(target)}")
            else:
                lines.append(f"mount --bind {q(str(src))} {q(target)}")
            if m.get("readOnly") or kind == "image":  # an image volume is read-only whatever the mount says
                lines.append(f"mount -o remount,bind,ro {q(target)}")
        sa = f"{root}{SERVICE_ACCOUNT}"
        lines += [
            f"mkdir -p {sa} && mount --bind {pod.host_dir}/volumes/kube-api-access {sa} && mount -o remount,bind,ro {sa}",
            *(f"mount --bind {etc}/{f} {root}/etc/{f}" for f in ("hosts", "resolv.conf", "hostname")),
            f"cd {root} && mkdir -p .podsim-old && pivot_root . .podsim-old && umount -l /.podsim-old && rmdir /.podsim-old",
            f"cd {q(self.main.get('workingDir') or image_workdir())}",
            f"ulimit -H -l {MEMLOCK_BYTES // 1024} && ulimit -S -l {MEMLOCK_BYTES // 1024}",
            "exec " + shlex.join(self._as_container(pod.env, [*(self.main.get("command") or []), *(self.main.get("args") or [])])),
        ]
        setup = pod.host_dir / "setup.sh"
        setup.write_text("\n".join(lines) + "\n")
        with open(pod.log, "wb") as log:
            pod.proc = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{pod.netns}",
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount",
                    "--uts",
                    "--ipc",
                    "--propagation",
                    "private",
                    "bash",
                    str(setup),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not pod.pid:
            children = Path(f"/proc/{pod.proc.pid}/task/{pod.proc.pid}/children")
            try:
                found = children.read_text().split()
            except OSError:
                found = []
            if found:
                pod.pid = int(found[0])
            elif pod.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{pod.name} did not start:\n{pod.log.read_text()}")
            else:
                time.sleep(0.02)

    def _image_program_lines(self, pod: Pod, root: str) -> list[str]:
        """Shell lines installing `image_programs` into the pod's root (before PID 1 runs)."""
        if not self.image_programs:
            return []
        src = pod.host_dir / "image-programs"
        src.mkdir(exist_ok=True)
        lines = [f"mkdir -p {root}/run/podsim-image && chmod 1777 {root}/run/podsim-image"]
        for k, (path, text) in enumerate(sorted(self.image_programs.items())):
            if isinstance(text, Path):
                shutil.copyfile(text, src / str(k))
            else:
                (src / str(k)).write_text(text)
            lines.append(f"install -D -m 0755 {src}/{k} {shlex.quote(root + path)}")
        return lines

    def restart(self, index: int, timeout: float = 90, wait: bool = True) -> None:
        """A container restart in the same pod (the kubelet's restart after PID 1 exits, or after `terminate`): the
        pod sandbox stays (network namespace, IP, /etc/hosts), so do the volumes (PVCs, emptyDirs, ConfigMaps); the
        container gets a fresh writable layer, /tmp and PID namespace (kuberuntime_manager.go computePodActions:
        a container is restarted, the sandbox is kept while it is healthy)."""
        pod = self.pods[index]
        if pod.proc is not None and pod.proc.poll() is None:
            self.terminate(index)
        self._start_pod(pod)
        if wait:
            self.wait_ready(index, timeout)

    def _as_container(self, env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
        """argv that runs `argv` with the container's identity, capabilities and env (nothing else)."""
        return ["setpriv", *self.identity.setpriv(), "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]

    def wait_ready(self, index: int, timeout: float = 90) -> None:
        """Run the rendered readiness probe until it passes (every 0.2 s instead of periodSeconds)."""
        pod = self.pods[index]
        deadline = time.monotonic() + timeout
        while not self.probe(index):
            if pod.proc is None or pod.proc.poll() is not None:
                raise RuntimeError(f"{pod.name} exited ({pod.proc and pod.proc.returncode}):\n{pod.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pod.name} not Ready after {timeout} s:\n{pod.log.read_text()}\n{self.sshd_log(index)}")
            time.sleep(0.2)

    def probe(self, index: int) -> bool:
        command = self.main["readinessProbe"]["exec"]["command"]
        try:
            return self.exec(index, command, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def sshd_log(self, index: int) -> str:
        path = self.pods[index].path("/tmp/ml-dev-env/logs/sshd.log")
        try:
            return path.read_text()
        except OSError:
            return "(no sshd log)"

    # ------------------------------------------------------------------------------- in a pod

    def command(self, index: int, cmd: str | Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
        """argv of `oc exec <pod> -- <cmd>` (a string: `bash -c`): PID 1's namespaces and root, the container's
        identity, capabilities, rlimits and env, a process outside PID 1's tree (runc exec)."""
        pod = self.pods[index]
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if cwd:
            argv = ["bash", "-c", f'cd {shlex.quote(cwd)} && exec "$@"', "bash", *argv]
        return [
            "nsenter",
            "-t",
            str(pod.pid),
            "-m",
            "-u",
            "-i",
            "-n",
            "-p",
            "-r",
            "-w",
            "--",
            "prlimit",
            f"--memlock={MEMLOCK_BYTES}:{MEMLOCK_BYTES}",
            "--",
            *self._as_container({**pod.env, **(env or {})}, argv),
        ]

    def exec(
        self,
        index: int,
        cmd: str | Sequence[str],
        timeout: float = 120,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(index, cmd, cwd, env), capture_output=True, text=True, timeout=timeout, input=input)

    def popen(
        self, index: int, cmd: str | Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(index, cmd, cwd, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )

    @staticmethod
    def interrupt(proc: subprocess.Popen[Any], sig: int = signal.SIGINT) -> None:
        """A terminal's Ctrl-C to a `popen`ed command: `sig` to its process group inside the pod (the nsenter on
        this machine, which `oc` would be, only waits for it)."""
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != proc.pid:
                try:
                    if os.getpgid(int(entry)) == proc.pid:
                        os.kill(int(entry), sig)
                except (ProcessLookupError, PermissionError):
                    continue

    def write(self, index: int, path: str, text: str, mode: int = 0o644) -> Path:
        """Write a file in pod `index` (parents made) as the pod's user would: owned by its UID, group 0."""
        pod = self.pods[index]
        target = pod.path(path)
        missing = [p for p in [target.parent, *target.parent.parents] if not p.exists()]
        target.parent.mkdir(parents=True, exist_ok=True)
        for d in missing:
            os.chown(d, self.identity.uid, self.identity.gid)
        target.write_text(text)
        target.chmod(mode)
        os.chown(target, self.identity.uid, self.identity.gid)
        return target

    def sessions(self, index: int) -> list[dict[str, str]]:
        """Live SSH sessions of pod `index` (ssh-session.sh's files: start time, user)."""
        out = []
        for f in self.pods[index].path("/tmp/ml-dev-env/ssh-sessions").glob("*"):
            lines = f.read_text().splitlines()
            out.append({"pid": f.name, "start": lines[0] if lines else "", "user": lines[1] if len(lines) > 1 else ""})
        return out

    def pod_pids(self, index: int) -> list[int]:
        """Every process of pod `index` (its PID namespace), as this machine numbers them.

        Refuses when the pod's first process is gone and its number now names a process outside any pod: the
        answer would be every process of the machine (callers kill what they find)."""
        namespace = os.readlink(f"/proc/{self.pods[index].pid}/ns/pid")
        if namespace == os.readlink("/proc/self/ns/pid"):
            raise RuntimeError(f"pod {index}: process {self.pods[index].pid} is not in a pod's PID namespace (the pod has ended)")
        return pids_in_namespace_of(namespace)

    def in_network(self, argv: Sequence[str]) -> list[str]:
        """argv run in the simulation's bridge namespace (a node of the pod network, not a pod): reaches every pod IP."""
        return ["nsenter", f"--net=/run/netns/{self.cluster_ns}", *argv]

    def connect(self, index: int, port: int, timeout: float = 5) -> socket.socket:
        """A TCP connection from the bridge namespace to pod `index`'s IP (the socket keeps its namespace)."""
        result: list[socket.socket | BaseException] = []

        def work() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            try:
                with open(f"/run/netns/{self.cluster_ns}") as f:
                    if libc.setns(f.fileno(), 0x40000000):  # CLONE_NEWNET, this thread only
                        raise OSError(ctypes.get_errno(), "setns")
                result.append(socket.create_connection((self.pods[index].ip, port), timeout=timeout))
            except BaseException as exc:  # handed to the caller
                result.append(exc)

        thread = threading.Thread(target=work)  # a thread of its own: it never returns to this namespace
        thread.start()
        thread.join(timeout + 5)
        if not result:
            raise TimeoutError(f"connect to {self.pods[index].ip}:{port}")
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def swap_configmap(self, name: str, data: Mapping[str, str] | None = None) -> None:
        """A ConfigMap (or Secret) update as the kubelet applies it: a new `..<timestamp>` directory, `..data` swapped,
        on every running pod (`data` None: the same content again)."""
        source = self.configmaps if name in self.configmaps else self.secrets
        if data is not None:
            source[name] = dict(data)
        self._resync(name)

    def _resync(self, name: str) -> None:
        for pod in self.pods:
            for v in self.pod_spec.get("volumes") or []:
                ref = (v.get("configMap") or {}).get("name") or (v.get("secret") or {}).get("secretName")
                if ref == name:
                    pod.volumes[v["name"]].write_volume(v.get("configMap") or v["secret"], self._source_data(v))

    def terminate(self, index: int, grace: float | None = None) -> str:
        """The kubelet's kill: preStop exec hook (if rendered), SIGTERM to PID 1, SIGKILL after the grace period
        (kuberuntime_container.go killContainer). Returns "exited" or "killed"."""
        pod = self.pods[index]
        grace = self.grace if grace is None else grace
        deadline = time.monotonic() + grace
        pre_stop = ((self.main.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if pre_stop:
            try:
                self.exec(index, pre_stop["command"], timeout=max(grace, 1))
            except subprocess.TimeoutExpired:
                pass
        os.kill(pod.pid, signal.SIGTERM)
        assert pod.proc is not None
        try:
            pod.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            return "exited"
        except subprocess.TimeoutExpired:
            os.kill(pod.pid, signal.SIGKILL)
            pod.proc.wait(timeout=30)
            return "killed"

    def evict_hard(self, index: int) -> str:
        """The kubelet's hard eviction (a node under memory, disk or PID pressure): the grace is overridden with
        1 s (kubernetes pkg/kubelet/eviction/eviction_manager.go synchronize -> evictPod with
        immediateEvictionGracePeriodSeconds = 1); current kuberuntime_container.go killContainer applies the
        override before the preStop hook, which gets at most that 1 s (executePreStopHook abandons it, it runs on),
        then StopContainer with the budget floored at minimumGracePeriodInSeconds = 2: SIGTERM to PID 1, SIGKILL
        2 s later. Returns "exited" or "killed"."""
        pod = self.pods[index]
        pre_stop = ((self.main.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        hook = None
        if pre_stop:
            hook = subprocess.Popen(self.command(index, pre_stop["command"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                hook.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass  # abandoned, not killed: it ends with the container
        os.kill(pod.pid, signal.SIGTERM)
        assert pod.proc is not None
        try:
            pod.proc.wait(timeout=2)
            how = "exited"
        except subprocess.TimeoutExpired:
            os.kill(pod.pid, signal.SIGKILL)
            pod.proc.wait(timeout=30)
            how = "killed"
        if hook is not None:
            hook.wait(timeout=30)
        return how

    def oom_kill(self, index: int) -> None:
        """The container's OOM kill on cgroup v2 with kubelet >= 1.28: the kubelet sets memory.oom.group, so the
        kernel kills every process of the container at once (kubernetes/kubernetes#117793): no preStop, no
        SIGTERM, no grace. SIGKILL to PID 1 ends its PID namespace, every process in it."""
        pod = self.pods[index]
        os.kill(pod.pid, signal.SIGKILL)
        assert pod.proc is not None
        pod.proc.wait(timeout=30)

    def rolling_update(self, timeout: float = 90) -> list[str]:
        """A StatefulSet rolling update (a template change): each pod terminated and replaced from the highest ordinal
        down, one at a time, the next only once the replacement is Ready (kubernetes
        pkg/controller/statefulset/stateful_set_control.go updateStatefulSet: "we terminate the Pod with the
        largest ordinal that does not match the update revision", maxUnavailable 1). Returns each termination's
        outcome, highest ordinal first."""
        outcomes = []
        for index in reversed(range(self.count)):
            outcomes.append(self.terminate(index))
            self.restart(index, timeout)
        return outcomes

    def records(self, index: int, path: str = "", workspace: str = "/workspace") -> Path:
        """Pod `index`'s view of this environment's records folder in the workspace (inpod/contract.py records_dir)."""
        from inpod import contract

        return self.pods[index].path(f"{contract.records_dir(workspace, self.app)}/{path}".rstrip("/"))

    def volume_dir(self, index: int, mount_path: str) -> Path:
        """The directory on this machine behind pod `index`'s volume mounted at `mount_path` (a PVC or emptyDir):
        it outlives the pod's processes (read a terminated pod's files here), until `stop()`."""
        mount = next(m for m in self.main.get("volumeMounts") or [] if m["mountPath"] == mount_path)
        claims = {t["metadata"]["name"] for t in self.statefulset["spec"].get("volumeClaimTemplates") or []}
        volume: dict[str, Any] = next((v for v in self.pod_spec.get("volumes") or [] if v["name"] == mount["name"]), {})
        if "persistentVolumeClaim" in volume and mount["name"] not in claims:
            return self.claims / volume["persistentVolumeClaim"]["claimName"]
        return self.pods[index].host_dir / "volumes" / mount["name"]

    def stop(self) -> None:
        """Kill every pod (SIGKILL to PID 1 ends its PID namespace), the DNS; remove namespaces and directories.

        A pod's PID 1 finishes exiting only once every process of its namespace has been reaped (Linux
        kernel/pid_namespace.c zap_pid_ns_processes). The suite is a child subreaper (tests/fixtures/leftovers.py), so
        a pod process whose parent on this machine died (an `nsenter` a test killed) was reparented to pytest and,
        killed with its pod, stays a zombie until pytest reaps it: those are reaped here while the pod ends, or PID 1
        would wait out the 30 s below (seen: 90 s at the end of a module of 4 pods)."""
        for pod in self.pods:
            if pod.proc is None:
                continue
            pid_ns = None
            if pod.pid:
                with contextlib.suppress(OSError):
                    pid_ns = os.readlink(f"/proc/{pod.pid}/ns/pid")
                try:
                    os.kill(pod.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 30
            while pod.proc.poll() is None and time.monotonic() < deadline:
                if pid_ns:
                    reap_orphans_in(pid_ns)
                time.sleep(0.05)
            if pod.proc.poll() is None:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait(timeout=30)
        if self.dns is not None:
            self.dns.kill()
            self.dns.wait(timeout=30)
            if self.dns.stdout:
                self.dns.stdout.close()
        for ns in [p.netns for p in self.pods] + [self.cluster_ns]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(self.base, ignore_errors=True)


def leftovers() -> list[str]:
    """Network namespaces and directories of the simulation still on this machine."""
    names = run(["ip", "netns", "list"]).split()
    found = [f"netns {n}" for n in names if n.startswith(PREFIX)]
    found += [f"dir {p}" for p in Path("/var/tmp").glob(f"{PREFIX}*")]
    return found


@contextmanager
def held_pid_namespaces(pids: Iterable[int]) -> Iterator[list[str]]:
    """The PID namespaces of `pids` (readlinks of /proc/<pid>/ns/pid), each held open until the block ends.

    A namespace's inode number is free for the next namespace once its last reference goes (Linux fs/nsfs.c; seen:
    a pod of another xdist worker started in the number a stopped pod had just left, and a scan after `stop` found
    its processes). An open fd keeps the number this namespace's, so `pids_in_namespace_of` inside the block finds
    only what is left of these pods."""
    fds: list[int] = []
    links: list[str] = []
    try:
        for pid in pids:
            try:
                fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
            except OSError:
                continue  # already gone: nothing of it to scan for
            fds.append(fd)
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        yield links
    finally:
        for fd in fds:
            os.close(fd)


def pids_in_namespace_of(pid_ns: str) -> list[int]:
    """PIDs of this machine whose PID namespace is `pid_ns` (a readlink of /proc/<pid>/ns/pid)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == pid_ns:
                    out.append(int(entry))
            except OSError:
                continue
    return out


def reap_orphans_in(pid_ns: str) -> None:
    """Reap the zombies of PID namespace `pid_ns` whose parent is this process (orphans reparented to the subreaper;
    no Popen object owns them: a test's Popen is the `nsenter` on this machine, never the process inside the pod)."""
    me = os.getpid()
    for pid in pids_in_namespace_of(pid_ns):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z" and int(fields[1]) == me:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


@contextmanager
def running(result: Any, **kw: Any) -> Iterator[PodSim]:
    sim = PodSim(result, **kw)
    try:
        yield sim.start()
    finally:
        sim.stop()
