"""Programs that run inside the environment's pods, and the one table of what ships where.

Every file here is delivered verbatim in the stack's startup ConfigMap (`<app>-startup`, mounted at
`core.naming.STARTUP_MOUNT`, /opt/ml-dev-env) under the key `SHIPPED` names. The Pulumi components read
the texts only through `text()` / `group()`; nothing else ships. Like `steps/`, this package imports
nothing of ours and no Pulumi: the programs run on the images' Pythons with the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

MIN_PYTHON = (3, 8)
"""The oldest `python3` the in-pod programs run on; the one place that says so. The presets' images carry 3.10
and 3.12; 3.8 keeps older CUDA images (Ubuntu 20.04) working. Enforced by ruff's per-file target version
(pyproject.toml, checked against this) and by tests/inpod, which runs the programs' unit tests under every
CPython from this one to the newest found (pyenv or PATH)."""


@dataclass(frozen=True)
class Shipped:
    key: str
    """The ConfigMap key, i.e. the file name under /opt/ml-dev-env in the pod."""
    source: str
    """The file in this package."""
    group: str
    """Which part of the stack ships it: startup (PID 1), devloop (SSH fabric, launcher), lifecycle, fabric, usage,
    home (the home page and the SVG plots it and the fabric gate draw; always shipped)."""


SHIPPED: tuple[Shipped, ...] = (
    Shipped("startup.sh", "startup.sh", "startup"),
    Shipped("sshd.sh", "sshd.sh", "devloop"),
    Shipped("ssh-session.sh", "ssh-session.sh", "devloop"),
    Shipped("ml-dev", "ml_dev.py", "devloop"),
    Shipped("idle_agent.py", "idle_agent.py", "lifecycle"),
    Shipped("idle-warning.sh", "idle-warning.sh", "lifecycle"),
    Shipped("checkpoint_stop.sh", "checkpoint_stop.sh", "lifecycle"),
    Shipped("fabric_check.py", "fabric_check.py", "fabric"),
    Shipped("fabric_util.py", "fabric_util.py", "fabric"),
    Shipped("fabric_parse.py", "fabric_parse.py", "fabric"),
    Shipped("fabric_preflight.py", "fabric_preflight.py", "fabric"),
    Shipped("fabric_gate.py", "fabric_gate.py", "fabric"),
    Shipped("fabric_localise.py", "fabric_localise.py", "fabric"),
    Shipped("fabric_report.py", "fabric_report.py", "fabric"),
    Shipped("rank_order.sh", "rank_order.sh", "fabric"),
    Shipped("usage.py", "usage.py", "usage"),
    Shipped("home_page.py", "home_page.py", "home"),
    Shipped("svgplot.py", "svgplot.py", "home"),
)
_BY_KEY = {s.key: s for s in SHIPPED}


def path(key: str) -> Path:
    """The source file of ConfigMap key `key`."""
    try:
        return HERE / _BY_KEY[key].source
    except KeyError:
        raise KeyError(f"{key!r} is not shipped; shipped: {', '.join(_BY_KEY)}") from None


def text(key: str) -> str:
    """The exact text the pod gets under `key`."""
    return path(key).read_text()


def group(name: str) -> dict[str, str]:
    """key → text of every file of one group, in table order."""
    found = {s.key: text(s.key) for s in SHIPPED if s.group == name}
    if not found:
        raise KeyError(f"no shipped group {name!r}")
    return found
