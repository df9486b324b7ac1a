"""Policy 2: privileges need an SCC binding."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .query import MANDATORY, PolicySpec, Resource, _get, _item_name, _m, _same_ns, _seq, _str, _true, _workloads, pod_containers

# -------------------------------------------------------------- 2. privileges need an SCC binding

SCC_ROLE_PREFIX = "system:openshift:scc:"
RESTRICTED_CAPS = frozenset({"NET_BIND_SERVICE"})  # restricted-v2 lets any pod add these
# OpenShift's built-in SCCs (4.x) that may be bound without being declared: what each allows.
BUILTIN_SCCS: dict[str, dict[str, Any]] = {
    "privileged": {"privileged": True, "caps": {"*"}, "host": {"hostNetwork", "hostPID", "hostIPC"}},
    "hostaccess": {"privileged": False, "caps": set(), "host": {"hostNetwork", "hostPID", "hostIPC"}},
    "hostnetwork": {"privileged": False, "caps": set(), "host": {"hostNetwork"}},
    "hostnetwork-v2": {"privileged": False, "caps": set(), "host": {"hostNetwork"}},
    **{
        n: {"privileged": False, "caps": set(), "host": set()}
        for n in (
            "restricted",
            "restricted-v2",
            "nonroot",
            "nonroot-v2",
            "anyuid",
            "hostmount-anyuid",
            "machine-api-termination-handler",
        )
    },
}
SCC_HOST_FIELDS = {"hostNetwork": "allowHostNetwork", "hostPID": "allowHostPID", "hostIPC": "allowHostIPC"}


def _cap(name: str) -> str:
    name = name.upper()
    return name[4:] if name.startswith("CAP_") else name


@dataclass
class _Needs:
    privileged: list[str] = field(default_factory=list)
    caps: dict[str, list[str]] = field(default_factory=dict)
    host: list[str] = field(default_factory=list)

    def add_container(self, where: str, container: Mapping[str, Any]) -> None:
        ctx = _m(container.get("securityContext"))
        if _true(ctx.get("privileged")):
            self.privileged.append(where)
        for cap in _seq(_get(ctx, "capabilities", "add")):
            if _str(cap) and _cap(cap) not in RESTRICTED_CAPS:
                self.caps.setdefault(_cap(cap), []).append(where)

    def add_pod(self, spec: Mapping[str, Any]) -> None:
        self.host += [f for f in SCC_HOST_FIELDS if _true(spec.get(f))]

    def __bool__(self) -> bool:
        return bool(self.privileged or self.caps or self.host)

    def describe(self) -> str:
        parts = []
        if self.privileged:
            parts.append(f"privileged containers ({', '.join(sorted(set(self.privileged)))})")
        if self.caps:
            parts.append("added capabilities " + ", ".join(f"{c} ({', '.join(sorted(set(w)))})" for c, w in sorted(self.caps.items())))
        if self.host:
            parts.append("host namespaces " + ", ".join(sorted(set(self.host))))
        return "; ".join(parts)


def _scc_allows(scc: str, needs: _Needs, sccs: dict[str, Mapping[str, Any]]) -> str | None:
    """None if SCC `scc` admits everything in `needs`; else what it lacks."""
    if scc in sccs:
        obj = sccs[scc]
        allowed_caps = {_cap(c) for c in _seq(obj.get("allowedCapabilities")) + _seq(obj.get("defaultAddCapabilities")) if _str(c)}
        privileged = _true(obj.get("allowPrivilegedContainer"))
        host = {f for f, k in SCC_HOST_FIELDS.items() if _true(obj.get(k))}
    elif scc in BUILTIN_SCCS:
        builtin = BUILTIN_SCCS[scc]
        allowed_caps, privileged, host = set(builtin["caps"]), builtin["privileged"], set(builtin["host"])
    else:
        return None  # a cluster SCC the stack binds to but doesn't declare: trusted as named
    missing = []
    if needs.privileged and not privileged:
        missing.append("allowPrivilegedContainer")
    if "*" not in allowed_caps:
        lacking = sorted(c for c in needs.caps if c not in allowed_caps)
        if lacking:
            missing.append(f"allowedCapabilities {', '.join(lacking)}")
    missing += [SCC_HOST_FIELDS[h] for h in sorted(set(needs.host) - host)]
    return ", ".join(missing) or None


ROLE_OWNER_ANNOTATION = "ml-dev-env/role-owner"
"""On a RoleBinding whose Role another stack of the project creates: that stack's name."""


