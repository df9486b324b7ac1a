"""The home page's "Stall verdicts" card: the last `ml-dev why` verdict of each live run launched on this pod (a run with
no verdict yet is not listed; no such run, no card).

A live run is a fresh `heartbeat/run-<pid>.json` of this pod's state directory (the launcher rewrites it every 10 s);
its verdict is `$ML_DEV_WORKSPACE/.ml-dev-env/env/<app>/runs/<run>/why/latest.json` (inpod/ml_dev/why.py keep_local). Shown:
the verdict's kind (undecided as undecided), rank, pod, node, frame and age, and each rank it could not see and why;
everything HTML-escaped (frames and pod names come from users' code and stacks), every value marked by the page's
`num` (handed in: the page imports this module). Standard library only, Python 3.8+.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Callable

from .. import contract
from ..lib.pod import ago, env_records_dir, state_dir

ALIVE_SECONDS = 60
"""A run heartbeat older than this is a run that ended without removing it."""


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
    path = env_records_dir(migrate=False) / contract.RUNS_SUBDIR / run / contract.WHY_LATEST
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record.get("verdict") if isinstance(record, dict) and isinstance(record.get("verdict"), dict) else None


def why_html(now: float, mark: Callable[[str, object], str]) -> str:
    """The card's HTML ("" when no live run has a verdict); `mark(key, value)` is the page's `num` (escapes, marks)."""
    items = []
    for run in live_runs(now):
        v = last_verdict(run)
        if v is None:
            continue
        kind = str(v.get("kind", "?"))
        s = v.get("straggler") or {}
        cls = {"straggler": "bad", "no-straggler": "ok"}.get(kind, "neutral")
        if s:
            node = f", node {mark('why-node', s['node'])}" if s.get("node") else ""
            what = (
                f'rank <span class="why-rank">{mark("why-rank", ", ".join(str(x) for x in s.get("ranks", [])))}</span> on '
                f'<span class="why-pod">{mark("why-pod", s.get("pod", "?"))}</span>{node}: '
                f'<code class="why-frame">{mark("why-frame", s.get("frame", "?"))}</code>'
            )
        else:
            what = escape(kind.replace("-", " "))
        # the ranks the verdict could not see (not Python, py-spy refused or missing, a pod that did not answer): an
        # undecided verdict reads as undecided, with who was not seen and why
        unseen = [str(x) for x in v.get("not_seen") or []]
        listed = "".join(f'<li class="why-unseen">{mark("why-unseen", line)}</li>' for line in unseen)
        unseen_html = f'<br><span class="small">not seen:</span><ul class="small">{listed}</ul>' if unseen else ""
        items.append(
            f'<li class="why {cls}" data-run="{escape(run)}">run <code>{mark("why-run", run)}</code>: {what} '
            f'<span class="small why-age">({mark("why-age", ago(now - float(v.get("time", now))) + " ago")})</span><br>'
            f'<span class="small">{mark("why-text", v.get("text", ""))}</span>{unseen_html}</li>'
        )
    if not items:
        return ""
    return f'<section id="card-why" class="card why"><h2>Stall verdicts (ml-dev why)</h2><ul>{"".join(items)}</ul></section>'
