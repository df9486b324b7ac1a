"""The pod a program runs in: its env, its state directory, its log, running a tool, the one `rank.env` reader, the
one `idle.json` reader, where the program was started from.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import contract


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def state_dir() -> Path:
    """$ML_DEV_STATE_DIR: this pod's own, never synced."""
    return Path(env(contract.STATE_DIR_ENV, contract.STATE_DIR))


def app_name() -> str:
    """The environment's name: APP_NAME when set, else from the pod's name `<app>-<ordinal>` (a StatefulSet's pods;
    the rendered env carries POD_NAME, the app name only cluster.env)."""
    if env("APP_NAME"):
        return env("APP_NAME")
    app, _, ordinal = env("POD_NAME").rpartition("-")
    return app if ordinal.isdigit() else ""


def mounted_models() -> list[dict[str, Any]]:
    """The models mounted from their images (contract.MODELS_ENV, rendered by components/pod.py model_volumes): name,
    path, image, its `sha256:` digest, and whether this pod has the path (an API server with its ImageVolume gate off
    drops the volume without a word: the pod then starts without it)."""
    try:
        listed = json.loads(env(contract.MODELS_ENV) or "[]")
    except ValueError:
        return []
    out = []
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict):
            continue
        image = str(entry.get("image", ""))
        path = str(entry.get("path", ""))
        out.append(
            {
                "name": str(entry.get("name", "")),
                "path": path,
                "image": image,
                "digest": image.rpartition("@")[2] if "@" in image else "",
                "present": bool(path) and os.path.isdir(path),
            }
        )
    return out


def model_line(model: dict[str, Any]) -> str:
    """One mounted model as `ml-dev status` and the home page say it."""
    state = "" if model["present"] else " - NOT MOUNTED in this pod (the cluster dropped the image volume?)"
    return f"{model['name']} at {model['path']} ({model['digest'] or model['image']}){state}"


def env_records_dir(migrate: bool = True) -> Path:
    """This environment's records in the workspace (contract.records_dir): `$ML_DEV_WORKSPACE/.ml-dev-env/env/<app>`.
    Records written before they were kept per environment (`.ml-dev-env/{runs,home,fabric}`) move here once, the first
    time a program of this environment looks (`migrate`); nothing is lost (see move_legacy)."""
    workspace = env(contract.WORKSPACE_ENV, contract.WORKSPACE_DEFAULT)
    app = app_name() or "unnamed"
    mine = Path(contract.records_dir(workspace, app))
    if migrate:
        move_legacy(Path(workspace) / contract.WORKSPACE_RECORDS_DIR, mine)
    return mine


def environment_record() -> dict[str, object] | None:
    """The last drift gate's verdict (`ml-dev run`, inpod/ml_dev/envgate.py), kept under the environment's records on
    the launching pod (contract.ENV_GATE_DIR)."""
    found = read_json(env_records_dir(migrate=False) / contract.ENV_GATE_DIR / contract.ENV_GATE_LAST)
    return found if isinstance(found, dict) else None


def environment_summary(record: dict[str, object] | None) -> str:
    """That verdict in words (`ml-dev status`, the home page): "one environment", or the ranks that differ."""
    if not record:
        return "not checked yet (every `ml-dev run` checks it)"
    when = f"{record.get('at')}, {record.get('ranks')} ranks"
    if record.get("one_environment"):
        return f"one environment ({when})"
    allowed = ", launched with --allow-drift" if record.get("allowed") else ", launch refused"
    differs = record.get("differs")
    return f"ranks differ: {', '.join(map(str, differs if isinstance(differs, list) else []))} ({when}{allowed})"


