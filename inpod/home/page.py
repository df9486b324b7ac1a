"""ml-dev-env home page: one page that shows the whole environment at a glance (pod 0).

Standard library only, Python 3.8+. Started by startup.sh on pod 0 as the `home` dev server
(core/servers.py): it listens on the pod IP and the loopback (never a wildcard: nothing answers on the
SR-IOV interfaces net1..N), behind its own OAuth proxy sidecar and Route, the same OpenShift login as VS Code
and Jupyter. Its data is what the environment already collects:

* every pod's idle-agent report, `GET /activity` on the activity port (GPUs and their utilisation,
  terminals, SSH session records, launcher heartbeats) and pod 0's `GET /decision` (last activity, why,
  the pending stop warning); the page keeps the last hour of GPU utilisation it sampled;
* pod 0's state directory: `heartbeat/run-*.json` (`ml-dev run`s launched here), `ssh-sessions/<pid>`
  (user and client of each live SSH session), `idle-stop.json` (the last idle stop);
* the fabric gate's `fabric/latest.json` and its curve (`latest.svg`, redrawn when absent);
* the idle settings (`$ML_DEV_IDLE_SETTINGS`): whether the idle stop is on, its timeout.

Routes: `/` the page, `/fragment` its live part (the page's script swaps it in every
`refresh` seconds: no full reload), `/app.js`, `/fabric.svg`, `/healthz`. Everything that comes from
users (command lines, working directories, user names, pod names) is HTML-escaped; the page loads
nothing from the internet and runs no inline script (Content-Security-Policy `default-src 'self'`).

Usage: home_page.py serve [--listen HOST:PORT[,HOST:PORT]]   (default $ML_DEV_HOME_LISTEN, else $POD_IP and
127.0.0.1 on port 8090; `[v6]:port` for IPv6; port 0 picks a free port; the bound addresses are written to
$ML_DEV_STATE_DIR/home.addr, one a line)
       home_page.py render                       (the page once, to stdout)
Test overrides: ML_DEV_HOME_AGENTS "pod=host:port ..." (every pod's agent, rank order),
ML_DEV_HOME_INTERVAL (sampling seconds, default 30), ML_DEV_HOME_REFRESH (page refresh seconds, default 10).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import html
import shlex
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from .. import contract
from ..lib import http, usersecrets
from ..lib.http import fetch_json
from ..lib.pod import clock, env, idle_settings, pid_alive, read_json, read_rank_env, state_dir

HISTORY_SECONDS = 3600
PORT = 8090
"""The page's port when --listen names none (core/servers.py, the home row)."""
LINKS = (("vscode", "VS Code"), ("jupyter", "Jupyter"), ("tensorboard", "TensorBoard"))


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


try:  # imported at start, never later: the kubelet removes the old `..<timestamp>` directory after a `..data`
    # swap (kubernetes pkg/volume/util/atomic_writer.go, AtomicWriter.Write); without it the page shows no plot
    from . import svgplot as SVGPLOT
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


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


# ------------------------------------------------------------------------------------ collection


