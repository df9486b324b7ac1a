"""The stop trials' job and launchers (tests/inpod/idle/test_stops.py, test_stop_matrix.py): programs run inside the pods.

* JOB: the docs' training loop ("Checkpoint before a stop", docs/use/suspend-and-idle.md), standard library only.
  Each step runs a real collective: an all-reduce MAX of the local stop flag over TCP (rank 0 serves it on
  MASTER_ADDR:MASTER_PORT, the address torch's TCPStore would use; torch is not installed here). Every rank
  leaves the loop at the step where any rank's flag was set, so all save the same step. The collective fails, as
  gloo does when a peer's connection closes, instead of blocking for ever: a rank then saves the last step every
  rank completed. Each rank writes `ckpt/rank<R>.json`: `running` at its start, then its exit path (`saved`,
  `saved-after-peer-lost`, `failed`) with the step and the time; a rank killed keeps `running`.
  argv: save seconds [failing rank, failing step]; JOB_PRINT_STEPS=1: a line per step on stdout.
* TRAIN_SH: a wrapper script as users write them (`cd`, then python as a child, no exec).
* TORCHRUN: a stand-in for `torchrun` where torch is not installed, doing what upstream does at a stop (pytorch
  torch/distributed/run.py, torch/distributed/elastic): options default to `PET_<FLAG>` (run.py's `env` action);
  each worker runs in a session of its own (subprocess_handler.py SubprocessHandler, start_new_session=True) with
  RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; the signals in
  TORCHELASTIC_SIGNALS_TO_HANDLE (default SIGTERM, SIGINT, SIGHUP, SIGQUIT) raise SignalException
  (api.py _terminate_process_handler), whose handler (agent/server/api.py SimpleElasticAgent.run ->
  LocalElasticAgent._shutdown -> PContext.close(death_sig, timeout=30)) sends that signal to each worker, waits
  up to 30 s and SIGKILLs the rest, then exits 1; a failed worker (max_restarts 0) gets the others the default
  death signal (SIGTERM) and the same 30 s, exit 1. Its rendezvous (a TCPStore on MASTER_PORT) is left out: the
  job's collective is the only network traffic, so MASTER_PORT stays the job's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.podsim.pods import PodSim

PROJECT = "/workspace/job"  # where the trials put the job, on the workspace volume
JOB_PROCESSES = "job[.]py|train[.]sh|torchrun|ml-dev _rank"  # pgrep -f: what of the job may run on a pod

JOB = r"""
import json, os, signal, socket, sys, threading, time
SAVE = float(sys.argv[1])
FAIL_RANK = int(sys.argv[2]) if len(sys.argv) > 2 else -1
FAIL_STEP = int(sys.argv[3]) if len(sys.argv) > 3 else 0
PRINT_STEPS = os.environ.get("JOB_PRINT_STEPS") == "1"  # a line per step, as jobs print their loss
stop = False
def on_signal(signum, frame):
    global stop
    stop = True
signal.signal(getattr(signal, os.environ.get("ML_DEV_CHECKPOINT_SIGNAL", "SIGTERM")), on_signal)
rank = int(os.environ.get("RANK", os.environ["NODE_RANK"]))
world = int(os.environ["WORLD_SIZE"])
os.makedirs("ckpt", exist_ok=True)

def record(**fields):
    tmp = "ckpt/rank%d.json.tmp" % rank
    with open(tmp, "w") as f:
        json.dump(dict(rank=rank, pid=os.getpid(), host=socket.gethostname(), at=time.time(), **fields), f)
    os.replace(tmp, "ckpt/rank%d.json" % rank)

class PeerLost(Exception):
    pass

def serve(listener):
    # rank 0: gather one value per rank per step, answer the MAX to all; a closed connection fails the step
    conns = []
    listener.settimeout(120)
    while len(conns) < world:
        conns.append(listener.accept()[0].makefile("rwb"))
    while True:
        values = [c.readline() for c in conns]
        if not all(values):
            for c in conns:
                try:
                    c.write(b"lost\n")
                    c.flush()
                except OSError:
                    pass
            return
        top = max(int(v) for v in values)
        for c in conns:
            c.write(b"%d\n" % top)
            c.flush()
        if top:
            return

if rank == 0:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", int(os.environ["MASTER_PORT"])))
    listener.listen(world)
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
deadline = time.time() + 120
while True:
    try:
        conn = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=5)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.2)
conn.settimeout(None)
channel = conn.makefile("rwb")

def all_reduce_max(flag):
    channel.write(b"%d\n" % flag)
    channel.flush()
    got = channel.readline().strip()
    if not got.isdigit():
        raise PeerLost(got.decode() or "connection closed")
    return int(got)

def save(step):
    path = "ckpt/step%d-rank%d.txt" % (step, rank)
    with open(path + ".tmp", "w") as f:
        f.write("step=%d\n" % step)
        for _ in range(10):
            f.write("x" * 1000 + "\n")
            f.flush()
            time.sleep(SAVE / 10)
        f.write("END\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return path

record(exit="running")
open("ckpt/rank%d.started" % rank, "w").close()
step = 0
while True:
    time.sleep(0.05)  # the step's work
    step += 1
    if PRINT_STEPS:
        print("rank", rank, "step", step, flush=True)
    if rank == FAIL_RANK and step == FAIL_STEP:
        record(exit="failed", step=step)
        sys.exit(3)
    try:
        if all_reduce_max(1 if stop else 0):  # every rank agrees the stop at the same step
            path = save(step)
            record(exit="saved", step=step, path=path)
            break
    except PeerLost as e:
        path = save(step - 1)  # this step's collective failed: the last step every rank completed
        record(exit="saved-after-peer-lost", step=step - 1, path=path, why=str(e))
        sys.exit(1)
print("rank", rank, "saved", path, flush=True)
"""

TRAIN_SH = """#!/bin/bash
cd "$(dirname "$0")"
python3 job.py "$@"
"""

TORCHRUN = r"""#!/usr/bin/python3
import os, signal, subprocess, sys, time
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key.replace("-", "_")] = value if _ else args.pop(0)
def opt(name, default):
    return opts.get(name) or os.environ.get("PET_" + name.upper()) or default
