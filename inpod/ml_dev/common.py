"""ml-dev's shared library: paths, the rank contract (rank.env), the environment rule, the pods (Cluster), parallel calls.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from .. import contract
from ..lib import ssh, usersecrets
from ..lib.pod import mount_dir, read_rank_env, state_dir

# The mount path of the startup ConfigMap ($ML_DEV_DIR, contract.STARTUP_MOUNT), else the launcher's directory as
# called. Other pods are handed this path.
HERE = mount_dir("ml-dev")

STATE_DIR = state_dir()
IGNORE_FILE = ".ml-devignore"
SYNC_MANIFEST = ".ml-dev-synced"
HEARTBEAT_SECONDS = 10
STOP_GRACE_DEFAULT = contract.GRACE_DEFAULT  # lifecycle.checkpointGraceSeconds' default; the pod's comes with its env


def stop_grace(values: dict[str, str] | None = None) -> int:
    """Seconds a stopped rank gets to save a checkpoint before its process group is killed."""
    text = (values or {}).get(contract.CHECKPOINT_GRACE_ENV) or os.environ.get(contract.CHECKPOINT_GRACE_ENV, "")
    return int(text) if text.isdigit() else STOP_GRACE_DEFAULT


def stop_signal(values: dict[str, str] | None = None) -> signal.Signals:
    """The signal a stopped rank gets first (lifecycle.checkpointSignal; SIGTERM unless set)."""
    name = (values or {}).get(contract.CHECKPOINT_SIGNAL_ENV) or os.environ.get(contract.CHECKPOINT_SIGNAL_ENV, contract.SIGNAL_DEFAULT)
    return getattr(signal.Signals, name, signal.SIGTERM) if name.startswith("SIG") else signal.SIGTERM


DEBUG_PORT = 5678
PY = "python3"
PER_POD_ENV = contract.PER_POD_ENV
"""Never carried from the launching pod to the others (glob patterns): what differs per pod by nature
(inpod/contract.py); `ml-dev run --help` prints it."""

RANK_ENV = contract.RANK_ENV
"""The keys of rank.env (inpod/contract.py). Interactive and
login shells source rank.env when they start (env.sh from ~/.bashrc, ~/.profile, $ENV, /etc/profile.d), so a
shell's values are the pod's as they were then: a count change since leaves them stale. They never travel from
the launching shell; each rank reads its own pod's current rank.env (`--env K=V` still sets one everywhere)."""
FROM_RANK_FILE = (*RANK_ENV, "NCCL_IB_HCA", "RANK", "LOCAL_RANK")
"""What a rank takes from its own pod only: rank.env's keys, NCCL_IB_HCA (written there when auto-detected, the
pod's own devices) and what `--per-pod` sets (RANK, LOCAL_RANK)."""


def die(message: str, code: int = 1) -> None:
    print(f"ml-dev: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


# ------------------------------------------------------------------------------------ environment


def read_env_file(path: Path) -> dict[str, str]:
    """Values of a shell-sourceable file, as the shell sees them (devloop.env, nss.env: the file is the contract, not
    its syntax); rank.env has the one reader of inpod/lib/pod.py."""
    if not path.is_file():
        return {}
    out = subprocess.run(
        ["bash", "-c", 'set -a; . "$1" >/dev/null 2>&1; env -0', "_", str(path)],
        stdout=subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        check=False,
    ).stdout
    values = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: v for k, v in values.items() if k not in ("PWD", "SHLVL", "_", "PATH")}


def container_env() -> dict[str, str]:
    """The env every SSH session gets on every pod (sshd.sh's session.env: the container env), else PID 1's."""
    path = STATE_DIR / "ssh" / "session.env"
    if path.is_file():
        out = subprocess.run(
            ["bash", "-c", 'PATH=; set -a; . "$1" >/dev/null 2>&1; env -0', "_", str(path)],
            stdout=subprocess.PIPE,
            env={},
            check=False,
        ).stdout
    else:
        try:
            out = Path("/proc/1/environ").read_bytes()
        except OSError:
            return {}
    return dict(item.split("=", 1) for item in out.decode(errors="replace").split("\0") if "=" in item)


def per_pod(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in PER_POD_ENV)


def listed_secrets() -> usersecrets.Listed:
    """env.secrets' keys (devloop.env ML_DEV_SECRETS): each rank reads them from its own pod's mount."""
    return usersecrets.read_listed(Path(os.environ.get("ML_DEV_DEVLOOP_ENV", HERE / contract.DEVLOOP_ENV_FILE)))


HOME_MARK = "\0home\0"
"""Stands for the receiving pod's own HOME in a carried value (an environment value never holds a NUL byte)."""


