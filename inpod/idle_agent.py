#!/usr/bin/env python3
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
/etc/ml-dev-env/lifecycle/idle.json; re-read every interval so a change needs no restart).
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import json
import os
import re
import shlex
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

AGENT = "ml-dev-env-idle-agent"
GPU_QUERY = "index,uuid,utilization.gpu,utilization.memory,memory.used"
APPS_QUERY = "gpu_uuid,pid,process_name,used_memory"
LAUNCHER_FRESH_SECONDS = 60  # the launcher touches its heartbeat at least every 15 s
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "idleTimeoutSeconds": 3600,
    "intervalSeconds": 60,
    "warningLeadSeconds": 600,
    "gpuUtilThreshold": 5,
    "gpuMemoryUtilThreshold": 5,
    "gpuMemoryFloorMiB": 1024,
    "unreachableSeconds": 600,
    "activityPort": 9099,
    "servers": [],
}


def log(message: str) -> None:
    print(f"[idle-agent] {time.strftime('%H:%M:%S')} {message}", flush=True)


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def state_dir() -> Path:
    return Path(env("ML_DEV_STATE_DIR", "/tmp/ml-dev-env"))


def load_settings() -> dict[str, Any]:
    path = Path(env("ML_DEV_IDLE_SETTINGS", "/etc/ml-dev-env/lifecycle/idle.json"))
    try:
        return {**DEFAULTS, **json.loads(path.read_text())}
    except (OSError, ValueError) as exc:
        log(f"settings {path} unreadable ({exc}); idle stop off")
        return dict(DEFAULTS)


def read_rank_env() -> dict[str, str]:
    """rank.env (the rank contract: `export KEY=value ...` lines written by startup.sh)."""
    values: dict[str, str] = {}
    for line in (state_dir() / "rank.env").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "export":
            words = words[1:]
        for word in words:
            key, sep, value = word.partition("=")
            if sep:
                values[key] = value
    return values


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_time(text: str) -> float:
    """Jupyter's ISO-8601 UTC timestamps ('2026-11-23T10:05:00.123456Z')."""
    base = text.rstrip("Z").split("+")[0]
    whole, _, frac = base.partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds + (float(f"0.{frac}") if frac else 0.0)


def signal(name: str, ok: bool, active: bool = False, age: float | None = None, **detail: Any) -> dict[str, Any]:
    """One probe's result: ok (the probe worked), active (activity now), age (seconds since the last activity)."""
    return {"name": name, "ok": ok, "active": active, "age": None if age is None else round(max(age, 0.0), 1), "detail": detail}


# ------------------------------------------------------------------------------------------ probes


