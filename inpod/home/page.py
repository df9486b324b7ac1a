"""ml-dev-env home page: one page that shows the whole environment at a glance (pod 0).

Standard library only, Python 3.8+. Started by startup.sh on pod 0 as the `home` dev server
(core/servers.py): it listens on the pod IP and the loopback (never a wildcard: nothing answers on the
SR-IOV interfaces net1..N), behind its own OAuth proxy sidecar and Route, the same OpenShift login as VS Code
and Jupyter. Its data is what the environment already collects:

* every pod's idle-agent report, `GET /activity` on the activity port (GPUs and their utilisation, SSH sessions
  with their user, client connection and the `ml-dev` launcher that opened them, launcher heartbeats with each
  `ml-dev run`'s command) and pod 0's `GET /decision` (last activity, why, the pending stop warning);
* what it counts: a pod's SSH figure is people's connections (one per client connection, whatever sessions it
  carries; ml-dev's own connections belong to their run), its ml-dev figure the ranks running on it; *Running*
  lists the runs and the connections;
* the last hour of GPU utilisation it sampled, kept in the environment's records folder of the workspace
  (`.ml-dev-env/env/<app>/home/history.json`): a
  restarted page keeps it; each pod's plot spans the samples held and says since when;
* GPU-hours: the environment's usage record (`<app>-usage`, the last 7 days, inpod/usage.py `week_hours`), read
  with the pods' ServiceAccount;
* pod 0's `idle-stop.json` (the last idle stop); the fabric gate's `fabric/latest.json` and its curve
  (`latest.svg`, redrawn when absent); the idle settings (`$ML_DEV_IDLE_SETTINGS`).

Layout: one table of sections (`SECTIONS`); the first screen (1280x800) holds the idle state, the pods and the
fabric curve. Every value shown is marked with what it is (`num`, `data-k`): the tests check each.

Routes: `/` the page, `/fragment` its live part (the page's script swaps it in every
`refresh` seconds: no full reload; both drawn from a round of the agents at most half a refresh old, so a change
shows by the second refresh after it: `Collector.fresh`), `/app.js`, `/fabric.svg`, `/healthz`. Everything that comes from
users (command lines, working directories, user names, pod names) is HTML-escaped; the page loads
nothing from the internet and runs no inline script (Content-Security-Policy `default-src 'self'`).

Usage: home_page.py serve [--listen HOST:PORT[,HOST:PORT]]   (default $ML_DEV_HOME_LISTEN, else $POD_IP and
127.0.0.1 on port 8090; `[v6]:port` for IPv6; port 0 picks a free port; the bound addresses are written to
$ML_DEV_STATE_DIR/home.addr, one a line)
       home_page.py render                       (the page once, to stdout)
Test overrides: ML_DEV_HOME_AGENTS "pod=host:port ..." (every pod's agent, rank order),
ML_DEV_HOME_INTERVAL (sampling seconds while no page asks, default 30), ML_DEV_HOME_REFRESH (page refresh seconds, default 10).

Why one module: the page's sampler, its HTTP handler and its HTML are one program that ships as one file of its
family; the views with logic of their own are modules of the family (why_view.py) or the package's lib (lib/svgplot.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import html
import json
import shlex
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from .. import contract, usage
from ..lib import http, kube, ledger, usersecrets
from ..lib.http import fetch_json
from ..lib.pod import (
    ago,
    app_name,
    clock,
    env,
    env_records_dir,
    environment_record,
    environment_summary,
    idle_settings,
    mount_dir,
    mounted_models,
    read_json,
    read_rank_env,
    state_dir,
)
from .why_view import why_html

HISTORY_SECONDS = 3600
PORT = 8090
"""The page's port when --listen names none (core/servers.py, the home row)."""
FIELD_MANAGER = "ml-dev-env-home"
"""The page's User-Agent towards the API (it only reads)."""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


try:  # imported at start, never later: the kubelet removes the old `..<timestamp>` directory after a `..data`
    # swap (kubernetes pkg/volume/util/atomic_writer.go, AtomicWriter.Write); without it the page shows no plot
    from ..lib import svgplot as SVGPLOT
except ImportError:  # pragma: no cover
    SVGPLOT = None  # type: ignore[assignment]


def svgplot() -> Any:
    return SVGPLOT


def settings_or_defaults() -> dict[str, Any]:
    """idle.json over the contract's defaults; unreadable: the defaults (the page shows the idle stop as off)."""
    try:
        return idle_settings()
    except (OSError, ValueError):
        return dict(contract.IDLE_DEFAULTS)