def own_home(env: Mapping[str, str]) -> str:
    return env.get("ML_DEV_HOME") or env.get("HOME") or ""


def home_relative(value: str, homes: list[str]) -> str:
    """`value` with each `:`-separated part that is one of `homes` (this pod's HOME) or under it written relative to
    HOME_MARK: a login shell's PATH (`~/.local/bin` first: ~/.profile, env.sh) and the caches env.sh sets
    (XDG_CACHE_HOME, PIP_CACHE_DIR, IPYTHONDIR...) name this pod's own HOME, which no other pod has; each rank reads
    them as its own pod's (`at_home`)."""
    parts = value.split(":")
    for i, part in enumerate(parts):
        for home in homes:
            if part == home or part.startswith(home + "/"):
                parts[i] = HOME_MARK + part[len(home) :]
                break
    return ":".join(parts)


def at_home(value: str, home: str) -> str:
    return value.replace(HOME_MARK, home) if home else value


def launch_env(extra: list[str]) -> dict[str, str]:
    """What travels to every rank: this shell's variables that differ from the container env (except the
    per-pod set, the rank keys, FROM_RANK_FILE, and env.secrets' keys, which each rank reads from its own pod's
    mount), then `--env K=V` (any key, rank keys included; never a listed Secret key: argv is world-readable).
    A carried value's parts under this pod's HOME are each pod's own there (home_relative): only what the user chose
    travels, never a path of this pod."""
    base = container_env()
    secret = set(usersecrets.listed_keys(listed_secrets()))
    homes = sorted({h for h in (os.environ.get("HOME", ""), os.environ.get("ML_DEV_HOME", "")) if h.strip("/")}, key=len, reverse=True)
    carried = {
        k: home_relative(v, homes)
        for k, v in os.environ.items()
        if base.get(k) != v and not per_pod(k) and k not in FROM_RANK_FILE and k not in secret
    }
    for item in extra:
        if "=" not in item or not item.split("=", 1)[0]:
            die(f"--env {item!r}: expected NAME=value")
        key, value = item.split("=", 1)
        if key in secret:
            die(f"--env {key}=...: {key} comes from a Secret of env.secrets on every pod; a value in --env is in this process's argv")
        carried[key] = value
    return carried


def read_line(fd: int, limit: float) -> bytes:
    """One line from a raw fd (no buffered reader: the rest of the stream is the stop channel), with a deadline."""
    import select

    data = b""
    deadline = time.monotonic() + limit
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            die(f"no launch environment on stdin within {limit:.0f} s")
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data


