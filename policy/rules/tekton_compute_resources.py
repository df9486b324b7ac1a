"""Policy 5: Tekton v1: computeResources only."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .query import MANDATORY, TEKTON_KINDS, PolicySpec, Resource, _item_name, _m, _pipeline_specs, _seq, task_specs

# ------------------------------------------------------------ 5. Tekton v1: computeResources only


def check_tekton_compute_resources(res: Resource) -> Iterator[str]:
    if res.group != "tekton.dev" or res.base_kind not in TEKTON_KINDS:
        return
    version = res.api_version.rsplit("/", 1)[-1]
    if version != "v1":
        yield (
            f"uses tekton.dev/{version}. Fix: write tekton.dev/v1 objects (v1 renamed step `resources` to "
            "`computeResources`, PipelineRun `timeout` to `timeouts`, `serviceAccountName`/`podTemplate` to `taskRunTemplate`)."
        )
    fix = (
        "Fix: rename it to `computeResources` — tekton.dev/v1 has no `resources` on steps, sidecars or stepTemplate "
        "and silently drops it, so the step runs without its memory/ephemeral-storage requests (the original "
        "model pipeline was evicted this way)."
    )
    for path, task_spec in task_specs(res):
        if "resources" in task_spec:
            yield f"{path}.resources: v1beta1 PipelineResources don't exist in tekton.dev/v1. Fix: use workspaces, params and results."
        for key in ("steps", "sidecars"):
            for i, step in enumerate(_seq(task_spec.get(key))):
                if isinstance(step, Mapping) and "resources" in step:
                    yield f"{path}.{key}[{_item_name(step, i)}] carries `resources`. {fix}"
        if "resources" in _m(task_spec.get("stepTemplate")):
            yield f"{path}.stepTemplate carries `resources`. {fix}"
    for path, pipeline in _pipeline_specs(res):
        if "resources" in pipeline:
            yield f"{path}.resources: v1beta1 PipelineResources don't exist in tekton.dev/v1. Fix: use workspaces, params and results."
        for section in ("tasks", "finally"):
            for i, task in enumerate(_seq(pipeline.get(section))):
                if isinstance(task, Mapping) and "resources" in task:
                    yield f"{path}.{section}[{_item_name(task, i)}].resources: v1beta1 PipelineResources. Fix: use workspaces and params."


POLICY = PolicySpec(
    "tekton-v1-compute-resources",
    MANDATORY,
    "resource",
    "Tekton objects are tekton.dev/v1 and no step, sidecar or stepTemplate (of a Task, or an inline taskSpec of a "
    "Pipeline/PipelineRun/TaskRun) carries `resources`: v1 calls it computeResources and silently drops the old name.",
    "Rename step `resources` to `computeResources`; use tekton.dev/v1.",
    check_tekton_compute_resources,
    order=5,
)
