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