def parse_csv(text: str) -> list[dict[str, str]]:
    """`nvidia-smi --query-*=... --format=csv`: a header of field names (`utilization.gpu [%]`), then one row
    per GPU or process; cells as printed (units, `[N/A]`). Keyed by the field name without its unit.
    Lines without a comma ("No running processes found") are not rows."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    header = [cell.strip().split(" [", 1)[0] for cell in lines[0].split(",")] if lines else []
    if not header or not all(re.match(r"^[a-z][A-Za-z0-9_.]*$", name) for name in header):
        raise ValueError(f"no nvidia-smi CSV header in {text.strip()[:200]!r}")
    rows = []
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(header):
            if len(cells) == 1:
                continue
            raise ValueError(f"unexpected nvidia-smi row {line!r} for header {header}")
        rows.append(dict(zip(header, cells)))
    return rows


def number(cell: str | None) -> float | None:
    """A numeric cell ('97 %', '61234 MiB', '97'); None when the GPU does not report it ('[N/A]',
    '[Not Supported]', 'N/A': MIG utilisation, unified-memory memory.used). Anything else raises."""
    if cell is None:
        return None
    value = cell.strip()
    if not value or value.startswith("[") or value.upper() == "N/A":
        return None
    for unit in ("MiB", "%", "W", "MHz"):
        if value.endswith(unit):
            value = value[: -len(unit)].strip()
    return float(value)


def parse_gpu_csv(text: str) -> list[dict[str, Any]]:
    """GPUs of `nvidia-smi --query-gpu=<GPU_QUERY> --format=csv`; a value the GPU does not report is None."""
    gpus: list[dict[str, Any]] = []
    for row in parse_csv(text):
        gpus.append(
            {
                "index": int(row["index"]) if row.get("index", "").isdigit() else len(gpus),
                "uuid": row.get("uuid"),
                "util": number(row.get("utilization.gpu")),
                "memUtil": number(row.get("utilization.memory")),
                "memUsedMiB": number(row.get("memory.used")),
            }
        )
    if not gpus:
        raise ValueError("nvidia-smi listed no GPU")
    return gpus


def parse_compute_apps(text: str) -> list[dict[str, Any]]:
    """Processes of `nvidia-smi --query-compute-apps=<APPS_QUERY> --format=csv` (a header alone: none)."""
    apps = []
    for row in parse_csv(text):
        pid = row.get("pid", "")
        apps.append(
            {
                "gpuUuid": row.get("gpu_uuid"),
                "pid": int(pid) if pid.isdigit() else None,
                "name": row.get("process_name") or row.get("name"),
                "usedMiB": number(row.get("used_gpu_memory") or row.get("used_memory")),
            }
        )
    return apps


def busy_gpus(gpus: list[dict[str, Any]], apps: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, list[str]]:
    """Why each busy GPU is busy. A GPU with a compute process is busy whatever its utilisation (a CPU phase
    of a job holds its memory at 0 %); so is one whose memory in use reaches the floor, or whose SM or
    memory-controller utilisation reaches its threshold. A value the GPU does not report ([N/A]: MIG
    utilisation, unified-memory memory.used) is no evidence either way; MIG instances are judged by their
    processes. A process on a GPU this query did not list still counts (key 'other')."""
    why: dict[str, list[str]] = {}
    by_uuid = {g["uuid"]: str(g["index"]) for g in gpus}
    for app in apps:
        key = by_uuid.get(app["gpuUuid"], "other")
        why.setdefault(key, []).append(f"compute process {app['pid'] if app['pid'] is not None else '?'} ({app['name'] or '?'})")
    floor = settings.get("gpuMemoryFloorMiB", DEFAULTS["gpuMemoryFloorMiB"])
    for g in gpus:
        key = str(g["index"])
        if g["memUsedMiB"] is not None and g["memUsedMiB"] >= floor:
            why.setdefault(key, []).append(f"{g['memUsedMiB']:g} MiB in use (floor {floor} MiB)")
        if g["util"] is not None and g["util"] >= settings["gpuUtilThreshold"]:
            why.setdefault(key, []).append(f"utilization.gpu {g['util']:g} %")
        if g["memUtil"] is not None and g["memUtil"] >= settings["gpuMemoryUtilThreshold"]:
            why.setdefault(key, []).append(f"utilization.memory {g['memUtil']:g} %")
    return why


def nvidia_smi(query: str) -> str:
    cmd = [env("ML_DEV_NVIDIA_SMI", "nvidia-smi"), query, "--format=csv"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    if proc.returncode != 0:
        # e.g. "Failed to initialize NVML: Driver/library version mismatch" (a driver upgrade under a running
        # container): nothing can be judged, the probe fails and counts as active
        raise ValueError(f"`{' '.join(cmd[:2])}` exit {proc.returncode}: {' '.join((proc.stderr or proc.stdout).split())[:200]}")
    return proc.stdout


def probe_gpu(settings: dict[str, Any]) -> dict[str, Any]:
    try:
        gpus = parse_gpu_csv(nvidia_smi(f"--query-gpu={GPU_QUERY}"))
        apps = parse_compute_apps(nvidia_smi(f"--query-compute-apps={APPS_QUERY}"))
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        return signal("gpu", False, error=str(exc))
    why = busy_gpus(gpus, apps, settings)
    return signal("gpu", True, active=bool(why), busy=sorted(why), why=why, gpus=gpus, processes=len(apps))


def probe_terminals(now: float) -> dict[str, Any]:
    pts = Path(env("ML_DEV_PTS_DIR", "/dev/pts"))
    inputs = {}
    with contextlib.suppress(OSError):
        for entry in pts.iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    inputs[entry.name] = entry.stat().st_atime
    age = now - max(inputs.values()) if inputs else None
    return signal("terminals", True, age=age, open=len(inputs))


def proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): tells a reused PID from the original."""
    try:
        stat = Path(env("ML_DEV_PROC_DIR", "/proc"), str(pid), "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19] if ")" in stat else None


