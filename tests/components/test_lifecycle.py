"""Suspend / resume by config, the Pulumi-agent replicas handshake, agent RBAC and Kueue labels (rendered objects)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_objects, stack_objects
from tests.fixtures import schema_check
from tools.mock_engine import RunResult

STS = "kubernetes:apps/v1:StatefulSet"
CM = "kubernetes:core/v1:ConfigMap"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"


def render(stack: str = "barcelona", lifecycle: dict[str, Any] | None = None) -> RunResult:
    objects = stack_objects(stack)
    if lifecycle is not None:
        objects["lifecycle"] = lifecycle
    result = run_objects(stack, objects)
    assert result.error is None, result.error
    return result


def durable(result: RunResult) -> list[tuple[str, str, str]]:
    """Everything that must survive a suspend: every object but the StatefulSet, with its inputs."""
    return sorted((r.typ, r.name, json.dumps(r.inputs, sort_keys=True)) for r in result.resources if r.typ != STS)


@pytest.fixture(scope="module")
def running() -> RunResult:
    return render()


@pytest.fixture(scope="module")
def suspended() -> RunResult:
    return render(lifecycle={"suspended": True})


def test_suspend_is_replicas_zero_and_nothing_else(running: RunResult, suspended: RunResult) -> None:
    on, off = running.one(STS).inputs, suspended.one(STS).inputs
    assert on["spec"]["replicas"] == 2 and off["spec"]["replicas"] == 0
    # same template (same ordinals, same claims), same claim templates, same everything else
    assert {**off["spec"], "replicas": 2} == on["spec"]
    assert off["metadata"] == on["metadata"]
    assert durable(suspended) == durable(running)
    assert off["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert [t["metadata"]["name"] for t in off["spec"]["volumeClaimTemplates"]] == ["workspace", "checkpoints"]


def test_outputs_say_suspended_and_what_it_frees(running: RunResult, suspended: RunResult) -> None:
    out = suspended.outputs["lifecycle"]
    assert out["state"] == "suspended" and out["replicas"] == 0
    # barcelona: 2 pods x 4 H100, 4 SR-IOV NICs per pod
    assert out["frees"] == {"pods": 2, "gpus": 8, "rdmaNics": 8}
    assert "lifecycle.suspended' false" in out["resume"]
    assert running.outputs["lifecycle"]["state"] == "running"
    assert running.outputs["lifecycle"]["resume_after_idle_stop"] == "pulumi up --refresh"
    assert "frees" not in running.outputs["lifecycle"]
    # URLs stay exported while suspended (the routes are kept)
    assert suspended.outputs["vscode_url"] == running.outputs["vscode_url"] != ""


def test_tcp_suspend_frees_no_nics() -> None:
    assert render("nerc-production", {"suspended": True}).outputs["lifecycle"]["frees"]["rdmaNics"] == 0


def test_pulumi_and_the_agent_share_replicas_through_patch_force(running: RunResult) -> None:
    assert running.one(STS).inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"


def test_idle_settings_are_a_directory_mount_and_not_in_the_pod_hash(running: RunResult) -> None:
    busy = render(lifecycle={"idleStop": {"enabled": True, "idleTimeout": "2h", "interval": "30s", "warningLead": "15m"}})
    settings = json.loads(busy.one(CM, "gpu-lifecycle").inputs["data"]["idle.json"])
    assert settings == {
        "enabled": True,
        "idleTimeoutSeconds": 7200,
        "intervalSeconds": 30,
        "warningLeadSeconds": 900,
        "gpuUtilThreshold": 5,
        "gpuMemoryUtilThreshold": 5,
        "gpuMemoryFloorMiB": 1024,
        "unreachableSeconds": 600,
        "statefulset": "ml-dev-env",
        "namespace": "nccl-test",
        "recordConfigMap": "ml-dev-env-idle-stop",
        "activityPort": 9099,
        "servers": ["vscode", "jupyter", "tensorboard", "home"],
    }
    # toggling the idle stop changes no pod template (no restart), only the settings and the RBAC
    assert busy.one(STS).inputs["spec"]["template"] == running.one(STS).inputs["spec"]["template"]
    main = next(c for c in running.one(STS).inputs["spec"]["template"]["spec"]["containers"] if c["name"] == "ml-dev")
    mount = next(m for m in main["volumeMounts"] if m["name"] == "lifecycle")
    assert mount == {"name": "lifecycle", "mountPath": "/etc/ml-dev-env/lifecycle", "readOnly": True}
    startup = running.one(CM, "gpu-startup").inputs["data"]
    assert {"startup.sh", "idle_agent.py", "idle-warning.sh"} <= set(startup)  # the dev loop adds its scripts too


def test_stop_record_configmap_data_belongs_to_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pulumi creates the record ConfigMap but ignores its data (the agent writes it): no drift, no revert."""
    from tools import mock_engine

    seen: dict[str, list[str]] = {}
    real = mock_engine.RecordingMonitor.RegisterResource

    def spy(self: Any, request: Any) -> Any:
        seen[request.name] = list(request.ignoreChanges)
        return real(self, request)

    monkeypatch.setattr(mock_engine.RecordingMonitor, "RegisterResource", spy)
    result = render()
    assert result.one(CM, "gpu-idle-stop").inputs["metadata"]["name"] == "ml-dev-env-idle-stop"
    assert seen["gpu-idle-stop"] == ["data"]
    assert seen["gpu-lifecycle"] == [] and seen["gpu-statefulset"] == []


