"""What the page serves is never older than half its refresh interval (inpod/home/page.py `Collector.fresh`), whatever
its sampling interval: the agent here is a local HTTP server answering `/activity` as an idle agent does, the page's
handler is served on the loopback, and no sampling loop runs (only the page's requests make rounds).

On simulated pods, in chromium, the browser test counts the page's refreshes (tests/inpod/home/test_browser.py)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inpod.home import page as home_page
from tests.inpod.home.numbers import shown

POD = "env-0"


class Agent:
    """`/activity` of one pod with `people` SSH connections (a person's session each); counts the rounds that ask it;
    `hold` (when set) keeps every answer until `release`."""

    def __init__(self) -> None:
        self.people = 2
        self.asked = 0
        self.hold = False
        self.arrived, self.release = threading.Event(), threading.Event()
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's method name
                if self.path == "/activity":
                    agent.asked += 1
                    agent.arrived.set()
                    if agent.hold:
                        assert agent.release.wait(30), "the test never released the agent"
                    sessions = [{"user": f"u{k}", "connection": f"10.0.0.{k} 5000{k} 2222", "run": ""} for k in range(agent.people)]
                    body: Any = {"pod": POD, "node": "node-0", "signals": [{"name": "ssh", "ok": True, "detail": {"sessions": sessions}}]}
                else:
                    body = {"lastActive": 1.0, "reason": "ssh"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    found = Agent()
    port = found.httpd.server_address[1]
    for name, value in {
        "ML_DEV_HOME_AGENTS": f"{POD}=127.0.0.1:{port}",
        "ML_DEV_HOME_REFRESH": "10",
        "ML_DEV_STATE_DIR": str(tmp_path / "state"),
        "ML_DEV_WORKSPACE": str(tmp_path / "workspace"),
        "ML_DEV_IDLE_SETTINGS": str(tmp_path / "no-idle.json"),
    }.items():
        monkeypatch.setenv(name, value)
    try:
        yield found
    finally:
        found.close()


def page_server(collector: home_page.Collector) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (home_page.Handler,), {"collector": collector})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def ssh_shown(httpd: ThreadingHTTPServer, path: str = "fragment") -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{httpd.server_address[1]}/{path}", timeout=30) as response:
        return shown(response.read().decode())[0][f"ssh:{POD}"]


def test_a_request_is_served_from_a_round_at_most_half_a_refresh_old(agent: Agent, tmp_path: Path) -> None:
    collector = home_page.Collector(tmp_path / "history.json")  # never sampled: no loop runs here
    httpd = page_server(collector)
    try:
        assert ssh_shown(httpd, "") == ["2"] and agent.asked == 1, "the page's first load makes the first round"
        agent.people = 1
        assert ssh_shown(httpd) == ["2"] and agent.asked == 1, "a round under half a refresh (5 s) old is served again"
        assert collector.last_sample is not None
        collector.last_sample -= 5.5  # that round is now older than half a refresh
        assert ssh_shown(httpd) == ["1"] and agent.asked == 2, "an older round is not served: the request makes one"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_requests_that_ask_together_share_one_round(agent: Agent, tmp_path: Path) -> None:
    collector = home_page.Collector(tmp_path / "history.json")
    agent.hold = True
    first = threading.Thread(target=collector.fresh, args=(60,))
    first.start()
    assert agent.arrived.wait(30), "the first request made no round"
    # asked while that round runs: it waits for it (one round at a time) and is served from it
    second = threading.Thread(target=collector.fresh, args=(60,))
    second.start()
    agent.release.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    assert agent.asked == 1, f"{agent.asked} rounds for two requests asked together"
    assert [c["user"] for c in home_page.connections(collector.reports[POD])] == ["u0", "u1"]
