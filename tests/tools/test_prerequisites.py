"""Kueue said out loud: with a queue, `make render` lists Kueue, the LocalQueue and the quota its ClusterQueue
must cover (from the rendered pods), with their `oc` checks; the waitForPodsReady setting is checked."""

from __future__ import annotations

from typing import Any

from tests.tools.test_render import find, rendered
from tools.prerequisites import prerequisites


def queued(objects: dict[str, Any]) -> None:
    objects.setdefault("lifecycle", {})["kueue"] = {"queueName": "team-gpu"}


def test_no_queue_no_kueue_prerequisite() -> None:
    config, objects = rendered("barcelona")
    assert not [n for n in prerequisites(config, objects) if "Kueue" in n.what or "LocalQueue" in n.what]


def test_queue_lists_kueue_the_local_queue_and_the_quota() -> None:
    config, objects = rendered("barcelona", queued)
    needs = prerequisites(config, objects)
    [kueue] = find(needs, "Kueue (kueue.x-k8s.io)")
    assert kueue.check == "oc get crd localqueues.kueue.x-k8s.io clusterqueues.kueue.x-k8s.io"
    [local] = find(needs, "LocalQueue nccl-test/team-gpu")
    assert local.check == "oc get localqueue team-gpu -n nccl-test"
    [quota] = find(needs, "quota for the whole environment")
    # independent arithmetic from the rendered StatefulSet: replicas x every container's requests
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    pods = sts["spec"]["replicas"]
    containers = sts["spec"]["template"]["spec"]["containers"]
    gpus = sum(int(c["resources"]["requests"].get("nvidia.com/gpu", 0)) for c in containers) * pods
    assert gpus == config.nodes.count * config.nodes.gpus_per_pod == 8
    assert f"nvidia.com/gpu {gpus}" in quota.what
    for resource in config.network.rdma.sriov_resources:
        assert f"{resource} {pods * config.network.rdma.sriov_resource_count}" in quota.what
    main_cpu = int(config.nodes.resources.requests.cpu)
    cpu = next(part for part in quota.what.split(": ", 1)[1].split(", ") if part.startswith("cpu "))
    assert float(cpu.split()[1]) > main_cpu * pods, "sidecars' requests count too"
    assert "memory " in quota.what and quota.check.startswith("oc get clusterqueue $(oc get localqueue team-gpu -n nccl-test")


def test_on_deploy_adds_the_pods_ready_timeout() -> None:
    def held(objects: dict[str, Any]) -> None:
        queued(objects)
        objects["lifecycle"]["kueue"]["waitForPodsReadyTimeout"] = "60m"
        objects["fabricCheck"].update(onDeploy=True, onDeployTimeoutSeconds=1800)

    config, objects = rendered("barcelona", held)
    [ready] = find(prerequisites(config, objects), "Kueue waitForPodsReady.timeout at least 60m")
    assert "1800s" in ready.why and "600s" in ready.why


def test_pods_ready_timeout_shorter_than_pull_plus_hold_is_refused() -> None:
    from tests.conftest import run_objects, stack_objects

    objects = stack_objects("barcelona")
    queued(objects)
    objects["fabricCheck"].update(onDeploy=True, onDeployTimeoutSeconds=1800)
    result = run_objects("barcelona", objects)
    assert result.error is not None
    line = next(x for x in result.error.splitlines() if "waitForPodsReadyTimeout" in x)
    assert "ml-dev-env:lifecycle.kueue.waitForPodsReadyTimeout: got '5m'; Kueue evicts a workload" in line
    assert "(300s)" in line and "imagePullSeconds (600) + fabricCheck.onDeployTimeoutSeconds (1800) = 2400s" in line


def multi_network_policy(objects: dict[str, Any]) -> None:
    objects["network"]["rdma"]["multiNetworkPolicy"] = True


def test_multi_network_policy_per_attachment_against_the_upstream_schema_with_its_prerequisite() -> None:
    """network.rdma.multiNetworkPolicy: one MultiNetworkPolicy per attachment the pods name, admitting the stack's own
    pods only, valid against the vendored upstream CRD schema (schemas/k8s.cni.cncf.io/v1beta1); the cluster's
    enforcement is a prerequisite. Off (the default): none, and no such prerequisite."""
    import json
    from pathlib import Path

    import jsonschema

    config, objects = rendered("barcelona")
    assert not [o for o in objects if o["kind"] == "MultiNetworkPolicy"]
    assert not [n for n in prerequisites(config, objects) if "MultiNetworkPolicy" in n.what]
    config, objects = rendered("barcelona", multi_network_policy)
    policies = [o for o in objects if o["kind"] == "MultiNetworkPolicy"]
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    named = sts["spec"]["template"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]
    attachments = [n.split("@")[0] for n in named.replace(" ", "").split(",")]
    ns = sts["metadata"]["namespace"]
    assert sorted(p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/policy-for"] for p in policies) == sorted(
        a if "/" in a else f"{ns}/{a}" for a in attachments
    )
    selector = sts["spec"]["selector"]["matchLabels"]
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas/k8s.cni.cncf.io/v1beta1/MultiNetworkPolicy.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for p in policies:
        assert p["apiVersion"] == "k8s.cni.cncf.io/v1beta1"
        assert list(validator.iter_errors(p)) == [], p
        assert p["spec"]["podSelector"]["matchLabels"] == selector and p["spec"]["policyTypes"] == ["Ingress"]
        assert p["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    broken = {**policies[0], "spec": {**policies[0]["spec"], "ingress": [{"from": "everyone"}]}}
    assert list(validator.iter_errors(broken)), "the schema checks the spec (not an empty schema)"
    [need] = [n for n in prerequisites(config, objects) if "MultiNetworkPolicy" in n.what]
    assert "multi-networkpolicies.k8s.cni.cncf.io" in need.check and "useMultiNetworkPolicy" in need.check