def _granted_scc(roles: Mapping[tuple[str | None, str], Resource], ns: str | None, role_name: str) -> str | None:
    """The one SCC a Role of the stack (any name) grants `use` of by name, else None."""
    role = roles.get((ns, role_name))
    if role is None:
        return None
    for rule in map(_m, _seq(role.inputs.get("rules"))):
        names = _seq(rule.get("resourceNames"))
        if "use" in _seq(rule.get("verbs")) and "securitycontextconstraints" in _seq(rule.get("resources")) and len(names) == 1:
            return _str(names[0])
    return None


def _bound_sccs(sa: str, ns: str | None, resources: Sequence[Resource]) -> tuple[list[str], list[str]]:
    """SCCs the stack lets service account `sa` use, and notes on bindings that grant nothing."""
    roles = {(r.namespace, r.name): r for r in resources if r.is_kubernetes and r.kind == "Role" and not r.is_patch}
    bound: list[str] = []
    notes: list[str] = []
    for binding in resources:
        if not binding.is_kubernetes or binding.kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if binding.kind == "RoleBinding" and not _same_ns(binding.namespace, ns):
            continue
        ref = _m(binding.inputs.get("roleRef"))
        role_name = _str(ref.get("name")) or ""
        granted = _granted_scc(roles, binding.namespace, role_name) if ref.get("kind") == "Role" else None
        if not role_name.startswith(SCC_ROLE_PREFIX) and granted is None:
            continue
        subject_ok = False
        for subject in _seq(binding.inputs.get("subjects")):
            subject = _m(subject)
            if subject.get("kind") == "ServiceAccount" and subject.get("name") == sa:
                subject_ok |= _same_ns(_str(subject.get("namespace")) or binding.namespace, ns)
            elif subject.get("kind") == "Group" and subject.get("name") in ("system:serviceaccounts", f"system:serviceaccounts:{ns}"):
                subject_ok = True
        if not subject_ok:
            continue
        # A Role of another name (an environment's own, named after it) grants the SCC its rule names.
        scc = role_name[len(SCC_ROLE_PREFIX) :] if role_name.startswith(SCC_ROLE_PREFIX) else str(granted)
        if ref.get("kind") == "Role":
            role = roles.get((binding.namespace, role_name)) or next(
                (r for (rns, rname), r in roles.items() if rname == role_name and _same_ns(rns, binding.namespace)), None
            )
            owner = (_m(_m(binding.inputs.get("metadata")).get("annotations"))).get(ROLE_OWNER_ANNOTATION)
            if role is None and owner:
                # The Role belongs to another stack of this project (an environment's cluster stack), whose own
                # check covers what it grants: counted as bound, like a ClusterRole OpenShift provides.
                bound.append(scc)
                continue
            if role is None:
                notes.append(f"{binding.label} refers to Role {role_name!r}, which the stack does not create")
                continue
            if not any(
                "use" in _seq(rule.get("verbs"))
                and "securitycontextconstraints" in _seq(rule.get("resources"))
                and (not _seq(rule.get("resourceNames")) or scc in _seq(rule.get("resourceNames")))
                for rule in map(_m, _seq(role.inputs.get("rules")))
            ):
                notes.append(f"Role {role_name!r} does not grant `use` of SCC {scc!r}")
                continue
        # kind ClusterRole: OpenShift provides system:openshift:scc:<name> for its SCCs; a custom one is the admin's.
        bound.append(scc)
    for scc_res in resources:
        if scc_res.is_kubernetes and scc_res.kind == "SecurityContextConstraints":
            if f"system:serviceaccount:{ns}:{sa}" in _seq(scc_res.inputs.get("users")):
                bound.append(scc_res.name)
    return bound, notes


def _privilege_violation(
    sa: str, ns: str | None, needs: _Needs, resources: Sequence[Resource], sccs: dict[str, Mapping[str, Any]], what: str
) -> str | None:
    bound, notes = _bound_sccs(sa, ns, resources)
    problems = []
    for scc in bound:
        lacking = _scc_allows(scc, needs, sccs)
        if lacking is None:
            return None
        problems.append(f"SCC {scc!r} is bound but does not set {lacking}")
    detail = "; ".join(problems + notes) or f"no RoleBinding in the stack grants service account {sa!r} an SCC"
    return (
        f"{what} needs {needs.describe()}, but {detail}. Fix: declare the privilege the way the memlock setting does "
        f"(security.memlock.mode scc|privileged): a RoleBinding of service account {sa!r} to "
        f"'{SCC_ROLE_PREFIX}<scc>' (a Role granting `use` of the SCC, or the ClusterRole OpenShift provides), and, when "
        f"the stack creates the SCC, list the capabilities in its allowedCapabilities; otherwise drop the privileges "
        f"(TCP mode needs none and runs under restricted-v2)."
    )


