"""The `ml-dev-env-guardrails` policy pack: adapters from the `rules` package to pulumi-policy.

Run by the Pulumi CLI (`pulumi preview --policy-pack policy`) through `pulumi-analyzer-policy-python`,
i.e. `python -u -m pulumi.policy <engine> <pack dir>`, which does `runpy.run_path(<pack dir>)`
(pulumi/pulumi sdk/python/lib/pulumi/policy/__main__.py, `main`): this directory, not the repository
root, is on sys.path, so the rules import as `rules` there and as `policy.rules` everywhere else (tests,
`make render`); the rules package imports only itself (relative imports), never `core`/`stacks`. Each rule in
`rules.POLICIES` becomes a ResourceValidationPolicy (one resource's inputs) or a
StackValidationPolicy (all resources, for rules that follow references: Route -> Service -> pod
template, pod -> ServiceAccount -> RoleBinding -> SCC). Importing this module builds the policy
objects without serving them; only running it as `__main__` starts the pack.

Preview-time unknowns: the SDK wraps properties in a proxy that raises on unknown values. The
adapters unwrap it to plain data in which unknowns stay as the engine's sentinel strings, and the
rules skip whatever they cannot judge yet, so an unknown value never fails a preview.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import _DictProxy, _ListProxy

try:
    from policy import rules
except ImportError:  # run by the CLI from the pack directory: only policy/ itself is on sys.path
    import rules  # type: ignore[no-redef]

LEVELS = {rules.MANDATORY: EnforcementLevel.MANDATORY, rules.ADVISORY: EnforcementLevel.ADVISORY}


def plain(value: Any) -> Any:
    """Unwrap pulumi-policy's unknown-checking proxies into dicts/lists (unknowns stay sentinels)."""
    if isinstance(value, _DictProxy):
        value = value["__target"]
    elif isinstance(value, _ListProxy):
        value = value["__target"]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def options(opts: Any, name: str, urn: str) -> dict[str, Any]:
    """The rules' option dict. The analyzer protocol has no retainOnDelete: None means "not known"."""
    return {
        "protect": bool(getattr(opts, "protect", False)),
        "retain_on_delete": None,
        "delete_before_replace": getattr(opts, "delete_before_replace", None),
        "parent": getattr(opts, "parent", None),
        "name": name,
        "urn": urn,
    }


def described(spec: rules.PolicySpec) -> dict[str, Any]:
    """What every policy of the pack takes from its catalogue entry: name, description, level, remediation."""
    return {
        "name": spec.name,
        "description": spec.description,
        "enforcement_level": LEVELS[spec.level],
        "remediation_steps": spec.remediation,
    }


def resource_policy(spec: rules.PolicySpec) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        item = (args.resource_type, plain(args.props), options(args.opts, args.name, args.urn))
        for violation in rules.evaluate([item], policies=[spec.name]):
            report_violation(f"{violation.resource}: {violation.message}", None)

    return ResourceValidationPolicy(validate=validate, **described(spec))


def stack_policy(spec: rules.PolicySpec) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = list(args.resources)
        items = [(r.resource_type, plain(r.props), options(r.opts, r.name, r.urn)) for r in resources]
        for violation in rules.evaluate(items, policies=[spec.name]):
            urn = resources[violation.index].urn if violation.index is not None else None
            report_violation(f"{violation.resource}: {violation.message}", urn)

    return StackValidationPolicy(validate=validate, **described(spec))


def api_server_policy() -> ResourceValidationPolicy:
    """The schema check (`rules.kube_api`): every object against its vendored upstream schema and upstream's rules."""
    spec = rules.API_SERVER_ACCEPTS

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        res = rules.Resource(0, args.resource_type, plain(args.props), options(args.opts, args.name, args.urn))
        for message in rules.kube_api.check_api_server_accepts(res):
            report_violation(f"{res.label}: {message}", None)

    return ResourceValidationPolicy(validate=validate, **described(spec))


def build_policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """The catalogue's rules, then the schema check (what `make render` prints as its schema check)."""
    return [*(resource_policy(s) if s.scope == "resource" else stack_policy(s) for s in rules.POLICIES), api_server_policy()]


def main() -> None:
    PolicyPack(
        rules.PACK_NAME,
        policies=build_policies(),  # type: ignore[arg-type]
        enforcement_level=EnforcementLevel.MANDATORY,
        description="ml-dev-env guard rails: authentication, privileges, devices, data, Tekton v1, images, secrets.",
        readme=(Path(__file__).resolve().parent / "README.md").read_text(),
    )


if __name__ == "__main__":
    main()