def session_alive(record: Path) -> bool:
    """An SSH session record named after its PID; a first line holding the start time guards PID reuse."""
    if not record.name.isdigit() or not pid_alive(int(record.name)):
        return False
    try:
        first = record.read_text().splitlines()[0].strip() if record.stat().st_size else ""
    except (OSError, IndexError):
        first = ""
    return not first.isdigit() or proc_start_time(int(record.name)) in (None, first)


def probe_ssh() -> dict[str, Any]:
    # activity/ssh/<pid> (the activity-records contract) and ssh-sessions/<pid> (the SSH fabric's ForceCommand)
    live = []
    for records in (state_dir() / "activity" / "ssh", state_dir() / "ssh-sessions"):
        with contextlib.suppress(OSError):
            live += [int(p.name) for p in records.iterdir() if session_alive(p)]
    sessions = []
    if env("ML_DEV_SSH_PROCESS_SCAN", "1") == "1":
        for proc in Path(env("ML_DEV_PROC_DIR", "/proc")).glob("[0-9]*"):
            with contextlib.suppress(OSError):
                title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                if title.startswith("sshd: ") and "@" in title:  # sshd's per-session process title
                    sessions.append(int(proc.name))
    return signal("ssh", True, active=bool(live or sessions), records=sorted(live), sessionProcesses=sorted(sessions))


def probe_launcher(now: float) -> dict[str, Any]:
    # activity/launcher.heartbeat (the contract) and heartbeat/{run,rank}-<pid>.json (the launcher, every 10 s)
    beats = [state_dir() / "activity" / "launcher.heartbeat", *sorted((state_dir() / "heartbeat").glob("*.json"))]
    active, ages, runs = False, [], []
    for beat in beats:
        try:
            mtime = beat.stat().st_mtime
        except FileNotFoundError:
            continue
        except OSError as exc:
            return signal("launcher", False, error=str(exc))
        pid = None
        with contextlib.suppress(OSError, ValueError, AttributeError, IndexError, KeyError, TypeError):
            pid = int(json.loads(beat.read_text().strip().splitlines()[0])["pid"])
        alive = pid is None or pid_alive(pid)
        ages.append(now - mtime)
        if alive and now - mtime <= LAUNCHER_FRESH_SECONDS:
            active = True
            runs.append(beat.name)
    return signal("launcher", True, active=active, age=min(ages) if ages else None, runs=runs)


def probe_vscode(now: float) -> dict[str, Any]:
    data = env("XDG_DATA_HOME") or str(Path(env("HOME", "/tmp")) / ".local" / "share")
    beat = Path(env("ML_DEV_CODE_SERVER_HEARTBEAT", str(Path(data) / "code-server" / "heartbeat")))
    try:
        return signal("vscode", True, age=now - beat.stat().st_mtime, heartbeat=str(beat))
    except FileNotFoundError:
        return signal("vscode", True, heartbeat=str(beat), note="no heartbeat yet (never used)")
    except OSError as exc:
        return signal("vscode", False, error=str(exc))


def _jupyter_get(path: str) -> Any:
    base = env("ML_DEV_JUPYTER_URL", "http://127.0.0.1:8888").rstrip("/")
    request = urllib.request.Request(base + path)
    if env("JUPYTER_TOKEN"):
        request.add_header("Authorization", f"token {env('JUPYTER_TOKEN')}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def probe_jupyter(now: float) -> dict[str, Any]:
    try:
        status = _jupyter_get("/api/status")
        # no_track_activity: our own polling must not count as activity (jupyter_server
        # base/handlers.py APIHandler.update_api_activity; /api/status never tracks activity)
        kernels = _jupyter_get("/api/kernels?no_track_activity=1")
        terminals = _jupyter_get("/api/terminals?no_track_activity=1")
        stamps = [parse_time(status["last_activity"])]
        stamps += [parse_time(k["last_activity"]) for k in kernels if k.get("last_activity")]
        stamps += [parse_time(t["last_activity"]) for t in terminals if t.get("last_activity")]
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError) as exc:
        return signal("jupyter", False, error=str(exc))
    busy = [k.get("id") for k in kernels if k.get("execution_state") == "busy"]
    return signal(
        "jupyter",
        True,
        active=bool(busy),
        age=now - max(stamps),
        busyKernels=busy,
        kernels=len(kernels),
        terminals=len(terminals),
        connections=status.get("connections"),
    )


