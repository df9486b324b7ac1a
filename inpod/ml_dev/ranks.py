"""ml-dev ranks: warm ranks, one long-lived Python per GPU on every pod, and cells run in every rank's own namespace.

    ml-dev ranks start [--nproc-per-node N]   sync, check and start them as `ml-dev run` starts ranks; returns once warm
    ml-dev ranks exec -c 'CODE' | -f FILE     run a cell on every rank (--ranks 0,3: those); output labelled per rank
    ml-dev ranks status                       the warm ranks and the last cell
    ml-dev ranks stop                         the checkpoint signal and the grace, as every stop

The hub (`ml-dev _ranks-hub`, a process of its own on the launching pod, its log in the environment's records) is an
`ml-dev run` of the node program (warm.py) on every pod: the same rank agents, gate, tree check, Secret check, run
log, heartbeats and stops. It holds one bridge per pod (the fabric's SSH to `ml-dev _warm-bridge`, which reaches that
pod's node socket) and serves the cells on one Unix socket in the abstract namespace of its pod, to its own UID only
(SO_PEERCRED): no port, nothing that listens on the pod network. A cell goes to every targeted rank at once; an
exception on one rank interrupts the others' cell; Ctrl-C (SIGINT of `ranks exec`, the notebook's stop button) sends
an interrupt and the ranks stay warm.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

from .. import contract
from ..lib.pod import env_records_dir, pid_alive
from .common import HERE, PY, STATE_DIR, Cluster, die, stop_grace
from .warm import HANDLERS, Message, listen, messages, peer_uid, send

HUB_COMMAND = "_ranks-hub"


def warm_dir() -> Path:
    """The warm ranks' records: `<records_dir>/warm/` (state.json, hub.log) on the launching pod's workspace."""
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


def hub_alive(state: Message) -> bool:
    pid = state.get("hub_pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    try:
        return HUB_COMMAND.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def warm_here() -> list[Message]:
    """The rank agents of warm ranks on this pod (their heartbeats: the node command, alive)."""
    out = []
    for beat in sorted((STATE_DIR / contract.HEARTBEAT_DIR).glob("rank-*.json")):
        try:
            info = json.loads(beat.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and contract.WARM_NODE_COMMAND in info.get("command", []) and pid_alive(int(info.get("pid", 0))):
            out.append(info)
    return out


def refuse_run() -> None:
    """`ml-dev run` on GPUs that warm ranks hold: refused, naming them and how to stop them."""
    found = warm_here()
    if found:
        where = found[0].get("launcher") or "?"
        die(
            f"warm ranks hold this environment's GPUs (started from {where}, rank agent pid {found[0].get('pid')}): "
            f"stop them first with `ml-dev ranks stop` on {where}, or run your code in them: ml-dev ranks exec -f FILE"
        )


# ------------------------------------------------------------------------------------------- the hub


class Bridge:
    """The hub's channel to one pod's node: `ml-dev _warm-bridge` there (over SSH; here: a local process)."""

    def __init__(self, cluster: Cluster, pod: int, route: Callable[[Message], None]) -> None:
        remote = [PY, str(HERE / "ml-dev"), contract.WARM_BRIDGE_COMMAND]
        argv = remote if pod == cluster.me else cluster.ssh(pod, remote)
        self.pod = pod
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.lock = threading.Lock()
        self.hello: Message = {}
        self.route = route

    def read_hello(self) -> bool:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        try:
            self.hello = json.loads(line) if line else {}
        except ValueError:
            self.hello = {}
        if self.hello.get("op") != "hello":
            return False
        threading.Thread(target=self.read, daemon=True).start()
        return True

    def read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict):
                self.route(msg)
        self.route({"op": "bridge-lost", "pod": self.pod})

    def send(self, msg: Message) -> bool:
        with self.lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write((json.dumps(msg) + "\n").encode())
                self.proc.stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass


class Cell:
    def __init__(self, cid: int, targets: list[int], conn: socket.socket) -> None:
        self.cid, self.targets, self.conn = cid, targets, conn
        self.done: dict[int, Message] = {}
        self.finished = threading.Event()
        self.interrupted = False
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.started = time.time()


class Hub:
    def __init__(self, cluster: Cluster, nproc: int, state: Message) -> None:
        self.cluster, self.nproc, self.state = cluster, nproc, state
        self.bridges: dict[int, Bridge] = {}
        self.rank_pod: dict[int, int] = {}
        self.busy = threading.Lock()
        self.cell: Cell | None = None
        self.next_id = 1
        self.ready = threading.Event()

    def save(self, **fields: Any) -> None:
        self.state.update(fields)
        write_state(self.state)

    def connect(self, deadline: float) -> None:
        """A bridge to every pod, once its node serves (the agents start the nodes after the gate: tried until then)."""
        pods = list(range(len(self.cluster.hosts)))
        while pods and time.monotonic() < deadline:
            for pod in list(pods):
                bridge = Bridge(self.cluster, pod, self.route)
                if bridge.read_hello():
                    self.bridges[pod] = bridge
                    for rank in bridge.hello.get("ranks", []):
                        self.rank_pod[int(rank)] = pod
                    pods.remove(pod)
                else:
                    bridge.close()
                    bridge.proc.wait()
            if pods:
                time.sleep(1)
        if not pods:
            self.save(state="ready", ready=time.time(), world=len(self.rank_pod))
            print(f"ml-dev: {len(self.rank_pod)} warm ranks ready on {len(self.bridges)} pods", flush=True)
            self.ready.set()

    def route(self, msg: Message) -> None:
        cell = self.cell
        op = msg.get("op")
        if op in ("bridge-lost", "gone"):
            lost = [r for r, p in self.rank_pod.items() if p == msg.get("pod")] if op == "bridge-lost" else [int(msg.get("rank", -1))]
            if cell is not None:
                why = "its pod's bridge ended" if op == "bridge-lost" else f"the rank exited with status {msg.get('status')}"
                for rank in lost:
                    if rank in cell.targets and rank not in cell.done:
                        self.finish(cell, {"op": "done", "rank": rank, "id": cell.cid, "ok": False, "interrupted": False, "error": why})
            return
        if cell is None or msg.get("id") != cell.cid:
            return  # a cell that ended already (its late output)
        with cell.out_lock:
            send(cell.conn, threading.Lock(), msg)
        if op == "done":
            self.finish(cell, msg)

    def finish(self, cell: Cell, msg: Message) -> None:
        with cell.lock:
            cell.done[int(msg["rank"])] = msg
            if not msg.get("ok") and not msg.get("interrupted") and not cell.interrupted:
                self.interrupt(cell)  # an exception on one rank: every other rank's cell is interrupted
            if set(cell.done) >= set(cell.targets):
                cell.finished.set()

    def interrupt(self, cell: Cell) -> None:
        cell.interrupted = True
        for pod in sorted({self.rank_pod[r] for r in cell.targets}):
            self.bridges[pod].send({"op": "interrupt", "id": cell.cid})

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            if peer_uid(conn) != os.getuid():
                conn.close()
                continue
            threading.Thread(target=self.client, args=(conn,), daemon=True).start()

    def client(self, conn: socket.socket) -> None:
        reader = messages(conn)
        req = next(reader, None)
        if req is None:
            conn.close()
            return
        if req.get("op") == "status":
            send(conn, threading.Lock(), {"op": "status", **self.state})
            conn.close()
            return
        if not self.ready.is_set():
            send(conn, threading.Lock(), {"op": "refused", "why": "the warm ranks are not ready yet (ml-dev ranks status)"})
            conn.close()
            return
        if not self.busy.acquire(blocking=False):
            running = self.cell.cid if self.cell else "?"
            send(conn, threading.Lock(), {"op": "refused", "why": f"cell {running} still runs on the warm ranks: interrupt it first"})
            conn.close()
            return
        try:
            self.run_cell(conn, req, reader)
        finally:
            self.busy.release()
            conn.close()

    def run_cell(self, conn: socket.socket, req: Message, reader: Any) -> None:
        world = sorted(self.rank_pod)
        targets = world if req.get("ranks") is None else sorted({int(r) for r in req["ranks"]})
        bad = [r for r in targets if r not in self.rank_pod]
        if bad or not targets:
            why = f"--ranks {','.join(map(str, bad))}: the warm ranks are {world[0]}-{world[-1]}" if bad else "--ranks: no rank"
            send(conn, threading.Lock(), {"op": "refused", "why": why})
            return
        cell = Cell(self.next_id, targets, conn)
        self.next_id += 1
        self.cell = cell
        self.save(last_cell={"id": cell.cid, "state": "running", "ranks": targets, "started": cell.started})
        send(conn, threading.Lock(), {"op": "started", "id": cell.cid, "ranks": targets})
        for pod in sorted({self.rank_pod[r] for r in targets}):
            if not self.bridges[pod].send({"op": "cell", "id": cell.cid, "code": req.get("code", ""), "ranks": targets}):
                self.route({"op": "bridge-lost", "pod": pod})

        def listen_client() -> None:
            for msg in reader:  # Ctrl-C of `ranks exec`, the notebook's stop button
                if msg.get("op") == "interrupt" and not cell.finished.is_set():
                    with cell.lock:
                        self.interrupt(cell)
            if not cell.finished.is_set():  # the client went away (terminal closed, kernel restarted): interrupted
                with cell.lock:
                    if not cell.interrupted:
                        self.interrupt(cell)

        threading.Thread(target=listen_client, daemon=True).start()
        cell.finished.wait()
        self.cell = None
        outcomes = [m for m in cell.done.values()]
        state = "error" if any(not m.get("ok") and not m.get("interrupted") for m in outcomes) else "ok"
        state = "interrupted" if state == "ok" and any(m.get("interrupted") for m in outcomes) else state
        seconds = round(time.time() - cell.started, 3)
        self.save(last_cell={"id": cell.cid, "state": state, "ranks": targets, "started": cell.started, "seconds": seconds})
        with cell.out_lock:
            send(conn, threading.Lock(), {"op": "end", "id": cell.cid, "state": state, "seconds": seconds})


def cmd_hub(args: argparse.Namespace) -> int:
    """(detached, on the launching pod) `ml-dev run` of the node program on every pod, and the cells' server."""
    from .launch import cmd_run

    cluster = Cluster()
    state: Message = {
        "state": "starting",
        "hub_pid": os.getpid(),
        "pod": cluster.pods[cluster.me] if 0 <= cluster.me < len(cluster.pods) else "",
        "pods": len(cluster.hosts),
        "nproc_per_node": args.nproc_per_node,
        "cwd": os.getcwd(),
        "started": time.time(),
        "last_cell": None,
    }
    hub = Hub(cluster, args.nproc_per_node, state)
    hub.save()
    try:
        listener = listen(hub_address())
    except OSError as exc:
        hub.save(state="failed", why=f"the hub's socket: {exc}")
        return 1
    threading.Thread(target=hub.serve, args=(listener,), daemon=True).start()
    threading.Thread(target=hub.connect, args=(time.monotonic() + args.timeout + 600,), daemon=True).start()
    # a warm rank is quiet between cells: no stall verdict (lifecycle.stallVerdictSeconds) for that
    os.environ[contract.STALL_SECONDS_ENV] = "0"
    node = [PY, str(HERE / "ml-dev"), contract.WARM_NODE_COMMAND, "--nproc", str(args.nproc_per_node)]
    run = argparse.Namespace(
        command=node,
        no_sync=args.no_sync,
        debug=None,
        no_wait=False,
        debug_host="localhost",
        per_pod=False,
        env=args.env,
        timeout=args.timeout,
    )
    code: Any = 1
    try:
        code = cmd_run(run)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        hub.save(state="stopped" if hub.ready.is_set() else "failed", ended=time.time(), status=code)
        for bridge in hub.bridges.values():
            bridge.close()
    return int(code or 0)


