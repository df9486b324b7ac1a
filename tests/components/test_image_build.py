"""On-cluster image build: ImageStream + base/runtime BuildConfigs, asserted per preset."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from components import image_build
from tests.conftest import run_objects, stack_objects, tcp_shared_variant
from tests.fixtures import schema_check
from tests.repo.test_locks import locked
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
    """The pods' image BuildConfig specs by stage ("base", "runtime")."""
    return {r.inputs["metadata"]["labels"]["ml-dev-env/stage"]: r.inputs["spec"] for r in result.of_type(BC) if r.name.startswith("image-")}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_renders_two_stage_build(preset: str, tmp_path: Path) -> None:
    result = build_stack(preset=preset)
    p = image_build.presets_file()["presets"][preset]
    stream = result.one(IS, "image-imagestream").inputs
    assert stream["metadata"]["name"] == "ml-dev-env" and stream["spec"] == {"lookupPolicy": {"local": True}}
    bcs = configs(result)
    base, runtime = bcs["base"], bcs["runtime"]
    # base: FROM the preset's image, tagged <arch>-<cuda>-torch<ver>-fa<ver>-<hash of the base inputs>
    assert re.fullmatch(r"[a-z]+-cu\d+-torch[\w.]+-fa[\w.]+", p["tag"])
    base_tag = base["output"]["to"]["name"].split(":", 1)[1]
    assert re.fullmatch(re.escape(p["tag"]) + r"-[0-9a-f]{10}", base_tag), base_tag
    assert base["output"]["to"] == {"kind": "ImageStreamTag", "name": f"ml-dev-env:{base_tag}"}
    assert base["strategy"]["dockerStrategy"]["from"] == {"kind": "DockerImage", "name": p["base_image"]}
    args = {a["name"]: a["value"] for a in base["strategy"]["dockerStrategy"]["buildArgs"]}
    assert args["MAX_JOBS"] == "16" and args["FLASH_ATTN_VERSION"] == p["build_args"]["FLASH_ATTN_VERSION"]
    assert base["triggers"] == [{"type": "ConfigChange"}]
    # runtime: FROM the base ImageStreamTag, built by its ImageChange trigger once that tag exists
    assert runtime["strategy"]["dockerStrategy"]["from"] == {"kind": "ImageStreamTag", "name": f"ml-dev-env:{base_tag}"}
    assert runtime["triggers"] == [{"type": "ImageChange", "imageChange": {}}]
    runtime_args = {a["name"]: a["value"] for a in runtime["strategy"]["dockerStrategy"]["buildArgs"]}
    assert runtime_args["BASE_IMAGE"] == f"ml-dev-env:{base_tag}" and runtime_args["REQUIREMENTS_FILE"] == ""
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
    assert result.outputs["base_image"].endswith(f"ml-dev-env:{base_tag}")
    render.write(result, tmp_path)
    proc = schema_check.check(str(tmp_path))
    assert proc.returncode == 0, proc.stdout


CM = "kubernetes:core/v1:ConfigMap"


@pytest.mark.parametrize("preset", PRESETS)
def test_the_base_build_gets_its_presets_hash_lock_from_a_configmap(preset: str) -> None:
    result = build_stack(preset=preset)
    base = next(r for r in result.of_type(BC) if r.inputs["metadata"]["labels"].get("ml-dev-env/stage") == "base")
    lock = result.one(CM, "image-base-lock")
    name = lock.inputs["metadata"]["name"]
    assert name == base.inputs["metadata"]["name"] + "-lock", "one lock per base hash, replaced with its BuildConfig"
    assert lock.inputs["immutable"] is True
    # the lock of the preset's Python, entry by entry (comments dropped), each with its hashes
    python = image_build.presets_file()["presets"][preset]["python"]
    text = lock.inputs["data"]["base-requirements.txt"]
    entries = text.splitlines()
    assert entries and all(re.fullmatch(r"[A-Za-z0-9._-]+==\S+( ; [^-]+)? (--hash=sha256:[0-9a-f]{64} ?)+", e) for e in entries)
    shipped = {re.sub(r"[-_.]+", "-", e.split("==")[0]).lower(): e.split("==")[1].split()[0] for e in entries}
    assert shipped == locked(image_build.IMAGES / f"base-requirements-py{python}.txt")
    assert "jupyterlab" in shipped
    # into the build context, where the Containerfile COPYs it from; the BuildConfig waits for it
    assert base.inputs["spec"]["source"]["configMaps"] == [{"configMap": {"name": name}, "destinationDir": "ml-dev-env-lock"}]
    assert "COPY ml-dev-env-lock/base-requirements.txt " in base.inputs["spec"]["source"]["dockerfile"]
    assert any(urn.endswith("::image-base-lock") for urn in base.options["dependencies"])


