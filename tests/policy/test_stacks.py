"""The real program passes every policy on every stack (and the variants the config allows), and the
policies really follow the real objects: breaking one invariant in a real stack's output fires."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from policy.rules import evaluate, format_report
from tests.conftest import STACKS, run_objects, stack_objects, tcp_shared_variant
from tests.policy.objects import Item, secret_placeholders, stack_items


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_passes_every_policy(stack: str) -> None:
    items = stack_items(stack)
    assert len(items) > 10
    violations = evaluate(items)
    assert violations == [], format_report(violations)


def _token(o: dict[str, Any]) -> None:
    o["access"] = {"auth": "token", "tensorboard": False}


def _privileged(o: dict[str, Any]) -> None:
    o["security"]["memlock"] = {"mode": "privileged"}
    o["security"]["createServiceAccount"] = False
    o["cluster"]["createNamespace"] = True


VARIANTS: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "barcelona-token-auth": ("barcelona", _token),
    "barcelona-privileged-memlock-created-namespace": ("barcelona", _privileged),
    "barcelona-tcp-shared": ("barcelona", tcp_shared_variant),
    "nerc-production-token-auth": ("nerc-production", _token),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_allowed_variants_pass_every_policy(variant: str) -> None:
    stack, mutate = VARIANTS[variant]
    objects = stack_objects(stack)
    mutate(objects)
    result = run_objects(stack, objects, secret_placeholders())
    assert result.error is None, result.error
    violations = evaluate([(r.typ, r.inputs, r.options) for r in result.resources])
    assert violations == [], format_report(violations)


# ------------------------------------------------------------- breaking a real stack fires the rule


def _find(items: list[Item], kind: str, name: str | None = None) -> Item:
    found = [i for i in items if i[0].endswith(f":{kind}") and (name is None or i[1]["metadata"]["name"] == name)]
    assert found, f"no {kind} {name or ''} in the stack"
    return found[0]


def _pod(items: list[Item]) -> dict[str, Any]:
    return _find(items, "StatefulSet")[1]["spec"]["template"]["spec"]


def _policies(items: list[Item]) -> set[str]:
    return {v.policy for v in evaluate(items)}


def test_real_route_chain_is_resolved_to_the_proxy() -> None:
    items = stack_items("nerc-production")
    for c in _pod(items)["containers"]:
        if c["name"] == "jupyter-proxy":
            c["args"] = [a for a in c["args"] if not a.startswith("--provider")]
    [violation] = evaluate(items, policies=["routes-require-authentication"])
    assert violation.resource.endswith("/ml-dev-env-jupyter")
    assert "-> StatefulSet coops-767192/ml-dev-env port 'p-jupyter': container 'jupyter-proxy'" in violation.message


def test_real_route_to_the_bare_dev_server_fires() -> None:
    items = stack_items("barcelona")
    _pod(items)["containers"][0]["ports"].append({"name": "vscode", "containerPort": 8080})
    for port in _find(items, "Service", "ml-dev-env")[1]["spec"]["ports"]:
        port["targetPort"] = port["name"]
    assert "routes-require-authentication" in _policies(items)


def test_real_rdma_pod_needs_its_scc_binding() -> None:
    items = [i for i in stack_items("barcelona") if not i[0].endswith(":RoleBinding")]
    assert _policies(items) == {"privileges-require-scc-binding"}
    items = stack_items("barcelona")
    _find(items, "SecurityContextConstraints")[1]["allowedCapabilities"] = ["IPC_LOCK"]
    assert _policies(items) == {"privileges-require-scc-binding"}


def test_real_tcp_pod_with_added_capabilities_fires() -> None:
    items = stack_items("nerc-production")
    _pod(items)["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    assert _policies(items) == {"privileges-require-scc-binding"}


def test_real_gpu_limits_and_retention_are_checked() -> None:
    items = stack_items("barcelona")
    _pod(items)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    _find(items, "StatefulSet")[1]["spec"].pop("persistentVolumeClaimRetentionPolicy")
    _find(items, "PersistentVolumeClaim")[2]["retain_on_delete"] = False
    assert _policies(items) == {"gpu-requests-equal-limits", "persistent-data-retained"}
    assert len(evaluate(items, policies=["persistent-data-retained"])) == 2


def test_real_image_and_env_are_checked() -> None:
    items = stack_items("nerc-production")
    main = _pod(items)["containers"][0]
    main["image"] = main["image"].rsplit(":", 1)[0]
    main["env"].append({"name": "HF_TOKEN", "value": "hf_" + "x" * 34})
    assert _policies(items) == {"images-pinned", "no-plaintext-credentials"}


def test_real_pipeline_runs_are_traced_to_their_task_steps() -> None:
    items = stack_items("barcelona")
    runs = [i for i in items if i[0] == "kubernetes:tekton.dev/v1:PipelineRun"]
    tasks = [i for i in items if i[0] == "kubernetes:tekton.dev/v1:Task"]
    if not runs or not tasks:
        pytest.skip("this stack declares no model pipeline")
    tasks[0][1]["spec"]["steps"][0]["securityContext"] = {"privileged": True}
    violations = evaluate(items, policies=["privileges-require-scc-binding"])
    assert {v.resource for v in violations} == {f"PipelineRun {r[1]['metadata']['namespace']}/{r[1]['metadata']['name']}" for r in runs}
    tasks[0][1]["spec"]["steps"][0]["computeResources"] = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}
    tasks[0][1]["spec"]["steps"][0]["resources"] = {"requests": {"memory": "1Gi"}}
    assert _policies(items) == {"privileges-require-scc-binding", "gpu-requests-equal-limits", "tekton-v1-compute-resources"}
