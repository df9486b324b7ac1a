"""ml-dev status: pods, reachability, ranks, GPUs, RDMA devices, SSH sessions, the idle agent's view (`--all`: usage.py).

The idle agent's view is pod 0's decision (inpod/idle/decider.py Decider.status): its `$ML_DEV_STATE_DIR/idle-status.json`
on pod 0, `GET /decision` on pod 0's activity port from the other pods. A worker the agent cannot reach is shown
with the time it was first unreachable and whether it still holds the idle stop (lifecycle.idleStop.unreachableAfter).

Shipped next to ml-dev (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from .. import contract
from ..lib import kube, ledger, usersecrets
from ..lib.pod import app_name, env_records_dir, environment_record, environment_summary, idle_settings, model_line, mounted_models
from .common import HERE, PY, STATE_DIR, Cluster, parallel
from .secrets import pod_presence

STATUS_SCRIPT = (
    r"""
STATE_DIR="${@STATE_ENV@:-@STATE@}"
. "$STATE_DIR/rank.env" 2>/dev/null
gpus="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)"
rdma="$(ls /sys/class/infiniband 2>/dev/null | paste -sd, -)"
n=0
for f in "$STATE_DIR"/@SESSIONS@/*; do
  [ -f "$f" ] || continue
  pid="${f##*/}"; start="$(head -n1 "$f")"
  if [ -r "/proc/$pid/stat" ] && [ "$(cut -d' ' -f22 "/proc/$pid/stat")" = "$start" ]; then n=$((n + 1)); else rm -f "$f"; fi
done
stopping=""  # checkpoint_stop.sh's marker: the pod got its stop (preStop or SIGTERM), its ranks are saving
if [ -r "$STATE_DIR/stopping" ]; then
  at="$(cat "$STATE_DIR/stopping")"
  stopping=" STOPPING since $(date -u -d "@$at" '+%Y-%m-%d %H:%M:%S UTC' 2>/dev/null || printf '%s' "$at")"
