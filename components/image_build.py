"""On-cluster image build (SPEC.md §5.5): ImageStream + Docker-strategy BuildConfigs, base and runtime.

The base stage (CUDA, PyTorch, Flash-Attention, RDMA user space, dev servers) is tagged
`<arch>-<cuda>-torch<ver>-fa<ver>` from `images/presets.yaml`; the runtime stage builds `FROM` that
ImageStreamTag (an ImageChange trigger rebuilds it when a new base lands) and is tagged
`runtime-<hash of its inputs>`, so every input change gives a new tag — and the GPU cluster, which
uses exactly that reference, rolls to it on the next `pulumi up`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml
from pydantic import BaseModel, ConfigDict

from components import crds, naming
from stacks.config import BuildNodesConfig, ImageBuildConfig

IMAGES = Path(__file__).resolve().parent.parent / "images"
BASE_CONTAINERFILE = IMAGES / "base.Containerfile"
RUNTIME_CONTAINERFILE = IMAGES / "runtime.Containerfile"
TOOLS_CONTAINERFILE = IMAGES / "tools.Containerfile"
STEP_REQUIREMENTS = IMAGES.parent / "steps" / "requirements.txt"


@functools.cache
def presets_file() -> dict[str, Any]:
    return yaml.safe_load((IMAGES / "presets.yaml").read_text())


def preset(name: str | None) -> dict[str, Any]:
    data = presets_file()
    return data["presets"][name or data["default"]]


def preset_name(build: ImageBuildConfig) -> str:
    return build.preset or presets_file()["default"]


def base_tag(build: ImageBuildConfig) -> str:
    return str(preset(build.preset)["tag"])


RUNTIME_REQUIREMENTS = IMAGES / "runtime-requirements.txt"


def _pins(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def app_requirements(build: ImageBuildConfig) -> list[str]:
    """Pins installed by the runtime stage through APP_REQUIREMENTS (inline source)."""
    if build.runtime_requirements:
        return list(build.runtime_requirements)
    return _pins(RUNTIME_REQUIREMENTS) if build.source == "inline" else []


def runtime_inputs(build: ImageBuildConfig) -> dict[str, Any]:
    """Everything the runtime stage's result depends on."""
    inputs: dict[str, Any] = {"base": base_tag(build), "requirements": app_requirements(build)}
    if build.source == "git" and build.git:
        inputs["git"] = build.git.model_dump()
    else:
        inputs["containerfile"] = RUNTIME_CONTAINERFILE.read_text()
    return inputs


def runtime_tag(build: ImageBuildConfig) -> str:
    return "runtime-" + naming.short_hash(json.dumps(runtime_inputs(build), sort_keys=True))


def _source(build: ImageBuildConfig, containerfile: Path) -> dict[str, Any]:
    if build.source == "git" and build.git:
        source: dict[str, Any] = {"type": "Git", "git": {"uri": build.git.uri, "ref": build.git.ref}}
        if build.git.context_dir:
            source["contextDir"] = build.git.context_dir
        return source
    return {"type": "Dockerfile", "dockerfile": containerfile.read_text()}


def _dockerfile_path(build: ImageBuildConfig, containerfile: Path) -> str:
    # Git builds read the file from the context dir; inline builds name the embedded file "Dockerfile".
    return containerfile.name if build.source == "git" else "Dockerfile"


def _build_args(values: dict[str, Any]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in values.items()]


def base_spec(build: ImageBuildConfig, nodes: BuildNodesConfig, image_stream: str) -> dict[str, Any]:
    p = preset(build.preset)
    args = {**p["build_args"], "MAX_JOBS": build.max_jobs}
    return {
        **_common_spec(build, nodes),
        "source": _source(build, BASE_CONTAINERFILE),
        "strategy": {
            "type": "Docker",
            "dockerStrategy": {
                "dockerfilePath": _dockerfile_path(build, BASE_CONTAINERFILE),
                "from": {"kind": "DockerImage", "name": p["base_image"]},
                "buildArgs": _build_args(args),
            },
        },
        "output": {"to": {"kind": "ImageStreamTag", "name": f"{image_stream}:{base_tag(build)}"}},
        "triggers": [{"type": "ConfigChange"}],
    }


