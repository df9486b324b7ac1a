#!/usr/bin/env python3
"""ml-dev: run one command on every pod of an ml-dev-env stack, from any pod.

    ml-dev run -- torchrun train.py        sync the tree, start on every pod, stream, stop all on failure
    ml-dev run --debug 1 -- python x.py    rank 1's Python waits for a debugger on 127.0.0.1:5678 of its pod
                                           (--debug-host pod: on the pod IP, for a debugger in another pod)
    ml-dev sync                            sync the working tree to every pod (no-op on shared storage)
    ml-dev exec -- nvidia-smi              run on every pod, output prefixed by rank
    ml-dev status                          pods, reachability, ranks, GPUs, RDMA devices, SSH sessions
    ml-dev status --all                    every environment of the namespace: owner, size, state, GPU-hours 7 days

Delivered by the stack in the <app>-startup ConfigMap (mounted at /opt/ml-dev-env), so it works in any
image with Python 3.8+, OpenSSH and rsync. Reads the rank contract only: $ML_DEV_STATE_DIR/rank.env
(ML_DEV_HOSTS, ML_DEV_PODS, NODE_RANK, ...), written by the startup script; never computes ranks.
The pods talk over the stack's SSH fabric (sshd.sh): $ML_DEV_STATE_DIR/ssh/client.conf.

The synced tree: the git top level of the current directory (else the current directory), without
.gitignore'd paths (git's own rules) and without paths matching `.ml-devignore` at the tree root
(gitignore-style globs: `name`, `dir/`, `/anchored`, `*.ext`). Its hash is sha256 over the sorted
(path, mode, sha256 of content) of every file. Files the launcher synced earlier and that are gone now
are deleted on the other pods; files created on the other pods are never touched.

Activity records: while a run is alive, $ML_DEV_STATE_DIR/heartbeat/run-<pid>.json (on the launching pod)
and rank-<pid>.json (on every pod running a rank) are rewritten every 10 s and removed at the end.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, TextIO

# The mount path of the startup ConfigMap (container env ML_DEV_DIR, core.naming.STARTUP_MOUNT), else this
# file's directory as called (os.path.abspath, never resolve(): behind the mount's symlinks lies the kubelet's
# `..<timestamp>` directory, which differs on every pod). Other pods are handed this path.
HERE = Path(os.environ.get("ML_DEV_DIR") or os.path.dirname(os.path.abspath(__file__)))
STATE_DIR = Path(os.environ.get("ML_DEV_STATE_DIR", "/tmp/ml-dev-env"))
IGNORE_FILE = ".ml-devignore"
SYNC_MANIFEST = ".ml-dev-synced"
HEARTBEAT_SECONDS = 10
STOP_GRACE_DEFAULT = 30  # lifecycle.checkpointGraceSeconds' default; the pod's value comes with rank.env


def stop_grace(values: dict[str, str] | None = None) -> int:
    """Seconds a stopped rank gets to save a checkpoint before its process group is killed."""
    text = (values or {}).get("ML_DEV_CHECKPOINT_GRACE_SECONDS") or os.environ.get("ML_DEV_CHECKPOINT_GRACE_SECONDS", "")
    return int(text) if text.isdigit() else STOP_GRACE_DEFAULT


def stop_signal(values: dict[str, str] | None = None) -> signal.Signals:
    """The signal a stopped rank gets first (lifecycle.checkpointSignal; SIGTERM unless set)."""
    name = (values or {}).get("ML_DEV_CHECKPOINT_SIGNAL") or os.environ.get("ML_DEV_CHECKPOINT_SIGNAL", "SIGTERM")
    return getattr(signal.Signals, name, signal.SIGTERM) if name.startswith("SIG") else signal.SIGTERM


DEBUG_PORT = 5678
PY = "python3"
PER_POD_ENV = (
    "HOSTNAME",
    "HOME",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "USER",
    "LOGNAME",
    "SHELL",
    "MAIL",
    "TERM",
    "POD_*",
    "NODE_NAME",
    "ML_DEV_POD",
    "ML_DEV_HOME",
    "NODE_RANK",
    "PET_NODE_RANK",
    "RANK",
    "LOCAL_RANK",
    "SSH_*",
    "LD_PRELOAD",
    "NSS_WRAPPER_*",
    "KUBERNETES_*",
)
"""Never carried from the launching pod to the others (glob patterns): what differs per pod by nature.
core/pod_contract.py holds the same tuple (tests/test_contract.py); `ml-dev run --help` prints it."""


def die(message: str, code: int = 1) -> None:
    print(f"ml-dev: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


# ------------------------------------------------------------------------------------ environment


def read_env_file(path: Path) -> dict[str, str]:
    """Values of a shell-sourceable file, as the shell sees them (the file is the contract, not its syntax)."""
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


def launch_env(extra: list[str]) -> dict[str, str]:
    """What travels to every rank: this shell's variables that differ from the container env (except the
    per-pod set), then `--env K=V`."""
    base = container_env()
    carried = {k: v for k, v in os.environ.items() if base.get(k) != v and not per_pod(k)}
    for item in extra:
        if "=" not in item or not item.split("=", 1)[0]:
            die(f"--env {item!r}: expected NAME=value")
        key, value = item.split("=", 1)
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
        self.devloop = read_env_file(Path(os.environ.get("ML_DEV_DEVLOOP_ENV", HERE / "devloop.env")))
        rank_file = STATE_DIR / "rank.env"
        self.rank_env = read_env_file(rank_file)
        if not self.rank_env.get("ML_DEV_HOSTS"):
            die(f"{rank_file} has no ML_DEV_HOSTS: is this an ml-dev-env pod, and has its startup script run?")
        self.hosts = self.rank_env["ML_DEV_HOSTS"].split()
        self.pods = self.rank_env.get("ML_DEV_PODS", "").split() or [h.split(".")[0] for h in self.hosts]
        self.me = int(self.rank_env.get("NODE_RANK", "-1"))
        self.ssh_config = STATE_DIR / "ssh" / "client.conf"
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
        ]
        if batch:
            opts += ["-o", "BatchMode=yes"]
        return ["ssh", *opts, self.hosts[rank], shlex.join(remote)]

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
        return f"oc exec{ns} {self.pods[rank]} -c ml-dev -- cat {STATE_DIR}/logs/sshd.log"

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


# ------------------------------------------------------------------------------------------ tree


def git(*args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, check=False)
    except FileNotFoundError:  # an image without git: plain directories
        return None


def tree_root(cwd: Path) -> Path:
    top = git("-C", str(cwd), "rev-parse", "--show-toplevel")
    path = top.stdout.decode().strip() if top and top.returncode == 0 else ""
    return Path(path) if path else cwd


def _ignore_patterns(root: Path, extra_files: list[str]) -> list[str]:
    patterns = [SYNC_MANIFEST, ".git/"]
    for name in extra_files:
        f = root / name
        if f.is_file():
            patterns += [ln.strip() for ln in f.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return patterns


def ignored(rel: str, patterns: list[str]) -> bool:
    """gitignore-style: `name` matches any path component, `a/b` and `/a` are anchored at the root,
    a trailing `/` matches directories only. (No `!` negation.)"""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # every directory above, then the file
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        body = pattern.rstrip("/")
        anchored = "/" in body
        body = body.lstrip("/")
        targets = prefixes[:-1] if dir_only else prefixes
        if any(fnmatch.fnmatchcase(t if anchored else t.rsplit("/", 1)[-1], body) for t in targets):
            return True
    return False


def tree_files(root: Path) -> list[str]:
    """Relative paths of the synced tree, sorted."""
    listed = git("-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed and listed.returncode == 0 and (root / ".git").exists():
        candidates = {p for p in listed.stdout.decode().split("\0") if p}
        patterns = _ignore_patterns(root, [IGNORE_FILE])
    else:
        candidates = set()
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                candidates.add(name if rel_dir == "." else f"{rel_dir}/{name}")
        patterns = _ignore_patterns(root, [IGNORE_FILE, ".gitignore"])
    out = []
    for rel in candidates:
        path = root / rel
        if not os.path.lexists(path) or ignored(rel, patterns):
            continue
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            out.append(rel)
    return sorted(out)


RACY_NS = 2_000_000_000


class HashCache:
    """sha256 per file keyed by (size, mtime_ns, inode): unchanged files are not read again.

    A file modified less than 2 s before it was hashed is hashed again next time (file timestamps are
    coarse: a same-size rewrite within one tick keeps size and mtime; git calls this "racy")."""

    def __init__(self, root: Path) -> None:
        key = hashlib.sha256(str(root).encode()).hexdigest()[:16]
        self.path = STATE_DIR / "tree-cache" / f"{key}.json"
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.new: dict[str, list[object]] = {}

    def digest(self, root: Path, rel: str) -> tuple[str, str]:
        path = root / rel
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return "120000", hashlib.sha256(os.readlink(path).encode()).hexdigest()
        mode = "100755" if st.st_mode & 0o111 else "100644"
        sig = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.data.get(rel)
        if cached and len(cached) == 5 and cached[:3] == sig and st.st_mtime_ns + RACY_NS < int(cached[4]):
            digest, hashed_at = str(cached[3]), int(cached[4])
        else:
            hashed_at = time.time_ns()
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            digest = h.hexdigest()
        self.new[rel] = [*sig, digest, hashed_at]
        return mode, digest

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}")
            tmp.write_text(json.dumps(self.new))
            tmp.replace(self.path)
        except OSError:
            pass


def tree_hash(root: Path, files: list[str]) -> str:
    cache = HashCache(root)
    h = hashlib.sha256()
    for rel in sorted(files):
        if not os.path.lexists(root / rel):
            h.update(f"missing\0{rel}\n".encode())
            continue
        mode, digest = cache.digest(root, rel)
        h.update(f"{mode} {digest} {rel}\n".encode())
    cache.save()
    return h.hexdigest()


# ------------------------------------------------------------------------------- remote helpers


def cmd_apply(args: argparse.Namespace) -> int:
    """(on a receiving pod) delete what an earlier sync brought and is gone now; print the tree hash."""
    root = Path(args.root)
    files = [p for p in sys.stdin.buffer.read().decode().split("\0") if p]
    manifest = root / SYNC_MANIFEST
    try:
        before = set(manifest.read_text().split("\0"))
    except OSError:
        before = set()
    for rel in sorted(before - set(files) - {""}):
        path = root / rel
        if ".." in Path(rel).parts or not os.path.lexists(path):
            continue
        if os.path.islink(path) or path.is_file():
            path.unlink()
    root.mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_suffix(f".{os.getpid()}")
    tmp.write_text("\0".join(files))
    tmp.replace(manifest)
    print(tree_hash(root, files))
    return 0


class Heartbeat:
    def __init__(self, name: str, info: dict[str, object]) -> None:
        self.path = STATE_DIR / "heartbeat" / f"{name}-{os.getpid()}.json"
        self.info = {**info, "pid": os.getpid(), "started": time.time()}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps({**self.info, "alive_at": time.time()}))
                tmp.replace(self.path)
            except OSError:
                pass
            self.stop.wait(HEARTBEAT_SECONDS)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        try:
            self.path.unlink()
        except OSError:
            pass


DEBUG_SITECUSTOMIZE = """
import os, sys
def _ml_dev_debug():
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    if any(k in argv for k in ("torchrun", "torch.distributed.run", "deepspeed.launcher", "bin/deepspeed")):
        return  # a launcher process: the debugger belongs in its worker
    if os.environ.get("LOCAL_RANK", "0") != os.environ.get("ML_DEV_DEBUG_LOCAL_RANK", "0"):
        return
    os.environ.pop("ML_DEV_DEBUG_PORT", None)  # children of the debugged process run freely
    try:
        import debugpy
    except ImportError:
        sys.stderr.write("ml-dev: debugpy is not installed in this image (pip install debugpy)\\n")
        return
    host = os.environ.get("ML_DEV_DEBUG_HOST") or "127.0.0.1"
    debugpy.listen((host, int(port)))
    sys.stderr.write("ml-dev: debugpy listening on %s port %s (pid %d); waiting for the debugger to attach\\n" % (host, port, os.getpid()))
    sys.stderr.flush()
    if os.environ.get("ML_DEV_DEBUG_WAIT", "1") == "1":
        debugpy.wait_for_client()
