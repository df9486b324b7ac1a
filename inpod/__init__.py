"""Programs that run inside the environment's pods, and the one table of what ships where.

Every file here is delivered verbatim in the stack's startup ConfigMap (`<app>-startup`, mounted at
`core.naming.STARTUP_MOUNT`, /opt/ml-dev-env) at the path in the pod that `SHIPPED` names: the package itself
under `inpod/` (its families are subpackages importing each other relatively), the programs' 3-line launchers
(bin/) and the shell files (sh/) at the mount root, where the docs and the image call them. ConfigMap keys are
flat (k8s.io/apimachinery pkg/util/validation/validation.go IsConfigMapKey: `[-._a-zA-Z0-9]+`), so each row's key
is its path with `/` as `.`; the volume's `items` (k8s.io/api core/v1/types.go ConfigMapVolumeSource.Items,
KeyToPath.Path) put every key back at its path (kubernetes pkg/volume/util/atomic_writer.go writePayloadToDir
makes the directories, createUserVisibleFiles links the first component: `inpod -> ..data/inpod`). A launcher
imports the package by its absolute name: Python puts the launcher's real (`..<timestamp>`) directory first on
sys.path, and that directory holds `inpod/`. The Pulumi components read the texts only through `text()` /
`group()` / `items()`; nothing else ships. Like `steps/`, this package imports nothing of ours and no Pulumi: the
programs run on the images' Pythons with the standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import contract

HERE = Path(os.path.dirname(os.path.abspath(__file__)))


def _bytecode_in_state_dir() -> None:
    """In a pod the package is the startup ConfigMap's read-only volume: no `__pycache__` can be written beside it, so
    every process (each rank agent of every launch) compiled every module again, about 0.1 s of CPU. There, bytecode
    goes to the pod's state dir instead (sys.pycache_prefix, Python 3.8+: CPython Lib/importlib/_bootstrap_external.py
    cache_from_source), under the source's own path, so a ConfigMap update (a new `..<timestamp>` directory) compiles
    afresh and nothing stale is read. Where the package is writable (a checkout, the tests) nothing changes."""
    if sys.pycache_prefix is None and not sys.dont_write_bytecode and not os.access(HERE, os.W_OK):
        sys.pycache_prefix = os.path.join(os.environ.get(contract.STATE_DIR_ENV) or contract.STATE_DIR, "pycache")


_bytecode_in_state_dir()

MIN_PYTHON = (3, 8)
"""The oldest `python3` the in-pod programs run on; the one place that says so. The presets' images carry 3.10
and 3.12; 3.8 keeps older CUDA images (Ubuntu 20.04) working. Enforced by ruff's per-file target version
(pyproject.toml, checked against this) and by tests/inpod, which runs the programs' unit tests under every
CPython from this one to the newest found (pyenv or PATH)."""


@dataclass(frozen=True)
class Shipped:
    path: str
    """Where the pod finds it, relative to the mount (/opt/ml-dev-env)."""
    source: str
    """The file in this package."""
    group: str
    """Which part of the stack ships it: package (the package's common modules, the SVG plots the home page and the
    fabric gate draw among them, and contract.env; always), startup (PID 1), devloop (SSH fabric, launcher), servers
    (forward.py: the token-mode servers on the pod IP), lifecycle, fabric, usage, home (the home page; always shipped)."""

    @property
    def key(self) -> str:
        """The ConfigMap key: the path with `/` as `.` (keys are flat; none starts with `..`)."""
        return self.path.replace("/", ".")


def _package(group: str, *sources: str) -> tuple[Shipped, ...]:
    """The package's modules in `sources`: a module, or a family's folder, which ships every module in it (a new
    module of a family ships with it; `__init__.py` first)."""
    files: list[str] = []
    for source in sources:
        if source.endswith(".py"):
            files.append(source)
        else:
            files += sorted(f"{source}/{f.name}" for f in (HERE / source).glob("*.py"))
    return tuple(Shipped(f"inpod/{f}", f, group) for f in files)


def _root(group: str, *names: str) -> tuple[Shipped, ...]:
    """Files at the mount root, where the docs and the image call them: shell files (and the contract they source,
    contract.env) from sh/, launchers from bin/."""
    return tuple(Shipped(name, f"{'sh' if name.endswith(('.sh', '.env')) else 'bin'}/{name}", group) for name in names)


SHIPPED: tuple[Shipped, ...] = (
    *_package("package", "__init__.py", "contract.py", "lib"),
    *_root("package", contract.CONTRACT_ENV_FILE),  # contract.py's facts for the shell files (tools/contract_env.py writes it)
    *_root("startup", "startup.sh"),
    *_root("servers", "forward.py"),
    *_root("devloop", "sshd.sh", "ssh-session.sh", "user-secrets.sh", "ml-dev", "ml-dev-why"),
    *_package("devloop", "ml_dev"),
    *_root("lifecycle", "idle_agent.py", "idle-warning.sh", "checkpoint_stop.sh"),
    *_package("lifecycle", "idle"),
    *_root("fabric", "fabric_check.py", "rank_order.sh"),
    *_package("fabric", "fabric"),
    *_root("usage", "usage.py"),
    *_package("usage", "usage.py"),
    *_root("home", "home_page.py"),
    *_package("home", "home"),
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


def items(keys: Iterable[str]) -> list[dict[str, str]]:
    """The `items` of a volume of the startup ConfigMap holding `keys`: every shipped key at its path in the pod, any
    other key (the rendered settings: devloop.env, fabric.json) at its own name. A volume with `items` holds the
    listed keys only (k8s.io/api core/v1/types.go ConfigMapVolumeSource.Items), so every key is listed."""
    return [{"key": k, "path": _BY_KEY[k].path if k in _BY_KEY else k} for k in keys]


def group(name: str) -> dict[str, str]:
    """key → text of every file of one group, in table order."""
    found = {s.key: text(s.key) for s in SHIPPED if s.group == name}
    if not found:
        raise KeyError(f"no shipped group {name!r}")
    return found
