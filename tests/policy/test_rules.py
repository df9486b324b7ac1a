"""Each policy fires on a crafted bad object (with a message that says how to fix it) and stays quiet
on the near miss that is fine."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from policy import rules
from policy.rules import Violation, evaluate, format_report
from tests.policy.objects import (
    NS,
    UNKNOWN,
    Item,
    config_map,
    container,
    deployment,
    item,
    meta,
    oauth_proxy,
    route,
    scc,
    scc_binding,
    scc_role,
    service,
    statefulset,
    step,
    tekton,
    with_env,
)

HF_TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gH3"
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"


def run(policy: str, *items: Item) -> list[Violation]:
    return evaluate(items, policies=[policy])


def messages(policy: str, *items: Item) -> list[str]:
    return [v.message for v in run(policy, *items)]


def one(policy: str, *items: Item) -> Violation:
    found = run(policy, *items)
    assert len(found) == 1, found
    return found[0]


# ---------------------------------------------------------------------------------------- routes

WEB = [{"name": "web", "port": 8080, "targetPort": "p-web"}]


def proxied_app() -> list[Item]:
    return [statefulset("app", [container("server"), oauth_proxy()]), service("app", {"app": "app"}, WEB)]


def test_route_to_oauth_proxy_port_is_quiet() -> None:
    assert run("routes-require-authentication", *proxied_app(), route("app", "app", "web")) == []


def test_route_to_plain_server_fires_with_the_resolved_chain() -> None:
    sts = statefulset("app", [container("server", ports=[{"name": "http", "containerPort": 8000}])])
    found = one(
        "routes-require-authentication",
        sts,
        service("app", {"app": "app"}, [{"name": "web", "port": 80, "targetPort": "http"}]),
        route("app", "app", "web"),
    )
    assert found.level == "mandatory" and found.resource == f"Route {NS}/app"
    assert "Service app port web -> StatefulSet team/app port 'http'" in found.message
    assert "container 'server' is neither an OpenShift OAuth proxy" in found.message
    assert "Fix: route only to the named port of an OpenShift OAuth proxy" in found.message


def test_proxy_without_openshift_provider_is_not_a_proxy() -> None:
    proxy = oauth_proxy()
    proxy["args"] = ["--provider=github", "--http-address=:18080"]
    sts = statefulset("app", [container("server"), proxy])
    assert messages("routes-require-authentication", sts, service("app", {"app": "app"}, WEB), route("app", "app", "web"))


def test_provider_flag_as_two_arguments_counts() -> None:
    proxy = oauth_proxy()
    proxy["args"] = ["--provider", "openshift"]
    assert not run(
        "routes-require-authentication", statefulset("app", [proxy]), service("app", {"app": "app"}, WEB), route("app", "app", "web")
    )


def _token_server(env: list[dict[str, Any]], port_name: str = "vscode", number: int = 8080) -> list[Item]:
    server = container("ml-dev", env=env, ports=[{"name": port_name, "containerPort": number}])
    return [statefulset("app", [server]), service("app", {"app": "app"}, [{"name": port_name, "port": number, "targetPort": port_name}])]


def test_code_server_with_password_from_secret_is_quiet() -> None:
    env = [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "app-dev-tokens", "key": "vscodePassword"}}}]
    assert run("routes-require-authentication", *_token_server(env), route("app", "app", "vscode")) == []


def test_code_server_with_literal_password_fires_twice() -> None:
    items = [*_token_server([{"name": "PASSWORD", "value": "hunter2hunter2"}]), route("app", "app", "vscode")]
    assert (
        "is code-server without its own credential (no HASHED_PASSWORD or PASSWORD from a valueFrom.secretKeyRef)"
        in one("routes-require-authentication", *items).message
    )
    assert "sets a credential-named variable from a literal value" in one("no-plaintext-credentials", *items).message


def test_jupyter_needs_its_own_token() -> None:
    env = [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "t", "key": "vscodePassword"}}}]
    found = one("routes-require-authentication", *_token_server(env, "jupyter", 8888), route("app", "app", "jupyter"))
    assert "is Jupyter without its own credential (no JUPYTER_TOKEN" in found.message
    env = [{"name": "JUPYTER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "jupyterToken"}}}]
    assert not run("routes-require-authentication", *_token_server(env, "jupyter", 8888), route("app", "app", "jupyter"))


def test_tensorboard_never_counts_as_self_authenticated() -> None:
    env = [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}}]
    found = one("routes-require-authentication", *_token_server(env, "tensorboard", 6006), route("app", "app", "tensorboard"))
    assert "neither an OpenShift OAuth proxy" in found.message


def test_route_to_a_service_the_stack_does_not_create_fires() -> None:
    found = one("routes-require-authentication", *proxied_app(), route("other", "elsewhere", "web"))
    assert "targets Service 'elsewhere', which this stack does not create" in found.message


def test_route_port_matching_no_service_port_has_no_backend() -> None:
    found = one("routes-require-authentication", *proxied_app(), route("app", "app", "nope"))
    assert "port 'nope' matches no port of Service 'app', so the route has no backend" in found.message


def test_service_selecting_nothing_fires() -> None:
    items = [statefulset("app", [oauth_proxy()]), service("app", {"app": "other"}, WEB), route("app", "app", "web")]
    assert "selects no pod template of this stack" in one("routes-require-authentication", *items).message


def test_service_without_selector_fires() -> None:
    items = [statefulset("app", [oauth_proxy()]), service("app", None, WEB), route("app", "app", "web")]
    assert "has no pod selector" in one("routes-require-authentication", *items).message


def test_pod_name_selector_resolves_to_an_existing_ordinal_only() -> None:
    ok = service("app", {"app": "app", "statefulset.kubernetes.io/pod-name": "app-0"}, WEB)
    assert not run("routes-require-authentication", statefulset("app", [oauth_proxy()]), ok, route("app", "app", "web"))
    beyond = service("app", {"app": "app", "statefulset.kubernetes.io/pod-name": "app-5"}, WEB)
    assert messages("routes-require-authentication", statefulset("app", [oauth_proxy()], replicas=2), beyond, route("app", "app", "web"))


def test_named_target_port_no_container_declares_has_no_backend() -> None:
    items = [statefulset("app", [container("server")]), service("app", {"app": "app"}, WEB), route("app", "app", "web")]
    assert "no container has a port named 'p-web', so the route has no backend" in one("routes-require-authentication", *items).message


def test_numeric_port_nobody_declares_fires() -> None:
    items = [
        statefulset("app", [container("server")]),
        service("app", {"app": "app"}, [{"port": 80, "targetPort": 8000}]),
        route("app", "app", 8000),
    ]
    assert "no container declares this port" in one("routes-require-authentication", *items).message


def test_route_without_port_checks_every_service_port() -> None:
    ports = [*WEB, {"name": "debug", "port": 5678, "targetPort": "debug"}]
    sts = statefulset("app", [oauth_proxy(), container("server", ports=[{"name": "debug", "containerPort": 5678}])])
    found = one("routes-require-authentication", sts, service("app", {"app": "app"}, ports), route("app", "app"))
    assert "port 'debug'" in found.message


def test_alternate_backends_are_checked() -> None:
    plain = [
        deployment("plain", [container("server", ports=[{"name": "web", "containerPort": 8080}])]),
        service("plain", {"app": "plain"}, [{"name": "web", "port": 8080, "targetPort": "web"}]),
    ]
    r = route("app", "app", "web", alternateBackends=[{"kind": "Service", "name": "plain", "weight": 10}])
    found = one("routes-require-authentication", *proxied_app(), *plain, r)
    assert "Deployment team/plain" in found.message


def test_unknown_route_values_are_not_judged() -> None:
    assert not run("routes-require-authentication", route("app", UNKNOWN, "web"))
    assert not run("routes-require-authentication", *proxied_app(), route("app", "app", UNKNOWN))


# ------------------------------------------------------------------------------------ privileges

CAPS = {"securityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_RESOURCE"]}}}


def rdma_pod(sa: str = "dev-sa", **ctx: Any) -> Item:
    return statefulset("app", [container("ml-dev", **(ctx or CAPS))], sa=sa)


def test_added_capabilities_without_binding_fire() -> None:
    found = one("privileges-require-scc-binding", rdma_pod())
    assert found.resource == "StatefulSet team/app"
    assert "needs added capabilities IPC_LOCK (container ml-dev), SYS_RESOURCE (container ml-dev)" in found.message
    assert "no RoleBinding in the stack grants service account 'dev-sa' an SCC" in found.message
    assert "Fix: declare the privilege the way the memlock setting does" in found.message


def test_declared_scc_with_role_and_binding_is_quiet() -> None:
    items = [rdma_pod(), scc("rdma", ["IPC_LOCK", "SYS_RESOURCE"]), scc_role("rdma"), scc_binding("dev-sa", "rdma", "Role")]
    assert run("privileges-require-scc-binding", *items) == []


def test_binding_to_a_role_the_stack_lacks_grants_nothing() -> None:
    items = [rdma_pod(), scc("rdma", ["IPC_LOCK", "SYS_RESOURCE"]), scc_binding("dev-sa", "rdma", "Role")]
    assert (
        "refers to Role 'system:openshift:scc:rdma', which the stack does not create"
        in one("privileges-require-scc-binding", *items).message
    )


def test_declared_scc_must_allow_the_capabilities() -> None:
    items = [rdma_pod(), scc("rdma", ["IPC_LOCK"]), scc_role("rdma"), scc_binding("dev-sa", "rdma", "Role")]
    assert "SCC 'rdma' is bound but does not set allowedCapabilities SYS_RESOURCE" in one("privileges-require-scc-binding", *items).message


def test_binding_for_another_service_account_does_not_count() -> None:
    assert messages("privileges-require-scc-binding", rdma_pod(sa="other"), scc_binding("dev-sa", "privileged"))
    assert messages("privileges-require-scc-binding", rdma_pod(sa=""), scc_binding("dev-sa", "privileged"))  # runs as `default`


def test_privileged_scc_cluster_role_admits_privileged_pods() -> None:
    pod = rdma_pod(securityContext={"privileged": True})
    assert run("privileges-require-scc-binding", pod, scc_binding("dev-sa", "privileged")) == []
    found = one("privileges-require-scc-binding", pod, scc("rdma", ["IPC_LOCK"]), scc_role("rdma"), scc_binding("dev-sa", "rdma", "Role"))
    assert "does not set allowPrivilegedContainer" in found.message


def test_restricted_scc_grants_no_capabilities() -> None:
    assert (
        "SCC 'restricted-v2' is bound but does not set allowedCapabilities IPC_LOCK, SYS_RESOURCE"
        in one("privileges-require-scc-binding", rdma_pod(), scc_binding("dev-sa", "restricted-v2")).message
    )


def test_net_bind_service_and_dropped_caps_need_nothing() -> None:
    ctx: dict[str, Any] = {
        "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}, "allowPrivilegeEscalation": False}
    }
    assert run("privileges-require-scc-binding", rdma_pod(**ctx)) == []


def test_host_network_needs_an_scc() -> None:
    pod = statefulset("app", [container()], pod={"hostNetwork": True})
    assert "host namespaces hostNetwork" in one("privileges-require-scc-binding", pod).message
    assert run("privileges-require-scc-binding", pod, scc_binding("dev-sa", "hostnetwork-v2")) == []


def _pipeline(privileged_step: bool, sa: str = "pipeline-sa") -> list[Item]:
    ctx = {"securityContext": {"privileged": True}} if privileged_step else {}
    return [
        tekton("Task", "build", {"steps": [step("buildah", **ctx)]}),
        tekton("Pipeline", "package", {"tasks": [{"name": "build", "taskRef": {"name": "build"}, "timeout": "1h"}]}),
        tekton("PipelineRun", "package-abc", {"pipelineRef": {"name": "package"}, "taskRunTemplate": {"serviceAccountName": sa}}),
    ]


def test_privileged_tekton_step_needs_the_run_service_account_bound() -> None:
    found = one("privileges-require-scc-binding", *_pipeline(True))
    assert found.resource == "PipelineRun team/package-abc"
    assert "pipeline task 'build' needs privileged containers (step buildah)" in found.message
    assert "service account 'pipeline-sa'" in found.message
    assert run("privileges-require-scc-binding", *_pipeline(True), scc_binding("pipeline-sa", "privileged")) == []
    assert run("privileges-require-scc-binding", *_pipeline(False)) == []


# ------------------------------------------------------------------------------------------- GPU


def gpu_pod(requests: dict[str, Any], limits: dict[str, Any]) -> Item:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return statefulset("app", [container("ml-dev", resources=resources)])


def test_gpu_requests_below_limits_fire() -> None:
    found = one("gpu-requests-equal-limits", gpu_pod({"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "8"}))
    assert "spec.template.spec.containers[ml-dev]: nvidia.com/gpu requests 4 but limits 8" in found.message
    assert "Fix: make resources.requests and .limits of 'nvidia.com/gpu' equal" in found.message


def test_gpu_request_without_limit_fires() -> None:
    assert "is requested (4) without a limit" in one("gpu-requests-equal-limits", gpu_pod({"nvidia.com/gpu": "4"}, {})).message


@pytest.mark.parametrize(
    ("requests", "limits"),
    [
        ({"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": 4}),
        ({}, {"nvidia.com/gpu": "4"}),  # a limit alone: the request defaults to it
        ({"cpu": "32", "memory": "128Gi"}, {"cpu": "64", "memory": "256Gi"}),  # over-commit of cpu/memory is allowed
        ({"openshift.io/eno5np0rdma": "1"}, {"openshift.io/eno5np0rdma": "1000m"}),
    ],
)
def test_equal_or_native_resources_are_quiet(requests: dict[str, Any], limits: dict[str, Any]) -> None:
    assert run("gpu-requests-equal-limits", gpu_pod(requests, limits)) == []


def test_sriov_and_rdma_resources_and_init_containers_are_checked() -> None:
    sriov = {"requests": {"openshift.io/eno5np0rdma": "1"}, "limits": {"openshift.io/eno5np0rdma": "2"}}
    rdma = {"requests": {"rdma/hca": "1"}, "limits": {"rdma/hca": "2"}}
    pod = statefulset("app", [container(resources=sriov)], pod={"initContainers": [container("init", resources=rdma)]})
    assert len(run("gpu-requests-equal-limits", pod)) == 2


def test_tekton_step_compute_resources_are_checked() -> None:
    task = tekton("Task", "t", {"steps": [step(computeResources={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}})]})
    assert "spec.steps[run]: nvidia.com/gpu requests 1 but limits 2" in one("gpu-requests-equal-limits", task).message


def test_unknown_gpu_quantities_are_not_judged() -> None:
    assert run("gpu-requests-equal-limits", gpu_pod({"nvidia.com/gpu": UNKNOWN}, {"nvidia.com/gpu": "8"})) == []


# ------------------------------------------------------------------------------------- retention


def pvc(**options: Any) -> Item:
    return item(
        "kubernetes:core/v1:PersistentVolumeClaim",
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta("data"), "spec": {}},
        **options,
    )


def test_pvc_deleted_on_destroy_fires() -> None:
    found = one("persistent-data-retained", pvc())
    assert found.resource == "PersistentVolumeClaim team/data"
    assert "Fix: create it with `opts=pulumi.ResourceOptions(retain_on_delete=True)`" in found.message


@pytest.mark.parametrize("options", [{"retain_on_delete": True}, {"protect": True}, {"retain_on_delete": None}])
def test_retained_protected_or_unknown_pvc_is_quiet(options: dict[str, Any]) -> None:
    assert run("persistent-data-retained", pvc(**options)) == []


def test_created_namespace_must_be_retained() -> None:
    ns = item("kubernetes:core/v1:Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    assert "deletes every PVC in it" in one("persistent-data-retained", ns).message
    assert run("persistent-data-retained", (ns[0], ns[1], {"retain_on_delete": True})) == []


VCT = [{"metadata": {"name": "workspace"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]


def test_statefulset_claims_need_an_explicit_retain_policy() -> None:
    found = one("persistent-data-retained", statefulset("app", volumeClaimTemplates=VCT))
    assert "persistentVolumeClaimRetentionPolicy whenDeleted unset, whenScaled unset" in found.message
    policy = {"whenDeleted": "Delete", "whenScaled": "Retain"}
    found = one("persistent-data-retained", statefulset("app", volumeClaimTemplates=VCT, persistentVolumeClaimRetentionPolicy=policy))
    assert "whenDeleted='Delete'" in found.message
    policy = {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert run("persistent-data-retained", statefulset("app", volumeClaimTemplates=VCT, persistentVolumeClaimRetentionPolicy=policy)) == []
    assert run("persistent-data-retained", statefulset("app")) == []  # no claims of its own


# ---------------------------------------------------------------------------------------- Tekton

RESOURCES = {"requests": {"memory": "4Gi"}}


@pytest.mark.parametrize(
    ("kind", "spec", "where"),
    [
        ("Task", {"steps": [step(resources=RESOURCES)]}, "spec.steps[run] carries `resources`"),
        ("Task", {"steps": [step()], "stepTemplate": {"resources": RESOURCES}}, "spec.stepTemplate carries `resources`"),
        ("Task", {"steps": [step()], "sidecars": [step("cache", resources=RESOURCES)]}, "spec.sidecars[cache] carries `resources`"),
        (
            "Pipeline",
            {"tasks": [{"name": "dl", "taskSpec": {"steps": [step(resources=RESOURCES)]}}]},
            "spec.tasks[dl].taskSpec.steps[run] carries `resources`",
        ),
        (
            "Pipeline",
            {"tasks": [], "finally": [{"name": "cleanup", "taskSpec": {"steps": [step(resources=RESOURCES)]}}]},
            "spec.finally[cleanup].taskSpec.steps[run]",
        ),
        (
            "PipelineRun",
            {"pipelineSpec": {"tasks": [{"name": "dl", "taskSpec": {"steps": [step(resources=RESOURCES)]}}]}},
            "spec.pipelineSpec.tasks[dl].taskSpec.steps[run] carries `resources`",
        ),
        ("TaskRun", {"taskSpec": {"steps": [step(resources=RESOURCES)]}}, "spec.taskSpec.steps[run] carries `resources`"),
    ],
)
def test_step_resources_fire_everywhere(kind: str, spec: dict[str, Any], where: str) -> None:
    found = one("tekton-v1-compute-resources", tekton(kind, "x", spec))
    assert where in found.message
    assert "Fix: rename it to `computeResources`" in found.message


def test_compute_resources_are_quiet() -> None:
    task = tekton("Task", "t", {"steps": [step(computeResources=RESOURCES)], "stepTemplate": {"computeResources": RESOURCES}})
    assert run("tekton-v1-compute-resources", task) == []


def test_v1beta1_objects_fire() -> None:
    found = one("tekton-v1-compute-resources", tekton("Task", "t", {"steps": [step()]}, version="v1beta1"))
    assert "uses tekton.dev/v1beta1. Fix: write tekton.dev/v1 objects" in found.message


# ---------------------------------------------------------------------------------------- images


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        ("busybox", "has no tag"),
        ("quay.io/org/tool:latest", "uses the floating :latest tag"),
        ("image-registry.openshift-image-registry.svc:5000/ns/tool", "has no tag"),
        ("quay.io/org/tool@sha256:abc", "has a malformed digest"),
    ],
)
def test_floating_images_fire(image: str, problem: str) -> None:
    found = one("images-pinned", statefulset("app", [container(image=image)]))
    assert f"image {image!r} {problem}" in found.message and "Fix: pin a version tag" in found.message


@pytest.mark.parametrize(
    "image",
    [
        "image-registry.openshift-image-registry.svc:5000/ns/tool:pytorch-2.9",
        "quay.io/org/tool@sha256:" + "a" * 64,
        "quay.io/org/tool:1.0@sha256:" + "b" * 64,
        "$(params.toolsImage)",
        UNKNOWN,
    ],
)
def test_pinned_or_unknowable_images_are_quiet(image: str) -> None:
    assert run("images-pinned", statefulset("app", [container(image=image)])) == []


def test_init_containers_and_tekton_images_are_checked() -> None:
    pod = statefulset("app", [container()], pod={"initContainers": [container("init", image="alpine")]})
    assert "spec.template.spec.initContainers[init]: image 'alpine'" in one("images-pinned", pod).message
    task = tekton(
        "Task",
        "t",
        {"steps": [step(image="python:latest")], "stepTemplate": {"image": "ubi9"}, "sidecars": [step("s", image="registry:2")]},
    )
    found = messages("images-pinned", task)
    assert len(found) == 2 and any("spec.stepTemplate" in m for m in found)


def buildconfig(strategy_from: dict[str, str], output_to: dict[str, str]) -> Item:
    return item(
        "kubernetes:build.openshift.io/v1:BuildConfig",
        {
            "apiVersion": "build.openshift.io/v1",
            "kind": "BuildConfig",
            "metadata": meta("base"),
            "spec": {
                "strategy": {"type": "Docker", "dockerStrategy": {"from": strategy_from}},
                "output": {"to": output_to},
                "triggers": [{"type": "ImageChange", "imageChange": {"from": {"kind": "ImageStreamTag", "name": "base:latest"}}}],
            },
        },
    )


def test_buildconfig_from_output_and_trigger_are_checked() -> None:
    found = messages(
        "images-pinned",
        buildconfig({"kind": "DockerImage", "name": "nvcr.io/nvidia/pytorch"}, {"kind": "DockerImage", "name": "quay.io/org/base:latest"}),
    )
    assert len(found) == 3
    assert "spec.strategy.dockerStrategy.from: DockerImage 'nvcr.io/nvidia/pytorch' has no tag" in found[0]
    assert "spec.output.to: DockerImage 'quay.io/org/base:latest' uses the floating :latest tag" in found[1]
    assert "spec.triggers[0].imageChange.from: ImageStreamTag 'base:latest'" in found[2]


def test_pinned_buildconfig_is_quiet() -> None:
    bc = buildconfig(
        {"kind": "DockerImage", "name": "nvcr.io/nvidia/pytorch:25.09-py3"}, {"kind": "ImageStreamTag", "name": "ml-dev-env:base"}
    )
    bc[1]["spec"]["triggers"] = [{"type": "ConfigChange"}]
    assert run("images-pinned", bc) == []


def test_imagestream_imports_and_modelcar_uris_are_checked() -> None:
    stream = item(
        "kubernetes:image.openshift.io/v1:ImageStream",
        {
            "apiVersion": "image.openshift.io/v1",
            "kind": "ImageStream",
            "metadata": meta("tools"),
            "spec": {
                "lookupPolicy": {"local": True},
                "tags": [{"name": "upstream", "from": {"kind": "DockerImage", "name": "python:latest"}}],
            },
        },
    )
    assert "spec.tags[upstream].from: 'python:latest' uses the floating :latest tag" in one("images-pinned", stream).message
    isvc = item(
        "kubernetes:serving.kserve.io/v1beta1:InferenceService",
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": meta("llm"),
            "spec": {"predictor": {"model": {"modelFormat": {"name": "vLLM"}, "storageUri": "oci://quay.io/org/modelcar"}}},
        },
    )
    assert "spec.predictor.model.storageUri 'oci://quay.io/org/modelcar' has no tag" in one("images-pinned", isvc).message
    isvc[1]["spec"]["predictor"]["model"]["storageUri"] = "oci://quay.io/org/modelcar@sha256:" + "c" * 64
    assert run("images-pinned", isvc) == []


# --------------------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    ("data", "what"),
    [
        ({"password": "correct-horse"}, "holds a credential-named value in a ConfigMap"),
        ({"creds": f"aws_access_key_id = {AWS_KEY_ID}\n"}, "contains an AWS access key id"),
        ({"env": f"HF_TOKEN={HF_TOKEN}\n"}, "contains a Hugging Face token"),
        (
            {"key.pem": "-----BEGIN RSA PRIVATE KEY-----\n" + "MIIEpAIBAAKCAQEA" * 5 + "\n-----END RSA PRIVATE KEY-----\n"},
            "contains a private key",
        ),
        (
            {"config.json": '{"auths": {"quay.io": {"auth": "dXNlcjpwYXNzd29yZA=="}}}'},
            "contains registry credentials (dockerconfigjson auths)",
        ),
        ({"app.env": "S3_SECRET_ACCESS_KEY=wJalrXUtnFEMIbK7MDENG\n"}, "contains a literal value for S3_SECRET_ACCESS_KEY"),
        ({"settings.yaml": "registry:\n  password: s3cr3tvalue\n"}, "contains a literal value for password"),
        ({"startup.sh": "REDACTED"}, "embeds a Pulumi secret in a plain ConfigMap"),
    ],
)
def test_credentials_in_config_maps_fire(data: dict[str, str], what: str) -> None:
    found = one("no-plaintext-credentials", config_map("cfg", data))
    assert what in found.message and "Fix: keep the value in a Secret" in found.message
    for value in data.values():  # the report never repeats the credential
        if value != "REDACTED":
            assert value.strip() not in found.message


def test_binary_data_is_decoded() -> None:
    binary = {"notes.txt": base64.b64encode(HF_TOKEN.encode()).decode()}
    found = one("no-plaintext-credentials", config_map("cfg", binary=binary))
    assert "binaryData['notes.txt'] contains a Hugging Face token" in found.message


def test_scripts_that_only_mention_credential_variables_are_quiet() -> None:
    script = """#!/bin/bash