port = os.environ.get("ML_DEV_DEBUG_PORT")
if port:
    _ml_dev_debug()
"""


def cmd_rank(args: argparse.Namespace) -> int:
    """(on every pod) run one rank: the pod's rank.env, own process group, stopped when stdin closes."""
    env = dict(os.environ)
    env.update(read_env_file(STATE_DIR / "rank.env"))
    if args.env_stdin:
        # the launcher's variables (launch_env) come first on stdin, never in argv (ps, logs, length limits)
        try:
            sent = json.loads(read_line(0, 30) or b"{}")
        except ValueError:
            die("the launch environment on stdin is not JSON")
        env.update({str(k): str(v) for k, v in sent.get("env", {}).items()})
        if sent.get("per_pod"):
            env.update(RANK=env.get("NODE_RANK", "0"), LOCAL_RANK="0", WORLD_SIZE=env.get("NNODES", "1"))
    env["PYTHONUNBUFFERED"] = "1"
    if args.debug_port:
        site = STATE_DIR / "debug-site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(DEBUG_SITECUSTOMIZE)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
        env["ML_DEV_DEBUG_PORT"] = str(args.debug_port)
        # debugpy has no authentication: loopback unless `--debug-host pod` (oc port-forward dials localhost
        # inside the pod: cri-o internal/oci/runtime_oci_linux.go, runtimeOCI.PortForwardContainer)
        if args.debug_host == "pod" and not os.environ.get("POD_IP"):
            print("ml-dev: --debug-host pod needs $POD_IP (downward-API env); listening on 127.0.0.1", file=sys.stderr, flush=True)
        env["ML_DEV_DEBUG_HOST"] = os.environ.get("POD_IP", "") if args.debug_host == "pod" else "127.0.0.1"
    cwd = args.cwd if os.path.isdir(args.cwd) else None
    if cwd is None:
        print(f"ml-dev: {args.cwd} does not exist on this pod; running in {os.getcwd()}", file=sys.stderr, flush=True)
    # stdin is the launcher's channel (its EOF stops the rank), never the program's
    proc = subprocess.Popen(
        ["bash", "-c", 'exec "$@"', "_", *args.command], cwd=cwd, env=env, start_new_session=True, stdin=subprocess.DEVNULL
    )

    grace, first = stop_grace(env), stop_signal(env)
    stopping = threading.Lock()

    def stop_group() -> None:
        # once: a pod stop (SIGTERM from checkpoint_stop.sh) and the launcher's EOF may both arrive; the
        # rank gets the checkpoint signal once and `grace` seconds before its group is killed
        if proc.poll() is not None or not stopping.acquire(blocking=False):
            return
        try:
            os.killpg(proc.pid, first)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def watch_stdin() -> None:
        try:  # raw reads: a buffered reader would hold its lock at interpreter shutdown
            while os.read(0, 1 << 12):
                pass
        except OSError:
            pass
        stop_group()

    if not args.no_stdin_watch:
        threading.Thread(target=watch_stdin, daemon=True).start()
    # never wait inside the handler: it interrupts proc.wait() below, whose lock a nested wait cannot take
    # (it would sleep out the whole grace after the rank has already exited)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=stop_group, daemon=True).start())
    with Heartbeat("rank", {"command": args.command, "cwd": args.cwd, "pgid": proc.pid}):
        code = proc.wait()
    # a rank killed by a signal reports 128+N like a shell
    return code if code >= 0 else 128 - code


