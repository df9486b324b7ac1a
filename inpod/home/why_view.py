"""The home page's "Stall verdicts" section: the last `ml-dev why` verdict of each live run launched on this pod.

A live run is a fresh `heartbeat/run-<pid>.json` of this pod's state directory (the launcher rewrites it every 10 s);
its verdict is `$ML_DEV_WORKSPACE/.ml-dev-env/runs/<run>/why/latest.json` (inpod/ml_dev/why.py keep_local). Shown:
the verdict's rank, pod, node, frame and age; everything HTML-escaped (frames and pod names come from users' code and
stacks). Standard library only, Python 3.8+.
"""

from __future__ import annotations

import json
import time
from html import escape
from pathlib import Path
from typing import Any

from .. import contract
from ..lib.pod import env, state_dir

ALIVE_SECONDS = 60
"""A run heartbeat older than this is a run that ended without removing it."""


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def live_runs(now: float) -> list[str]:
    """The run ids of this pod's live `ml-dev run`s (newest first)."""
    found = []
    for path in (state_dir() / contract.HEARTBEAT_DIR).glob("run-*.json"):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("run") and now - float(info.get("alive_at", 0)) <= ALIVE_SECONDS:
            found.append(str(info["run"]))
    return sorted(found, reverse=True)


def last_verdict(run: str) -> dict[str, Any] | None:
    path = Path(env("ML_DEV_WORKSPACE", "/workspace")) / contract.RUNS_DIR / run / contract.WHY_LATEST
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record.get("verdict") if isinstance(record, dict) and isinstance(record.get("verdict"), dict) else None


def why_html(now: float | None = None) -> str:
    """The section's HTML (a card, like the page's others); empty when no live run exists."""
    now = time.time() if now is None else now
    runs = live_runs(now)
    if not runs:
        return ""
    items = []
    for run in runs:
        v = last_verdict(run)
        r = escape(run)
        if v is None:
            items.append(f'<li class="why neutral" data-run="{r}">run <code>{r}</code>: no verdict yet (ml-dev why)</li>')
            continue
        kind = str(v.get("kind", "?"))
        s = v.get("straggler") or {}
        cls = {"straggler": "bad", "no-straggler": "ok"}.get(kind, "neutral")
        if s:
            ranks = escape(", ".join(str(x) for x in s.get("ranks", [])))
            node = f", node {escape(str(s['node']))}" if s.get("node") else ""
            what = (
                f'<span class="why-rank">rank {ranks}</span> on <span class="why-pod">{escape(str(s.get("pod", "?")))}</span>{node}: '
                f'<code class="why-frame">{escape(str(s.get("frame", "?")))}</code>'
            )
        else:
            what = escape(kind.replace("-", " "))
        age = escape(_age(now - float(v.get("time", now))))
        text = escape(str(v.get("text", "")))
        items.append(
            f'<li class="why {cls}" data-run="{r}">run <code>{r}</code>: {what} '
            f'<span class="small why-age">({age})</span><br><span class="small">{text}</span></li>'
        )
    return f'<section class="card why" id="why"><h2>Stall verdicts (ml-dev why)</h2><ul>{"".join(items)}</ul></section>'
