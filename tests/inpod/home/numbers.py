"""Every number on the home page, enumerated: the page marks each value it shows (`data-k="<what>"`,
inpod/home/page.py `num`); `shown` collects them and every digit left outside one; `check` fails on a digit that
is not marked, on a marked value the test has no expectation for (a new number without a check), and on a value
that differs from the test's ground truth.

Pictures are not read here (`<svg>`, `<img>`: their axes are the plot's); the page's `<head>` repeats the header's
title.
"""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser
from typing import Any

from inpod import usage
from inpod.lib.pod import ago, clock

SKIPPED = ("svg", "script", "style", "head")


class _Numbers(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.values: dict[str, list[str]] = {}
        self.stray: list[str] = []
        self.key: str | None = None
        self.key_tag = ""
        self.key_depth = 0
        self.skip: list[str] = []
        self.buffer: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.skip:
            if tag == self.skip[-1]:
                self.skip.append(tag)
            return
        if tag in SKIPPED:
            self.skip.append(tag)
            return
        if self.key is not None:
            if tag == self.key_tag:
                self.key_depth += 1
            return
        key = dict(attrs).get("data-k")
        if key is not None:
            self.key, self.key_tag, self.key_depth, self.buffer = key, tag, 1, []

    def handle_endtag(self, tag: str) -> None:
        if self.skip:
            if tag == self.skip[-1]:
                self.skip.pop()
            return
        if self.key is not None and tag == self.key_tag:
            self.key_depth -= 1
            if self.key_depth == 0:
                self.values.setdefault(self.key, []).append("".join(self.buffer))
                self.key = None

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.key is not None:
            self.buffer.append(data)
        else:
            self.stray += re.findall(r"\S*\d\S*", data)


def shown(page: str) -> tuple[dict[str, list[str]], list[str]]:
    """(every marked value by its key, in page order; every word with a digit outside a marked value)."""
    parser = _Numbers()
    parser.feed(page)
    parser.close()
    return parser.values, parser.stray


def check(values: dict[str, list[str]], stray: list[str], expected: dict[str, Any]) -> list[str]:
    """What differs, in words (empty: every number is the test's). `expected[key]` is a string, a list of strings
    (every value of that key, in any order) or a predicate on the list of values."""
    problems = [f"numbers outside any marked value: {stray}"] if stray else []
    unchecked = sorted(set(values) - set(expected))
    if unchecked:
        problems.append(f"values shown that the test does not check (add each to its ground truth): {unchecked}")
    for key, want in expected.items():
        got = values.get(key, [])
        if callable(want):
            ok = bool(want(got))
        elif isinstance(want, list):
            ok = sorted(got) == sorted(want)
        else:
            ok = got == [want]
        if not ok:
            problems.append(f"{key}: shown {got!r}, expected {want!r}")
    return problems


NOW = time.time()
USAGE = {  # a usage record's buckets: today, 6 days ago (in the 7 days), 7 days ago (not)
    f"gpu-seconds.{time.strftime('%Y-%m-%d', time.gmtime(NOW))}": "5400",
    f"gpu-seconds.{time.strftime('%Y-%m-%d', time.gmtime(NOW - 6 * 86400))}": "1800",
    f"gpu-seconds.{time.strftime('%Y-%m-%d', time.gmtime(NOW - 7 * 86400))}": "36000",
    "last-record": str(int(NOW)),
}


def status_hours(data: dict[str, str], app: str, namespace: str) -> str:
    """The GPU-hours `make status` prints for an environment with this usage record (inpod/usage.py, its table)."""
    items = [
        {"kind": "StatefulSet", "metadata": {"name": app, "namespace": namespace}, "spec": {"replicas": 2}},
        {"kind": "ConfigMap", "metadata": {"name": f"{app}-usage", "namespace": namespace}, "data": data},
    ]
    (row,) = usage.environments(items, time.time())
    return f"{row['gpuHoursWeek']:.2f}"


def idle_truth(decision: dict[str, Any], settings: dict[str, Any], now: float) -> dict[str, str]:
    """The idle card's values for pod 0's agent's decision (`GET /decision`), to the second, at the page's `now`."""
    last = float(decision["lastActive"])
    stop_at = last + settings["idleTimeoutSeconds"]
    out = {"why": decision["reason"], "last-active": clock(last), "last-active-ago": ago(now - last), "stop-at": clock(stop_at)}
    if decision.get("warning"):
        out["stop-in"] = ago(stop_at - now)
    elif now - last >= max(90.0, 2 * settings["intervalSeconds"]):
        out.update({"stop-in": ago(stop_at - now), "idle-for": ago(now - last)})
    return out
