"""Sizing rules of the model-packaging pipeline (pure functions, no Pulumi).

The packager streams every layer straight to the registry, so node-ephemeral scratch is a small
constant per step. By default it reads the weights straight from the source (no volume for them); only
a model that downloads first (`stream: false`, `uploadToS3`) gets a workspace PVC that grows with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

from core.quantity import parse_quantity


class ModelConfig(Protocol):
    """What sizing reads of a model (stacks.config.ModelConfig has these fields; core imports nothing above it)."""

    @property
    def size_gi(self) -> float: ...
    @property
    def workspace_size(self) -> str | None: ...


class ModelPipelineConfig(Protocol):
    """What sizing reads of the pipeline settings (stacks.config.ModelPipelineConfig)."""

    @property
    def max_model_size_gi(self) -> float: ...
    @property
    def node_ephemeral_free(self) -> str: ...


GIB = 2**30
PVC, STREAM = "pvc", "stream"  # the two pipelines: weights downloaded onto a PVC first, or streamed from the source


@dataclass(frozen=True)
class PipelineStep:
    """Everything the pipeline knows about one of its Tasks (each runs one step program)."""

    key: str
    """The Task's key: Pulumi resource `<component>-task-<key>`, and the row the sizing functions read."""
    task: str
    """The Tekton Task object's name."""
    name: str
    """The pipeline task's name and its step's name."""
    program: str
    """`steps/<program>.py`, embedded verbatim as the step's script (`steps.embed.STEPS`)."""
    cpu: tuple[str, str]
    """(request, limit)."""
    memory: tuple[str, str]
    ephemeral: tuple[str, str]
    """Node-ephemeral storage (request, limit): logs, bytecode, in-memory buffers. Downloads, caches and
    skopeo's TMPDIR live on the workspace."""
    min_timeout_min: int
    retries: int
    """Tekton `retries` of the pipeline task: transfers resume where the failed attempt stopped (the package
    step continues its upload session, the registry HEAD-checks finished blobs, download skips verified
    files), so a retry costs little."""
    planned_rate: float | None = None
    """Slowest sustained rate (bytes/s) we plan for: the timeout is twice the transfer time at this rate.
    None: the task moves no weights and its timeout is the minimum."""
    uses_workspace: bool = True
    """HOME and TMPDIR on the `model` workspace (the weights PVC, or a streaming run's scratch emptyDir)."""
    modes: frozenset[str] = frozenset({PVC, STREAM})
    """The pipelines that run this Task: `PVC` (download onto a workspace PVC, then package) and/or `STREAM`
    (package straight from the source). A stack renders a Task only when one of its models uses such a pipeline."""


_RATE = 25e6
PIPELINE_STEPS: tuple[PipelineStep, ...] = (
    # wait-tools covers the tools-image build on the first `pulumi up` (a small image: minutes, not hours);
    # it is not retried: a second wait would only double its timeout.
    PipelineStep(
        "wait-tools",
        "modelcar-wait-tools",
        "wait-tools",
        "wait_image",
        cpu=("10m", "100m"),
        memory=("32Mi", "128Mi"),
        ephemeral=("16Mi", "64Mi"),
        min_timeout_min=60,
        retries=0,
        uses_workspace=False,
    ),
    # 20 parallel download workers OOM-killed a 2Gi container in the original pipeline.
    PipelineStep(
        "download",
        "modelcar-download",
        "download",
        "download",
        cpu=("1", "4"),
        memory=("4Gi", "8Gi"),
        ephemeral=("256Mi", "1Gi"),
        min_timeout_min=30,
        retries=2,
        planned_rate=_RATE,
        modes=frozenset({PVC}),
    ),
    PipelineStep(
        "package",
        "modelcar-package",
        "package",
        "package",
        cpu=("1", "4"),
        memory=("1Gi", "4Gi"),
        ephemeral=("256Mi", "1Gi"),
        min_timeout_min=30,
        retries=2,
        planned_rate=_RATE,
        modes=frozenset({PVC}),
    ),
    PipelineStep(
        "mirror",
        "modelcar-mirror",
        "mirror",
        "mirror",
        cpu=("500m", "2"),
        memory=("512Mi", "2Gi"),
        ephemeral=("256Mi", "1Gi"),
        min_timeout_min=30,
        retries=2,
        planned_rate=_RATE,
    ),
    PipelineStep(
        "register",
        "modelcar-register",
        "register",
        "register",
        cpu=("100m", "500m"),
        memory=("128Mi", "512Mi"),
        ephemeral=("64Mi", "256Mi"),
        min_timeout_min=10,
        retries=2,
        uses_workspace=False,
    ),
    PipelineStep(
        "upload-s3",
        "modelcar-upload-s3",
        "upload-s3",
        "upload_s3",
        cpu=("500m", "2"),
        memory=("1Gi", "4Gi"),
        ephemeral=("256Mi", "1Gi"),
        min_timeout_min=30,
        retries=2,
        planned_rate=_RATE,
        modes=frozenset({PVC}),
    ),
)
STEP = {s.key: s for s in PIPELINE_STEPS}
# The streaming packager: the package step reading straight from the source; the pipeline task keeps
# the name `package` and the package row's sizing.
STEP["package-stream"] = replace(STEP["package"], key="package-stream", task="modelcar-package-stream", modes=frozenset({STREAM}))


