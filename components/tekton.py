"""Typed layer over Tekton Pipelines `tekton.dev/v1` (Task, Pipeline, PipelineRun).

Only v1 field names exist here: a step has `computeResources` and no `resources` field at all, a
PipelineRun has `taskRunTemplate` and `timeouts` (never v1beta1's `serviceAccountName`/`podTemplate`/
`timeout` at the root). `extra="forbid"` turns any other field into an error at preview time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from components.crds import Spec


class EnvVar(Spec):
    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


class ComputeResources(Spec):
    requests: dict[str, str]
    limits: dict[str, str]


class Step(Spec):
    name: str
    image: str
    script: str | None = None
    command: list[str] | None = None
    args: list[str] = []
    env: list[EnvVar] = []
    compute_resources: ComputeResources
    working_dir: str | None = None
    security_context: dict[str, Any] | None = None


class ParamSpec(Spec):
    name: str
    type: Literal["string", "array"] = "string"
    description: str = ""
    default: str | list[str] | None = None


class ResultSpec(Spec):
    name: str
    description: str = ""


class WorkspaceDeclaration(Spec):
    name: str
    description: str = ""
    mount_path: str | None = None
    read_only: bool | None = None
    optional: bool | None = None


class TaskSpec(Spec):
    description: str = ""
    params: list[ParamSpec] = []
    results: list[ResultSpec] = []
    workspaces: list[WorkspaceDeclaration] = []
    steps: list[Step]


class Param(Spec):
    name: str
    value: str | list[str]


class WorkspaceBinding(Spec):
    name: str
    workspace: str


class WhenExpression(Spec):
    input: str
    operator: Literal["in", "notin"]
    values: list[str]


class PipelineTask(Spec):
    name: str
    task_ref: dict[str, str]
    params: list[Param] = []
    workspaces: list[WorkspaceBinding] = []
    run_after: list[str] | None = None
    timeout: str
    retries: int | None = None
    when: list[WhenExpression] | None = None


class PipelineResult(Spec):
    name: str
    value: str
    description: str = ""


class PipelineWorkspace(Spec):
    name: str
    description: str = ""
    optional: bool | None = None


class PipelineSpec(Spec):
    description: str = ""
    params: list[ParamSpec] = []
    workspaces: list[PipelineWorkspace] = []
    tasks: list[PipelineTask]
    results: list[PipelineResult] = []


class PodTemplate(Spec):
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = None


class TaskRunTemplate(Spec):
    service_account_name: str
    pod_template: PodTemplate | None = None


class Timeouts(Spec):
    pipeline: str
    tasks: str | None = None


class RunWorkspace(Spec):
    name: str
    volume_claim_template: dict[str, Any] | None = None
    secret: dict[str, Any] | None = None
    empty_dir: dict[str, Any] | None = None


class PipelineRunSpec(Spec):
    pipeline_ref: dict[str, str]
    params: list[Param] = []
    workspaces: list[RunWorkspace] = []
    task_run_template: TaskRunTemplate
    timeouts: Timeouts = Field(description="Explicit: the 60-minute default killed the original full-model build.")
