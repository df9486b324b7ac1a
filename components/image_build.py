"""On-cluster image build: ImageStream + Docker-strategy BuildConfigs, base and runtime (and the tools image).

One BuildConfig PER INPUT HASH. OpenShift starts a build for a ConfigChange trigger only while the
BuildConfig has never built (openshift/openshift-controller-manager,
pkg/build/controller/buildconfig/buildconfig_controller.go, `handleBuildConfig`:
`if bc.Status.LastVersion > 0 { return nil }`), so editing a BuildConfig that already built builds
nothing. Here every stage's image-relevant inputs (Containerfile without comments, base image, build
args, requirements and hash locks, Git source) are hashed; the hash is in both the output tag and the BuildConfig's
name. A changed input therefore gives a NEW BuildConfig object (Pulumi replaces it: create the new
name, then delete the old one) whose first build produces exactly the new tag the pods / PipelineRuns
reference; an unchanged stage keeps its BuildConfig and tag untouched.

* base `<stream>-base-<hash>` → `<stream>:<preset tag>-<hash>`; ConfigChange trigger (FROM a public
  image); its hash lock in the ConfigMap `<stream>-base-<hash>-lock`.
* runtime `<stream>-runtime-<hash>` → `<stream>:runtime-<hash>`; its hash includes the base tag, so a
  new base gives a new runtime BuildConfig too. It has only an ImageChange trigger on the base tag:
  the image trigger controller builds a newly added BuildConfig at once when the base tag exists, or
  as soon as the base build pushes it (pkg/image/controller/trigger/cache.go `ProcessEvents` queues an
  added BuildConfig; pkg/image/trigger/buildconfigs/buildconfigs.go `ImageChanged` instantiates when
  the tag resolves and differs from the last triggered image) — exactly one build, no race with a
  ConfigChange instantiation.
* tools `<stream>-<hash>` → `<stream>:tools-<hash>` (model pipeline), ConfigChange trigger.
* a Job `<stream>-wait-<runtime hash>` that completes once the runtime tag is pushed; the pods get the new
  tag through `runtime_ready`, which depends on it, so they roll only when the image exists.

An old BuildConfig is deleted at the end of the `up` that replaced it (with its Builds and their logs);
the ImageStream keeps the old tags.

Why one module: the base, runtime and tools images share the hash, the BuildConfig shape and the wait for a tag;
each image is one component of it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pydantic import BaseModel, ConfigDict

from components import crds
from core import naming
from core.presets import base_lock, preset, presets_file
from inpod import contract
from stacks.config import BuildNodesConfig, ImageBuildConfig

IMAGES = Path(__file__).resolve().parent.parent / "images"
BASE_CONTAINERFILE = IMAGES / "base.Containerfile"
RUNTIME_CONTAINERFILE = IMAGES / "runtime.Containerfile"
TOOLS_CONTAINERFILE = IMAGES / "tools.Containerfile"
STEP_REQUIREMENTS = IMAGES.parent / "steps" / "requirements.txt"


def preset_name(build: ImageBuildConfig) -> str:
    return build.preset or presets_file()["default"]


PARSER_DIRECTIVE = re.compile(r"^#\s*(syntax|escape|check)\s*=", re.IGNORECASE)
HEREDOC = re.compile(r"<<-?\s*[\"']?([A-Za-z_][A-Za-z0-9_]*)[\"']?")


def strip_comments(containerfile: str) -> str:
    """The Containerfile as the builder reads it: comment and blank lines dropped, trailing blanks trimmed.

    Kept verbatim: parser directives at the top (`# syntax=`, `# escape=`, `# check=`) and heredoc
    bodies (where `#` lines are content). A comment-only edit thus leaves the text — and every hash
    and BuildConfig derived from it — unchanged.
    """
    out: list[str] = []
    heredocs: list[str] = []
    directives = True
    for line in containerfile.splitlines():
        if heredocs:
            out.append(line)
            if line.strip() == heredocs[0]:
                heredocs.pop(0)
            continue
        stripped = line.strip()
        if directives and PARSER_DIRECTIVE.match(stripped):
            out.append(stripped)
            continue
        directives = False
        if not stripped or stripped.startswith("#"):
            continue
        out.append(line.rstrip())
        heredocs.extend(HEREDOC.findall(line))
    return "\n".join(out) + "\n"


def containerfile_text(path: Path) -> str:
    return strip_comments(path.read_text())


def _hash(inputs: Any) -> str:
    return naming.short_hash(json.dumps(inputs, sort_keys=True))


def base_args(build: ImageBuildConfig) -> dict[str, Any]:
    return {**preset(build.preset)["build_args"], "MAX_JOBS": build.max_jobs}


def _source_inputs(build: ImageBuildConfig, containerfile: Path) -> dict[str, Any]:
    if build.source == "git" and build.git:
        return {"git": build.git.model_dump()}
    return {"containerfile": containerfile_text(containerfile)}


# The base stage's hash lock reaches the build as a ConfigMap the builder copies into the build context
# (openshift/builder pkg/build/builder/docker.go `dockerBuild` → `copyConfigMaps`/`copyLocalObject`: each key
# into <context dir>/<destinationDir>, after the inline Dockerfile is written, for inline and Git sources
# alike), where the Containerfile COPYs it. Not a build arg: the build pod gets the whole Build object in ONE
# environment variable, BUILD (openshift-controller-manager pkg/build/controller/strategy/docker.go
# `CreateBuildPod`), and Linux refuses an exec whose single env string exceeds 128 KiB; the lock is ~150 KB.
# A missing ConfigMap holds the build back rather than failing it (pkg/build/controller/build/build_controller.go
# `checkForNonExistantResources`); the BuildConfig depends on it anyway.
BASE_LOCK_DIR = "ml-dev-env-lock"
BASE_LOCK_KEY = "base-requirements.txt"


def lock_entries(path: Path) -> list[str]:
    """A uv hash lock's entries, one per package (`name==version --hash=sha256:… …`): continuation lines
    joined, comments dropped — so regenerating the lock's annotations changes no hash."""
    joined = path.read_text().replace("\\\n", " ")
    return [" ".join(line.split()) for line in _pins_text(joined)]