# ------------------------------------------------------------------------------------------- the commands


def default_nproc() -> int:
    text = Cluster().rank_env.get("GPUS_PER_NODE", "")
    return int(text) if text.isdigit() and int(text) > 0 else 1


def follow(log: Path, offset: int, out: IO[str]) -> int:
    """What the hub's log gained since `offset`, to `out`; the new offset."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    if data:
        out.write(data.decode(errors="replace"))
        out.flush()
    return offset + len(data)


def cmd_start(args: argparse.Namespace) -> int:
    Cluster()  # an ml-dev-env pod, its rank.env
    state = read_state()
    if hub_alive(state):
        die(f"warm ranks already run (hub pid {state.get('hub_pid')}, {state.get('state')}): ml-dev ranks stop first")
    if warm_here():
        refuse_run()  # warm ranks started from another pod hold these GPUs
    for beat in (STATE_DIR / contract.HEARTBEAT_DIR).glob("run-*.json"):
        try:
            info = json.loads(beat.read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(int(info.get("pid", 0))):
            die(f"`ml-dev run` (pid {info.get('pid')}: {' '.join(info.get('command', []))}) holds the GPUs: stop it first")
    nproc = args.nproc_per_node or default_nproc()
    log = warm_dir() / contract.WARM_HUB_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [PY, str(HERE / "ml-dev"), HUB_COMMAND, "--nproc-per-node", str(nproc), "--timeout", str(args.timeout)]
    argv += ["--no-sync"] * args.no_sync + [f"--env={e}" for e in args.env]
    with open(log, "wb") as out:
        hub = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    offset = 0
    try:
        while True:
            offset = follow(log, offset, sys.stderr)
            state = read_state()
            if state.get("hub_pid") == hub.pid and state.get("state") == "ready":
                print(
                    f"ml-dev: {state.get('world')} warm ranks on {state.get('pods')} pods ({nproc} per pod), hub pid {hub.pid}: "
                    "ml-dev ranks exec -c 'CODE' | -f FILE; ml-dev ranks stop"
                )
                return 0
            if hub.poll() is not None:
                follow(log, offset, sys.stderr)
                print(f"ml-dev: the warm ranks did not start (hub exited {hub.returncode}; its log: {log})", file=sys.stderr)
                return 1
            time.sleep(0.2)
    except KeyboardInterrupt:
        os.kill(hub.pid, signal.SIGTERM)  # a stop like any other: the checkpoint signal and the grace
        hub.wait()
        return 130


def cmd_stop(args: argparse.Namespace) -> int:
    state = read_state()
    if not hub_alive(state):
        if warm_here():
            refuse_run()
        print("ml-dev: no warm ranks run from this pod")
        return 0
    pid = int(state["hub_pid"])
    log = warm_dir() / contract.WARM_HUB_LOG
    offset = log.stat().st_size if log.exists() else 0
    os.kill(pid, signal.SIGTERM)  # `ml-dev run`'s stop: every rank gets the checkpoint signal and the grace
    deadline = time.monotonic() + stop_grace() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        offset = follow(log, offset, sys.stderr)
        time.sleep(0.2)
    follow(log, offset, sys.stderr)
    if pid_alive(pid):
        print(f"ml-dev: the hub (pid {pid}) still runs after the grace; its log: {log}", file=sys.stderr)
        return 1
    print("ml-dev: warm ranks stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = read_state()
    if not state:
        print("ml-dev: no warm ranks were started from this pod")
        return 0
    alive = hub_alive(state)
    print(f"warm ranks: {state.get('state') if alive else 'not running'} (hub pid {state.get('hub_pid')} on {state.get('pod')})")
    print(f"  {state.get('world', '?')} ranks on {state.get('pods')} pods, {state.get('nproc_per_node')} per pod, in {state.get('cwd')}")
    last = state.get("last_cell")
    if last:
        print(f"  last cell {last.get('id')}: {last.get('state')} on ranks {ranks_text(last.get('ranks', []))}")
    return 0 if alive else 3


def ranks_text(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


class Printer:
    """Each rank's output as whole lines, labelled `[rank] `, in order per rank."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.partial: dict[tuple, str] = {}

    def out(self, rank: int, stream: str, text: str) -> None:
        key = (rank, stream)
        text = self.partial.pop(key, "") + text
        *lines, rest = text.split("\n")
        if rest:
            self.partial[key] = rest
        self.emit(rank, stream, lines)

    def emit(self, rank: int, stream: str, lines: list[str]) -> None:
        target = sys.stderr if stream == "stderr" else sys.stdout
        for line in lines:
            target.write(f"[{rank:>{self.width}}] {line}\n")
        target.flush()

    def flush(self, rank: int) -> None:
        for stream in ("stdout", "stderr"):
            rest = self.partial.pop((rank, stream), None)
            if rest:
                self.emit(rank, stream, [rest])


