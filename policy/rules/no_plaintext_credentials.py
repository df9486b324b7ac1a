"""Policy 7: no plaintext credentials."""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from collections.abc import Iterator, Mapping

from .query import MANDATORY, REDACTED, PolicySpec, Resource, _get, _m, _seq, _str, container_likes, is_unknown, walk

# --------------------------------------------------------------------- 7. no plaintext credentials

SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "token", "secret", "apikey", "credential", "credentials", "privatekey"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("client", "secret")})
NOT_A_VALUE = frozenset({"file", "path", "dir", "name", "ref", "url", "uri", "endpoint", "mount", "type", "header", "env", "len", "length"})
CREDENTIAL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,})\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----\s*[A-Za-z0-9+/=\s]{40,}")),
    (
        "registry credentials (dockerconfigjson auths)",
        re.compile(r'"auths"\s*:\s*\{.*?"(?:auth|password|identitytoken)"\s*:\s*"[^"]{4,}"', re.S),
    ),
    ("an AWS secret access key", re.compile(r"(?i)aws_secret_access_key\s*[=:]\s*[\"']?[A-Za-z0-9/+]{40}\b")),
)
# `NAME=literal` / `name: literal` lines of env files, properties and YAML configs (not `$VAR` expansions).
_ASSIGNMENT = re.compile(r"""^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*[=:]\s*(["']?)([^\s"'$`{}()<>|;&]{8,})\2\s*$""", re.M)


def _words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def looks_secret_name(name: str) -> bool:
    """`HF_TOKEN`, `PASSWORD`, `aws_secret_access_key`, `apiKey`... but not `NCCL_*`,
    `HF_TOKEN_FILE`/`*_PATH`/`*_NAME` (references, not values) or `TOKENIZERS_PARALLELISM`."""
    if name.upper().startswith("NCCL_"):
        return False
    words = _words(name)
    if not words or words[-1] in NOT_A_VALUE:
        return False
    return any(w in SECRET_WORDS for w in words) or any(pair in SECRET_PAIRS for pair in itertools.pairwise(words))


def credential_in(text: str) -> str | None:
    """What credential `text` contains (never the value itself), or None."""
    for what, pattern in CREDENTIAL_PATTERNS:
        if pattern.search(text):
            return what
    for match in _ASSIGNMENT.finditer(text):
        name, value = match.group(1), match.group(3)
        if looks_secret_name(name) and not value.startswith("/") and value != REDACTED:
            return f"a literal value for {name}"
    return None


SECRET_FIX = (
    "Fix: keep the value in a Secret (declared by the stack from a Pulumi secret: `pulumi config set --secret`) and "
    "reference it with env valueFrom.secretKeyRef or a secret volume; if the value is not a credential (a file path "
    "or an object name), name the variable *_FILE/*_PATH/*_NAME."
)


def check_no_plaintext_credentials(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes:
        return
    if res.base_kind == "ConfigMap" and res.group == "":
        for section in ("data", "binaryData"):
            for key, value in _m(res.inputs.get(section)).items():
                text = _str(value)
                if text is None:
                    continue
                if section == "binaryData":
                    try:
                        text = base64.b64decode(text, validate=True).decode("utf-8", "replace")
                    except (binascii.Error, ValueError):
                        continue
                if looks_secret_name(key) and text.strip():
                    yield (
                        f"{section}[{key!r}] holds a credential-named value in a ConfigMap (readable by anyone who "
                        f"can read ConfigMaps). {SECRET_FIX}"
                    )
                elif text == REDACTED:
                    yield f"{section}[{key!r}] embeds a Pulumi secret in a plain ConfigMap. {SECRET_FIX}"
                else:
                    found = credential_in(text)
                    if found:
                        yield f"{section}[{key!r}] contains {found}. {SECRET_FIX}"
    for path, key, value in walk(res.inputs):
        if key not in ("env", "buildArgs"):  # container/step env; Docker build args end up in image history
            continue
        where = f"{path}.{key}" if path else key
        for item in _seq(value):
            item = _m(item)
            name, literal = _str(item.get("name")), item.get("value")
            if name is None:
                continue
            if isinstance(literal, str) and not is_unknown(literal) and literal:
                if looks_secret_name(name):
                    yield f"{where}[{name}] sets a credential-named variable from a literal value. {SECRET_FIX}"
                elif literal == REDACTED:
                    yield f"{where}[{name}] embeds a Pulumi secret as a literal env value (visible in the pod spec). {SECRET_FIX}"
                else:
                    found = credential_in(literal)
                    if found:
                        yield f"{where}[{name}] contains {found}. {SECRET_FIX}"
            elif looks_secret_name(name) and isinstance(_get(item, "valueFrom", "configMapKeyRef"), Mapping):
                yield f"{where}[{name}] reads a credential-named variable from a ConfigMap. {SECRET_FIX}"
    for where, container in container_likes(res):
        argv = [a for a in _seq(container.get("command")) + _seq(container.get("args")) if isinstance(a, str) and not is_unknown(a)]
        script = _str(container.get("script"))
        for text in [*argv, *([script] if script else [])]:
            found = next((w for w, p in CREDENTIAL_PATTERNS if p.search(text)), None)
            if found:
                yield f"{where}: command/args/script contain {found}. {SECRET_FIX}"
                break


POLICY = PolicySpec(
    "no-plaintext-credentials",
    MANDATORY,
    "resource",
    "No credential in a ConfigMap or a literal env value: credential-named keys/variables (password, token, "
    "secret, api key, access key, private key; not NCCL_* or *_FILE/*_PATH/*_NAME) come from a Secret, and no "
    "value looks like a credential (AWS/Hugging Face/GitHub tokens, private keys, dockerconfigjson auths).",
    "Move the value into a Secret created from a Pulumi secret and reference it with valueFrom.secretKeyRef.",
    check_no_plaintext_credentials,
    order=7,
)