def test_turing_has_no_flash_attention() -> None:
    p = image_build.presets_file()["presets"]["turing"]
    assert p["flash_attn"] == "none" and p["tag"].endswith("-fanone")


def test_default_preset_is_the_nvidia_pytorch_base() -> None:
    data = image_build.presets_file()
    assert data["default"] == "nvidia-pytorch"
    assert data["presets"]["nvidia-pytorch"]["base_image"] == "nvcr.io/nvidia/pytorch:25.09-py3"


def test_git_source_and_raised_resources() -> None:
    result = build_stack(
        source="git",
        git={"uri": "https://github.com/example/ml-dev-env.git", "ref": "v1.2.0"},
        resources={"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"cpu": "32", "memory": "128Gi"}},
        completionDeadlineSeconds=7200,
    )
    for stage, spec in configs(result).items():
        # the base lock's ConfigMap is copied into the Git context as into an inline one
        lock = {"configMaps": spec["source"]["configMaps"]} if stage == "base" else {}
        assert spec["source"] == {
            "type": "Git",
            "git": {"uri": "https://github.com/example/ml-dev-env.git", "ref": "v1.2.0"},
            "contextDir": "images",
            **lock,
        }, stage
        assert spec["strategy"]["dockerStrategy"]["dockerfilePath"] == f"{stage}.Containerfile"
        assert spec["completionDeadlineSeconds"] == 7200 and spec["resources"]["limits"]["memory"] == "128Gi"
    runtime = configs(result)["runtime"]["strategy"]["dockerStrategy"]
    assert {a["name"]: a["value"] for a in runtime["buildArgs"]}["REQUIREMENTS_FILE"] == "runtime-requirements.txt"


def test_no_image_change_trigger_on_the_statefulset() -> None:
    """The image field stays Pulumi's: no OpenShift trigger controller writes it (it would conflict or flip)."""
    for result in (build_stack(), run_objects("nerc-production", stack_objects("nerc-production"))):
        sts = result.one("kubernetes:apps/v1:StatefulSet").inputs
        assert "image.openshift.io/triggers" not in sts["metadata"].get("annotations", {})


def test_removed_rollout_option_is_refused_with_a_hint() -> None:
    objects = stack_objects("barcelona")
    objects["image"]["build"]["rolloutOnNewImage"] = True
    result = run_objects("barcelona", objects)
    assert result.error is not None
    (line,) = [x for x in result.error.splitlines() if "rolloutOnNewImage" in x]
    assert "ml-dev-env:image.build.rolloutOnNewImage: got True; removed:" in line and "delete the key" in line, line


def test_stack_without_build_uses_the_configured_image() -> None:
    result = run_objects("nerc-production", stack_objects("nerc-production"))
    assert configs(result) == {} and "runtime_image" not in result.outputs
    assert result.outputs["image"] == stack_objects("nerc-production")["image"]["reference"]


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        ({"preset": "volta"}, "ml-dev-env:image.build.preset: got 'volta'; allowed: ampere, hopper, nvidia-pytorch, turing"),
        ({"source": "git"}, "ml-dev-env:image.build.git: got None; source 'git' needs git.uri"),
        ({"runtimeRequirements": ["peft"]}, "ml-dev-env:image.build.runtimeRequirements[0]: got 'peft'; must be a pinned requirement"),
        (
            {"completionDeadlineSeconds": 60},
            "ml-dev-env:image.build.completionDeadlineSeconds: got 60; input should be greater than or equal to 600",
        ),
    ],
)
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
    args = {a["name"]: a["value"] for a in configs(result)["runtime"]["strategy"]["dockerStrategy"]["buildArgs"]}
    assert args["APP_REQUIREMENTS"] == " ".join(image_build._pins(image_build.RUNTIME_REQUIREMENTS))