set -euo pipefail
AUTH="${ML_DEV_AUTH:-oauth-proxy}"
: "${PASSWORD:?token mode needs PASSWORD for code-server}"
code-server --auth password "$WORKSPACE"
jupyter lab --IdentityProvider.token="$JUPYTER_TOKEN"
HF_TOKEN_FILE=/var/run/secrets/hf/token
export TOKENIZERS_PARALLELISM=false
grep -q -- "-----BEGIN OPENSSH PRIVATE KEY-----" "$KEY" || true
"""
    data = {"startup.sh": script, "token-file": "", "nccl.env": "NCCL_IB_TIMEOUT=23\nNCCL_SOCKET_IFNAME=net1,net2\n"}
    assert run("no-plaintext-credentials", config_map("startup", data)) == []


@pytest.mark.parametrize(
    "env",
    [
        {"name": "HF_TOKEN", "value": HF_TOKEN},
        {"name": "PASSWORD", "value": "hunter2hunter2"},
        {"name": "awsSecretAccessKey", "value": "x" * 40},
        {"name": "DATABASE_URL_EXTRA", "value": f"token={HF_TOKEN}"},
        {"name": "SOME_VALUE", "value": "REDACTED"},
        {"name": "HF_TOKEN", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "hf"}}},
    ],
)
def test_credentials_in_env_fire(env: dict[str, Any]) -> None:
    found = one("no-plaintext-credentials", with_env(env))
    assert f"spec.template.spec.containers[main].env[{env['name']}]" in found.message
    assert HF_TOKEN not in found.message and "hunter2" not in found.message


@pytest.mark.parametrize(
    "env",
    [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "HF_TOKEN_FILE", "value": "/var/run/secrets/hf/token"},
        {"name": "QUAY_SECRET_NAME", "value": "quay-push"},
        {"name": "NCCL_IB_TOKEN_SPACE", "value": "something-long-enough"},
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        {"name": "MAX_NEW_TOKENS", "value": "4096"},
        {"name": "PASSWORD", "value": ""},
        {"name": "PASSWORD", "value": UNKNOWN},
        {"name": "ML_DEV_AUTH", "value": "token"},
    ],
)
def test_references_and_lookalikes_in_env_are_quiet(env: dict[str, Any]) -> None:
    assert run("no-plaintext-credentials", with_env(env)) == []


def test_tekton_and_buildconfig_env_and_args_are_checked() -> None:
    task = tekton(
        "Task",
        "dl",
        {"steps": [step("download", args=["--token", HF_TOKEN]), step("push", env=[{"name": "REGISTRY_PASSWORD", "value": "p4ssw0rd!"}])]},
    )
    found = messages("no-plaintext-credentials", task)
    assert len(found) == 2
    assert any("spec.steps[push].env[REGISTRY_PASSWORD]" in m for m in found)
    assert any("spec.steps[download]: command/args/script contain a Hugging Face token" in m for m in found)
    bc = item(
        "kubernetes:build.openshift.io/v1:BuildConfig",
        {
            "apiVersion": "build.openshift.io/v1",
            "kind": "BuildConfig",
            "metadata": meta("b"),
            "spec": {"strategy": {"dockerStrategy": {"env": [{"name": "AWS_ACCESS_KEY_ID", "value": AWS_KEY_ID}]}}},
        },
    )
    assert "spec.strategy.dockerStrategy.env[AWS_ACCESS_KEY_ID]" in one("no-plaintext-credentials", bc).message
    build_args = [{"name": "HF_TOKEN", "value": HF_TOKEN}, {"name": "BASE_TAG", "value": "cu130"}]
    bc[1]["spec"]["strategy"]["dockerStrategy"] = {"buildArgs": build_args}
    assert "spec.strategy.dockerStrategy.buildArgs[HF_TOKEN]" in one("no-plaintext-credentials", bc).message


def test_secrets_themselves_are_not_flagged() -> None:
    secret = item(
        "kubernetes:core/v1:Secret", {"apiVersion": "v1", "kind": "Secret", "metadata": meta("hf"), "stringData": {"token": HF_TOKEN}}
    )
    assert run("no-plaintext-credentials", secret) == []


# --------------------------------------------------------------------------------- TLS (advisory)


def test_route_without_tls_is_advisory() -> None:
    r = route("app", "app", "web")
    del r[1]["spec"]["tls"]
    found = one("route-tls-redirect", r)
    assert found.level == "advisory" and "serves plain HTTP" in found.message
    r[1]["spec"]["tls"] = {"termination": "edge", "insecureEdgeTerminationPolicy": "Allow"}
    assert "Fix: set insecureEdgeTerminationPolicy: Redirect" in one("route-tls-redirect", r).message
    assert run("route-tls-redirect", route("app", "app", "web")) == []


# ------------------------------------------------------------------------------- evaluate / report


def test_evaluate_skips_non_kubernetes_resources_and_rejects_unknown_policy_names() -> None:
    assert (
        evaluate(
            [
                ("random:index/randomPassword:RandomPassword", {"length": 32}, {}),
                ("pulumi:providers:kubernetes", {"namespace": NS}, {}),
                ("ml-dev-env:cluster:GpuCluster", {}, {}),
            ]
        )
        == []
    )
    with pytest.raises(ValueError, match="unknown policies"):
        evaluate([], policies=["no-such-policy"])


def test_violations_carry_type_index_and_level() -> None:
    items = [pvc(retain_on_delete=True), statefulset("app", [container(image="busybox")])]
    [found] = evaluate(items)
    assert (found.policy, found.level, found.resource_type, found.index) == (
        "images-pinned",
        "mandatory",
        "kubernetes:apps/v1:StatefulSet",
        1,
    )


def user_secrets_workload() -> Item:
    """A workload mounting the user's Secret `wandb` world-readable, through subPath, writable."""
    mount = {"name": "s", "mountPath": "/etc/s", "subPath": "K"}
    volume = {"name": "s", "secret": {"secretName": "wandb", "defaultMode": 0o644}}
    typ, obj, opts = statefulset("ranks", [container(volumeMounts=[mount])], pod={"volumes": [volume]})
    obj["spec"]["template"]["metadata"]["annotations"] = {"ml-dev-env/user-secrets": "wandb"}
    return typ, obj, opts


