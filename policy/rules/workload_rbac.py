"""Policy rule: Roles the stack declares never let anyone rewrite a workload (issue: idle stop RBAC).

The idle agent may only scale its own StatefulSet: `statefulsets/scale` limited by resourceNames. Write
access to a workload object itself (`patch statefulsets`, `update deployments`, `create pods`, ...) could
change a pod template - image, command, privileges - so a Role or ClusterRole the stack declares must not
grant it, nor wildcards, nor `pods/exec`-style entry into running pods. Policy `workload-rbac-scale-only`
(`POLICY` below; pure function over one resource, like the other rules).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .query import MANDATORY, PolicySpec

WORKLOADS = {
    "apps": {"statefulsets", "deployments", "daemonsets", "replicasets", "controllerrevisions"},
    "": {"pods", "replicationcontrollers", "podtemplates"},
    "batch": {"jobs", "cronjobs"},
    "apps.openshift.io": {"deploymentconfigs"},
    "leaderworkerset.x-k8s.io": {"leaderworkersets"},
}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
ENTRY_SUBRESOURCES = {"exec", "attach", "portforward", "ephemeralcontainers", "proxy"}
SCALE_VERBS = {"get", "update", "patch"}


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list | tuple) else []


def check_workload_rbac(res: Any) -> Iterator[str]:
    """`res` is a rules.Resource: Role / ClusterRole inputs as Kubernetes receives them."""
    if res.kind not in ("Role", "ClusterRole") or not res.type.startswith("kubernetes:rbac.authorization.k8s.io/"):
        return
    rules = res.inputs.get("rules")
    for i, rule in enumerate(rules if isinstance(rules, list | tuple) else []):
        if not isinstance(rule, Mapping):
            continue
        groups, resources = _strings(rule.get("apiGroups")), _strings(rule.get("resources"))
        verbs, names = set(_strings(rule.get("verbs"))), _strings(rule.get("resourceNames"))
        if "*" in groups or "*" in resources:
            yield f"rules[{i}] uses a wildcard ({groups} {resources}). Fix: list the API groups and resources it needs"
            continue
        for group in groups:
            for resource in resources:
                base, _, sub = resource.partition("/")
                if base not in WORKLOADS.get(group, set()):
                    continue
                if sub == "scale":
                    if not names:
                        yield (
                            f"rules[{i}] grants {sorted(verbs)} on {resource} of every object. Fix: limit it with "
                            "resourceNames to the one workload it scales"
                        )
                    elif verbs - SCALE_VERBS:
                        yield f"rules[{i}] grants {sorted(verbs - SCALE_VERBS)} on {resource}. Fix: grant only get/update/patch"
                elif sub in ENTRY_SUBRESOURCES and verbs & {"create", "get", "*"}:
                    yield f"rules[{i}] grants {sorted(verbs)} on {resource}, which runs code inside the pods. Fix: remove the rule"
                elif not sub and verbs & WRITE_VERBS:
                    yield (
                        f"rules[{i}] grants {sorted(verbs & WRITE_VERBS)} on {group or 'core'}/{base}, which could change "
                        f"a pod template. Fix: scale through {base}/scale with resourceNames instead"
                    )


POLICY = PolicySpec(
    "workload-rbac-scale-only",
    MANDATORY,
    "resource",
    "Roles and ClusterRoles the stack declares grant no write verb on workload objects (StatefulSets, "
    "Deployments, pods, jobs, ...), no pods/exec-style entry and no wildcards; scaling goes through "
    "<workload>/scale limited by resourceNames (the idle agent's `statefulsets/scale` on its one StatefulSet).",
    "Grant get/update on `statefulsets/scale` with resourceNames: [<the StatefulSet>] instead of patch on statefulsets.",
    check_workload_rbac,
    order=9,
)
