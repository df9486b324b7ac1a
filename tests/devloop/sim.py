"""Simulated pods of one stack on this machine: real startup script, real sshd, real rsync/ssh/pdsh.

Each pod is a process tree in its own UTS and mount namespace (`unshare --uts --mount`), started as
root only to build its mounts, then running the rendered startup script as OpenShift would: an
arbitrary UID with GID 0, no capabilities, no_new_privs. Per pod:

* hostname `<app>-<i>`; its sshd listens on port 2222 of its own loopback address 127.A.B.<i+1>
  (ML_DEV_SSH_LISTEN; A.B random per cluster, so concurrent test runs never meet), which is also its
  POD_IP (a debugger started with `--debug-host pod` listens there);
* /etc/hosts (bind mount) maps every pod's cluster DNS name and short name to those addresses;
* /opt/ml-dev-env = the rendered `<app>-startup` ConfigMap (read-only), /etc/ml-dev-env/ssh = the
  `<app>-ssh` Secret files (0440, GID 0), /etc/ml-dev-env/cluster = cluster.env of the rank contract;
* a private /tmp (tmpfs) with /tmp/ml-dev-env (the state dir) and /tmp/workspace (the per-pod volume);
* /etc/passwd: a group-writable copy (the stack's image layout) or, with `nss=True`, a read-only one
  (the startup falls back to nss_wrapper);
* stub GPU tools (nvidia-smi) first on PATH.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from components import devloop
from core import naming

APP = "ml-dev-env"
NS = "nccl-test"
UID = 1000770000
WORKSPACE = "/tmp/workspace"
STATE = "/tmp/ml-dev-env"
HOST_MOUNTPOINTS = ("/etc/ml-dev-env/ssh", "/etc/ml-dev-env/cluster")
# CRI-O's default capabilities (cri-o internal/config/capabilities/capabilities_linux.go Default())
CRIO_DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE", "KILL")
TOOLS = ("sshd", "ssh", "ssh-keygen", "rsync", "unshare", "nsenter", "setpriv")


def missing_requirements() -> str | None:
    """Why the simulation cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (mount namespaces, a second UID)"
    for tool in TOOLS:
        if not shutil.which(tool) and not Path("/usr/sbin", tool).exists():
            return f"needs {tool} (Debian: openssh-server openssh-client rsync util-linux)"
    for tool in ("python3", "git", "bash"):
        if not shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin"):
            return f"needs {tool} in /usr/local/bin, /usr/bin or /bin (the simulated pods' PATH)"
    try:
        subprocess.run(["unshare", "--uts", "--mount", "true"], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"unshare --uts --mount is not permitted here: {exc}"
    return None


def keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


@dataclass
class Pod:
    index: int
    root: Path
    addr: str
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    nss: bool = False

    @property
    def name(self) -> str:
        return naming.pod_name(APP, self.index)

    @property
    def fqdn(self) -> str:
        return naming.pod_dns(APP, NS, self.index)

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def log(self) -> Path:
        return self.root / "pod.log"


class Cluster:
    """`Cluster(n).start()`; `exec(i, cmd)` runs a shell command inside pod i as the pod user."""

    def __init__(
        self,
        count: int = 4,
        gpus: int = 2,
        nss_pods: tuple[int, ...] = (),
        user_keys: list[str] | None = None,
        python_packages: tuple[str, ...] = (),
        uid: int = UID,
        capabilities: tuple[str, ...] = (),
    ) -> None:
        """uid 0: an RDMA pod of an SCC (root, CRI-O's default capabilities + `capabilities`)."""
        self.count, self.gpus, self.uid, self.capabilities = count, gpus, uid, capabilities
        self.base = Path(tempfile.mkdtemp(prefix="ml-dev-sim-", dir="/var/tmp"))
        self.base.chmod(0o755)
        self.keys = self.base / "keys"
        self.keys.mkdir()
        self.keys.chmod(0o700)
        host_pub = keygen(self.keys / "host", "host")
        client_pub = keygen(self.keys / "client", "stack")
        self.user_pub = keygen(self.keys / "user", "user@laptop")
        self.stranger_pub = keygen(self.keys / "stranger", "stranger")
        self.host_pub = host_pub
        # the Secret, as components/devloop.py fills it
        self.secret = self.base / "secret"
        self.secret.mkdir()
        files = {
            "host_ed25519_key": (self.keys / "host").read_text(),
            "host_ed25519_key.pub": host_pub + "\n",
            "id_ed25519": (self.keys / "client").read_text(),
            "id_ed25519.pub": client_pub + "\n",
            "authorized_keys": devloop.authorized_keys(client_pub, [self.user_pub, *(user_keys or [])]),
        }
        for name, text in files.items():
            (self.secret / name).write_text(text)
            os.chown(self.secret / name, 0, 0)
            (self.secret / name).chmod(0o440)
        self.secret.chmod(0o755)
        # the startup ConfigMap, rendered from the same builders as the stack
        self.configmap = self.base / "configmap"
        self.configmap.mkdir()
        from components import pod as podmod

        data = {"startup.sh": podmod.startup_script(), **devloop.scripts(_config())}
        for name, text in data.items():
            (self.configmap / name).write_text(text)
            (self.configmap / name).chmod(0o555)
        self.configmap.chmod(0o555)
        # cluster.env of the rank contract
        self.cluster_dir = self.base / "cluster"
        self.cluster_dir.mkdir()
        (self.cluster_dir / "cluster.env").write_text(
            f"NNODES={count}\nGPUS_PER_NODE={gpus}\nAPP_NAME={APP}\nHEADLESS_SERVICE={naming.headless_service(APP)}\n"
            f"POD_NAMESPACE={NS}\nMASTER_PORT={naming.MASTER_PORT}\n"
        )
        # a /24 of its own inside 127.0.0.0/8 (every address there is this machine's loopback)
        block = f"127.{random.randint(2, 254)}.{random.randint(0, 255)}"
        hosts = ["127.0.0.1 localhost"]
        for i in range(count):
            hosts.append(f"{block}.{i + 1} {naming.pod_dns(APP, NS, i)} {naming.pod_name(APP, i)}")
        (self.base / "hosts").write_text("\n".join(hosts) + "\n")
        self.bin = self.base / "bin"
        self.bin.mkdir()
        stub = self.bin / "nvidia-smi"
        stub.write_text(f'#!/bin/bash\nfor i in $(seq 0 {gpus - 1}); do echo "NVIDIA H100 80GB HBM3"; done\n')
        stub.chmod(0o755)
        self.pods = [Pod(i, self.base / f"pod{i}", f"{block}.{i + 1}", nss=i in nss_pods) for i in range(count)]
        # Python packages of the image (e.g. debugpy), copied from this interpreter where it has them
        self.site = self.base / "site"
        self.site.mkdir()
        self.python_packages = []
        for name in python_packages:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            shutil.copytree(Path(module.__file__).parent, self.site / name)  # type: ignore[arg-type]
            self.python_packages.append(name)

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 30) -> Cluster:
        for path in HOST_MOUNTPOINTS:
            Path(path).mkdir(parents=True, exist_ok=True)
        for pod in self.pods:
            self._start_pod(pod)
        deadline = time.monotonic() + timeout
        for pod in self.pods:
            while not ((pod.state / "ready").exists() and (pod.state / "ssh" / "sshd.pid").exists()):
                if pod.proc and pod.proc.poll() is not None:
                    raise RuntimeError(f"{pod.name} exited {pod.proc.returncode}:\n{pod.log.read_text()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{pod.name} not ready:\n{pod.log.read_text()}")
                time.sleep(0.05)
        settle = time.monotonic() + 1  # a startup script that implements the rank contract has written rank.env by now
        while not all((pod.state / "rank.env").exists() for pod in self.pods) and time.monotonic() < settle:
            time.sleep(0.05)
        for pod in self.pods:
            self._ensure_rank_env(pod)
        return self

    def _start_pod(self, pod: Pod) -> None:
        for d in (pod.root, pod.state, pod.workspace):
            d.mkdir(parents=True, exist_ok=True)
            os.chown(d, self.uid, 0)
            d.chmod(0o775)
        pod.root.chmod(0o755)
        passwd = pod.root / "passwd"
        shutil.copy("/etc/passwd", passwd)
        os.chown(passwd, 0, 0)
        passwd.chmod(0o644 if pod.nss else 0o664)  # the stack's image: chmod g=u /etc/passwd (GID 0)
        pod.env = {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/sbin:/usr/bin:/bin",
            "HOSTNAME": pod.name,
            "POD_NAME": pod.name,
            "POD_NAMESPACE": NS,
            "APP_NAME": APP,
            "HEADLESS_SERVICE": naming.headless_service(APP),
            "NNODES": str(self.count),
            "GPUS_PER_NODE": str(self.gpus),
            "WORLD_SIZE": str(self.count * self.gpus),
            "MASTER_ADDR": naming.pod_dns(APP, NS, 0),
            "MASTER_PORT": str(naming.MASTER_PORT),
            "ML_DEV_WORKSPACE": WORKSPACE,
            "DEEPSPEED_HOSTFILE": f"{WORKSPACE}/.deepspeed/hostfile",
            "ML_DEV_STATE_DIR": STATE,
            "ML_DEV_SERVERS": "",
            "ML_DEV_MEMLOCK": "none",
            "ML_DEV_SSH_LISTEN": pod.addr,
            "POD_IP": pod.addr,
            "ML_DEV_SSH_REFRESH_SECONDS": "1",
            "HOME": "/home/ml-dev-image",  # the image's HOME, not writable here: the startup picks its own
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(self.site),
        }
        if self.uid == 0:
            caps = ",".join(f"+{c.lower()}" for c in (*CRIO_DEFAULT_CAPABILITIES, *self.capabilities))
            drop = f"--reuid=0 --regid=0 --clear-groups --bounding-set=-all,{caps}"
            (pod.root / "root").mkdir(mode=0o700, exist_ok=True)
            root_home = f"mount --bind {pod.root}/root /root"
        else:
            drop = f"--reuid={self.uid} --regid=0 --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all"
            root_home = ""
        setup = f"""
set -e
hostname {pod.name}
mount --make-rprivate /
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
{root_home}
mkdir -p {STATE} {WORKSPACE}
mount --bind {pod.state} {STATE}
mount --bind {pod.workspace} {WORKSPACE}
mount -t tmpfs -o mode=755 tmpfs /opt
mkdir -p /opt/ml-dev-env
mount --bind {self.configmap} /opt/ml-dev-env
mount -o remount,bind,ro /opt/ml-dev-env
mount --bind {self.secret} /etc/ml-dev-env/ssh
mount --bind {self.cluster_dir} /etc/ml-dev-env/cluster
mount --bind {self.base}/hosts /etc/hosts
mount --bind {passwd} /etc/passwd
exec setpriv {drop} \\
  env -i {" ".join(f"{k}={v}" for k, v in pod.env.items())} /bin/bash /opt/ml-dev-env/startup.sh
"""
        log = open(pod.log, "wb")
        pod.proc = subprocess.Popen(
            ["unshare", "--uts", "--mount", "--fork", "bash", "-c", setup],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _ensure_rank_env(self, pod: Pod) -> None:
        """The rank contract's rank.env: the startup script writes it; older startup scripts do not, then write it here."""
        rank_env = pod.state / "rank.env"
        if rank_env.exists():
            return
        hosts = " ".join(naming.pod_dns(APP, NS, i) for i in range(self.count))
        names = " ".join(naming.pod_name(APP, i) for i in range(self.count))
        master = naming.pod_dns(APP, NS, 0)
        values = {
            "ML_DEV_POD": pod.name,
            "NODE_RANK": pod.index,
            "NNODES": self.count,
            "GPUS_PER_NODE": self.gpus,
            "WORLD_SIZE": self.count * self.gpus,
            "MASTER_ADDR": master,
            "MASTER_PORT": naming.MASTER_PORT,
            "PET_NNODES": self.count,
            "PET_NODE_RANK": pod.index,
            "PET_NPROC_PER_NODE": self.gpus,
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": naming.MASTER_PORT,
            "DEEPSPEED_HOSTFILE": f"{WORKSPACE}/.deepspeed/hostfile",
            "ML_DEV_HOSTS": hosts,
            "ML_DEV_PODS": names,
        }
        tmp = pod.state / "rank.env.tmp"
        tmp.write_text("".join(f"export {k}='{v}'\n" for k, v in values.items()))
        os.chown(tmp, self.uid, 0)
        tmp.replace(rank_env)

    def namespace_pids(self, pod: Pod) -> list[int]:
        if not pod.proc:
            return []
        try:
            ns = os.readlink(f"/proc/{pod.proc.pid}/ns/mnt")
        except OSError:
            return []
        root_ns = os.readlink("/proc/self/ns/mnt")
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != pod.proc.pid:
                try:
                    if os.readlink(f"/proc/{entry}/ns/mnt") == ns != root_ns:
                        pids.append(int(entry))
                except OSError:
                    continue
        return pids

    def stop(self) -> None:
        for pod in self.pods:
            if pod.proc is None:
                continue
            for pid in self.namespace_pids(pod):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.killpg(pod.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            pod.proc.wait(timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------------------------- in a pod

    def pid(self, pod: Pod) -> int:
        """PID of the pod's startup script (the namespaces to enter)."""
        assert pod.proc is not None
        children = Path(f"/proc/{pod.proc.pid}/task/{pod.proc.pid}/children").read_text().split()
        return int(children[0]) if children else pod.proc.pid

    def command(self, index: int, script: str, cwd: str = WORKSPACE, env: dict[str, str] | None = None, nss: bool = True) -> list[str]:
        """argv running `script` in pod `index` like `oc exec ... bash -lc` (the container env, the pod user);
        nss=False: without the nss_wrapper environment, exactly as `oc exec` starts processes."""
        pod = self.pods[index]
        penv = {**pod.env, "HOME": f"{STATE}/home", **(env or {})}
        nss_env = pod.state / "ssh" / "nss.env"
        prefix = f". {STATE}/ssh/nss.env; " if nss and nss_env.exists() else ""
        return [
            "nsenter",
            "-t",
            str(self.pid(pod)),
            "-u",
            "-m",
            "--",
            "setpriv",
            f"--reuid={self.uid}",
            "--regid=0",
            "--clear-groups",
            "--no-new-privs",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in penv.items()),
            "bash",
            "-c",
            f"{prefix}cd {cwd} && {script}",
        ]

    def exec(self, index: int, script: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(index, script, **kw), capture_output=True, text=True, timeout=timeout)  # type: ignore[arg-type]

    def popen(self, index: int, script: str, **kw: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(index, script, **kw),  # type: ignore[arg-type]
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def write(self, index: int, rel: str, text: str, mode: int = 0o644) -> Path:
        """Write a file into pod `index`'s workspace (as the pod user would)."""
        path = self.pods[index].workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in [path.parent, *path.parent.parents]:
            if parent == self.pods[index].workspace.parent:
                break
            os.chown(parent, self.uid, 0)
        path.write_text(text)
        path.chmod(mode)
        os.chown(path, self.uid, 0)
        return path

    def sessions(self, index: int) -> list[dict[str, str]]:
        out = []
        for f in (self.pods[index].state / "ssh-sessions").glob("*"):
            lines = f.read_text().splitlines()
            out.append({"pid": f.name, "start": lines[0] if lines else "", "user": lines[1] if len(lines) > 1 else ""})
        return out


def _config():
    """A per-pod-workspace stack configuration for the rendered ConfigMap (devloop.env)."""
    from stacks.config import StackConfig

    return StackConfig.model_validate(
        {
            "cluster": {"name": "sim", "namespace": NS, "appsDomain": "apps.example.org"},
            "nodes": {
                "count": 4,
                "gpusPerPod": 2,
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            },
            "storage": {
                "mode": "per-pod",
                "volumes": [{"name": "workspace", "mountPath": WORKSPACE.replace("/tmp", "/data"), "size": "1Gi"}],
            },
            "image": {"reference": "quay.io/org/img:1.0"},
        }
    )


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)
