"""Sizing rules of the model-packaging pipeline (pure functions, no Pulumi).

The packager streams every layer straight to the registry, so node-ephemeral scratch is a small
constant per step; only the workspace PVC grows with the model (it holds the downloaded weights).
"""

from __future__ import annotations

import math
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

# Per-task node-ephemeral storage (requests, limits). Downloads, caches and skopeo's TMPDIR all live
# on the workspace PVC; what remains is logs, Python bytecode and in-memory upload buffers.
EPHEMERAL: dict[str, tuple[str, str]] = {
    "wait-tools": ("16Mi", "64Mi"),
    "download": ("256Mi", "1Gi"),
    "package": ("256Mi", "1Gi"),
    "mirror": ("256Mi", "1Gi"),
    "register": ("64Mi", "256Mi"),
    "upload-s3": ("256Mi", "1Gi"),
}
MEMORY: dict[str, tuple[str, str]] = {
    "wait-tools": ("32Mi", "128Mi"),
    # 20 parallel download workers OOM-killed a 2Gi container in the original pipeline.
    "download": ("4Gi", "8Gi"),
    "package": ("1Gi", "4Gi"),
    "mirror": ("512Mi", "2Gi"),
    "register": ("128Mi", "512Mi"),
    "upload-s3": ("1Gi", "4Gi"),
}
CPU: dict[str, tuple[str, str]] = {
    "wait-tools": ("10m", "100m"),
    "download": ("1", "4"),
    "package": ("1", "4"),
    "mirror": ("500m", "2"),
    "register": ("100m", "500m"),
    "upload-s3": ("500m", "2"),
}
# Slowest sustained rates we plan for (bytes/s): timeouts are twice the transfer time at these.
PLANNED_RATE = {"download": 25e6, "package": 25e6, "mirror": 25e6, "upload-s3": 25e6}
# wait-tools covers the tools-image build on the first `pulumi up` (a small image: minutes, not hours)
MIN_TIMEOUT_MIN = {"wait-tools": 60, "download": 30, "package": 30, "mirror": 30, "upload-s3": 30, "register": 10}


def workspace_gib(size_gi: float) -> int:
    """Workspace PVC needed for a model: the weights, plus 15 % and 4 GiB for caches and metadata."""
    return math.ceil(size_gi * 1.15 + 4)


def workspace_size(model: ModelConfig) -> str:
    return model.workspace_size or f"{workspace_gib(model.size_gi)}Gi"


def task_timeout_minutes(task: str, size_gi: float) -> int:
    if task not in PLANNED_RATE:
        return MIN_TIMEOUT_MIN[task]
    seconds = 2 * size_gi * GIB / PLANNED_RATE[task]
    return max(MIN_TIMEOUT_MIN[task], math.ceil(seconds / 60 / 5) * 5)


def duration(minutes: int) -> str:
    hours, mins = divmod(minutes, 60)
    return f"{hours}h{mins}m0s" if hours else f"{mins}m0s"


# Tekton `retries` per pipeline task: transfers resume where the failed attempt stopped (the package
# step continues its upload session, the registry HEAD-checks finished blobs, download skips verified
# files), so a retry costs little. wait-tools is not retried: a second wait would only double its timeout.
TASK_RETRIES = {"wait-tools": 0, "download": 2, "package": 2, "mirror": 2, "register": 2, "upload-s3": 2}
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
    return sum((TASK_RETRIES[t] + 1) * task_timeout_minutes(t, size_gi) for t in tasks) + PIPELINE_MARGIN_MIN


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
    scratch_task, (_, scratch) = max(EPHEMERAL.items(), key=lambda kv: parse_quantity(kv[1][1]))
    free = parse_quantity(pipeline.node_ephemeral_free)
    if parse_quantity(scratch) > free:
        return (
            f"the {scratch_task} step needs up to {scratch} of node ephemeral storage; "
            f"modelPipeline.nodeEphemeralFree is {pipeline.node_ephemeral_free}"
        )
    return None
