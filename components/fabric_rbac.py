"""Read access to the environment's own pods, for rack-aware ranks (fabricCheck.nodeRacks).

Each pod orders the ranks from the pods' spec.nodeName (docs/operate/fabric-check.md), read through the
Kubernetes API with the pods' service account: a namespaced Role with get/list on pods, nothing else.
Created only when nodeRacks is set, so stacks without it keep exactly their objects.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from stacks.config import StackConfig


def pod_reader(name: str, config: StackConfig, labels: dict[str, str], opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    if not config.fabric_check.node_racks:
        return []
    app, ns = config.cluster.app_name, config.cluster.namespace
    meta = k8s.meta.v1.ObjectMetaArgs(name=f"{app}-pod-reader", namespace=ns, labels=labels)
    role = k8s.rbac.v1.Role(
        f"{name}-pod-reader",
        metadata=meta,
        rules=[k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
        opts=opts,
    )
    binding = k8s.rbac.v1.RoleBinding(
        f"{name}-pod-reader",
        metadata=meta,
        role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=f"{app}-pod-reader"),
        subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=config.security.service_account, namespace=ns)],
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[role])),
    )
    return [role, binding]
