"""ml-dev ranks: warm ranks, one long-lived Python per GPU on every pod, and cells run in every rank's own namespace.

    ml-dev ranks start [--nproc-per-node N]   sync, check and start them as `ml-dev run` starts ranks; returns once warm
    ml-dev ranks exec -c 'CODE' | -f FILE     run a cell on every rank (--ranks 0,3: those); output labelled per rank
    ml-dev ranks status                       the warm ranks and the last cell
    ml-dev ranks stop                         the checkpoint signal and the grace, as every stop

The hub (hub.py, `ml-dev _ranks-hub`, detached on the launching pod, its log and state in the environment's records)
is an `ml-dev run` of the node program (warm.py) on every pod and the cells' server; this module holds the commands, the
state record and the client that `ranks exec` and the notebook's `%%ranks` (notebook.py) share.

From another pod of the environment the client reaches the hub's socket through the fabric's SSH, as the hub reaches
every node (`ml-dev _ranks-relay` on the hub's pod splices the session to the hub's socket; nothing new listens on the
network). The SSH client runs in a session of its own, so a terminal's Ctrl-C (or the kernel's SIGINT, sent to the
kernel's process group: jupyter_client provisioning/local_provisioner.py LocalProvisioner.send_signal) reaches only
the client, which sends the interrupt over it; a client gone closes its end, the SSH session ends, the relay shuts the
hub's socket and the hub interrupts the cell as for a local client.

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable

from .. import contract
from ..lib.pod import pid_alive
from .common import HERE, PY, STATE_DIR, Cluster, die, stop_grace
from .hub import cmd_hub
from .warm import HANDLERS, Message, hub_address, read_state, send, splice, warm_dir

HUB_COMMAND = "_ranks-hub"
RELAY_COMMAND = "_ranks-relay"


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


def cmd_ranks_start(args: argparse.Namespace) -> int:
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
    argv += ["--no-sync"] * args.no_sync + ["--allow-drift"] * args.allow_drift + [f"--env={e}" for e in args.env]
    with open(log, "wb") as out:
        hub = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    offset = 0
    try:
        while True:
            offset = follow(log, offset, sys.stderr)
            state = read_state()
            if state.get("hub_pid") == hub.pid and state.get("state") == "warm":
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


def cmd_ranks_stop(args: argparse.Namespace) -> int:
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


def cmd_ranks_status(args: argparse.Namespace) -> int:
    state = read_state()
    if not state:
        print("ml-dev: no warm ranks were started from this pod")
        return 0
    alive = hub_alive(state)
    print(f"warm ranks: {state.get('state') if alive else 'not running'} (hub pid {state.get('hub_pid')} on {state.get('pod')})")
    print(f"  {state.get('world', '?')} ranks on {state.get('pods')} pods, {state.get('nproc_per_node')} per pod, in {state.get('cwd')}")
    last = state.get("last_cell")
    if last:
        print(f"  last cell {last.get('id')}: {last.get('state')} on ranks {comma_ranks(last.get('ranks', []))}")
    return 0 if alive else 3


def comma_ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


class Printer:
    """Each rank's output as whole lines, labelled `[rank] `, in order per rank."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.partial: dict[tuple, str] = {}
        self.failed: list[int] = []  # the ranks whose cell raised (not interrupted)

    def show(self, msg: Message) -> None:
        """A hub message of the running cell: a rank's output, or its end (its error shown, the rank noted)."""
        op = msg.get("op")
        if op == "out":
            self.out(int(msg["rank"]), str(msg.get("stream")), str(msg.get("text", "")))
        elif op == "done":
            rank = int(msg["rank"])
            self.flush(rank)
            if not msg.get("ok") and not msg.get("interrupted"):
                self.failed.append(rank)
                self.emit(rank, "stderr", str(msg.get("error") or "failed").rstrip("\n").split("\n"))

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


