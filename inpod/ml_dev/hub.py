"""Warm ranks' hub (`ml-dev _ranks-hub`): detached on the launching pod, it holds the warm ranks and serves their cells.

It is an `ml-dev run` of the node program (warm.py) on every pod (launch.py cmd_run: the same rank agents, gate, tree
check, Secret check, run log, heartbeats and stops; SIGTERM, which `ml-dev ranks stop` sends, is that run's stop),
plus one bridge per pod (the fabric's SSH to `ml-dev _warm-bridge`, which reaches that pod's node socket) and the
cells' server: one Unix socket in the abstract namespace of its pod, for its own UID only (SO_PEERCRED). One cell at a
time goes to every targeted rank at once; an exception on one rank interrupts the others' cell; a client's interrupt
(Ctrl-C of `ranks exec`, the notebook's stop button) or a client gone interrupts it on every rank.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import threading
import time
from typing import Any, Callable

from .. import contract
from .common import HERE, PY, Cluster
from .launch import cmd_run
from .warm import Message, hub_address, listen_unix, messages, peer_uid, send, write_state


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
        self.route({"op": "bridge-lost", "pod": self.pod, "pid": self.proc.pid})

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


def ends_the_rank(msg: Message) -> bool:
    """A cell that ended in SystemExit: its rank is leaving on purpose (a stop's save handler calls sys.exit), never an
    exception to interrupt the others with: their own save handlers may be running, and a KeyboardInterrupt raised
    inside one leaves its checkpoint half written."""
    return str(msg.get("error") or "").startswith("SystemExit")


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
            self.save(state="warm", ready=time.time(), world=len(self.rank_pod))
            print(f"ml-dev: {len(self.rank_pod)} warm ranks ready on {len(self.bridges)} pods", flush=True)
            self.ready.set()

    def route(self, msg: Message) -> None:
        cell = self.cell
        op = msg.get("op")
        if op == "bridge-lost" and msg.get("pid") not in (None, self.bridges[int(msg["pod"])].proc.pid):
            return  # a bridge replaced already (reconnected)
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
            if not msg.get("ok") and not msg.get("interrupted") and not cell.interrupted and not ends_the_rank(msg):
                self.interrupt(cell)  # an exception on one rank: every other rank's cell is interrupted
            if set(cell.done) >= set(cell.targets):
                cell.finished.set()

    def reconnect(self, pod: int) -> None:
        """A new bridge to a pod whose bridge ended (its SSH session broke) while its node still serves."""
        bridge = Bridge(self.cluster, pod, self.route)
        if bridge.read_hello():
            self.bridges[pod] = bridge
        else:
            bridge.close()
            bridge.proc.wait()

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
        ended: tuple[Cell, Message] | None = None
        try:
            ended = self.run_cell(conn, req, reader)
        finally:
            self.busy.release()  # before the client reads `end`: its next cell (a notebook's, at once) is not refused
        if ended is not None:
            cell, end = ended
            with cell.out_lock:
                send(conn, threading.Lock(), end)
        conn.close()

    def run_cell(self, conn: socket.socket, req: Message, reader: Any) -> tuple[Cell, Message] | None:
        world = sorted(self.rank_pod)
        targets = world if req.get("ranks") is None else sorted({int(r) for r in req["ranks"]})
        bad = [r for r in targets if r not in self.rank_pod]
        if bad or not targets:
            why = f"--ranks {','.join(map(str, bad))}: the warm ranks are {world[0]}-{world[-1]}" if bad else "--ranks: no rank"
            send(conn, threading.Lock(), {"op": "refused", "why": why})
            return None
        cell = Cell(self.next_id, targets, conn)
        self.next_id += 1
        self.cell = cell
        self.save(last_cell={"id": cell.cid, "state": "running", "ranks": targets, "started": cell.started})
        send(conn, threading.Lock(), {"op": "started", "id": cell.cid, "ranks": targets})
        for pod in sorted({self.rank_pod[r] for r in targets}):
            if self.bridges[pod].proc.poll() is not None:
                self.reconnect(pod)
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
        return cell, {"op": "end", "id": cell.cid, "state": state, "seconds": seconds}


def cmd_hub(args: argparse.Namespace) -> int:
    """(detached, on the launching pod) `ml-dev run` of the node program on every pod, and the cells' server."""

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
        listener = listen_unix(hub_address())
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
        allow_drift=args.allow_drift,
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
