"""The idle agent's local signals (gpu, terminals, ssh, launcher, warm, vscode, jupyter), its settings and environment.

Shipped next to idle_agent.py (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import calendar
import contextlib
import functools
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from .. import contract
from ..lib import pod, usersecrets
from ..lib.pod import env, pid_alive, read_rank_env, state_dir

AGENT = contract.IDLE_AGENT_MANAGER
GPU_QUERY = "index,uuid,utilization.gpu,utilization.memory,memory.used"
APPS_QUERY = "gpu_uuid,pid,process_name,used_memory"
LAUNCHER_FRESH_SECONDS = 60  # the launcher touches its heartbeat at least every 15 s
DEFAULTS = contract.IDLE_DEFAULTS  # the one table (inpod/contract.py)

log = functools.partial(pod.log, "idle-agent", stamp=True)


def load_settings() -> dict[str, Any]:
    """idle.json over the contract's defaults; unreadable: the defaults (idle stop off), said in the log."""
    try:
        return pod.idle_settings()
    except (OSError, ValueError) as exc:
        log(f"settings {env(contract.IDLE_SETTINGS_ENV, contract.IDLE_SETTINGS)} unreadable ({exc}); idle stop off")
        return dict(DEFAULTS)


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


GPU_PROBE_SECONDS = contract.GPU_PROBE_SECONDS
"""The GPU probe's whole budget (both nvidia-smi queries): a worker's /activity must answer well within pod 0's
fetch timeout (decider.gather, ACTIVITY_FETCH_SECONDS: 15 s), so a hung nvidia-smi is that pod's failed GPU check (active), never
an unreachable pod. The number is the contract's (inpod/contract.py)."""

_ABANDONED: list[subprocess.Popen] = []
"""nvidia-smi runs killed at the deadline and not waited for (one stuck in the driver, state D, ignores SIGKILL
until the driver lets go; waiting would hang the agent): collected when they finally exit."""


def nvidia_smi(query: str, deadline: float | None = None) -> str:
    """One nvidia-smi query; raises ValueError at `deadline` (time.monotonic) without waiting for the process."""
    for old in list(_ABANDONED):
        if old.poll() is not None:
            _ABANDONED.remove(old)
    cmd = [env("ML_DEV_NVIDIA_SMI", "nvidia-smi"), query, "--format=csv"]
    left = (time.monotonic() + GPU_PROBE_SECONDS if deadline is None else deadline) - time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = proc.communicate(timeout=max(0.1, left))
    except subprocess.TimeoutExpired:
        proc.kill()
        _ABANDONED.append(proc)
        raise ValueError(f"`{' '.join(cmd[:2])}` did not answer within {GPU_PROBE_SECONDS} s (killed; a hung driver?)") from None
    if proc.returncode != 0:
        # e.g. "Failed to initialize NVML: Driver/library version mismatch" (a driver upgrade under a running
        # container): nothing can be judged, the probe fails and counts as active
        raise ValueError(f"`{' '.join(cmd[:2])}` exit {proc.returncode}: {' '.join((err or out).split())[:200]}")
    return str(out)


GPU_DEVICE_PREFIX = contract.GPU_DEVICE_PREFIX  # /dev/nvidia<N>, one per GPU the container was given
KERNEL_FILE = re.compile(r"kernel-([0-9A-Za-z-]+)\.json")
"""The connection file in a Jupyter kernel's command line (`python -m ipykernel_launcher -f .../kernel-<id>.json`;
jupyter_client provisioning/local_provisioner.py LocalProvisioner.launch_kernel, connect.py): its id in /api/kernels."""


