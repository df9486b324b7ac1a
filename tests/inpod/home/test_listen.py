"""The home page binds what it is told (default: $POD_IP and 127.0.0.1 on 8090), never a wildcard.

The bind on simulated pods (pod IP + loopback, nothing on net1..N) is tests/podsim/test_reach.py; here the
program itself, on loopback addresses only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from inpod.home import page as home_page
from inpod.lib import http
from tests.inpod import mount

PROGRAM = mount.shipped() / "home_page.py"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # the workspace too: the page keeps its history there (never the machine's /workspace)
    workspace = str(tmp_path / "workspace")
    state = str(tmp_path)
    return {"PATH": os.environ["PATH"], "ML_DEV_STATE_DIR": state, "ML_DEV_WORKSPACE": workspace, "ML_DEV_HOME_INTERVAL": "60", **extra}


@pytest.mark.parametrize("listen", ["0.0.0.0:0", ":8090", "[::]:8090", "127.0.0.1:0,0.0.0.0:0"])
def test_a_wildcard_is_refused(tmp_path: Path, listen: str) -> None:
    out = subprocess.run(
        [sys.executable, str(PROGRAM), "serve", "--listen", listen], env=_env(tmp_path), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2 and "not a wildcard" in out.stderr, out
    assert not (tmp_path / "home.addr").exists()


def test_the_default_is_the_pod_ip_and_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "10.128.0.10")
    assert http.listen_addresses("", home_page.PORT) == [("10.128.0.10", 8090), ("127.0.0.1", 8090)]
    monkeypatch.setenv("POD_IP", "fd01::a")
    assert http.listen_addresses("", home_page.PORT) == [("fd01::a", 8090), ("127.0.0.1", 8090)]
    assert http.listen_addresses("[fd01::a]:1 127.0.0.1:2", home_page.PORT) == [("fd01::a", 1), ("127.0.0.1", 2)]
    monkeypatch.delenv("POD_IP")
    assert http.listen_addresses("", home_page.PORT) == [("127.0.0.1", 8090)]


def test_it_serves_on_every_address_it_is_given(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), "serve", "--listen", "127.0.0.1:0,127.0.0.2:0"],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        addr = tmp_path / "home.addr"
        deadline = time.monotonic() + 30
        while not (addr.exists() and len(addr.read_text().split()) == 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.05)
        bound = addr.read_text().split()
        assert [b.rpartition(":")[0] for b in bound] == ["127.0.0.1", "127.0.0.2"]
        for b in bound:
            with urllib.request.urlopen(f"http://{b}/healthz", timeout=10) as response:
                assert response.status == 200
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()
