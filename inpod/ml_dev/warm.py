"""Warm ranks, the pod's side: the node (the rank command the rank agent runs, one per pod), its workers (one per GPU,
each a long-lived Python with its own namespace) and the bridge (the hub's SSH session to the node).

    rank agent (`ml-dev _rank`, launch.py) -> node (`ml-dev _warm-node`)  -> worker (`python -c WORKER_MAIN`) x N
    hub (ranks.py, on the launching pod)   -> bridge (`ml-dev _warm-bridge`, over the fabric's SSH) -> node

The node is the rank agent's command: its process group is the rank (the checkpoint signal and the grace of every stop
reach the node and every worker), its output goes to the run log. It serves one Unix socket in the abstract namespace
(unix(7): no file, bound to the pod's network namespace: nothing outside the pod reaches it, no port anywhere) and
accepts only peers of its own UID (SO_PEERCRED). A worker talks to the node over a socketpair it inherits.

Messages are JSON lines: hub -> node `cell` {id, code, ranks} and `interrupt` {id}; node -> hub `hello` {pod, ranks},
`out` {rank, id, stream, text}, `done` {rank, id, ok, interrupted, error}, `gone` {rank, status}.

An interrupt raises KeyboardInterrupt in the worker's main thread: SIGINT sent to that thread (pthread_kill, so a
blocking call there returns EINTR and the handler runs: PEP 475 retries a call only when the handler returns), whose
handler raises only while the interrupted cell runs. The checkpoint signal (lifecycle.checkpointSignal) raises
SystemExit, unless a cell installed a handler of its own (a save).

Why one module: the node, its workers and the bridge are the ends of one protocol (its messages, its sockets, its
signals); kept in one file, both ends of each message are read together.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import linecache
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict

from .. import contract
from ..lib.pod import env_records_dir
from .common import HERE, STATE_DIR, stop_signal

Message = Dict[str, Any]
OUTCOMES = ("ok", "interrupted", "error")
"""A cell's outcomes, the worst last: a cell's state on a pod is its worst rank's."""


def node_address(uid: int | None = None, host: str | None = None) -> bytes:
    """The node's socket on its pod: abstract (leading NUL), named by UID and pod."""
    who = os.getuid() if uid is None else uid
    return f"\0{contract.WARM_SOCKET_PREFIX}node:{who}:{host or socket.gethostname()}".encode()


def peer_uid(conn: socket.socket) -> int:
    """The connected peer's UID (SO_PEERCRED: struct ucred {pid, uid, gid})."""
    raw = conn.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_PEERCRED", 17), struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[1])


def warm_dir() -> Path:
    """The warm ranks' records: `<records_dir>/warm-ranks/` (state.json, hub.log) on the launching pod's workspace."""
    return env_records_dir() / contract.WARM_DIR


def hub_address() -> bytes:
    """The hub's socket: abstract, named by UID and the environment's records folder (one hub per environment)."""
    tag = hashlib.sha256(str(env_records_dir(migrate=False)).encode()).hexdigest()[:12]
    return f"\0{contract.WARM_SOCKET_PREFIX}hub:{os.getuid()}:{tag}".encode()


def read_state() -> Message:
    try:
        got = json.loads((warm_dir() / contract.WARM_STATE_FILE).read_text())
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def write_state(state: Message) -> None:
    path = warm_dir() / contract.WARM_STATE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def listen_unix(address: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address)
    sock.listen(8)
    return sock


def send(sock: socket.socket, lock: threading.Lock, msg: Message) -> bool:
    data = (json.dumps(msg) + "\n").encode()
    with lock:
        try:
            sock.sendall(data)
            return True
        except OSError:
            return False


def messages(sock: socket.socket) -> Any:
    """The JSON lines a socket sends, until EOF. Raw recv: an interrupted call loses nothing of the buffer."""
    buffered = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except InterruptedError:
            continue
        except OSError:
            return
        if not chunk:
            return
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict):
                yield got


def activity_path() -> Any:
    return STATE_DIR / contract.WARM_DIR / contract.WARM_ACTIVITY_FILE


def write_activity(record: Message) -> None:
    """This pod's warm-rank activity (the idle agent's and the home page's): cells running, the last one's state."""
    path = activity_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------- the node


