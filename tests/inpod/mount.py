"""The startup ConfigMap's mount as a pod sees it, for tests that run the shipped programs as plain processes.

Built from `inpod.SHIPPED` through the volume's `items` (inpod.items) by podsim's atomic writer: the launchers and
shell files at the root, the package under `inpod/` behind the first-component link, `..data` and a `..<timestamp>`
directory, exactly the tree a simulated pod (and the kubelet) makes from the render. So a program started from here
imports its package as in the pod, and a shell file finds its siblings where the pod has them.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import inpod
from tests.podsim.layout import AtomicVolume


def write(target: Path, extra: Mapping[str, str] | None = None) -> Path:
    """Every shipped key (plus `extra`, e.g. fabric.json) at its path under `target`; returns `target`."""
    data = {**{s.key: inpod.text(s.key) for s in inpod.SHIPPED}, **(extra or {})}
    AtomicVolume(target, mode=0o555).write_volume({"items": inpod.items(data)}, data)
    return target


def remove(target: Path) -> None:
    """Remove a tree `write` made (its directories are read-only, as the kubelet's are)."""
    for root, dirs, _ in os.walk(target):
        for d in dirs:
            path = os.path.join(root, d)
            if not os.path.islink(path):
                os.chmod(path, 0o755)
    shutil.rmtree(target, ignore_errors=True)


@functools.cache
def shipped() -> Path:
    """One read-only mount for the whole run (removed at exit)."""
    base = Path(tempfile.mkdtemp(prefix="ml-dev-env-mount-"))
    atexit.register(remove, base)
    return write(base / "opt-ml-dev-env")
