"""Shared helpers of the fabric check's modules: environment, paths, the rank contract, running tools locally and on other pods.

Part of the fabric check (fabric_check.py is the program); standard library only, Python 3.8+.
"""

from __future__ import annotations

import functools
import json
import socket
from pathlib import Path

from .. import contract
from ..lib import pod, ssh
from ..lib.pod import env, mount_dir, read_rank_env, read_text, run, state_dir, utc_now

__all__ = ["env", "read_rank_env", "read_text", "run", "state_dir", "utc_now"]  # the fabric modules take them from here

# Handed to other pods: the startup ConfigMap's mount path (ML_DEV_DIR), else the launcher's directory as called.
PROGRAM = mount_dir("fabric_check.py") / "fabric_check.py"


GIB = 1 << 30

log = functools.partial(pod.log, "fabric-check")


def sys_root() -> Path:
    return Path(env("ML_DEV_FABRIC_ROOT", "/"))


def load_config(path: str | None = None) -> dict:
    path = path or env("ML_DEV_FABRIC_CONFIG") or str(PROGRAM.parent / contract.FABRIC_SETTINGS_FILE)
    return json.loads(Path(path).read_text())


def this_pod() -> str:
    return env("POD_NAME") or env("ML_DEV_POD") or socket.gethostname()  # POD_NAME: the downward API, always this pod


def this_node() -> str:
    return env("NODE_NAME", "?")


def remote(host: str, args: list[str]) -> list[str]:
    """Command line running `args` on `host` over the SSH fabric."""
    return ssh.command(host, args)


def ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


NO_RANK_ENV = (
    "no {path}: the startup script writes it (the rank contract); fix: wait for the pod's startup, "
    "or check its log (oc logs <pod> -c ml-dev)"
)
