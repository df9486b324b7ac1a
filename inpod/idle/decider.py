"""The idle agent's decision (pod 0): gathering every pod's signals, the idle clock, the warning, the scale to 0 and its record.

Shipped next to idle_agent.py (inpod.SHIPPED); Python 3.8+, standard library only.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .. import contract
from ..lib.http import fetch_json
from ..lib.kube import Client
from .probes import AGENT, env, local_activity, log, read_rank_env, signal, state_dir


def peers(settings: dict[str, Any]) -> list[tuple[str, str]]:
    """(pod, base URL) of every other pod, from rank.env (ML_DEV_PODS / ML_DEV_HOSTS, rank order)."""
    rank = read_rank_env()
    pods, hosts = rank.get("ML_DEV_PODS", "").split(), rank.get("ML_DEV_HOSTS", "").split()
    if not pods or len(pods) != len(hosts):
        raise ValueError("rank.env has no ML_DEV_PODS/ML_DEV_HOSTS pair")
    me = env("POD_NAME") or env("HOSTNAME")
    return [(pod, f"http://{host}:{settings['activityPort']}") for pod, host in zip(pods, hosts) if pod != me]  # same length: checked above


ACTIVITY_FETCH_SECONDS = contract.ACTIVITY_FETCH_SECONDS
"""How long pod 0 waits for a worker's /activity; probes.GPU_PROBE_SECONDS stays well below it (the worker's answer
runs its probes inline). Both are the contract's (inpod/contract.py)."""


def gather(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod's activity; an unreachable pod or an unreadable rank.env is one failed signal."""
    reports = [local_activity(settings)]
    try:
        others = peers(settings)
    except (OSError, ValueError) as exc:
        return [*reports, {"pod": "?", "time": time.time(), "signals": [signal("peers", False, error=str(exc))]}]
    got: dict[str, dict[str, Any]] = {}

    def ask(pod: str, base: str) -> None:
        try:
            got[pod] = fetch_json(f"{base}/activity", timeout=ACTIVITY_FETCH_SECONDS, connect_timeout=contract.ACTIVITY_CONNECT_SECONDS)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            got[pod] = {"pod": pod, "time": time.time(), "signals": [signal("reachable", False, error=str(exc))]}

    # every pod at once: a gone or slow pod costs the round its own wait, not one wait per such pod
    threads = [threading.Thread(target=ask, args=pair, daemon=True) for pair in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(contract.ACTIVITY_CONNECT_SECONDS + ACTIVITY_FETCH_SECONDS + 5)
    for pod, _ in others:  # rank order
        reports.append(got.get(pod) or {"pod": pod, "time": time.time(), "signals": [signal("reachable", False, error="no answer")]})
    return reports


class Decider:
    """The whole environment's idle clock (pod 0)."""

    def __init__(self, now: float | None = None, unreachable_seconds: float = contract.IDLE_DEFAULTS["unreachableSeconds"]) -> None:
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
        self.enabled = True
        """lifecycle.idleStop.enabled as last read (off: pod 0 gathers nothing, `status` says so)."""
        self.errors: dict[str, str] = {}
        """Worker pod → the last error seen reaching it (what `ml-dev status` shows)."""

    def status(self, now: float) -> dict[str, Any]:
        """What `idle_agent.py status` and `GET /decision` show."""
        return {
            "at": now,
            "enabled": self.enabled,
            "idleSeconds": round(now - self.last_active, 1),
            "lastActive": self.last_active,
            "reason": self.reason,
            "warning": self.warning,
            "unreachableSeconds": self.unreachable_seconds,
            "unreachable": {
                pod: {
                    "seconds": round(now - since, 1),
                    "since": since,
                    "writtenOff": pod in self.written_off,
                    "error": self.errors.get(pod, ""),
                }
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
                self.errors.pop(pod, None)
            else:
                since = self.unreachable_since.setdefault(pod, now)
                self.errors[pod] = str(unreachable["detail"].get("error", "?"))
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
        f"Each rank of `ml-dev run` then gets {env(contract.CHECKPOINT_SIGNAL_ENV, contract.SIGNAL_DEFAULT)} and "
        f"{env(contract.CHECKPOINT_GRACE_ENV, str(contract.GRACE_DEFAULT))} s to save a checkpoint: handle that signal in your job "
        "(docs: Use, 'Suspend, resume and idle stop', 'Checkpoint before a stop'). "
        "Resume later with `pulumi up --refresh`."
    )


def show_warning(text: str | None) -> None:
    """The warning file the shells print at each prompt; a banner to open terminals when it first appears."""
    path = state_dir() / contract.IDLE_WARNING_FILE
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
    kube = Client(AGENT)  # the agent's field manager on every write (lib/kube.py)
    scale_path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale"
    current = kube.call("GET", scale_path)
    before = int(current.get("spec", {}).get("replicas", 0))
    if before == 0:
        log("already scaled to 0")
        return True
    meta = current["metadata"]
    kube.call("PUT", scale_path, scale_body(name, ns, meta["resourceVersion"], 0))
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
        (state_dir() / contract.IDLE_STOP_FILE).write_text(json.dumps(record, indent=2))
    try:
        kube.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/configmaps/{settings['recordConfigMap']}",
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
    Client(AGENT).call("POST", f"/api/v1/namespaces/{ns}/events", body)


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
    write_status(decider, now)


def write_status(decider: Decider, now: float) -> None:
    """$ML_DEV_STATE_DIR/idle-status.json: pod 0's view each round (`idle_agent.py status`, `ml-dev status`)."""
    with contextlib.suppress(OSError):
        tmp = state_dir() / f"{contract.IDLE_STATUS_FILE}.tmp"
        tmp.write_text(json.dumps(decider.status(now), indent=2))
        tmp.replace(state_dir() / contract.IDLE_STATUS_FILE)


# ------------------------------------------------------------------------------------ the loop


def tick(settings: dict[str, Any], decider: Decider, now: float | None = None) -> str:
    """One round on pod 0: gather, decide, warn or stop. Returns 'active' | 'warn' | 'stop' | 'off'."""
    decider.enabled = bool(settings["enabled"])
    if not settings["enabled"]:
        show_warning(None)
        decider.warning = None
        decider.unreachable_since.clear()
        decider.written_off.clear()
        write_status(decider, time.time() if now is None else now)
        return "off"
    reports = gather(settings)
    now = time.time() if now is None else now
    decider.unreachable_seconds = float(settings.get("unreachableSeconds", contract.IDLE_DEFAULTS["unreachableSeconds"]))
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