def gpu_holders() -> dict[int, str]:
    """This pod's processes holding a GPU device open (an fd on /dev/nvidia<N>) and their command lines: the pod's
    own PIDs. NVML's process list cannot name them: inside a container it reports host PIDs
    (NVIDIA/nvidia-docker#1483)."""
    device = re.compile("^" + re.escape(env("ML_DEV_GPU_DEVICE_PREFIX", GPU_DEVICE_PREFIX)) + r"[0-9]+$")
    holders = {}
    for proc in Path(env("ML_DEV_PROC_DIR", "/proc")).glob("[0-9]*"):
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if device.match(os.readlink(fd)):
                    with contextlib.suppress(OSError):
                        holders[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    break
    return holders


IDLE_WARM = "warm ranks"
"""What held_by_idle_kernels names for warm ranks' workers (`ml-dev _warm-worker`) when no cell runs on them."""


def held_by_idle_kernels(idle_kernels: set[str], warm_idle: bool = False) -> list[str] | None:
    """The kernel ids holding the GPUs when every process of this pod that holds one is a kernel Jupyter reports
    idle (or, `warm_idle`, a warm rank without a cell: IDLE_WARM); None when any other process (or none this pod can
    see) holds one."""
    holders = gpu_holders()
    ids = [
        IDLE_WARM if warm_idle and contract.WARM_WORKER_COMMAND in cmd else m.group(1) if m else None
        for cmd, m in ((cmd, KERNEL_FILE.search(cmd)) for cmd in holders.values())
    ]
    if not ids or any(i not in idle_kernels and i != IDLE_WARM for i in ids):
        return None
    return sorted({i for i in ids if i})


def probe_gpu(settings: dict[str, Any], idle_kernels: set[str] | None = None, warm_idle: bool = False) -> dict[str, Any]:
    """The gpu signal. `idle_kernels` (pod 0 with Jupyter: the kernels /api/kernels reports idle): a GPU held only
    by those kernels does not veto by its processes or memory (a notebook with a model loaded at 0 % for days is
    judged by Jupyter's activity, warned and stopped at idleTimeout); utilisation still counts. `warm_idle`: the same
    for warm ranks without a cell (the warm signal judges them)."""
    try:
        deadline = time.monotonic() + GPU_PROBE_SECONDS
        gpus = parse_gpu_csv(nvidia_smi(f"--query-gpu={GPU_QUERY}", deadline))
        apps = parse_compute_apps(nvidia_smi(f"--query-compute-apps={APPS_QUERY}", deadline))
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        return signal("gpu", False, error=str(exc))
    why = busy_gpus(gpus, apps, settings)
    kernels = held_by_idle_kernels(idle_kernels or set(), warm_idle) if why and (idle_kernels is not None or warm_idle) else None
    if kernels is not None:
        held = ("compute process ", " MiB in use (floor ")
        why = {k: rest for k, v in why.items() if (rest := [w for w in v if not any(h in w for h in held)])}
    return signal("gpu", True, active=bool(why), busy=sorted(why), why=why, gpus=gpus, processes=len(apps), heldByIdleKernels=kernels or [])


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


def session_facts(record: Path) -> dict[str, Any]:
    """What a live SSH session record says (ssh-session.sh's lines: start time, user, `$SSH_CLIENT`, the `ml-dev`
    launcher that opened it, if any): for the home page, which counts connections, not sessions. The activity
    rules read none of it."""
    try:
        lines = [*record.read_text().splitlines(), "", "", "", ""]
    except OSError:
        lines = ["", "", "", ""]
    client = lines[2].split()
    return {
        "pid": int(record.name),
        "user": lines[1].strip(),
        # one TCP connection: the client's address and port (`$SSH_CLIENT` is "address port server-port"); every
        # session multiplexed over it (ssh's ControlMaster) has the same
        "connection": " ".join(client[:2]) if len(client) >= 2 else f"pid {record.name}",
        "run": lines[3].strip(),
    }


def warm_session(pid: int) -> bool:
    """A session of warm ranks (`ml-dev ranks`: a rank agent of the node program, a hub's bridge): what it runs names
    the program (contract.WARM_NODE_COMMAND / WARM_BRIDGE_COMMAND). Its activity is the warm signal's (cells), so
    the session itself counts for nothing: warm ranks without a cell are idle."""
    with contextlib.suppress(OSError):
        argv = Path(env("ML_DEV_PROC_DIR", "/proc"), str(pid), "cmdline").read_bytes()
        return any(name.encode() in argv for name in (contract.WARM_NODE_COMMAND, contract.WARM_BRIDGE_COMMAND))
    return False


def probe_ssh() -> dict[str, Any]:
    # activity/ssh/<pid> (the activity-records contract) and ssh-sessions/<pid> (the SSH fabric's ForceCommand)
    live, facts, warm = [], [], set()
    for records in (state_dir() / contract.ACTIVITY_DIR / "ssh", state_dir() / contract.SSH_SESSIONS_DIR):
        with contextlib.suppress(OSError):
            for p in sorted(records.iterdir()):
                if session_alive(p):
                    if warm_session(int(p.name)):
                        warm.add(int(p.name))
                        continue
                    live.append(int(p.name))
                    facts.append(session_facts(p))
    sessions = []
    if env("ML_DEV_SSH_PROCESS_SCAN", "1") == "1":
        parents: dict[int, list[int]] = {}
        for proc in Path(env("ML_DEV_PROC_DIR", "/proc")).glob("[0-9]*"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(proc.name))
            with contextlib.suppress(OSError):
                title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                if title.startswith("sshd: ") and "@" in title:  # sshd's per-session process title
                    sessions.append(int(proc.name))
        # a connection that carries only warm ranks' sessions (the hub's, multiplexed) is theirs
        sessions = [p for p in sessions if not (parents.get(p) and set(parents[p]) <= warm)]
    return signal("ssh", True, active=bool(live or sessions), records=sorted(live), sessionProcesses=sorted(sessions), sessions=facts)


def probe_launcher(now: float) -> dict[str, Any]:
    # activity/launcher.heartbeat (the contract) and heartbeat/{run,rank}-<pid>.json (the launcher, every 10 s)
    beats = [state_dir() / contract.ACTIVITY_DIR / "launcher.heartbeat", *sorted((state_dir() / contract.HEARTBEAT_DIR).glob("*.json"))]
    active, ages, runs, launches = False, [], [], []
    for beat in beats:
        try:
            mtime = beat.stat().st_mtime
        except FileNotFoundError:
            continue
        except OSError as exc:
            return signal("launcher", False, error=str(exc))
        pid: int | None = None
        info: Any = {}
        with contextlib.suppress(OSError, ValueError, AttributeError, IndexError, KeyError, TypeError):
            info = json.loads(beat.read_text().strip().splitlines()[0])
            pid = int(info["pid"])
        alive = pid is None or pid_alive(pid)
        if isinstance(info, dict) and contract.WARM_NODE_COMMAND in (info.get("command") or []):
            continue  # warm ranks (their hub's run, their rank agents): the warm signal counts their cells
        ages.append(now - mtime)
        if alive and now - mtime <= LAUNCHER_FRESH_SECONDS:
            active = True
            runs.append(beat.name)
            if beat.name.startswith("run-") and isinstance(info, dict):  # an `ml-dev run` launched here: the home page lists it
                launches.append({k: info.get(k) for k in ("pid", "command", "cwd", "pods", "started")})
    return signal("launcher", True, active=active, age=min(ages) if ages else None, runs=runs, launches=launches)


def probe_warm(now: float) -> dict[str, Any]:
    """Warm ranks on this pod (`ml-dev ranks`): active while a cell runs; else the last cell's end (their start when
    none ran) is the last activity, so warm ranks without a cell for idleTimeout are idle. Their node rewrites
    `warm/activity.json` at every cell's start and end (contract.WARM_ACTIVITY_FILE)."""
    path = state_dir() / contract.WARM_DIR / contract.WARM_ACTIVITY_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return signal("warm", True, ranks=[])
    except (OSError, ValueError) as exc:
        return signal("warm", False, error=f"{path}: {exc}")
    if not isinstance(record, dict) or not pid_alive(int(record.get("pid") or 0)):
        return signal("warm", True, ranks=[])  # a node that was killed left its record
    running = list(record.get("running") or [])
    last = float(record.get("last") or now)
    detail = {"ranks": record.get("ranks") or [], "running": running, "lastCell": record.get("last_cell")}
    return signal("warm", True, active=bool(running), age=max(0.0, now - last), **detail)


def probe_vscode(now: float) -> dict[str, Any]:
    # code-server writes <data>/heartbeat (empty) on a request at most once a minute and again every minute
    # while a browser is connected; its /healthz `lastHeartbeat` is that instant (coder/code-server
    # src/node/heart.ts Heart.beat, src/node/routes/index.ts register, src/node/routes/health.ts; <data> is
    # env-paths' $XDG_DATA_HOME/code-server, else ~/.local/share/code-server: src/node/util.ts getEnvPaths)
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


def judge_jupyter(status: Any, kernels: Any, terminals: Any, now: float) -> dict[str, Any]:
    """The jupyter signal from the bodies of /api/status, /api/kernels and /api/terminals (jupyter_server
    services/api/handlers.py APIStatusHandler.get, services/kernels/kernelmanager.py kernel_model,
    jupyter_server_terminals terminalmanager.py get_terminal_model; real captures in
    tests/data/tool_output/jupyter): a busy kernel is activity now; the age is that of the newest
    last_activity. A kernel still `starting` (no client has talked to it yet) is not busy."""
    stamps = [parse_time(status["last_activity"])]
    stamps += [parse_time(k["last_activity"]) for k in kernels if k.get("last_activity")]
    stamps += [parse_time(t["last_activity"]) for t in terminals if t.get("last_activity")]
    busy = [k.get("id") for k in kernels if k.get("execution_state") == "busy"]
    idle = [k.get("id") for k in kernels if k.get("execution_state") == "idle"]
    return signal(
        "jupyter",
        True,
        active=bool(busy),
        age=now - max(stamps),
        busyKernels=busy,
        idleKernels=idle,
        kernels=len(kernels),
        terminals=len(terminals),
        connections=status.get("connections"),
    )


def probe_jupyter(now: float) -> dict[str, Any]:
    try:
        status = _jupyter_get("/api/status")
        # no_track_activity: our own polling must not count as activity (jupyter_server
        # base/handlers.py APIHandler.update_api_activity; /api/status never tracks activity)
        kernels = _jupyter_get("/api/kernels?no_track_activity=1")
        terminals = _jupyter_get("/api/terminals?no_track_activity=1")
        return judge_jupyter(status, kernels, terminals, now)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, urllib.error.URLError) as exc:
        return signal("jupyter", False, error=str(exc))


