"""env.secrets on the render side: the config's checks (one line per mistake), the Secret volumes of every stack
(schema-valid, read-only, no subPath, 0440, optional, only the listed keys), names in devloop.env, no value anywhere,
and the guard rail (policy `user-secrets-stay-the-users`) that no such Secret is created, read or put in an env."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from components import pod
from inpod import contract
from inpod.lib import usersecrets
from policy.rules import evaluate
from policy.rules import user_secrets_stay_the_users as rule
from stacks.config import StackConfig
from tests.conftest import run_objects, stack_objects
from tests.fixtures import schema_check
from tools.mock_engine import RunResult

STACKS = ["barcelona", "nerc-production", "barcelona-alice"]
SECRETS = [{"secret": "wandb", "keys": ["WANDB_API_KEY"]}, {"secret": "hf.user", "keys": ["HF_TOKEN", "HF_HOME_TOKEN"]}]


def with_secrets(stack: str, secrets: list[dict[str, Any]] | None = None) -> RunResult:
    objects = stack_objects(stack)
    objects["env"] = {"secrets": copy.deepcopy(SECRETS if secrets is None else secrets)}
    result = run_objects(stack, objects)
    assert result.error is None, result.error
    return result


def statefulset(result: RunResult) -> dict[str, Any]:
    return next(r.inputs for r in result.resources if r.kind == "StatefulSet")


@pytest.mark.parametrize("stack", STACKS)
def test_every_pod_mounts_the_named_secrets_read_only(stack: str) -> None:
    sts = statefulset(with_secrets(stack))
    spec = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"] if "secret" in v and v["secret"]["secretName"] in ("wandb", "hf.user")}
    assert [v["secret"]["secretName"] for v in volumes.values()] == ["wandb", "hf.user"]
    for v in volumes.values():
        src = v["secret"]
        assert src["defaultMode"] == 0o440 and not src["defaultMode"] & 0o007, "never world-readable"
        assert src["optional"] is True
        keys = next(s["keys"] for s in SECRETS if s["secret"] == src["secretName"])
        assert src["items"] == [{"key": k, "path": k} for k in keys], "only the listed keys, at their own names"
    main = spec["containers"][0]
    mounts = {m["name"]: m for m in main["volumeMounts"] if m["name"] in volumes}
    assert {m["mountPath"] for m in mounts.values()} == {f"{contract.SECRETS_MOUNT}/wandb", f"{contract.SECRETS_MOUNT}/hf.user"}
    assert all(m["readOnly"] is True and "subPath" not in m and "subPathExpr" not in m for m in mounts.values())
    for other in spec["containers"][1:]:  # the proxies never see them
        assert not {m["name"] for m in other.get("volumeMounts") or []} & set(volumes)
    assert not [
        e
        for e in main["env"]
        if "secretKeyRef" in (e.get("valueFrom") or {}) and e["valueFrom"]["secretKeyRef"]["name"] in ("wandb", "hf.user")
    ]
    assert sts["spec"]["template"]["metadata"]["annotations"][pod.USER_SECRETS_ANNOTATION] == "wandb,hf.user"


@pytest.mark.parametrize("stack", STACKS)
def test_devloop_env_lists_the_names(stack: str) -> None:
    result = with_secrets(stack)
    data = next(r.inputs["data"] for r in result.resources if r.kind == "ConfigMap" and "devloop.env" in (r.inputs.get("data") or {}))
    path = Path("/nonexistent")
    listed = usersecrets.parse(
        next(line for line in data["devloop.env"].splitlines() if line.startswith(contract.SECRETS_ENV + "=")).split("=", 1)[1].strip("'")
    )
    assert listed == [("wandb", "WANDB_API_KEY"), ("hf.user", "HF_TOKEN"), ("hf.user", "HF_HOME_TOKEN")]
    assert usersecrets.presence(listed, path) == {"wandb": {"WANDB_API_KEY": False}, "hf.user": {"HF_TOKEN": False, "HF_HOME_TOKEN": False}}


def test_no_secrets_renders_no_volume_and_an_empty_list() -> None:
    result = run_objects("barcelona", stack_objects("barcelona"))
    sts = statefulset(result)
    assert not [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"].startswith("user-secret")]
    assert pod.USER_SECRETS_ANNOTATION not in sts["spec"]["template"]["metadata"]["annotations"]
    data = next(r.inputs["data"] for r in result.resources if r.kind == "ConfigMap" and "devloop.env" in (r.inputs.get("data") or {}))
    assert f"{contract.SECRETS_ENV}=''" in data["devloop.env"].splitlines()


@pytest.mark.parametrize("stack", STACKS)
def test_rendered_objects_pass_the_schema_check(stack: str, tmp_path: Path) -> None:
    from tools import render as render_tool

    written = render_tool.write(with_secrets(stack), tmp_path / stack)
    proc = schema_check.check(str(tmp_path / stack))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"summary: {len(written)} ok, 0 invalid" in proc.stdout


@pytest.mark.parametrize(
    ("secrets", "line"),
    [
        ([{"secret": "wandb", "keys": ["wandb-key"]}], "ml-dev-env:env.secrets[0].keys[0]: got 'wandb-key'; an environment variable name"),
        ([{"secret": "wandb", "keys": ["1KEY"]}], "ml-dev-env:env.secrets[0].keys[0]: got '1KEY'; an environment variable name"),
        ([{"secret": "wandb", "keys": ["PATH"]}], "ml-dev-env:env.secrets[0].keys[0]: got 'PATH'; a name the pod sets itself (PATH)"),
        ([{"secret": "w", "keys": ["NODE_RANK"]}], "ml-dev-env:env.secrets[0].keys[0]: got 'NODE_RANK'; a name the pod sets itself"),
        ([{"secret": "w", "keys": ["NCCL_IB_HCA"]}], "ml-dev-env:env.secrets[0].keys[0]: got 'NCCL_IB_HCA'; a name the pod sets itself"),
        ([{"secret": "Wandb", "keys": ["K"]}], "ml-dev-env:env.secrets[0].secret: got 'Wandb'"),
        ([{"secret": "w", "keys": []}], "ml-dev-env:env.secrets[0].keys: got []"),
        ([{"secret": "w", "keys": ["K", "K"]}], "ml-dev-env:env.secrets[0].keys: got ['K']; each key once"),
        ([{"secret": "w", "keys": ["K"]}, {"secret": "w", "keys": ["L"]}], "ml-dev-env:env.secrets[].secret: got ['w']; each Secret once"),
        (
            [{"secret": "a", "keys": ["K"]}, {"secret": "b", "keys": ["K"]}],
            "ml-dev-env:env.secrets[].keys: got ['K']; a variable comes from one Secret only",
        ),
        (
            [{"secret": "ml-dev-env-ssh", "keys": ["K"]}],
            "ml-dev-env:env.secrets[0].secret: got 'ml-dev-env-ssh'; a Secret the stacks create (this stack's SSH keys)",
        ),
        (
            [{"secret": "model-pipeline-hf", "keys": ["HF_TOKEN"]}],
            "ml-dev-env:env.secrets[0].secret: got 'model-pipeline-hf'; a Secret the stacks create (the model pipeline's",
        ),
        (
            [{"secret": "ml-dev-env-bob-oauth-cookie", "keys": ["K"]}],
            "got 'ml-dev-env-bob-oauth-cookie'; a Secret the stacks create (another environment's OAuth cookie)",
        ),
        ([{"secret": "w", "keys": ["K"], "value": "x"}], "ml-dev-env:env.secrets[0].value: unknown key"),
    ],
)
def test_each_mistake_is_one_line_naming_key_value_and_what_is_allowed(secrets: list[dict[str, Any]], line: str) -> None:
    objects = stack_objects("nerc-production")
    objects["env"] = {"secrets": secrets}
    result = run_objects("nerc-production", objects)
    assert result.error is not None and line in result.error, result.error
    assert "Traceback" not in result.error


@pytest.mark.parametrize(
    ("secret", "what"), [("ml-dev-env-ssh", "the cluster stack's SSH keys"), ("model-pipeline-s3", "the model pipeline's")]
)
def test_an_environment_stack_may_not_list_its_clusters_secrets(secret: str, what: str) -> None:
    objects = stack_objects("barcelona-alice")
    objects["env"] = {"secrets": [{"secret": secret, "keys": ["K"]}]}
    error = run_objects("barcelona-alice", objects).error or ""
    assert f"ml-dev-env:env.secrets[0].secret: got '{secret}'; a Secret the stacks create ({what}" in error, error
    assert "oc create secret generic" in error and "Traceback" not in error


def test_all_mistakes_of_a_run_together() -> None:
    objects = stack_objects("nerc-production")
    objects["env"] = {"secrets": [{"secret": "w", "keys": ["a-b"]}, {"secret": "v", "keys": ["PATH"]}]}
    objects["nodes"]["count"] = 0
    error = run_objects("nerc-production", objects).error or ""
    assert "env.secrets[0].keys[0]" in error and "env.secrets[1].keys[0]" in error and "nodes.count" in error


def test_the_stack_never_holds_a_value() -> None:
    """Names only: nothing the program produces (objects, outputs, state) holds more than the name."""
    value = "v4lue-the-stack-must-never-see-0123"
    result = with_secrets("nerc-production")
    dumped = json.dumps([r.inputs for r in result.resources], default=str) + json.dumps(result.outputs, default=str)
    assert value not in dumped
    fields = StackConfig.model_json_schema(by_alias=True)["$defs"]["SecretRef"]["properties"]
    assert set(fields) == {"secret", "keys"}, "the schema has no place for a value"


# ------------------------------------------------------------------------------------------ the guard rail


def _items(result: RunResult) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(r.typ, copy.deepcopy(r.inputs), dict(r.options)) for r in result.resources]


def rule_messages(items: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[str]:
    return [v.message for v in evaluate(items, ["user-secrets-stay-the-users"])]


@pytest.mark.parametrize("stack", STACKS)
def test_the_guard_rail_passes_every_rendered_stack(stack: str) -> None:
    assert rule_messages(_items(with_secrets(stack))) == []


def test_the_annotation_is_the_rules() -> None:
    assert pod.USER_SECRETS_ANNOTATION == rule.USER_SECRETS_ANNOTATION


def test_the_guard_rail_refuses_a_created_or_read_secret_and_a_world_readable_or_subpath_mount() -> None:
    items = _items(with_secrets("nerc-production"))
    ns = next(i[1] for i in items if i[1].get("kind") == "StatefulSet" or i[0].endswith("StatefulSet"))["metadata"]["namespace"]
    created: tuple[str, dict[str, Any], dict[str, Any]] = (
        "kubernetes:core/v1:Secret",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wandb", "namespace": ns}, "stringData": {"WANDB_API_KEY": "x"}},
        {},
    )
    assert any("Secret wandb is one of the user's" in m for m in rule_messages([*items, created]))
    other: tuple[str, dict[str, Any], dict[str, Any]] = (
        "kubernetes:core/v1:Secret",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wandb", "namespace": "elsewhere"}},
        {},
    )
    assert rule_messages([*items, other]) == []
    bad = copy.deepcopy(items)
    sts = next(i[1] for i in bad if i[0].endswith("StatefulSet"))
    spec = sts["spec"]["template"]["spec"]
    spec["containers"][0]["env"].append({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "WANDB_API_KEY"}}})
    spec["containers"][0].setdefault("envFrom", []).append({"secretRef": {"name": "hf.user"}})
    vol = next(v for v in spec["volumes"] if v["name"] == "user-secret-0")
    vol["secret"]["defaultMode"] = 0o444
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "user-secret-1")
    mount["subPath"] = "HF_TOKEN"
    mount["readOnly"] = False
    messages = rule_messages(bad)
    assert any("valueFrom.secretKeyRef takes the user's Secret wandb" in m for m in messages)
    assert any("envFrom.secretRef takes the user's Secret hf.user" in m for m in messages)
    assert any("world-readable" in m for m in messages)
    assert any("uses subPath" in m for m in messages) and any("is not readOnly" in m for m in messages)


def _without_annotation(items: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    sts = next(i[1] for i in items if i[0].endswith("StatefulSet"))
    sts["spec"]["template"]["metadata"]["annotations"].pop(pod.USER_SECRETS_ANNOTATION)
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    ("what", "edit", "said"),
    RAIL_CASES := [
        (
            "envFrom in the main container",
            lambda spec: spec["containers"][0].setdefault("envFrom", []).append({"secretRef": {"name": "wandb"}}),
            "envFrom.secretRef takes the user's Secret wandb",
        ),
        (
            "env in an init container",
            lambda spec: spec.setdefault("initContainers", []).append(
                {"name": "init", "image": "x", "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "other-team", "key": "T"}}}]}
            ),
            "valueFrom.secretKeyRef takes the user's Secret other-team",
        ),
        (
            "a projected volume in a sidecar",
            lambda spec: (
                spec["volumes"].append({"name": "p", "projected": {"sources": [{"secret": {"name": "wandb"}}]}}),
                spec["containers"][1].setdefault("volumeMounts", []).append({"name": "p", "mountPath": "/p", "readOnly": True}),
            ),
            "volume p projects the user's Secret wandb",
        ),
        (
            "the env.secrets volume in a sidecar",
            lambda spec: (
                spec["containers"][1].setdefault("volumeMounts", []).append({"name": "user-secret-0", "mountPath": "/s", "readOnly": True})
            ),
            f"container {'{'}sidecar{'}'} mounts user-secret-0, the user's Secret wandb",
        ),
    ],
    ids=[c[0] for c in RAIL_CASES],
)
def test_the_guard_rail_reads_the_objects_whatever_the_annotation_says(what: str, edit: Any, said: str) -> None:
    """The annotation removed: a Secret the stack refers to and does not create is the user's all the same."""
    items = _items(with_secrets("nerc-production"))
    spec = _without_annotation(items)
    assert rule_messages(items) == [], "the rendered volumes, main container only, pass without the annotation too"
    edit(spec)
    sidecar = spec["containers"][1]["name"]
    messages = rule_messages(items)
    assert any(said.replace("{sidecar}", sidecar) in m for m in messages), (what, messages)
    assert all("Fix:" in m for m in messages)


