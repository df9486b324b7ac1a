"""ml-dev run / exec and `_rank` (what runs on every pod): heartbeats, the debugger hook, streaming output, stop-all on failure.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.

Why one module: `ml-dev run`'s launcher and the rank agent it talks to are the two ends of one protocol (markers,
gate, stop); kept in one file, both ends of each message are read together.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Container, TextIO

from .. import contract
from ..lib import ledger, usersecrets
from ..lib.pod import read_rank_env
from . import envdrift, install, secrets
from .common import (
    DEBUG_PORT,
    FROM_RANK_FILE,
    HEARTBEAT_SECONDS,
    HERE,
    PY,
    STATE_DIR,
    Cluster,
    at_home,
    die,
    launch_env,
    listed_secrets,
    own_home,
    parallel,
    read_line,
    stop_grace,
    stop_signal,
    unreachable,
    wait_reachable,
)
from .logs import log_path
from .sync import GATE_MARK, POD_STOP_MARK, Tree, copy, serve_gate, sync, tree_root
from .watchdog import PROGRESS_MARK, ProgressRelay, Watchdog, new_run_id, rank_env, stall_seconds, verdict_now


class Heartbeat:
    def __init__(self, name: str, info: dict[str, object]) -> None:
        self.path = STATE_DIR / contract.HEARTBEAT_DIR / f"{name}-{os.getpid()}.json"
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
def _ml_dev_interface_of(host):
    # the interface that holds `host` (inpod/lib/http.py interface_of: this file runs where inpod is not importable)
    import fcntl, ipaddress, socket, struct
    ip = ipaddress.ip_address(host.split("%")[0])
    if ip.version == 6:
        with open("/proc/net/if_inet6") as f:
            return next((w[5] for w in (line.split() for line in f) if len(w) == 6 and w[0] == ip.packed.hex()), None)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                if fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))[20:24] == ip.packed:
                    return name
            except OSError:
                pass
    return None
def _ml_dev_adapter_on_pod_interface():
    # debugpy's adapter (started by debugpy.listen with this env: debugpy/server/api.py, `--for-server`) owns the
    # listener. On the pod IP it is bound to the interface that holds that IP (SO_BINDTODEVICE), as sshd and the
    # agents are: a peer on net1..N routing the pod IP via its secondary network is refused. It cannot be: the bind
    # fails, naming the address (debugpy.listen then fails in the debugged process), never an unbound listener.
    host = os.environ.get("ML_DEV_DEBUG_HOST", "")
    argv = getattr(sys, "orig_argv", sys.argv)
    if "--for-server" not in argv or not host or host.startswith("127.") or host == "::1":
        return
    import socket
    plain = socket.socket.bind
    def bind(self, address):
        if isinstance(address, tuple) and address and address[0] == host:
            device = _ml_dev_interface_of(host)
            if device is None:
                raise OSError("ml-dev: no interface of this pod holds %s: the debugger does not listen there" % host)
            try:
                self.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_BINDTODEVICE", 25), device.encode())
            except OSError as exc:
                raise OSError("ml-dev: the debugger cannot bind to %s, which holds %s (%s)" % (device, host, exc))
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
    """(on every pod) run one rank: the pod's rank.env, own process group, stopped when stdin closes.

    Why one function: the rank agent's life in order (gate, start, stream, stop), one process's state.
    """
    # the rank keys come from this pod's current rank.env only: on the launching pod this process inherits the
    # launching shell's env, whose rank values are those of when the shell started (stale after a count change)
    env = {k: v for k, v in os.environ.items() if k not in FROM_RANK_FILE}
    env.update(read_rank_env(missing_ok=True))
    sent: dict = {}
    if args.env_stdin:
        # the launcher's variables (launch_env) come first on stdin, never in argv (ps, logs, length limits)
        try:
            sent = json.loads(read_line(0, 30) or b"{}")
        except ValueError:
            die("the launch environment on stdin is not JSON")
        home = own_home(env)  # a carried value's parts under the launching pod's HOME are this pod's own (home_relative)
        env.update({str(k): at_home(str(v), home) for k, v in sent.get("env", {}).items()})
        if sent.get("per_pod"):
            env.update(RANK=env.get("NODE_RANK", "0"), LOCAL_RANK="0", WORLD_SIZE=env.get("NNODES", "1"))
    gate = sent.get("gate") if args.env_stdin else None
    if isinstance(gate, dict) and not serve_gate(gate, env):
        return 0  # the launch stopped before any rank started (a pod that never got the tree, a missing Secret key)
    run = sent.get("run", "") if args.env_stdin else ""
    if run:  # `ml-dev run`: the run id, the progress file (watched here), Flight Recorder's pipe (ml-dev why)
        env.update(rank_env(run, sent.get("launcher", ""), env))
        ProgressRelay(env[contract.PROGRESS_FILE_ENV]).start()
    values, refused = usersecrets.read_values()  # env.secrets' keys from this pod's own mount (never sent on stdin)
    if refused:  # `ml-dev run` stopped at the gate already; `ml-dev exec` and others stop here, in the same words
        die("no rank started:\n  " + "\n  ".join(refused))
    env.update(values)
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
            quiet_say("ml-dev: --debug-host pod needs $POD_IP (downward-API env); listening on 127.0.0.1")
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
        quiet_say(f"ml-dev: {args.cwd} does not exist on this pod; running in {os.getcwd()}")
    # the rank is its whole process tree: a member whose parent exits (bash after SIGTERM, torchrun's workers in
    # sessions of their own when torchrun dies) is re-parented to this agent, which waits for it and kills it
    # (prctl(2) PR_SET_CHILD_SUBREAPER)
    subreaper()
    # stdin is the launcher's channel (its EOF stops the rank), never the program's. In a run the rank's output goes
    # through this agent (RankOutput): to the run log, then on to the launcher while it reads; the rank never writes
    # to the SSH session itself, so a launcher gone (terminal closed, `| tee` ended, SIGKILL) cannot kill it with
    # SIGPIPE/EPIPE in the middle of its save
    if run:
        ledger.mark(contract.START_RANK)  # the start ledger's last phase: the first rank of a run this container started
    out = RankOutput(run_log(run, env.get("NODE_RANK", "0")) if run else None)
    piped = subprocess.PIPE if run else None
    proc = subprocess.Popen(
        ["bash", "-c", 'exec "$@"', "_", *args.command],
        cwd=cwd,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=piped,
        stderr=piped,
    )
    pumps = [out.pump(proc.stdout, 1), out.pump(proc.stderr, 2)] if run else []
    group = RankGroup(proc, first, grace, leave_rest=getattr(args, "leave_rest", False), say=out.say)

    def watch_stdin() -> None:
        try:  # raw reads: a buffered reader would hold its lock at interpreter shutdown
            while os.read(0, 1 << 12):
                pass
        except OSError:
            pass
        group.stop()

    def on_signal(signum: int, _frame: object) -> None:
        # SIGTERM from checkpoint_stop.sh (the pod's preStop hook or PID 1's trap, after it wrote the `stopping`
        # marker): this pod is stopping. The line tells the launcher, which stops every other rank at once
        # (run_everywhere reads POD_STOP_MARK); never wait inside the handler (it interrupts the waits below)
        name = signal.Signals(signum).name
        if (STATE_DIR / contract.STOPPING_MARKER).exists():
            why = f"pod {os.environ.get('POD_NAME') or os.environ.get('HOSTNAME', '?')} is stopping ({name} from its stop hook)"
        else:
            why = f"rank agent on {os.environ.get('POD_NAME') or os.environ.get('HOSTNAME', '?')} got {name}"
        threading.Thread(target=group.stop, daemon=True).start()  # first: the line below may meet a closed pipe
        out.say(f"{POD_STOP_MARK}{why}; its rank gets {first.name} and {grace} s to save")

    if not args.no_stdin_watch:
        threading.Thread(target=watch_stdin, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    info = {"command": args.command, "cwd": args.cwd, "pgid": proc.pid, "run": run, "launcher": sent.get("launcher") if run else None}
    with Heartbeat("rank", info):
        code = group.wait()
    for pump in pumps:  # the rank's last lines; what it left running (LEFT_RUNNING_MARK) may hold its pipes for ever
        pump.join(timeout=0.5 if group.left else 5)
    # a rank killed by a signal reports 128+N like a shell
    status = code if code >= 0 else 128 - code
    out.close(status)
    return status


def run_log(run: str, rank: str) -> Path:
    """This rank's log of `run` on its pod's workspace, the environment's own records folder (contract.records_dir):
    `$ML_DEV_WORKSPACE/.ml-dev-env/env/<app>/runs/<run>/logs/rank<N>.log` (`ml-dev logs` reads it back: logs.py)."""
    return log_path(run, rank)


class RankOutput:
    """(in the rank agent) The rank's output and the agent's own lines: each line to the run log, then to the agent's
    stdout/stderr (the SSH session's, read by `ml-dev run`). A write that fails there (EPIPE: the reader is gone;
    EIO) ends only the forwarding to that fd: the log still gets every line and the rank never sees the failure.
    Python ignores SIGPIPE (it sets SIG_IGN at startup), so the failure is an OSError here, never a signal."""

    def __init__(self, log: Path | None) -> None:
        self.lock = threading.Lock()
        self.gone: set[int] = set()
        self.log: IO[bytes] | None = None
        self.path = log
        if log is not None:
            try:
                log.parent.mkdir(parents=True, exist_ok=True)
                self.log = open(log, "ab")
            except OSError as exc:
                self.say(f"ml-dev: no run log at {log} ({exc.strerror}): the output goes to the launcher only")

    def write(self, fd: int, data: bytes, log: bool = True) -> None:
        with self.lock:
            if self.log is not None and log:
                try:
                    self.log.write(data)
                    self.log.flush()
                except OSError:
                    pass
            if fd in self.gone:
                return
            try:
                while data:
                    data = data[os.write(fd, data) :]
            except OSError:
                self.gone.add(fd)

    def say(self, line: str) -> None:
        """The agent's own line (stderr): never fatal, whatever became of the launcher."""
        self.write(2, (line + "\n").encode(), log=not line.startswith(PROGRESS_MARK))

    def pump(self, pipe: IO[bytes] | None, fd: int) -> threading.Thread:
        def run() -> None:
            if pipe is None:
                return
            for raw in iter(pipe.readline, b""):
                self.write(fd, raw)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self, status: int) -> None:
        """The log's last line: how the rank ended (`ml-dev logs -f` stops there)."""
        with self.lock:
            if self.log is not None:
                try:
                    self.log.write(f"{contract.RUN_LOG_END}{status}\n".encode())
                    self.log.close()
                except OSError:
                    pass
                self.log = None