fi
printf 'rank=%s/%s gpus=%s rdma=%s ssh_sessions=%s%s\n' "${NODE_RANK:-?}" "${NNODES:-?}" "${gpus:-none}" "${rdma:-none}" "$n" "$stopping"
""".replace("@STATE_ENV@", contract.STATE_DIR_ENV)
    .replace("@STATE@", contract.STATE_DIR)
    .replace("@SESSIONS@", contract.SSH_SESSIONS_DIR)
)


def settings_or_empty() -> dict[str, Any]:
    """idle.json (over the contract's defaults), or nothing when it is not mounted (no idle lines)."""
    try:
        return idle_settings()
    except (OSError, ValueError):
        return {}


def idle_view(cluster: Cluster, settings: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Pod 0's idle decision (None and why not when it cannot be read)."""
    # urllib (http.client, email, ssl) is loaded here, not by every `ml-dev` process: a rank agent or a hop's `_apply`
    # imports this module with the rest of ml-dev, and the startup ConfigMap's read-only mount caches no bytecode
    import urllib.request

    try:
        if cluster.me == 0:
            return json.loads((STATE_DIR / contract.IDLE_STATUS_FILE).read_text()), ""
        port = settings.get("activityPort", contract.ACTIVITY_PORT)
        with urllib.request.urlopen(f"http://{cluster.hosts[0]}:{port}/decision", timeout=5) as response:
            return json.loads(response.read()), ""
    except (OSError, ValueError) as exc:  # urllib.error.URLError is an OSError
        return None, f"{type(exc).__name__}: {exc}"


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def idle_lines(view: dict[str, Any] | None, why: str, settings: dict[str, Any], now: float) -> tuple[list[str], dict[str, str]]:
    """The summary line(s) of the idle agent's view and one note per pod it cannot reach."""
    if view is None:
        if not settings:
            return [], {}
        return [f"idle agent: no view from pod 0 ({why})"], {}
    if not view.get("enabled", True):
        return ["idle stop: off (lifecycle.idleStop.enabled); the idle agent only reports"], {}
    at = float(view.get("at") or now)
    interval = float(settings.get("intervalSeconds", 60))
    stale = f" (stale: pod 0's agent last decided {int(now - at)} s ago)" if now - at > 3 * interval + 5 else ""
    lines = [f"idle stop: idle {int(float(view.get('idleSeconds', 0)))} s; last activity: {view.get('reason', '?')}{stale}"]
    bound = int(float(view.get("unreachableSeconds") or settings.get("unreachableSeconds") or 0))
    notes = {}
    for pod, entry in sorted((view.get("unreachable") or {}).items()):
        since = float(entry.get("since") or at - float(entry.get("seconds", 0)))
        held = (
            f"written off after {bound} s: the idle stop no longer waits for it"
            if entry.get("writtenOff")
            else f"counts as active until {bound} s, then the idle stop no longer waits for it"
        )
        error = f"; {entry['error']}" if entry.get("error") else ""
        notes[pod] = f"UNREACHABLE for the idle agent since {when(since)} ({int(now - since)} s{error}): {held}"
    return lines, notes


def cmd_start(args: argparse.Namespace) -> int:
    """`ml-dev status --start`: the start ledger of this start of the environment (inpod/lib/ledger.py), kept with the
    environment's records (the last contract.START_LEDGER_KEEP starts), beside the previous start's."""
    namespace = os.environ.get("POD_NAMESPACE") or (Path(contract.SA_DIR) / "namespace").read_text().strip()
    client = kube.Client("ml-dev-env-status")
    try:
        pods, events, workloads = ledger.read_api(lambda path: client.call("GET", path), namespace, app_name())
    except (OSError, ValueError) as exc:
        print(f"ml-dev status --start: cannot read the pods and events of {namespace} ({type(exc).__name__}: {exc})")
        return 1
    cluster = Cluster()
    names = list(cluster.pods)

    def marks_of(rank: int) -> dict[str, float]:
        if rank == cluster.me:
            return ledger.read_marks()
        argv = cluster.ssh(rank, ["bash", "-c", ledger.MARKS_SCRIPT])
        res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=args.timeout + 10, check=False)
        return ledger.parse_marks(res.stdout) if res.returncode == 0 else {}

    found = parallel(marks_of, list(range(len(names))))  # rank -> its marks, or the Exception where a pod failed
    marks: dict[str, dict[str, float]] = {names[i]: m for i, m in found.items() if isinstance(m, dict)}
    start = ledger.build(pods, events, workloads, marks)
    records = env_records_dir()
    before = [s for s in ledger.kept(records) if s.get("id") != start.get("id")]
    ledger.keep_start(records, start)
    for line in ledger.start_table(start):
        print(line)
    if before:
        print(ledger.compare(start, before[-1]))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if getattr(args, "start", False):
        return cmd_start(args)
    if getattr(args, "all", False):
        # Every environment of this namespace (owner, size, state, GPU-hours this week) from the live objects,
        # read with the pod's ServiceAccount (its usage Role may list them): usage.py, shipped next to ml-dev.
        namespace = os.environ.get("POD_NAMESPACE") or (Path(contract.SA_DIR) / "namespace").read_text().strip()
        return subprocess.run([PY, str(HERE / "usage.py"), "status", "--namespace", namespace], check=False).returncode
    cluster = Cluster()

    def one(rank: int) -> str:
        argv = ["bash", "-c", STATUS_SCRIPT] if rank == cluster.me else cluster.ssh(rank, ["bash", "-c", STATUS_SCRIPT])
        res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=args.timeout + 10, check=False)
        if res.returncode != 0:
            return "UNREACHABLE " + ((res.stderr.strip().splitlines() or [""])[-1])
        return res.stdout.strip()

    settings = settings_or_empty()
    results = parallel(one, list(range(len(cluster.hosts))))
    found = pod_presence(cluster, args.timeout + 10)  # env.secrets: names and present/missing, never a value
    view, why = idle_view(cluster, settings)
    lines, notes = idle_lines(view, why, settings, time.time())
    print(
        f"{len(cluster.hosts)} pods, WORLD_SIZE={cluster.rank_env.get('WORLD_SIZE', '?')}, "
        f"master {cluster.rank_env.get('MASTER_ADDR', '?')}:{cluster.rank_env.get('MASTER_PORT', '?')}"
    )
    unreachable = 0
    for rank in range(len(cluster.hosts)):
        text = results[rank]
        text = f"ERROR {text}" if isinstance(text, Exception) else text
        unreachable += str(text).startswith(("UNREACHABLE", "ERROR")) or cluster.pods[rank] in notes
        print(f"  {cluster.pods[rank]:<24} {text}{'  (this pod)' if rank == cluster.me else ''}")
        secret_line = usersecrets.status_line(found.get(cluster.pods[rank]))
        if secret_line:
            print(f"  {'':<24} {secret_line}")
        if cluster.pods[rank] in notes:
            print(f"  {'':<24} {notes.pop(cluster.pods[rank])}")
    for pod, note in sorted(notes.items()):  # a pod the agent names that rank.env does not list
        print(f"  {pod:<24} {note}")
    for line in lines:
        print(line)
    models = mounted_models()
    if models:
        print("models mounted from their images (read-only, every pod):")
        for model in models:
            print(f"  {model_line(model)}")
    gate = environment_record()  # the last launch's drift gate, on the launching pod (records_dir)
    print(f"environment: {environment_summary(gate)}")
    for line in list((gate or {}).get("lines") or [])[:8]:  # type: ignore[call-overload]
        print(f"  {line}")
    return 1 if unreachable or not all(m["present"] for m in models) else 0
