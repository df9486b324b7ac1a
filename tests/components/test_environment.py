"""Team environments on one cluster: cluster stack + environment stacks, no object with two owners.

Runs the committed barcelona stack and its two example environments (barcelona-alice in the cluster's
namespace, barcelona-bob in its own) through the real program.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from components.environment import STACK_LABEL, api_path, ownership_conflict, stack_label_transformation
from stacks.environment import FACTS_OUTPUT, FACTS_VERSION
from tests.conftest import ROOT, STACKS, run_objects, stack_objects
from tools.mock_engine import ORGANIZATION, RunResult, run_program, stack_config

ENVIRONMENTS = [s for s in STACKS if "environment" in stack_objects(s)]
SHARED_KINDS = {"BuildConfig", "ImageStream", "Task", "Pipeline", "PipelineRun", "SecurityContextConstraints", "Job", "Namespace"}


def render(stack: str, **kwargs: Any) -> RunResult:
    result = run_objects(stack, stack_objects(stack), **kwargs)
    assert result.error is None, result.error
    return result


def objects(result: RunResult) -> list[dict[str, Any]]:
    return [r.inputs for r in result.resources if r.typ.startswith("kubernetes:") and "kind" in r.inputs]


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


@pytest.fixture(scope="module")
def renders() -> dict[str, RunResult]:
    return {stack: render(stack) for stack in ["barcelona", *ENVIRONMENTS]}


def test_two_example_environments_of_at_most_15_lines() -> None:
    examples = {s: stack_objects(s)["environment"] for s in ENVIRONMENTS}
    assert {e["cluster"] for e in examples.values()} == {"barcelona"}
    assert any("namespace" in e for e in examples.values()) and any("namespace" not in e for e in examples.values())
    for stack in ENVIRONMENTS:
        lines = (ROOT / f"Pulumi.{stack}.yaml").read_text().splitlines()
        assert len(lines) <= 15, f"Pulumi.{stack}.yaml has {len(lines)} lines"


def test_no_object_has_two_owners(renders: dict[str, RunResult]) -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for stack, result in renders.items():
        for obj in objects(result):
            assert key(obj) not in seen, f"{key(obj)} is rendered by {seen.get(key(obj))} and {stack}"
            seen[key(obj)] = stack


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_an_environment_owns_only_its_own_objects(renders: dict[str, RunResult], stack: str) -> None:
    name = stack_objects(stack)["environment"]["name"]
    for obj in objects(renders[stack]):
        assert obj["kind"] not in SHARED_KINDS, key(obj)
        assert obj["metadata"].get("namespace"), f"cluster-scoped {key(obj)}"
        assert name in obj["metadata"]["name"], f"{key(obj)} does not carry the environment name {name!r}"


def test_every_object_carries_its_stack_label_and_pod_templates_stay(renders: dict[str, RunResult]) -> None:
    for stack, result in renders.items():
        for obj in objects(result):
            assert obj["metadata"]["labels"][STACK_LABEL] == stack, key(obj)
            template = (obj.get("spec") or {}).get("template")
            if isinstance(template, dict):
                assert STACK_LABEL not in (template.get("metadata") or {}).get("labels", {}), key(obj)


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_its_service_account_redirects_to_its_own_routes_only(renders: dict[str, RunResult], stack: str) -> None:
    result = renders[stack]
    routes = {o["metadata"]["name"] for o in objects(result) if o["kind"] == "Route"}
    (sa,) = [o for o in objects(result) if o["kind"] == "ServiceAccount"]
    refs = [json.loads(v)["reference"]["name"] for k, v in sa["metadata"]["annotations"].items() if "oauth-redirectreference" in k]
    assert refs and set(refs) == routes
    (sts,) = [o for o in objects(result) if o["kind"] == "StatefulSet"]
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_its_pods_run_exactly_the_cluster_runtime_tag(renders: dict[str, RunResult], stack: str) -> None:
    runtime = renders["barcelona"].outputs["runtime_image"]
    (sts,) = [o for o in objects(renders[stack]) if o["kind"] == "StatefulSet"]
    (main,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "ml-dev"]
    assert main["image"] == runtime and renders[stack].outputs["image"] == runtime


def test_in_its_own_namespace_it_pulls_the_cluster_image_and_has_its_own_claims(renders: dict[str, RunResult]) -> None:
    cluster_ns = stack_objects("barcelona")["cluster"]["namespace"]
    for stack in ENVIRONMENTS:
        env = stack_objects(stack)["environment"]
        objs = objects(renders[stack])
        pullers = [o for o in objs if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == "system:image-puller"]
        claims = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
        (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
        mounted = {
            v["persistentVolumeClaim"]["claimName"] for v in sts["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v
        }
        if env.get("namespace"):
            (binding,) = pullers
            assert binding["metadata"]["namespace"] == cluster_ns
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": sts["spec"]["template"]["spec"]["serviceAccountName"], "namespace": env["namespace"]}
            ]
            assert mounted == {c["metadata"]["name"] for c in claims} and all(
                c["metadata"]["namespace"] == env["namespace"] for c in claims
            )
        else:
            assert not pullers and not claims
            cluster_claims = {o["metadata"]["name"] for o in objects(renders["barcelona"]) if o["kind"] == "PersistentVolumeClaim"}
            assert mounted == cluster_claims


def test_the_cluster_stack_exports_versioned_facts(renders: dict[str, RunResult]) -> None:
    facts = renders["barcelona"].outputs[FACTS_OUTPUT]
    assert facts["version"] == FACTS_VERSION and facts["runtimeImage"] == renders["barcelona"].outputs["runtime_image"]


def env_config(stack: str, **changes: Any) -> dict[str, Any]:
    config = stack_config(ROOT / f"Pulumi.{stack}.yaml")
    for k, v in changes.items():
        config[f"ml-dev-env:{k}"] = v
    return config


def test_an_environment_whose_cluster_was_never_deployed_stops_with_one_line() -> None:
    result = run_program("barcelona-alice", env_config("barcelona-alice"), stack_outputs={})
    assert result.error is not None and len(result.error.strip().splitlines()) == 1
    assert f"cluster stack {ORGANIZATION}/ml-dev-env/barcelona has no environment_facts output" in result.error
    assert "pulumi up -s barcelona" in result.error


def test_a_cluster_deployed_with_other_settings_stops_it() -> None:
    outputs = render("barcelona").outputs
    stale = {**outputs, FACTS_OUTPUT: {**outputs[FACTS_OUTPUT], "runtimeImage": "elsewhere/old:tag"}}
    result = run_program("barcelona-alice", env_config("barcelona-alice"), stack_outputs={f"{ORGANIZATION}/ml-dev-env/barcelona": stale})
    assert result.error is not None and "is deployed with other runtime_image than Pulumi.barcelona.yaml says" in result.error


def test_cluster_keys_and_foreign_nodes_in_an_environment_are_one_line_each() -> None:
    config = env_config(
        "barcelona-alice", storage={"mode": "shared", "volumes": []}, nodes={"count": 1, "gpuNodes": ["not-a-cluster-node"]}
    )
    result = run_program("barcelona-alice", config, stack_outputs={})
    assert result.error is not None
    lines = [line.strip().removeprefix("- ") for line in result.error.splitlines()[1:]]
    assert len(lines) == 2, result.error
    assert any(
        "ml-dev-env:storage: an environment stack" in line and "takes only environment, nodes, access, ssh, lifecycle" in line
        for line in lines
    ), result.error
    assert any("ml-dev-env:nodes.gpuNodes: got ['not-a-cluster-node']" in line for line in lines), result.error


# ------------------------------------------------------------------------------------------ ownership guard


def transform(reader: Any, stack: str = "barcelona-alice", name: str = "ml-dev-env-alice") -> Any:
    args = pulumi.ResourceTransformationArgs(
        resource=None,  # type: ignore[arg-type]  # no Resource exists outside a Pulumi run; the transform never reads it
        type_="kubernetes:apps/v1:StatefulSet",
        name="gpu-statefulset",
        props={"metadata": {"name": name, "namespace": "nccl-test", "labels": {"a": "b"}}, "spec": {}},
        opts=pulumi.ResourceOptions(),
    )
    return stack_label_transformation(stack, reader)(args)


def test_the_guard_stops_a_second_owner_with_one_line_naming_both_stacks() -> None:
    reads: list[str] = []

    def live(path: str) -> dict[str, Any]:
        reads.append(path)
        return {"metadata": {"labels": {STACK_LABEL: "barcelona-bob"}}}

    with pytest.raises(pulumi.RunError) as err:
        transform(live)
    assert reads == ["/apis/apps/v1/namespaces/nccl-test/statefulsets/ml-dev-env-alice"]
    message = str(err.value)
    assert "\n" not in message and "'barcelona-bob'" in message and "'barcelona-alice'" in message
    assert "StatefulSet nccl-test/ml-dev-env-alice" in message


@pytest.mark.parametrize(
    "live", [None, {"metadata": {"labels": {"app": "by-hand"}}}, {"metadata": {"labels": {STACK_LABEL: "barcelona-alice"}}}]
)
def test_the_guard_adopts_unowned_objects_and_keeps_its_own(live: Any) -> None:
    result = transform(lambda path: live)
    assert result.props["metadata"]["labels"] == {"a": "b", STACK_LABEL: "barcelona-alice"}


def test_api_paths_of_the_kinds_the_program_creates() -> None:
    assert api_path("kubernetes:core/v1:ServiceAccount", "ns", "x") == "/api/v1/namespaces/ns/serviceaccounts/x"
    assert (
        api_path("kubernetes:networking.k8s.io/v1:NetworkPolicy", "ns", "x") == "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/x"
    )
    assert (
        api_path("kubernetes:security.openshift.io/v1:SecurityContextConstraints", None, "x")
        == "/apis/security.openshift.io/v1/securitycontextconstraints/x"
    )
    assert api_path("ml-dev-env:cluster:GpuCluster", "ns", "x") is None
    assert ownership_conflict({"metadata": {}}, "a", "ConfigMap", "ns", "x") is None