def quiet_say(line: str) -> None:
    """A line to stderr that a closed pipe or a hung-up terminal cannot make fatal (the line is lost)."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


LEFT_RUNNING_MARK = "may not signal: left running"
"""The end of a rank agent's last line when it leaves processes it may not signal (RankGroup.wait). They hold the
agent's output (the SSH session's), so that session would stay open as long as they run: `ml-dev run` reads the line
and stops waiting for that rank."""


def subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux prctl PR_SET_CHILD_SUBREAPER = 36)."""
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, int, str]]:
    """{pid: (parent pid, process group, state)} of every process this pod's /proc shows."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
        except (OSError, IndexError, ValueError):
            continue
    return table


class RankGroup:
    """One rank: its process group and every descendant of this agent (the subreaper keeps orphans here).

    `stop()` sends the checkpoint signal to the group (and to re-parented members outside it, whose own launcher
    is gone) and starts the grace; `wait()` returns the first child's status once no member is left, SIGKILLing
    every member at the end of the grace. When the first child ends on its own, what it left behind gets the same
    signal, grace and kill: a rank is over when its command is. Members this agent may not signal (another UID, and
    the container lacks CAP_KILL, as barcelona's SCC drops it) are named and left running as soon as only they are
    left: neither the signal nor SIGKILL reaches them, so waiting out the grace would change nothing."""

    def __init__(
        self,
        proc: subprocess.Popen,
        first: signal.Signals,
        grace: float,
        leave_rest: bool = False,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.proc, self.first, self.grace, self.leave_rest = proc, first, grace, leave_rest
        self.say = say or quiet_say
        self.left = False  # it returned leaving members it may not signal
        self.stopping = threading.Lock()
        self.deadline: float | None = None

    def members(self) -> dict[int, tuple[int, int, str]]:
        """Live members {pid: (parent, group, state)}: the group's processes and this agent's descendants."""
        table = process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        found: set[int] = set()
        todo = list(children.get(os.getpid(), []))
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo += children.get(pid, [])
        found |= {pid for pid, (_, pgid, _) in table.items() if pgid == self.proc.pid}
        return {pid: table[pid] for pid in found if table[pid][2] != "Z"}

    def send(self, sig: signal.Signals) -> None:
        """`sig` to the group; SIGKILL to every member, another signal to the orphans outside the group."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid, (ppid, pgid, _) in self.members().items():
            if pgid != self.proc.pid and (sig == signal.SIGKILL or ppid == os.getpid()):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    continue

    @staticmethod
    def refused(members: dict[int, tuple[int, int, str]]) -> dict[int, str]:
        """{pid: its UID} of the members this agent may not signal. kill(2) with signal 0 makes the permission check
        and sends nothing: EPERM unless one of the sender's real/effective UIDs is the target's real or saved UID,
        or the sender has CAP_KILL (linux kernel/signal.c check_kill_permission, kill_ok_by_cred)."""
        out: dict[int, str] = {}
        for pid in members:
            try:
                os.kill(pid, 0)
            except PermissionError:
                try:
                    with open(f"/proc/{pid}/status") as f:
                        uid = next((line.split()[1] for line in f if line.startswith("Uid:")), "?")
                except (OSError, IndexError):
                    uid = "?"
                out[pid] = uid
            except ProcessLookupError:
                continue
        return out

    def stop(self) -> None:
        # once: a pod stop (SIGTERM from checkpoint_stop.sh) and the launcher's EOF may both arrive; the rank gets
        # the checkpoint signal once and `grace` seconds before every member is killed
        if not self.stopping.acquire(blocking=False):
            return
        self.deadline = time.monotonic() + self.grace
        self.send(self.first)

    def reap(self) -> None:
        """Collect re-parented members that have exited (the first child is Popen's to collect)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def wait(self) -> int:
        while True:
            if self.deadline is None:  # running: block on the command (no /proc scans) until it ends or a stop starts
                try:
                    self.proc.wait(0.5)
                except subprocess.TimeoutExpired:
                    continue
            code = self.proc.poll()
            if code is not None:
                self.reap()
            left = self.members()
            if code is not None and (not left or (self.leave_rest and self.deadline is None)):
                return code
            if code is not None and self.deadline is None:
                self.stop()  # the command ended on its own: what it left behind is stopped too
            refused = self.refused(left) if self.deadline is not None and left else {}
            if refused and len(refused) == len(left):
                uids = ", ".join(sorted(set(refused.values())))
                self.left = True
                self.say(
                    f"ml-dev: {len(left)} process(es) of the rank (pids {' '.join(map(str, sorted(refused)))}) run as "
                    f"UID {uids}, which this agent (UID {os.getuid()}, without CAP_KILL) {LEFT_RUNNING_MARK}"
                )
                return code if code is not None else 1
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.send(signal.SIGKILL)  # before the line: a write never delays (or, failing, skips) the kill
                self.deadline = time.monotonic() + 1  # again until they are gone
                self.say(f"ml-dev: {len(left)} process(es) of the rank still running after {self.grace} s: killed")
            time.sleep(0.05)


# --------------------------------------------------------------------------------- the launcher


class Stream(threading.Thread):
    lock = threading.Lock()

    def __init__(
        self,
        pipe: IO[bytes] | None,
        prefix: str,
        out: TextIO,
        on_line: Callable[[str], bool | None] | None = None,
        rank: int = -1,
    ) -> None:  # Popen(stdout=PIPE).stdout
        super().__init__(daemon=True)
        self.pipe, self.prefix, self.out, self.on_line, self.rank = pipe, prefix, out, on_line, rank

    def run(self) -> None:
        if self.pipe is None:
            return
        # drained to the end whatever becomes of `out`: an agent whose pipe filled would block its rank's writes
        for raw in iter(self.pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if self.on_line is not None and self.on_line(line):
                continue  # the launcher's own marks (watchdog.PROGRESS_MARK) are not the job's output
            emit(self.out, f"{self.prefix}{line}\n")


OUTPUT_GONE: list[str] = []
"""Why the launcher's stdout or stderr took a write no more (its first failure): `ml-dev run` stops the job then."""
OUTPUT_CHANGED = threading.Event()


def emit(out: TextIO, text: str) -> bool:
    """`text` to the launcher's stdout or stderr. A write that fails there (EPIPE: its pipe's reader is gone, `| tee`
    after Ctrl-C; EIO: its terminal hung up) never raises: that fd becomes /dev/null (dup2), so no later write, the
    interpreter's last flush included, fails again, and the failure is kept in OUTPUT_GONE."""
    with Stream.lock:
        try:
            out.write(text)
            out.flush()
            return True
        except (OSError, ValueError) as exc:
            name = "stdout" if out is sys.stdout else "stderr" if out is sys.stderr else "output"
            errno_name = getattr(exc, "errno", None)
            OUTPUT_GONE.append(f"its {name} took no more output ({os.strerror(errno_name) if errno_name else exc})")
            OUTPUT_CHANGED.set()
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, out.fileno())
                os.close(null)
                out.flush()  # what the failed write left in the buffer goes to /dev/null now
            except (OSError, ValueError):
                pass
            return False


