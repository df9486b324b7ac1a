"""image.prePull: the pods' image on the GPU nodes before it is needed (components/prepull.py).

Asserted on what the program registers (recording mocks) and, for the cluster fact, through the program against a
local API (the discovery document of machineconfiguration.openshift.io/v1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components import preflight, prepull
from tests.components.test_preflight import FakeApi, api, kubeconfig  # noqa: F401 (api: the fixture)
from tests.conftest import run_objects, stack_objects
from tests.tools.test_render import find, rendered
from tests.tools.test_render_schema import RUNTIME_DIGEST
from tools.mock_engine import RunResult
from tools.prerequisites import admin_needs, prerequisites

STS = "kubernetes:apps/v1:StatefulSet"
DS = "kubernetes:apps/v1:DaemonSet"
PIS = "kubernetes:machineconfiguration.openshift.io/v1:PinnedImageSet"


def run(stack: str, **image: Any) -> RunResult:
    objects = stack_objects(stack)
    objects["image"] = {**objects["image"], **image} if "reference" not in image else image
    result = run_objects(stack, objects)
    assert result.error is None, result.error
    return result


def template(r: Any) -> dict[str, Any]:
    return r.inputs["spec"]["template"]["spec"]


def depends_on(result: RunResult, dependent: Any, dependency: Any) -> bool:
    return any(urn.endswith(f"${dependency.typ}::{dependency.name}") for urn in dependent.options.get("dependencies", []))


def test_off_renders_neither() -> None:
    result = run("barcelona")
    assert not [r for r in result.of_type(DS) if r.name.endswith("-prepull")] and not result.of_type(PIS)


def test_the_daemonset_pulls_the_pods_image_on_the_gpu_nodes_only_and_holds_no_gpu() -> None:
    result = run("barcelona", prePull="daemonSet")
    sts, ds = result.one(STS), result.one(DS, "-prepull")
    pods, pullers = template(sts), template(ds)
    main = next(c for c in pods["containers"] if c["name"] == "ml-dev")
    (puller,) = pullers["containers"]
    # the same image (the built runtime tag, once the wait Job saw it), on the same nodes
    assert puller["image"] == main["image"] == result.outputs["runtime_image"]
    assert pullers["nodeSelector"] == pods["nodeSelector"] and pullers["tolerations"] == pods["tolerations"]
    assert pullers["affinity"] == {"nodeAffinity": pods["affinity"]["nodeAffinity"]}, "node affinity only, no anti-affinity"
    hosts = pullers["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert hosts["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == stack_objects("barcelona")["nodes"]["gpuNodes"]
    # no GPU, requests ~0
    resources = puller["resources"]
    assert not [k for k in {**resources["requests"], **resources["limits"]} if k not in ("cpu", "memory")]
    assert resources["requests"] == {"cpu": "1m", "memory": "16Mi"}
    # its pods are never the GPU pods (their anti-affinity and Services select by these)
    selector = sts.inputs["spec"]["selector"]["matchLabels"]
    labels = ds.inputs["spec"]["template"]["metadata"]["labels"]
    assert any(labels.get(k) != v for k, v in selector.items())
    # a new image: every node's new pod starts beside the old, and the StatefulSet waits for the rollout
    assert ds.inputs["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": "100%", "maxUnavailable": 0}
    assert "pulumi.com/skipAwait" not in ds.inputs["metadata"].get("annotations", {})
    assert depends_on(result, sts, ds)


def test_the_pinned_image_set_pins_the_digest_for_the_pool() -> None:
    result = run("nerc-production", reference=RUNTIME_DIGEST, prePull="pinnedImageSet", machineConfigPool="gpu")
    sts, pis = result.one(STS), result.one(PIS)
    assert pis.inputs["spec"] == {"pinnedImages": [{"name": RUNTIME_DIGEST}]}
    assert pis.inputs["metadata"]["labels"][prepull.POOL_ROLE_LABEL] == "gpu"
    assert "namespace" not in pis.inputs["metadata"], "cluster-scoped"
    assert depends_on(result, sts, pis)
    assert not [r for r in result.of_type(DS) if r.name.endswith("-prepull")]


def test_a_tag_cannot_be_pinned() -> None:
    for image in ({"reference": "quay.io/team/runtime:v1", "prePull": "pinnedImageSet"}, {"prePull": "pinnedImageSet"}):
        objects = stack_objects("barcelona")
        objects["image"] = image if "reference" in image else {**objects["image"], **image}
        result = run_objects("barcelona", objects)
        assert result.error is not None
        [line] = [x for x in result.error.splitlines() if "prePull" in x]
        assert "ml-dev-env:image.prePull: got 'pinnedImageSet'; pinnedImageSet needs image.reference by @sha256 digest" in line


def test_prerequisites_name_the_rights_and_features_each_needs() -> None:
    config, objects = rendered("barcelona", lambda o: o["image"].update(prePull="daemonSet"))
    [rights] = find(prerequisites(config, objects), "the right to create DaemonSets")
    assert rights.check == f"oc auth can-i create daemonsets.apps -n {config.cluster.namespace}"

    def pinned(o: dict[str, Any]) -> None:
        o["image"] = {"reference": RUNTIME_DIGEST, "prePull": "pinnedImageSet", "machineConfigPool": "gpu"}

    config, objects = rendered("nerc-production", pinned)
    needs = prerequisites(config, objects)
    assert find(needs, "PinnedImageSet served")[0].check.startswith("oc api-resources --api-group=machineconfiguration.openshift.io")
    [rights] = find(needs, "the right to create PinnedImageSets")
    assert rights.check == "oc auth can-i create pinnedimagesets.machineconfiguration.openshift.io"
    assert find(needs, "MachineConfigPool gpu")[0].check.startswith("oc get mcp gpu ")
    assert "image-registry.openshift-image-registry.svc:5000" in find(needs, "the nodes' pull secret")[0].what
    assert [n for n in admin_needs(objects, config.cluster.namespace) if n.what.startswith("PinnedImageSet/")]


@pytest.mark.parametrize("served", [True, False])
def test_a_cluster_without_pinned_image_sets_gets_one_line_and_the_daemonset(
    served: bool,
    api: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resources = [{"name": "machineconfigpools", "kind": "MachineConfigPool"}]
    if served:
        resources.append({"name": "pinnedimagesets", "kind": "PinnedImageSet"})
    FakeApi.objects = {prepull.DISCOVERY_PATH: {"kind": "APIResourceList", "resources": resources}, "/version": {"major": "1"}}
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", api, {"token": "sha256~token"})))
    monkeypatch.setattr(preflight, "_offline", lambda render_dir: False)
    result = run("nerc-production", reference=RUNTIME_DIGEST, prePull="pinnedImageSet")
    lines = [w for w in result.warnings if "pinnedimagesets" in w]
    assert (prepull.DISCOVERY_PATH, "Bearer sha256~token") in FakeApi.seen
    if served:
        assert result.one(PIS) and not lines
    else:
        assert lines == [prepull.NOT_SERVED] and not result.of_type(PIS)
        assert result.one(DS, "-prepull") and depends_on(result, result.one(STS), result.one(DS, "-prepull"))


@pytest.mark.parametrize("variant", ["barcelona-prepull-daemonset", "nerc-production-pinned-image-set"])
def test_the_policy_pack_passes_both_ways(variant: str) -> None:
    from policy.rules import evaluate, has_mandatory
    from tests.tools.test_render_schema import VARIANTS

    stack, mutate = VARIANTS[variant]
    objects = stack_objects(stack)
    assert mutate is not None
    mutate(objects)
    result = run_objects(stack, objects)
    assert result.error is None, result.error
    assert result.of_type(DS) or result.of_type(PIS)
    violations = list(evaluate((r.typ, r.inputs, r.options) for r in result.resources))
    assert not has_mandatory(violations), violations