def workspace_gib(size_gi: float) -> int:
    """Workspace PVC needed for a model: the weights, plus 15 % and 4 GiB for caches and metadata."""
    return math.ceil(size_gi * 1.15 + 4)


def workspace_size(model: ModelConfig) -> str:
    return model.workspace_size or f"{workspace_gib(model.size_gi)}Gi"


def task_timeout_minutes(task: str, size_gi: float) -> int:
    step = STEP[task]
    if step.planned_rate is None:
        return step.min_timeout_min
    seconds = 2 * size_gi * GIB / step.planned_rate
    return max(step.min_timeout_min, math.ceil(seconds / 60 / 5) * 5)


def duration(minutes: int) -> str:
    hours, mins = divmod(minutes, 60)
    return f"{hours}h{mins}m0s" if hours else f"{mins}m0s"


PIPELINE_MARGIN_MIN = 30


def pipeline_timeout_minutes(size_gi: float, upload_s3: bool, stream: bool = False) -> int:
    """Every attempt of every task that runs, end to end, plus a margin for scheduling and PVC binding.

    Tekton times each retry attempt on its own (tektoncd/pipeline pkg/reconciler/taskrun/taskrun.go,
    `retryTaskRun` resets the TaskRun's StartTime), so a pipeline timeout below this sum would kill a run
    whose tasks are still within their own limits. `size_gi` must be what the Pipeline's task timeouts
    were sized for.
    """
    tasks = ["wait-tools", "package", "mirror", "register"] if stream else ["wait-tools", "download", "package", "mirror", "register"]
    tasks += ["upload-s3"] if upload_s3 else []
    return sum((STEP[t].retries + 1) * task_timeout_minutes(t, size_gi) for t in tasks) + PIPELINE_MARGIN_MIN


def preflight(model: ModelConfig, pipeline: ModelPipelineConfig) -> str | None:
    """None when the model fits; otherwise one sentence saying what is needed and what is configured."""
    if model.size_gi > pipeline.max_model_size_gi:
        return (
            f"sizeGi {model.size_gi:g} is above modelPipeline.maxModelSizeGi ({pipeline.max_model_size_gi:g}), "
            "which sizes the Pipeline's task timeouts; raise it"
        )
    needed = workspace_gib(model.size_gi)
    if model.workspace_size is not None and parse_quantity(model.workspace_size) < needed * GIB:
        return (
            f"needs a workspace PVC of at least {needed}Gi for ~{model.size_gi:g}Gi of weights "
            f"(1.15 × size + 4Gi); workspaceSize is {model.workspace_size}"
        )
    widest = max(PIPELINE_STEPS, key=lambda step: parse_quantity(step.ephemeral[1]))
    scratch_task, scratch = widest.key, widest.ephemeral[1]
    free = parse_quantity(pipeline.node_ephemeral_free)
    if parse_quantity(scratch) > free:
        return (
            f"the {scratch_task} step needs up to {scratch} of node ephemeral storage; "
            f"modelPipeline.nodeEphemeralFree is {pipeline.node_ephemeral_free}"
        )
    return None
