"""models[].mountInEnv: a registered modelcar mounted read-only in every pod, from its image (components/pod.py
model_volumes), gated on the cluster serving image volumes (cluster.imageVolumes, checked against the API server's
/version at preview: components/live_checks.py check_image_volumes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components import live_checks, preflight
from inpod import contract
from tests.components.test_environment import CLUSTER_REF, checkout_with, env_config
from tests.components.test_preflight import FakeApi, api, kubeconfig  # noqa: F401 (api: the fixture)
from tests.conftest import PLACEHOLDER_SECRETS, run_objects, stack_objects
from tools.mock_engine import RunResult, run_program, stack_config

STS = "kubernetes:apps/v1:StatefulSet"
W4A16 = "image-registry.openshift-image-registry.svc:5000/nccl-test/mistral-small-24b-w4a16@sha256:" + "cd" * 32


def mount_first_model(o: dict[str, Any], path: str = "/models/mistral", image: str | None = W4A16, served: bool = True) -> None:
    o["cluster"]["imageVolumes"] = served
    o["models"][0]["mountInEnv"] = path
    if image is not None:
        o["models"][0]["registeredImage"] = image


def pod_spec(result: RunResult) -> dict[str, Any]:
    assert result.error is None, result.error
    return result.one(STS).inputs["spec"]["template"]["spec"]


def main_of(spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == "ml-dev")


def test_the_model_image_is_an_image_volume_of_every_pod_pinned_read_only_at_its_folder() -> None:
    objects = stack_objects("barcelona")
    mount_first_model(objects)
    spec = pod_spec(run_objects("barcelona", objects))
    (volume,) = [v for v in spec["volumes"] if "image" in v]
    assert volume["image"] == {"reference": W4A16, "pullPolicy": "IfNotPresent"}
    (mount,) = [m for m in main_of(spec)["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": "/models/mistral", "subPath": "models", "readOnly": True}
    env = {e["name"]: e.get("value") for e in main_of(spec)["env"]}
    assert json.loads(env[contract.MODELS_ENV]) == [{"name": "mistral-small-24b-w4a16", "path": "/models/mistral", "image": W4A16}]
    # the other model is not mounted, and no other container gets the volume
    assert not any(m["name"] == volume["name"] for c in spec["containers"] if c["name"] != "ml-dev" for m in c.get("volumeMounts", []))


def test_no_mount_no_volume_and_no_env() -> None:
    spec = pod_spec(run_objects("barcelona", stack_objects("barcelona")))
    assert not [v for v in spec["volumes"] if "image" in v]
    assert contract.MODELS_ENV not in {e["name"] for e in main_of(spec)["env"]}


def test_an_environment_mounts_its_clusters_models(tmp_path: Path) -> None:
    """The mount is the cluster stack's (its models): an environment stack renders it from its cluster's file."""

    def edit(text: str) -> str:
        text = text.replace("    appName: ml-dev-env\n", "    appName: ml-dev-env\n    imageVolumes: true\n", 1)
        return text.replace(
            "      tag: w4a16-2501\n", f"      tag: w4a16-2501\n      mountInEnv: /models/mistral\n      registeredImage: {W4A16}\n", 1
        )

    main = checkout_with(tmp_path, edit)
    cluster = run_program(
        "barcelona", stack_config(tmp_path / "Pulumi.barcelona.yaml"), dict(PLACEHOLDER_SECRETS), main=main, stack_outputs={}
    )
    assert cluster.error is None, cluster.error
    result = run_program(
        "barcelona-alice", env_config("barcelona-alice"), dict(PLACEHOLDER_SECRETS), main=main, stack_outputs={CLUSTER_REF: cluster.outputs}
    )
    spec = pod_spec(result)
    assert [v["image"]["reference"] for v in spec["volumes"] if "image" in v] == [W4A16]
    assert json.loads({e["name"]: e.get("value") for e in main_of(spec)["env"]}[contract.MODELS_ENV])[0]["image"] == W4A16


def test_every_mistake_of_a_mount_is_one_line_in_one_run() -> None:
    """A model's own mistakes together; the stack's (the cluster fact, overlaps) together once the models are valid
    (pydantic runs a model's cross-field rules only once its fields validated: stacks/loader.py)."""
    objects = stack_objects("barcelona")
    mount_first_model(objects, image=W4A16.replace("@sha256:" + "cd" * 32, ":w4a16-2501"))
    objects["models"][1]["mountInEnv"] = "/models/fp16"  # no registeredImage
    result = run_objects("barcelona", objects)
    assert result.error is not None
    lines = result.error.strip().splitlines()
    assert lines[0].endswith("(2 problems):"), lines
    assert "models[0].registeredImage" in lines[1] and "an image pinned by digest" in lines[1], lines
    assert "models[1].mountInEnv" in lines[2] and "needs registeredImage" in lines[2], lines

    objects = stack_objects("barcelona")
    mount_first_model(objects, served=False)
    objects["models"][1].update(mountInEnv="/workspace/models", registeredImage=W4A16.replace("cd", "ef"))
    result = run_objects("barcelona", objects)
    assert result.error is not None
    lines = result.error.strip().splitlines()
    for i in (0, 1):
        assert any(f"models[{i}].mountInEnv" in line and "cluster.imageVolumes is false" in line for line in lines), lines
    assert any("models[1].mountInEnv" in line and "overlaps the mount of storage volume workspace" in line for line in lines), lines


def test_the_oci_uri_the_register_step_logs_is_taken_as_it_is() -> None:
    """The register step logs `registered: oci://<repo>@sha256:…` (steps/register.py main): pasted as it is, the image
    volume names the image without the scheme."""
    objects = stack_objects("barcelona")
    mount_first_model(objects, image="oci://" + W4A16)
    spec = pod_spec(run_objects("barcelona", objects))
    assert [v["image"]["reference"] for v in spec["volumes"] if "image" in v] == [W4A16]


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ({"major": "1", "minor": "32", "gitVersion": "v1.32.9"}, True),
        ({"major": "1", "minor": "31+", "gitVersion": "v1.31.4+abc"}, True),
        ({"major": "1", "minor": "33", "gitVersion": "v1.33.5"}, False),
        ({"major": "1", "minor": "34"}, False),
        (None, False),
    ],
)
def test_the_api_servers_version_is_checked_at_preview(
    version: dict[str, Any] | None,
    refused: bool,
    api: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeApi.objects = {"/version": version} if version else {}
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", api, {"token": "sha256~token"})))
    monkeypatch.setattr(preflight, "_offline", lambda render_dir: False)
    objects = stack_objects("barcelona")
    mount_first_model(objects)
    result = run_objects("barcelona", objects)
    assert ("/version", "Bearer sha256~token") in FakeApi.seen
    if refused:
        assert result.error is not None and len(result.error.strip().splitlines()) == 1
        assert result.error.strip().startswith("ml-dev-env:cluster.imageVolumes: got true; the cluster's Kubernetes is v1.3")
        assert "from 1.33" in result.error
    else:
        assert result.error is None, result.error
    assert (live_checks.image_volumes_problem(version) is not None) == refused


def test_the_prerequisites_name_the_cluster_fact() -> None:
    from tests.tools.test_render import find, rendered
    from tools.prerequisites import prerequisites

    config, objects = rendered("barcelona", mount_first_model)
    [need] = find(prerequisites(config, objects), "image volumes with subPath")
    assert W4A16 in need.why and "ImageVolume" in need.check
    config, objects = rendered("barcelona", lambda o: None)
    assert not find(prerequisites(config, objects), "image volumes with subPath")


GATE_METRICS = """# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="ImageMaximumGCAge",stage=""} 1
kubernetes_feature_enabled{name="ImageVolume",stage="BETA"} %s
kubernetes_feature_enabled{name="InPlacePodVerticalScaling",stage="BETA"} 1
"""


@pytest.mark.parametrize(("gate", "refused"), [("0", True), ("1", False), (None, False)])
def test_where_the_api_servers_metrics_are_readable_its_image_volume_gate_is_checked(
    gate: str | None,
    refused: bool,
    api: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kubernetes_feature_enabled` (k8s.io/component-base metrics/prometheus/feature RecordFeatureInfo) on the API
    server's /metrics; unreadable (None: 404 here, a 403 for most users) is no line: the key is the admin's word."""
    FakeApi.objects = {"/version": {"major": "1", "minor": "33", "gitVersion": "v1.33.5"}}
    if gate is not None:
        FakeApi.objects["/metrics"] = GATE_METRICS % gate
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", api, {"token": "sha256~token"})))
    monkeypatch.setattr(preflight, "_offline", lambda render_dir: False)
    objects = stack_objects("barcelona")
    mount_first_model(objects)
    result = run_objects("barcelona", objects)
    assert ("/metrics", "Bearer sha256~token") in FakeApi.seen
    if refused:
        assert result.error is not None and len(result.error.strip().splitlines()) == 1, result.error
        assert "ImageVolume feature gate off" in result.error and result.error.strip().startswith(
            "ml-dev-env:cluster.imageVolumes: got true"
        )
    else:
        assert result.error is None, result.error
