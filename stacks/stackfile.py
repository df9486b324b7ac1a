"""Mistakes in the text of `Pulumi.<stack>.yaml` that the parsed values no longer show.

A YAML mapping with a key twice keeps the last value silently (`count: 4` then `count: 2` gives 2 pods);
the Pulumi CLI hands the program values only, so the program (at preview and up) and the offline render
both re-read the file and run these checks. One line per mistake: file:line:col, the key and the fix.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

import yaml

PREFIX = "ml-dev-env:"
# The top-level keys of a Pulumi stack file (pulumi/pulumi sdk/go/common/workspace/project.go, ProjectStack).
STACK_FILE_KEYS = frozenset({"secretsprovider", "encryptedkey", "encryptionsalt", "config", "environment"})
# `secure:` values: the passphrase provider writes `v1:<nonce>:<ciphertext>`, both base64 (pulumi/pulumi
# sdk/go/common/resource/config/crypt.go, symmetricCrypter.EncryptValue); the service and cloud KMS providers
# write the ciphertext as one base64 string.
_PASSPHRASE = re.compile(r"^v1:[A-Za-z0-9+/]+={0,2}:[A-Za-z0-9+/]+={0,2}$")


def _base64(text: str) -> bool:
    try:
        return len(text) >= 16 and bool(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return False


def secure_problem(value: object, passphrase: bool = False) -> str | None:
    """None for a value the stack's secrets provider could have written; `passphrase`: the file has `encryptionsalt`,
    the passphrase provider's (pulumi/pulumi sdk/go/common/workspace/project.go ProjectStack.EncryptionSalt), whose
    values are always `v1:<nonce>:<ciphertext>` (a plaintext token that happens to be base64 is no secret there)."""
    if isinstance(value, str) and _PASSPHRASE.match(value):
        return None
    if isinstance(value, str) and _base64(value) and not passphrase:
        return None
    if passphrase:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 24 else repr(value[:21] + "...")
        return (
            f"`secure:` holds {shown}, not a value the passphrase provider (this file's encryptionsalt) encrypted "
            "(v1:<nonce>:<ciphertext>): set it again with `pulumi config set --secret <key> …` (never edit a secure value by hand)"
        )
    shown = repr(value) if not isinstance(value, str) or len(value) <= 24 else repr(value[:21] + "...")
    return (
        f"`secure:` holds {shown}, not a value Pulumi encrypted (v1:<nonce>:<ciphertext> or base64): set it again with "
        "`pulumi config set --secret <key> …` (never edit a secure value by hand)"
    )


_problems: dict[tuple[str, str], list[str]] = {}
"""`problems` by its arguments (a pure function of them: each render reads its stack file's text again)."""


def problems(text: str, name: str) -> list[str]:
    """Every text-level mistake of a stack file (empty when the YAML itself is broken: that is reported elsewhere)."""
    if (text, name) not in _problems:
        _problems[text, name] = _text_problems(text, name)
    return list(_problems[text, name])


def _text_problems(text: str, name: str) -> list[str]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []
    if not isinstance(root, yaml.MappingNode):
        return []
    out: list[str] = []
    passphrase = any(str(key.value) == "encryptionsalt" for key, _ in root.value)

    def at(node: yaml.Node) -> str:
        return f"{name}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, yaml.Node] = {}
            for key, value in node.value:
                k = str(key.value)
                where = f"{path}.{k}" if path and path != "config" else k  # keys as `pulumi config` names them
                if k in seen:
                    out.append(
                        f"{at(key)}: duplicate key {where!r} (first at line {seen[k].start_mark.line + 1}); YAML keeps the "
                        "last one silently: remove one of them"
                    )
                seen.setdefault(k, key)
                if k == "secure" and isinstance(value, yaml.ScalarNode | yaml.MappingNode | yaml.SequenceNode):
                    problem = secure_problem(value.value if isinstance(value, yaml.ScalarNode) else value, passphrase)
                    if problem:
                        out.append(f"{at(value)}: {path}: {problem}")
                    continue
                walk(value, where)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")

    walk(root, "")
    for key, value in root.value:
        k = str(key.value)
        if k in STACK_FILE_KEYS or not isinstance(value, yaml.MappingNode):
            continue
        if any(str(inner.value).startswith(PREFIX) for inner, _ in value.value):
            out.append(
                f"{at(key)}: the {PREFIX}* keys are under `{k}:`; Pulumi reads a stack's settings only under `config:` "
                f"(rename `{k}:` to `config:`)"
            )
    return out


# A label value (k8s.io/apimachinery pkg/util/validation/validation.go IsValidLabelValue): every object carries the
# stack name as its `ml-dev-env/stack` label (components/environment.py stack_label_transformation).
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def stack_name_problem(path: Path) -> str | None:
    """A stack name the objects' `ml-dev-env/stack` label cannot carry (Pulumi allows up to 100 characters)."""
    name = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    if len(name) <= 63 and _LABEL_VALUE.match(name):
        return None
    return (
        f"{path.name}: the stack name {name!r} ({len(name)} characters) is no label value: every object carries it as "
        "its ml-dev-env/stack label, at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )


def file_problems(path: Path) -> list[str]:
    name_problem = stack_name_problem(path)
    try:
        return ([name_problem] if name_problem else []) + problems(path.read_text(), path.name)
    except OSError:
        return [name_problem] if name_problem else []
