"""Admission as the simulation applies it (no root): SCC capabilities and restricted-v2 identity."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.podsim.admission import CRIO_DEFAULT_CAPABILITIES, NAMESPACE_UID, AdmissionRefused, admit


def objects(scc: dict[str, Any] | None) -> list[SimpleNamespace]:
    if scc is None:
        return []
    role = {"metadata": {"name": "use-it"}, "rules": [{"verbs": ["use"], "resourceNames": ["my-scc"]}]}
    binding = {"roleRef": {"name": "use-it"}, "subjects": [{"kind": "ServiceAccount", "name": "sa"}]}
    return [
        SimpleNamespace(
            kind="SecurityContextConstraints", inputs={"metadata": {"name": "my-scc"}, "runAsUser": {"type": "RunAsAny"}, **scc}
        ),
        SimpleNamespace(kind="Role", inputs=role),
        SimpleNamespace(kind="RoleBinding", inputs=binding),
    ]


def test_scc_capabilities_are_runtime_defaults_plus_add_minus_drops() -> None:
    scc = {
        "requiredDropCapabilities": ["KILL", "MKNOD"],
        "defaultAddCapabilities": ["NET_RAW", "SYS_PTRACE"],
        "allowedCapabilities": ["IPC_LOCK"],
    }
    container = {"securityContext": {"capabilities": {"add": ["IPC_LOCK"], "drop": ["SYS_PTRACE", "CHOWN"]}}}
    got = admit(objects(scc), {"serviceAccountName": "sa"}, container)
    want = [c for c in CRIO_DEFAULT_CAPABILITIES if c not in ("KILL", "CHOWN")] + ["NET_RAW", "IPC_LOCK"]
    assert got.capabilities == tuple(want) and got.uid == 0 and not got.no_new_privs and got.scc == "my-scc"
    # another service account is not granted the SCC: restricted-v2
    other = admit(objects(scc), {"serviceAccountName": "someone-else"}, container)
    assert other.scc == "restricted-v2"


def test_restricted_v2_is_the_namespace_uid_gid_0_fsgroup_no_capabilities() -> None:
    got = admit(objects(None), {"serviceAccountName": "sa"}, {"securityContext": {"capabilities": {"drop": ["ALL"]}}})
    assert (got.uid, got.gid, got.groups, got.capabilities, got.no_new_privs) == (NAMESPACE_UID, 0, (NAMESPACE_UID,), (), True)
    assert "--no-new-privs" in got.setpriv() and "--bounding-set=-all" in got.setpriv()


def test_a_capability_the_scc_does_not_allow_is_refused() -> None:
    """mustrunas.go Validate: an added capability outside allowedCapabilities and defaultAddCapabilities is refused."""
    scc = {"allowedCapabilities": ["IPC_LOCK"], "defaultAddCapabilities": ["NET_RAW"]}
    for add in (["IPC_LOCK"], ["NET_RAW"]):
        assert admit(objects(scc), {"serviceAccountName": "sa"}, {"securityContext": {"capabilities": {"add": add}}}).uid == 0
    with pytest.raises(AdmissionRefused, match="SYS_CHROOT: capability may not be added"):
        admit(objects(scc), {"serviceAccountName": "sa"}, {"securityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_CHROOT"]}}})
    anything = {"allowedCapabilities": ["*"]}
    assert (
        "SYS_CHROOT"
        in admit(
            objects(anything), {"serviceAccountName": "sa"}, {"securityContext": {"capabilities": {"add": ["SYS_CHROOT"]}}}
        ).capabilities
    )