class Lines:
    """JSON lines from a socket; a KeyboardInterrupt in the wait loses nothing (a generator would end there)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffered, self.ready = sock, b"", []  # type: tuple[socket.socket, bytes, list[Message]]

    def next(self) -> Message | None:
        while not self.ready:
            if b"\n" in self.buffered:
                line, self.buffered = self.buffered.split(b"\n", 1)
                try:
                    got = json.loads(line)
                except ValueError:
                    continue
                if isinstance(got, dict):
                    self.ready.append(got)
                continue
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                return None
            self.buffered += chunk
        return self.ready.pop(0)


def run_cell(code: str, ranks: list[int] | None, on: Callable[[Message], None]) -> Message:
    """Send a cell to the hub and hand each message to `on`; SIGINT (KeyboardInterrupt here) interrupts it on every rank
    and waits for the ranks to say so. Returns the `end` message ({"state": "ok" | "error" | "interrupted"} ...)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(hub_address())
    except OSError:
        here = warm_here()
        if here:
            die(f"the warm ranks were started from {here[0].get('launcher')}: ml-dev ranks exec there")
        die("no warm ranks run from this pod: ml-dev ranks start")
    lock = threading.Lock()
    send(sock, lock, {"op": "cell", "code": code, "ranks": ranks})
    reader = Lines(sock)
    interrupts = 0
    while True:
        try:
            msg = reader.next()
        except KeyboardInterrupt:
            interrupts += 1
            send(sock, lock, {"op": "interrupt"})
            if interrupts > 2:
                sock.close()  # the hub interrupts the cell of a client that went away
                return {"op": "end", "state": "interrupted", "detached": True}
            continue
        if msg is None:
            return {"op": "end", "state": "lost", "why": "the hub ended (ml-dev ranks status)"}
        if msg.get("op") == "refused":
            return {"op": "end", "state": "refused", "why": msg.get("why")}
        on(msg)
        if msg.get("op") == "end":
            return msg