class Node:
    """One pod's warm ranks: spawns the workers, serves the hub's bridge, routes messages, records activity."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.node_rank = int(os.environ.get("NODE_RANK", "0") or 0)
        self.nnodes = int(os.environ.get("NNODES", "1") or 1)
        self.workers: dict[int, subprocess.Popen] = {}
        self.channels: dict[int, socket.socket] = {}
        self.locks: dict[int, threading.Lock] = {}
        self.ready: set = set()
        self.all_ready = threading.Event()
        self.bridge: socket.socket | None = None
        self.bridge_lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.stopping = False
        self.running: dict[int, set] = {}  # cell id -> ranks still running it here
        self.state_lock = threading.Lock()
        self.activity: Message = {"pid": os.getpid(), "started": time.time(), "last": time.time(), "running": [], "last_cell": None}
        self.activity["ranks"] = self.ranks()

    def ranks(self) -> list[int]:
        return [self.node_rank * self.nproc + k for k in range(self.nproc)]

    def start(self) -> None:
        world = self.nnodes * self.nproc
        for local, rank in enumerate(self.ranks()):
            mine, theirs = socket.socketpair()
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(local),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(self.nproc),
                GROUP_RANK=str(self.node_rank),
                ROLE_RANK=str(rank),
                ROLE_WORLD_SIZE=str(world),
            )
            # `python -c`: the cells' imports find the tree first (sys.path[0] is the cwd, the tree root), then this
            # package (PYTHONPATH, which the worker gives back its value: a cell's own children never see it)
            env[WORKER_PYTHONPATH] = json.dumps(env.get("PYTHONPATH"))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
            argv = [sys.executable, "-c", WORKER_MAIN, str(theirs.fileno()), contract.WARM_WORKER_COMMAND]  # (its name: ps, idle)
            # the node's process group (no session of its own): the rank agent's checkpoint signal reaches every worker
            self.workers[rank] = subprocess.Popen(argv, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
            theirs.close()
            self.channels[rank], self.locks[rank] = mine, threading.Lock()
            threading.Thread(target=self.from_worker, args=(rank,), daemon=True).start()

    def from_worker(self, rank: int) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, stop_signal()})
        for msg in messages(self.channels[rank]):
            if msg.get("op") == "up":
                self.ready.add(rank)
                if len(self.ready) == self.nproc:
                    self.all_ready.set()
                continue
            if msg.get("op") == "done":
                self.finished(rank, msg)
            self.to_hub(msg)

    def finished(self, rank: int, msg: Message) -> None:
        """A worker's cell ended: the pod's activity record says which cells still run and how the last one went."""
        state = "interrupted" if msg.get("interrupted") else "ok" if msg.get("ok") else "error"
        with self.state_lock:
            cid = int(msg.get("id", 0))
            left = self.running.get(cid, set())
            left.discard(rank)
            if not left:
                self.running.pop(cid, None)
            last = self.activity.get("last_cell") or {}
            if last.get("id") == cid:
                worst = max(last.get("outcome", "ok"), state, key=OUTCOMES.index)
                last.update(outcome=worst, done=sorted({*last.get("done", []), rank}))
                if not left:
                    last.update(state=worst, ended=time.time())
            self.activity.update(last=time.time(), running=sorted(self.running), last_cell=last)
            write_activity(self.activity)

    def to_hub(self, msg: Message) -> None:
        with self.bridge_lock:
            bridge = self.bridge
        if bridge is not None:
            send(bridge, self.out_lock, msg)

    def serve(self, listener: socket.socket) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, stop_signal()})  # the main thread's (and its threads')
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if peer_uid(conn) != os.getuid():
                conn.close()  # another UID of the pod: never served
                continue
            with self.bridge_lock:
                old, self.bridge = self.bridge, conn
            if old is not None:
                old.close()
            self.all_ready.wait()
            send(conn, self.out_lock, {"op": "hello", "pod": socket.gethostname(), "ranks": self.ranks(), "pid": os.getpid()})
            threading.Thread(target=self.from_hub, args=(conn,), daemon=True).start()

    def from_hub(self, conn: socket.socket) -> None:
        for msg in messages(conn):
            op = msg.get("op")
            if op == "cell":
                targets = [r for r in self.ranks() if msg.get("ranks") is None or r in msg["ranks"]]
                with self.state_lock:
                    self.running[int(msg["id"])] = set(targets)
                    now = time.time()
                    self.activity.update(last=now, running=sorted(self.running))
                    self.activity["last_cell"] = {"id": msg["id"], "started": now, "state": "running", "ranks": targets}
                    write_activity(self.activity)
                for r in targets:
                    send(self.channels[r], self.locks[r], msg)
            elif op == "interrupt" and not self.stopping:  # a stop's save handlers run: an interrupt would cut them
                for r in self.ranks():
                    send(self.channels[r], self.locks[r], msg)

    def wait(self) -> int:
        """Until a worker ends: a stop (every worker got the checkpoint signal) waits for all of them; a worker that ended
        on its own ends the node (the process group is broken): the rank agent stops the rest, the hub every pod."""
        while True:
            for rank, proc in self.workers.items():
                code = proc.poll()
                if code is None:
                    continue
                if not self.stopping:
                    self.to_hub({"op": "gone", "rank": rank, "status": code})
                    print(f"ml-dev: warm rank {rank} exited with status {code}", file=sys.stderr, flush=True)
                for other in self.workers.values():
                    other.wait()
                return code if code > 0 else 128 - code if code < 0 else 0
            time.sleep(0.1)


def cmd_node(nproc: int) -> int:
    node = Node(max(1, nproc))
    first = stop_signal()

    def on_stop(signum: int, _frame: object) -> None:
        # the workers got it too (one process group): a cell that handles it (a save) ends, then its worker, whose
        # channel ends here; an idle worker ends at once (SystemExit)
        node.stopping = True
        for channel in node.channels.values():
            try:
                channel.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    signal.signal(first, on_stop)
    if first != signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is a worker's, never the node's
    listener = listen_unix(node_address())
    node.start()
    write_activity(node.activity)
    threading.Thread(target=node.serve, args=(listener,), daemon=True).start()
    print(f"ml-dev: warm ranks {' '.join(map(str, node.ranks()))} on {socket.gethostname()}", flush=True)
    try:
        return node.wait()
    finally:
        try:
            activity_path().unlink()
        except OSError:
            pass


# ------------------------------------------------------------------------------------------- the bridge


def cmd_bridge() -> int:
    """(on a pod, the hub's SSH session) stdin -> the node's socket -> stdout, until either side ends."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 30
    while True:
        try:
            sock.connect(node_address())
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                print(f"ml-dev: no warm ranks on {socket.gethostname()} ({exc.strerror})", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.2)
    return splice(sock)


def splice(sock: socket.socket) -> int:
    """stdin -> `sock`, `sock` -> stdout, until either side ends (stdin's EOF shuts the socket: its peer sees the
    client gone). The bridge's and the hub's relay's (ranks.py cmd_hub_relay) one loop."""

    def up() -> None:
        while True:
            try:
                data = os.read(0, 1 << 16)
            except OSError:
                data = b""
            if not data:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            sock.sendall(data)

    threading.Thread(target=up, daemon=True).start()
    while True:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return 0
        try:
            while data:
                data = data[os.write(1, data) :]
        except OSError:
            return 0


# ------------------------------------------------------------------------------------------- the worker


class CellOut:
    """A cell's sys.stdout / sys.stderr: each write to the hub (labelled by the node) and to the run log."""

    def __init__(self, worker: Worker, cid: int, stream: str, fd: int) -> None:
        self.worker, self.cid, self.stream, self.fd = worker, cid, stream, fd
        self.encoding = "utf-8"

    def write(self, text: str) -> int:
        if text:
            self.worker.say({"op": "out", "rank": self.worker.rank, "id": self.cid, "stream": self.stream, "text": text})
            try:
                os.write(self.fd, text.encode(errors="replace"))
            except OSError:
                pass
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class Worker:
    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.lock = threading.Lock()
        self.rank = int(os.environ.get("RANK", "0"))
        self.cells: queue.Queue = queue.Queue()
        self.cell: int | None = None  # the cell running now
        self.user = False  # the cell's own code runs (an interrupt may land)
        self.interrupting = False
        self.stopping = False
        self.namespace: Message = {"__name__": "__main__", "__builtins__": builtins}
        self.stop_signal = stop_signal()

    def say(self, msg: Message) -> None:
        send(self.sock, self.lock, msg)

    def read(self) -> None:
        # signals for the process go to the main thread, where the handlers run: Python runs a handler in the main
        # thread whichever thread got the signal (docs.python.org library/signal.html "Signals and threads"), but a
        # main thread blocked in a call wakes (EINTR) only when it got the signal itself; the kernel offers a
        # process-directed signal to the thread group leader first, then to any thread not blocking it (linux
        # kernel/signal.c complete_signal). The node's interrupt is pthread_kill to the main thread in any case.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, self.stop_signal})
        for msg in messages(self.sock):
            if msg.get("op") == "cell":
                self.cells.put(msg)
            elif msg.get("op") == "interrupt" and self.cell is not None and self.cell == msg.get("id"):
                self.interrupting = True
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        self.cells.put(None)  # the node is gone: this rank ends

    def on_sigint(self, signum: int, _frame: object) -> None:
        if self.interrupting and self.user:
            self.interrupting = False
            raise KeyboardInterrupt
        if signum == self.stop_signal and not self.interrupting:
            self.on_stop(signum, _frame)

    def on_stop(self, signum: int, _frame: object) -> None:
        self.stopping = True
        raise SystemExit(128 + signum)

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.on_sigint)
        if self.stop_signal != signal.SIGINT:
            signal.signal(self.stop_signal, self.on_stop)
        sys.argv = [f"rank {self.rank}"]
        threading.Thread(target=self.read, daemon=True).start()
        self.say({"op": "up", "rank": self.rank, "pid": os.getpid()})
        while True:
            try:
                msg = self.cells.get(timeout=1)
            except (KeyboardInterrupt, queue.Empty):
                continue
            if msg is None:
                return 0
            self.run_cell(msg)

    def run_cell(self, msg: Message) -> None:
        cid = int(msg.get("id", 0))
        filename = cell_file(cid, str(msg.get("code", "")))
        outcome: Message = {"op": "done", "rank": self.rank, "id": cid, "ok": True, "interrupted": False, "error": None}
        saved = sys.stdout, sys.stderr
        self.interrupting = False
        self.cell = cid
        try:
            sys.stdout, sys.stderr = CellOut(self, cid, "stdout", 1), CellOut(self, cid, "stderr", 2)
            try:
                self.user = True
                execute(str(msg.get("code", "")), filename, self.namespace)
            finally:
                self.user = False
        except KeyboardInterrupt:
            outcome.update(ok=False, interrupted=True, error="KeyboardInterrupt: interrupted")
        except SystemExit as exc:
            if self.stopping:
                self.finish(saved, outcome)
                raise
            outcome.update(ok=False, error=f"SystemExit: {exc.code} (the rank stays warm)")
        except BaseException as exc:  # the cell's own exception: shown with the rank and the traceback
            outcome.update(ok=False, error=cell_traceback(exc))
        self.finish(saved, outcome)

    def finish(self, saved: tuple, outcome: Message) -> None:
        sys.stdout, sys.stderr = saved
        self.cell = None
        self.interrupting = False
        self.say(outcome)


