"""Model-packaging pipeline: LLM weights → KServe modelcar → Quay → internal registry → registry.

Tekton v1 Tasks run the step programs of `steps/` from a small tools image the stack builds itself (the
steps' files are part of it: `steps.embed.shipped`); only the wait for that image runs as an inlined
script. One PipelineRun per configured model, named from a hash of its inputs
(unchanged config re-creates nothing; a change starts a new run) and not awaited by Pulumi.

Why one module: the Tasks, the Pipeline and the PipelineRuns of one pipeline, whose params and results are wired to
each other by name; apart, every name would cross a module boundary.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pydantic import BaseModel, ConfigDict

from components import crds, tekton
from components.image_build import ToolsImage, ToolsImageArgs
from core import model_sizing, naming
from core.model_sizing import STEP, PipelineStep
from core.quantity import parse_quantity
from inpod import contract
from stacks.config import PIPELINE_CREDENTIALS, BuildNodesConfig, ModelConfig, ModelPipelineConfig
from steps.embed import EMBEDDED, step_command, step_script

PIPELINE = "modelcar"
# Bump when the pipeline's output changes meaning (e.g. the modelcar layout): every model re-runs.
PIPELINE_VERSION = 1
STREAM_PIPELINE = "modelcar-stream"
SA_DIR = contract.SA_DIR  # holds service-ca.crt for the internal registry
SA_TOKEN = f"{SA_DIR}/token"
# download, package and upload share the digest cache that lives next to this directory (their default)
WEIGHTS = "$(workspaces.model.path)/weights"
STEP_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def _resources(step: PipelineStep) -> tekton.ComputeResources:
    cpu, mem, eph = step.cpu, step.memory, step.ephemeral
    return tekton.ComputeResources(
        requests={"cpu": cpu[0], "memory": mem[0], "ephemeral-storage": eph[0]},
        limits={"cpu": cpu[1], "memory": mem[1], "ephemeral-storage": eph[1]},
    )


def _secret_env(name: str, secret: str, key: str) -> tekton.EnvVar:
    return tekton.EnvVar(name=name, value_from={"secretKeyRef": {"name": secret, "key": key}})


def _p(*names: str) -> list[tekton.ParamSpec]:
    return [tekton.ParamSpec(name=n) for n in names]


def _step(key: str, image: str, args: list[str], env: list[tekton.EnvVar] | None = None) -> tekton.Step:
    """The one step of Task `key`: its program, resources and workspace use come from its row in `STEP`."""
    step = STEP[key]
    base = [tekton.EnvVar(name="PYTHONUNBUFFERED", value="1")]
    if step.uses_workspace:
        # caches and temporary files on the workspace PVC, never on the node
        base += [
            tekton.EnvVar(name="HOME", value="$(workspaces.model.path)/.home"),
            tekton.EnvVar(name="TMPDIR", value="$(workspaces.model.path)"),
        ]
    embedded = step.program in EMBEDDED
    return tekton.Step(
        name=step.name,
        image=image,
        script=step_script(step.program) if embedded else None,
        command=None if embedded else step_command(step.program),
        args=args,
        env=base + (env or []),
        compute_resources=_resources(step),
        security_context=STEP_SECURITY,
    )


def task_specs(
    tools_image: str,
    tools_base: str,
    secrets: set[str],
    chunk_threshold: str,
    max_layer_size: str = "20G",
    registry_ca_file: str = f"{SA_DIR}/service-ca.crt",
    chunk_size: str = "1Gi",
) -> dict[str, tekton.TaskSpec]:
    """The six Tasks; `secrets` says which optional Secrets exist (hf, s3). Sizes are Kubernetes quantities
    (`modelPipeline.*`), rendered as whole bytes: the steps' size parser has no Kubernetes suffixes.

    Why one function: it is the table of the six Tasks, one entry each, sharing the params, sizes and Secrets;
    read as one table.
    """
    layer_limit = str(int(parse_quantity(max_layer_size)))
    chunks = ["--chunk-threshold", str(int(parse_quantity(chunk_threshold))), "--chunk-size", str(int(parse_quantity(chunk_size)))]
    model_ws = tekton.WorkspaceDeclaration(name="model", description="PVC holding the downloaded weights")
    quay_ws = tekton.WorkspaceDeclaration(name="quay-auth", description="Quay dockerconfigjson", read_only=True)

    def credential_env(cred: str) -> list[tekton.EnvVar]:
        """The credential's Secret keys as the steps' environment variables, when the Secret exists."""
        table = PIPELINE_CREDENTIALS[cred]
        return [_secret_env(env, table.secret, env) for env, _, _ in table.keys] if cred in secrets else []

    download_env, s3_env = credential_env("hf"), credential_env("s3")
    return {
        "wait-tools": tekton.TaskSpec(
            description="Wait until the tools image is pushed (its build starts with the same `pulumi up`).",
            params=_p("image"),
            steps=[
                _step(
                    "wait-tools",
                    tools_base,
                    [
                        "--image",
                        "$(params.image)",
                        "--token-file",
                        SA_TOKEN,
                        "--ca-file",
                        f"{SA_DIR}/service-ca.crt",
                        "--timeout",
                        str(model_sizing.task_timeout_minutes("wait-tools", 0) * 60 - 60),
                    ],
                )
            ],
        ),
        "download": tekton.TaskSpec(
            description="Download the weights (Hugging Face or S3) onto the workspace PVC, verifying checksums.",
            params=[*_p("source-uri", "revision", "endpoint-url", "region"), tekton.ParamSpec(name="include", type="array")],
            results=[
                tekton.ResultSpec(name="BYTES", description="bytes downloaded"),
                tekton.ResultSpec(name="REVISION", description="resolved Hugging Face commit (empty for S3)"),
                tekton.ResultSpec(name="LICENSE", description="model card license (empty when unknown)"),
            ],
            workspaces=[model_ws],
            steps=[
                _step(
                    "download",
                    tools_image,
                    [
                        "--source",
                        "$(params.source-uri)",
                        "--dest",
                        WEIGHTS,
                        "--revision",
                        "$(params.revision)",
                        "--endpoint-url",
                        "$(params.endpoint-url)",
                        "--region",
                        "$(params.region)",
                        "--result-size",
                        "$(results.BYTES.path)",
                        "--max-layer-size",
                        layer_limit,
                        "--result-revision",
                        "$(results.REVISION.path)",
                        "--result-license",
                        "$(results.LICENSE.path)",
                        "--include",
                        "$(params.include[*])",
                    ],
                    download_env + s3_env,
                )
            ],
        ),
        "package": tekton.TaskSpec(
            description="Stream the weights into a modelcar (one uncompressed GNU tar layer per file) and push it to Quay.",
            params=_p("image", "base-image", "source", "revision", "license", "quantization"),
            results=[tekton.ResultSpec(name="IMAGE_DIGEST"), tekton.ResultSpec(name="IMAGE_URL", description="repo@digest")],
            workspaces=[model_ws, quay_ws],
            steps=[
                _step(
                    "package",
                    tools_image,
                    [
                        # OCI annotations: where the weights came from, at which revision, under which license, how quantized
                        "--annotation",
                        "org.opencontainers.image.source=$(params.source)",
                        "--annotation",
                        "org.opencontainers.image.revision=$(params.revision)",
                        "--annotation",
                        "org.opencontainers.image.licenses=$(params.license)",
                        "--annotation",
                        "io.ml-dev-env.model.quantization=$(params.quantization)",
                        "--model-dir",
                        WEIGHTS,
                        "--image",
                        "$(params.image)",
                        "--base-image",
                        "$(params.base-image)",
                        "--authfile",
                        "$(workspaces.quay-auth.path)/.dockerconfigjson",
                        *chunks,
                        "--max-layer-size",
                        layer_limit,
                        "--result-digest",
                        "$(results.IMAGE_DIGEST.path)",
                        "--result-image",
                        "$(results.IMAGE_URL.path)",
                    ],
                )
            ],
        ),
        "mirror": tekton.TaskSpec(
            description="Copy the image from Quay into the internal registry, preserving digests.",
            params=_p("source-image", "destination"),
            results=[tekton.ResultSpec(name="IMAGE_DIGEST"), tekton.ResultSpec(name="IMAGE_URL", description="repo@digest")],
            workspaces=[model_ws, quay_ws],
            steps=[
                _step(
                    "mirror",
                    tools_image,
                    [
                        "--src",
                        "$(params.source-image)",
                        "--dest",
                        "$(params.destination)",
                        "--src-authfile",
                        "$(workspaces.quay-auth.path)/.dockerconfigjson",
                        # the service-account token is read right before the push (tokens expire in long runs)
                        "--dest-token-file",
                        SA_TOKEN,
                        "--dest-cert-dir",
                        SA_DIR,
                        "--tmpdir",
                        "$(workspaces.model.path)",
                        "--result-digest",
                        "$(results.IMAGE_DIGEST.path)",
                        "--result-image",
                        "$(results.IMAGE_URL.path)",
                    ],
                )
            ],
        ),
        "register": tekton.TaskSpec(
            description="Register the model version with URI oci://<internal repo>@sha256:<digest>.",
            params=_p("registry-url", "model-name", "version-name", "description", "image", "quantization", "base-model", "source"),
            results=[
                tekton.ResultSpec(name="MODEL_ID"),
                tekton.ResultSpec(name="VERSION_ID"),
                tekton.ResultSpec(name="VERSION_NAME", description="<version> or <version>-<digest12> for a new image"),
            ],
            steps=[
                _step(
                    "register",
                    tools_image,
                    [
                        "--registry-url",
                        "$(params.registry-url)",
                        "--token-file",
                        SA_TOKEN,
                        "--ca-file",
                        registry_ca_file,
                        "--result-version-name",
                        "$(results.VERSION_NAME.path)",
                        "--model-name",
                        "$(params.model-name)",
                        "--version",
                        "$(params.version-name)",
                        "--description",
                        "$(params.description)",
                        "--image",
                        "$(params.image)",
                        "--quantization",
                        "$(params.quantization)",
                        "--base-model",
                        "$(params.base-model)",
                        "--source",
                        "$(params.source)",
                        "--result-model-id",
                        "$(results.MODEL_ID.path)",
                        "--result-version-id",
                        "$(results.VERSION_ID.path)",
                    ],
                )
            ],
        ),
        "package-stream": tekton.TaskSpec(
            description="Stream the weights from S3 or Hugging Face straight into a modelcar pushed to Quay (no weights PVC).",
            params=[
                *_p("image", "base-image", "source-uri", "revision", "endpoint-url", "region", "quantization"),
                tekton.ParamSpec(name="include", type="array"),
            ],
            results=[tekton.ResultSpec(name="IMAGE_DIGEST"), tekton.ResultSpec(name="IMAGE_URL", description="repo@digest")],
            workspaces=[tekton.WorkspaceDeclaration(name="model", description="small scratch (emptyDir): HOME, TMPDIR"), quay_ws],
            steps=[
                _step(
                    "package-stream",
                    tools_image,
                    [
                        "--source",
                        "$(params.source-uri)",
                        "--hf-revision",
                        "$(params.revision)",
                        "--s3-endpoint-url",
                        "$(params.endpoint-url)",
                        "--s3-region",
                        "$(params.region)",
                        "--image",
                        "$(params.image)",
                        "--base-image",
                        "$(params.base-image)",
                        "--authfile",
                        "$(workspaces.quay-auth.path)/.dockerconfigjson",
                        *chunks,
                        "--max-layer-size",
                        layer_limit,
                        "--annotation",
                        "org.opencontainers.image.source=$(params.source-uri)",
                        "--annotation",
                        "io.ml-dev-env.model.quantization=$(params.quantization)",
                        "--result-digest",
                        "$(results.IMAGE_DIGEST.path)",
                        "--result-image",
                        "$(results.IMAGE_URL.path)",
                        "--include",
                        "$(params.include[*])",
                    ],
                    download_env + s3_env,
                )
            ],
        ),
        "upload-s3": tekton.TaskSpec(
            description="Upload the weight files to S3.",
            params=_p("destination", "endpoint-url", "region"),
            results=[tekton.ResultSpec(name="URI")],
            workspaces=[model_ws],
            steps=[
                _step(
                    "upload-s3",
                    tools_image,
                    [
                        "--src",
                        WEIGHTS,
                        "--dest",
                        "$(params.destination)",
                        "--endpoint-url",
                        "$(params.endpoint-url)",
                        "--region",
                        "$(params.region)",
                        "--result-uri",
                        "$(results.URI.path)",
                    ],
                    s3_env,
                )
            ],
        ),
    }


PIPELINE_PARAMS = [
    "tools-image",
    "source-uri",
    "revision",
    "endpoint-url",
    "region",
    "quay-image",
    "internal-image",
    "base-image",
    "registry-url",
    "model-name",
    "version-name",
    "description",
    "quantization",
    "base-model",
    "upload-s3",
    "upload-destination",
    "upload-endpoint",
    "upload-region",
]


def pipeline_spec(size_gi_for_timeouts: float) -> tekton.PipelineSpec:
    """Download → package → mirror → register (+ optional S3 upload); digests flow through results.

    Why one function: the task graph as one literal; the results that flow between the tasks are read where they
    are wired.
    """

    def ref(task: str) -> dict[str, str]:
        return {"kind": "Task", "name": STEP[task].task}

    def param(name: str, value: str | list[str] | None = None) -> tekton.Param:
        return tekton.Param(name=name, value=value if value is not None else f"$(params.{name})")

    def t(task: str) -> str:
        return model_sizing.duration(model_sizing.task_timeout_minutes(task, size_gi_for_timeouts))

    def retries(task: str) -> int | None:
        return STEP[task].retries or None

    model_ws = [tekton.WorkspaceBinding(name="model", workspace="model")]
    quay_ws = [tekton.WorkspaceBinding(name="quay-auth", workspace="quay-auth")]
    return tekton.PipelineSpec(
        description="Package LLM weights as a KServe modelcar, push to Quay, mirror internally, register.",
        params=[*[tekton.ParamSpec(name=n) for n in PIPELINE_PARAMS], tekton.ParamSpec(name="include", type="array")],
        workspaces=[tekton.PipelineWorkspace(name="model"), tekton.PipelineWorkspace(name="quay-auth")],
        tasks=[
            tekton.PipelineTask(
                name="wait-tools",
                task_ref=ref("wait-tools"),
                timeout=t("wait-tools"),
                params=[param("image", "$(params.tools-image)")],
            ),
            tekton.PipelineTask(
                name="download",
                task_ref=ref("download"),
                timeout=t("download"),
                retries=retries("download"),
                run_after=["wait-tools"],
                workspaces=model_ws,
                params=[
                    param("source-uri"),
                    param("revision"),
                    param("endpoint-url"),
                    param("region"),
                    param("include", "$(params.include[*])"),
                ],
            ),
            tekton.PipelineTask(
                name="package",
                task_ref=ref("package"),
                timeout=t("package"),
                retries=retries("package"),
                run_after=["download"],
                workspaces=model_ws + quay_ws,
                params=[
                    param("image", "$(params.quay-image)"),
                    param("base-image"),
                    param("source", "$(params.source-uri)"),
                    param("revision", "$(tasks.download.results.REVISION)"),
                    param("license", "$(tasks.download.results.LICENSE)"),
                    param("quantization"),
                ],
            ),
            tekton.PipelineTask(
                name="mirror",
                task_ref=ref("mirror"),
                timeout=t("mirror"),
                retries=retries("mirror"),
                workspaces=model_ws + quay_ws,
                params=[param("source-image", "$(tasks.package.results.IMAGE_URL)"), param("destination", "$(params.internal-image)")],
            ),
            tekton.PipelineTask(
                name="register",
                task_ref=ref("register"),
                timeout=t("register"),
                retries=retries("register"),
                params=[
                    param("registry-url"),
                    param("model-name"),
                    param("version-name"),
                    param("description"),
                    param("image", "$(tasks.mirror.results.IMAGE_URL)"),
                    param("quantization"),
                    param("base-model"),
                    param("source", "$(params.source-uri)"),
                ],
            ),
            tekton.PipelineTask(
                name="upload-s3",
                task_ref=ref("upload-s3"),
                timeout=t("upload-s3"),
                retries=retries("upload-s3"),
                run_after=["download"],
                workspaces=model_ws,
                when=[tekton.WhenExpression(input="$(params.upload-s3)", operator="in", values=["true"])],
                params=[
                    param("destination", "$(params.upload-destination)"),
                    param("endpoint-url", "$(params.upload-endpoint)"),
                    param("region", "$(params.upload-region)"),
                ],
            ),
        ],
        results=[
            tekton.PipelineResult(name="QUAY_IMAGE", value="$(tasks.package.results.IMAGE_URL)"),
            tekton.PipelineResult(name="INTERNAL_IMAGE", value="$(tasks.mirror.results.IMAGE_URL)"),
        ],
    )


def stream_pipeline_spec(size_gi_for_timeouts: float) -> tekton.PipelineSpec:
    """S3 / Hugging Face → package (streamed, no weights PVC) → mirror → register; scratch is an emptyDir."""
    full = pipeline_spec(size_gi_for_timeouts)
    by_name = {t.name: t for t in full.tasks}
    ws = [tekton.WorkspaceBinding(name="model", workspace="model"), tekton.WorkspaceBinding(name="quay-auth", workspace="quay-auth")]
    names: tuple[tuple[str, str], ...] = (
        ("image", "quay-image"),
        ("base-image", "base-image"),
        ("source-uri", "source-uri"),
        ("endpoint-url", "endpoint-url"),
        ("region", "region"),
        ("quantization", "quantization"),
        ("revision", "revision"),
    )
    package = tekton.PipelineTask(
        name="package",
        task_ref={"kind": "Task", "name": STEP["package-stream"].task},
        timeout=by_name["package"].timeout,
        retries=by_name["package"].retries,
        run_after=["wait-tools"],
        workspaces=ws,
        params=[
            *(tekton.Param(name=n, value=f"$(params.{v})") for n, v in names),
            tekton.Param(name="include", value="$(params.include[*])"),
        ],
    )
    tasks = [by_name["wait-tools"], package, by_name["mirror"], by_name["register"]]
    return tekton.PipelineSpec(
        description="Package LLM weights straight from S3 or the Hugging Face Hub as a KServe modelcar (no weights PVC), "
        "mirror internally, register.",
        params=full.params,
        workspaces=full.workspaces,
        tasks=tasks,
        results=full.results,
    )


def run_params(model: ModelConfig, pipeline: ModelPipelineConfig, namespace: str, tools_image: str) -> list[tekton.Param]:
    src = model.source
    hf, s3, up = src.hugging_face, src.s3, model.upload_to_s3
    stream = model.internal_image_stream or model.name
    values: dict[str, str | list[str]] = {
        "tools-image": tools_image,
        "source-uri": source_uri(model),
        "revision": hf.revision if hf else "",
        "endpoint-url": s3.endpoint if s3 else "",
        "region": s3.region if s3 else "us-east-1",
        "include": list(model.include),
        "quay-image": f"{model.quay_repository}:{model.tag}",
        "internal-image": naming.internal_image(namespace, stream, model.tag),
        "base-image": pipeline.modelcar_base_image,
        "registry-url": pipeline.registry_url,
        "model-name": model.registration.model_name,
        "version-name": model.registration.version_name,
        "description": model.registration.description,
        "quantization": model.quantization,
        "base-model": model.registration.base_model or (hf.repo if hf else ""),
        "upload-s3": "true" if up else "false",
        "upload-destination": f"s3://{up.bucket}/{up.prefix.strip('/')}/" if up else "",
        "upload-endpoint": up.endpoint if up else "",
        "upload-region": up.region if up else "",
    }
    return [tekton.Param(name=k, value=v) for k, v in values.items()]


def source_uri(model: ModelConfig) -> str:
    hf, s3 = model.source.hugging_face, model.source.s3
    if hf:
        return f"hf://{hf.repo}"
    assert s3 is not None  # ModelSource has exactly one
    return f"s3://{s3.bucket}/{s3.prefix}".rstrip("/")


def run_name(model: ModelConfig, inputs_digest: str) -> str:
    return f"modelcar-{model.name[:40].rstrip('-')}-{inputs_digest}"


def run_commands(run: str, namespace: str, model: ModelConfig) -> dict[str, str]:
    """What a user pastes to follow, inspect and retry a model's run (the `model_runs` stack output)."""
    label = f"tekton.dev/pipelineRun={run}"
    return {
        "run": run,
        "namespace": namespace,
        "follow": f"tkn pipelinerun logs -f {run} -n {namespace}",
        "describe": f"tkn pipelinerun describe {run} -n {namespace}",
        "status": f"oc get pipelinerun {run} -n {namespace} -o jsonpath='{{.status.conditions[0].reason}}{{\"\\n\"}}'",
        "taskruns": f"oc get taskrun -n {namespace} -l {label}",
        "logs": f"oc logs -n {namespace} -l {label} --all-containers --prefix --tail=50",
        "retry": f"raise models[name={model.name}].retry (now {model.retry}) to {model.retry + 1} and run `pulumi up`: a new run; "
        "blobs already in the registry are not sent again",
    }


