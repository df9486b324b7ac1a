"""The catalogue: every rule module of this package, found by its `POLICY`, and the evaluation over them.

A rule is one module in `policy/rules/` that defines `POLICY = PolicySpec(...)` next to its check; nothing
else needs to change to add one (CONTRIBUTING.md). `PolicySpec.order` places it in reports (then the name).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .query import ADVISORY, MANDATORY, PACK_NAME, PolicySpec, Resource, Violation, _m

NOT_RULES = frozenset({"query", "catalogue", "kube_api"})  # kube_api: the pack adds its API_SERVER_ACCEPTS


def _discover() -> tuple[PolicySpec, ...]:
    # Relative to this package, whatever it is called: `policy.rules` in the repository, `rules` when
    # the Pulumi CLI runs the pack from its own directory (policy/__main__.py).
    package = __name__.rpartition(".")[0]
    found = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name in NOT_RULES or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        spec = getattr(module, "POLICY", None)
        if not isinstance(spec, PolicySpec):
            raise TypeError(f"policy/rules/{info.name}.py defines no POLICY = PolicySpec(...)")
        found.append(spec)
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate policy names: {sorted(n for n in names if names.count(n) > 1)}")
    return tuple(sorted(found, key=lambda s: (s.order, s.name)))


POLICIES: tuple[PolicySpec, ...] = _discover()
POLICY_NAMES = tuple(p.name for p in POLICIES)


def evaluate(
    resources: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
    policies: Iterable[str] | None = None,
) -> list[Violation]:
    """Check (type token, inputs, options) triples against every policy (or the named ones).

    `options` may hold `retain_on_delete`, `protect` (and `name`, used when an object has no
    metadata.name); a missing `retain_on_delete` means "not known", never "false".
    """
    items = [Resource(i, str(item[0]), _m(item[1]), _m(item[2]) if len(item) > 2 else {}) for i, item in enumerate(resources)]
    wanted = set(POLICY_NAMES if policies is None else policies)
    unknown = wanted - set(POLICY_NAMES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; known: {', '.join(POLICY_NAMES)}")
    violations: list[Violation] = []
    for spec in POLICIES:
        if spec.name not in wanted:
            continue
        if spec.scope == "resource":
            check: Callable[[Any], Iterable[Any]] = spec.check
            found = [(res, msg) for res in items for msg in check(res)]
        else:
            found = list(spec.check(items))  # type: ignore[arg-type]
        for res, msg in found:
            violations.append(Violation(spec.name, spec.level, res.type, res.label, msg, res.index))
    return violations


def has_mandatory(violations: Iterable[Violation]) -> bool:
    return any(v.level == MANDATORY for v in violations)


def format_report(violations: Sequence[Violation]) -> str:
    """A human report: one block per violation, mandatory first, then a one-line verdict."""
    if not violations:
        return f"policy {PACK_NAME}: {len(POLICIES)} policies, no violations"
    order = {MANDATORY: 0, ADVISORY: 1}
    mandatory = sum(v.level == MANDATORY for v in violations)
    lines = [f"policy {PACK_NAME}: {len(violations)} violation(s) ({mandatory} mandatory, {len(violations) - mandatory} advisory)"]
    for v in sorted(
        violations,
        key=lambda v: (
            order[v.level],
            POLICY_NAMES.index(v.policy) if v.policy in POLICY_NAMES else 99,
            v.index if v.index is not None else -1,
            v.message,
        ),
    ):
        lines.append(f"  [{v.level}] {v.policy}: {v.resource}")
        lines.append(f"      {v.message}")
    return "\n".join(lines)