def test_an_environment_stack_never_inherits_the_clusters_secrets() -> None:
    """Like `ssh`: the cluster owner's Secrets never reach another person's pods; the environment names its own."""
    from stacks.environment import environment_config
    from tests.conftest import stack_objects as objects_of

    cluster = objects_of("barcelona")
    cluster["env"] = {"secrets": [{"secret": "owners-wandb", "keys": ["WANDB_API_KEY"]}]}
    alice = objects_of("barcelona-alice")
    raw, problems = environment_config(cluster, alice)
    assert problems == [] and raw["env"] == {}
    alice["env"] = {"secrets": [{"secret": "alice-wandb", "keys": ["WANDB_API_KEY"]}]}
    raw, problems = environment_config(cluster, alice)
    assert problems == [] and raw["env"]["secrets"][0]["secret"] == "alice-wandb"


def test_the_program_has_no_way_to_read_a_secret() -> None:
    """`k8s.core.v1.Secret.get(...)` would read a Secret (its data) into the stack's state: the program never calls it,
    so no Secret of env.secrets can be read (the policy rule holds the objects; this holds the code)."""
    import ast

    from tests.conftest import ROOT

    found = []
    for path in [ROOT / "__main__.py", *sorted((ROOT / "components").rglob("*.py")), *sorted((ROOT / "stacks").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "get"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "Secret"
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