class SafeErr:
    """The launcher's stderr for the watchdog and its verdict: every write through emit (never raises)."""

    def write(self, text: str) -> int:
        emit(sys.stderr, text)
        return len(text)

    def flush(self) -> None:
        pass


def say_err(line: str) -> None:
    """One of the launcher's own lines (stderr), never fatal."""
    emit(sys.stderr, line + "\n")


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
    run_id: str = "",
    tree: Tree | None = None,
    timeout: float = 60,
    gate: bool = False,
    allow_drift: bool = False,
) -> int:
    """Start a rank agent on every pod and stream them. With `tree` every agent first waits at its gate (serve_gate):
    it answers the hash of the tree it holds, the pods whose answer differs get a copy (sync.copy; a direct hop's
    `_apply` goes to the waiting agent), the listed Secret keys are checked (the
    same answers), and only then does every agent start its rank: one SSH
    session per pod when nothing changed, and no rank starts before every pod's tree is verified. With `gate` (`ml-dev
    run`, with or without a tree to check) every agent answers its environment's fingerprint at the gate too, and no
    rank starts while ranks differ (envdrift.gate_verdict; `allow_drift`: they start, the run's record says so).

    Why one function: the launcher's one event loop over every agent's stream (markers, exits, stops).
    """
    procs: dict[int, subprocess.Popen] = {}
    streams: list[Stream] = []
    launcher = cluster.pods[cluster.me] if 0 <= cluster.me < len(cluster.pods) else ""
    hello_of = {"env": carried or {}, "per_pod": per_pod_ranks, "run": run_id, "launcher": launcher}
    listed = listed_secrets() if tree is not None else []
    guess = envdrift.Guess() if gate else None  # its digest in every gate question: an equal rank answers only that
    stopped: list[str] = []  # why a pod stopped its rank (the agent's POD_STOP_MARK line), the first one
    left_running: set[int] = set()  # ranks whose agent ended leaving processes it may not signal (LEFT_RUNNING_MARK)
    pod_stop = threading.Event()
    # no output and no progress mark for lifecycle.stallVerdictSeconds: `ml-dev why`, once per stall (watchdog.py)
    seconds = stall_seconds() if run_id else 0
    safe_err = SafeErr()
    dog = Watchdog(seconds, lambda: verdict_now(run_id, safe_err), out=safe_err) if seconds else None

    def on_line(line: str, rank: int) -> bool:
        if dog is not None:
            dog.progress()
        if POD_STOP_MARK in line and not pod_stop.is_set():
            stopped.append(line.split(POD_STOP_MARK, 1)[1])
            pod_stop.set()
        if line.endswith(LEFT_RUNNING_MARK):
            left_running.add(rank)
        return line == PROGRESS_MARK

    def on_out(line: str) -> bool:
        if dog is not None:
            dog.progress()
        return False

    width = len(str(len(cluster.hosts) - 1))

    def spawn(rank: int) -> subprocess.Popen:
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
        hello = dict(hello_of)
        asked: dict[str, object] = {"env_digest": guess.digest} if guess is not None and guess.digest else {}
        if tree is not None:  # the launching pod's own agent only waits: its tree is the truth
            root = "" if rank == cluster.me else str(tree.root)
            hello["gate"] = {"root": root, "hash": tree.hash, "secrets": listed, "env": gate, **asked}
        elif gate:  # the tree is on shared storage, or not synced: the environment's fingerprint only
            hello["gate"] = {"root": "", "hash": "", "secrets": [], "env": True, **asked}
        try:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(hello) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass  # the rank failed at once: its exit status says why
        return proc

    for rank in range(len(cluster.hosts)):
        procs[rank] = spawn(rank)
    if tree is not None or gate:
        heard: list[str] = []  # the gate agents' stderr, as open_gate read it
        drift = functools.partial(envdrift.gate_verdict, cluster, allow_drift=allow_drift, run_id=run_id) if gate else None
        try:
            open_gate(cluster, procs, spawn, tree, timeout, heard, drift, guess)
        except BaseException:  # a refusal (die), Ctrl-C: EOF at every gate, no rank starts
            stop_all(procs, grace=0)
            stop = gate_stop(procs, heard)
            if stop:  # a pod stopping during the tree copy: its agent said so before its pod's sshd went
                say_err(f"ml-dev: STOPPED: {stop}")
                raise SystemExit(STOPPED_STATUS) from None
            raise
    for rank, proc in sorted(procs.items()):
        prefix = f"[{rank:>{width}}] "
        err = Stream(proc.stderr, prefix, sys.stderr, functools.partial(on_line, rank=rank), rank)
        streams += [Stream(proc.stdout, prefix, sys.stdout, on_out, rank), err]
    for s in streams:
        s.start()
    if dog is not None:
        dog.start()
    if debug_rank is not None:
        emit(sys.stdout, debug_line(cluster, debug_rank, debug_host) + "\n")

    signals: list[signal.Signals] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signal.Signals(signum))

    old = {s: signal.signal(s, on_signal) for s in LAUNCHER_SIGNALS}
    events = Events()
    try:
        while not (signals or pod_stop.is_set() or OUTPUT_GONE):
            running = [r for r, p in procs.items() if p.poll() is None]
            for rank, p in sorted(procs.items()):
                if p.returncode not in (None, 0) and events.failed is None:
                    events.failure(rank, p.returncode, f"{cluster.label(rank)} on {cluster.hosts[rank]}")
            if events.failed or not running:
                break
            time.sleep(0.1)
    finally:
        # whatever ended the wait (a signal, a stop, a failure, the output gone; an exception, even), every rank is
        # stopped before this returns, and nothing here may raise on the way: every line goes through emit
        if dog is not None:
            dog.stop.set()
        events.note(signals, stopped, OUTPUT_GONE)
        if events.first is not None:
            # one pod's stop is the job's stop: every other rank gets the checkpoint signal and the grace now,
            # not when its own pod stops (a rolling update replaces one pod at a time; a rank left running would
            # block in its next collective)
            say_err(f"ml-dev: {events.first.cause}; stopping every rank")
            stop_all(procs, left_running)
        for s in streams:  # the output of what an agent left running never ends: no wait for it
            s.join(timeout=0 if s.rank in left_running else 2)
        events.note(signals, stopped, OUTPUT_GONE)  # what came during the grace: named, the first still decides
        for sig, handler in old.items():
            signal.signal(sig, handler)
    for line in events.lines():
        say_err(line)
    return events.status()