def runtime_spec(build: ImageBuildConfig, nodes: BuildNodesConfig, image_stream: str) -> dict[str, Any]:
    base = f"{image_stream}:{base_tag(build)}"
    args: dict[str, Any] = {"BASE_IMAGE": base, "SOURCE_REF": build.git.ref if build.git else runtime_tag(build)}
    # inline: no context files, requirements come in as pins; git: the context's requirements file
    args["REQUIREMENTS_FILE"] = build.git.requirements_file if build.git else ""
    if app_requirements(build):
        args["APP_REQUIREMENTS"] = " ".join(app_requirements(build))
    return {
        **_common_spec(build, nodes),
        "source": _source(build, RUNTIME_CONTAINERFILE),
        "strategy": {
            "type": "Docker",
            "dockerStrategy": {
                "dockerfilePath": _dockerfile_path(build, RUNTIME_CONTAINERFILE),
                "from": {"kind": "ImageStreamTag", "name": base},
                "buildArgs": _build_args(args),
            },
        },
        "output": {"to": {"kind": "ImageStreamTag", "name": f"{image_stream}:{runtime_tag(build)}"}},
        # A new base image rebuilds the runtime; a changed BuildConfig builds both.
        "triggers": [{"type": "ConfigChange"}, {"type": "ImageChange", "imageChange": {}}],
    }


def _common_spec(build: ImageBuildConfig, nodes: BuildNodesConfig) -> dict[str, Any]:
    res = build.resources
    return _run_spec(
        build.completion_deadline_seconds,
        {"cpu": res.requests.cpu, "memory": res.requests.memory},
        {"cpu": res.limits.cpu, "memory": res.limits.memory},
        nodes,
    )


def _run_spec(deadline: int, requests: dict[str, str], limits: dict[str, str], nodes: BuildNodesConfig) -> dict[str, Any]:
    """How and where a build runs: serial, bounded in time and size, on the build nodes."""
    spec: dict[str, Any] = {
        "runPolicy": "Serial",
        "completionDeadlineSeconds": deadline,
        "resources": {"requests": requests, "limits": limits},
        "successfulBuildsHistoryLimit": 3,
        "failedBuildsHistoryLimit": 3,
    }
    if nodes.node_selector:
        spec["nodeSelector"] = dict(nodes.node_selector)
    return spec


class ImageBuildArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    labels: dict[str, str]
    build: ImageBuildConfig
    build_nodes: BuildNodesConfig