# ------------------------------------------------------------------------------ rebuilds (day 2)
# OpenShift's ConfigChange trigger builds only a BuildConfig that never built (openshift-controller-manager
# buildconfig_controller.go `handleBuildConfig`), so every input change must give a NEW BuildConfig object
# (a new metadata.name is a replacement in pulumi-kubernetes) whose output is the tag the workloads use.

TOOLS_STREAM = "ml-dev-env-tools"


def build_configs(result: RunResult) -> dict[str, dict[str, Any]]:
    """Every BuildConfig by stage ("base", "runtime", "tools"): Pulumi name, object name, spec."""
    found = {}
    for r in result.of_type(BC):
        stage = r.inputs["metadata"]["labels"]["ml-dev-env/stage"]
        assert stage not in found, f"two {stage} BuildConfigs"
        found[stage] = {"pulumi": r.name, "name": r.inputs["metadata"]["name"], "spec": r.inputs["spec"]}
    return found


def output_image(result: RunResult, bc: dict[str, Any]) -> str:
    to = bc["spec"]["output"]["to"]
    assert to["kind"] == "ImageStreamTag"
    return f"image-registry.openshift-image-registry.svc:5000/nccl-test/{to['name']}"


def workload_images(result: RunResult) -> dict[str, set[str]]:
    """The images the GPU pods and the model pipeline's tool steps / runs actually use."""
    pod = result.one("kubernetes:apps/v1:StatefulSet").inputs["spec"]["template"]["spec"]
    steps = {s["image"] for r in result.of_type("kubernetes:tekton.dev/v1:Task") for s in r.inputs["spec"]["steps"]}
    params = {
        p["value"]
        for r in result.of_type("kubernetes:tekton.dev/v1:PipelineRun")
        for p in r.inputs["spec"]["params"]
        if p["name"] == "tools-image"
    }
    return {
        "pods": {c["image"] for c in pod["containers"] if c["name"] == "ml-dev"},
        "tools": {i for i in steps if f"/{TOOLS_STREAM}:" in i} | params,
    }


def edited(tmp_path: Path, source: Path, extra: str) -> Path:
    target = tmp_path / source.name
    target.write_text(source.read_text() + extra)
    return target


SIX_LOCKED = "six==1.17.0 --hash=sha256:" + "a" * 64 + "\n"
CHANGES: dict[str, tuple[set[str], Any]] = {
    # name: (stages that must get a new BuildConfig, how to make the change)
    "preset": ({"base", "runtime"}, lambda o, mp, tmp: o["image"]["build"].update(preset="hopper")),
    "build arg (maxJobs)": ({"base", "runtime"}, lambda o, mp, tmp: o["image"]["build"].update(maxJobs=32)),
    "base Containerfile": (
        {"base", "runtime"},
        lambda o, mp, tmp: mp.setattr(image_build, "BASE_CONTAINERFILE", edited(tmp, image_build.BASE_CONTAINERFILE, "RUN true\n")),
    ),
    "base lock (make lock)": (
        {"base", "runtime"},
        lambda o, mp, tmp: mp.setattr(
            image_build, "base_lock", lambda name, lock=image_build.base_lock: edited(tmp, lock(name), SIX_LOCKED)
        ),
    ),
    "runtime requirements": (
        {"runtime"},
        lambda o, mp, tmp: o["image"]["build"].update(runtimeRequirements=["accelerate==1.10.1", "peft==0.17.1", "trl==0.23.0"]),
    ),
    "runtime Containerfile": (
        {"runtime"},
        lambda o, mp, tmp: mp.setattr(image_build, "RUNTIME_CONTAINERFILE", edited(tmp, image_build.RUNTIME_CONTAINERFILE, "RUN true\n")),
    ),
    "steps/requirements.txt": (
        {"tools"},
        lambda o, mp, tmp: mp.setattr(image_build, "STEP_REQUIREMENTS", edited(tmp, image_build.STEP_REQUIREMENTS, "six==1.17.0\n")),
    ),
    "tools Containerfile": (
        {"tools"},
        lambda o, mp, tmp: mp.setattr(image_build, "TOOLS_CONTAINERFILE", edited(tmp, image_build.TOOLS_CONTAINERFILE, "RUN true\n")),
    ),
}