def run_spec(
    model: ModelConfig, pipeline: ModelPipelineConfig, namespace: str, build_nodes: BuildNodesConfig, tools_image: str
) -> tekton.PipelineRunSpec:
    claim: dict[str, Any] = {
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": model_sizing.workspace_size(model)}}}
    }
    if pipeline.storage_class:
        claim["spec"]["storageClassName"] = pipeline.storage_class
    # Streaming runs hold no weights: their "model" workspace is only HOME/TMPDIR scratch (an emptyDir).
    model_ws = (
        tekton.RunWorkspace(name="model", empty_dir={}) if model.stream else tekton.RunWorkspace(name="model", volume_claim_template=claim)
    )
    pod_template = None
    if build_nodes.node_selector or build_nodes.tolerations:
        pod_template = tekton.PodTemplate(
            node_selector=dict(build_nodes.node_selector) or None,
            tolerations=[t.model_dump(by_alias=True, exclude_none=True) for t in build_nodes.tolerations] or None,
        )
    # The Pipeline's task timeouts are sized for maxModelSizeGi: the run's timeout covers all of them.
    minutes = model_sizing.pipeline_timeout_minutes(pipeline.max_model_size_gi, model.upload_to_s3 is not None, model.stream)
    return tekton.PipelineRunSpec(
        pipeline_ref={"name": STREAM_PIPELINE if model.stream else PIPELINE},
        params=run_params(model, pipeline, namespace, tools_image),
        workspaces=[
            model_ws,
            tekton.RunWorkspace(name="quay-auth", secret={"secretName": PIPELINE_CREDENTIALS["quay"].secret}),
        ],
        # Build-node placement at the run level, so the affinity assistant shares it (no fsGroup: the SCC assigns it).
        task_run_template=tekton.TaskRunTemplate(service_account_name=pipeline.service_account, pod_template=pod_template),
        timeouts=tekton.Timeouts(pipeline=model_sizing.duration(minutes)),
    )


class ModelPipelineArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    namespace: str
    labels: dict[str, str]
    pipeline: ModelPipelineConfig
    models: list[ModelConfig]
    build_nodes: BuildNodesConfig
    secrets: dict[str, Any]
    """Pulumi secrets by config key: quayDockerConfigJson (required), hfToken, s3AccessKeyId/s3SecretAccessKey."""


class ModelPipeline(pulumi.ComponentResource):
    """Tools image, SA + RBAC, Secrets, Tasks, Pipeline and one PipelineRun per model."""

    run_names: dict[str, str]
    """PipelineRun name per model."""
    internal_images: dict[str, str]
    runs: dict[str, dict[str, str]]
    """Per model: run name, namespace and ready-to-paste commands (`run_commands`)."""

    def __init__(self, name: str, args: ModelPipelineArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """Declares the pipeline's objects. Why one function: a component declares its children in its
        constructor, in dependency order; the specs come from this module's functions."""
        super().__init__("ml-dev-env:models:ModelPipeline", name, None, opts)
        ns, cfg = args.namespace, args.pipeline
        child = pulumi.ResourceOptions(parent=self)

        def meta(obj: str, **extra: Any) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(name=obj, namespace=ns, labels=args.labels, **extra)

        tools = ToolsImage(
            f"{name}-tools",
            ToolsImageArgs(namespace=ns, labels=args.labels, base_image=cfg.tools_base_image, build_nodes=args.build_nodes),
            opts=child,
        )
        deps: list[pulumi.Resource] = [tools]
        deps.append(k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=meta(cfg.service_account), opts=child))
        deps.append(
            k8s.rbac.v1.RoleBinding(
                f"{name}-image-builder",
                metadata=meta(f"{cfg.service_account}-image-builder"),
                role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="system:image-builder"),
                subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=cfg.service_account, namespace=ns)],
                opts=child,
            )
        )
        if cfg.registry_access is not None:
            # The model-registry operator creates Role `registry-user-<name>` (get on Service <name>) in the
            # registry's namespace, and its kube-rbac-proxy admits whoever may do that
            # (opendatahub-io/model-registry-operator internal/controller/config/templates/role.yaml.tmpl,
            # kube-rbac-proxy/kube-rbac-proxy-config.yaml.tmpl). This binding lives in that namespace.
            access = cfg.registry_access
            deps.append(
                k8s.rbac.v1.RoleBinding(
                    f"{name}-registry-user",
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        name=f"{ns}-{cfg.service_account}-registry-user-{access.name}"[:253],
                        namespace=access.namespace,
                        labels=args.labels,
                    ),
                    role_ref=k8s.rbac.v1.RoleRefArgs(
                        api_group="rbac.authorization.k8s.io", kind="Role", name=f"registry-user-{access.name}"
                    ),
                    subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=cfg.service_account, namespace=ns)],
                    opts=child,
                )
            )
        # A credential's Secret exists when a model uses it and its stack secrets are set (the loader has already
        # refused a stack that lacks a secret a model requires, e.g. hfToken for a gated repository).
        secrets = args.secrets
        used = {cred for model in args.models for cred in model.credentials()}
        present = set()
        for cred, table in PIPELINE_CREDENTIALS.items():
            if cred not in used or not all(secrets.get(key) for _, key, _ in table.keys):
                continue
            present.add(cred)
            deps.append(
                k8s.core.v1.Secret(
                    f"{name}-{cred}",
                    metadata=meta(table.secret),
                    type=table.type,
                    string_data={env: secrets[key] for env, key, _ in table.keys},
                    opts=child,
                )
            )

        specs = task_specs(
            tools.image, cfg.tools_base_image, present, cfg.chunk_threshold, cfg.max_layer_size, cfg.registry_ca_file, cfg.chunk_size
        )
        # Each Task and Pipeline exists only when a model runs it: streaming (the default) needs neither the
        # download Task nor the PVC Pipeline; a model with `stream: false` or `uploadToS3` brings them back.
        modes = {model_sizing.STREAM if m.stream else model_sizing.PVC for m in args.models}
        for task, spec in specs.items():
            if STEP[task].modes & modes:
                deps.append(crds.custom_resource(f"{name}-task-{task}", "tekton.dev/v1", "Task", meta(STEP[task].task), spec, child))
        if model_sizing.PVC in modes:
            pipeline = pipeline_spec(cfg.max_model_size_gi)
            deps.append(crds.custom_resource(f"{name}-pipeline", "tekton.dev/v1", "Pipeline", meta(PIPELINE), pipeline, child))
        if model_sizing.STREAM in modes:
            stream_pipeline = stream_pipeline_spec(cfg.max_model_size_gi)
            deps.append(
                crds.custom_resource(f"{name}-pipeline-stream", "tekton.dev/v1", "Pipeline", meta(STREAM_PIPELINE), stream_pipeline, child)
            )

        self.run_names, self.internal_images, self.runs = {}, {}, {}
        for model in args.models:
            stream = model.internal_image_stream or model.name
            deps.append(
                crds.custom_resource(
                    f"{name}-stream-{model.name}",
                    "image.openshift.io/v1",
                    "ImageStream",
                    meta(stream),
                    {"lookupPolicy": {"local": True}},
                    child,
                )
            )
            run_body = run_spec(model, cfg, ns, args.build_nodes, tools.image)
            # The run's own inputs (model, destinations, sizes, tools image, pipeline version): another model
            # or an unchanged config never starts a new run of this one.
            # `retry` (a counter in the model's config) starts a new run of unchanged inputs.
            retry = [f"retry={model.retry}"] if model.retry else []
            digest = naming.short_hash(str(PIPELINE_VERSION), json.dumps(run_body.dump(), sort_keys=True), *retry)
            run = run_name(model, digest)
            crds.custom_resource(
                f"{name}-run-{model.name}",
                "tekton.dev/v1",
                "PipelineRun",
                meta(run, annotations={"pulumi.com/skipAwait": "true"}),
                run_body,
                # Not awaited; kept on replace/destroy so run history and logs stay until Tekton's pruner removes them.
                pulumi.ResourceOptions(parent=self, depends_on=list(deps), retain_on_delete=True),
            )
            self.run_names[model.name] = run
            self.internal_images[model.name] = naming.internal_image(ns, stream, model.tag)
            self.runs[model.name] = run_commands(run, ns, model)
        self.register_outputs({"run_names": self.run_names, "internal_images": self.internal_images, "runs": self.runs})