def base_lock_text(build: ImageBuildConfig) -> str:
    """The requirements file the base stage installs (its preset's Python's lock, one line per entry)."""
    return "".join(f"{entry}\n" for entry in lock_entries(base_lock(build.preset)))


def base_inputs(build: ImageBuildConfig) -> dict[str, Any]:
    """Everything the base stage's result depends on (build resources and placement are not inputs)."""
    p = preset(build.preset)
    args = {k: str(v) for k, v in base_args(build).items()}
    return {
        "from": p["base_image"],
        "tag": p["tag"],
        "args": args,
        "lock": base_lock_text(build),
        **_source_inputs(build, BASE_CONTAINERFILE),
    }


def base_hash(build: ImageBuildConfig) -> str:
    return _hash(base_inputs(build))


def base_tag(build: ImageBuildConfig) -> str:
    """`<preset tag>-<hash of the base inputs>`."""
    return f"{preset(build.preset)['tag']}-{base_hash(build)}"


RUNTIME_REQUIREMENTS = IMAGES / "runtime-requirements.txt"


def _pins(path: Path) -> list[str]:
    return _pins_text(path.read_text())


def _pins_text(text: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def app_requirements(build: ImageBuildConfig) -> list[str]:
    """Pins installed by the runtime stage through APP_REQUIREMENTS (inline source)."""
    if build.runtime_requirements:
        return list(build.runtime_requirements)
    return _pins(RUNTIME_REQUIREMENTS) if build.source == "inline" else []


def runtime_inputs(build: ImageBuildConfig) -> dict[str, Any]:
    """Everything the runtime stage's result depends on (the base tag carries the base's hash)."""
    return {"base": base_tag(build), "requirements": app_requirements(build), **_source_inputs(build, RUNTIME_CONTAINERFILE)}


def runtime_hash(build: ImageBuildConfig) -> str:
    return _hash(runtime_inputs(build))


def runtime_tag(build: ImageBuildConfig) -> str:
    return f"runtime-{runtime_hash(build)}"


def base_build_config(build: ImageBuildConfig) -> str:
    return f"{build.image_stream}-base-{base_hash(build)}"


def base_lock_config_map(build: ImageBuildConfig) -> str:
    return f"{base_build_config(build)}-lock"


def runtime_build_config(build: ImageBuildConfig) -> str:
    return f"{build.image_stream}-runtime-{runtime_hash(build)}"


def _source(build: ImageBuildConfig, containerfile: Path) -> dict[str, Any]:
    if build.source == "git" and build.git:
        source: dict[str, Any] = {"type": "Git", "git": {"uri": build.git.uri, "ref": build.git.ref}}
        if build.git.context_dir:
            source["contextDir"] = build.git.context_dir
        return source
    return {"type": "Dockerfile", "dockerfile": containerfile_text(containerfile)}


def _dockerfile_path(build: ImageBuildConfig, containerfile: Path) -> str:
    # Git builds read the file from the context dir; inline builds name the embedded file "Dockerfile".
    return containerfile.name if build.source == "git" else "Dockerfile"


def _build_args(values: dict[str, Any]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in values.items()]


def base_spec(build: ImageBuildConfig, nodes: BuildNodesConfig, image_stream: str) -> dict[str, Any]:
    p = preset(build.preset)
    args = base_args(build)
    lock = {"configMap": {"name": base_lock_config_map(build)}, "destinationDir": BASE_LOCK_DIR}
    return {
        **_common_spec(build, nodes),
        "source": {**_source(build, BASE_CONTAINERFILE), "configMaps": [lock]},
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
        # Only the ImageChange trigger on the base tag: it builds this (new) BuildConfig once the base tag
        # exists — at once, or when the base build pushes it (see the module docstring).
        "triggers": [{"type": "ImageChange", "imageChange": {}}],
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
    wait_image: str | None = None
    """Python image for the wait Job (`runtime_ready`); None: no Job, `runtime_ready` is the plain reference."""


SA_DIR = contract.SA_DIR  # token + service-ca.crt (the internal registry's CA)
WAIT_MARGIN_SECONDS = 600  # queueing of the two build pods before their deadlines start


def wait_seconds(build: ImageBuildConfig) -> int:
    """Longest time until the runtime tag exists: both builds run to their deadline, one after the other."""
    return 2 * build.completion_deadline_seconds + WAIT_MARGIN_SECONDS


def wait_job_name(build: ImageBuildConfig) -> str:
    return f"{build.image_stream[:40]}-wait-{runtime_hash(build)}"


def wait_job_spec(build: ImageBuildConfig, image: str, python_image: str, namespace: str) -> k8s.batch.v1.JobSpecArgs:
    """A Job that completes when `image` is in the registry (steps/wait_image.py, stdlib only, as the pipeline's wait-tools),
    and fails at once when the newest Build of the base or runtime BuildConfig failed (its ServiceAccount may list Builds)."""
    from steps.embed import step_script  # the steps package is the single source of the wait program

    seconds = wait_seconds(build)
    return k8s.batch.v1.JobSpecArgs(
        backoff_limit=0,
        active_deadline_seconds=seconds + 120,
        template=k8s.core.v1.PodTemplateSpecArgs(
            spec=k8s.core.v1.PodSpecArgs(
                service_account_name=naming.image_wait(build.image_stream),
                restart_policy="Never",
                security_context=k8s.core.v1.PodSecurityContextArgs(
                    run_as_non_root=True, seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")
                ),
                containers=[
                    k8s.core.v1.ContainerArgs(
                        name="wait",
                        image=python_image,
                        image_pull_policy="IfNotPresent",
                        command=[
                            "python3",
                            "-c",
                            step_script("wait_image"),
                            "--image",
                            image,
                            "--token-file",
                            f"{SA_DIR}/token",
                            "--ca-file",
                            f"{SA_DIR}/service-ca.crt",
                            "--timeout",
                            str(seconds),
                            "--namespace",
                            namespace,
                            "--build-config",
                            base_build_config(build),
                            "--build-config",
                            runtime_build_config(build),
                            "--api-ca-file",
                            f"{SA_DIR}/ca.crt",
                        ],
                        resources=k8s.core.v1.ResourceRequirementsArgs(
                            requests={"cpu": "10m", "memory": "64Mi"}, limits={"cpu": "200m", "memory": "128Mi"}
                        ),
                        security_context=k8s.core.v1.SecurityContextArgs(
                            allow_privilege_escalation=False, capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"])
                        ),
                    )
                ],
            ),
        ),
    )


class ImageBuild(pulumi.ComponentResource):
    """ImageStream + one base and one runtime BuildConfig per input hash; `runtime_image` is what the GPU pods run."""

    base_image: str
    runtime_image: str
    runtime_ready: pulumi.Input[str]
    """`runtime_image`, available once the wait Job saw it pushed (what the GPU pods should use)."""
    base_build_config: str
    runtime_build_config: str
    start_build_command: str
    logs_command: str

    def __init__(self, name: str, args: ImageBuildArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """Declares the image builds. Why one function: a component declares its children in its constructor,
        in the order they depend on each other; their specs come from this module's functions."""
        super().__init__("ml-dev-env:image:ImageBuild", name, None, opts)
        build, ns, stream = args.build, args.namespace, args.build.image_stream
        child = pulumi.ResourceOptions(parent=self)

        def meta(obj: str, stage: str | None = None) -> k8s.meta.v1.ObjectMetaArgs:
            labels = {**args.labels, "ml-dev-env/preset": preset_name(build)}
            if stage:
                labels["ml-dev-env/stage"] = stage
            return k8s.meta.v1.ObjectMetaArgs(name=obj, namespace=ns, labels=labels)

        # Kept on destroy (retainOnDelete): environment stacks' pods pull their image from it (a pod that restarts or
        # resumes after the cluster stack's destroy pulls again); docs/use/teams.md says how to remove it afterwards.
        image_stream = crds.custom_resource(
            f"{name}-imagestream",
            "image.openshift.io/v1",
            "ImageStream",
            meta(stream),
            {"lookupPolicy": {"local": True}},
            pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        after_stream = pulumi.ResourceOptions(parent=self, depends_on=[image_stream])
        self.base_build_config = base_build_config(build)
        self.runtime_build_config = runtime_build_config(build)
        # Stable Pulumi names; the object name carries the input hash, so a changed input is a replacement:
        # the new BuildConfig is created (and builds), the old one is deleted after the update (with its
        # Build objects and logs — Pulumi deletes with foreground propagation); the ImageStream keeps the
        # old tags until they are pruned.
        # The base lock, one immutable ConfigMap per base hash (named after its BuildConfig): replaced with it.
        lock = k8s.core.v1.ConfigMap(
            f"{name}-base-lock",
            metadata=meta(base_lock_config_map(build), "base"),
            immutable=True,
            data={BASE_LOCK_KEY: base_lock_text(build)},
            opts=child,
        )
        crds.custom_resource(
            f"{name}-base",
            "build.openshift.io/v1",
            "BuildConfig",
            meta(self.base_build_config, "base"),
            base_spec(build, args.build_nodes, stream),
            pulumi.ResourceOptions(parent=self, depends_on=[image_stream, lock]),
        )
        crds.custom_resource(
            f"{name}-runtime",
            "build.openshift.io/v1",
            "BuildConfig",
            meta(self.runtime_build_config, "runtime"),
            runtime_spec(build, args.build_nodes, stream),
            after_stream,
        )
        self.base_image = naming.internal_image(ns, stream, base_tag(build))
        self.runtime_image = naming.internal_image(ns, stream, runtime_tag(build))
        self.runtime_ready: pulumi.Input[str] = self.runtime_image
        if args.wait_image:
            # One Job per runtime hash that ends when the new runtime tag is pushed; pulumi-kubernetes awaits a Job
            # until it completes or fails (provider/pkg/await/job.go, jobInitAwaiter.Await). `runtime_ready` carries
            # the Job as a dependency, so the pods are switched to the new tag only once it exists: a rebuild never
            # leaves a running pod replaced by one in ImagePullBackOff for the length of a build.
            # The Job lists the Builds of its two BuildConfigs to fail fast on a failed build (steps/wait_image.py).
            wait_name = naming.image_wait(stream)
            wait_meta = k8s.meta.v1.ObjectMetaArgs(name=wait_name, namespace=ns, labels={**args.labels, "ml-dev-env/stage": "wait"})
            wait_sa = k8s.core.v1.ServiceAccount(f"{name}-wait-sa", metadata=wait_meta, opts=child)
            wait_role = k8s.rbac.v1.Role(
                f"{name}-wait-role",
                metadata=wait_meta,
                rules=[k8s.rbac.v1.PolicyRuleArgs(api_groups=["build.openshift.io"], resources=["builds"], verbs=["get", "list", "watch"])],
                opts=child,
            )
            wait_binding = k8s.rbac.v1.RoleBinding(
                f"{name}-wait-binding",
                metadata=wait_meta,
                role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=wait_name),
                subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=wait_name, namespace=ns)],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[wait_role, wait_sa]),
            )
            job = k8s.batch.v1.Job(
                f"{name}-wait",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=wait_job_name(build),
                    namespace=ns,
                    labels={**args.labels, "ml-dev-env/stage": "wait"},
                    annotations={
                        "pulumi.com/timeoutSeconds": str(wait_seconds(build) + 300),
                        # A Job that failed (a failed build) is replaced by the next `up` instead of blocking it: with
                        # this annotation the provider's Diff reads the live Job and replaces it when it is not ready
                        # (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go kubeProvider.Diff,
                        # metadata.ReplaceUnready; provider/pkg/metadata/overrides.go ReplaceUnready).
                        "pulumi.com/replaceUnready": "true",
                    },
                ),
                spec=wait_job_spec(build, self.runtime_image, args.wait_image, ns),
                # A Job's template is immutable: a change that keeps the name (deadline, Python image, wait program)
                # is a replacement, and create-before-delete of the same name would be an upsert onto the old Job
                # (refused by the API server). Delete first; a new Job for an existing tag completes at once.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[image_stream, wait_binding], delete_before_replace=True),
            )
            image = self.runtime_image
            # The URN is known in a preview (the pods' new tag shows in the diff) and, in an update, resolves only
            # when the Job's registration returns, i.e. after its await.
            self.runtime_ready = job.urn.apply(lambda _: image)
        self.start_build_command = f"oc start-build {self.base_build_config} -n {ns} --follow"
        self.logs_command = f"oc logs -f bc/{self.base_build_config} -n {ns}; oc logs -f bc/{self.runtime_build_config} -n {ns}"
        self.register_outputs({"base_image": self.base_image, "runtime_image": self.runtime_image})