def check_privileges_bound(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    sccs = {r.name: r.inputs for r in resources if r.is_kubernetes and r.kind == "SecurityContextConstraints"}
    for workload in _workloads(resources):
        needs = _Needs()
        for container in pod_containers(workload.spec):
            needs.add_container(f"container {container.get('name')}", container)
        needs.add_pod(workload.spec)
        if not needs:
            continue
        sa = workload.spec.get("serviceAccountName", workload.spec.get("serviceAccount")) or "default"
        if _str(sa) is None:
            continue
        msg = _privilege_violation(sa, workload.res.namespace, needs, resources, sccs, "the pod template")
        if msg:
            yield workload.res, msg
    yield from _tekton_privileges(resources, sccs)


def _tekton_privileges(resources: Sequence[Resource], sccs: dict[str, Mapping[str, Any]]) -> Iterator[tuple[Resource, str]]:
    """Privileged Tekton steps run in TaskRun pods as the run's service account: that account needs the SCC."""
    tasks = {(r.namespace, r.name, r.kind): r for r in resources if r.group == "tekton.dev" and r.kind in ("Task", "ClusterTask")}
    pipelines = {(r.namespace, r.name): r for r in resources if r.group == "tekton.dev" and r.kind == "Pipeline"}

    def lookup_task(ref: Mapping[str, Any], ns: str | None) -> Mapping[str, Any] | None:
        kind = _str(ref.get("kind")) or "Task"
        for (tns, tname, tkind), task in tasks.items():
            if tname == ref.get("name") and tkind == kind and (kind == "ClusterTask" or _same_ns(tns, ns)):
                return task.spec
        return None

    def task_needs(task_spec: Mapping[str, Any]) -> _Needs:
        needs = _Needs()
        for key in ("steps", "sidecars"):
            for i, step in enumerate(_seq(task_spec.get(key))):
                if isinstance(step, Mapping):
                    needs.add_container(f"{key[:-1]} {_item_name(step, i)}", step)
        if isinstance(task_spec.get("stepTemplate"), Mapping):
            needs.add_container("stepTemplate", task_spec["stepTemplate"])
        return needs

    for run in resources:
        if run.group != "tekton.dev" or run.is_patch or run.kind not in ("PipelineRun", "TaskRun"):
            continue
        spec, ns = run.spec, run.namespace
        if run.kind == "TaskRun":
            task_spec = _m(spec.get("taskSpec")) or lookup_task(_m(spec.get("taskRef")), ns) or {}
            needs = task_needs(task_spec)
            needs.add_pod(_m(spec.get("podTemplate")))
            sa = _str(spec.get("serviceAccountName")) or "default"
            if needs:
                msg = _privilege_violation(sa, ns, needs, resources, sccs, "the TaskRun's steps")
                if msg:
                    yield run, msg
            continue
        pipeline = _m(spec.get("pipelineSpec"))
        if not pipeline:
            ref_name = _get(spec, "pipelineRef", "name")
            found = next((p for (pns, pname), p in pipelines.items() if pname == ref_name and _same_ns(pns, ns)), None)
            pipeline = found.spec if found else {}
        template = _m(spec.get("taskRunTemplate"))
        overrides = {_str(t.get("pipelineTaskName")): _m(t) for t in map(_m, _seq(spec.get("taskRunSpecs")))}
        for task in map(_m, _seq(pipeline.get("tasks")) + _seq(pipeline.get("finally"))):
            task_spec = _m(task.get("taskSpec")) or lookup_task(_m(task.get("taskRef")), ns) or {}
            needs = task_needs(task_spec)
            override = overrides.get(_str(task.get("name")), {})
            needs.add_pod(_m(override.get("podTemplate")) or _m(template.get("podTemplate")))
            if not needs:
                continue
            sa = _str(override.get("serviceAccountName")) or _str(template.get("serviceAccountName")) or "default"
            msg = _privilege_violation(sa, ns, needs, resources, sccs, f"pipeline task {task.get('name')!r}")
            if msg:
                yield run, msg


POLICY = PolicySpec(
    "privileges-require-scc-binding",
    MANDATORY,
    "stack",
    "Privileged containers, added capabilities (beyond NET_BIND_SERVICE) and host namespaces appear only in pods "
    "whose service account the stack binds to an SCC (RoleBinding to system:openshift:scc:<scc>) that allows them: "
    "the RDMA memlock setting, declared, never granted out of band.",
    "Set security.memlock (scc with the SCC's capabilities, or privileged) so the stack declares the RoleBinding "
    "(and the SCC when it may create it), or remove the privileges.",
    check_privileges_bound,
    order=2,
)