def move_legacy(top: Path, mine: Path) -> list[str]:
    """Move `top/<name>` (contract.LEGACY_RECORDS) into `mine/<name>`, each by one rename (atomic: of two programs or
    two environments that try at once, one moves it and the other finds nothing). Where `mine/<name>` exists already,
    the entries of the old folder move into it one by one, and an entry both hold keeps the old one beside it as
    `<entry>.before-<time>`. Returns what was moved (empty: nothing left to move, the usual case: one stat per name)."""
    moved: list[str] = []
    for name in contract.LEGACY_RECORDS:
        old = top / name
        if not old.is_dir() or old.is_symlink():
            continue
        target = mine / name
        try:
            mine.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(old, target)  # fails when target exists and is not empty (or exists, on some systems)
                moved.append(name)
                continue
            except OSError:
                pass
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            for entry in sorted(old.iterdir()):
                dest = target / entry.name
                if dest.exists() or dest.is_symlink():
                    dest = target / f"{entry.name}.before-{stamp}"
                try:
                    os.rename(entry, dest)
                    moved.append(f"{name}/{entry.name}")
                except FileNotFoundError:
                    continue  # another program moved it first
            try:
                old.rmdir()
            except OSError:
                pass  # not empty: something was written there meanwhile; the next look moves it
        except OSError:
            continue  # a workspace we cannot write: the records stay where they are
    return moved


def mount_dir(*launchers: str) -> Path:
    """The startup ConfigMap's mount path, to hand other pods: $ML_DEV_DIR, else the directory of the running launcher
    (one of `launchers`) as called. Never resolve()d: behind the mount's symlinks lies the kubelet's `..<timestamp>`
    directory, which differs on every pod (and sys.path[0], hence every module's __file__, names it: CPython resolves
    the script's symlinks, Python/pathconfig.c _PyPathConfig_ComputeSysPath0). Last resort: the directory that holds
    the package."""
    if env(contract.STARTUP_DIR_ENV):
        return Path(env(contract.STARTUP_DIR_ENV))
    program = getattr(sys.modules.get("__main__"), "__file__", None)
    if program and os.path.basename(program) in launchers:
        return Path(os.path.dirname(os.path.abspath(program)))
    return Path(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def log(tag: str, message: str, stamp: bool = False) -> None:
    """One line on stdout: `[tag] message` (with the time of day when `stamp`)."""
    when = time.strftime("%H:%M:%S ") if stamp else ""
    print(f"[{tag}] {when}{message}", flush=True)


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: the pods' python3 may be older than 3.11 (CUDA devel images)
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def clock(ts: float) -> str:
    """A time of day as the pages and `ml-dev status` show it."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(ts))


def ago(seconds: float | None) -> str:
    """A duration as the pages show it: "never", "42 s", "17 min", "2.5 h"."""
    if seconds is None:
        return "never"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def run(cmd: list[str], timeout: float | None = None, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a tool; a missing tool is exit 127 and a timeout exit 124, never an exception."""
    full_env = dict(os.environ, **(env_extra or {}))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: command not found")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"{cmd[0]}: timed out after {timeout} s")


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def read_rank_env(path: Path | None = None, missing_ok: bool = False) -> dict[str, str]:
    """`$ML_DEV_STATE_DIR/rank.env` (contract.RANK_ENV): `export KEY=value` lines written by startup.sh, each value
    single-quoted for sh (its `q`), which shlex reads as sh does. Raises OSError when the file is missing (the startup
    script has not run) and ValueError on a line sh could not read either; `missing_ok`: nothing (`{}`) then."""
    path = path or state_dir() / contract.RANK_ENV_FILE
    try:
        lines = path.read_text().splitlines()
        return _exports(lines)
    except (OSError, ValueError):
        if missing_ok:
            return {}
        raise


def _exports(lines: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in lines:
        words = shlex.split(line, comments=True)
        for word in words[1:] if words[:1] == ["export"] else words:
            key, sep, value = word.partition("=")
            if sep:
                values[key] = value
    return values


def idle_settings() -> dict[str, Any]:
    """`idle.json` (contract.IdleSettings) over the contract's one table of defaults. Raises OSError or ValueError when
    it cannot be read: each reader says what that means for it."""
    path = Path(env(contract.IDLE_SETTINGS_ENV, contract.IDLE_SETTINGS))
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return {**contract.IDLE_DEFAULTS, **value}