def step_requirements() -> list[str]:
    """The tools image's hash lock (steps/requirements.txt, `make lock`), one entry per package."""
    return lock_entries(STEP_REQUIREMENTS)


# Separates the lock's entries in the STEP_REQUIREMENTS build arg (a build arg is one line; `|` never
# occurs in a requirement); images/tools.Containerfile turns it back into a requirements file.
STEP_REQUIREMENTS_SEPARATOR = "|"


def tools_hash(base_image: str) -> str:
    """Everything the tools image depends on, the step programs' files included (a changed step rebuilds it)."""
    from steps.embed import shipped

    return _hash([base_image, containerfile_text(TOOLS_CONTAINERFILE), step_requirements(), shipped()])


def tools_steps_config_map(base_image: str, image_stream: str, part: str) -> str:
    """The immutable ConfigMap carrying one part of the step files (`steps.embed.SHIPPED_DIRS`) into the build."""
    return f"{image_stream}-{part}-{tools_hash(base_image)}"  # the hash last, as in every per-hash name


def tools_tag(base_image: str) -> str:
    return f"tools-{tools_hash(base_image)}"


def tools_build_config(base_image: str, image_stream: str) -> str:
    return f"{image_stream}-{tools_hash(base_image)}"


# The step files reach the build like the base lock does (see BASE_LOCK_DIR): ConfigMaps the builder copies
# into the build context, here under ml-dev-env-steps/<part>, where images/tools.Containerfile COPYs them.
TOOLS_STEPS_DIR = "ml-dev-env-steps"