def exec_text(args: argparse.Namespace) -> str:
    if args.file:
        try:
            return Path(args.file).read_text()
        except OSError as exc:
            die(f"-f {args.file}: {exc.strerror}")
    return str(args.code)


def parse_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return sorted({int(w) for w in text.split(",") if w.strip()})
    except ValueError:
        die(f"--ranks {text!r}: expected rank numbers separated by commas, e.g. 0,3", 2)
    return None


def cmd_exec(args: argparse.Namespace) -> int:
    code = exec_text(args)
    ranks = parse_ranks(args.ranks)
    printer = Printer(2)
    failed: list[int] = []

    def on(msg: Message) -> None:
        op = msg.get("op")
        if op == "out":
            printer.out(int(msg["rank"]), str(msg.get("stream")), str(msg.get("text", "")))
        elif op == "done":
            rank = int(msg["rank"])
            printer.flush(rank)
            if not msg.get("ok") and not msg.get("interrupted"):
                failed.append(rank)
                printer.emit(rank, "stderr", str(msg.get("error") or "failed").rstrip("\n").split("\n"))

    # SIGINT as KeyboardInterrupt in run_cell's wait (the default handler), whatever the shell set
    signal.signal(signal.SIGINT, signal.default_int_handler)
    end = run_cell(code, ranks, on)
    state = end.get("state")
    if state == "refused" or state == "lost":
        die(str(end.get("why")))
    if state == "error":
        print(f"ml-dev: the cell raised on rank {ranks_text(sorted(failed))}; every other rank's cell was interrupted", file=sys.stderr)
        return 1
    if state == "interrupted":
        print("ml-dev: interrupted on every rank; the ranks stay warm", file=sys.stderr)
        return 130
    return 0