@pytest.fixture(scope="module")
def before() -> RunResult:
    return build_stack()


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_an_input_change_creates_one_new_build_config_whose_output_the_workloads_use(
    change: str, before: RunResult, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stages, apply = CHANGES[change]
    objects = stack_objects("barcelona")
    apply(objects, monkeypatch, tmp_path)
    after = run_objects("barcelona", objects)
    assert after.error is None, after.error
    old, new = build_configs(before), build_configs(after)
    assert set(old) == set(new) == {"base", "runtime", "tools"}
    old_names = {bc["name"] for bc in old.values()}
    for stage in ("base", "runtime", "tools"):
        # The Pulumi identity is stable (no rename under upsert); the Kubernetes object is new or untouched.
        assert new[stage]["pulumi"] == old[stage]["pulumi"]
        if stage in stages:
            assert new[stage]["name"] not in old_names, f"{change}: {stage} must be a NEW BuildConfig (never built)"
            assert new[stage]["spec"]["output"] != old[stage]["spec"]["output"], f"{change}: {stage} needs a new tag"
            assert new[stage]["name"].endswith(new[stage]["spec"]["output"]["to"]["name"].rsplit("-", 1)[1])
        else:
            assert new[stage] == old[stage], f"{change}: {stage} must not change at all"
    # What starts the build of the new object: ConfigChange (FROM a public image) or, for the runtime,
    # the ImageChange trigger on exactly the base tag the base BuildConfig produces.
    assert new["base"]["spec"]["triggers"] == new["tools"]["spec"]["triggers"] == [{"type": "ConfigChange"}]
    assert new["runtime"]["spec"]["triggers"] == [{"type": "ImageChange", "imageChange": {}}]
    assert new["runtime"]["spec"]["strategy"]["dockerStrategy"]["from"] == new["base"]["spec"]["output"]["to"]
    # The workloads use exactly the outputs of the declared BuildConfigs.
    images = workload_images(after)
    assert images["pods"] == {output_image(after, new["runtime"])} == {after.outputs["runtime_image"]}
    assert images["tools"] == {output_image(after, new["tools"])}


@pytest.mark.parametrize("target", ["BASE_CONTAINERFILE", "RUNTIME_CONTAINERFILE", "TOOLS_CONTAINERFILE", "STEP_REQUIREMENTS", "base_lock"])
def test_a_comment_only_edit_changes_nothing(target: str, before: RunResult, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source: Path = image_build.base_lock(None) if target == "base_lock" else getattr(image_build, target)
    lines = source.read_text().splitlines()
    # a new comment line after the first instruction, an edited comment, a blank line and a trailing comment
    # (after a complete line: a comment cannot split a `\`-continued instruction or a locked entry's hashes)
    first = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#") and not line.endswith("\\"))
    lines.insert(first + 1, "# a comment someone added")
    lines = [line + " (edited)" if line.startswith("# ") else line for line in lines]
    (tmp_path / source.name).write_text("\n".join(lines) + "\n\n# trailing\n")
    monkeypatch.setattr(image_build, target, (lambda name: tmp_path / source.name) if target == "base_lock" else tmp_path / source.name)
    after = build_stack()

    def objects(result: RunResult) -> dict[tuple[str, str], Any]:
        return {(r.typ, r.name): r.inputs for r in result.resources}

    assert objects(after) == objects(before)


def test_stripping_keeps_every_instruction_directives_and_heredocs() -> None:
    from dockerfile_parse import DockerfileParser

    for path in (image_build.BASE_CONTAINERFILE, image_build.RUNTIME_CONTAINERFILE, image_build.TOOLS_CONTAINERFILE):

        def instructions(text: str) -> list[tuple[str, str]]:
            parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
            return [(i["instruction"], i["value"]) for i in parser.structure if i["instruction"] != "COMMENT"]

        text = path.read_text()
        assert instructions(image_build.strip_comments(text)) == instructions(text), path.name
        assert "\n#" not in "\n" + image_build.strip_comments(text)
    text = "# syntax=docker/dockerfile:1\n# comment\nFROM x\nRUN <<EOF\n# kept: heredoc content\nEOF\n# gone\nRUN true\n"
    assert image_build.strip_comments(text) == "# syntax=docker/dockerfile:1\nFROM x\nRUN <<EOF\n# kept: heredoc content\nEOF\nRUN true\n"


def internal_refs(result: RunResult) -> list[tuple[str, str]]:
    """(where, image) for every internal-registry image a workload pulls or a build starts FROM."""
    refs: list[tuple[str, str]] = []
    for r in result.of_type("kubernetes:apps/v1:StatefulSet"):
        for c in r.inputs["spec"]["template"]["spec"]["containers"]:
            refs.append((f"StatefulSet {c['name']}", c["image"]))
    for r in result.of_type("kubernetes:tekton.dev/v1:Task"):
        refs += [(f"Task {r.inputs['metadata']['name']}", s["image"]) for s in r.inputs["spec"]["steps"]]
    for r in result.of_type("kubernetes:tekton.dev/v1:PipelineRun"):
        name = r.inputs["metadata"]["name"]
        refs += [(f"PipelineRun {name}", p["value"]) for p in r.inputs["spec"]["params"] if p["name"] == "tools-image"]
    for r in result.of_type(BC):
        frm = r.inputs["spec"]["strategy"]["dockerStrategy"]["from"]
        if frm["kind"] == "ImageStreamTag":
            meta = r.inputs["metadata"]
            refs.append((f"BuildConfig {meta['name']}", naming_internal(meta["namespace"]) + frm["name"]))
    return [(where, image) for where, image in refs if image.startswith("image-registry.openshift-image-registry.svc:5000/")]


def naming_internal(namespace: str) -> str:
    return f"image-registry.openshift-image-registry.svc:5000/{namespace}/"


def built_images(result: RunResult) -> set[str]:
    return {naming_internal(r.inputs["metadata"]["namespace"]) + r.inputs["spec"]["output"]["to"]["name"] for r in result.of_type(BC)}


VARIANTS: dict[str, tuple[str, Any]] = {
    "barcelona": ("barcelona", lambda o: None),
    "barcelona tcp/shared": ("barcelona", tcp_shared_variant),
    "barcelona git source": (
        "barcelona",
        lambda o: o["image"]["build"].update(source="git", git={"uri": "https://github.com/example/ml-dev-env.git", "ref": "v1.2.0"}),
    ),
    **{f"barcelona preset {p}": ("barcelona", lambda o, p=p: o["image"]["build"].update(preset=p)) for p in PRESETS},
    "barcelona without models": ("barcelona", lambda o: o.update(models=[])),
    "nerc-production": ("nerc-production", lambda o: None),
    "nerc-production with models and a build": (
        "nerc-production",
        lambda o: o.update(
            image={"build": stack_objects("barcelona")["image"]["build"]},
            models=stack_objects("barcelona")["models"],
            modelPipeline=stack_objects("barcelona")["modelPipeline"],
        ),
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_workloads_never_reference_a_tag_no_declared_build_config_produces(variant: str) -> None:
    stack, mutate = VARIANTS[variant]
    objects = stack_objects(stack)
    mutate(objects)
    result = run_objects(stack, objects)
    assert result.error is None, result.error
    built = built_images(result)
    # An `image.reference` is the user's statement that the image exists; every tag the program computes must be built.
    configured = {objects["image"].get("reference")}
    missing = [(where, image) for where, image in internal_refs(result) if image not in built | configured]
    assert not missing, f"internal images nothing in the stack builds: {missing}; built: {sorted(built)}"


def test_a_changed_step_file_rebuilds_the_tools_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps run from the tools image: their files are an input of its hash (and of its ConfigMaps' names)."""
    import steps.embed

    base = "registry.access.redhat.com/ubi9/python-311:9.6"
    before = image_build.tools_hash(base)
    files = steps.embed.shipped()
    files["steps-lib"]["registry.py"] += "\n# changed\n"
    monkeypatch.setattr(steps.embed, "shipped", lambda: files)
    assert image_build.tools_hash(base) != before
    assert image_build.tools_steps_config_map(base, "s", "steps") == f"s-steps-{image_build.tools_hash(base)}"
