"""The user's Secrets of `env.secrets` as a pod sees them: which keys are listed, which are present, their values.

The stack names existing Secrets and keys (`env.secrets`); every pod mounts each Secret read-only at
`<contract.SECRETS_MOUNT>/<secret>/` with only the listed keys (components/pod.py user_secret_volumes), and
`devloop.env` lists them (`ML_DEV_SECRETS="<secret>/<KEY> ..."`, names only). A value is read here, where a rank
starts (`ml-dev _rank`), and by ssh-session.sh for every SSH connection: never written to a file, a log, an argv or
the launch channel. What other programs show (`ml-dev status`, the home page, the idle agent's /activity) is names
and present/missing only, never a value, a length or a hash of one.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import html
import os
import re
import shlex
from pathlib import Path
from typing import Dict, List, Mapping, Tuple

from .. import contract

ENV_NAME = re.compile(f"^{contract.ENV_NAME_PATTERN}$")
"""A key a shell can export (POSIX: a name of letters, digits and underscores, not starting with a digit)."""

Listed = List[Tuple[str, str]]
Presence = Dict[str, Dict[str, bool]]


def secrets_dir() -> Path:
    return Path(os.environ.get(contract.SECRETS_DIR_ENV) or contract.SECRETS_MOUNT)


def parse(text: str) -> Listed:
    """`<secret>/<KEY> ...` (devloop.env's ML_DEV_SECRETS) as [(secret, KEY)], in order."""
    out = []
    for word in text.split():
        secret, _, key = word.partition("/")
        if secret and ENV_NAME.match(key):
            out.append((secret, key))
    return out


def read_listed(devloop_env: Path) -> Listed:
    """The listed keys from a devloop.env file (KEY=value lines, values shell-quoted); none when it has no line."""
    try:
        lines = devloop_env.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        if line.startswith(contract.SECRETS_ENV + "="):
            words = shlex.split(line.split("=", 1)[1]) or [""]
            return parse(" ".join(words))
    return []


def listed_keys(listed: Listed) -> list[str]:
    return [key for _, key in listed]


def value_max() -> int:
    try:
        return int(os.environ.get(contract.SECRET_VALUE_MAX_ENV) or contract.SECRET_VALUE_MAX)
    except ValueError:
        return contract.SECRET_VALUE_MAX


def value_refusal(data: bytes, size: int | None = None) -> str | None:
    """Why a value cannot travel as an environment variable (None: it can), in the words every path uses."""
    size = len(data) if size is None else size
    if size > value_max():
        return f"is {size} bytes"
    if b"\0" in data:
        return "holds a NUL byte"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    return None


def refusal_line(secret: str, key: str, why: str) -> str:
    """The one line a refused value gets, on every path (ssh-session.sh prints the same words)."""
    return (
        f"Secret {secret} key {key} {why}: refused, the key is not set (env.secrets values are UTF-8 text without NUL "
        f"bytes, at most {value_max()} bytes each); fix the value in the Secret (`oc edit secret {secret}`)"
    )


def _mounted(root: Path) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    try:
        secrets = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except OSError:
        return out
    for secret in secrets:
        try:
            files = sorted(p for p in secret.iterdir() if not p.name.startswith("."))
        except OSError:
            continue
        out += [(secret.name, path) for path in files if ENV_NAME.match(path.name)]
    return out


def read_values(root: Path | None = None) -> tuple[dict[str, str], list[str]]:
    """({KEY: value} of every key mounted under `root` (the listed ones: the volumes hold only those), the refusal
    lines of the values that cannot travel (`value_refusal`; those keys are left out)). A value loses its trailing
    newlines, as the shell's `$(<file)` in ssh-session.sh does (a Secret made `--from-file` of a file that ends in a
    newline). A file too large is not read beyond the bound."""
    root = secrets_dir() if root is None else root
    out: dict[str, str] = {}
    refused: list[str] = []
    limit = value_max()
    for secret, path in _mounted(root):
        try:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
                size = os.fstat(f.fileno()).st_size if len(data) > limit else len(data)
        except OSError:  # not a file, or not readable by this UID: missing for this pod
            continue
        why = value_refusal(data, size)
        if why:
            refused.append(refusal_line(secret, path.name, why))
            continue
        out[path.name] = data.decode("utf-8").rstrip("\n")
    return out, refused


def values(root: Path | None = None) -> dict[str, str]:
    """The values that can travel (read_values), refused ones left out."""
    return read_values(root)[0]


def refused(root: Path | None = None) -> list[str]:
    """The refusal lines of this pod's mounted values (read_values)."""
    return read_values(root)[1]


def presence(listed: Listed, root: Path | None = None) -> Presence:
    """{secret: {KEY: present}} of this pod: a key is present when its file is there and readable."""
    root = secrets_dir() if root is None else root
    out: Presence = {}
    for secret, key in listed:
        out.setdefault(secret, {})[key] = os.access(str(root / secret / key), os.R_OK)
    return out


def missing(found: Presence) -> Listed:
    return [(secret, key) for secret, keys in found.items() for key, ok in keys.items() if not ok]


def presence_script(listed: Listed) -> str:
    """A shell command that prints `<secret>/<KEY>` for each listed key present on the pod it runs on (names only:
    `test -r`, no value is read)."""
    words = " ".join(shlex.quote(f"{s}/{k}") for s, k in listed)
    return (
        f'D="${{{contract.SECRETS_DIR_ENV}:-{contract.SECRETS_MOUNT}}}"; '
        f'for p in {words}; do if [ -r "$D/$p" ]; then printf "%s\\n" "$p"; fi; done'
    )


def from_script_output(listed: Listed, text: str) -> Presence:
    seen = set(text.split())
    out: Presence = {}
    for secret, key in listed:
        out.setdefault(secret, {})[key] = f"{secret}/{key}" in seen
    return out


# ------------------------------------------------------------------------------------ what is shown (names only)


def status_line(found: Presence | None) -> str:
    """`secrets: wandb (WANDB_API_KEY) hf (HF_TOKEN MISSING)`; empty when none is listed."""
    if found is None:
        return "secrets: unknown (the pod did not answer)"
    if not found:
        return ""
    parts = []
    for secret, keys in found.items():
        shown = " ".join(key if ok else f"{key} MISSING" for key, ok in keys.items())
        parts.append(f"{secret} ({shown})")
    return "secrets: " + " ".join(parts)


def missing_lines(per_pod: Mapping[str, Presence | None]) -> list[str]:
    """One line per listed key missing on a pod, naming secret, key and pod."""
    lines = []
    for pod, found in per_pod.items():
        if found is None:
            lines.append(f"pod {pod}: could not check its Secrets")
            continue
        for secret, key in missing(found):
            lines.append(
                f"Secret {secret} key {key} is missing on pod {pod} (env.secrets lists it): create or fix it with "
                f"`oc create secret generic {secret} --from-literal={key}=...` (or `oc edit secret {secret}`); the "
                "pods see it within a minute or two, no restart"
            )
    return lines


def html_section(per_pod: Mapping[str, Presence | None]) -> str:
    """The home page's "Secrets" card: per pod, each listed secret's keys present or missing; empty when none is
    listed. Names only."""
    if not any(per_pod.values()):
        return ""
    rows = []
    for pod, found in per_pod.items():
        if found is None:
            rows.append(f'<tr><td>{html.escape(pod)}</td><td class="neutral">unknown</td></tr>')
            continue
        cells = []
        for secret, keys in found.items():
            for key, ok in keys.items():
                cls, word = ("ok", "present") if ok else ("bad", "MISSING")
                cells.append(f'{html.escape(secret)}/{html.escape(key)} <span class="{cls}">{word}</span>')
        rows.append(f"<tr><td>{html.escape(pod)}</td><td>{'<br>'.join(cells)}</td></tr>")
    bad = any(found is None or missing(found) for found in per_pod.values())
    return (
        f'<section id="secrets" class="card{" bad" if bad else ""}"><h2>Secrets (env.secrets)</h2>'
        f"<table><tr><th>pod</th><th>secret/key</th></tr>{''.join(rows)}</table></section>"
    )


def local_presence() -> Presence:
    """This pod's {secret: {KEY: present}} from devloop.env in the startup mount ($ML_DEV_DIR); {} when none is listed
    (the idle agent's /activity carries it: the home page shows every pod's)."""
    mount = os.environ.get(contract.STARTUP_DIR_ENV) or contract.STARTUP_MOUNT
    return presence(read_listed(Path(mount) / contract.DEVLOOP_ENV_FILE))


def reports_section(pods: list[str], reports: Mapping[str, Mapping[str, object]]) -> str:
    """The home page's card from the pods' /activity reports (`secrets`: names and present/missing)."""
    per_pod: dict[str, Presence | None] = {}
    for pod in pods:
        report = reports.get(pod)
        found = report.get("secrets") if report is not None else None
        per_pod[pod] = found if isinstance(found, dict) else None
    return html_section(per_pod)