def start_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=0, help="ranks per pod (default: the pod's GPUs, GPUS_PER_NODE)")
    p.add_argument("--no-sync", action="store_true", help="do not sync the working tree first")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="set K=V on every rank (repeatable)")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for every pod to be reachable (60)")


COMMANDS = (*HANDLERS, HUB_COMMAND, "ranks")
"""What main.py hands this module: `ranks` and the internal programs of warm ranks."""


def main(argv: list[str]) -> int:
    if argv[0] in HANDLERS:
        return HANDLERS[argv[0]](argv[1:])
    if argv[0] == HUB_COMMAND:
        hub = argparse.ArgumentParser(prog=f"ml-dev {HUB_COMMAND}")
        start_options(hub)
        return cmd_hub(hub.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(prog="ml-dev ranks", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    start_options(sub.add_parser("start", help="start one warm rank per GPU on every pod (the tree synced and checked)"))
    run = sub.add_parser("exec", help="run a cell on every warm rank, in its own namespace")
    what = run.add_mutually_exclusive_group(required=True)
    what.add_argument("-c", dest="code", help="the cell's code")
    what.add_argument("-f", dest="file", help="a file whose code is the cell")
    run.add_argument("--ranks", help="only these ranks, e.g. 0,3")
    sub.add_parser("stop", help="stop the warm ranks: the checkpoint signal and the grace")
    sub.add_parser("status", help="the warm ranks and the last cell")
    args = parser.parse_args(argv[1:])
    return {"start": cmd_start, "exec": cmd_exec, "stop": cmd_stop, "status": cmd_status}[args.cmd](args)