class ImageBuild(pulumi.ComponentResource):
    """ImageStream + base and runtime BuildConfigs; `runtime_image` is what the GPU pods run."""

    base_image: str
    runtime_image: str
    image_stream_tag: str
    """`<stream>:<runtime tag>`, for the image-change trigger."""
    start_build_command: str
    logs_command: str

    def __init__(self, name: str, args: ImageBuildArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-dev-env:image:ImageBuild", name, None, opts)
        build, ns, stream = args.build, args.namespace, args.build.image_stream
        child = pulumi.ResourceOptions(parent=self)

        def meta(obj: str, stage: str | None = None) -> k8s.meta.v1.ObjectMetaArgs:
            labels = {**args.labels, "ml-dev-env/preset": preset_name(build)}
            if stage:
                labels["ml-dev-env/stage"] = stage
            return k8s.meta.v1.ObjectMetaArgs(name=obj, namespace=ns, labels=labels)

        image_stream = crds.custom_resource(
            f"{name}-imagestream", "image.openshift.io/v1", "ImageStream", meta(stream), {"lookupPolicy": {"local": True}}, child
        )
        after_stream = pulumi.ResourceOptions(parent=self, depends_on=[image_stream])
        crds.custom_resource(
            f"{name}-base", "build.openshift.io/v1", "BuildConfig", meta(f"{stream}-base", "base"),
            base_spec(build, args.build_nodes, stream), after_stream,
        )
        crds.custom_resource(
            f"{name}-runtime", "build.openshift.io/v1", "BuildConfig", meta(f"{stream}-runtime", "runtime"),
            runtime_spec(build, args.build_nodes, stream), after_stream,
        )
        self.base_image = naming.internal_image(ns, stream, base_tag(build))
        self.runtime_image = naming.internal_image(ns, stream, runtime_tag(build))
        self.image_stream_tag = f"{stream}:{runtime_tag(build)}"
        self.start_build_command = f"oc start-build {stream}-base -n {ns} --follow"
        self.logs_command = f"oc logs -f bc/{stream}-runtime -n {ns}"
        self.register_outputs({"base_image": self.base_image, "runtime_image": self.runtime_image})


def image_trigger_annotation(image_stream_tag: str, container: str) -> dict[str, str]:
    """OpenShift's image-change trigger for a StatefulSet container (opt-in rollout on a new image)."""
    trigger = [{
        "from": {"kind": "ImageStreamTag", "name": image_stream_tag},
        "fieldPath": f'spec.template.spec.containers[?(@.name=="{container}")].image',
    }]
    return {"image.openshift.io/triggers": json.dumps(trigger, separators=(",", ":"))}


def step_requirements() -> list[str]:
    """The step programs' pins, one per line in steps/requirements.txt (comments dropped)."""
    return _pins(STEP_REQUIREMENTS)


def tools_tag(base_image: str) -> str:
    inputs = [base_image, TOOLS_CONTAINERFILE.read_text(), step_requirements()]
    return "tools-" + naming.short_hash(json.dumps(inputs))


def tools_spec(base_image: str, nodes: BuildNodesConfig, image_stream: str) -> dict[str, Any]:
    return {
        **_run_spec(1800, {"cpu": "1", "memory": "2Gi"}, {"cpu": "2", "memory": "4Gi"}, nodes),
        "source": {"type": "Dockerfile", "dockerfile": TOOLS_CONTAINERFILE.read_text()},
        "strategy": {
            "type": "Docker",
            "dockerStrategy": {
                "dockerfilePath": "Dockerfile",
                "from": {"kind": "DockerImage", "name": base_image},
                "buildArgs": _build_args({"STEP_REQUIREMENTS": " ".join(step_requirements())}),
            },
        },
        "output": {"to": {"kind": "ImageStreamTag", "name": f"{image_stream}:{tools_tag(base_image)}"}},
        "triggers": [{"type": "ConfigChange"}],
    }


class ToolsImageArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    labels: dict[str, str]
    base_image: str
    build_nodes: BuildNodesConfig
    image_stream: str = "ml-dev-env-tools"


class ToolsImage(pulumi.ComponentResource):
    """The small image the model-pipeline steps run in (Python + pinned step deps + skopeo)."""

    image: str

    def __init__(self, name: str, args: ToolsImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-dev-env:image:ToolsImage", name, None, opts)
        meta = k8s.meta.v1.ObjectMetaArgs(name=args.image_stream, namespace=args.namespace, labels=args.labels)
        stream = crds.custom_resource(
            f"{name}-imagestream", "image.openshift.io/v1", "ImageStream", meta, {"lookupPolicy": {"local": True}},
            pulumi.ResourceOptions(parent=self),
        )
        crds.custom_resource(
            f"{name}-build", "build.openshift.io/v1", "BuildConfig", meta,
            tools_spec(args.base_image, args.build_nodes, args.image_stream),
            pulumi.ResourceOptions(parent=self, depends_on=[stream]),
        )
        self.image = naming.internal_image(args.namespace, args.image_stream, tools_tag(args.base_image))
        self.register_outputs({"image": self.image})