def agents(settings: dict[str, Any]) -> list[tuple[str, str]]:
    """(pod, agent base URL) of every pod in rank order."""
    override = env("ML_DEV_HOME_AGENTS")
    if override:
        return [(p.split("=", 1)[0], "http://" + p.split("=", 1)[1]) for p in override.split()]
    rank = read_rank_env(missing_ok=True)  # nothing yet: the page shows what it has
    pods, hosts = rank.get("ML_DEV_PODS", "").split(), rank.get("ML_DEV_HOSTS", "").split()
    count = len(pods) if len(pods) == len(hosts) else 0  # a half-written rank.env names no pod
    return [(pods[i], f"http://{hosts[i]}:{settings['activityPort']}") for i in range(count)]


# ------------------------------------------------------------------------------------ collection


def history_file() -> Path:
    """Where the page keeps the GPU utilisation it sampled (the workspace: it outlives the page's process and the
    container, as the fabric gate's results do)."""
    return env_records_dir() / "home" / "history.json"


class Collector:
    """Samples every pod's agent and the environment's usage record; keeps an hour of GPU utilisation per pod (saved
    to `history_file()` after each round and read back at start: a restarted page keeps what it sampled)."""

    def __init__(self, history: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.sampling = threading.Lock()
        """Held for a whole round (`sample`); `lock` only while a round's results are stored or a page is drawn."""
        self.history_path = history_file() if history is None else history
        self.history: dict[str, deque[tuple[float, list[float]]]] = self.load_history()
        self.reports: dict[str, dict[str, Any]] = {}
        self.decision: dict[str, Any] | None = None
        self.errors: dict[str, str] = {}
        self.usage: dict[str, Any] = {"error": "not read yet"}
        self.last_sample: float | None = None
        self.pods: list[str] = []

    def load_history(self) -> dict[str, deque[tuple[float, list[float]]]]:
        found = read_json(self.history_path)
        out: dict[str, deque[tuple[float, list[float]]]] = {}
        if not isinstance(found, dict):
            return out
        now = time.time()
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            for pod, samples in (found.get("samples") or {}).items():
                kept = [(float(t), [float(u) for u in utils]) for t, utils in samples if float(t) >= now - HISTORY_SECONDS]
                out[str(pod)] = deque(sorted(kept))
        return out

    def save_history(self) -> None:
        data = {"samples": {pod: [[t, u] for t, u in series] for pod, series in self.history.items()}}
        with contextlib.suppress(OSError):
            self.history_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.history_path.with_name(self.history_path.name + ".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.history_path)

    def sample(self, now: float | None = None) -> None:
        """One round: every pod's `/activity` and pod 0's `/decision` (one round at a time: the loop's and `fresh`'s)."""
        with self.sampling:
            self._sample(now)

    def fresh(self, max_age: float) -> None:
        """Make what is served come from a round that started at most `max_age` seconds before this call: a round now
        unless one did (requests that ask together share it). `/` and `/fragment` ask for half the page's refresh
        interval, so whatever the sampling interval, a change the agents report is on the page by the second refresh
        that starts after it (that refresh's request comes a refresh interval after the first, its round half an
        interval before it at the earliest). The agents answer `/activity` from the pod's records at that moment."""
        asked = time.time()
        with self.sampling:
            if self.last_sample is None or self.last_sample < asked - max_age:
                try:
                    self._sample()
                except Exception as exc:  # the page is served from the last round whatever this one hit
                    print(f"[home-page] sample failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _sample(self, now: float | None = None) -> None:
        settings = settings_or_defaults()
        pods = agents(settings)
        now = time.time() if now is None else now

        def one(item: tuple[str, str]) -> tuple[str, Any, str]:
            pod, base = item
            try:
                return pod, fetch_json(base + "/activity"), ""
            except (OSError, ValueError, urllib.error.URLError) as exc:
                return pod, None, str(exc)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(pods)))) as pool:
            results = list(pool.map(one, pods))
        decision = None
        if pods:
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                decision = fetch_json(pods[0][1] + "/decision")
        with self.lock:
            self.last_sample = now
            self.decision = decision
            self.reports, self.errors = {}, {}
            for pod, report, error in results:
                if report is None:
                    self.errors[pod] = error
                    continue
                self.reports[pod] = report
                utils = [float(g["util"] or 0) for g in gpu_list(report)]  # None: not reported ([N/A], MIG)
                series = self.history.setdefault(pod, deque())
                series.append((now, utils))
                while series and series[0][0] < now - HISTORY_SECONDS:
                    series.popleft()
            self.pods = [p for p, _ in pods]
            self.save_history()

    def sample_usage(self, now: float | None = None) -> None:
        found = read_usage(time.time() if now is None else now)
        with self.lock:
            self.usage = found

    def loop(self, interval: float, stop: threading.Event, work: Any = None) -> None:
        """`work` (default `sample`) every `interval` seconds until `stop`; the usage record is read in a loop of its
        own (`sample_usage`): an API that does not answer never holds up the agents' samples."""
        while not stop.is_set():
            try:
                (work or self.sample)()
            except Exception as exc:  # the page must keep serving whatever one round hit
                print(f"[home-page] sample failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            stop.wait(interval)


def read_usage(now: float) -> dict[str, Any]:
    """The environment's GPU-hours of the last 7 days: `usage.week_hours` of its usage record (the ConfigMap the
    usage recorder writes; `make status` prints the same figure). Read with the pods' ServiceAccount, whose reader
    Role may `list` the namespace's ConfigMaps (components/lifecycle.py usage_reader_rules): a list narrowed to the
    one name by a field selector (the API server authorizes it as a list, kubernetes
    staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go NewRequestInfo)."""
    ns, app = env("POD_NAMESPACE"), app_name()
    if not ns or not app:
        return {"error": "no namespace or app name in the pod's environment"}
    name = contract.usage_configmap(app)
    selector = urllib.parse.quote(f"metadata.name={name}")
    try:
        items = kube.Client(FIELD_MANAGER).call("GET", f"/api/v1/namespaces/{ns}/configmaps?fieldSelector={selector}", timeout=5)
        found = [i for i in (items.get("items") or []) if (i.get("metadata") or {}).get("name") == name]
    except (OSError, ValueError, AttributeError, urllib.error.URLError) as exc:
        return {"error": f"{name}: {exc}"}
    if not found:
        return {"error": f"no ConfigMap {name} in {ns}"}
    data = found[0].get("data") or {}
    return {"hours": usage.week_hours(data, now), "name": name}


def gpu_list(report: dict[str, Any]) -> list[dict[str, Any]]:
    for s in report.get("signals", []):
        if s.get("name") == "gpu" and s.get("ok"):
            return list(s.get("detail", {}).get("gpus", []))
    return []


def signal_of(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((s for s in report.get("signals", []) if s.get("name") == name), None)


def connections(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A person's SSH connections into the pod: one per client connection, however many sessions it carries
    (ssh's ControlMaster multiplexes), never ml-dev's own (rank start, rsync, tree hash: the sessions its launcher
    marked, inpod/sh/ssh-session.sh). The agent's sshd-process scan is not counted: it sees the same connections."""
    found: dict[str, dict[str, Any]] = {}
    for s in (signal_of(report, "ssh") or {}).get("detail", {}).get("sessions", []):
        if s.get("run"):
            continue
        conn = found.setdefault(str(s.get("connection")), {"user": s.get("user") or "?", "connection": s.get("connection"), "sessions": 0})
        conn["sessions"] += 1
    return [found[k] for k in sorted(found)]


def ranks(report: dict[str, Any]) -> int:
    """Ranks of `ml-dev run`/`exec` running on the pod: its rank agents' fresh heartbeats (`rank-<pid>.json`)."""
    runs = (signal_of(report, "launcher") or {}).get("detail", {}).get("runs", [])
    return sum(1 for r in runs if str(r).startswith("rank-"))


# ---------------------------------------------------------------------------------------- pieces


def num(key: str, value: object) -> str:
    """A value the page shows (a number, a time, or text that may hold digits), marked with what it is: every digit
    on the page is inside one of these (tests/inpod/home enumerates them and checks each against what it made)."""
    return f'<span data-k="{esc(key)}">{esc(value)}</span>'


def links() -> list[tuple[str, str]]:
    """(server, title) of the dev servers to link to: the render's list beside the program (contract
    HOME_LINKS_FILE, the stack's enabled servers with core/servers.py's titles), read at every render; none without
    it (a page run outside a pod)."""
    found = read_json(mount_dir("home_page.py") / contract.HOME_LINKS_FILE)
    if not isinstance(found, list):
        return []
    return [(str(p[0]), str(p[1])) for p in found if isinstance(p, list) and len(p) == 2]


def links_html() -> str:
    app, ns = app_name(), env("POD_NAMESPACE")
    # The Routes are <app>-<server>-<namespace>.<apps domain>: app.js derives each from this page's host.
    items = [f'<a class="ide" data-server="{esc(name)}" href="#">{esc(title)}</a>' for name, title in links()]
    return f'<nav id="links" data-app="{esc(app)}" data-namespace="{esc(ns)}">{" ".join(items)}</nav>'


class View:
    """What every section reads: the collector's last round, the idle settings, the time, the plot module."""

    def __init__(self, col: Collector, settings: dict[str, Any], now: float, plots: Any) -> None:
        self.col, self.settings, self.now, self.plots = col, settings, now, plots


def idle_html(v: View) -> tuple[str, str]:
    settings, now = v.settings, v.now
    decision = v.col.decision or {}
    stop_record = read_json(state_dir() / contract.IDLE_STOP_FILE)
    rows = []
    if not settings.get("enabled"):
        state, cls = esc("idle stop is off: this environment runs until someone stops it"), "neutral"
    elif decision.get("lastActive") is not None:
        last = float(decision["lastActive"])
        stop_at = last + float(settings["idleTimeoutSeconds"])
        at, left = num("stop-at", clock(stop_at)), num("stop-in", ago(stop_at - now))
        if decision.get("warning"):
            state, cls = f"idle: stops at {at} (in {left}) unless something happens", "warn"
        elif now - last < max(90.0, 2 * float(settings.get("intervalSeconds", 60))):  # active at the agent's last round
            state, cls = f"in use: would stop at {at} if nothing happens from now", "ok"
        else:
            state, cls = f"idle for {num('idle-for', ago(now - last))}: stops at {at} (in {left})", "warn"
        rows.append(f"<li>why: {num('why', decision.get('reason', '?'))}</li>")
        rows.append(f"<li>last activity: {num('last-active', clock(last))} ({num('last-active-ago', ago(now - last))} ago)</li>")
    else:
        state, cls = esc("idle stop is on; pod 0's agent has not answered yet"), "neutral"
    if isinstance(stop_record, dict) and stop_record.get("stoppedAt"):
        why = stop_record.get("lastActivityReason", "")
        rows.append(f"<li>last idle stop: {num('last-stop', stop_record['stoppedAt'])} ({num('last-stop-why', why)})</li>")
    return f'<p id="idle-state" class="{cls}">{state}</p><ul>{"".join(rows)}</ul>', ""


def utilisation_plot(pod: str, v: View) -> str:
    """One pod's GPU utilisation over the samples the page holds: its busiest GPU (highest mean) and the mean of all
    its GPUs, the x axis from the first sample held to now, in minutes; the legend (below the plot) and the caption
    name the busiest GPU, the caption since when."""
    history = list(v.col.history.get(pod, []))
    if v.plots is None or len(history) < 2:
        return ""
    count = max(len(u) for _, u in history)
    if not count:
        return ""
    means = [sum(u[i] for _, u in history if i < len(u)) / len(history) for i in range(count)]
    busiest = max(range(count), key=lambda i: (means[i], -i))
    t_last = history[-1][0]
    span = (history[0][0] - t_last) / 60
    series = [
        {"label": f"GPU {busiest} (busiest)", "points": [((t - t_last) / 60, u[busiest]) for t, u in history if busiest < len(u)]},
        {"label": f"mean of {count} GPUs", "points": [((t - t_last) / 60, sum(u) / len(u)) for t, u in history if u], "dash": True},
    ]
    svg = v.plots.line_chart(series, width=320, height=124, y_max=100, x_range=(span, 0), x_label="minutes before now")  # legend below
    caption = (
        f'<div class="cap">busiest: {num(f"busiest:{pod}", f"GPU {busiest}")} of {num(f"gpus:{pod}", count)}, '
        f"samples since {num(f'since:{pod}', clock(history[0][0]))}</div>"
    )
    return f'<div class="plot">{svg}{caption}</div>'


def pods_html(v: View) -> tuple[str, str]:
    col = v.col
    rows = []
    for rank, pod in enumerate(getattr(col, "pods", [])):
        report = col.reports.get(pod)
        name = f"{num(f'rank:{pod}', rank)} {num(f'pod:{rank}', pod)}"
        if report is None:
            error = num(f"error:{pod}", col.errors.get(pod, "?"))
            rows.append(f'<tr class="bad"><td>{name}</td><td colspan="2">agent unreachable: {error}</td></tr>')
            continue
        gpus = gpu_list(report)
        gpu_signal = signal_of(report, "gpu") or {}
        busy = {str(b) for b in gpu_signal.get("detail", {}).get("busy", [])}  # GPU indexes as strings (or "other")
        cells = " ".join(
            f'<span class="gpu {"busy" if str(g["index"]) in busy else "idle"}" title="{esc(g.get("uuid", ""))}" '
            f'data-k="gpu:{esc(pod)}:{esc(g["index"])}">'
            f"GPU {esc(g['index'])}: {esc('n/a' if g.get('util') is None else int(g['util']))}%"
            f"{' busy' if str(g['index']) in busy else ' idle'}</span>"
            for g in gpus
        )
        if not gpus:
            error = gpu_signal.get("detail", {}).get("error", "no report")
            cells = f'<span class="gpu bad">GPUs unreadable: {num(f"gpu-error:{pod}", error)}</span>'
        people = connections(report)
        rows.append(
            f"<tr><td>{name}<br><small>node {num(f'node:{pod}', report.get('node') or '?')}</small></td>"
            f'<td class="gpus">{cells}{utilisation_plot(pod, v)}</td>'
            f"<td>{num(f'ssh:{pod}', len(people))} SSH<br>{num(f'ranks:{pod}', ranks(report))} ml-dev</td></tr>"
        )
    head = "<tr><th>rank, pod</th><th>GPUs now; utilisation, last hour</th><th>in use</th></tr>"
    usage_record, days = col.usage, num("usage-days", usage.WEEK_DAYS)
    if "hours" in usage_record:
        hours = f"{usage_record['hours']:.2f}"
        footer = f"GPU-hours, last {days} days: {num('gpu-hours-7d', hours)} (the environment's usage record, as make status shows it)"
    else:
        footer = f"GPU-hours, last {days} days: unknown ({num('gpu-hours-error', usage_record.get('error', '?'))})"
    return f'<table id="pods">{head}{"".join(rows)}</table><p id="gpu-hours">{footer}</p>', ""


def warm_items(v: View) -> list[str]:
    """Each pod's warm ranks (its idle agent's warm signal: the node's activity record) and its last cell's state."""
    items = []
    for pod in getattr(v.col, "pods", []):
        detail = (signal_of(v.col.reports.get(pod) or {}, "warm") or {}).get("detail", {})
        ranks_here = detail.get("ranks") or []
        if not ranks_here:
            continue
        last = detail.get("lastCell") or {}
        text = f"ranks {num(f'warm:{pod}:ranks', ','.join(map(str, ranks_here)))} on {num(f'warm:{pod}:pod', pod)}: "
        if not last:
            text += "no cell yet"
        elif last.get("state") == "running":
            since = float(last.get("started") or v.now)
            text += f"cell {num(f'warm:{pod}:cell', last.get('id'))} running for {num(f'warm:{pod}:age', ago(v.now - since))}"
        else:
            since = float(last.get("ended") or last.get("started") or v.now)
            cell = num(f"warm:{pod}:cell", last.get("id"))
            text += f"last cell {cell} {esc(last.get('state'))}, {num(f'warm:{pod}:age', ago(v.now - since))} ago"
        items.append(f'<li class="warm">{text}</li>')
    return items


def running_html(v: View) -> tuple[str, str]:
    """The `ml-dev run`s of every pod (their launchers' heartbeats) and the people's SSH connections into every pod."""
    col, now = v.col, v.now
    launches: list[tuple[float, str, dict[str, Any]]] = []
    conns: list[tuple[str, dict[str, Any]]] = []
    for pod in getattr(col, "pods", []):
        report = col.reports.get(pod) or {}
        for run in (signal_of(report, "launcher") or {}).get("detail", {}).get("launches", []):
            with contextlib.suppress(TypeError, ValueError):
                launches.append((float(run.get("started") or now), pod, run))
        conns += [(pod, c) for c in connections(report)]
    runs = []
    for i, (started, pod, run) in enumerate(sorted(launches, key=lambda r: (r[0], r[1]))):
        command = run.get("command")
        text = shlex.join([str(c) for c in command]) if isinstance(command, list) else str(command)
        runs.append(
            f'<li class="run"><code>{num(f"run:{i}:command", text)}</code> in <code>{num(f"run:{i}:cwd", run.get("cwd", "?"))}</code>, '
            f"launched on {num(f'run:{i}:on', pod)}: {num(f'run:{i}:pods', len(run.get('pods') or []))} pods, "
            f"running {num(f'run:{i}:age', ago(now - started))}</li>"
        )
    ssh = []
    for pod, c in conns:
        user, address = c["user"], str(c["connection"]).split()[0]
        who = f"{user} from {address}"
        several = f", {num(f'conn-sessions:{pod}', c['sessions'])} sessions" if c["sessions"] > 1 else ""
        ssh.append(f'<li class="ssh">{num(f"conn:{pod}", who)} into {num("conn-pod", pod)}{several}</li>')
    body = "<h3>ml-dev runs</h3>" + (f"<ul>{''.join(runs)}</ul>" if runs else "<p>none</p>")
    warm = warm_items(v)
    if warm:
        body += f"<h3>Warm ranks (ml-dev ranks)</h3><ul>{''.join(warm)}</ul>"
    body += "<h3>SSH connections (people's; ml-dev's own belong to its runs)</h3>" + (f"<ul>{''.join(ssh)}</ul>" if ssh else "<p>none</p>")
    return body, ""


def fabric_result() -> dict[str, Any] | None:
    for d in (state_dir() / "fabric", env_records_dir() / "fabric"):
        found = read_json(d / "latest.json")
        if isinstance(found, dict):
            return found
    return None


def fabric_svg(result: dict[str, Any], plots: Any) -> str | None:
    for d in (state_dir() / "fabric", env_records_dir() / "fabric"):
        with contextlib.suppress(OSError):
            if (d / "latest.json").exists() and (d / "latest.svg").exists():
                return (d / "latest.svg").read_text()
    return plots.gate_curve(result) if plots is not None else None


def fabric_html(v: View) -> tuple[str, str]:
    result = fabric_result()
    if result is None:
        return '<p id="fabric-status" class="neutral">no fabric check has run</p>', ""
    status = str(result.get("status", "?"))
    cls = {"pass": "ok", "fail": "bad", "error": "bad"}.get(status, "neutral")
    text = f"{esc(status.upper())} at {num('fabric-time', result.get('time', '?'))}"
    if result.get("plateauBusbw") is not None:
        text += f": plateau {num('plateau', result['plateauBusbw'])} GB/s"
    exp = result.get("expectation") or {}
    if exp.get("pass_busbw_gbs"):
        text += f", pass at {num('pass', exp['pass_busbw_gbs'])} GB/s"
    diagnosis = "".join(f"<li>{num('diagnosis', d)}</li>" for d in result.get("diagnosis", []))
    # a phone gets the curve drawn at its width (text drawn at its own size, never scaled under 11 px)
    narrow = f'<source media="(max-width: 600px)" srcset="fabric.svg?width={v.plots.NARROW}">' if v.plots is not None else ""
    img = '<img id="fabric-curve" src="fabric.svg" alt="bus bandwidth against message size">'
    plot = f"<picture>{narrow}{img}</picture>" if result.get("sizes") else ""
    return f'<p id="fabric-status" class="{cls}">{text}</p>{plot}<ul class="diagnosis">{diagnosis}</ul>', cls


def secrets_html(v: View) -> tuple[str, str]:
    """The Secrets card (inpod/lib/usersecrets.py: names and present/missing per pod, from the agents' reports); its
    own `<section>`, none when no secret is listed."""
    return usersecrets.reports_section(list(getattr(v.col, "pods", [])), v.col.reports), ""


def start_html(v: View) -> tuple[str, str]:
    """The last start's ledger (inpod/lib/ledger.py, kept by `ml-dev status --start` under the environment's records):
    the slowest pod and its dominant phase in one line, one row per pod, and the start against the previous one."""
    starts = ledger.kept(env_records_dir(migrate=False))
    if not starts:
        return '<p id="start-summary" class="neutral">no start recorded yet: <code>ml-dev status --start</code></p>', ""
    last = starts[-1]

    def seconds(key: str, value: Any) -> str:
        return num(key, "%.0f s" % float(value or 0))  # noqa: UP031 (no nested quotes in f-strings before 3.12)

    head = "".join(f"<th>{esc(p)}</th>" for p in contract.START_PHASES)
    rows = []
    for pod in last.get("pods", []):
        cells = "".join(
            f"<td>{seconds('start-' + str(p.get('phase')), p.get('seconds'))}</td>" if p.get("at") is not None else "<td>-</td>"
            for p in pod.get("phases", [])
        )
        wall = seconds("start-wall", pod.get("wall"))
        rows.append(f"<tr><td>{esc(pod.get('pod'))}</td><td>{esc(pod.get('node'))}</td>{cells}<td>{wall}</td></tr>")
    previous = ""
    if len(starts) > 1:  # each start against the one before it (inpod/lib/ledger.py compare)
        previous = f'<p id="start-previous" class="small">{num("start-previous", ledger.compare(last, starts[-2]))}</p>'
    summary = f'<p id="start-summary">{esc(ledger.start_summary(last))}</p>'
    table = f'<table id="start"><tr><th>pod</th><th>node</th>{head}<th>wall</th></tr>{"".join(rows)}</table>'
    return summary + table + previous, ""


def models_html(v: View) -> tuple[str, str]:
    """The models mounted from their images (models[].mountInEnv: inpod/lib/pod.py mounted_models), with their digests;
    no card where none is mounted."""
    models = mounted_models()
    if not models:
        return "", ""
    rows = "".join(
        f"<tr><td>{esc(m['name'])}</td><td><code>{esc(m['path'])}</code></td><td><code>{esc(m['digest'])}</code></td>"
        f"<td>{'mounted' if m['present'] else 'NOT MOUNTED'}</td></tr>"
        for m in models
    )
    table = f'<table id="models"><tr><th>model</th><th>path</th><th>digest</th><th>this pod</th></tr>{rows}</table>'
    cls = "" if all(m["present"] for m in models) else "bad"
    return f'<section id="card-models" class="card {cls}"><h2>Models</h2>{table}</section>', ""


def environment_html(v: View) -> tuple[str, str]:
    """The last drift gate of `ml-dev run` (inpod/ml_dev/envgate.py, under the environment's records): "one
    environment", or the ranks that differ with one line per difference and the command that aligns them."""
    record = environment_record()
    text = environment_summary(record)
    if not record:
        return f'<p id="environment-status" class="neutral">{esc(text)}</p>', ""
    if record.get("one_environment"):
        return f'<p id="environment-status" class="ok">{num("environment", text)}</p>', ""
    lines = record.get("lines")
    items = "".join(f"<li>{num('environment-line', line)}</li>" for line in (lines if isinstance(lines, list) else [])[:12])
    fix = f'<p class="small">align: <code>{num("environment-align", record["align"])}</code></p>' if record.get("align") else ""
    return f'<p id="environment-status" class="bad">{num("environment", text)}</p><ul class="diagnosis">{items}</ul>{fix}', "bad"


class Section:
    """One card of the page: `place` "main" (left of the first screen), "side" (right of it) or "wide" (below);
    `card` False: the builder's body is the whole card (or nothing)."""

    def __init__(self, name: str, title: str, build: Any, place: str, card: bool = True) -> None:
        self.name, self.title, self.build, self.place, self.card = name, title, build, place, card


SECTIONS: tuple[Section, ...] = (
    Section("idle", "Idle stop", idle_html, "main"),
    Section("pods", "Pods", pods_html, "main"),
    Section("fabric", "Fabric check", fabric_html, "side"),
    Section("environment", "Environment", environment_html, "side"),
    Section("running", "Running", running_html, "wide"),
    Section("start", "Last start", start_html, "wide"),
    Section("models", "Models", models_html, "wide", card=False),
    Section("secrets", "Secrets", secrets_html, "wide", card=False),
    Section("why", "Stall verdicts", lambda v: (why_html(v.now, num), ""), "wide", card=False),  # inpod/home/why_view.py
)
"""The page's sections in order, one row each: a new section is one row here (its builder takes a `View` and returns
its body and an extra CSS class; every value it shows goes through `num`). The first screen (1280x800) holds the
"main" and "side" ones."""


def fragment(col: Collector, now: float | None = None) -> str:
    now = time.time() if now is None else now
    view = View(col, settings_or_defaults(), now, svgplot())
    places: dict[str, list[str]] = {"main": [], "side": [], "wide": []}
    with col.lock:
        for s in SECTIONS:
            body, cls = s.build(view)
            card = f'<section id="card-{esc(s.name)}" class="card {cls}"><h2>{esc(s.title)}</h2>{body}</section>' if s.card else body
            places[s.place].append(card)
    first = f'<div class="first"><div class="main">{"".join(places["main"])}</div><div class="side">{"".join(places["side"])}</div></div>'
    return (
        f'<div id="live" data-now="{now:.3f}">{first}{"".join(places["wide"])}'
        f'<p class="small">updated {num("updated", clock(now))}</p></div>'
    )


STYLE = """
body{font-family:system-ui,sans-serif;margin:0;background:#f4f5f7;color:#222;font-size:14px}
header{background:#151c28;color:#fff;padding:8px 16px;display:flex;flex-wrap:wrap;align-items:center;gap:4px 16px}
header h1{font-size:18px;margin:0}
nav a{color:#fff;background:#2c6ecb;padding:3px 10px;border-radius:4px;margin-right:6px;text-decoration:none;display:inline-block}
main{padding:8px 12px}.card{background:#fff;border-radius:6px;padding:4px 12px 6px;margin-bottom:8px;box-shadow:0 1px 2px #0002}
.first{display:flex;gap:8px;align-items:flex-start}.first .main{flex:1 1 0;min-width:0}.first .side{flex:0 0 540px;min-width:0}
h2{font-size:16px;margin:4px 0}h3{font-size:14px;margin:6px 0}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
ul{margin:4px 0;padding-left:20px}p{margin:4px 0}
.gpu{display:inline-block;padding:1px 6px;margin:1px;border-radius:3px;font-size:12px}
.gpu.busy{background:#1e8e3e;color:#fff}.gpu.idle{background:#e0e0e0}.gpu.bad,.bad{color:#b00020}
.plot svg{display:block;max-width:100%;height:auto}.plot svg text{font-size:12px}.cap{font-size:12px;color:#555}
#fabric-curve{display:block;width:100%;height:auto}.diagnosis{font-size:12px}
.ok{color:#1e8e3e;font-weight:bold}.warn{color:#b06000;font-weight:bold}.neutral{color:#555}
section.bad{border-left:6px solid #b00020}#fabric-status.bad{font-weight:bold}.small{font-size:12px;color:#666}
code{background:#f0f0f0;padding:1px 3px;overflow-wrap:anywhere}li,td,p{overflow-wrap:anywhere}small{font-size:12px}
@media (max-width:900px){.first{display:block}.first .side{flex:none}}
@media (max-width:600px){#pods tr,#pods td,#pods th{display:block;border:0}#pods tr{border-bottom:1px solid #ddd;padding:4px 0}}
"""

APP_JS = """'use strict';
(function () {
  var nav = document.getElementById('links');
  var app = nav.getAttribute('data-app'), ns = nav.getAttribute('data-namespace');
  var host = window.location.hostname, mine = app + '-home-' + ns;
  nav.querySelectorAll('a.ide').forEach(function (a) {
    var server = a.getAttribute('data-server');
    if (app && ns && host.indexOf(mine) === 0) {
      a.href = window.location.protocol + '//' + app + '-' + server + '-' + ns + host.slice(mine.length) + '/';
    } else {
      a.removeAttribute('href');
      a.title = 'Route host unknown here';
    }
  });
  var every = parseInt(document.body.getAttribute('data-refresh'), 10) * 1000;
  function refresh() {
    fetch('fragment', {credentials: 'same-origin', cache: 'no-store'}).then(function (r) {
      if (!r.ok) { throw new Error('HTTP ' + r.status); }
      return r.text();
    }).then(function (text) {
      var live = document.getElementById('live');
      var next = new DOMParser().parseFromString(text, 'text/html').getElementById('live');
      if (live && next) { live.replaceWith(document.importNode(next, true)); }
    }).catch(function (err) {
      var live = document.getElementById('live');
      if (live) { live.setAttribute('data-stale', String(err)); }
    });
  }
  window.setInterval(refresh, every);
})();
"""


def refresh_seconds() -> int:
    """How often the page's script fetches `/fragment` (`data-refresh`): ML_DEV_HOME_REFRESH, default 10, at least 1."""
    return max(1, int(float(env("ML_DEV_HOME_REFRESH", "10"))))


def page(col: Collector) -> str:
    ns = env("POD_NAMESPACE")
    title = f"{app_name() or 'ml-dev-env'}" + (f" in {ns}" if ns else "") + " · home"
    refresh = refresh_seconds()
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        '<link rel="icon" href="data:,"><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}</style></head>"
        f'<body data-refresh="{refresh}"><header><h1>{num("title", title)}</h1>{links_html()}</header>'
        f'<main>{fragment(col)}</main><script src="app.js"></script></body></html>\n'
    )


# ---------------------------------------------------------------------------------------- server

CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'"


class Handler(BaseHTTPRequestHandler):
    collector: Collector = Collector()

    def do_GET(self) -> None:  # http.server's method name
        path = self.path.split("?", 1)[0]
        col = self.collector
        if path in ("/", "/fragment"):
            col.fresh(refresh_seconds() / 2)  # never older than half a refresh: a change shows within two (Collector.fresh)
            self.reply(page(col) if path == "/" else fragment(col), "text/html; charset=utf-8")
        elif path == "/app.js":
            self.reply(APP_JS, "text/javascript; charset=utf-8")
        elif path == "/fabric.svg":
            result = fabric_result()
            width = self.path.partition("?width=")[2]
            narrow = result is not None and width.isdigit() and svgplot() is not None and 240 <= int(width) <= 1200
            svg = svgplot().gate_curve(result, width=int(width)) if narrow else fabric_svg(result, svgplot()) if result else None
            if svg is None:
                self.send_error(404)
                return
            self.reply(svg, "image/svg+xml")
        elif path == "/healthz":
            self.reply("ok\n", "text/plain")
        else:
            self.send_error(404)

    def reply(self, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def serve_page(listen: str) -> int:
    try:
        addresses = http.listen_addresses(listen, PORT)
    except ValueError as exc:
        print(f"[home-page] {exc}", file=sys.stderr, flush=True)
        return 2
    collector = Collector()
    handler = type("BoundHandler", (Handler,), {"collector": collector})
    servers = http.bind(addresses, handler)
    stop = threading.Event()
    interval = float(env("ML_DEV_HOME_INTERVAL", "30"))
    threading.Thread(target=collector.loop, args=(interval, stop), daemon=True).start()
    threading.Thread(target=collector.loop, args=(interval, stop, collector.sample_usage), daemon=True).start()
    shown = http.shown(servers)
    with contextlib.suppress(OSError):
        state_dir().mkdir(parents=True, exist_ok=True)
        tmp = state_dir() / f"{contract.HOME_ADDR}.tmp"
        tmp.write_text("".join(f"{a}\n" for a in shown))
        tmp.replace(state_dir() / contract.HOME_ADDR)
    print(f"[home-page] serving on {' '.join(shown)}", flush=True)
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        servers[0].serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for server in servers:
            server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("command", choices=["serve", "render"])
    parser.add_argument("--listen", default=env("ML_DEV_HOME_LISTEN"))
    args = parser.parse_args(argv)
    if args.command == "render":
        collector = Collector()
        collector.sample()
        collector.sample_usage()
        sys.stdout.write(page(collector))
        return 0
    return serve_page(args.listen)


if __name__ == "__main__":
    sys.exit(main())