def cell_file(cid: int, code: str) -> str:
    """The cell's source under this pod's state dir (`warm-ranks/cells/cell-<id>.py`): tracebacks show its lines, `ml-dev why`
    names its frames (a `<string>` frame reads as the interpreter's own)."""
    path = STATE_DIR / contract.WARM_DIR / "cells" / f"cell-{cid}.py"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != code:
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(code)
            tmp.replace(path)
    except OSError:
        pass
    linecache.cache[str(path)] = (len(code), None, code.splitlines(True), str(path))
    return str(path)


def execute(code: str, filename: str, namespace: Message) -> None:
    """Run a cell; a last bare expression's value is printed (as a notebook shows it), None excepted."""
    tree = ast.parse(code, filename, "exec")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body = tree.body[:-1]
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
        if value is not None:
            print(repr(value))


def cell_traceback(exc: BaseException) -> str:
    """The traceback without this module's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


WORKER_PYTHONPATH = "ML_DEV_WARM_PYTHONPATH"
"""The rank's own PYTHONPATH (JSON: null when unset), which the worker gives back."""
WORKER_MAIN = "import sys; from inpod.ml_dev.warm import cmd_worker; sys.exit(cmd_worker(int(sys.argv[1])))"


def cmd_worker(fd: int) -> int:
    """(a worker, `python -c WORKER_MAIN <fd>`) the rank's PYTHONPATH as it was, then cells until the node ends."""
    given = json.loads(os.environ.pop(WORKER_PYTHONPATH, "null"))
    if given is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = given
    return Worker(fd).run()


HANDLERS: dict[str, Callable[[list[str]], int]] = {
    contract.WARM_NODE_COMMAND: lambda a: cmd_node(int(a[a.index("--nproc") + 1]) if "--nproc" in a else 1),
    contract.WARM_BRIDGE_COMMAND: lambda a: cmd_bridge(),
}
