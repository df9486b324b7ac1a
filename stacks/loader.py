"""Read `ml-dev-env:*` Pulumi config into a validated `StackConfig`.

Mistakes become one `pulumi.RunError` listing every problem (no traceback). Secrets are read only
through Pulumi secrets and stay `Output` secrets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pydantic import ValidationError

from stacks.config import StackConfig
from stacks.errors import PREFIX, format_validation_error

# Secret config keys (always `pulumi config set --secret ml-dev-env:<key> …`) and what needs them.
SECRET_KEYS: dict[str, str] = {
    "vscodePassword": "code-server password (access.auth: token)",
    "jupyterToken": "Jupyter token (access.auth: token)",
    "quayDockerConfigJson": "Quay push credentials, a dockerconfigjson document (models)",
    "hfToken": "Hugging Face token (models with a huggingFace source marked gated: true)",
    "s3AccessKeyId": "S3 access key id (models with an s3 source or uploadToS3)",
    "s3SecretAccessKey": "S3 secret access key (models with an s3 source or uploadToS3)",
}


@dataclass(frozen=True)
class LoadedStack:
    config: StackConfig
    secrets: dict[str, pulumi.Output[str]]
    warnings: list[str] = field(default_factory=list)


def object_keys() -> list[str]:
    return [f.alias or name for name, f in StackConfig.model_fields.items()]


def _all_config() -> Mapping[str, Any]:
    from pulumi.runtime import config as runtime_config

    return runtime_config.CONFIG.get()


def parse_raw(raw_config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Split flat Pulumi config (`ml-dev-env:key` → JSON text) into objects; collect key errors."""
    known = set(object_keys()) | set(SECRET_KEYS)
    raw: dict[str, Any] = {}
    problems: list[str] = []
    for full_key, text in raw_config.items():
        if not full_key.startswith(PREFIX):
            continue
        key = full_key[len(PREFIX):]
        if key not in known:
            import difflib

            hint = difflib.get_close_matches(key, sorted(known), n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            problems.append(f"{full_key}: unknown key{suggestion}; allowed keys: {', '.join(sorted(known))}")
            continue
        if key in SECRET_KEYS:
            continue
        try:
            raw[key] = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError:
            problems.append(f"{full_key}: got {text!r}; must be an object (use `pulumi config set --path`)")
    return raw, problems


def validate(raw: Mapping[str, Any], source: str) -> StackConfig:
    """Validate raw objects; raise `pulumi.RunError` with one line per problem."""
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise pulumi.RunError(format_validation_error(exc, StackConfig, source)) from None


def warnings_for(config: StackConfig) -> list[str]:
    out = []
    net = config.network
    if net.mode == "rdma" and not net.rdma.enabled:
        out.append(
            f"network.mode is 'rdma' but network.rdma.enabled is false on cluster '{config.cluster.name}': "
            "deploying with TCP (NCCL_IB_DISABLE=1); the effective mode is in the 'network_mode' output"
        )
    if net.effective_mode == "tcp" and config.security.memlock.mode != "none":
        out.append("security.memlock is ignored in TCP mode: pods get no added capabilities (restricted-v2)")
    if net.effective_mode == "rdma" and config.security.memlock.mode == "none":
        out.append(
            "RDMA without security.memlock: pods keep the default 8 MiB memlock limit and NCCL may fail "
            "with IBV_WC_LOC_PROT_ERR; set memlock.mode 'scc'"
        )
    if config.image.build is not None and config.build_nodes.tolerations:
        out.append(
            "buildNodes.tolerations do not apply to BuildConfigs (OpenShift has no per-build tolerations; "
            "an admin sets them in build.config.openshift.io/cluster buildOverrides); nodeSelector does apply"
        )
    return out


def load(source: str) -> LoadedStack:
    """Load the current stack's configuration (inside a Pulumi program)."""
    raw, problems = parse_raw(_all_config())
    secrets: dict[str, pulumi.Output[str]] = {}
    cfg = pulumi.Config("ml-dev-env")
    for key in SECRET_KEYS:
        full_key = PREFIX + key
        if cfg.get(key) is None:
            continue
        if not pulumi.runtime.is_config_secret(full_key):
            problems.append(f"{full_key}: is stored in plain text; set it with `pulumi config set --secret {full_key} …`")
            continue
        secrets[key] = cfg.require_secret(key)
    if problems:
        head = f"invalid stack configuration in {source}"
        raise pulumi.RunError(head + ":\n" + "\n".join(f"  - {p}" for p in problems))
    config = validate(raw, source)
    missing = required_secrets(config) - secrets.keys()
    if missing:
        lines = [
            f"{PREFIX}{key}: missing; {SECRET_KEYS[key]} — set it with `pulumi config set --secret {PREFIX}{key} …`"
            for key in sorted(missing)
        ]
        raise pulumi.RunError(f"invalid stack configuration in {source}:\n" + "\n".join(f"  - {line}" for line in lines))
    return LoadedStack(config=config, secrets=secrets, warnings=warnings_for(config))


def required_secrets(config: StackConfig) -> set[str]:
    needed: set[str] = set()
    if config.access.auth == "token":
        if config.access.vscode:
            needed.add("vscodePassword")
        if config.access.jupyter:
            needed.add("jupyterToken")
    if config.models:
        needed.add("quayDockerConfigJson")
    if any(m.source.hugging_face and m.source.hugging_face.gated for m in config.models):
        needed.add("hfToken")
    if any(m.source.s3 or m.upload_to_s3 for m in config.models):
        needed |= {"s3AccessKeyId", "s3SecretAccessKey"}
    return needed
