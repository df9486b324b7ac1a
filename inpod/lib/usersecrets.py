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


def values(root: Path | None = None) -> dict[str, str]:
    """{KEY: value} of every key mounted under `root` (the listed ones: the volumes hold only those). A value loses its
    trailing newlines, as the shell's `$(<file)` in ssh-session.sh does (a Secret made `--from-file` of a file that
    ends in a newline)."""
    root = secrets_dir() if root is None else root
    out: dict[str, str] = {}
    try:
        secrets = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except OSError:
        return out
    for secret in secrets:
        try:
            files = sorted(p for p in secret.iterdir() if not p.name.startswith("."))
        except OSError:
            continue
        for path in files:
            if not ENV_NAME.match(path.name):
                continue
            try:
                out[path.name] = path.read_bytes().decode(errors="replace").rstrip("\n")
            except OSError:  # not a file, or not readable by this UID: missing for this pod
                continue
    return out


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
