"""Identity and capabilities as OpenShift's SCC admission and CRI-O give a container (see the package docstring)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CRIO_DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE", "KILL")
"""cri-o internal/config/capabilities/capabilities_linux.go Default() (CRI-O 1.25+, OpenShift 4.11+)."""

NAMESPACE_UID = 1000770000
"""First UID of the namespace's `openshift.io/sa.scc.uid-range` (and of its supplemental-groups range, the fsGroup)."""


@dataclass(frozen=True)
class Identity:
    scc: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    capabilities: tuple[str, ...]  # bounding = permitted = effective for UID 0; for others the bounding set only
    no_new_privs: bool
    fs_group: int | None

    def setpriv(self) -> list[str]:
        """setpriv(1) arguments giving a process this identity (util-linux)."""
        caps = ",".join(["-all", *(f"+{c.lower()}" for c in self.capabilities)])
        args = [f"--reuid={self.uid}", f"--regid={self.gid}"]
        args.append(f"--groups={','.join(map(str, self.groups))}" if self.groups else "--clear-groups")
        args += [f"--bounding-set={caps}", "--inh-caps=-all"]
        if self.no_new_privs:
            args.append("--no-new-privs")
        return args


class AdmissionRefused(Exception):
    """The pod is refused: the API server answers the StatefulSet controller's create with this message."""


def _by_kind(resources: Iterable[Any], kind: str) -> list[Mapping[str, Any]]:
    return [r.inputs for r in resources if r.kind == kind]


def granted_scc(resources: Iterable[Any], service_account: str) -> Mapping[str, Any] | None:
    """The SCC granted to the pod's service account through a Role (or an admin's ClusterRole) + RoleBinding
    (openshift/apiserver-library-go pkg/securitycontextconstraints/sccadmission: the SCCs a service account may
    use, highest priority first; we only ever see the stack's own, an admin's a test adds, and restricted-v2)."""
    resources = list(resources)
    for scc in _by_kind(resources, "SecurityContextConstraints"):
        name = scc["metadata"]["name"]
        roles = {
            r["metadata"]["name"]
            for r in [*_by_kind(resources, "Role"), *_by_kind(resources, "ClusterRole")]
            if any("use" in rule.get("verbs", []) and name in rule.get("resourceNames", []) for rule in r.get("rules", []))
        }
        for binding in _by_kind(resources, "RoleBinding"):
            if binding["roleRef"]["name"] in roles and any(
                s.get("kind") == "ServiceAccount" and s.get("name") == service_account for s in binding.get("subjects", [])
            ):
                return scc
    return None


def admit(resources: Iterable[Any], pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> Identity:
    """The identity a container of `pod_spec` runs with."""
    resources = list(resources)
    sc = {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    caps = sc.get("capabilities") or {}
    add, drop = [c.upper() for c in caps.get("add") or []], [c.upper() for c in caps.get("drop") or []]
    scc = granted_scc(resources, pod_spec.get("serviceAccountName", "default"))
    if scc is None:
        # restricted-v2: runAsUser MustRunAsRange -> the range's first UID (mustrunasrange.go), fsGroup MustRunAs
        # -> the first supplemental group (fsgroup/mustrunas.go), requiredDropCapabilities [ALL], no privilege
        # escalation; the runtime gives the process GID 0 and the fsGroup as supplementary group.
        uid = int(sc.get("runAsUser", NAMESPACE_UID))
        fs_group = int((pod_spec.get("securityContext") or {}).get("fsGroup", NAMESPACE_UID))
        return Identity("restricted-v2", uid, 0, (fs_group,), (), True, fs_group)
    # An SCC of the stack: capabilities = the runtime's defaults + add - drop - requiredDropCapabilities
    # (apiserver-library-go pkg/securitycontextconstraints/capabilities/mustrunas.go Generate: required drops are
    # added to the container's drop list; CRI-O then removes `drop` from its defaults + `add`).
    # Generate: add = (defaultAddCapabilities - container drop) + container add; drop = required + container drop.
    required = [c.upper() for c in scc.get("requiredDropCapabilities") or []]
    # mustrunas.go Validate: a capability the container adds that the SCC neither allows nor adds by default is refused
    # ("capability may not be added"); `*` in allowedCapabilities allows any.
    allowed = {c.upper() for c in [*(scc.get("allowedCapabilities") or []), *(scc.get("defaultAddCapabilities") or [])]}
    refused = [c for c in add if c not in allowed and "*" not in allowed]
    if refused:
        raise AdmissionRefused(
            f"unable to validate against any security context constraint: capabilities.add: {', '.join(refused)}: "
            f"capability may not be added (SCC {scc['metadata']['name']})"
        )
    default_add = [c.upper() for c in scc.get("defaultAddCapabilities") or [] if c.upper() not in drop]
    gone = set(drop) | set(required)
    base = [] if "ALL" in gone else list(CRIO_DEFAULT_CAPABILITIES)
    final = tuple(dict.fromkeys(c for c in [*base, *default_add, *add] if c not in gone))
    # runAsUser RunAsAny without a runAsUser: the image's USER (images/base.Containerfile sets none: root)
    default_uid = 0 if (scc.get("runAsUser") or {}).get("type") == "RunAsAny" else NAMESPACE_UID
    uid = int(sc.get("runAsUser", default_uid))
    pod_fs_group = (pod_spec.get("securityContext") or {}).get("fsGroup")
    groups = (int(pod_fs_group),) if pod_fs_group is not None else ()
    no_new_privs = sc.get("allowPrivilegeEscalation") is False or not scc.get("allowPrivilegeEscalation", True)
    return Identity(scc["metadata"]["name"], uid, 0, groups, final, no_new_privs, int(pod_fs_group) if pod_fs_group is not None else None)