nnodes, node_rank, nproc = int(opt("nnodes", "1")), int(opt("node_rank", "0")), int(opt("nproc_per_node", "1"))
handled = [s for s in os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT").split(",") if s]
workers = []
for local in range(nproc):
    env = dict(os.environ, RANK=str(node_rank * nproc + local), LOCAL_RANK=str(local), WORLD_SIZE=str(nnodes * nproc),
               LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(node_rank), MASTER_ADDR=opt("master_addr", "127.0.0.1"),
               MASTER_PORT=opt("master_port", "29500"))
    workers.append(subprocess.Popen([sys.executable, "-u", *args], env=env, start_new_session=True))

class SignalException(Exception):
    def __init__(self, sig):
        self.sig = sig

def on_signal(signum, frame):
    raise SignalException(signal.Signals(signum))

for name in handled:
    signal.signal(getattr(signal, name), on_signal)

def close(death_sig, timeout=30):
    for w in workers:
        if w.poll() is None:
            w.send_signal(death_sig)
    end = time.monotonic() + timeout
    for w in workers:
        try:
            w.wait(max(0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for w in workers:
        if w.poll() is None:
            w.kill()
            w.wait()

try:
    while True:
        codes = [w.poll() for w in workers]
        if any(c not in (None, 0) for c in codes):
            sys.stderr.write("torchrun: worker failed %s\n" % codes)
            close(signal.SIGTERM)
            sys.exit(1)
        if all(c == 0 for c in codes):
            sys.exit(0)
        time.sleep(0.1)
except SignalException as e:
    sys.stderr.write("torchrun: got %s\n" % e.sig.name)
    close(e.sig)
    sys.exit(1)
"""

DEEPSPEED_LAUNCH = r"""# deepspeed/launcher/launch.py where DeepSpeed is not installed, doing what upstream does at a stop
# (deepspeedai/DeepSpeed deepspeed/launcher/launch.py main): one process per slot of this node in --world_info
# (base64 JSON {host: [slots]}), RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, in launch.py's process group
# (plain subprocess.Popen); SIGINT/SIGTERM -> sigkill_handler -> terminate_process_tree (SIGTERM to each child and
# its descendants upstream, to each child here; psutil.wait_procs(timeout=30), then kill), exit 1; a child that fails
# stops the others the same way.
import argparse, base64, json, os, signal, subprocess, sys, time
p = argparse.ArgumentParser()
p.add_argument("--world_info"); p.add_argument("--node_rank", type=int, default=0)
p.add_argument("--master_addr", default="127.0.0.1"); p.add_argument("--master_port", default="29500")
p.add_argument("script"); p.add_argument("script_args", nargs=argparse.REMAINDER)
a = p.parse_args()
world = json.loads(base64.urlsafe_b64decode(a.world_info))
hosts = list(world)
start = sum(len(world[h]) for h in hosts[:a.node_rank])
size = sum(len(v) for v in world.values())
procs = []
for local in range(len(world[hosts[a.node_rank]])):
    env = dict(os.environ, RANK=str(start + local), LOCAL_RANK=str(local), WORLD_SIZE=str(size),
               MASTER_ADDR=a.master_addr, MASTER_PORT=str(a.master_port))
    procs.append(subprocess.Popen([sys.executable, "-u", a.script, *a.script_args], env=env))
def terminate_all():
    for q in procs:
        if q.poll() is None:
            q.terminate()
    end = time.monotonic() + 30
    for q in procs:
        try:
            q.wait(max(0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            q.kill()
def sigkill_handler(signum, frame):
    terminate_all()
    sys.exit(1)
signal.signal(signal.SIGINT, sigkill_handler)
signal.signal(signal.SIGTERM, sigkill_handler)
while procs:
    for q in list(procs):
        code = q.poll()
        if code is None:
            continue
        if code != 0:
            terminate_all()
            sys.exit(code)
        procs.remove(q)
    time.sleep(1)
"""

STUBBORN = r"""
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a job that never handles the checkpoint signal
os.makedirs("ckpt", exist_ok=True)
open("ckpt/rank%s.started" % os.environ["NODE_RANK"], "w").close()
while True:
    time.sleep(0.05)
"""

RUN_SH = """#!/bin/bash
cd "$(dirname "$0")"
python3 stubborn.py "$@"
"""


def ckpt_dir(sim: PodSim, index: int) -> Path:
    """Pod `index`'s checkpoint folder of the job, on this machine."""
    return sim.volume_dir(index, "/workspace") / PROJECT.removeprefix("/workspace/") / "ckpt"


def records(sim: PodSim, pods: int) -> dict[int, dict[str, Any]]:
    """Each rank's `ckpt/rank<R>.json` that exists (rank R on pod R), by rank."""
    out = {}
    for i in range(pods):
        path = ckpt_dir(sim, i) / f"rank{i}.json"
        if path.exists():
            out[i] = json.loads(path.read_text())
    return out


def job_processes(sim: PodSim, index: int) -> list[str]:
    """What of the job still runs on pod `index` (pgrep -af lines)."""
    res = sim.exec(index, f"pgrep -af '{JOB_PROCESSES}' || true", timeout=30)
    return [line for line in res.stdout.splitlines() if "pgrep" not in line]
