"""`ml-dev run`'s exit statuses (issue 45, item 4): the order of events, and the docs' table, each row pinned by a test."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from inpod.ml_dev.launch import OUTPUT_GONE_STATUS, RUN_EXIT_STATUSES, STOPPED_STATUS, Events

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs" / "ref" / "exit-codes.md"
STOP = "pod ml-dev-env-2 is stopping (SIGTERM from its stop hook)"


def test_a_failure_then_a_stop_keeps_the_failures_status_and_names_both() -> None:
    events = Events()
    events.failure(1, 3, "rank 1 (ml-dev-env-1) on host-1")
    events.note([], [STOP], [])
    assert events.status() == 3
    assert events.lines() == [
        "ml-dev: FAILED: rank 1 (ml-dev-env-1) on host-1 exited with status 3",
        f"ml-dev: then STOPPED: {STOP} (the status is the first's)",
    ]


def test_a_stop_then_a_signal_is_a_stop() -> None:
    events = Events()
    events.note([], [STOP], [])
    events.note([signal.SIGINT], [STOP], [])
    assert events.status() == STOPPED_STATUS
    assert events.lines()[0] == f"ml-dev: STOPPED: {STOP}" and "then INTERRUPTED: ml-dev run got SIGINT" in events.lines()[1]


def test_each_signal_is_named_with_a_shells_status() -> None:
    for sig, status in ((signal.SIGHUP, 129), (signal.SIGINT, 130), (signal.SIGTERM, 143)):
        events = Events()
        events.note([sig], [], [])
        assert events.status() == status and sig.name in events.lines()[0], (sig, events.lines())
    events = Events()
    events.note([], [], ["its stdout took no more output (Broken pipe)"])
    assert events.status() == OUTPUT_GONE_STATUS == 141


def test_a_status_out_of_range_is_1() -> None:
    events = Events()
    events.failure(0, 300, "rank 0 (p) on h")
    assert events.status() == 1


def test_a_usage_mistake_exits_2() -> None:
    argv = [sys.executable, str(REPO / "inpod" / "bin" / "ml-dev"), "run", "--timeout", "soon", "--", "true"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert res.returncode == 2 and "argument --timeout: invalid float value: 'soon'" in res.stderr, res.stderr


def test_the_docs_table_is_every_status_and_each_is_pinned_by_a_test() -> None:
    text = DOCS.read_text()
    section = text[text.index("## `ml-dev`") : text.index("`ml-dev why` (see")]
    rows = re.findall(r"^\| ([^|]+) \| (.+) \|$", section, re.M)
    documented = [(code.strip(), meaning.strip()) for code, meaning in rows if code.strip() not in ("code", "---:")]
    assert documented == [(c, m) for c, m, _ in RUN_EXIT_STATUSES]
    for code, _, test in RUN_EXIT_STATUSES:
        path, name = test.split("::")
        assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), (code, test)
