"""Image references and registry credentials from docker config files (no network)."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runtime import EXIT_AUTH, StepError

# --- registry credentials (docker config.json / .dockerconfigjson) ---------------------------


def _auth_key(key: str) -> str:
    key = re.sub(r"^https?://", "", key).rstrip("/")
    key = re.sub(r"/v[12]$", "", key)
    return "docker.io" if key in ("index.docker.io", "registry-1.docker.io") else key


def registry_credentials(authfile: str | None, registry: str, repository: str = "") -> tuple[str, str] | None:
    """Find `(username, password)` for `registry/repository` in a docker/podman authfile.

    Keys may carry a scheme, a `/v1/` suffix or a repository path (podman); the longest key that
    is a prefix of `registry/repository` wins. No authfile or no entry means anonymous access.
    """
    if not authfile:
        return None
    try:
        data = json.loads(Path(authfile).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StepError(f"cannot read authfile {authfile}: {exc}", EXIT_AUTH) from exc
    auths = data.get("auths", data) if isinstance(data, dict) else {}
    target = f"{_auth_key(registry)}/{repository}".rstrip("/")
    best: tuple[int, dict[str, Any]] | None = None
    for key, entry in auths.items():
        norm = _auth_key(key)
        if isinstance(entry, dict) and (target == norm or target.startswith(norm + "/")):
            if best is None or len(norm) > best[0]:
                best = (len(norm), entry)
    if best is None:
        return None
    entry = best[1]
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
        except ValueError as exc:
            raise StepError(f"authfile {authfile}: invalid base64 'auth' for {registry}", EXIT_AUTH) from exc
        return user, password
    if entry.get("username"):
        return str(entry["username"]), str(entry.get("password", ""))
    raise StepError(f"authfile {authfile}: entry for {registry} has no 'auth' or username/password", EXIT_AUTH)


# --- image references -----------------------------------------------------------------------

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        name, _, digest = text.partition("@")
        head, _, rest = name.partition("/")
        if not rest or not ("." in head or ":" in head or head == "localhost"):
            head, rest = "docker.io", name if rest else f"library/{name}"
        repo, tag = rest, None
        if ":" in rest.rsplit("/", 1)[-1]:
            repo, tag = rest.rsplit(":", 1)
        if not _REPO_RE.fullmatch(repo) or (tag is not None and not _TAG_RE.fullmatch(tag)):
            raise StepError(f"invalid image reference {text!r}")
        if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise StepError(f"invalid digest in image reference {text!r}")
        return cls(head, repo, tag, digest or None)

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")
