"""ml-dev-env idle agent: decides idleness for the WHOLE environment and suspends it (scale to 0).

Runs in the main container of every pod (started by startup.sh; it needs that container's GPUs,
processes, terminals and state directory), standard library only:

* every pod serves `GET /activity` (its local signals as JSON) on the activity port of its pod IP and
  127.0.0.1 (never a wildcard: nothing answers on the SR-IOV interfaces);
* pod 0 (NODE_RANK 0 in rank.env) samples its own signals and every other pod's `/activity` each
  interval, keeps the time of the last activity anywhere, shows a warning `warningLead` before the
  stop (a file the shells print at each prompt + a banner written to open terminals) and, after
  `idleTimeout` without activity, scales the StatefulSet to 0 through `statefulsets/scale`
  (autoscaling/v1 Scale), then records why on the stop-record ConfigMap and as an Event;
* the other pods poll pod 0's `GET /decision` and mirror its warning locally.

Signals (a local probe that fails, or raises anything unexpected, counts as ACTIVE: the agent never stops
what it cannot see; a worker pod that cannot be reached counts as active for `unreachableSeconds`, then
it is reported (an Event, `idle_agent.py status`) and no longer holds the stop):
  gpu        `nvidia-smi --query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used --format=csv`
             and `--query-compute-apps=gpu_uuid,pid,process_name,used_memory`: a GPU is busy with a compute
             process, with memory.used at or above gpuMemoryFloorMiB, or with utilization.gpu/.memory at
             or above its threshold; `[N/A]` in a column is no evidence (MIG, unified memory), never a
             failure; a missing or failing nvidia-smi is a failed probe
  terminals  last input on any /dev/pts/N (its atime, what `w` shows as IDLE)
  ssh        `$ML_DEV_STATE_DIR/activity/ssh/<pid>` or `ssh-sessions/<pid>` records whose pid is alive (and,
             when the record's first line holds it, has the same start time), or `sshd: user@…` processes
  launcher   `$ML_DEV_STATE_DIR/activity/launcher.heartbeat` or `heartbeat/*.json` rewritten within 60 s by a
             live run (`ml-dev` rewrites its run/rank records every 10 s)
  vscode     code-server's heartbeat file (`<data dir>/code-server/heartbeat`, rewritten at most once a
             minute while code-server has activity or open connections: coder/code-server src/node/heart.ts)
  jupyter    `/api/status` last_activity, `/api/kernels` (a busy kernel is active), `/api/terminals`

Usage: idle_agent.py run | probe | status   (settings: $ML_DEV_IDLE_SETTINGS, default
/etc/ml-dev-env/lifecycle/idle.json; looked at every second between rounds, so a change takes effect
within a second and needs no restart).

The program is split at its seams, modules shipped next to it in the same ConfigMap (inpod.SHIPPED):
probes (settings, environment, the local signals) and decider (gathering, the idle clock, the
warning, the scale to 0 and its record); this file holds the HTTP server and the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .. import contract
from ..lib import http, pod
from ..lib.http import fetch_json
from .decider import Decider, show_warning, tick
from .probes import env, is_rank0, load_settings, local_activity, log, read_rank_env, state_dir


class Handler(BaseHTTPRequestHandler):
    decider: Decider | None = None

    def do_GET(self) -> None:  # http.server's method name
        if self.path == "/activity":
            body: Any = local_activity(load_settings())
        elif self.path == "/decision" and self.decider is not None:
            body = self.decider.status(time.time())
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def serve_activity(listen: str | None, decider: Decider | None, port: int = 0) -> list[ThreadingHTTPServer]:
    """/activity (every pod) and /decision (pod 0) on the pod IP and 127.0.0.1, never a wildcard (lib/http.py)."""
    handler = type("BoundHandler", (Handler,), {"decider": decider})
    servers = http.bind(http.listen_addresses(listen, port), handler)
    http.serve_in_background(servers)
    (state_dir() / "activity.addr").write_text("".join(f"{a}\n" for a in http.shown(servers)))
    return servers


def follow_master(settings: dict[str, Any]) -> None:
    """Workers: mirror pod 0's warning (unreachable pod 0 = no warning shown; it decides anyway)."""
    try:
        # pod 0's agent at MASTER_ADDR (rank.env: pod 0's DNS name) on the activity port, as every pod's agent listens
        decision = fetch_json(f"http://{read_rank_env()['MASTER_ADDR']}:{settings['activityPort']}/decision", timeout=10)
    except (OSError, ValueError, KeyError, urllib.error.URLError):
        return
    warning = decision.get("warning")
    show_warning(warning["text"] if warning else None)


def run_agent(listen: str | None, rounds: int | None = None) -> int:
    settings = load_settings()
    state_dir().mkdir(parents=True, exist_ok=True)
    decider = Decider(unreachable_seconds=float(settings.get("unreachableSeconds", contract.IDLE_DEFAULTS["unreachableSeconds"])))
    servers = serve_activity(listen or env("ML_DEV_ACTIVITY_LISTEN"), decider, int(settings["activityPort"]))
    where = ", ".join(str(s.server_address[:2]) for s in servers)
    log(f"serving /activity on {where}; idle stop {'on' if settings['enabled'] else 'off'}")
    done, next_round = 0, time.monotonic()
    while rounds is None or done < rounds:
        settings = load_settings()
        try:
            if is_rank0():
                outcome = tick(settings, decider)
                if outcome != "active":
                    log(f"{outcome}: idle {int(time.time() - decider.last_active)}s; last: {decider.reason}")
            elif settings["enabled"]:
                follow_master(settings)
            else:
                show_warning(None)
        except Exception as exc:  # the agent must never die and leave the environment unguarded
            log(f"ERROR: {type(exc).__name__}: {exc}")
        done += 1
        # fixed period (a slow probe does not stretch the interval); never busy-loop
        next_round = max(next_round + max(1.0, float(settings["intervalSeconds"])), time.monotonic() + 0.2)
        if not until_next_round(next_round, settings):
            next_round = time.monotonic()  # the settings changed: a round now, the period from here
    return 0


SETTINGS_LOOK_SECONDS = 1.0
"""How often the agent looks at idle.json between rounds: a ConfigMap update (the kubelet swaps the mounted
directory's ..data link) takes effect within this, not at the next round up to intervalSeconds later."""


def until_next_round(at: float, settings: dict[str, Any]) -> bool:
    """Sleep until `at` (time.monotonic()); False as soon as the settings differ from `settings` (a read of a small
    file each SETTINGS_LOOK_SECONDS)."""
    while True:
        left = at - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, SETTINGS_LOOK_SECONDS))
        try:
            now = pod.idle_settings()
        except (OSError, ValueError):
            continue  # unreadable (mid-swap, or gone): the next round reads it and says so in the log
        if time.monotonic() < at and now != settings:
            return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "probe", "status"])
    parser.add_argument("--listen", help="host:port[,host:port] for /activity (default $POD_IP and 127.0.0.1, port activityPort)")
    parser.add_argument("--rounds", type=int, help="stop after this many intervals (tests)")
    args = parser.parse_args(argv)
    if args.command == "status":
        # pod 0's view: idle seconds, last activity, pods written off as unreachable
        path = state_dir() / contract.IDLE_STATUS_FILE
        try:
            print(path.read_text().strip())
        except OSError:
            print(f"no {path} (the idle agent runs its decision on pod 0 only)")
            return 2
        return 0
    if args.command == "probe":
        json.dump(local_activity(load_settings()), sys.stdout, indent=2)
        print()
        return 0
    return run_agent(args.listen, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
