"""Policy 4: persistent data retained."""

from __future__ import annotations

from collections.abc import Iterator

from .query import MANDATORY, PolicySpec, Resource, _m, _seq, is_unknown

# -------------------------------------------------------------------- 4. persistent data retained


def check_persistent_data_retained(res: Resource) -> Iterator[str]:
    if not res.is_kubernetes or res.is_patch:
        return
    if res.kind in ("PersistentVolumeClaim", "Namespace") and res.group == "":
        retain, protect = res.options.get("retain_on_delete"), res.options.get("protect")
        if protect is True or retain is True or retain is None:
            return  # None: the caller can't see retainOnDelete (the policy-pack protocol doesn't carry it)
        what = "its claims' data" if res.kind == "PersistentVolumeClaim" else "every PVC in it"
        yield (
            f"is deleted by `pulumi destroy` (and by a replacement), which deletes {what}. Fix: create it with "
            "`opts=pulumi.ResourceOptions(retain_on_delete=True)` (or protect=True) so the data outlives the stack."
        )
    elif res.kind == "StatefulSet":
        templates = res.spec.get("volumeClaimTemplates")
        if is_unknown(templates) or not _seq(templates):
            return
        policy = _m(res.spec.get("persistentVolumeClaimRetentionPolicy"))
        wrong = {k: policy.get(k) for k in ("whenDeleted", "whenScaled") if policy.get(k) != "Retain" and not is_unknown(policy.get(k))}
        if wrong:
            shown = ", ".join(f"{k}={v!r}" if v is not None else f"{k} unset" for k, v in wrong.items())
            yield (
                f"has volumeClaimTemplates but persistentVolumeClaimRetentionPolicy {shown}. Fix: set "
                "spec.persistentVolumeClaimRetentionPolicy {whenDeleted: Retain, whenScaled: Retain} explicitly, so "
                "per-pod claims survive deletion/replacement of the StatefulSet and a smaller pod count."
            )


POLICY = PolicySpec(
    "persistent-data-retained",
    MANDATORY,
    "resource",
    "Data survives `pulumi destroy` and replacements: PersistentVolumeClaims and a created Namespace are "
    "retain_on_delete (or protected); StatefulSets with volumeClaimTemplates set "
    "persistentVolumeClaimRetentionPolicy whenDeleted/whenScaled: Retain. (The policy-pack protocol does not "
    "carry retainOnDelete, so `pulumi preview --policy-pack` checks protect and the StatefulSet policy; "
    "`make render` checks retain_on_delete.)",
    "Create claims and namespaces with ResourceOptions(retain_on_delete=True); set the StatefulSet's "
    "persistentVolumeClaimRetentionPolicy to Retain/Retain.",
    check_persistent_data_retained,
    order=4,
)
