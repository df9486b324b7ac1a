"""Behaviour of the GPU cluster, asserted on the inputs the program registers (recording mocks)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core import nccl
from tests.conftest import tcp_shared_variant
from tools.mock_engine import RunResult

STS = "kubernetes:apps/v1:StatefulSet"
SVC = "kubernetes:core/v1:Service"
ROUTE = "kubernetes:route.openshift.io/v1:Route"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
SCC = "kubernetes:security.openshift.io/v1:SecurityContextConstraints"
ROLEBINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CONFIGMAP = "kubernetes:core/v1:ConfigMap"

BARCELONA_NODES = [
    "moc-r4pcc02u17-nairr",
    "moc-r4pcc02u18-nairr",
    "moc-r4pcc02u25-nairr",
    "moc-r4pcc02u15-yunshi",
    "moc-r4pcc02u16-yunshi",
]


def pod_spec(result: RunResult) -> dict[str, Any]:
    return result.one(STS).inputs["spec"]["template"]["spec"]


def container(result: RunResult, name: str = "ml-dev") -> dict[str, Any]:
    return next(c for c in pod_spec(result)["containers"] if c["name"] == name)


def env(result: RunResult) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(result)["env"]}


@pytest.fixture(scope="module")
def barcelona() -> RunResult:
    from tests.conftest import run_objects, stack_objects

    result = run_objects("barcelona", stack_objects("barcelona"))
    assert result.error is None, result.error
    return result


@pytest.fixture(scope="module")
def nerc() -> RunResult:
    from tests.conftest import run_objects, stack_objects

    result = run_objects("nerc-production", stack_objects("nerc-production"))
    assert result.error is None, result.error
    return result


# ---------------------------------------------------------------------------------------- barcelona


def test_barcelona_statefulset_identity_and_scheduling(barcelona: RunResult) -> None:
    sts = barcelona.one(STS).inputs
    assert sts["metadata"] == sts["metadata"] | {"name": "ml-dev-env", "namespace": "nccl-test"}
    spec = sts["spec"]
    assert spec["replicas"] == 2
    assert spec["serviceName"] == "ml-dev-env-headless"
    assert spec["podManagementPolicy"] == "Parallel"
    pod = spec["template"]["spec"]
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [{"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"}]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": BARCELONA_NODES}]}]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["serviceAccountName"] == "ml-dev-sa"


def test_barcelona_gpu_and_cpu_resources(barcelona: RunResult) -> None:
    res = container(barcelona)["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "4"
    assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("32", "128Gi")
    assert (res["limits"]["cpu"], res["limits"]["memory"]) == ("64", "256Gi")
    volumes = {v["name"]: v for v in pod_spec(barcelona)["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}


def test_barcelona_rdma_attachments_and_sriov_resources(barcelona: RunResult) -> None:
    annotations = barcelona.one(STS).inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotations["k8s.v1.cni.cncf.io/networks"] == (
        "nccl-test/eno5np0-network, nccl-test/eno6np0-network, nccl-test/eno7np0-network, nccl-test/eno8np0-network"
    )
    res = container(barcelona)["resources"]
    for nic in ("eno5np0", "eno6np0", "eno7np0", "eno8np0"):
        assert res["requests"][f"openshift.io/{nic}rdma"] == res["limits"][f"openshift.io/{nic}rdma"] == "1"


def test_barcelona_full_validated_nccl_set(barcelona: RunResult) -> None:
    e = env(barcelona)
    validated = {
        "NCCL_IB_HCA": "mlx5_6,mlx5_7,mlx5_8,mlx5_9",
        "NCCL_SOCKET_IFNAME": "net1,net2,net3,net4",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_NET_GDR_LEVEL": "5",
        "NCCL_CROSS_NIC": "0",
        "NCCL_DMABUF_ENABLE": "1",
        "NCCL_MIN_NCHANNELS": "8",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_IB_TIMEOUT": "23",
        "NCCL_IB_RETRY_CNT": "7",
        "NCCL_IB_TC": "106",
        "NCCL_NET_GDR_READ": "1",
        "NCCL_IB_SL": "0",
        "NCCL_IB_AR_THRESHOLD": "8192",
        "NCCL_IB_PCI_RELAXED_ORDERING": "1",
        "NCCL_PROTO": "Simple",
        "NCCL_ALGO": "Ring",
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_NTHREADS": "640",
        "NCCL_LL_THRESHOLD": "0",
        "NCCL_TREE_THRESHOLD": "0",
        "NCCL_SOCKET_FAMILY": "4",
        "NCCL_NSOCKS_PERTHREAD": "8",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_NET_SHARED_BUFFERS": "1",
        "NCCL_NET_OVERHEAD": "0",
        "NCCL_IGNORE_CPU_AFFINITY": "1",
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_IB_DISABLE": "0",
        "NCCL_DEBUG": "INFO",
    }
    assert {k: e.get(k) for k in validated} == validated


def cluster_env(result: RunResult) -> dict[str, str]:
    data = result.one(CONFIGMAP, "gpu-cluster").inputs["data"]["cluster.env"]
    return dict(line.split("=", 1) for line in data.splitlines())


def test_rank_wiring_comes_from_the_cluster_configmap(barcelona: RunResult) -> None:
    """No rank or count value in the pod template: they are in `<app>-cluster`, mounted as a directory."""
    e = env(barcelona)
    for name in (
        "NODE_RANK",
        "NNODES",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "DEEPSPEED_HOSTFILE",
    ):
        assert name not in e, name
    for name, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"), ("POD_IP", "status.podIP")):
        assert e[name] == {"fieldRef": {"fieldPath": path}}
    cm = barcelona.one(CONFIGMAP, "gpu-cluster").inputs
    assert cm["metadata"]["name"] == "ml-dev-env-cluster"
    assert cluster_env(barcelona) == {
        "NNODES": "2",
        "GPUS_PER_NODE": "4",
        "APP_NAME": "ml-dev-env",
        "HEADLESS_SERVICE": "ml-dev-env-headless",
        "POD_NAMESPACE": "nccl-test",
        "MASTER_PORT": "29500",
    }
    volume = next(v for v in pod_spec(barcelona)["volumes"] if v.get("configMap", {}).get("name") == "ml-dev-env-cluster")
    mounts = [m for m in container(barcelona)["volumeMounts"] if m["name"] == volume["name"]]
    # a directory mount: the kubelet updates it in place (a subPath mount never sees an update)
    assert mounts == [{"name": volume["name"], "mountPath": "/etc/ml-dev-env/cluster", "readOnly": True}]
    assert e["ML_DEV_CLUSTER_DIR"] == "/etc/ml-dev-env/cluster"
    assert not [m for c in pod_spec(barcelona)["containers"] for m in c.get("volumeMounts", []) if "subPath" in m]


def statefulset_template(result: RunResult) -> str:
    return json.dumps(result.one(STS).inputs["spec"]["template"], sort_keys=True)


def test_pod_template_is_identical_for_count_n_and_n_plus_1(barcelona: RunResult, run) -> None:
    """`nodes.count` 2 → 3 must not roll the pods: only `replicas` and the cluster ConfigMap change."""
    three = run("barcelona", lambda o: o["nodes"].update(count=3))
    assert three.error is None, three.error
    assert statefulset_template(three) == statefulset_template(barcelona)
    assert (barcelona.one(STS).inputs["spec"]["replicas"], three.one(STS).inputs["spec"]["replicas"]) == (2, 3)
    assert (cluster_env(barcelona)["NNODES"], cluster_env(three)["NNODES"]) == ("2", "3")
    # the StatefulSet is updated after the ConfigMap, so new pods read the new count
    assert "gpu-cluster" in [urn.rsplit("::", 1)[-1] for urn in three.one(STS).options["dependencies"]]


def test_home_is_on_a_persistent_volume_per_pod(barcelona: RunResult, nerc: RunResult, run) -> None:
    e = env(barcelona)
    names = [x["name"] for x in container(barcelona)["env"]]
    # `$(POD_NAME)` and `$(ML_DEV_HOME)` only expand when defined earlier in the list
    assert names.index("POD_NAME") < names.index("ML_DEV_HOME") < names.index("HOME")
    assert (e["ML_DEV_HOME"], e["HOME"]) == ("/workspace/.home/$(POD_NAME)", "$(ML_DEV_HOME)")
    assert "workspace" in [t["metadata"]["name"] for t in barcelona.one(STS).inputs["spec"]["volumeClaimTemplates"]]
    assert e["ENV"] == "/tmp/ml-dev-env/env.sh"  # `oc rsh` runs /bin/sh, which reads $ENV
    # only shared volumes: the shared workspace
    assert env(nerc)["ML_DEV_HOME"] == "/workspace/.home/$(POD_NAME)"

    def per_pod_scratch(o: dict[str, Any]) -> None:
        o["storage"] = {
            "mode": "hybrid",
            "volumes": [
                {"name": "workspace", "mountPath": "/workspace", "size": "100Gi", "scope": "shared", "storageClass": "nfs-csi"},
                {"name": "scratch", "mountPath": "/scratch", "size": "100Gi", "scope": "per-pod"},
            ],
        }

    assert env(run("barcelona", per_pod_scratch))["ML_DEV_HOME"] == "/scratch/.home/$(POD_NAME)"


def test_memlock_through_declared_scc_binding(barcelona: RunResult) -> None:
    assert container(barcelona)["securityContext"] == {"runAsUser": 0, "capabilities": {"add": ["IPC_LOCK", "SYS_RESOURCE", "SYS_CHROOT"]}}
    assert env(barcelona)["ML_DEV_MEMLOCK"] == "scc"
    scc = barcelona.one(SCC).inputs
    assert scc["metadata"]["name"] == "nccl-rdma-scc-nccl-test-ml-dev-env"  # per stack: SCCs are cluster-scoped
    assert scc["allowedCapabilities"] == ["IPC_LOCK", "SYS_RESOURCE", "SYS_CHROOT"]
    assert scc["allowPrivilegedContainer"] is False and scc["allowHostNetwork"] is False
    assert scc["seccompProfiles"] == ["runtime/default"]  # the pods ask for RuntimeDefault
    binding = barcelona.one(ROLEBINDING, "gpu-scc-binding").inputs
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "system:openshift:scc:nccl-rdma-scc-nccl-test-ml-dev-env",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ml-dev-sa", "namespace": "nccl-test"}]
    assert binding["metadata"]["name"] == "ml-dev-env-scc-nccl-rdma-scc"
    role = barcelona.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "gpu-scc-role").inputs
    assert role["metadata"]["name"] == binding["roleRef"]["name"]
    assert role["rules"] == [
        {
            "apiGroups": ["security.openshift.io"],
            "resources": ["securitycontextconstraints"],
            "resourceNames": [scc["metadata"]["name"]],
            "verbs": ["use"],
        }
    ]


def cluster_scoped(result: RunResult) -> set[tuple[str, str]]:
    """(type, name) of every rendered Kubernetes object without a namespace."""
    return {
        (r.typ, r.inputs["metadata"]["name"])
        for r in result.resources
        if r.typ.startswith("kubernetes:") and isinstance(r.inputs.get("metadata"), dict) and "namespace" not in r.inputs["metadata"]
    }


def test_two_environments_in_one_cluster_have_disjoint_cluster_scoped_names(barcelona: RunResult, run) -> None:
    def second_user(o: dict[str, Any]) -> None:
        o["cluster"].update(namespace="alice-dev", appName="alice-env")

    other = run("barcelona", second_user)
    assert other.error is None, other.error
    mine, theirs = cluster_scoped(barcelona), cluster_scoped(other)
    assert (SCC, "nccl-rdma-scc-nccl-test-ml-dev-env") in mine and (SCC, "nccl-rdma-scc-alice-dev-alice-env") in theirs
    assert mine.isdisjoint(theirs), mine & theirs

    # the same holds with the namespace created by each stack
    def second_user_creating_namespace(o: dict[str, Any]) -> None:
        second_user(o)
        o["cluster"].update(createNamespace=True)

    created = run("barcelona", second_user_creating_namespace)
    assert cluster_scoped(created).isdisjoint(cluster_scoped(run("barcelona", lambda o: o["cluster"].update(createNamespace=True))))


def test_long_scc_names_stay_dns_subdomains() -> None:
    from core.naming import DNS_SUBDOMAIN, stack_scc_name

    long_a, long_b = stack_scc_name("s" * 250, "team-a", "app"), stack_scc_name("s" * 250, "team-b", "app")
    assert DNS_SUBDOMAIN.match(long_a) and DNS_SUBDOMAIN.match(long_b) and long_a != long_b


def test_attachments_in_another_namespace_warn(run) -> None:
    result = run("barcelona", lambda o: o["network"]["rdma"].update(attachmentNamespace="shared-nics"))
    assert result.error is None, result.error
    assert any("network.rdma.attachmentNamespace 'shared-nics'" in w and "nccl-test" in w for w in result.warnings), result.warnings
    same = run("barcelona", lambda o: o["network"]["rdma"].update(attachmentNamespace="nccl-test"))
    assert not any("attachmentNamespace" in w for w in same.warnings), same.warnings


def test_existing_scc_is_bound_not_created(run) -> None:
    def mutate(o: dict[str, Any]) -> None:
        o["security"]["memlock"]["createScc"] = False

    result = run("barcelona", mutate)
    assert result.of_type(SCC) == []
    assert result.one(ROLEBINDING, "gpu-scc-binding").inputs["roleRef"]["kind"] == "ClusterRole"
    assert result.one(ROLEBINDING, "gpu-scc-binding").inputs["roleRef"]["name"] == "system:openshift:scc:nccl-rdma-scc"


def test_privileged_memlock_binds_privileged_scc(run) -> None:
    result = run("barcelona", lambda o: o["security"].update(memlock={"mode": "privileged"}))
    assert container(result)["securityContext"] == {"privileged": True}
    assert result.one(ROLEBINDING, "gpu-scc-binding").inputs["roleRef"]["name"] == "system:openshift:scc:privileged"


def test_hca_autodetect_is_opt_in(run) -> None:
    def mutate(o: dict[str, Any]) -> None:
        o["network"]["rdma"]["hcaMode"] = "auto"
        o["network"]["rdma"]["hcas"] = []

    result = run("barcelona", mutate)
    assert "NCCL_IB_HCA" not in env(result)
    assert env(result)["ML_DEV_HCA_MODE"] == "auto"


def test_nccl_overrides_apply(run) -> None:
    result = run("barcelona", lambda o: o["network"].update(ncclEnv={"NCCL_DEBUG": "WARN", "NCCL_MIN_NCHANNELS": 4}))
    assert env(result)["NCCL_DEBUG"] == "WARN"
    assert env(result)["NCCL_MIN_NCHANNELS"] == "4"
    assert env(result)["NCCL_IB_TIMEOUT"] == nccl.GOLD_STANDARD["NCCL_IB_TIMEOUT"]


def test_created_attachments_have_distinct_subnets(run) -> None:
    def mutate(o: dict[str, Any]) -> None:
        o["network"]["rdma"]["createAttachments"] = True
        o["network"]["rdma"]["subnets"] = ["10.0.103.0/24", "10.0.104.0/24", "10.0.105.0/24", "10.0.106.0/24"]

    result = run("barcelona", mutate)
    nads = sorted(result.of_type("kubernetes:k8s.cni.cncf.io/v1:NetworkAttachmentDefinition"), key=lambda n: n.inputs["metadata"]["name"])
    assert [n.inputs["metadata"]["name"] for n in nads] == ["eno5np0-network", "eno6np0-network", "eno7np0-network", "eno8np0-network"]
    configs = [json.loads(n.inputs["spec"]["config"]) for n in nads]
    assert [c["ipam"]["range"] for c in configs] == ["10.0.103.0/24", "10.0.104.0/24", "10.0.105.0/24", "10.0.106.0/24"]
    assert {c["type"] for c in configs} == {"sriov"} and {c["mtu"] for c in configs} == {9000}
    assert nads[0].inputs["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/resourceName": "openshift.io/eno5np0rdma"}


# ------------------------------------------------------------------------------------- TCP / fallback


def assert_restricted(result: RunResult) -> None:
    pod = pod_spec(result)
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    for c in pod["containers"]:
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}, c["name"]
    assert "hostNetwork" not in pod and "hostIPC" not in pod
    # No SCC binding (the usage bindings grant only the recorder its record, pod list and the nodes' Leases, the pods
    # list reads).
    usage_bindings = ("gpu-usage-binding", "gpu-usage-reader", "gpu-usage-leases")
    assert [r for r in result.of_type(ROLEBINDING) if r.name.startswith("gpu-") and r.name not in usage_bindings] == []
    assert result.of_type(SCC) == []


def test_nerc_production_is_tcp_and_restricted(nerc: RunResult) -> None:
    e = env(nerc)
    assert nerc.outputs["network_mode"] == "tcp"
    assert (e["NCCL_IB_DISABLE"], e["NCCL_SOCKET_IFNAME"], e["NCCL_P2P_LEVEL"]) == ("1", "^lo,docker0", "NVL")
    assert "NCCL_IB_HCA" not in e
    assert "k8s.v1.cni.cncf.io/networks" not in nerc.one(STS).inputs["spec"]["template"]["metadata"]["annotations"]
    assert not any(k.startswith("openshift.io/") for k in container(nerc)["resources"]["limits"])
    assert "nodeAffinity" not in pod_spec(nerc)["affinity"]
    assert_restricted(nerc)


def test_tcp_shared_variant(run) -> None:
    result = run("barcelona", tcp_shared_variant)
    assert result.error is None, result.error
    assert result.outputs["network_mode"] == "tcp"
    assert_restricted(result)
    claims = {c.inputs["metadata"]["name"]: c.inputs["spec"] for c in result.of_type(PVC)}
    assert set(claims) == {"ml-dev-env-workspace", "ml-dev-env-datasets"}
    assert all(spec["accessModes"] == ["ReadWriteMany"] and spec["storageClassName"] == "nfs-csi" for spec in claims.values())
    assert "volumeClaimTemplates" not in result.one(STS).inputs["spec"]


def test_rdma_requested_where_disabled_falls_back_to_tcp(run) -> None:
    result = run("barcelona", lambda o: o["network"]["rdma"].update(enabled=False))
    assert result.outputs["network_mode"] == "tcp"
    assert any("falls back" in w or "deploying with TCP" in w for w in result.warnings), result.warnings
    assert env(result)["NCCL_IB_DISABLE"] == "1"
    assert_restricted(result)


# ---------------------------------------------------------------------------------------- storage


def test_hybrid_storage_barcelona(barcelona: RunResult) -> None:
    spec = barcelona.one(STS).inputs["spec"]
    vcts = {t["metadata"]["name"]: t["spec"] for t in spec["volumeClaimTemplates"]}
    assert set(vcts) == {"workspace", "checkpoints"}
    assert vcts["workspace"]["accessModes"] == ["ReadWriteOnce"]
    assert vcts["workspace"]["storageClassName"] == "ocs-external-storagecluster-ceph-rbd"
    assert vcts["checkpoints"]["resources"]["requests"]["storage"] == "200Gi"
    shared = barcelona.one(PVC).inputs
    assert shared["metadata"]["name"] == "ml-dev-env-datasets"
    assert shared["spec"]["accessModes"] == ["ReadWriteMany"] and shared["spec"]["storageClassName"] == "nfs-csi"
    mounts = {m["name"]: m["mountPath"] for m in container(barcelona)["volumeMounts"]}
    assert mounts == {
        "workspace": "/workspace",
        "checkpoints": "/checkpoints",
        "datasets": "/datasets",
        "dshm": "/dev/shm",
        "startup": "/opt/ml-dev-env",
        "cluster": "/etc/ml-dev-env/cluster",
        "lifecycle": "/etc/ml-dev-env/lifecycle",
        "ssh-keys": "/etc/ml-dev-env/ssh",
    }
    pod_volumes = {v["name"] for v in pod_spec(barcelona)["volumes"]}
    assert "datasets" in pod_volumes and "workspace" not in pod_volumes  # per-pod comes from the template


def test_data_survives_destroy_replace_and_scale(barcelona: RunResult, run) -> None:
    sts = barcelona.one(STS)
    assert sts.inputs["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert sts.options["delete_before_replace"] is True
    # pulls and start, and one termination grace per pod (a rolling update stops them one at a time); the builds
    # are awaited before the StatefulSet changes (tests/components/test_waits.py)
    grace = sts.inputs["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    stops = sts.inputs["spec"]["replicas"] * grace
    assert sts.inputs["metadata"]["annotations"]["pulumi.com/timeoutSeconds"] == str(1800 + stops)
    assert all(c.options["retain_on_delete"] for c in barcelona.of_type(PVC))
    created_ns = run("barcelona", lambda o: o["cluster"].update(createNamespace=True))
    namespace = created_ns.one("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["name"] == "nccl-test" and namespace.options["retain_on_delete"] is True


def test_per_pod_storage(run) -> None:
    def mutate(o: dict[str, Any]) -> None:
        o["storage"] = {"mode": "per-pod", "volumes": [{"name": "workspace", "mountPath": "/workspace", "size": "50Gi"}]}

    result = run("barcelona", mutate)
    assert result.of_type(PVC) == []
    templates = result.one(STS).inputs["spec"]["volumeClaimTemplates"]
    assert [t["metadata"]["name"] for t in templates] == ["workspace"]
    assert templates[0]["spec"]["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in templates[0]["spec"]


# ----------------------------------------------------------------------------------- access & auth


def test_pod0_service_and_edge_routes(barcelona: RunResult) -> None:
    dev = next(s.inputs for s in barcelona.of_type(SVC) if s.inputs["metadata"]["name"] == "ml-dev-env")
    assert dev["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == "ml-dev-env-0"
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in dev["spec"]["ports"]}
    assert ports == {
        "vscode": (8080, "p-vscode"),
        "jupyter": (8888, "p-jupyter"),
        "tensorboard": (6006, "p-tensorboard"),
        "home": (8090, "p-home"),
    }
    assert 5678 not in [p["port"] for s in barcelona.of_type(SVC) for p in s.inputs["spec"]["ports"]]
    routes = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in barcelona.of_type(ROUTE)}
    assert set(routes) == {"ml-dev-env-vscode", "ml-dev-env-jupyter", "ml-dev-env-tensorboard", "ml-dev-env-home"}
    for server, spec in ((n.rsplit("-", 1)[1], s) for n, s in routes.items()):
        assert spec["tls"] == {"termination": "edge", "insecureEdgeTerminationPolicy": "Redirect"}
        assert spec["to"]["name"] == "ml-dev-env" and spec["port"] == {"targetPort": server}
        assert barcelona.outputs[f"{server}_url"] == f"https://{spec['host']}"
    assert barcelona.outputs["vscode_url"] == "https://ml-dev-env-vscode-nccl-test.apps.barcelona.nerc.mghpcc.org"
    headless = next(s.inputs for s in barcelona.of_type(SVC) if s.inputs["metadata"]["name"] == "ml-dev-env-headless")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True


def test_every_route_reaches_an_oauth_proxy(barcelona: RunResult) -> None:
    """No route reaches an unauthenticated server: each targets a proxy port; servers bind loopback."""
    containers = {c["name"]: c for c in pod_spec(barcelona)["containers"]}
    dev = next(s.inputs for s in barcelona.of_type(SVC) if s.inputs["metadata"]["name"] == "ml-dev-env")
    for port in dev["spec"]["ports"]:
        owner = [c for c in containers.values() if any(p.get("name") == port["targetPort"] for p in c.get("ports", []))]
        assert len(owner) == 1 and owner[0]["name"].endswith("-proxy"), port
        args = owner[0]["args"]
        assert "--provider=openshift" in args and "--openshift-service-account=ml-dev-sa" in args
        assert any(a.startswith("--openshift-sar=") and '"namespace":"nccl-test"' in a for a in args)
        assert f"--upstream=http://127.0.0.1:{port['port']}" in args
    assert "ports" not in containers["ml-dev"] or {p["name"] for p in containers["ml-dev"]["ports"]} == {"master", "debug"}
    assert env(barcelona)["ML_DEV_AUTH"] == "oauth-proxy"
    sa = barcelona.one("kubernetes:core/v1:ServiceAccount", "gpu-sa").inputs
    refs = {k: json.loads(v) for k, v in sa["metadata"]["annotations"].items()}
    vscode_ref = refs["serviceaccounts.openshift.io/oauth-redirectreference.vscode"]
    assert vscode_ref["reference"] == {"kind": "Route", "name": "ml-dev-env-vscode"}
    cookie = barcelona.one("kubernetes:core/v1:Secret", "gpu-oauth-cookie").inputs
    assert cookie["stringData"] == {"cookie-secret": "REDACTED"}


def test_token_mode_uses_pulumi_secrets(run) -> None:
    def mutate(o: dict[str, Any]) -> None:
        o["access"] = {"auth": "token", "tensorboard": False}

    secrets = {"vscodePassword": "vs-s3cret-value", "jupyterToken": "jt-s3cret-value"}
    result = run("barcelona", mutate, secrets)
    assert result.error is None, result.error
    assert not [c for c in pod_spec(result)["containers"] if c["name"].endswith("-proxy")]
    e = env(result)
    assert e["PASSWORD"] == {"secretKeyRef": {"name": "ml-dev-env-dev-tokens", "key": "vscodePassword"}}
    assert e["JUPYTER_TOKEN"] == {"secretKeyRef": {"name": "ml-dev-env-dev-tokens", "key": "jupyterToken"}}
    assert result.of_type(ROUTE) and "tensorboard_url" in result.outputs and result.outputs["tensorboard_url"] == ""
    dump = json.dumps([r.inputs for r in result.resources]) + json.dumps(result.outputs)
    assert "s3cret-value" not in dump


def test_adopted_service_account_gets_oauth_annotations_by_patch(run) -> None:
    result = run("barcelona", lambda o: o["security"].update(createServiceAccount=False))
    # the pods' ServiceAccount is adopted, not created (the usage recorder's own one is)
    assert [r.name for r in result.of_type("kubernetes:core/v1:ServiceAccount") if r.name.startswith("gpu-")] == ["gpu-usage-sa"]
    patch = result.one("kubernetes:core/v1:ServiceAccountPatch").inputs
    assert patch["metadata"]["name"] == "ml-dev-sa"
    assert set(patch["metadata"]["annotations"]) == {
        f"serviceaccounts.openshift.io/oauth-redirectreference.{s}" for s in ("vscode", "jupyter", "tensorboard", "home")
    }


def test_outputs(barcelona: RunResult) -> None:
    out = barcelona.outputs
    assert set(out) >= {
        "vscode_url",
        "jupyter_url",
        "tensorboard_url",
        "master_addr",
        "pod_names",
        "world_size",
        "network_mode",
        "image",
        "shell_command",
        "port_forward_command",
    }
    assert out["shell_command"] == "oc rsh -n nccl-test -c ml-dev ml-dev-env-0"
    assert out["port_forward_command"] == "oc port-forward -n nccl-test pod/ml-dev-env-0 5678:5678"
    assert out["image"] == container(barcelona)["image"]
    assert out["network_mode"] == "rdma"


def test_startup_script_is_embedded_from_the_repository(barcelona: RunResult) -> None:
    from components.pod import STARTUP_SCRIPT, content_hash

    cm = barcelona.one(CONFIGMAP, "gpu-startup").inputs
    assert cm["data"]["startup.sh"] == STARTUP_SCRIPT.read_text()
    annotations = barcelona.one(STS).inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotations["ml-dev-env/startup-sha256"] == content_hash(STARTUP_SCRIPT.read_text())
    assert container(barcelona)["command"] == ["/bin/bash", "/opt/ml-dev-env/startup.sh"]
