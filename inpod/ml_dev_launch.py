"""ml-dev run / exec and `_rank` (what runs on every pod): heartbeats, the debugger hook, streaming output, stop-all on failure.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO

if TYPE_CHECKING or __package__:  # in the repository: the inpod package
    from .ml_dev_lib import (
        DEBUG_PORT,
        FROM_RANK_FILE,
        HEARTBEAT_SECONDS,
        HERE,
        PY,
        STATE_DIR,
        Cluster,
        die,
        launch_env,
        read_env_file,
        read_line,
        stop_grace,
        stop_signal,
        wait_reachable,
    )
    from .ml_dev_sync import sync, tree_root
else:  # in the pod: the modules ship next to the program (/opt/ml-dev-env), whose directory is sys.path[0]
    from ml_dev_lib import (
        DEBUG_PORT,
        FROM_RANK_FILE,
        HEARTBEAT_SECONDS,
        HERE,
        PY,
        STATE_DIR,
        Cluster,
        die,
        launch_env,
        read_env_file,
        read_line,
        stop_grace,
        stop_signal,
        wait_reachable,
    )
    from ml_dev_sync import sync, tree_root


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
def _ml_dev_adapter_on_pod_interface():
    # debugpy's adapter (started by debugpy.listen with this env: debugpy/server/api.py, `--for-server`) owns the
    # listener. On the pod IP it is bound to the pod network's interface (SO_BINDTODEVICE), as sshd and the agents
    # are: a peer on net1..N routing the pod IP via its secondary network is refused.
    host = os.environ.get("ML_DEV_DEBUG_HOST", "")
    argv = getattr(sys, "orig_argv", sys.argv)
    if "--for-server" not in argv or not host or host.startswith("127.") or not os.path.exists("/sys/class/net/eth0"):
        return
    import socket
    plain = socket.socket.bind
    def bind(self, address):
        if isinstance(address, tuple) and address and address[0] == host:
            try:
                self.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_BINDTODEVICE", 25), b"eth0")
            except OSError as exc:
                sys.stderr.write("ml-dev: the debugger is not bound to eth0 (%s): net1..N peers reach it\\n" % exc)
        return plain(self, address)
    socket.socket.bind = bind
_ml_dev_adapter_on_pod_interface()
port = os.environ.get("ML_DEV_DEBUG_PORT")
if port:
    _ml_dev_debug()
"""


TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""What torchrun forwards to its workers by default (TORCHELASTIC_SIGNALS_TO_HANDLE's default)."""


def cmd_rank(args: argparse.Namespace) -> int:
    """(on every pod) run one rank: the pod's rank.env, own process group, stopped when stdin closes."""
    # the rank keys come from this pod's current rank.env only: on the launching pod this process inherits the
    # launching shell's env, whose rank values are those of when the shell started (stale after a count change)
    env = {k: v for k, v in os.environ.items() if k not in FROM_RANK_FILE}
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
    grace, first = stop_grace(env), stop_signal(env)
    if first.name not in TORCHRUN_SIGNALS and "TORCHELASTIC_SIGNALS_TO_HANDLE" not in env:
        # torchrun runs its workers in sessions of their own and forwards only the signals it handles (SIGTERM,
        # SIGINT, SIGHUP, SIGQUIT; another one ends torchrun and never reaches them). Newer PyTorch reads this
        # list (torch/distributed/elastic/multiprocessing/api.py, PContext.start; pytorch/pytorch#154849);
        # older versions ignore it.
        env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = ",".join((*TORCHRUN_SIGNALS, first.name))
    cwd = args.cwd if os.path.isdir(args.cwd) else None
    if cwd is None:
        print(f"ml-dev: {args.cwd} does not exist on this pod; running in {os.getcwd()}", file=sys.stderr, flush=True)
    # stdin is the launcher's channel (its EOF stops the rank), never the program's
    proc = subprocess.Popen(
        ["bash", "-c", 'exec "$@"', "_", *args.command], cwd=cwd, env=env, start_new_session=True, stdin=subprocess.DEVNULL
    )

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
