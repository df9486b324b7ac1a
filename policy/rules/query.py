"""The query library of the policy rules: the levels, tolerant accessors, the resource and violation
records, walkers over pod and Tekton specs, Kubernetes quantities, and the shape of a rule (`PolicySpec`).

Inputs are the objects exactly as Kubernetes receives them (camelCase: apiVersion, kind, metadata,
spec, ...). Values not known yet (the engine's "unknown during preview" sentinels) are never judged:
a rule that needs such a value stays quiet for that resource, so a preview never fails on them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

Level = Literal["mandatory", "advisory"]
MANDATORY: Level = "mandatory"
ADVISORY: Level = "advisory"
PACK_NAME = "ml-dev-env-guardrails"

# The engine's "value unknown during preview" sentinels (pulumi_policy.proxy / pulumi.runtime.rpc).
UNKNOWN_SENTINELS = frozenset(
    {
        "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",  # boolean
        "3eeb2bf0-c639-47a8-9e75-3b44932eb421",  # number
        "04da6b54-80e4-46f7-96ec-b56ff0331ba9",  # string
        "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",  # array
        "030794c1-ac77-496b-92df-f27374a8bd58",  # asset
        "e48ece36-62e2-4504-bad9-02848725956a",  # archive
        "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",  # object
    }
)
# What the offline recorder (tools/mock_engine.py) writes in place of a Pulumi secret's value.
REDACTED = "REDACTED"


def is_unknown(value: Any) -> bool:
    return isinstance(value, str) and value in UNKNOWN_SENTINELS


# ------------------------------------------------------------------------------ tolerant accessors


def _m(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _str(value: Any) -> str | None:
    """A known string (None for missing, unknown or non-string values)."""
    return value if isinstance(value, str) and not is_unknown(value) else None


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


# ---------------------------------------------------------------------------------- the resources


@dataclass(frozen=True)
class Resource:
    """One evaluated resource: its position in the input, type token, inputs and options."""

    index: int
    type: str
    inputs: Mapping[str, Any]
    options: Mapping[str, Any]

    @property
    def kind(self) -> str:
        """`StatefulSet` for `kubernetes:apps/v1:StatefulSet` (a `...Patch` keeps its suffix)."""
        return self.type.rsplit(":", 1)[-1]

    @property
    def base_kind(self) -> str:
        return self.kind[: -len("Patch")] if self.is_patch else self.kind

    @property
    def api_version(self) -> str:
        parts = self.type.split(":")
        return parts[1] if len(parts) == 3 else ""

    @property
    def group(self) -> str:
        """API group ("" for the core group, which type tokens spell `core/v1`)."""
        group = self.api_version.rsplit("/", 1)[0] if "/" in self.api_version else ""
        return "" if group == "core" else group

    @property
    def is_kubernetes(self) -> bool:
        return self.type.startswith("kubernetes:")

    @property
    def is_patch(self) -> bool:
        return self.type.endswith("Patch")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return _m(self.inputs.get("metadata"))

    @property
    def name(self) -> str:
        return _str(self.metadata.get("name")) or _str(self.options.get("name")) or "<unnamed>"

    @property
    def namespace(self) -> str | None:
        return _str(self.metadata.get("namespace"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return _m(self.inputs.get("spec"))

    @property
    def label(self) -> str:
        ns = self.namespace
        return f"{self.kind} {ns}/{self.name}" if ns else f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Violation:
    policy: str
    level: Level
    resource_type: str
    resource: str
    """`<Kind> <namespace>/<name>` of the offending object."""
    message: str
    """What is wrong and how to fix it."""
    index: int | None = field(default=None, compare=False)
    """Position of the offending resource in the evaluated sequence (the pack maps it to a URN)."""


def _same_ns(a: str | None, b: str | None) -> bool:
    """Namespaces match; a missing one is the provider's default namespace, so it matches any."""
    return a is None or b is None or a == b


# --------------------------------------------------------------------------- shared walkers

POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "DeploymentConfig": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers", "sidecars", "steps")
TEKTON_KINDS = ("Task", "ClusterTask", "TaskRun", "Pipeline", "PipelineRun", "StepAction")


def pod_spec(res: Resource) -> Mapping[str, Any] | None:
    path = POD_SPEC_PATHS.get(res.kind)
    if path is None or not res.is_kubernetes:
        return None
    spec = _get(res.inputs, *path)
    return spec if isinstance(spec, Mapping) else None


