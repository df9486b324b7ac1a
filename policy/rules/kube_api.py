"""What the API server refuses, checked offline: the strict schema of each kind and upstream's rules beyond it.

Not one of the catalogue's rules (`POLICIES`, whose tests feed them deliberately partial objects): the pack adds
`API_SERVER_ACCEPTS` beside them (policy/__main__.py) and `make render` prints its own section for it
(tools/schema_check.py, with the config key that made each refused value). Why one module: the pack runs from its
own directory and imports only this package (policy/__main__.py), and the two halves share the object walk and
the problem type; split, each half would re-walk every object. Two halves:

* **Schemas** — `schemas/<group>/<version>/<Kind>.json` (group `core` for `apiVersion: v1`), upstream schema data
  vendored with its provenance (`schemas/PROVENANCE.md`). Applied strictly: an object schema that lists `properties`
  and does not preserve unknown fields gets `additionalProperties: false` (the API server prunes or refuses unknown
  fields: `kubectl apply --validate=strict`, the default since kubectl 1.27, refuses them). `nullable`,
  `x-kubernetes-int-or-string` and the core int-or-string/Quantity `oneOf`s are read as the API server reads them;
  an integral float (`2.0`, what Pulumi's mock engine hands over for an int) is an integer, as Go's JSON decoder into
  an int field takes it. A kind with no file here is a problem (so a new kind comes with its schema).
* **Rules beyond the schemas**, as the API server applies them (Kubernetes 1.33; the functions named are in
  kubernetes `staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go` — `IsDNS1123Label`,
  `IsDNS1123Subdomain`, `IsDNS1035Label`, `IsQualifiedName`, `IsValidLabelValue`, `IsValidPortName`,
  `IsValidPortNum`, `IsRelaxedEnvVarName`, `IsConfigMapKey` —, `staging/src/k8s.io/apimachinery/pkg/api/validation/
  objectmeta.go` — `ValidateAnnotations` (`TotalAnnotationSizeLimitB`), `ValidateObjectMeta` —, `pkg/apis/core/
  validation/validation.go` — `ValidateServiceName` (DNS-1035), `ValidateNamespaceName` (DNS label),
  `validateContainers` (container names: DNS labels, unique), `validateContainerPorts` (`IsValidPortName`,
  `IsValidPortNum`), `ValidateVolumes` (DNS labels, unique), `validateVolumeMounts` (a mount names a volume),
  `validateEnvVarName` (`IsRelaxedEnvVarName`: the RelaxedEnvironmentVariableValidation gate is on by default
  since 1.32), `ValidatePersistentVolumeClaimSpec` (`storageClassName`: `ValidateClassName`, a DNS subdomain),
  `ValidateResourceRequirements`/`validateResourceQuantityValue` (quantities parse, are ≥ 0, requests ≤ limits),
  `ValidateConfigMap`/`ValidateSecret` (`IsConfigMapKey`), `ValidateService` (port names DNS labels, target port
  names `IsValidPortName`) —, `pkg/apis/rbac/validation/validation.go` `ValidateRBACName` (a path segment name:
  `system:…` role names are legal), `pkg/apis/apps/validation/validation.go` `ValidateStatefulSet` (a DNS subdomain,
  and its pods' names become hostnames, DNS labels: `pkg/apis/core/validation` `ValidatePodSpec` hostname), the
  Job controller's `batch.kubernetes.io/job-name` label (`pkg/apis/batch/validation/validation.go` `ValidateJob`
  validates the generated pod labels: a Job name is at most 63 characters), Tekton's
  `pkg/apis/validate/metadata.go` `ObjectMetadata` (names ≤ 63, no `.`) and OpenShift's
  `route/validation/validation.go` `ValidateRoute` (`spec.host` a DNS subdomain of labels ≤ 63).

Every problem carries the JSON path and the offending value, so `make render` can name the config key that made it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .query import MANDATORY, PolicySpec, Resource, _m, _seq, is_unknown, quantity

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@dataclass(frozen=True)
class Problem:
    """One refusal: where (JSON path), the value found there, and why."""

    path: str
    value: Any
    message: str

    @property
    def text(self) -> str:
        shown = json.dumps(self.value) if isinstance(self.value, str | int | float) and not isinstance(self.value, bool) else None
        if shown is not None and len(shown) > 80:
            shown = shown[:77] + '..."'
        return f"{self.path or '(object)'}: {shown + ': ' if shown is not None else ''}{self.message}"


# ------------------------------------------------------------------------------------------ schemas


def schema_file(api_version: str, kind: str, root: Path = SCHEMAS) -> Path:
    group, _, version = api_version.rpartition("/")
    return root / (group or "core") / version / f"{kind}.json"


_RECURSE_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_RECURSE_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
_RECURSE_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")


def _only_types(branches: Any) -> bool:
    return isinstance(branches, list) and all(isinstance(b, Mapping) and set(b) <= {"type", "format"} for b in branches)


def prepare(node: Any, strict: bool = True) -> Any:
    """A schema node as the API server reads it (see the module doc); returns a new node."""
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _RECURSE_MAPS and isinstance(value, Mapping):
            out[key] = {k: prepare(v, strict) for k, v in value.items()}
        elif key in _RECURSE_ONE and isinstance(value, Mapping):
            out[key] = prepare(value, strict)
        elif key in _RECURSE_LIST and isinstance(value, list):
            out[key] = [prepare(v, strict) for v in value]
        elif key == "x-provenance":
            continue
        else:
            out[key] = value
    if out.get("x-kubernetes-int-or-string") or out.get("format") == "int-or-string":
        out.pop("type", None)
        if not isinstance(out.get("anyOf"), list):  # Route's targetPort carries `anyOf: null`
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    # IntOrString / Quantity in the core bundle: oneOf [string|null, integer|null]: a null matches both branches.
    if _only_types(out.get("oneOf")):
        out["anyOf"] = out.pop("oneOf")
    if out.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if strict and "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _jsonschema() -> Any:
    """jsonschema (the dev lock's; policy/requirements.in), imported without `rfc3987_syntax`.

    jsonschema's format module imports rfc3987_syntax when it is installed, which builds a grammar: 1.9 s of the 2.1 s
    the import costs. Formats are not checked here (the API server checks none of the `iri` formats it serves), so the
    import is kept out while jsonschema loads, and allowed again right after (no lasting change for anyone else).
    """
    if "jsonschema" in sys.modules:
        return sys.modules["jsonschema"]
    blocked = "rfc3987_syntax" not in sys.modules
    if blocked:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
    try:
        import jsonschema
    finally:
        if blocked:
            sys.modules.pop("rfc3987_syntax", None)
    return jsonschema


@cache
def _validator(path: Path, strict: bool) -> Any:
    """One prepared jsonschema validator per schema file and strictness (None: no such file)."""
    jsonschema = _jsonschema()

    if not path.is_file():
        return None
    schema = prepare(json.loads(path.read_text()), strict)
    base = jsonschema.Draft202012Validator

    def integer(checker: Any, instance: Any) -> bool:
        return base.TYPE_CHECKER.is_type(instance, "integer") or (isinstance(instance, float) and instance.is_integer())

    cls = jsonschema.validators.extend(base, type_checker=base.TYPE_CHECKER.redefine("integer", integer))
    return cls(schema)


def _json_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _error_problems(error: Any) -> Iterator[Problem]:
    if error.validator in ("anyOf", "oneOf") and error.context:
        # the branch that got furthest says most (e.g. the unknown field inside the object branch)
        deepest = max(error.context, key=lambda e: len(e.absolute_path))
        if len(deepest.absolute_path) > len(error.absolute_path):
            yield from _error_problems(deepest)
            return
    if error.validator == "additionalProperties" and error.validator_value is False and isinstance(error.instance, Mapping):
        allowed = set(_m(error.schema.get("properties")))
        for extra in sorted(k for k in error.instance if k not in allowed):
            yield Problem(_json_path([*error.absolute_path, extra]), None, "unknown field (the API server refuses or drops it)")
        return
    message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
    value = error.instance if isinstance(error.instance, str | int | float) else None
    yield Problem(_json_path(error.absolute_path), value, message)


def schema_problems(obj: Mapping[str, Any], strict: bool = True, patch: bool = False, root: Path = SCHEMAS) -> list[Problem]:
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    validator = _validator(schema_file(api_version, kind, root), strict)
    if validator is None:
        where = schema_file(api_version, kind, root)
        shown = where.relative_to(root.parent) if where.is_relative_to(root.parent) else where
        return [Problem("", None, f"no schema for apiVersion {api_version} kind {kind}: add upstream's as {shown} (schemas/PROVENANCE.md)")]
    found: list[Problem] = []
    for error in validator.iter_errors(obj):
        if is_unknown(error.instance) or (patch and error.validator == "required"):
            continue
        found += _error_problems(error)
    return found


# --------------------------------------------------------------------------- upstream name rules

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(f"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PORT_NAME = re.compile(r"^[-a-z0-9]+$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
TOTAL_ANNOTATION_SIZE = 256 * 1024  # objectmeta.go TotalAnnotationSizeLimitB
MAX_CONFIG_SIZE = 1024 * 1024  # core validation.go ValidateConfigMap/ValidateSecret: corev1.MaxSecretSize


def dns1123_label(value: str) -> list[str]:
    """`IsDNS1123Label`."""
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _DNS1123_LABEL.match(value):
        errs.append(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character"
        )
    return errs


def dns1123_subdomain(value: str) -> list[str]:
    """`IsDNS1123Subdomain`."""
    errs = ["must be no more than 253 characters"] if len(value) > 253 else []
    if not _DNS1123_SUBDOMAIN.match(value):
        errs.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return errs


def dns1035_label(value: str) -> list[str]:
    """`IsDNS1035Label`."""
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _DNS1035_LABEL.match(value):
        errs.append(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
            "start with an alphabetic character, and end with an alphanumeric character"
        )
    return errs


def path_segment_name(value: str) -> list[str]:
    """`path.IsValidPathSegmentName` (apimachinery/pkg/api/validation/path/name.go): RBAC names."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value] + (["may not be empty"] if not value else [])


def qualified_name(value: str) -> list[str]:
    """`IsQualifiedName`: label and annotation keys (`prefix/name`)."""
    parts = value.split("/")
    if len(parts) > 2:
        return ["a qualified name must consist of alphanumeric characters, '-', '_' or '.', with an optional DNS subdomain prefix and '/'"]
    name = parts[-1]
    errs = []
    if len(parts) == 2:
        if not parts[0]:
            errs.append("prefix part must be non-empty")
        else:
            errs += [f"prefix part {e}" for e in dns1123_subdomain(parts[0])]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if name and not _QUALIFIED.match(name):
        errs.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return errs


def label_value(value: str) -> list[str]:
    """`IsValidLabelValue`."""
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _LABEL_VALUE.match(value):
        errs.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return errs


def port_name(value: str) -> list[str]:
    """`IsValidPortName` (an IANA_SVC_NAME)."""
    errs = ["must be no more than 15 characters"] if len(value) > 15 else []
    if not _PORT_NAME.match(value):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", value):
        errs.append("must contain at least one letter (a-z)")
    if "--" in value:
        errs.append("must not contain consecutive hyphens")
    if value.startswith("-") or value.endswith("-"):
        errs.append("must not begin or end with a hyphen")
    return errs


def env_var_name(value: str) -> list[str]:
    """`IsRelaxedEnvVarName` (1.33's default: printable ASCII but '=')."""
    if not value:
        return ["environment variable name must not be empty"]
    if any(ord(c) > 126 or ord(c) < 32 or c == "=" for c in value):
        return ["a valid environment variable name must consist only of printable ASCII characters other than '='"]
    return []


def config_key(value: str) -> list[str]:
    """`IsConfigMapKey`."""
    errs = ["must be no more than 253 characters"] if len(value) > 253 else []
    if not _CONFIG_KEY.match(value):
        errs.append("a valid config key must consist of alphanumeric characters, '-', '_' or '.'")
    if value in (".", ".."):
        errs.append(f"must not be '{value}'")
    elif value.startswith(".."):
        errs.append("must not start with '..'")
    return errs


def tekton_name(value: str) -> list[str]:
    """Tekton's `ObjectMetadata`: a DNS subdomain (ValidateObjectMeta) of at most 63 characters and without '.'."""
    errs = dns1123_subdomain(value)
    if len(value) > 63:
        errs.append("Tekton: must be no more than 63 characters")
    if "." in value:
        errs.append("Tekton: special character . must not be present")
    return errs


def job_name(value: str) -> list[str]:
    errs = dns1123_subdomain(value)
    if len(value) > 63:
        errs.append("must be no more than 63 characters (its pods carry it as the batch.kubernetes.io/job-name label value)")
    return errs


NAME_RULES: dict[str, Callable[[str], list[str]]] = {
    "Service": dns1035_label,
    "Namespace": dns1123_label,
    "Role": path_segment_name,
    "RoleBinding": path_segment_name,
    "ClusterRole": path_segment_name,
    "ClusterRoleBinding": path_segment_name,
    "Job": job_name,
    **{kind: tekton_name for kind in ("Task", "TaskRun", "Pipeline", "PipelineRun", "StepAction")},
}


def _quantity_problems(path: str, value: Any) -> list[Problem]:
    if isinstance(value, bool) or is_unknown(value):
        return []
    if isinstance(value, int | float):
        return [Problem(path, value, "must be greater than or equal to 0")] if value < 0 else []
    if not isinstance(value, str) or not _QUANTITY.match(value):
        return [Problem(path, value, "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    number = quantity(value)
    if number is not None and number < 0:
        return [Problem(path, value, "must be greater than or equal to 0")]
    return []


def _resources(path: str, resources: Mapping[str, Any]) -> list[Problem]:
    found: list[Problem] = []
    for section in ("requests", "limits"):
        for name, value in _m(resources.get(section)).items():
            found += _quantity_problems(f"{path}.{section}.{name}", value)
    requests, limits = _m(resources.get("requests")), _m(resources.get("limits"))
    for name, value in requests.items():
        req, lim = quantity(value), quantity(limits.get(name)) if name in limits else None
        if req is not None and lim is not None and req > lim:
            found.append(Problem(f"{path}.requests.{name}", value, f"must be less than or equal to {name} limit of {limits[name]}"))
    return found


def _named(path: str, value: Any, rule: Callable[[str], list[str]], what: str) -> list[Problem]:
    if not isinstance(value, str) or is_unknown(value):
        return []
    return [Problem(path, value, f"{what}: {e}") for e in rule(value)]


def _meta_problems(path: str, meta: Mapping[str, Any]) -> list[Problem]:
    found: list[Problem] = []
    for key, value in _m(meta.get("labels")).items():
        found += _named(f"{path}.labels", key, qualified_name, "label key")
        found += _named(f"{path}.labels.{key}", value, label_value, "label value")
    annotations = _m(meta.get("annotations"))
    for key in annotations:
        found += _named(f"{path}.annotations", str(key).lower(), qualified_name, "annotation key")
    size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items() if not is_unknown(v))
    if size > TOTAL_ANNOTATION_SIZE:
        found.append(Problem(f"{path}.annotations", None, f"may not be more than {TOTAL_ANNOTATION_SIZE} bytes in all (found {size})"))
    return found


def _selector_problems(path: str, selector: Any) -> list[Problem]:
    found: list[Problem] = []
    for key, value in _m(_m(selector).get("matchLabels")).items():
        found += _named(f"{path}.matchLabels", key, qualified_name, "label key")
        found += _named(f"{path}.matchLabels.{key}", value, label_value, "label value")
    return found


def _container_problems(path: str, container: Mapping[str, Any], volumes: set[str] | None) -> list[Problem]:
    found = _named(f"{path}.name", container.get("name"), dns1123_label, "container name")
    for i, port in enumerate(_seq(container.get("ports"))):
        port = _m(port)
        found += _named(f"{path}.ports[{i}].name", port.get("name"), port_name, "port name")
        number = port.get("containerPort")
        if isinstance(number, int | float) and not isinstance(number, bool) and not 1 <= number <= 65535:
            found.append(Problem(f"{path}.ports[{i}].containerPort", number, "must be between 1 and 65535, inclusive"))
    for i, env in enumerate(_seq(container.get("env"))):
        found += _named(f"{path}.env[{i}].name", _m(env).get("name"), env_var_name, "env var name")
    for key in ("resources", "computeResources"):
        found += _resources(f"{path}.{key}", _m(container.get(key)))
    if volumes is not None:
        for i, mount in enumerate(_seq(container.get("volumeMounts"))):
            name = _m(mount).get("name")
            if isinstance(name, str) and not is_unknown(name) and name not in volumes:
                found.append(Problem(f"{path}.volumeMounts[{i}].name", name, "not found: no volume of that name"))
    return found


def _volume_problems(path: str, items: Any) -> tuple[list[Problem], set[str]]:
    found: list[Problem] = []
    names: set[str] = set()
    for i, volume in enumerate(_seq(items)):
        name = _m(volume).get("name")
        found += _named(f"{path}[{i}].name", name, dns1123_label, "volume name")
        if isinstance(name, str):
            if name in names:
                found.append(Problem(f"{path}[{i}].name", name, "Duplicate value"))
            names.add(name)
        size = _m(_m(volume).get("emptyDir")).get("sizeLimit")
        if size is not None:
            found += _quantity_problems(f"{path}[{i}].emptyDir.sizeLimit", size)
    return found, names


def _pod_spec_problems(path: str, spec: Mapping[str, Any], claims: set[str] = frozenset()) -> list[Problem]:  # type: ignore[assignment]
    found, volumes = _volume_problems(f"{path}.volumes", spec.get("volumes"))
    volumes |= claims  # a StatefulSet's volumeClaimTemplates are its pods' volumes too
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for i, container in enumerate(_seq(spec.get(key))):
            container = _m(container)
            found += _container_problems(f"{path}.{key}[{i}]", container, volumes)
            name = container.get("name")
            if isinstance(name, str):
                if name in seen:
                    found.append(Problem(f"{path}.{key}[{i}].name", name, "Duplicate value"))
                seen.add(name)
    return found


def _pvc_spec_problems(path: str, spec: Mapping[str, Any]) -> list[Problem]:
    found = _named(f"{path}.storageClassName", spec.get("storageClassName"), dns1123_subdomain, "storage class name")
    return found + _resources(f"{path}.resources", _m(spec.get("resources")))


def _task_spec_problems(path: str, spec: Mapping[str, Any]) -> list[Problem]:
    found, volumes = _volume_problems(f"{path}.volumes", spec.get("volumes"))
    names = volumes | {str(_m(w).get("name")) for w in _seq(spec.get("workspaces"))}
    for key in ("steps", "sidecars"):
        for i, step in enumerate(_seq(spec.get(key))):
            step = _m(step)
            # Tekton's validateStep: step names are DNS labels; a workspace may be mounted by name too
            found += _container_problems(f"{path}.{key}[{i}]", step, names)
    return found


POD_TEMPLATES = {"StatefulSet", "Deployment", "DaemonSet", "Job", "ReplicaSet"}


def rule_problems(obj: Mapping[str, Any]) -> list[Problem]:
    """Upstream's rules beyond the schema (see the module doc), for one object."""
    kind = str(obj.get("kind", ""))
    meta, spec = _m(obj.get("metadata")), _m(obj.get("spec"))
    found = _named("metadata.name", meta.get("name"), NAME_RULES.get(kind, dns1123_subdomain), f"{kind} name")
    found += _named("metadata.namespace", meta.get("namespace"), dns1123_label, "namespace")
    found += _meta_problems("metadata", meta)
    if kind in POD_TEMPLATES:
        template = _m(spec.get("template"))
        found += _meta_problems("spec.template.metadata", _m(template.get("metadata")))
        found += _selector_problems("spec.selector", spec.get("selector"))
        claims = (
            {str(_m(_m(c).get("metadata")).get("name")) for c in _seq(spec.get("volumeClaimTemplates"))} if kind == "StatefulSet" else set()
        )
        found += _pod_spec_problems("spec.template.spec", _m(template.get("spec")), claims)
    if kind == "StatefulSet":
        name, replicas = meta.get("name"), spec.get("replicas")
        if isinstance(name, str) and isinstance(replicas, int | float) and not is_unknown(name):
            pod = f"{name}-{max(int(replicas) - 1, 0)}"
            found += _named("metadata.name", name, lambda _: dns1123_label(pod), f"pod name {pod} (the pods' hostname)")
        for i, claim in enumerate(_seq(spec.get("volumeClaimTemplates"))):
            found += _pvc_spec_problems(f"spec.volumeClaimTemplates[{i}].spec", _m(_m(claim).get("spec")))
    elif kind == "PersistentVolumeClaim":
        found += _pvc_spec_problems("spec", spec)
    elif kind == "Service":
        for i, port in enumerate(_seq(spec.get("ports"))):
            port = _m(port)
            found += _named(f"spec.ports[{i}].name", port.get("name"), dns1123_label, "port name")
            target = port.get("targetPort")
            if isinstance(target, str):
                found += _named(f"spec.ports[{i}].targetPort", target, port_name, "target port name")
        for key, value in _m(spec.get("selector")).items():
            found += _named("spec.selector", key, qualified_name, "label key")
            found += _named(f"spec.selector.{key}", value, label_value, "label value")
    elif kind in ("ConfigMap", "Secret"):
        size = 0
        for section in ("data", "binaryData", "stringData"):
            for key, value in _m(obj.get(section)).items():
                found += _named(f"{section}", key, config_key, "key")
                size += len(str(value)) if not is_unknown(value) else 0
        if size > MAX_CONFIG_SIZE:
            found.append(Problem("data", None, f"Too long: may not be more than {MAX_CONFIG_SIZE} bytes (found {size})"))
    elif kind == "Route":
        host = spec.get("host")
        if isinstance(host, str) and host and not is_unknown(host):
            found += _named("spec.host", host, dns1123_subdomain, "host")
            found += [
                Problem("spec.host", host, f"host label {label!r} must be no more than 63 characters")
                for label in host.split(".")
                if len(label) > 63
            ]
    elif kind == "NetworkPolicy":
        found += _selector_problems("spec.podSelector", spec.get("podSelector"))
    if str(obj.get("apiVersion", "")).startswith("tekton.dev/"):
        found += _tekton_problems(kind, spec)
    return found


def _tekton_problems(kind: str, spec: Mapping[str, Any]) -> list[Problem]:
    found: list[Problem] = []
    if kind == "Task":
        found += _task_spec_problems("spec", spec)
    pipeline, base = (spec, "spec") if kind == "Pipeline" else (_m(spec.get("pipelineSpec")), "spec.pipelineSpec")
    if kind == "TaskRun" and isinstance(spec.get("taskSpec"), Mapping):
        found += _task_spec_problems("spec.taskSpec", spec["taskSpec"])
    for section in ("tasks", "finally"):
        for i, task in enumerate(_seq(pipeline.get(section))):
            if isinstance(_m(task).get("taskSpec"), Mapping):
                found += _task_spec_problems(f"{base}.{section}[{i}].taskSpec", task["taskSpec"])
    return found


def problems(obj: Mapping[str, Any], patch: bool = False, strict: bool = True, root: Path = SCHEMAS) -> list[Problem]:
    """Everything the API server would refuse in one object: its schema, then upstream's rules."""
    found = schema_problems(obj, strict=strict, patch=patch, root=root)
    return found + rule_problems(obj)


def kinds(root: Path = SCHEMAS) -> list[tuple[str, str]]:
    """(apiVersion, kind) of every vendored schema."""
    out = []
    for path in sorted(root.glob("*/*/*.json")):
        group, version = path.parent.parent.name, path.parent.name
        out.append((version if group == "core" else f"{group}/{version}", path.stem))
    return out


def iter_objects(value: Any) -> Iterator[Mapping[str, Any]]:
    """The objects of a parsed YAML/JSON document (a `kind: List` is opened)."""
    if isinstance(value, Mapping):
        if str(value.get("kind", "")).endswith("List") and isinstance(value.get("items"), list):
            for item in value["items"]:
                yield from iter_objects(item)
        else:
            yield value


def check_api_server_accepts(res: Resource) -> Iterator[str]:
    """The pack's view: every problem of one resource's inputs (unknown values at preview are skipped)."""
    if not res.is_kubernetes or "apiVersion" not in res.inputs or "kind" not in res.inputs:
        return
    for problem in problems(res.inputs, patch=res.is_patch):
        yield problem.text


API_SERVER_ACCEPTS = PolicySpec(
    "api-server-accepts",
    MANDATORY,
    "resource",
    "Every object is one the API server accepts: it passes its kind's upstream schema strictly (schemas/, an unknown "
    "field is an error; a kind without a vendored schema fails) and upstream's rules beyond the schema (names per "
    "kind, label keys and values, annotation size, container/port/volume/env names, quantities, storageClassName).",
    "Fix the config value that made the field (`make render` names the key); a new kind comes with its upstream "
    "schema under schemas/ (schemas/PROVENANCE.md).",
    check_api_server_accepts,
    order=0,
)