def guarded(name: str, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A probe's signal; any exception it did not expect is a failed probe (counts as active), never a crash."""
    try:
        return probe()
    except Exception as exc:
        return signal(name, False, error=f"{type(exc).__name__}: {exc}")


def local_activity(settings: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    # the IDE servers run on pod 0 only (startup.sh); workers report only their own signals
    servers = settings.get("servers", []) if is_rank0() else []
    jupyter = guarded("jupyter", lambda: probe_jupyter(now)) if "jupyter" in servers else None
    idle_kernels = set(jupyter["detail"].get("idleKernels") or []) if jupyter is not None and jupyter["ok"] else None
    warm = guarded("warm", lambda: probe_warm(now))
    warm_idle = bool(warm["ok"] and warm["detail"].get("ranks") and not warm["active"])
    signals = [
        guarded("gpu", lambda: probe_gpu(settings, idle_kernels, warm_idle)),
        guarded("terminals", lambda: probe_terminals(now)),
        guarded("ssh", probe_ssh),
        guarded("launcher", lambda: probe_launcher(now)),
        warm,
    ]
    if "vscode" in servers:
        signals.append(guarded("vscode", lambda: probe_vscode(now)))
    if jupyter is not None:
        signals.append(jupyter)
    report: dict[str, Any] = {"pod": env("POD_NAME") or env("HOSTNAME"), "node": env("NODE_NAME") or None, "time": now, "signals": signals}
    report["secrets"] = usersecrets.local_presence()  # env.secrets: names and present/missing, never a value
    return report


def is_rank0() -> bool:
    try:
        return read_rank_env().get("NODE_RANK") == "0"
    except OSError:
        return env("NODE_RANK", "") == "0"


# ---------------------------------------------------------------------------------- whole env