def tools_spec(base_image: str, nodes: BuildNodesConfig, image_stream: str) -> dict[str, Any]:
    from steps.embed import SHIPPED_DIRS

    steps = [
        {"configMap": {"name": tools_steps_config_map(base_image, image_stream, part)}, "destinationDir": f"{TOOLS_STEPS_DIR}/{part}"}
        for part in SHIPPED_DIRS
    ]
    return {
        **_run_spec(1800, {"cpu": "1", "memory": "2Gi"}, {"cpu": "2", "memory": "4Gi"}, nodes),
        "source": {"type": "Dockerfile", "dockerfile": containerfile_text(TOOLS_CONTAINERFILE), "configMaps": steps},
        "strategy": {
            "type": "Docker",
            "dockerStrategy": {
                "dockerfilePath": "Dockerfile",
                "from": {"kind": "DockerImage", "name": base_image},
                "buildArgs": _build_args({"STEP_REQUIREMENTS": STEP_REQUIREMENTS_SEPARATOR.join(step_requirements())}),
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
    build_config: str

    def __init__(self, name: str, args: ToolsImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-dev-env:image:ToolsImage", name, None, opts)
        meta = k8s.meta.v1.ObjectMetaArgs(name=args.image_stream, namespace=args.namespace, labels=args.labels)
        stream = crds.custom_resource(
            f"{name}-imagestream",
            "image.openshift.io/v1",
            "ImageStream",
            meta,
            {"lookupPolicy": {"local": True}},
            pulumi.ResourceOptions(parent=self),
        )
        # One BuildConfig per input hash, like ImageBuild (its ConfigChange trigger builds only a new object).
        self.build_config = tools_build_config(args.base_image, args.image_stream)
        bc_meta = k8s.meta.v1.ObjectMetaArgs(
            name=self.build_config, namespace=args.namespace, labels={**args.labels, "ml-dev-env/stage": "tools"}
        )
        from steps.embed import shipped

        # The step files, immutable ConfigMaps per tools hash (named after the BuildConfig): replaced with it.
        files = [
            k8s.core.v1.ConfigMap(
                f"{name}-{part}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=tools_steps_config_map(args.base_image, args.image_stream, part),
                    namespace=args.namespace,
                    labels={**args.labels, "ml-dev-env/stage": "tools"},
                ),
                immutable=True,
                data=data,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for part, data in shipped().items()
        ]
        crds.custom_resource(
            f"{name}-build",
            "build.openshift.io/v1",
            "BuildConfig",
            bc_meta,
            tools_spec(args.base_image, args.build_nodes, args.image_stream),
            pulumi.ResourceOptions(parent=self, depends_on=[stream, *files]),
        )
        self.image = naming.internal_image(args.namespace, args.image_stream, tools_tag(args.base_image))
        self.register_outputs({"image": self.image})
