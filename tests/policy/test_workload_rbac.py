"""Policy `workload-rbac-scale-only`: the idle agent (and any Role the stack declares) may scale, never rewrite, a workload."""

from __future__ import annotations

from typing import Any

import pytest

from policy.rules import evaluate
from tests.conftest import run_objects, stack_objects
from tests.policy.objects import NS, item, meta

POLICY = ["workload-rbac-scale-only"]


def role(*rules: dict[str, Any], kind: str = "Role") -> Any:
    return item(
        f"kubernetes:rbac.authorization.k8s.io/v1:{kind}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": meta("agent"),
            "rules": list(rules),
        },
    )


SCALE_ONE = {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "resourceNames": ["app"], "verbs": ["get", "update"]}
EVENTS = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
RECORD = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["app-idle-stop"], "verbs": ["get", "update", "patch"]}


def messages(*rules: dict[str, Any], kind: str = "Role") -> list[str]:
    return [v.message for v in evaluate([role(*rules, kind=kind)], POLICY)]


def test_scale_of_one_statefulset_events_and_one_configmap_are_allowed() -> None:
    assert messages(SCALE_ONE, EVENTS, RECORD) == []


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": ["app"], "verbs": ["get", "patch"]},
            "grants ['patch'] on apps/statefulsets, which could change a pod template. Fix: scale through statefulsets/scale",
        ),
        (
            {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["update"]},
            "on statefulsets/scale of every object. Fix: limit it with resourceNames",
        ),
        (
            {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "resourceNames": ["app"], "verbs": ["delete"]},
            "grants ['delete'] on statefulsets/scale. Fix: grant only get/update/patch",
        ),
        ({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}, "on pods/exec, which runs code inside the pods"),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}, "grants ['delete'] on core/pods"),
        ({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}, "grants ['create'] on batch/jobs"),
        ({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["get"]}, "uses a wildcard"),
        ({"apiGroups": ["*"], "resources": ["statefulsets"], "verbs": ["get"]}, "uses a wildcard"),
    ],
)
def test_workload_writes_fire(rule: dict[str, Any], expected: str) -> None:
    found = messages(SCALE_ONE, rule)
    assert len(found) == 1 and expected in found[0], found
    assert found == messages(SCALE_ONE, rule, kind="ClusterRole")


def test_read_only_workload_access_is_quiet() -> None:
    assert messages({"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": ["get", "list", "watch"]}) == []


def test_the_rendered_idle_agent_role_passes_and_a_patch_role_would_not() -> None:
    objects = stack_objects("barcelona")
    objects["lifecycle"] = {"idleStop": {"enabled": True}}
    result = run_objects("barcelona", objects)
    assert result.error is None, result.error
    rendered = [(r.typ, r.inputs, r.options) for r in result.resources]
    assert [r for r in rendered if r[1].get("metadata", {}).get("name") == "ml-dev-env-idle-agent" and r[0].endswith(":Role")]
    assert evaluate(rendered, POLICY) == []
    role_inputs = next(r[1] for r in rendered if r[0].endswith(":Role") and r[1]["metadata"]["name"] == "ml-dev-env-idle-agent")
    widened = {
        **role_inputs,
        "rules": [
            *role_inputs["rules"],
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": ["ml-dev-env"], "verbs": ["patch"]},
        ],
    }
    [violation] = evaluate([("kubernetes:rbac.authorization.k8s.io/v1:Role", widened, {})], POLICY)
    assert violation.level == "mandatory" and violation.resource == f"Role {NS.replace('team', 'nccl-test')}/ml-dev-env-idle-agent"