class HubLink:
    """The client's socket to the hub: its own pod's, else a socketpair spliced to the hub's pod over the fabric's SSH
    (`ml-dev _ranks-relay` there). `lost` words the end of either."""

    def __init__(self) -> None:
        self.ssh: subprocess.Popen | None = None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lost = "the hub ended (ml-dev ranks status)"
        try:
            self.sock.connect(hub_address())
            return
        except OSError:
            self.sock.close()
        here = warm_here()  # this pod's warm ranks name the pod that started them
        if not here:
            die("no warm ranks run in this environment: ml-dev ranks start")
        self.relay(str(here[0].get("launcher") or ""))

    def relay(self, pod: str) -> None:
        saved = dict(os.environ)
        try:
            cluster = Cluster()  # sets the SSH session's variables: for the ssh child only, not this process (a kernel)
            env = dict(os.environ)
        finally:
            for key in set(os.environ) - set(saved):
                del os.environ[key]
            os.environ.update(saved)
        if pod not in cluster.pods or cluster.pods.index(pod) == cluster.me:
            die(f"the warm ranks' hub (started from {pod or '?'}) is not running (ml-dev ranks status there)")
        self.sock, theirs = socket.socketpair()
        remote = cluster.ssh(cluster.pods.index(pod), [PY, str(HERE / "ml-dev"), RELAY_COMMAND])
        # a session of its own: a Ctrl-C of the terminal (the kernel's SIGINT to its group) must not end the session
        self.ssh = subprocess.Popen(remote, stdin=theirs.fileno(), stdout=theirs.fileno(), env=env, start_new_session=True)
        theirs.close()
        self.lost = f"the connection to the warm ranks' hub on {pod} ended (ml-dev ranks status there)"

    def close(self) -> None:
        self.sock.close()  # the SSH session's stdin ends: the relay shuts the hub's socket
        if self.ssh is not None:
            try:
                self.ssh.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.ssh.kill()
                self.ssh.wait()


def cmd_hub_relay() -> int:
    """(on the hub's pod, a client's SSH session from another pod) stdin -> the hub's socket -> stdout."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(hub_address())
    except OSError:
        why = f"the warm ranks' hub on {socket.gethostname()} is not running (ml-dev ranks status there)"
        os.write(1, (json.dumps({"op": "refused", "why": why}) + "\n").encode())
        return 1
    return splice(sock)


def run_cell(code: str, ranks: list[int] | None, on: Callable[[Message], None]) -> Message:
    """Send a cell to the hub and hand each message to `on`; SIGINT (KeyboardInterrupt here) interrupts it on every rank
    and waits for the ranks to say so. Returns the `end` message ({"state": "ok" | "error" | "interrupted"} ...)."""
    link = HubLink()
    try:
        return cell_exchange(link, code, ranks, on)
    finally:
        link.close()


def cell_exchange(link: HubLink, code: str, ranks: list[int] | None, on: Callable[[Message], None]) -> Message:
    sock = link.sock
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
            if interrupts > 2:  # closed by run_cell: the hub interrupts the cell of a client that went away
                return {"op": "end", "state": "interrupted", "detached": True}
            continue
        if msg is None:
            return {"op": "end", "state": "lost", "why": link.lost}
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


def chosen_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return sorted({int(w) for w in text.split(",") if w.strip()})
    except ValueError:
        die(f"--ranks {text!r}: expected rank numbers separated by commas, e.g. 0,3", 2)
    return None


def cmd_ranks_exec(args: argparse.Namespace) -> int:
    code = exec_text(args)
    ranks = chosen_ranks(args.ranks)
    printer = Printer(2)

    # SIGINT as KeyboardInterrupt in run_cell's wait (the default handler), whatever the shell set
    signal.signal(signal.SIGINT, signal.default_int_handler)
    end = run_cell(code, ranks, printer.show)
    state = end.get("state")
    if state == "refused" or state == "lost":
        die(str(end.get("why")))
    if state == "error":
        print(
            f"ml-dev: the cell raised on rank {comma_ranks(sorted(printer.failed))}; every other rank's cell was interrupted",
            file=sys.stderr,
        )
        return 1
    if state == "interrupted":
        print("ml-dev: interrupted on every rank; the ranks stay warm", file=sys.stderr)
        return 130
    return 0


def start_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=0, help="ranks per pod (default: the pod's GPUs, GPUS_PER_NODE)")
    p.add_argument("--no-sync", action="store_true", help="do not sync the working tree first")
    p.add_argument("--allow-drift", action="store_true", help="start the ranks even when their environments differ (as ml-dev run)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="set K=V on every rank (repeatable)")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for every pod to be reachable (60)")


COMMANDS = (*HANDLERS, HUB_COMMAND, RELAY_COMMAND, "ranks")
"""What main.py hands this module: `ranks` and the internal programs of warm ranks."""


def main(argv: list[str]) -> int:
    if argv[0] in HANDLERS:
        return HANDLERS[argv[0]](argv[1:])
    if argv[0] == RELAY_COMMAND:
        return cmd_hub_relay()
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
    return {"start": cmd_ranks_start, "exec": cmd_ranks_exec, "stop": cmd_ranks_stop, "status": cmd_ranks_status}[args.cmd](args)
