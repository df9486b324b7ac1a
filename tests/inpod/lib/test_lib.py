"""inpod/lib, the helpers every family shares: each behaviour the families relied on when each had its own copy."""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from inpod import contract
from inpod.lib import http, kube, pod, ssh


def test_rank_env_is_read_as_the_shell_writes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / contract.RANK_ENV_FILE).write_text(
        "# written by startup.sh\nexport ML_DEV_HOSTS='a.x b.x'\nexport NODE_RANK=1\n\nexport PET_X=\"q r\"  # note\n"
    )
    monkeypatch.setenv(contract.STATE_DIR_ENV, str(tmp_path))
    assert pod.read_rank_env() == {"ML_DEV_HOSTS": "a.x b.x", "NODE_RANK": "1", "PET_X": "q r"}
    monkeypatch.setenv(contract.STATE_DIR_ENV, str(tmp_path / "none"))
    with pytest.raises(OSError):
        pod.read_rank_env()


def test_idle_settings_are_the_file_over_the_contract_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = tmp_path / contract.SETTINGS_KEY
    settings.write_text(json.dumps({"enabled": True, "idleTimeoutSeconds": 900}))
    monkeypatch.setenv(contract.IDLE_SETTINGS_ENV, str(settings))
    assert pod.idle_settings() == {**contract.IDLE_DEFAULTS, "enabled": True, "idleTimeoutSeconds": 900}
    settings.write_text("[1]")
    with pytest.raises(ValueError):
        pod.idle_settings()


def test_the_mount_path_is_handed_on_never_a_resolved_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.STARTUP_DIR_ENV, "/opt/x")
    assert pod.mount_dir("ml-dev") == Path("/opt/x")
    monkeypatch.delenv(contract.STARTUP_DIR_ENV)
    assert (pod.mount_dir("no-such-launcher") / "inpod" / "lib" / "pod.py").is_file(), "else: the directory holding the package"


def test_a_missing_or_slow_tool_is_an_exit_status(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-tool")  # not a program of the suite: one this machine lacks
    assert pod.run([missing]).returncode == 127
    slow = pod.run(["sleep", "5"], timeout=0.2)
    assert slow.returncode == 124 and "timed out" in slow.stderr


def test_one_ssh_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ML_DEV_SSH", "ssh -F /s/client.conf")
    cmd = ssh.command("pod-1.x", ["echo", "a b", "$HOME"])
    assert cmd[:3] == ["ssh", "-F", "/s/client.conf"] and cmd[3] == "pod-1.x" and shlex.split(cmd[4]) == ["echo", "a b", "$HOME"]
    assert ssh.command("h", ["true"], ["ssh", "-o", "X=1"]) == ["ssh", "-o", "X=1", "h", "true"]


def test_never_a_wildcard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "10.0.0.5")
    assert http.listen_addresses(None, 9) == [("10.0.0.5", 9), ("127.0.0.1", 9)]
    for wildcard in ("0.0.0.0:1", "[::]:1", ":1"):
        with pytest.raises(ValueError, match="not a wildcard"):
            http.listen_addresses(wildcard, 9)


class _Api(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "agent": self.headers["User-Agent"],
                "auth": self.headers["Authorization"],
                "body": body,
            }
        )
        data = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_PATCH = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    _Api.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_one_kube_client_with_the_callers_field_manager(api: str, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t1\n")
    client = kube.Client("ml-dev-env-test", api, tmp_path)
    assert client.call("GET", "/api/v1/namespaces/n/pods?labelSelector=a%3Db") == {"ok": True}
    (tmp_path / "token").write_text("t2\n")  # the kubelet rotated it: the next call sends the new one
    client.call("PATCH", "/api/v1/namespaces/n/configmaps/c", {"data": {}}, "application/merge-patch+json")
    first, second = _Api.seen
    assert first["path"].endswith("?labelSelector=a%3Db") and first["auth"] == "Bearer t1" and first["agent"] == "ml-dev-env-test"
    assert second["path"] == "/api/v1/namespaces/n/configmaps/c?fieldManager=ml-dev-env-test" and second["auth"] == "Bearer t2"