def pod_labels(res: Resource) -> Mapping[str, Any]:
    if res.kind == "Pod":
        return _m(res.metadata.get("labels"))
    path = (*POD_SPEC_PATHS[res.kind][:-1], "metadata", "labels")
    return _m(_get(res.inputs, *path))


def pod_containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in _seq(spec.get(key)):
            if isinstance(container, Mapping):
                yield container


def _item_name(item: Mapping[str, Any], index: int) -> str:
    return _str(item.get("name")) or str(index)


def walk(node: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """Every (path, key, value) of every mapping in a nested structure, depth first, in order."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield path, str(key), value
            yield from walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            label = _item_name(item, i) if isinstance(item, Mapping) else str(i)
            yield from walk(item, f"{path}[{label}]")


def container_likes(res: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every container-shaped object of any kind: pod-template containers, init containers, Tekton
    steps, sidecars and step templates (also inline task specs), containers of CRDs such as KServe.
    Yields (path, object)."""
    for path, key, value in walk(res.inputs):
        where = f"{path}.{key}" if path else key
        if key in CONTAINER_LISTS:
            for i, item in enumerate(_seq(value)):
                if isinstance(item, Mapping):
                    yield f"{where}[{_item_name(item, i)}]", item
        elif key == "stepTemplate" and isinstance(value, Mapping):
            yield where, value


def task_specs(res: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Tekton task specs of a Task/ClusterTask/TaskRun/Pipeline/PipelineRun (inline ones included)."""
    if res.group != "tekton.dev":
        return
    spec = res.spec
    if res.base_kind in ("Task", "ClusterTask", "StepAction"):
        yield "spec", spec
    elif res.base_kind == "TaskRun":
        if isinstance(spec.get("taskSpec"), Mapping):
            yield "spec.taskSpec", spec["taskSpec"]
    elif res.base_kind in ("Pipeline", "PipelineRun"):
        pipeline, base = (spec, "spec") if res.base_kind == "Pipeline" else (_m(spec.get("pipelineSpec")), "spec.pipelineSpec")
        for section in ("tasks", "finally"):
            for i, task in enumerate(_seq(pipeline.get(section))):
                if isinstance(task, Mapping) and isinstance(task.get("taskSpec"), Mapping):
                    yield f"{base}.{section}[{_item_name(task, i)}].taskSpec", task["taskSpec"]


def _pipeline_specs(res: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if res.group != "tekton.dev":
        return
    if res.base_kind == "Pipeline":
        yield "spec", res.spec
    elif res.base_kind == "PipelineRun" and isinstance(res.spec.get("pipelineSpec"), Mapping):
        yield "spec.pipelineSpec", res.spec["pipelineSpec"]


# ------------------------------------------------------------------------------------ quantities

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number (None if unknown or unparsable)."""
    if isinstance(value, bool) or value is None or is_unknown(value):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        return None


def is_extended_resource(name: str) -> bool:
    """Device-plugin resources (`nvidia.com/gpu`, `openshift.io/<sriov>`, `rdma/<dev>`, ...): a
    domain-prefixed name outside `kubernetes.io` (those can't be over-committed)."""
    return "/" in name and not name.split("/", 1)[0].endswith("kubernetes.io")


# Workloads: every object with a pod template (patches excluded).


@dataclass(frozen=True)
class _Workload:
    res: Resource
    spec: Mapping[str, Any]
    labels: Mapping[str, Any]


def _workloads(resources: Sequence[Resource]) -> list[_Workload]:
    out = []
    for res in resources:
        if res.is_patch:
            continue
        spec = pod_spec(res)
        if spec is not None:
            out.append(_Workload(res, spec, pod_labels(res)))
    return out


# ======================================================================================= rule shapes
# Resource rules: Resource -> messages.   Stack rules: all resources -> (resource, message).

ResourceCheck = Callable[[Resource], Iterable[str]]
StackCheck = Callable[[Sequence[Resource]], Iterable[tuple[Resource, str]]]


@dataclass(frozen=True)
class PolicySpec:
    name: str
    level: Level
    scope: Literal["resource", "stack"]
    description: str
    remediation: str
    check: ResourceCheck | StackCheck
    """A ResourceCheck for scope "resource", a StackCheck for scope "stack"."""
    order: int = 100
    """Position in the catalogue and in reports (then by name)."""