LAUNCHER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What `ml-dev run` turns into a stop of every rank (checkpoint signal, grace): Ctrl-C, a kill, a terminal closed (the
kernel's SIGHUP to the session leader when its pty hangs up: drivers/tty/tty_jobctrl.c tty_signal_session_leader)."""
SIGNAL_WORDS = {
    signal.SIGINT: "SIGINT (Ctrl-C)",
    signal.SIGTERM: "SIGTERM",
    signal.SIGHUP: "SIGHUP (its terminal or SSH session closed)",
}
OUTPUT_GONE_STATUS = 128 + signal.SIGPIPE
"""`ml-dev run`'s status when its output's reader went away (141, as a shell reports a SIGPIPE death)."""


RUN_EXIT_STATUSES = (
    ("0", "every rank exited 0", "tests/podsim/test_rank_start.py::test_the_secret_reached_every_rank_and_nothing_else"),
    (
        "the failed rank's",
        "the first rank that failed, when that came first (every other rank stopped); 1 when its status is not 1–255. "
        "A stop that follows is named on the next line (`then STOPPED: …`)",
        "tests/podsim/test_attachment_matrix.py::test_a_failed_rank_then_a_drain_reports_both_the_failure_deciding",
    ),
    (
        "1",
        "`ml-dev` itself refused before any rank started: not an ml-dev-env pod (no `rank.env`), nothing to run, a pod "
        "unreachable, a sync problem, ranks whose environments differ (the drift gate: one line per difference; "
        "`--allow-drift` launches anyway)",
        "tests/podsim/test_rank_start.py::test_no_sshd_listening_is_connection_refused",
    ),
    ("2", "a usage mistake (argparse)", "tests/inpod/ml_dev/test_run_status.py::test_a_usage_mistake_exits_2"),
    (
        "129",
        "`ml-dev run` got SIGHUP (its terminal or SSH session closed): every rank got the checkpoint signal and the grace",
        "tests/podsim/test_attachment_matrix.py::test_every_attachment_keeps_every_checkpoint",
    ),
    (
        "130",
        "interrupted (Ctrl-C, SIGINT): every rank got the checkpoint signal and the grace",
        "tests/podsim/test_stop_matrix.py::test_every_stop_every_launcher",
    ),
    (
        "137",
        "`ml-dev run` was SIGKILLed (the shell's status; it prints nothing): every rank agent saw its stdin end and stopped "
        "its rank with the checkpoint signal and the grace all the same (`ml-dev logs` shows how)",
        "tests/podsim/test_attachment_matrix.py::test_every_attachment_keeps_every_checkpoint",
    ),
    (
        "141",
        "its output's reader went away (a `head` or `tee` it was piped to ended): every rank got the checkpoint signal and the grace "
        "(as a shell reports a SIGPIPE death; the rest of the output is in the run log)",
        "tests/podsim/test_attachment_matrix.py::test_every_attachment_keeps_every_checkpoint",
    ),
    (
        "143",
        "a pod's stop (drain, eviction, rolling update, scale to 0; during the tree copy too) reached a rank, or `ml-dev "
        "run` got SIGTERM: every rank got the checkpoint signal and the grace at once; the last line names the pod or "
        "the signal",
        "tests/podsim/test_attachment_matrix.py::test_sigterm_to_ml_dev_run_is_named_and_exits_143",
    ),
)
"""Every status `ml-dev run` returns (docs/ref/exit-codes.md's table), each with the test that pins it. When several
events end a run (a failed rank, a pod's stop, a signal to `ml-dev run`, its output gone) the first decides and each
is named, in order."""


class Event:
    def __init__(self, kind: str, cause: str, words: str, status: int) -> None:
        self.kind, self.cause, self.words, self.status = kind, cause, words, status


class Events:
    """What ended a run, in the order `ml-dev run` saw it: a failed rank, a pod's stop, a signal to `ml-dev run`, its
    output gone. The first decides the exit status; every one is named (issue 45: a stop after a failure never hides
    the failure, nor a failure the stop)."""

    def __init__(self) -> None:
        self.seen: list[Event] = []
        self.failed: tuple[int, int] | None = None

    @property
    def first(self) -> Event | None:
        return self.seen[0] if self.seen else None

    def _add(self, kind: str, cause: str, words: str, status: int) -> None:
        if all(e.kind != kind for e in self.seen):
            self.seen.append(Event(kind, cause, words, status))

    def failure(self, rank: int, code: int, where: str) -> None:
        self.failed = (rank, code)
        label = where.split(" on ")[0]
        self._add("FAILED", f"{label} exited with status {code}", f"{where} exited with status {code}", code if 0 < code < 256 else 1)

    def note(self, signals: list[signal.Signals], stopped: list[str], gone: list[str]) -> None:
        if stopped:  # a stopped job never reads as success, even when every rank saved and exited 0
            self._add("STOPPED", stopped[0], stopped[0], STOPPED_STATUS)
        if signals:
            sig = signals[0]
            words = f"ml-dev run got {SIGNAL_WORDS.get(sig, sig.name)}"
            self._add("INTERRUPTED", "interrupted" if sig == signal.SIGINT else words, words, 128 + int(sig))
        if gone:
            self._add("INTERRUPTED", gone[0], f"ml-dev run: {gone[0]}", OUTPUT_GONE_STATUS)

    def lines(self) -> list[str]:
        out = []
        for i, e in enumerate(self.seen):
            out.append(f"ml-dev: {e.kind}: {e.words}" if i == 0 else f"ml-dev: then {e.kind}: {e.words} (the status is the first's)")
        return out

    def status(self) -> int:
        return self.first.status if self.first is not None else 0


def gate_answer(proc: subprocess.Popen, prefix: str) -> dict | None:
    """The agent's answer at its gate ({"tree": the hash of the tree it holds, "secrets": presence}); lines before it
    (a login script's) are shown as the rank's output; None: the agent or its SSH session ended first."""
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith(GATE_MARK):
            try:
                got = json.loads(line[len(GATE_MARK) :])
            except ValueError:
                got = None
            if isinstance(got, dict):
                return got
        emit(sys.stdout, f"{prefix}{line}\n")
    return None


def gate_stop(procs: dict[int, subprocess.Popen], heard: list[str]) -> str:
    """The first POD_STOP_MARK line the gate agents said (every one has ended: stop_all), else ""."""
    for proc in procs.values():
        try:
            if proc.stderr is not None and proc.poll() is not None:
                heard.append(proc.stderr.read().decode(errors="replace"))
        except (OSError, ValueError):
            continue
    for text in heard:
        for line in text.splitlines():
            if POD_STOP_MARK in line:
                return line.split(POD_STOP_MARK, 1)[1]
    return ""


def open_gate(
    cluster: Cluster,
    procs: dict[int, subprocess.Popen],
    spawn: Callable[[int], subprocess.Popen],
    tree: Tree | None,
    timeout: float,
    heard: list[str] | None = None,
    drift: Callable[[dict[int, object]], None] | None = None,
    guess: envdrift.Guess | None = None,
) -> None:
    """Every agent answers at its gate (an SSH failure, exit 255 (ssh(1)), is tried again each second until
    `timeout`: the same wait and words as wait_reachable); the pods whose tree differs get a copy; every listed
    Secret key must be on every pod (their answers say; secrets.require's words); `drift` judges the environments'
    fingerprints (envdrift.gate_verdict; an answer of `guess`'s digest stands for its fingerprint); then `go` to all.
    Dies naming the pods that never answered or never got the tree, the missing keys, or the ranks whose environments
    differ. Without `tree` (shared storage, --no-sync) only the fingerprints are asked.

    Why one function: one exchange with every agent at its gate, in protocol order (answers, copies, Secret
    keys, go).
    """
    started = time.monotonic()
    deadline = started + timeout
    said = heard if heard is not None else []
    answers: dict[int, str] = {}
    found: dict[int, usersecrets.Presence | None] = {}
    prints: dict[int, object] = {}
    pip_applied: dict[int, int] = {}
    unusable: dict[int, list[str]] = {}
    width = len(str(len(cluster.hosts) - 1))

    def first(rank: int) -> str:
        """The agent's answer, or why it never came (`!<words>`: the agent's own)."""
        while True:
            proc = procs[rank]
            got = gate_answer(proc, f"[{rank:>{width}}] ")
            if got is not None:
                answers[rank] = str(got.get("tree") or "")
                prints[rank] = guess.heard(got) if guess is not None else got.get("env")
                pip_applied[rank] = int(got.get("pip_applied") or 0)
                found[rank] = got.get("secrets") if isinstance(got.get("secrets"), dict) else None
                unusable[rank] = [str(line) for line in got.get("refused_secrets") or []]
                return ""
            code = proc.wait()
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            said.append(err)
            if rank == cluster.me or code != 255:  # the agent's own words (255 is ssh's own failure)
                return "!" + ((err.strip().splitlines() or [f"exited {code}"])[-1])
            last = cluster.explain(rank, err, code)
            if time.monotonic() >= deadline:
                return last
            time.sleep(1)
            procs[rank] = spawn(rank)

    def ask(ranks: list[int]) -> None:
        results = parallel(first, ranks)
        bad = {r: str(e) for r, e in results.items() if e}
        if bad:
            die(unreachable(cluster, bad, timeout))

    ask(sorted(procs))

    def tell(rank: int, word: str, data: bytes) -> tuple[str, str]:
        """`<word> <n>` and n bytes to the agent waiting at that pod's gate; (the hash it answers, error)."""
        proc = procs[rank]
        if proc.poll() is not None:  # its session ended (that pod's sshd died): a new agent, once
            procs[rank] = proc = spawn(rank)
            if gate_answer(proc, f"[{rank:>{width}}] ") is None:
                code = proc.wait()
                said.append(proc.stderr.read().decode(errors="replace") if proc.stderr else "")
                return "", cluster.explain(rank, said[-1], code)
        try:
            assert proc.stdin is not None
            proc.stdin.write(f"{word} {len(data)}\n".encode() + data)
            proc.stdin.flush()
        except OSError:
            pass
        got = gate_answer(proc, f"[{rank:>{width}}] ")
        if got is None:
            code = proc.wait()
            said.append(proc.stderr.read().decode(errors="replace") if proc.stderr else "")
            return "", cluster.explain(rank, said[-1], code)
        if "env" in got or "env_digest" in got:
            prints[rank] = guess.heard(got) if guess is not None else got.get("env")
        if got.get("refused"):
            return str(got.get("tree") or ""), f"refused: {got['refused']}"
        return str(got.get("tree") or ""), ""

    def verify(rank: int, listing: bytes) -> tuple[str, str]:
        """`_apply` by the agent waiting at that pod's gate: the file list on its stdin, the hash it answers."""
        return tell(rank, "apply", listing)

    def patch(rank: int, payload: bytes) -> tuple[str, str]:
        """A small change written by the agent waiting at that pod's gate (sync.apply_patch), the hash it answers."""
        return tell(rank, "patch", payload)

    if tree is not None:
        copy(cluster, tree, {r: h for r, h in answers.items() if r != cluster.me}, started, verify=verify, patch=patch)
    # an agent whose SSH session ended while it waited (its pod's sshd died during the copy: that relay's failure
    # cost a retry) is started again and answers again, now with the verified tree
    gone = [r for r, p in sorted(procs.items()) if r != cluster.me and p.poll() is not None]
    if gone:
        emit(sys.stdout, f"ml-dev: {', '.join(cluster.label(r) for r in gone)}: its session ended while it waited; starting it again\n")
        deadline = time.monotonic() + timeout
        for r in gone:
            procs[r] = spawn(r)
        ask(gone)
        differs = [r for r in gone if tree is not None and answers[r] != tree.hash]
        if differs:
            die(
                "\n  ".join(
                    f"{cluster.label(r)}: tree {answers[r][:12]} differs from {tree.hash[:12] if tree else ''} here" for r in differs
                )
            )
    if tree is not None and listed_secrets():
        lines = usersecrets.missing_lines({cluster.pods[r]: found.get(r) for r in sorted(procs)})
        lines += sorted({line for r in sorted(procs) for line in unusable.get(r, [])})  # one line per Secret key
        if lines:
            die("no rank started:\n  " + "\n  ".join(lines))
    if drift is not None:
        for rank in install.replay(cluster, pip_applied):  # a pod added by a resize: the pip log first
            _, error = tell(rank, "env", b"")
            if error:
                die(f"{cluster.label(rank)}: {error}")
        drift(prints)
    for proc in procs.values():
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        except OSError:
            pass  # that agent ended: its status says why


STOPPED_STATUS = contract.RUN_STOPPED_STATUS  # 128 + SIGTERM
"""`ml-dev run`'s status when a pod's stop ended the job: 143, as a shell reports a SIGTERM (checkpoint_stop.sh's)."""


def stop_all(procs: dict[int, subprocess.Popen], left_running: Container[int] = (), grace: float | None = None) -> None:
    """Closing an agent's stdin stops its rank's process group (over SSH: the channel's EOF); an agent still at its
    gate (no rank started: `grace=0`) just ends. Each gets the checkpoint grace (lifecycle.checkpointGraceSeconds)
    and 5 s more, then its client is killed: the session of a pod that cannot be reached would hold the launch
    otherwise, and killing the client ends the remote agent's session all the same (its stdin's EOF). A rank in
    `left_running` (its agent said LEFT_RUNNING_MARK, now or while this waits) is done: its SSH session stays open
    only for the processes it left, which hold the session's output (sshd closes the channel at EOF), so its
    client is ended rather than waited for."""
    for p in procs.values():
        try:
            if p.stdin:
                p.stdin.close()
        except OSError:
            pass
    deadline = time.monotonic() + (stop_grace() if grace is None else grace) + 5  # the container env's (STOP_ENV)
    waiting = dict(procs)
    while waiting:
        for rank, p in list(waiting.items()):
            if p.poll() is None and (rank in left_running or time.monotonic() >= deadline):
                p.kill()
                p.wait()
            if p.poll() is not None:
                del waiting[rank]
        time.sleep(0.05)


LAUNCHER_CAP_SECONDS = 30
"""What torchrun and DeepSpeed's per-node launcher give their workers after the stop signal before SIGKILL: pytorch
torch/distributed/elastic/multiprocessing/api.py PContext.close(death_sig, timeout=30), called by
LocalElasticAgent._shutdown; deepspeedai/DeepSpeed deepspeed/launcher/launch.py sigkill_handler ->
terminate_process_tree (psutil.wait_procs(timeout=30), then kill)."""
MPI_CAP_SECONDS = 1
"""What Open MPI's mpirun gives its ranks: on a stop it sends SIGCONT, waits `odls_base_sigkill_timeout` (default 1 s),
sends SIGTERM, waits again, then SIGKILL (open-mpi/ompi v4.1 orte/mca/odls/base/odls_base_default_fns.c
orte_odls_base_default_kill_local_procs; the default registered in orte/mca/odls/base/odls_base_frame.c; Open MPI 5's
PRRTE the same: 3rd-party/prrte/src/mca/odls/base/odls_base_frame.c prte_odls_base_register, timeout 1)."""


class LauncherCap:
    """A launcher that kills its workers on its own clock after the stop signal (one row per launcher)."""

    def __init__(self, label: str, cap: int, source: str, remedy: str, match: Callable[[list[str]], bool]) -> None:
        self.label, self.cap, self.source, self.remedy, self.match = label, cap, source, remedy, match


def _has(*names: str) -> Callable[[list[str]], bool]:
    return lambda words: any(w in names for w in words)


def _accelerate(words: list[str]) -> bool:
    return any(w == "accelerate" and words[i + 1 : i + 2] == ["launch"] for i, w in enumerate(words))


PER_POD = "or run one process per pod: ml-dev run --per-pod -- python train.py"
LAUNCHER_CAPS = (
    LauncherCap(
        "torchrun",
        LAUNCHER_CAP_SECONDS,
        "torch/distributed/elastic/multiprocessing/api.py PContext.close(death_sig, timeout=30)",
        PER_POD,
        _has("torchrun", "torch.distributed.run", "torch.distributed.launch"),
    ),
    LauncherCap(
        "DeepSpeed's launcher",
        LAUNCHER_CAP_SECONDS,
        "deepspeed/launcher/launch.py sigkill_handler -> terminate_process_tree, psutil.wait_procs(timeout=30)",
        PER_POD,
        _has("deepspeed.launcher.launch", "deepspeed.launcher.runner", "deepspeed"),
    ),
    LauncherCap(
        "accelerate launch (torchrun's launcher in-process)",
        LAUNCHER_CAP_SECONDS,
        "accelerate/commands/launch.py multi_gpu_launcher -> torch.distributed.run.run -> PContext.close(timeout=30)",
        PER_POD,
        _accelerate,
    ),
    LauncherCap(
        "mpirun (Open MPI)",
        MPI_CAP_SECONDS,
        "Open MPI orte/mca/odls/base/odls_base_default_fns.c orte_odls_base_default_kill_local_procs, "
        "odls_base_sigkill_timeout default 1 s (PRRTE: prte_odls_base_register)",
        "or raise it: ml-dev run --env OMPI_MCA_odls_base_sigkill_timeout=<grace> (Open MPI 5: PRTE_MCA_odls_base_sigkill_timeout)",
        _has("mpirun", "mpiexec", "orterun", "prterun"),
    ),
)
"""Every launcher with a cap of its own, the cap, where upstream sets it, and what to do."""
SCRIPT_LINES = 200
"""How many lines of a script command (`./train.sh`, `bash train.sh`) are read for a launcher inside it."""


def command_words(text: str) -> list[str]:
    return [os.path.basename(w.strip("'\"();&|")) for w in text.split()]


def script_of(command: list[str], cwd: Path | None = None) -> Path | None:
    """The script a command runs, when it runs one: `./train.sh`, `bash train.sh`, `sh -e run.sh` (not `bash -c`)."""
    args = list(command)
    if args and os.path.basename(args[0]) in ("bash", "sh", "dash", "zsh"):
        args = args[1:]
        while args and args[0].startswith("-"):
            if args[0] == "-c":
                return None
            args = args[1:]
    if not args:
        return None
    path = Path(args[0]) if os.path.isabs(args[0]) else (cwd or Path.cwd()) / args[0]
    if ("/" in args[0] or os.path.basename(command[0]) in ("bash", "sh", "dash", "zsh")) and path.is_file():
        return path
    return None


def script_words(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, words) of the script's first SCRIPT_LINES lines that are not comments."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                if number > SCRIPT_LINES:
                    break
                code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
                if code.strip():
                    out.append((number, command_words(code)))
    except OSError:
        return []
    return out


def launcher_cap_warning(command: list[str], grace: int, cwd: Path | None = None) -> str | None:
    """The launch-time warning when the command runs a launcher that caps the grace below checkpointGraceSeconds: the
    command itself (`bash -c 'torchrun …'` too) or, when it runs a script, a line of the script."""
    found: list[tuple[LauncherCap, str]] = []
    words = command_words(" ".join(command))
    found += [(cap, "") for cap in LAUNCHER_CAPS if cap.match(words)]
    script = script_of(command, cwd)
    if script is not None and not found:
        for number, line in script_words(script):
            found += [(cap, f" (in {script.name}, line {number})") for cap in LAUNCHER_CAPS if cap.match(line)]
    for cap, where in found:
        if grace > cap.cap:
            return (
                f"ml-dev: warning: {cap.label} gives its workers {cap.cap} s after the stop signal, then SIGKILL{where}: "
                f"checkpointGraceSeconds is {grace} s, so a save must finish within {cap.cap} s ({cap.remedy}; "
                f"upstream: {cap.source})"
            )
    return None


def cmd_run(args: argparse.Namespace) -> int:
    cluster = Cluster()
    if not args.command:
        die("nothing to run: ml-dev run -- <command>")
    warning = launcher_cap_warning(args.command, stop_grace(cluster.rank_env), Path.cwd())
    if warning:
        say_err(warning)
    cwd = Path.cwd()
    tree = None if args.no_sync else Tree(cluster, tree_root(cwd))
    if tree is None or tree.shared:
        if tree is not None:
            sync(cluster, tree.root, timeout=args.timeout)  # shared storage: nothing to copy, every pod reachable
        else:
            wait_reachable(cluster, args.timeout)
        secrets.require(cluster)
        tree = None
    # else: the rank agents' gate is the reachability probe, the tree check and the Secret check (open_gate), the
    # copy goes to the pods whose tree differs, and only then does any rank start
    run_id = new_run_id()
    with Heartbeat("run", {"command": args.command, "cwd": str(cwd), "pods": cluster.pods, "run": run_id}):
        return run_everywhere(
            cluster,
            args.command,
            cwd,
            args.debug,
            not args.no_wait,
            launch_env(args.env),
            args.per_pod,
            args.debug_host,
            run_id,
            tree=tree,
            timeout=args.timeout,
            gate=True,
            allow_drift=args.allow_drift,
        )


def cmd_exec(args: argparse.Namespace) -> int:
    cluster = Cluster()
    if not args.command:
        die("nothing to run: ml-dev exec -- <command>")
    wait_reachable(cluster, args.timeout)
    secrets.require(cluster)
    results: dict[int, int] = {}
    procs = {}
    streams = []
    hello = (json.dumps({"env": launch_env(args.env)}) + "\n").encode()
    for rank in range(len(cluster.hosts)):
        agent = [PY, str(HERE / "ml-dev"), "_rank", "--env-stdin", "--leave-rest", "--cwd", os.getcwd(), "--", *args.command]
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
