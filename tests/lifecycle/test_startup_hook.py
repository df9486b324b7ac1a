"""The real startup script starts the idle agent on every pod (when its settings are mounted) and hooks the
warning into interactive shells; without settings it starts none."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from tests.lifecycle.conftest import write_settings
from tests.test_startup_script import base_env, make_stubs, start, stop, wait_ready


def test_startup_starts_the_agent_and_hooks_the_warning(tmp_path: Path) -> None:
    bin_dir, _ = make_stubs(tmp_path)
    settings = write_settings(tmp_path / "idle.json", enabled=False)
    env = base_env(tmp_path, bin_dir, "ml-dev-env-1", ML_DEV_IDLE_SETTINGS=str(settings), ML_DEV_ACTIVITY_LISTEN="127.0.0.1:0")
    proc = start(env)
    addr = tmp_path / "state" / "activity.addr"
    try:
        wait_ready(proc, tmp_path / "state")
        deadline = time.monotonic() + 30
        while not (addr.exists() and addr.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://{addr.read_text().strip()}/activity", timeout=10) as response:
            report = json.loads(response.read())
    finally:
        out = stop(proc)
    assert "starting idle-agent: python3" in out, out
    assert report["pod"] == "ml-dev-env-1"
    assert [s["name"] for s in report["signals"]] == ["gpu", "terminals", "ssh", "launcher"]  # a worker: no IDE probes
    # the stub nvidia-smi prints another query's columns: a failed probe, which the decision counts as active
    assert report["signals"][0]["ok"] is False
    home = Path(env["ML_DEV_HOME"])
    bashrc = (home / ".bashrc").read_text()
    assert bashrc.count("idle-warning.sh") == 2 and "inpod/idle-warning.sh" in bashrc  # one line, path twice
    # the agent stopped with the pod
    time.sleep(0.5)
    try:
        urllib.request.urlopen(f"http://{addr.read_text().strip()}/activity", timeout=2)
        raise AssertionError("the agent outlived the startup script")
    except OSError:
        pass


def test_no_settings_no_agent(tmp_path: Path) -> None:
    bin_dir, _ = make_stubs(tmp_path)
    env = base_env(tmp_path, bin_dir, "ml-dev-env-1", ML_DEV_IDLE_SETTINGS=str(tmp_path / "absent.json"))
    proc = start(env)
    try:
        wait_ready(proc, tmp_path / "state")
    finally:
        out = stop(proc)
    assert "idle-agent" not in out
    assert not (tmp_path / "state" / "activity.addr").exists()