def guarded(name: str, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A probe's signal; any exception it did not expect is a failed probe (counts as active), never a crash."""
    try:
        return probe()
    except Exception as exc:
        return signal(name, False, error=f"{type(exc).__name__}: {exc}")


def local_activity(settings: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    signals = [
        guarded("gpu", lambda: probe_gpu(settings)),
        guarded("terminals", lambda: probe_terminals(now)),
        guarded("ssh", probe_ssh),
        guarded("launcher", lambda: probe_launcher(now)),
    ]
    # the IDE servers run on pod 0 only (startup.sh); workers report only their own signals
    if is_rank0():
        if "vscode" in settings.get("servers", []):
            signals.append(guarded("vscode", lambda: probe_vscode(now)))
        if "jupyter" in settings.get("servers", []):
            signals.append(guarded("jupyter", lambda: probe_jupyter(now)))
    return {"pod": env("POD_NAME") or env("HOSTNAME"), "node": env("NODE_NAME") or None, "time": now, "signals": signals}


def is_rank0() -> bool:
    try:
        return read_rank_env().get("NODE_RANK") == "0"
    except OSError:
        return env("NODE_RANK", "") == "0"


# ---------------------------------------------------------------------------------- whole env


def overridden(name: str) -> str:
    """A test override: the value, or with '@<file>' the file's content (read each round; missing = error)."""
    value = env(name)
    return Path(value[1:]).read_text().strip() if value.startswith("@") else value


def peers(settings: dict[str, Any]) -> list[tuple[str, str]]:
    """(pod, base URL) of every other pod, from rank.env (ML_DEV_PODS / ML_DEV_HOSTS, rank order)."""
    override = overridden("ML_DEV_ACTIVITY_PEERS")  # "pod=host:port ..." (tests run simulated pods on loopback)
    if override:
        return [(p.split("=", 1)[0], f"http://{p.split('=', 1)[1]}") for p in override.split()]
    rank = read_rank_env()
    pods, hosts = rank.get("ML_DEV_PODS", "").split(), rank.get("ML_DEV_HOSTS", "").split()
    if not pods or len(pods) != len(hosts):
        raise ValueError("rank.env has no ML_DEV_PODS/ML_DEV_HOSTS pair")
    me = env("POD_NAME") or env("HOSTNAME")
    return [(pod, f"http://{host}:{settings['activityPort']}") for pod, host in zip(pods, hosts) if pod != me]  # same length: checked above


def fetch_json(url: str, timeout: float = 15) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def gather(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod's activity; an unreachable pod or an unreadable rank.env is one failed signal."""
    reports = [local_activity(settings)]
    try:
        others = peers(settings)
    except (OSError, ValueError) as exc:
        return [*reports, {"pod": "?", "time": time.time(), "signals": [signal("peers", False, error=str(exc))]}]
    for pod, base in others:
        try:
            reports.append(fetch_json(f"{base}/activity"))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            reports.append({"pod": pod, "time": time.time(), "signals": [signal("reachable", False, error=str(exc))]})
    return reports


class Decider:
    """The whole environment's idle clock (pod 0)."""

    def __init__(self, now: float | None = None, unreachable_seconds: float = DEFAULTS["unreachableSeconds"]) -> None:
        self.last_active = time.time() if now is None else now  # a fresh start is activity
        self.reason = "agent started"
        self.warning: dict[str, Any] | None = None
        self.stopped = False
        self.last_reports: list[dict[str, Any]] = []
        self.unreachable_seconds = unreachable_seconds
        self.unreachable_since: dict[str, float] = {}
        """Worker pod → when it was first unreachable (since it last answered)."""
        self.written_off: dict[str, str] = {}
        """Worker pods unreachable longer than the bound → the last error; they no longer hold the stop."""
        self.announced: set[str] = set()

    def status(self, now: float) -> dict[str, Any]:
        """What `idle_agent.py status` and `GET /decision` show."""
        return {
            "idleSeconds": round(now - self.last_active, 1),
            "lastActive": self.last_active,
            "reason": self.reason,
            "warning": self.warning,
            "unreachable": {
                pod: {"seconds": round(now - since, 1), "writtenOff": pod in self.written_off}
                for pod, since in sorted(self.unreachable_since.items())
            },
        }

    def observe(self, reports: list[dict[str, Any]], now: float) -> float:
        """Fold one round of reports into the clock; returns the idle seconds.

        A worker that cannot be reached (Pending, no endpoints, a broken network) counts as active for
        `unreachable_seconds`; then it is written off: reported, and no longer able to veto the stop
        (a pod stuck Pending has no work to lose). It counts again as soon as it answers."""
        self.last_reports = reports
        for report in reports:
            pod = str(report.get("pod"))
            unreachable = next((s for s in report["signals"] if s["name"] == "reachable" and not s["ok"]), None)
            if unreachable is None:
                self.unreachable_since.pop(pod, None)
                self.written_off.pop(pod, None)
            else:
                since = self.unreachable_since.setdefault(pod, now)
                if now - since >= self.unreachable_seconds:
                    self.written_off[pod] = str(unreachable["detail"].get("error", "?"))
                    continue
            for s in report["signals"]:
                where = f"{report.get('pod')}/{s['name']}"
                if not s["ok"]:
                    self.last_active, self.reason = now, f"{where}: probe failed ({s['detail'].get('error', '?')})"
                elif s["active"]:
                    self.last_active, self.reason = now, f"{where}: active"
                elif s["age"] is not None and now - s["age"] > self.last_active:
                    self.last_active, self.reason = now - s["age"], f"{where}: last activity"
        return now - self.last_active


def summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Signals and their last values, per pod (what the stop record and the Event carry)."""
    out: dict[str, Any] = {}
    for report in reports:
        for s in report["signals"]:
            value: dict[str, Any] = {"ok": s["ok"], "active": s["active"], "age": s["age"]}
            detail = s["detail"]
            if s["name"] == "gpu" and s["ok"]:
                value["util"] = [g["util"] for g in detail["gpus"]]
                value["memUtil"] = [g["memUtil"] for g in detail["gpus"]]
            for key in ("open", "records", "busyKernels", "kernels", "terminals", "error"):
                if key in detail:
                    value[key] = detail[key]
            out[f"{report.get('pod')}/{s['name']}"] = value
    return out


# ------------------------------------------------------------------------------------- warning


def warning_text(stop_at: float, idle: float) -> str:
    when = time.strftime("%H:%M:%S UTC", time.gmtime(stop_at))
    return (
        f"ml-dev-env: this environment has been idle for {int(idle // 60)} min and will be SUSPENDED at {when} "
        "(GPUs released, data kept). Any activity cancels it: a command, a running job, GPU work. "
        f"Each rank of `ml-dev run` then gets {env('ML_DEV_CHECKPOINT_SIGNAL', 'SIGTERM')} and "
        f"{env('ML_DEV_CHECKPOINT_GRACE_SECONDS', '30')} s to save a checkpoint: handle that signal in your job "
        "(README 'Checkpoint before a stop'). "
        "Resume later with `pulumi up --refresh`."
    )


def show_warning(text: str | None) -> None:
    """The warning file the shells print at each prompt; a banner to open terminals when it first appears."""
    path = state_dir() / "idle-warning"
    if text is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    new = not path.exists()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
    if new:
        pts = Path(env("ML_DEV_PTS_DIR", "/dev/pts"))
        with contextlib.suppress(OSError):
            for entry in pts.iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError), open(entry, "w") as tty:
                        tty.write(f"\r\n\033[1;33m{text}\033[0m\r\n")


# --------------------------------------------------------------------------------- API server


class Kube:
    """Minimal in-cluster REST client (service-account token, standard library)."""

    def __init__(self, namespace: str) -> None:
        host, port = env("KUBERNETES_SERVICE_HOST"), env("KUBERNETES_SERVICE_PORT", "443")
        self.base = env("ML_DEV_KUBE_API") or f"https://{host}:{port}"
        sa = Path(env("ML_DEV_SA_DIR", str(SA_DIR)))
        self.token_file = sa / "token"
        self.namespace = namespace
        self.context = None
        if self.base.startswith("https://"):
            self.context = ssl.create_default_context(cafile=str(sa / "ca.crt"))

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token_file.read_text().strip()}")  # re-read: tokens rotate
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", AGENT)
        if data is not None:
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
            return json.loads(response.read())


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def scale_body(name: str, namespace: str, resource_version: str, replicas: int) -> dict[str, Any]:
    """The autoscaling/v1 Scale the agent PUTs to statefulsets/<name>/scale."""
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
        "spec": {"replicas": replicas},
    }


def stop(settings: dict[str, Any], decider: Decider, idle: float, now: float) -> bool:
    """Scale to 0, then record why (ConfigMap + Event). True when the environment is (now) stopped."""
    name, ns = settings["statefulset"], settings["namespace"]
    kube = Kube(ns)
    manager = urllib.parse.urlencode({"fieldManager": AGENT})
    scale_path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale"
    current = kube.call("GET", scale_path)
    before = int(current.get("spec", {}).get("replicas", 0))
    if before == 0:
        log("already scaled to 0")
        return True
    meta = current["metadata"]
    kube.call("PUT", f"{scale_path}?{manager}", scale_body(name, ns, meta["resourceVersion"], 0))
    signals = summary(decider.last_reports)
    message = (
        f"Suspended by the idle agent after {int(idle)}s without activity (idleTimeout "
        f"{settings['idleTimeoutSeconds']}s); replicas {before} -> 0, claims kept. Resume: pulumi up --refresh"
    )
    if decider.written_off:
        message += f" Unreachable pods not waited for: {', '.join(sorted(decider.written_off))}."
    record = {
        "stoppedAt": rfc3339(now),
        "idleSeconds": str(int(idle)),
        "lastActivity": rfc3339(decider.last_active),
        "lastActivityReason": decider.reason,
        "replicasBefore": str(before),
        "message": message,
        "signals.json": json.dumps(signals, sort_keys=True),
        "unreachablePods": " ".join(sorted(decider.written_off)),
    }
    with contextlib.suppress(OSError):
        (state_dir() / "idle-stop.json").write_text(json.dumps(record, indent=2))
    try:
        kube.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/configmaps/{settings['recordConfigMap']}?{manager}",
            {"data": record},
            "application/merge-patch+json",
        )
    except (OSError, urllib.error.URLError) as exc:
        log(f"WARNING: stop record not written: {exc}")
    try:
        event(
            settings, "IdleStop", message + " Signals: " + json.dumps(signals, sort_keys=True, separators=(",", ":")), now, meta.get("uid")
        )
    except (OSError, urllib.error.URLError) as exc:
        log(f"WARNING: event not created: {exc}")
    log(message)
    return True


def event(settings: dict[str, Any], reason: str, message: str, now: float, uid: str | None = None) -> None:
    """An Event on the StatefulSet (`oc get events --field-selector reason=<reason>`)."""
    name, ns = settings["statefulset"], settings["namespace"]
    involved: dict[str, str] = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "namespace": ns}
    if uid:
        involved["uid"] = uid
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{reason.lower()}.{int(now * 1000):x}", "namespace": ns},
        "involvedObject": involved,
        "reason": reason,
        "type": "Warning" if reason != "IdleStop" else "Normal",
        "message": message[:1024],
        "source": {"component": AGENT, "host": env("POD_NAME") or env("HOSTNAME")},
        "reportingComponent": AGENT,
        "reportingInstance": env("POD_NAME") or env("HOSTNAME") or AGENT,
        "firstTimestamp": rfc3339(now),
        "lastTimestamp": rfc3339(now),
        "count": 1,
    }
    Kube(ns).call("POST", f"/api/v1/namespaces/{ns}/events", body)


def report_unreachable(settings: dict[str, Any], decider: Decider, now: float) -> None:
    """Each pod written off gets one log line and one Event; the status file lists them for `status`."""
    for pod, error in sorted(decider.written_off.items()):
        if pod in decider.announced:
            continue
        decider.announced.add(pod)
        since = decider.unreachable_since.get(pod, now)
        message = (
            f"Pod {pod} unreachable for {int(now - since)}s (bound {int(decider.unreachable_seconds)}s: "
            f"{error}); the idle stop no longer waits for it. Check it: oc describe pod {pod}"
        )
        log(f"WARNING: {message}")
        if settings.get("enabled"):
            try:
                event(settings, "IdleAgentPodUnreachable", message, now)
            except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
                log(f"WARNING: event not created: {exc}")
    decider.announced &= set(decider.written_off)
    with contextlib.suppress(OSError):
        tmp = state_dir() / "idle-status.json.tmp"
        tmp.write_text(json.dumps(decider.status(now), indent=2))
        tmp.replace(state_dir() / "idle-status.json")


# ------------------------------------------------------------------------------------ the loop


def tick(settings: dict[str, Any], decider: Decider, now: float | None = None) -> str:
    """One round on pod 0: gather, decide, warn or stop. Returns 'active' | 'warn' | 'stop' | 'off'."""
    if not settings["enabled"]:
        show_warning(None)
        decider.warning = None
        return "off"
    reports = gather(settings)
    now = time.time() if now is None else now
    decider.unreachable_seconds = float(settings.get("unreachableSeconds", DEFAULTS["unreachableSeconds"]))
    idle = decider.observe(reports, now)
    report_unreachable(settings, decider, now)
    timeout, lead = settings["idleTimeoutSeconds"], settings["warningLeadSeconds"]
    if idle >= timeout and not decider.stopped:
        try:
            decider.stopped = stop(settings, decider, idle, now)
        except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
            log(f"ERROR: scale to 0 failed ({exc}); retrying next interval")
            return "warn"
        return "stop"
    if idle >= timeout - lead:
        stop_at = decider.last_active + timeout
        decider.warning = {"stop_at": stop_at, "text": warning_text(stop_at, idle)}
        show_warning(decider.warning["text"])
        return "warn"
    decider.warning = None
    show_warning(None)
    decider.stopped = False
    return "active"


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


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def listen_addresses(listen: str | None, port: int) -> list[tuple[str, int]]:
    """Where /activity and /decision answer: `host:port` items (`[v6]:port`), separated by spaces or commas.

    Default: the pod IP (pod 0 and the workers reach each other there; the NetworkPolicy admits only the stack's
    pods) plus 127.0.0.1 (local clients, `oc port-forward`); never a wildcard, so nothing answers on the SR-IOV
    interfaces (net1..N), which NetworkPolicy does not cover.
    """
    items = (listen or "").replace(",", " ").split()
    if not items:
        items = [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in (env("POD_IP"), "127.0.0.1") if ip]
    out = []
    for item in items:
        host, _, number = item.rpartition(":")
        host = host.strip("[]")
        if not host or host in ("0.0.0.0", "::"):
            raise ValueError(f"listen address {item!r}: name the address to bind (the pod IP, 127.0.0.1), not a wildcard")
        out.append((host, int(number)))
    return out


def serve(listen: str | None, decider: Decider | None, port: int = 0) -> list[ThreadingHTTPServer]:
    handler = type("BoundHandler", (Handler,), {"decider": decider})
    servers: list[ThreadingHTTPServer] = []
    for host, number in listen_addresses(listen, port):
        server = (_Server6 if ":" in host else ThreadingHTTPServer)((host, number), handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    bound = [(str(s.server_address[0]), s.server_address[1]) for s in servers]
    (state_dir() / "activity.addr").write_text("".join(f"[{h}]:{p}\n" if ":" in h else f"{h}:{p}\n" for h, p in bound))
    return servers


def follow_master(settings: dict[str, Any]) -> None:
    """Workers: mirror pod 0's warning (unreachable pod 0 = no warning shown; it decides anyway)."""
    try:
        override = overridden("ML_DEV_MASTER_ACTIVITY")  # host:port, for simulated pods
        base = f"http://{override}" if override else f"http://{read_rank_env()['MASTER_ADDR']}:{settings['activityPort']}"
        decision = fetch_json(f"{base}/decision", timeout=10)
    except (OSError, ValueError, KeyError, urllib.error.URLError):
        return
    warning = decision.get("warning")
    show_warning(warning["text"] if warning else None)


def run(listen: str | None, rounds: int | None = None) -> int:
    settings = load_settings()
    state_dir().mkdir(parents=True, exist_ok=True)
    decider = Decider(unreachable_seconds=float(settings.get("unreachableSeconds", DEFAULTS["unreachableSeconds"])))
    servers = serve(listen or env("ML_DEV_ACTIVITY_LISTEN"), decider, int(settings["activityPort"]))
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
        time.sleep(next_round - time.monotonic())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "probe", "status"])
    parser.add_argument("--listen", help="host:port[,host:port] for /activity (default $POD_IP and 127.0.0.1, port activityPort)")
    parser.add_argument("--rounds", type=int, help="stop after this many intervals (tests)")
    args = parser.parse_args(argv)
    if args.command == "status":
        # pod 0's view: idle seconds, last activity, pods written off as unreachable
        path = state_dir() / "idle-status.json"
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
    return run(args.listen, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