def test_agent_rbac_only_when_enabled_and_only_scale(running: RunResult) -> None:
    assert [r for r in running.of_type(ROLE) if "idle" in r.name] == []
    enabled = render(lifecycle={"idleStop": {"enabled": True}})
    role = enabled.one(ROLE, "gpu-idle-agent").inputs
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "resourceNames": ["ml-dev-env"], "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["ml-dev-env-idle-stop"], "verbs": ["get", "update", "patch"]},
    ]
    binding = enabled.one(BINDING, "gpu-idle-agent").inputs
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ml-dev-env-idle-agent"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ml-dev-sa", "namespace": "nccl-test"}]


def test_kueue_queue_label_only_on_the_statefulset(running: RunResult) -> None:
    queued = render(lifecycle={"kueue": {"queueName": "gpu-team"}})
    sts = queued.one(STS).inputs
    assert sts["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    # Kueue copies the label onto the pods itself; the pod template (and so the pods) stay as they were
    assert sts["spec"]["template"] == running.one(STS).inputs["spec"]["template"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in running.one(STS).inputs["metadata"]["labels"])
    assert queued.outputs["lifecycle"]["kueue_queue"] == "gpu-team"


@pytest.mark.parametrize(
    ("lifecycle", "message"),
    [
        (
            {"idleStop": {"idleTimeout": "5m"}},
            "ml-dev-env:lifecycle.idleStop.idleTimeout: got '5m'; between 900s and 86400s (admin bounds of the idle stop)",
        ),
        ({"idleStop": {"idleTimeout": "30h"}}, "ml-dev-env:lifecycle.idleStop.idleTimeout: got '30h'; between 900s and 86400s"),
        ({"idleStop": {"interval": "5s"}}, "ml-dev-env:lifecycle.idleStop.interval: got '5s'; between 15s and 300s"),
        (
            {"idleStop": {"idleTimeout": "20m", "warningLead": "30m"}},
            "ml-dev-env:lifecycle.idleStop.warningLead: got '30m'; must be shorter than idleTimeout (20m)",
        ),
        (
            {"idleStop": {"interval": "5m", "warningLead": "5m"}},
            "ml-dev-env:lifecycle.idleStop.interval: got '5m'; at most half of warningLead",
        ),
        ({"idleStop": {"idleTimeout": "1 hour"}}, "ml-dev-env:lifecycle.idleStop.idleTimeout: got '1 hour'; '1 hour' is not a duration"),
        (
            {"idleStop": {"gpuUtilThreshold": 90}},
            "ml-dev-env:lifecycle.idleStop.gpuUtilThreshold: got 90; input should be less than or equal to 50",
        ),
        ({"kueue": {"queueName": "Team_Q"}}, "ml-dev-env:lifecycle.kueue.queueName: got 'Team_Q'"),
        ({"suspend": True}, "ml-dev-env:lifecycle.suspend: unknown key (did you mean 'suspended'?)"),
    ],
)
def test_lifecycle_config_errors(lifecycle: dict[str, Any], message: str) -> None:
    objects = stack_objects("barcelona")
    objects["lifecycle"] = lifecycle
    result = run_objects("barcelona", objects)
    assert result.error is not None and message in result.error, result.error


@pytest.mark.parametrize("stack", ["barcelona", "nerc-production"])
def test_rendered_lifecycle_objects_pass_the_schema_check(stack: str, tmp_path: Path) -> None:
    from tools import render as render_tool

    result = render(stack, {"suspended": True, "idleStop": {"enabled": True}, "kueue": {"queueName": "team-queue"}})
    written = render_tool.write(result, tmp_path / stack)
    names = {path.name for _, _, path in written}
    assert {"configmap-ml-dev-env-lifecycle.yaml", "configmap-ml-dev-env-idle-stop.yaml", "role-ml-dev-env-idle-agent.yaml"} <= names
    proc = schema_check.check(str(tmp_path / stack))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"summary: {len(written)} ok, 0 invalid" in proc.stdout
