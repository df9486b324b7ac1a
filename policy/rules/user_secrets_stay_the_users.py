"""Policy rule: the user's Secrets (env.secrets) are named by the stack, never created, read or copied by it.

A workload declares the Secrets it mounts for the user in its pod-template annotation `ml-dev-env/user-secrets`
(comma-separated names; components/pod.py USER_SECRETS_ANNOTATION). The stack holds their names only: no resource of
the stack is a Secret of such a name (creating one would put the value in the stack's config and state; a `get`
would read it into the state), no container takes one into its environment (env valueFrom.secretKeyRef, envFrom
secretRef: the value would be copied into session.env and every process's environ), and each such volume is
mounted read-only, without subPath (a rotated Secret reaches the running pods), and not world-readable.
Policy `user-secrets-stay-the-users` (`POLICY` below).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from .query import MANDATORY, PolicySpec, Resource, _m, _same_ns, _seq, _str, _workloads, container_likes, pod_containers
from .ssh_only_from_stack_pods import _template_annotations

USER_SECRETS_ANNOTATION = "ml-dev-env/user-secrets"


def _declared(resources: Sequence[Resource]) -> list[tuple[Resource, Mapping[str, object], set[str]]]:
    out = []
    for workload in _workloads(resources):
        raw = _str(_template_annotations(workload.res).get(USER_SECRETS_ANNOTATION)) or ""
        names = {n.strip() for n in raw.split(",") if n.strip()}
        if names:
            out.append((workload.res, workload.spec, names))
    return out


def _refs(container: Mapping[str, object]) -> Iterator[tuple[str, str]]:
    """(how, Secret name) of every Secret a container takes into its environment."""
    for env in _seq(container.get("env")):
        ref = _m(_m(_m(env).get("valueFrom")).get("secretKeyRef"))
        if _str(ref.get("name")):
            yield f"env {_str(_m(env).get('name'))} valueFrom.secretKeyRef", str(ref["name"])
    for source in _seq(container.get("envFrom")):
        ref = _m(_m(source).get("secretRef"))
        if _str(ref.get("name")):
            yield "envFrom.secretRef", str(ref["name"])


def check_user_secrets(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    declared = _declared(resources)
    for owner, spec, names in declared:
        for res in resources:
            if res.kind == "Secret" and res.name in names and _same_ns(res.namespace, owner.namespace):
                yield (
                    res,
                    f"Secret {res.name} is one of the user's (env.secrets of {owner.label}): the stack must never create or read "
                    "it (its value would be in the stack's config and state). Fix: drop this resource; the user creates it with "
                    "`oc create secret generic`.",
                )
            for where, container in container_likes(res):
                for how, name in _refs(container):
                    if name in names and _same_ns(res.namespace, owner.namespace):
                        yield (
                            res,
                            f"{where} {how} takes the user's Secret {name} into a container env (copied into session.env and "
                            "every process's environ). Fix: leave it to the env.secrets volume, read where a rank starts.",
                        )
        volumes = {
            _str(_m(v).get("name")): _m(_m(v).get("secret"))
            for v in _seq(spec.get("volumes"))
            if _str(_m(_m(v).get("secret")).get("secretName")) in names
        }
        for volume, source in volumes.items():
            mode = source.get("defaultMode", 0o644)
            if not isinstance(mode, int) or mode & 0o007:
                yield owner, f"volume {volume} (Secret {source.get('secretName')}): defaultMode {mode!r} is world-readable. Fix: 0440."
            for item in _seq(source.get("items")):
                item_mode = _m(item).get("mode")
                if isinstance(item_mode, int) and item_mode & 0o007:
                    yield owner, f"volume {volume}: item {_m(item).get('key')} mode {oct(item_mode)} is world-readable. Fix: no item mode."
        for container in pod_containers(spec):
            for mount in _seq(container.get("volumeMounts")):
                m = _m(mount)
                if _str(m.get("name")) not in volumes:
                    continue
                if m.get("subPath") or m.get("subPathExpr"):
                    yield (
                        owner,
                        f"mount {m.get('mountPath')} of {m.get('name')} uses subPath: a rotated Secret never reaches it. "
                        "Fix: mount the volume as a directory.",
                    )
                if m.get("readOnly") is not True:
                    yield owner, f"mount {m.get('mountPath')} of {m.get('name')} is not readOnly. Fix: readOnly: true."


POLICY = PolicySpec(
    "user-secrets-stay-the-users",
    MANDATORY,
    "stack",
    "The Secrets a workload mounts for its user (pod-template annotation ml-dev-env/user-secrets, from env.secrets) are "
    "never created or read by the stack nor taken into a container env; their volumes are read-only, without subPath "
    "and not world-readable.",
    "Name the user's Secrets in env.secrets only (components/pod.py user_secret_volumes): one read-only volume each, "
    "defaultMode 0440, no subPath; the user creates the Secret with `oc create secret generic`.",
    check_user_secrets,
    order=13,
)
