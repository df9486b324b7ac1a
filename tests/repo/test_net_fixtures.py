"""tests/fixtures/net.py: a server started on a port another process took first is restarted on another port,
and is never mistaken for the process that holds the port."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from tests.fixtures import net

SERVER = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
    "s.listen()\n"
    "print('serving on', sys.argv[1], flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_port_taken_before_the_server_binds_is_retried_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()  # connects to it succeed: a connect-based wait would accept it
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        free = net.free_port
        monkeypatch.setattr(net, "free_port", lambda: next(ports, None) or free())
        log = tmp_path / "server.log"
        port, proc = net.start_on_free_port(
            lambda p: [sys.executable, "-c", SERVER, str(p)], log, lambda p: f"serving on {p}", attempts=3, timeout=20
        )
        try:
            assert port != taken
            assert proc.poll() is None
            assert "Address already in use" in log.read_text(), "the first attempt lost the port"
        finally:
            proc.kill()
            proc.wait()


def test_a_server_that_never_binds_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError, match=r"exited 2 times before listening.*boom"):
        net.start_on_free_port(lambda p: [sys.executable, "-c", "raise SystemExit('boom')"], log, lambda p: "never", attempts=2)
