"""On-cluster image build: ImageStream + base/runtime BuildConfigs, asserted per preset."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components import image_build
from tests.conftest import VALIDATOR, run_objects, stack_objects
from tools import render
from tools.mock_engine import RunResult

BC = "kubernetes:build.openshift.io/v1:BuildConfig"
IS = "kubernetes:image.openshift.io/v1:ImageStream"
PRESETS = sorted(image_build.presets_file()["presets"])


def build_stack(**build: Any) -> RunResult:
    objects = stack_objects("barcelona")
    objects["image"]["build"].update(build)
    result = run_objects("barcelona", objects)
    assert result.error is None, result.error
    return result


def configs(result: RunResult) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in result.of_type(BC) if r.name.startswith("image-")}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_renders_two_stage_build(preset: str, tmp_path: Path) -> None:
    result = build_stack(preset=preset)
    p = image_build.presets_file()["presets"][preset]
    stream = result.one(IS, "image-imagestream").inputs
    assert stream["metadata"]["name"] == "ml-dev-env" and stream["spec"] == {"lookupPolicy": {"local": True}}
    bcs = configs(result)
    base, runtime = bcs["ml-dev-env-base"], bcs["ml-dev-env-runtime"]
    # base: FROM the preset's image, tagged <arch>-<cuda>-torch<ver>-fa<ver>
    assert re.fullmatch(r"[a-z]+-cu\d+-torch[\w.]+-fa[\w.]+", p["tag"])
    assert base["output"]["to"] == {"kind": "ImageStreamTag", "name": f"ml-dev-env:{p['tag']}"}
    assert base["strategy"]["dockerStrategy"]["from"] == {"kind": "DockerImage", "name": p["base_image"]}
    args = {a["name"]: a["value"] for a in base["strategy"]["dockerStrategy"]["buildArgs"]}
    assert args["MAX_JOBS"] == "16" and args["FLASH_ATTN_VERSION"] == p["build_args"]["FLASH_ATTN_VERSION"]
    assert base["triggers"] == [{"type": "ConfigChange"}]
    # runtime: FROM the base ImageStreamTag, rebuilt by an ImageChange trigger
    assert runtime["strategy"]["dockerStrategy"]["from"] == {"kind": "ImageStreamTag", "name": f"ml-dev-env:{p['tag']}"}
    assert runtime["triggers"] == [{"type": "ConfigChange"}, {"type": "ImageChange", "imageChange": {}}]
    runtime_args = {a["name"]: a["value"] for a in runtime["strategy"]["dockerStrategy"]["buildArgs"]}
    assert runtime_args["BASE_IMAGE"] == f"ml-dev-env:{p['tag']}" and runtime_args["REQUIREMENTS_FILE"] == ""
    assert runtime_args["APP_REQUIREMENTS"] == "accelerate==1.10.1 peft==0.17.1"
    assert runtime["output"]["to"]["name"].startswith("ml-dev-env:runtime-")
    for spec in (base, runtime):
        assert spec["completionDeadlineSeconds"] == 3600
        assert spec["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "16", "memory": "64Gi"}}
        assert spec["nodeSelector"] == {"kubernetes.io/hostname": "moc-r4pcc02u15-yunshi"}
        assert spec["source"]["type"] == "Dockerfile" and "NCCL_IB_HCA=" not in spec["source"]["dockerfile"]
    # the pods run exactly the runtime stage's output
    tag = runtime["output"]["to"]["name"].split(":", 1)[1]
    expected = f"image-registry.openshift-image-registry.svc:5000/nccl-test/ml-dev-env:{tag}"
    pod = result.one("kubernetes:apps/v1:StatefulSet").inputs["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == expected == result.outputs["runtime_image"] == result.outputs["image"]
    assert result.outputs["base_image"].endswith(f"ml-dev-env:{p['tag']}")
    if VALIDATOR.exists():
        render.write(result, tmp_path)
        proc = subprocess.run([sys.executable, str(VALIDATOR), str(tmp_path)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout


def test_turing_has_no_flash_attention() -> None:
    p = image_build.presets_file()["presets"]["turing"]
    assert p["flash_attn"] == "none" and p["tag"].endswith("-fanone")


def test_default_preset_is_the_nvidia_pytorch_base() -> None:
    data = image_build.presets_file()
    assert data["default"] == "nvidia-pytorch"
    assert data["presets"]["nvidia-pytorch"]["base_image"] == "nvcr.io/nvidia/pytorch:25.09-py3"


def test_runtime_input_change_changes_only_the_runtime_build() -> None:
    before = configs(build_stack())
    after = configs(build_stack(runtimeRequirements=["accelerate==1.10.1", "peft==0.17.1", "trl==0.23.0"]))
    assert after["ml-dev-env-base"] == before["ml-dev-env-base"]
    assert after["ml-dev-env-runtime"] != before["ml-dev-env-runtime"]
    assert after["ml-dev-env-runtime"]["output"] != before["ml-dev-env-runtime"]["output"]  # new tag → pods roll


def test_base_input_change_changes_the_base_build_and_the_runtime_tag() -> None:
    before = configs(build_stack())
    after = configs(build_stack(maxJobs=32))
    assert after["ml-dev-env-base"] != before["ml-dev-env-base"]
    hopper = configs(build_stack(preset="hopper"))
    assert hopper["ml-dev-env-runtime"]["output"] != before["ml-dev-env-runtime"]["output"]


def test_git_source_and_raised_resources() -> None:
    result = build_stack(
        source="git", git={"uri": "https://github.com/example/ml-dev-env.git", "ref": "v1.2.0"},
        resources={"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"cpu": "32", "memory": "128Gi"}},
        completionDeadlineSeconds=7200,
    )
    for name, spec in configs(result).items():
        assert spec["source"] == {"type": "Git", "git": {"uri": "https://github.com/example/ml-dev-env.git", "ref": "v1.2.0"},
                                  "contextDir": "images"}, name
        stage = name.rsplit("-", 1)[1]
        assert spec["strategy"]["dockerStrategy"]["dockerfilePath"] == f"{stage}.Containerfile"
        assert spec["completionDeadlineSeconds"] == 7200 and spec["resources"]["limits"]["memory"] == "128Gi"
    runtime = configs(result)["ml-dev-env-runtime"]["strategy"]["dockerStrategy"]
    assert {a["name"]: a["value"] for a in runtime["buildArgs"]}["REQUIREMENTS_FILE"] == "runtime-requirements.txt"


def test_rollout_on_new_image_is_opt_in() -> None:
    sts = build_stack().one("kubernetes:apps/v1:StatefulSet").inputs
    assert "image.openshift.io/triggers" not in sts["metadata"]["annotations"]
    result = build_stack(rolloutOnNewImage=True)
    sts = result.one("kubernetes:apps/v1:StatefulSet").inputs
    trigger = json.loads(sts["metadata"]["annotations"]["image.openshift.io/triggers"])
    tag = result.outputs["runtime_image"].rsplit("/", 1)[1]
    assert trigger == [{"from": {"kind": "ImageStreamTag", "name": tag},
                        "fieldPath": 'spec.template.spec.containers[?(@.name=="ml-dev")].image'}]


def test_stack_without_build_uses_the_configured_image() -> None:
    result = run_objects("nerc-production", stack_objects("nerc-production"))
    assert configs(result) == {} and "runtime_image" not in result.outputs
    assert result.outputs["image"] == stack_objects("nerc-production")["image"]["reference"]


@pytest.mark.parametrize(("build", "expected"), [
    ({"preset": "volta"}, "ml-dev-env:image.build.preset: got 'volta'; allowed: ampere, hopper, nvidia-pytorch, turing"),
    ({"source": "git"}, "ml-dev-env:image.build.git: got None; source 'git' needs git.uri"),
    ({"runtimeRequirements": ["peft"]}, "ml-dev-env:image.build.runtimeRequirements[0]: got 'peft'; must be a pinned requirement"),
    ({"completionDeadlineSeconds": 60},
     "ml-dev-env:image.build.completionDeadlineSeconds: got 60; input should be greater than or equal to 600"),
])
def test_bad_build_settings(build: dict[str, Any], expected: str) -> None:
    objects = stack_objects("barcelona")
    objects["image"]["build"].update(build)
    result = run_objects("barcelona", objects)
    assert result.error is not None and expected in result.error, result.error


def test_reference_and_build_are_exclusive() -> None:
    objects = stack_objects("barcelona")
    objects["image"]["reference"] = "quay.io/org/img:1.0"
    result = run_objects("barcelona", objects)
    assert result.error and "set either image.reference or image.build, not both" in result.error


def test_inline_runtime_defaults_to_the_repository_requirements() -> None:
    result = build_stack(runtimeRequirements=[])
    args = {a["name"]: a["value"] for a in configs(result)["ml-dev-env-runtime"]["strategy"]["dockerStrategy"]["buildArgs"]}
    assert args["APP_REQUIREMENTS"] == " ".join(image_build._pins(image_build.RUNTIME_REQUIREMENTS))