class Collector:
    """Samples every pod's agent; keeps an hour of GPU utilisation per pod and the GPU-seconds seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.history: dict[str, deque[tuple[float, list[float]]]] = {}
        self.reports: dict[str, dict[str, Any]] = {}
        self.decision: dict[str, Any] | None = None
        self.errors: dict[str, str] = {}
        self.gpu_seconds = 0.0
        self.busy_gpu_seconds = 0.0
        self.last_sample: float | None = None
        self.started = time.time()
        self.pods: list[str] = []

    def sample(self, now: float | None = None) -> None:
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
        threshold = float(settings.get("gpuUtilThreshold", 5))
        with self.lock:
            dt = min(now - self.last_sample, 300.0) if self.last_sample is not None else 0.0
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
                self.gpu_seconds += dt * len(utils)
                self.busy_gpu_seconds += dt * sum(1 for u in utils if u >= threshold)
            self.pods = [p for p, _ in pods]

    def loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # the page must keep serving whatever one round hit
                print(f"[home-page] sample failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            stop.wait(interval)


def gpu_list(report: dict[str, Any]) -> list[dict[str, Any]]:
    for s in report.get("signals", []):
        if s.get("name") == "gpu" and s.get("ok"):
            return list(s.get("detail", {}).get("gpus", []))
    return []


def signal_of(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((s for s in report.get("signals", []) if s.get("name") == name), None)


# ---------------------------------------------------------------------------------------- pieces


def section(title: str, body: str, cls: str = "") -> str:
    return f'<section class="card {cls}"><h2>{esc(title)}</h2>{body}</section>'


def app_name() -> str:
    """The stack's app name: APP_NAME when set, else from the pod's name `<app>-<ordinal>` (a StatefulSet's
    pods; the rendered env carries POD_NAME and POD_NAMESPACE, the app name only cluster.env)."""
    if env("APP_NAME"):
        return env("APP_NAME")
    app, _, ordinal = env("POD_NAME").rpartition("-")
    return app if ordinal.isdigit() else ""


def links_html(settings: dict[str, Any]) -> str:
    app, ns = app_name(), env("POD_NAMESPACE")
    enabled = env("ML_DEV_SERVERS").split()  # the pod's enabled dev servers (components/pod.py); unset: all
    items = []
    for name, title in LINKS:
        if enabled and name not in enabled:
            continue
        # The Routes are <app>-<server>-<namespace>.<apps domain>: app.js derives each from this page's host.
        items.append(f'<a class="ide" data-server="{esc(name)}" href="#">{esc(title)}</a>')
    return f'<nav id="links" data-app="{esc(app)}" data-namespace="{esc(ns)}">{" ".join(items)}</nav>'


def idle_html(col: Collector, settings: dict[str, Any], now: float) -> str:
    decision = col.decision or {}
    stop_record = read_json(state_dir() / contract.IDLE_STOP_FILE)
    rows = []
    if not settings.get("enabled"):
        state, cls = "idle stop is off: this environment runs until someone stops it", "neutral"
    elif decision.get("lastActive") is not None:
        last = float(decision["lastActive"])
        stop_at = last + float(settings["idleTimeoutSeconds"])
        left = stop_at - now
        if decision.get("warning"):
            state, cls = f"idle: stops at {clock(stop_at)} (in {ago(left)}) unless something happens", "warn"
        elif now - last < max(90.0, 2 * float(settings.get("intervalSeconds", 60))):  # active at the agent's last round
            state, cls = f"in use: would stop at {clock(stop_at)} if nothing happens from now", "ok"
        else:
            state, cls = f"idle for {ago(now - last)}: stops at {clock(stop_at)} (in {ago(left)})", "warn"
        rows.append(f"<li>why: {esc(decision.get('reason', '?'))}</li>")
        rows.append(f"<li>last activity: {esc(clock(last))} ({esc(ago(now - last))} ago)</li>")
    else:
        state, cls = "idle stop is on; pod 0's agent has not answered yet", "neutral"
    if isinstance(stop_record, dict) and stop_record.get("stoppedAt"):
        rows.append(f"<li>last idle stop: {esc(stop_record['stoppedAt'])} ({esc(stop_record.get('lastActivityReason', ''))})</li>")
    return section("Idle stop", f'<p id="idle-state" class="{cls}">{esc(state)}</p><ul>{"".join(rows)}</ul>')


def pods_html(col: Collector, plots: Any) -> str:
    rows = []
    for rank, pod in enumerate(getattr(col, "pods", [])):
        report = col.reports.get(pod)
        if report is None:
            rows.append(
                f'<tr class="bad"><td>{rank}</td><td>{esc(pod)}</td><td colspan="3">agent unreachable: '
                f"{esc(col.errors.get(pod, '?'))}</td></tr>"
            )
            continue
        gpus = gpu_list(report)
        gpu_signal = signal_of(report, "gpu") or {}
        busy = {str(b) for b in gpu_signal.get("detail", {}).get("busy", [])}  # GPU indexes as strings (or "other")
        cells = " ".join(
            f'<span class="gpu {"busy" if str(g["index"]) in busy else "idle"}" title="{esc(g.get("uuid", ""))}">'
            f"GPU {esc(g['index'])}: {esc('n/a' if g.get('util') is None else int(g['util']))}%"
            f"{' busy' if str(g['index']) in busy else ' idle'}</span>"
            for g in gpus
        )
        if not gpus:
            cells = f'<span class="gpu bad">GPUs unreadable: {esc(gpu_signal.get("detail", {}).get("error", "no report"))}</span>'
        history = list(col.history.get(pod, []))
        plot = ""
        if plots is not None and len(history) >= 2:
            t0 = history[-1][0]
            count = max(len(u) for _, u in history)
            series = [{"label": f"GPU {i}", "points": [((t - t0) / 60, u[i]) for t, u in history if i < len(u)]} for i in range(count)]
            plot = plots.line_chart(series, width=320, height=110, y_max=100, x_range=(-60, 0), legend=False, x_label="minutes ago (GPU %)")
        ssh = signal_of(report, "ssh") or {}
        launcher = signal_of(report, "launcher") or {}
        sessions = len(ssh.get("detail", {}).get("records", [])) + len(ssh.get("detail", {}).get("sessionProcesses", []))
        runs = len(launcher.get("detail", {}).get("runs", []))
        rows.append(
            f"<tr><td>{rank}</td><td>{esc(pod)}<br><small>node {esc(report.get('node') or '?')}</small></td>"
            f'<td class="gpus">{cells}</td><td class="plot">{plot}</td>'
            f"<td>{sessions} SSH, {runs} ml-dev</td></tr>"
        )
    head = "<tr><th>rank</th><th>pod</th><th>GPUs now</th><th>utilisation, last hour</th><th>sessions</th></tr>"
    hours = col.gpu_seconds / 3600
    busy_hours = col.busy_gpu_seconds / 3600
    since = clock(col.started)
    footer = f'<p id="gpu-hours">GPU-hours since {esc(since)}: {hours:.2f} held, {busy_hours:.2f} busy</p>'
    return section("Pods", f'<table id="pods">{head}{"".join(rows)}</table>{footer}')


def sessions_html(now: float) -> str:
    runs, ssh = [], []
    for beat in sorted((state_dir() / contract.HEARTBEAT_DIR).glob("run-*.json")):
        info = read_json(beat)
        if not isinstance(info, dict) or now - float(info.get("alive_at", 0)) > 60:
            continue
        command = info.get("command")
        text = shlex.join([str(c) for c in command]) if isinstance(command, list) else str(command)
        started = float(info.get("started", now))
        runs.append(
            f'<li class="run"><code>{esc(text)}</code> in <code>{esc(info.get("cwd", "?"))}</code>, '
            f"{esc(len(info.get('pods', [])))} pods, running {esc(ago(now - started))}</li>"
        )
    for record in sorted((state_dir() / contract.SSH_SESSIONS_DIR).glob("[0-9]*")):
        if not pid_alive(int(record.name)):
            continue
        with contextlib.suppress(OSError):
            lines = [*record.read_text().splitlines(), "", "", ""]
            client = lines[2].split()[0] if lines[2].split() else "?"
            ssh.append(f'<li class="ssh">{esc(lines[1] or "?")} from {esc(client)} (pid {esc(record.name)})</li>')
    body = "<h3>ml-dev runs (launched on pod 0)</h3>"
    body += f"<ul>{''.join(runs)}</ul>" if runs else "<p>none</p>"
    body += "<h3>SSH sessions on pod 0</h3>"
    body += f"<ul>{''.join(ssh)}</ul>" if ssh else "<p>none</p>"
    return section("Running", body)


def fabric_result() -> dict[str, Any] | None:
    for d in (state_dir() / "fabric", Path(env("ML_DEV_WORKSPACE", "/workspace")) / ".ml-dev-env" / "fabric"):
        found = read_json(d / "latest.json")
        if isinstance(found, dict):
            return found
    return None


def fabric_svg(result: dict[str, Any], plots: Any) -> str | None:
    for d in (state_dir() / "fabric", Path(env("ML_DEV_WORKSPACE", "/workspace")) / ".ml-dev-env" / "fabric"):
        with contextlib.suppress(OSError):
            if (d / "latest.json").exists() and (d / "latest.svg").exists():
                return (d / "latest.svg").read_text()
    return plots.gate_curve(result) if plots is not None else None


def fabric_html(plots: Any) -> str:
    result = fabric_result()
    if result is None:
        return section("Fabric check", '<p id="fabric-status" class="neutral">no fabric check has run</p>')
    status = str(result.get("status", "?"))
    cls = {"pass": "ok", "fail": "bad", "error": "bad"}.get(status, "neutral")
    text = f"{status.upper()} at {result.get('time', '?')}"
    if result.get("plateauBusbw") is not None:
        text += f": plateau {result['plateauBusbw']} GB/s"
    exp = result.get("expectation") or {}
    if exp.get("pass_busbw_gbs"):
        text += f", pass at {exp['pass_busbw_gbs']} GB/s"
    diagnosis = "".join(f"<li>{esc(d)}</li>" for d in result.get("diagnosis", []))
    plot = '<img id="fabric-curve" src="fabric.svg" alt="bus bandwidth against message size">' if result.get("sizes") else ""
    return section("Fabric check", f'<p id="fabric-status" class="{cls}">{esc(text)}</p><ul>{diagnosis}</ul>{plot}', cls)


def fragment(col: Collector, now: float | None = None) -> str:
    now = time.time() if now is None else now
    settings = settings_or_defaults()
    plots = svgplot()
    with col.lock:
        parts = [idle_html(col, settings, now), pods_html(col, plots), sessions_html(now), fabric_html(plots)]
        parts.append(usersecrets.reports_section(list(getattr(col, "pods", [])), col.reports))  # names only
    return f'<div id="live" data-updated="{esc(clock(now))}">{"".join(parts)}<p class="small">updated {esc(clock(now))}</p></div>'


STYLE = """
body{font-family:system-ui,sans-serif;margin:0;background:#f4f5f7;color:#222}
header{background:#151c28;color:#fff;padding:12px 20px}header h1{font-size:20px;margin:0 0 8px 0}
nav a{color:#fff;background:#2c6ecb;padding:4px 10px;border-radius:4px;margin-right:8px;text-decoration:none}
main{padding:12px 20px}.card{background:#fff;border-radius:6px;padding:8px 16px;margin-bottom:12px;box-shadow:0 1px 2px #0002}
h2{font-size:16px;margin:6px 0}h3{font-size:14px;margin:6px 0}table{border-collapse:collapse}
td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
.gpu{display:inline-block;padding:1px 6px;margin:1px;border-radius:3px;font-size:12px}
.gpu.busy{background:#1e8e3e;color:#fff}.gpu.idle{background:#e0e0e0}.gpu.bad,.bad{color:#b00020}
.ok{color:#1e8e3e;font-weight:bold}.warn{color:#b06000;font-weight:bold}.neutral{color:#555}
section.bad{border-left:6px solid #b00020}#fabric-status.bad{font-weight:bold}.small{font-size:11px;color:#777}
code{background:#f0f0f0;padding:1px 3px}
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


def page(col: Collector) -> str:
    title = f"{app_name() or 'ml-dev-env'} home"
    refresh = int(float(env("ML_DEV_HOME_REFRESH", "10")))
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        '<link rel="icon" href="data:,"><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}</style></head>"
        f'<body data-refresh="{refresh}"><header><h1>{esc(title)}</h1>{links_html(settings_or_defaults())}</header>'
        f'<main>{fragment(col)}</main><script src="app.js"></script></body></html>\n'
    )


# ---------------------------------------------------------------------------------------- server

CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'"


class Handler(BaseHTTPRequestHandler):
    collector: Collector = Collector()

    def do_GET(self) -> None:  # http.server's method name
        path = self.path.split("?", 1)[0]
        col = self.collector
        if path == "/":
            self.reply(page(col), "text/html; charset=utf-8")
        elif path == "/fragment":
            self.reply(fragment(col), "text/html; charset=utf-8")
        elif path == "/app.js":
            self.reply(APP_JS, "text/javascript; charset=utf-8")
        elif path == "/fabric.svg":
            result = fabric_result()
            svg = fabric_svg(result, svgplot()) if result else None
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
    threading.Thread(target=collector.loop, args=(float(env("ML_DEV_HOME_INTERVAL", "30")), stop), daemon=True).start()
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
        sys.stdout.write(page(collector))
        return 0
    return serve_page(args.listen)


if __name__ == "__main__":
    sys.exit(main())
