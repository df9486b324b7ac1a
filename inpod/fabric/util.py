"""Shared helpers of the fabric check's modules: environment, paths, the rank contract, running tools locally and on other pods.

Part of the fabric check (fabric_check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path


def _program_dir() -> str:
    """The directory of `fabric_check.py` as called, never resolve()d: behind the mount's symlinks lies the kubelet's
    `..<timestamp>` directory, which differs on every pod. This module is imported through sys.path[0], which Python
    sets to the script's directory with symlinks resolved (docs: sys.path), so its own __file__ would name that
    directory: the running program's path is used instead."""
    program = getattr(sys.modules.get("__main__"), "__file__", None)
    if program and os.path.basename(program) == "fabric_check.py":
        return os.path.dirname(os.path.abspath(program))
    return os.path.dirname(os.path.abspath(__file__))


# Handed to other pods: the startup ConfigMap's mount path (ML_DEV_DIR, core.naming.STARTUP_MOUNT), else the program's
# directory as called.
PROGRAM = Path(os.environ.get("ML_DEV_DIR") or _program_dir()) / "fabric_check.py"


GIB = 1 << 30


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: the pods' python3 may be older than 3.11 (CUDA devel images)
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def state_dir() -> Path:
    return Path(env("ML_DEV_STATE_DIR", "/tmp/ml-dev-env"))


def sys_root() -> Path:
    return Path(env("ML_DEV_FABRIC_ROOT", "/"))


def load_config(path: str | None = None) -> dict:
    path = path or env("ML_DEV_FABRIC_CONFIG") or str(PROGRAM.parent / "fabric.json")
    return json.loads(Path(path).read_text())


def this_pod() -> str:
    return env("POD_NAME") or env("ML_DEV_POD") or socket.gethostname()  # POD_NAME: the downward API, always this pod


def this_node() -> str:
    return env("NODE_NAME", "?")


def read_rank_env(path: Path | None = None) -> dict[str, str]:
    """`export KEY=value` lines written by the startup script (the rank contract); values may be shell-quoted."""
    path = path or state_dir() / "rank.env"
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        if words and words[0] == "export":
            words = words[1:]
        for word in words:
            if "=" in word:
                key, value = word.split("=", 1)
                values[key] = value
    return values


def ssh_command() -> list[str]:
    return shlex.split(env("ML_DEV_SSH", "ssh -o BatchMode=yes"))


def run(cmd: list[str], timeout: float | None = None, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env_extra or {}))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: command not found")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"{cmd[0]}: timed out after {timeout} s")


def remote(host: str, args: list[str]) -> list[str]:
    """Command line running `args` on `host` over the SSH fabric."""
    return [*ssh_command(), host, shlex.join(args)]


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(msg: str) -> None:
    print(f"[fabric-check] {msg}", flush=True)


NO_RANK_ENV = (
    "no {path}: the startup script writes it (the rank contract); fix: wait for the pod's startup, "
    "or check its log (oc logs <pod> -c ml-dev)"
)