def test_every_message_says_how_to_fix() -> None:
    bad = [
        pvc(),
        rdma_pod(),
        gpu_pod({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}),
        tekton("Task", "t", {"steps": [step(resources=RESOURCES)]}),
        config_map("c", {"token": "abcdefgh12345"}),
        route("app", "missing", "web", tls=None),
        deployment("img", [container(image="busybox")]),
        item(
            "kubernetes:rbac.authorization.k8s.io/v1:Role",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": meta("agent"),
                "rules": [{"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["patch"]}],
            },
        ),
        statefulset("sshd", [container(ports=[{"name": "ssh", "containerPort": 2222}])]),
        item(
            "kubernetes:networking.k8s.io/v1:NetworkPolicy",
            {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("open"), "spec": {"ingress": [{}]}},
        ),
        statefulset("proxied", [{**oauth_proxy(), "args": ["--provider=openshift", "--http-address=:18080"]}]),
        user_secrets_workload(),
        item("kubernetes:core/v1:Secret", {"apiVersion": "v1", "kind": "Secret", "metadata": meta("wandb")}),
    ]
    found = evaluate(bad)
    assert {v.policy for v in found} == set(rules.POLICY_NAMES)
    assert all("Fix:" in v.message for v in found), [v.message for v in found if "Fix:" not in v.message]


def test_format_report_lists_mandatory_first_and_counts() -> None:
    r = route("app", "missing", "web", tls=None)
    report = format_report(evaluate([r]))
    lines = report.splitlines()
    assert lines[0] == "policy ml-dev-env-guardrails: 2 violation(s) (1 mandatory, 1 advisory)"
    assert lines[1] == "  [mandatory] routes-require-authentication: Route team/app"
    assert lines[3] == "  [advisory] route-tls-redirect: Route team/app"
    assert format_report([]) == f"policy ml-dev-env-guardrails: {len(rules.POLICIES)} policies, no violations"
    assert rules.has_mandatory(evaluate([r])) and not rules.has_mandatory([])


def test_unknown_sentinels_match_the_sdk() -> None:
    from pulumi_policy import proxy

    sdk = {getattr(proxy, n) for n in dir(proxy) if n.startswith("UNKNOWN_") and n.endswith("_VALUE")}
    assert sdk == set(rules.UNKNOWN_SENTINELS)


@pytest.mark.parametrize(("text", "value"), [("4", 4), ("1000m", 1), ("1Gi", 2**30), ("1e3", 1000), ("0.5", 0.5)])
def test_quantity(text: str, value: float) -> None:
    assert rules.quantity(text) == rules.quantity(value)
    assert rules.quantity(UNKNOWN) is None and rules.quantity("lots") is None