class Cluster:
    def __init__(self) -> None:
        self.devloop = read_env_file(Path(os.environ.get("ML_DEV_DEVLOOP_ENV", HERE / contract.DEVLOOP_ENV_FILE)))
        rank_file = STATE_DIR / contract.RANK_ENV_FILE
        self.rank_env = read_rank_env(rank_file, missing_ok=True)
        if not self.rank_env.get("ML_DEV_HOSTS"):
            die(f"{rank_file} has no ML_DEV_HOSTS: is this an ml-dev-env pod, and has its startup script run?")
        self.hosts = self.rank_env["ML_DEV_HOSTS"].split()
        self.pods = self.rank_env.get("ML_DEV_PODS", "").split() or [h.split(".")[0] for h in self.hosts]
        self.me = int(self.rank_env.get("NODE_RANK", "-1"))
        self.ssh_config = STATE_DIR / "ssh" / "client.conf"
        os.environ[contract.RUN_ENV] = str(os.getpid())  # what `ssh` sends (SendEnv): this launcher opened the session
        # images without a writable /etc/passwd: ssh needs the nss_wrapper entry sshd.sh made (children inherit it)
        os.environ.update(read_env_file(STATE_DIR / "ssh" / "nss.env"))
        shared = self.devloop.get("ML_DEV_SHARED_PATHS", "").split()
        self.shared_paths = [Path(p) for p in shared]
        self.per_pod_paths = [Path(p) for p in self.devloop.get("ML_DEV_PER_POD_PATHS", "").split()] + [STATE_DIR]
        parts = self.hosts[0].split(".")
        self.namespace = parts[2] if len(parts) > 2 else ""

    def label(self, rank: int) -> str:
        return f"rank {rank} ({self.pods[rank]})"

    def ssh(self, rank: int, remote: list[str], batch: bool = True) -> list[str]:
        control = STATE_DIR / "ssh" / "cm-%C"
        opts = [
            "-F",
            str(self.ssh_config),
            "-o",
            "ConnectTimeout=5",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={control}",
            "-o",
            "ControlPersist=30",
            "-o",
            "LogLevel=ERROR",
            # marks the session as this launcher's (ML_DEV_RUN, set in __init__; sshd.sh's AcceptEnv takes it,
            # ssh-session.sh records it): the home page shows people's SSH connections, not ml-dev's own (rank start,
            # rsync, tree hash). SendEnv, not SetEnv (OpenSSH 7.8+): any image's client has it; openssh mux.c
            # mux_client_request_session sends it over a shared ControlMaster connection too.
            "-o",
            f"SendEnv={contract.RUN_ENV}",
        ]
        if batch:
            opts += ["-o", "BatchMode=yes"]
        return ssh.command(self.hosts[rank], remote, ["ssh", *opts])

    def rsh(self) -> str:
        """The ssh command line rsync uses (-e)."""
        return shlex.join(self.ssh(0, [])[:-2])

    def is_shared(self, path: Path) -> bool:
        return any(path == p or p in path.parents for p in self.shared_paths)

    def is_per_pod(self, path: Path) -> bool:
        """HOME (`.home/<pod>`), the state dir: one pod's own, never synced."""
        return any(path == p or p in path.parents for p in self.per_pod_paths)

    def sshd_log_command(self, rank: int) -> str:
        ns = f" -n {self.namespace}" if self.namespace else ""
        return f"oc exec{ns} {self.pods[rank]} -c ml-dev -- cat {STATE_DIR}/{contract.STATE_LOGS_DIR}/sshd.log"

    def explain(self, rank: int, stderr: str, code: int) -> str:
        """What the SSH client saw when it could not reach `rank`, in words, and where that pod's sshd log is."""
        text = stderr.strip()
        known = (
            ("Could not resolve hostname", "the name does not resolve"),
            ("Name or service not known", "the name does not resolve"),
            ("Connection refused", "connection refused (no sshd listening on the pod)"),
            ("Host key verification failed", "the host key does not match the stack's known_hosts"),
            ("REMOTE HOST IDENTIFICATION HAS CHANGED", "the host key does not match the stack's known_hosts"),
            ("Permission denied", "authentication refused (the stack key is not accepted)"),
            ("kex_exchange_identification", "connection closed during key exchange (sshd died, see its log)"),
            ("Connection closed by", "connection closed during key exchange (sshd died, see its log)"),
            ("Connection reset", "connection closed during key exchange (sshd died, see its log)"),
            ("timed out", "connection timed out"),
            ("No route to host", "no route to the pod"),
        )
        what = next((words for needle, words in known if needle in text), f"ssh exited {code}")
        last = (text.splitlines() or [""])[-1]
        return f"{what}" + (f" [{last}]" if last else "") + f"; its sshd log: {self.sshd_log_command(rank)}"


def parallel(fn: Callable[[int], object], ranks: list[int]) -> dict[int, object]:
    results: dict[int, object] = {}

    def one(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except Exception as exc:  # reported per pod
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def wait_reachable(cluster: Cluster, timeout: float, remote: list[str] | None = None) -> dict[int, str]:
    """Every pod answers over SSH (the same connection is kept for what follows), else name the ones that do not.

    `remote` (default `true`) is what each pod runs: its output is the pod's answer (ml-dev sync asks each pod the
    hash of its tree, so the probe and the question are one round trip)."""
    deadline = time.monotonic() + timeout
    answers: dict[int, str] = {}

    def probe(rank: int) -> str:
        last = ""
        while True:
            res = subprocess.run(
                cluster.ssh(rank, remote or ["true"]), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
            )
            if res.returncode == 0:
                answers[rank] = res.stdout
                return ""
            if remote and res.returncode != 255:  # 255 is ssh's own failure (ssh(1)); this is the command's
                return "!" + ((res.stderr.strip().splitlines() or [f"exited {res.returncode}"])[-1])
            last = cluster.explain(rank, res.stderr, res.returncode)
            if time.monotonic() >= deadline:
                return last
            time.sleep(1)

    results = parallel(probe, [r for r in range(len(cluster.hosts)) if r != cluster.me])
    bad = {r: str(e) for r, e in results.items() if e}
    if bad:
        die(unreachable(cluster, bad, timeout))
    return answers


def unreachable(cluster: Cluster, bad: dict[int, str], timeout: float) -> str:
    """The launch's refusal, a line per pod: `!<words>` is the pod's own answer (its command failed), anything else
    what the SSH client saw until `timeout`."""
    lines = [
        f"pod {cluster.pods[r]} ({cluster.hosts[r]}): {e[1:]}"
        if e.startswith("!")
        else f"pod {cluster.pods[r]} ({cluster.hosts[r]}) is not reachable over SSH after {timeout:.0f} s: {e}"
        for r, e in sorted(bad.items())
    ]
    return "\n  ".join(lines)
