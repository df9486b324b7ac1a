"""Upstream's rules beyond the schemas (policy/rules/kube_api.py), value by value as the API server decides them."""

from __future__ import annotations

from typing import Any

import pytest

from policy.rules import kube_api
from tools.schema_check import Leaf, key_hint


@pytest.mark.parametrize(
    ("rule", "accepted", "refused"),
    [
        (kube_api.dns1123_label, ["a", "0a", "a-b", "a" * 63], ["", "A", "a_b", "-a", "a-", "a.b", "a" * 64, "a b"]),
        (kube_api.dns1123_subdomain, ["a.b", "nfs-csi", "a" * 253], ["NFS_Client", "nfs_csi", "NFS-CSI", "a..b", "a" * 254, ""]),
        (kube_api.dns1035_label, ["a", "a-0"], ["1ml-dev", "0", "a" * 64, "A"]),
        (kube_api.qualified_name, ["app", "ml-dev-env/stack", "kueue.x-k8s.io/queue-name"], ["", "a/b/c", "/a", "Ab_/x", "a" * 64]),
        (kube_api.label_value, ["", "a", "A_b.c-d", "a" * 63], ["a" * 64, "a b", "-a", "a_"]),
        (kube_api.port_name, ["ssh", "http-8080", "a" * 15], ["a" * 16, "8080", "a--b", "-a", "A", "a_b"]),
        (kube_api.env_var_name, ["PATH", "my.env-name", "1X", "A B"], ["", "A=B", "é"]),
        (kube_api.config_key, ["a.sh", "cluster.env", "_x"], [".", "..", "..a", "a/b", "a b"]),
        (kube_api.path_segment_name, ["system:openshift:scc:x"], [".", "..", "a/b", "a%b"]),
        (kube_api.tekton_name, ["model-pipeline"], ["a.b", "a" * 64]),
    ],
)
def test_each_rule_accepts_and_refuses_what_upstream_does(rule: Any, accepted: list[str], refused: list[str]) -> None:
    assert {v: rule(v) for v in accepted if rule(v)} == {}
    assert all(rule(v) for v in refused), {v: rule(v) for v in refused if not rule(v)}


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "app", "labels": {"ml-dev-env/stack": "x"}},
        "spec": {
            "replicas": 2,
            "serviceName": "app",
            "selector": {"matchLabels": {"app": "app"}},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": {"containers": [{"name": "main", "image": "i:1"}], **spec}},
        },
    }


def test_pod_rules_name_the_field() -> None:
    sts = _pod(
        volumes=[{"name": "Data", "emptyDir": {}}, {"name": "x", "emptyDir": {"sizeLimit": "-1Gi"}}],
        initContainers=[{"name": "main", "image": "i:1"}],
    )
    main = sts["spec"]["template"]["spec"]["containers"][0]
    main["ports"] = [{"name": "tensorboard-http", "containerPort": 6006}]
    main["env"] = [{"name": "A=B", "value": "1"}]
    main["resources"] = {"requests": {"cpu": "2", "memory": "1x"}, "limits": {"cpu": "1"}}
    main["volumeMounts"] = [{"name": "missing", "mountPath": "/m"}]
    found = {(p.path, p.message.split(":")[0]) for p in kube_api.rule_problems(sts)}
    base = "spec.template.spec"
    assert (f"{base}.volumes[0].name", "volume name") in found
    assert any(path == f"{base}.volumes[1].emptyDir.sizeLimit" for path, _ in found)
    assert (f"{base}.containers[0].name", "Duplicate value") in found
    assert (f"{base}.containers[0].ports[0].name", "port name") in found
    assert (f"{base}.containers[0].env[0].name", "env var name") in found
    assert any(path == f"{base}.containers[0].resources.requests.memory" for path, _ in found)
    assert (f"{base}.containers[0].resources.requests.cpu", "must be less than or equal to cpu limit of 1") in found
    assert (f"{base}.containers[0].volumeMounts[0].name", "not found") in found


def test_names_per_kind() -> None:
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1ml-dev"}, "spec": {"ports": [{"port": 1}]}}
    assert [p.path for p in kube_api.problems(svc)] == ["metadata.name"]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "1ml-dev"}}
    assert kube_api.problems(cm) == []  # a DNS subdomain may start with a digit
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "system:openshift:scc:x"}, "rules": []}
    assert kube_api.problems(role) == []
    sts = _pod()
    sts["metadata"]["name"] = "a" * 62  # its pod a…a-1 is 64 characters: no hostname
    assert any("pod name" in p.message for p in kube_api.rule_problems(sts))


def test_labels_annotations_and_storage_class() -> None:
    pvc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "d", "labels": {"ml-dev-env/stack": "a" * 64}, "annotations": {"k": "x" * (256 * 1024)}},
        "spec": {"storageClassName": "NFS_Client", "resources": {"requests": {"storage": "1Gi"}}},
    }
    paths = [p.path for p in kube_api.problems(pvc)]
    assert paths == ["metadata.labels.ml-dev-env/stack", "metadata.annotations", "spec.storageClassName"]


def test_key_hint_names_the_key_or_the_stack() -> None:
    leaves = [Leaf("Pulumi.b.yaml", "ml-dev-env:cluster.appName", "1ml-dev"), Leaf("Pulumi.b.yaml", "ml-dev-env:x.y", "ab")]
    assert key_hint("1ml-dev-headless", leaves) == "from ml-dev-env:cluster.appName: '1ml-dev' in Pulumi.b.yaml"
    assert key_hint("zz", leaves) == ""
    assert key_hint("q" * 70, leaves, "q" * 70, "Pulumi.q.yaml").startswith("from the stack name")