# --------------------------------------------------------------------------------- the launcher


class Stream(threading.Thread):
    lock = threading.Lock()

    def __init__(self, pipe: IO[bytes] | None, prefix: str, out: TextIO) -> None:  # Popen(stdout=PIPE).stdout
        super().__init__(daemon=True)
        self.pipe, self.prefix, self.out = pipe, prefix, out

    def run(self) -> None:
        if self.pipe is None:
            return
        for raw in iter(self.pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with Stream.lock:
                self.out.write(f"{self.prefix}{line}\n")
                self.out.flush()


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


def wait_reachable(cluster: Cluster, timeout: float) -> None:
    """Every pod answers over SSH (the same connection is kept for what follows), else name the ones that do not."""
    deadline = time.monotonic() + timeout

    def probe(rank: int) -> str:
        last = ""
        while True:
            res = subprocess.run(cluster.ssh(rank, ["true"]), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
            if res.returncode == 0:
                return ""
            last = cluster.explain(rank, res.stderr, res.returncode)
            if time.monotonic() >= deadline:
                return last
            time.sleep(1)

    results = parallel(probe, [r for r in range(len(cluster.hosts)) if r != cluster.me])
    bad = {r: e for r, e in results.items() if e}
    if bad:
        lines = [
            f"pod {cluster.pods[r]} ({cluster.hosts[r]}) is not reachable over SSH after {timeout:.0f} s: {e}"
            for r, e in sorted(bad.items())
        ]
        die("\n  ".join(lines))


def sync(cluster: Cluster, root: Path, quiet: bool = False) -> str:
    """Make the tree at `root` the same on every pod; returns its hash (verified on every pod)."""
    if root == Path("/"):
        die(f"refusing to sync {root}: run ml-dev from your project directory (or pass --no-sync)")
    files = [f for f in tree_files(root) if not cluster.is_per_pod(root / f)]
    local_hash = tree_hash(root, files)
    if cluster.is_shared(root):
        if not quiet:
            print(f"ml-dev: {root} is on shared storage: nothing to sync ({len(files)} files, tree {local_hash[:12]})", flush=True)
        return local_hash
    listing = ("\0".join(files)).encode()
    rsync_list = listing + b"\0" if files else b""
    rsh = cluster.rsh()

    sent: dict[int, int] = {}

    def push(rank: int) -> str:
        host = cluster.hosts[rank]
        mkdir = cluster.ssh(rank, ["mkdir", "-p", str(root)])
        mk = subprocess.run(mkdir, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        if mk.returncode != 0:
            raise RuntimeError(f"mkdir {root}: {mk.stderr.strip()}")
        got = ""
        # rsync's quick check (size + mtime, to the nanosecond with --modify-window=-1) misses a same-size
        # rewrite within one timestamp tick: when the hashes differ, compare contents (--checksum) once.
        for extra in ([], ["--checksum"]):
            res = subprocess.run(
                [
                    "rsync",
                    "-a",
                    "--stats",
                    "--modify-window=-1",
                    *extra,
                    "--from0",
                    "--files-from=-",
                    "-e",
                    rsh,
                    f"{root}/",
                    f"{host}:{root}/",
                ],
                input=rsync_list,
                capture_output=True,
                check=False,
            )
            if res.returncode != 0:
                raise RuntimeError(f"rsync exited {res.returncode}: {res.stderr.decode(errors='replace').strip()}")
            stats = re.search(rb"Total bytes sent: ([\d,.]+)", res.stdout)
            sent[rank] = sent.get(rank, 0) + (int(re.sub(rb"[,.]", b"", stats.group(1))) if stats else 0)
            remote = [PY, str(HERE / "ml-dev"), "_apply", "--root", str(root)]
            res = subprocess.run(cluster.ssh(rank, remote), input=listing, capture_output=True, check=False)
            if res.returncode != 0:
                raise RuntimeError(f"hash: {res.stderr.decode(errors='replace').strip()}")
            got = res.stdout.decode().strip()
            if got == local_hash:
                break
        return got

    started = time.monotonic()
    results = parallel(push, [r for r in range(len(cluster.hosts)) if r != cluster.me])
    problems = []
    for rank, got in sorted(results.items()):
        if isinstance(got, Exception):
            problems.append(f"{cluster.label(rank)}: sync failed: {got}; its sshd log: {cluster.sshd_log_command(rank)}")
        elif got != local_hash:
            problems.append(f"{cluster.label(rank)}: tree hash {str(got)[:12]} differs from {local_hash[:12]} here")
    if problems:
        die("\n  ".join(problems))
    if not quiet:
        print(
            f"ml-dev: synced {root} ({len(files)} files, tree {local_hash[:12]}) to {len(results)} pods in "
            f"{time.monotonic() - started:.1f} s, {sum(sent.values())} bytes sent",
            flush=True,
        )
    return local_hash


def debug_line(cluster: Cluster, rank: int, host: str) -> str:
    """What the launch says about the debugged rank: where debugpy listens and how to reach it."""
    if host == "pod":
        return (
            f"ml-dev: {cluster.label(rank)} runs under debugpy on its pod IP, port {DEBUG_PORT} (--debug-host pod): "
            f"any pod of the stack can attach to {cluster.hosts[rank]}:{DEBUG_PORT}, without authentication; "
            "oc port-forward does not reach it"
        )
    return (
        f"ml-dev: {cluster.label(rank)} runs under debugpy on 127.0.0.1:{DEBUG_PORT} of its pod (nothing else reaches it): "
        f"oc port-forward pod/{cluster.pods[rank]} {DEBUG_PORT}:{DEBUG_PORT}, then attach to localhost:{DEBUG_PORT}"
    )


def run_everywhere(
    cluster: Cluster,
    command: list[str],
    cwd: Path,
    debug_rank: int | None,
    wait_debugger: bool,
    carried: dict[str, str] | None = None,
    per_pod_ranks: bool = False,
    debug_host: str = "localhost",
) -> int:
    procs: dict[int, subprocess.Popen] = {}
    streams: list[Stream] = []
    hello = (json.dumps({"env": carried or {}, "per_pod": per_pod_ranks}) + "\n").encode()
    for rank in range(len(cluster.hosts)):
        agent = [PY, str(HERE / "ml-dev"), "_rank", "--env-stdin", "--cwd", str(cwd)]
        if debug_rank == rank:
            agent += ["--debug-port", str(DEBUG_PORT), "--debug-host", debug_host]
        agent += ["--", *command]
        argv = agent if rank == cluster.me else cluster.ssh(rank, agent)
        env = dict(os.environ)
        if debug_rank == rank and not wait_debugger:
            env["ML_DEV_DEBUG_WAIT"] = "0"
        # own session: the terminal's Ctrl-C reaches only the launcher, which stops every rank in order
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
        )
        procs[rank] = proc
        try:
            assert proc.stdin is not None
            proc.stdin.write(hello)
            proc.stdin.flush()
        except OSError:
            pass  # the rank failed at once: its exit status says why
        width = len(str(len(cluster.hosts) - 1))
        prefix = f"[{rank:>{width}}] "
        streams += [Stream(proc.stdout, prefix, sys.stdout), Stream(proc.stderr, prefix, sys.stderr)]
    for s in streams:
        s.start()
    if debug_rank is not None:
        print(debug_line(cluster, debug_rank, debug_host), flush=True)

    interrupted = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    failed: tuple[int, int] | None = None
    try:
        while True:
            if interrupted.is_set():
                break
            running = [r for r, p in procs.items() if p.poll() is None]
            for rank, p in sorted(procs.items()):
                if p.returncode not in (None, 0) and failed is None:
                    failed = (rank, p.returncode)
            if failed or not running:
                break
            time.sleep(0.1)
    finally:
        if failed or interrupted.is_set():
            why = f"{cluster.label(failed[0])} exited with status {failed[1]}" if failed else "interrupted"
            print(f"ml-dev: {why}; stopping every rank", file=sys.stderr, flush=True)
            stop_all(procs)
        for s in streams:
            s.join(timeout=2)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if failed:
        rank, code = failed
        print(f"ml-dev: FAILED: {cluster.label(rank)} on {cluster.hosts[rank]} exited with status {code}", file=sys.stderr, flush=True)
        return code if 0 < code < 256 else 1
    if interrupted.is_set():
        return 130
    return 0


def stop_all(procs: dict[int, subprocess.Popen]) -> None:
    """Closing an agent's stdin stops its rank's process group (over SSH: the channel's EOF)."""
    for p in procs.values():
        try:
            if p.stdin:
                p.stdin.close()
        except OSError:
            pass
    deadline = time.monotonic() + stop_grace(read_env_file(STATE_DIR / "rank.env")) + 5
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def cmd_run(args: argparse.Namespace) -> int:
    cluster = Cluster()
    if not args.command:
        die("nothing to run: ml-dev run -- <command>")
    wait_reachable(cluster, args.timeout)
    cwd = Path.cwd()
    if not args.no_sync:
        sync(cluster, tree_root(cwd))
    with Heartbeat("run", {"command": args.command, "cwd": str(cwd), "pods": cluster.pods}):
        return run_everywhere(cluster, args.command, cwd, args.debug, not args.no_wait, launch_env(args.env), args.per_pod, args.debug_host)


def cmd_sync(args: argparse.Namespace) -> int:
    cluster = Cluster()
    wait_reachable(cluster, args.timeout)
    sync(cluster, tree_root(Path.cwd()))
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    cluster = Cluster()
    if not args.command:
        die("nothing to run: ml-dev exec -- <command>")
    wait_reachable(cluster, args.timeout)
    results: dict[int, int] = {}
    procs = {}
    streams = []
    hello = (json.dumps({"env": launch_env(args.env)}) + "\n").encode()
    for rank in range(len(cluster.hosts)):
        agent = [PY, str(HERE / "ml-dev"), "_rank", "--env-stdin", "--cwd", os.getcwd(), "--", *args.command]
        argv = agent if rank == cluster.me else cluster.ssh(rank, agent)
        procs[rank] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            procs[rank].stdin.write(hello)  # type: ignore[union-attr]
            procs[rank].stdin.flush()  # type: ignore[union-attr]
        except OSError:
            pass
        streams += [Stream(procs[rank].stdout, f"[{rank}] ", sys.stdout), Stream(procs[rank].stderr, f"[{rank}] ", sys.stderr)]
    for s in streams:
        s.start()
    for rank, p in procs.items():
        results[rank] = p.wait()
    for s in streams:
        s.join(timeout=2)
    bad = {r: c for r, c in results.items() if c}
    for r, c in sorted(bad.items()):
        print(f"ml-dev: {cluster.label(r)} exited with status {c}", file=sys.stderr)
    return max(bad.values()) if bad else 0


STATUS_SCRIPT = r"""
. "${ML_DEV_STATE_DIR:-/tmp/ml-dev-env}/rank.env" 2>/dev/null
gpus="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)"
rdma="$(ls /sys/class/infiniband 2>/dev/null | paste -sd, -)"
n=0
for f in "${ML_DEV_STATE_DIR:-/tmp/ml-dev-env}"/ssh-sessions/*; do
  [ -f "$f" ] || continue
  pid="${f##*/}"; start="$(head -n1 "$f")"
  if [ -r "/proc/$pid/stat" ] && [ "$(cut -d' ' -f22 "/proc/$pid/stat")" = "$start" ]; then n=$((n + 1)); else rm -f "$f"; fi
done
printf 'rank=%s/%s gpus=%s rdma=%s ssh_sessions=%s\n' "${NODE_RANK:-?}" "${NNODES:-?}" "${gpus:-none}" "${rdma:-none}" "$n"
"""


def cmd_status(args: argparse.Namespace) -> int:
    if getattr(args, "all", False):
        # Every environment of this namespace (owner, size, state, GPU-hours this week) from the live objects,
        # read with the pod's ServiceAccount (its usage Role may list them): usage.py, shipped next to ml-dev.
        namespace = os.environ.get("POD_NAMESPACE") or Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
        return subprocess.run([PY, str(HERE / "usage.py"), "status", "--namespace", namespace], check=False).returncode
    cluster = Cluster()

    def one(rank: int) -> str:
        argv = ["bash", "-c", STATUS_SCRIPT] if rank == cluster.me else cluster.ssh(rank, ["bash", "-c", STATUS_SCRIPT])
        res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=args.timeout + 10, check=False)
        if res.returncode != 0:
            return "UNREACHABLE " + ((res.stderr.strip().splitlines() or [""])[-1])
        return res.stdout.strip()

    results = parallel(one, list(range(len(cluster.hosts))))
    print(
        f"{len(cluster.hosts)} pods, WORLD_SIZE={cluster.rank_env.get('WORLD_SIZE', '?')}, "
        f"master {cluster.rank_env.get('MASTER_ADDR', '?')}:{cluster.rank_env.get('MASTER_PORT', '?')}"
    )
    unreachable = 0
    for rank in range(len(cluster.hosts)):
        text = results[rank]
        text = f"ERROR {text}" if isinstance(text, Exception) else text
        unreachable += str(text).startswith(("UNREACHABLE", "ERROR"))
        print(f"  {cluster.pods[rank]:<24} {text}{'  (this pod)' if rank == cluster.me else ''}")
    return 1 if unreachable else 0


ENV_RULE = (
    "Environment of every rank: the pod's container env, its rank.env (NODE_RANK, NNODES, MASTER_ADDR, ...),\n"
    "then every variable of this shell that differs from the container env (an activated venv's PATH,\n"
    "NCCL_DEBUG=..., HF_*, CUDA_VISIBLE_DEVICES, ...), sent over the SSH session's stdin, never argv;\n"
    "then each --env K=V. Never carried (they differ per pod): " + " ".join(PER_POD_ENV) + "."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ml-dev", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser(
        "run",
        help="sync, then run a command on every pod with its rank environment",
        epilog=ENV_RULE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--no-sync", action="store_true", help="do not sync the working tree first")
    run.add_argument("--debug", type=int, metavar="RANK", help=f"run RANK's Python under debugpy on port {DEBUG_PORT}")
    run.add_argument("--no-wait", action="store_true", help="with --debug: do not wait for the debugger to attach")
    run.add_argument(
        "--debug-host",
        choices=("localhost", "pod"),
        default="localhost",
        help="with --debug: listen on 127.0.0.1 (default; oc port-forward) or on the pod IP (attach from another pod of the stack)",
    )
    run.add_argument(
        "--per-pod",
        action="store_true",
        help="one process per pod: also set RANK=NODE_RANK, LOCAL_RANK=0, WORLD_SIZE=NNODES (else nothing new is set)",
    )
    for p in (
        run,
        sub.add_parser("sync", help="sync the working tree to every pod"),
        sub.add_parser("exec", help="run a command on every pod (no sync)"),
        sub.add_parser("status", help="pods, ranks, GPUs, RDMA devices, SSH sessions"),
    ):
        p.add_argument("--timeout", type=float, default=60, help="seconds to wait for every pod to be reachable (60)")
        if p.prog.split()[-1] == "status":
            p.add_argument("--all", action="store_true", help="every environment of the namespace: owner, size, state, GPU-hours")
        if p.prog.split()[-1] in ("run", "exec"):
            p.add_argument("--env", action="append", default=[], metavar="K=V", help="set K=V on every rank (repeatable)")
            p.add_argument("command", nargs=argparse.REMAINDER)
    apply = sub.add_parser("_apply")
    apply.add_argument("--root", required=True)
    rank = sub.add_parser("_rank")
    rank.add_argument("--cwd", required=True)
    rank.add_argument("--debug-port", type=int)
    rank.add_argument("--debug-host", choices=("localhost", "pod"), default="localhost")
    rank.add_argument("--no-stdin-watch", action="store_true")
    rank.add_argument("--env-stdin", action="store_true")
    rank.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if getattr(args, "command", None) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    handlers = {"run": cmd_run, "sync": cmd_sync, "exec": cmd_exec, "status": cmd_status, "_apply": cmd_apply, "_rank": cmd_rank}
    return handlers[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
