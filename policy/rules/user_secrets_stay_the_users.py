"""Policy rule: the user's Secrets (env.secrets) are named by the stack, never created, read or copied by it.

Which Secrets are the user's is read from the objects, whatever the annotations say: every Secret a resource refers
to (a container's env valueFrom.secretKeyRef or envFrom.secretRef, a `secret` volume, a `projected` volume's secret
source, anywhere: containers, init containers, sidecars, Tekton steps) that no resource of the stack creates in its
namespace is one the user made, and so is every name a workload declares in its pod-template annotation
`ml-dev-env/user-secrets` (components/pod.py USER_SECRETS_ANNOTATION). The stack holds their names only:

* no resource of the stack is a Secret of a declared name (creating one would put the value in the stack's config
  and state; a `get` would read it into the state);
* no container of any kind takes one into its environment (env, envFrom: the value would be copied into
  session.env and every process's environ);
* no projected volume holds one (the stack mounts a user's Secret only as its own `secret` volume);
* each such volume is mounted only by the workload's main container, its first (components/pod.py puts it first;
  never an init container or a sidecar), read-only, without subPath (a rotated Secret reaches the running pods),
  and not world-readable.
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


def _volume_refs(spec: Mapping[str, object]) -> Iterator[tuple[str, str, str]]:
    """(volume, kind `secret`/`projected`, Secret name) of every Secret a pod spec's volumes hold."""
    for v in _seq(spec.get("volumes")):
        name = _str(_m(v).get("name")) or "?"
        secret = _str(_m(_m(v).get("secret")).get("secretName"))
        if secret:
            yield name, "secret", secret
        for source in _seq(_m(_m(v).get("projected")).get("sources")):
            projected = _str(_m(_m(source).get("secret")).get("name"))
            if projected:
                yield name, "projected", projected


def user_secrets(resources: Sequence[Resource]) -> dict[str | None, set[str]]:
    """{namespace: names} of the user's Secrets: referred to and not created by the stack there, or declared."""
    created = {(res.namespace, res.name) for res in resources if res.kind == "Secret"}
    out: dict[str | None, set[str]] = {}

    def mine(namespace: str | None, name: str) -> bool:
        return any(n == name and _same_ns(ns, namespace) for ns, n in created)

    for res in resources:
        names = {name for _, container in container_likes(res) for _, name in _refs(container)}
        for workload in _workloads([res]):
            names |= {name for _, _, name in _volume_refs(workload.spec)}
        out.setdefault(res.namespace, set()).update(n for n in names if not mine(res.namespace, n))
    for owner, _, declared in _declared(resources):
        out.setdefault(owner.namespace, set()).update(declared)
    return out


def _of(users: Mapping[str | None, set[str]], namespace: str | None) -> set[str]:
    return {n for ns, names in users.items() if _same_ns(ns, namespace) for n in names}


def check_user_secrets(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    users = user_secrets(resources)
    for owner, spec, declared in _declared(resources):
        for res in resources:
            if res.kind == "Secret" and res.name in declared and _same_ns(res.namespace, owner.namespace):
                yield (
                    res,
                    f"Secret {res.name} is one of the user's (env.secrets of {owner.label}): the stack must never create or read "
                    "it (its value would be in the stack's config and state). Fix: drop this resource; the user creates it with "
                    "`oc create secret generic`.",
                )
        names = _of(users, owner.namespace)
        volumes: dict[str, Mapping[str, object]] = {}
        for volume, kind, name in _volume_refs(spec):
            if name not in names:
                continue
            if kind == "projected":
                yield (
                    owner,
                    f"volume {volume} projects the user's Secret {name}. Fix: leave it to the env.secrets volume (one `secret` "
                    "volume per Secret, read-only in the main container).",
                )
                continue
            volumes[volume] = next(_m(_m(v).get("secret")) for v in _seq(spec.get("volumes")) if _str(_m(v).get("name")) == volume)
        for volume, source in volumes.items():
            mode = source.get("defaultMode", 0o644)
            if not isinstance(mode, int) or mode & 0o007:
                yield owner, f"volume {volume} (Secret {source.get('secretName')}): defaultMode {mode!r} is world-readable. Fix: 0440."
            for item in _seq(source.get("items")):
                item_mode = _m(item).get("mode")
                if isinstance(item_mode, int) and item_mode & 0o007:
                    yield owner, f"volume {volume}: item {_m(item).get('key')} mode {oct(item_mode)} is world-readable. Fix: no item mode."
        main = next(iter(_seq(spec.get("containers"))), None)
        for container in pod_containers(spec):
            for mount in _seq(container.get("volumeMounts")):
                m = _m(mount)
                if _str(m.get("name")) not in volumes:
                    continue
                if container is not main:
                    yield (
                        owner,
                        f"container {_str(container.get('name'))} mounts {m.get('name')}, the user's Secret "
                        f"{volumes[str(m.get('name'))].get('secretName')}: only the main container (the first) may. Fix: "
                        "drop the mount from this container.",
                    )
                if m.get("subPath") or m.get("subPathExpr"):
                    yield (
                        owner,
                        f"mount {m.get('mountPath')} of {m.get('name')} uses subPath: a rotated Secret never reaches it. "
                        "Fix: mount the volume as a directory.",
                    )
                if m.get("readOnly") is not True:
                    yield owner, f"mount {m.get('mountPath')} of {m.get('name')} is not readOnly. Fix: readOnly: true."
    for res in resources:
        names = _of(users, res.namespace)
        for where, container in container_likes(res):
            for how, name in _refs(container):
                if name in names:
                    yield (
                        res,
                        f"{where} {how} takes the user's Secret {name} into a container env (copied into session.env and "
                        "every process's environ). Fix: leave it to the env.secrets volume, read where a rank starts.",
                    )


POLICY = PolicySpec(
    "user-secrets-stay-the-users",
    MANDATORY,
    "stack",
    "The user's Secrets (those a resource refers to and the stack does not create, and those a workload declares in its "
    "pod-template annotation ml-dev-env/user-secrets) are never created or read by the stack nor taken into a container "
    "env or a projected volume; their volumes are mounted by the main container only, read-only, without subPath and not "
    "world-readable.",
    "Name the user's Secrets in env.secrets only (components/pod.py user_secret_volumes): one read-only volume each, "
    "defaultMode 0440, no subPath; the user creates the Secret with `oc create secret generic`.",
    check_user_secrets,
    order=13,
)
