"""wait_image with --build-config: a failed build ends the image wait at once (the image wait Job of a stack that builds).

A stand-in on 127.0.0.1 plays both the registry (the tag never appears: HEAD 404) and the Kubernetes API (the
Build list of the BuildConfigs, as `GET /apis/build.openshift.io/v1/namespaces/<ns>/builds?labelSelector=…`).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.net import reply_json
from tests.steps.conftest import StepRunner

NS = "nccl-test"
BASE, RUNTIME = "ml-dev-env-base-0123456789", "ml-dev-env-runtime-0123456789"


def build(config: str, number: int, phase: str, reason: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{config}-{number}",
            "labels": {"openshift.io/build-config.name": config},
            "annotations": {"openshift.io/build.number": str(number)},
        },
        "status": {"phase": phase, **({"reason": reason} if reason else {})},
    }


class StandIn:
    def __init__(self) -> None:
        self.builds: list[dict[str, Any]] = []
        self.selectors: list[str] = []
        self.tokens: list[str] = []


@pytest.fixture
def stand_in() -> Iterator[tuple[StandIn, str]]:
    state = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:  # the registry: the runtime tag never appears
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path != f"/apis/build.openshift.io/v1/namespaces/{NS}/builds":
                reply_json(self, 404, {})
                return
            state.selectors.append(urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0])
            state.tokens.append(self.headers.get("Authorization", ""))
            reply_json(self, 200, {"kind": "BuildList", "items": state.builds})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # bound here: no port race
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wait(run_step: StepRunner, tmp_path: Path, host: str, timeout: int = 60) -> tuple[Any, float]:
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    started = time.monotonic()
    step = run_step(
        "wait_image",
        "--image",
        f"{host}/{NS}/ml-dev-env:runtime-0123456789",
        "--token-file",
        token,
        "--plain-http",
        "--timeout",
        str(timeout),
        "--interval",
        "0.2",
        "--namespace",
        NS,
        "--build-config",
        BASE,
        "--build-config",
        RUNTIME,
        "--api-server",
        f"http://{host}",
        timeout=timeout + 30,
    )
    return step, time.monotonic() - started


def test_a_failed_build_ends_the_wait_at_once(tmp_path: Path, run_step: StepRunner, stand_in: tuple[StandIn, str]) -> None:
    state, host = stand_in
    state.builds = [build(BASE, 1, "Complete"), build(RUNTIME, 1, "Failed", "DockerBuildFailed")]
    step, seconds = wait(run_step, tmp_path, host)
    assert step.returncode == 1, step.stderr
    line = step.stderr.strip().splitlines()[-1]
    assert f"build {RUNTIME}-1 Failed (DockerBuildFailed)" in line
    assert f"`oc logs build/{RUNTIME}-1 -n {NS}`" in line
    assert seconds < 30  # not the 60 s timeout
    assert state.selectors[0] == f"openshift.io/build-config.name in ({BASE},{RUNTIME})"
    assert state.tokens[0] == "Bearer sa-token"


@pytest.mark.parametrize("phase", ["Error", "Cancelled"])
def test_error_and_cancelled_end_it_too(tmp_path: Path, run_step: StepRunner, stand_in: tuple[StandIn, str], phase: str) -> None:
    state, host = stand_in
    state.builds = [build(BASE, 1, phase)]
    step, _ = wait(run_step, tmp_path, host)
    assert step.returncode == 1 and f"build {BASE}-1 {phase}" in step.stderr


def test_a_retried_build_counts_not_the_failed_one_before_it(tmp_path: Path, run_step: StepRunner, stand_in: tuple[StandIn, str]) -> None:
    state, host = stand_in
    state.builds = [build(BASE, 1, "Failed"), build(BASE, 2, "Running")]
    step, _ = wait(run_step, tmp_path, host, timeout=3)
    assert step.returncode == 5, step.stderr  # EXIT_NOT_FOUND: it waited the whole (short) timeout
    assert "did not appear within 3 s" in step.stderr
    assert len(state.selectors) >= 2
