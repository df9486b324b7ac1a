"""Waits that end: nothing `pulumi up` awaits may wait on something slower than its own timeout, and the
deploy job outlives the longest await.

What pulumi-kubernetes awaits (pulumi/pulumi-kubernetes, provider/pkg/await/awaiters.go, the `awaiters` map):
StatefulSet (statefulset.go: ready pods at the current revision), Service with a selector (service.go,
serviceInitAwaiter.Await: endpoints, i.e. ready selected pods), PersistentVolumeClaim (Bound, or Pending with
WaitForFirstConsumer), Deployment/Pod/Job, ServiceAccount, … — each 10 minutes unless
`pulumi.com/timeoutSeconds` is set; `pulumi.com/skipAwait: "true"` skips it (metadata/overrides.go ReadyCondition).
Custom resources (BuildConfig, PipelineRun, Route, …) are not awaited unless `pulumi.com/waitFor` is set or the
provider runs with PULUMI_K8S_AWAIT_ALL=true (ReadyCondition), which this project never does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import STACKS, run_objects, stack_objects, tcp_shared_variant
from tools.mock_engine import RunResult

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = 600  # DefaultStatefulSetTimeoutMins, DefaultServiceTimeoutMins, … = 10
POD_KINDS = {"StatefulSet", "Deployment", "DaemonSet", "Job", "Pod", "ReplicaSet"}
AWAITED_KINDS = POD_KINDS | {"Service", "PersistentVolumeClaim", "PersistentVolume", "ServiceAccount", "Ingress", "Namespace"}
MIN_PULL_SECONDS = 600  # floor for pulling a multi-GB image and starting the containers, after the builds
SETUP_MARGIN_SECONDS = 15 * 60  # checkout, venv, offline render, plugin download before `pulumi up` starts
INTERNAL = "image-registry.openshift-image-registry.svc:5000/"


def annotations_of(r: Any) -> dict[str, str]:
    return r.inputs.get("metadata", {}).get("annotations") or {}


def awaited(result: RunResult) -> list[Any]:
    return [r for r in result.resources if r.custom and r.kind in AWAITED_KINDS and annotations_of(r).get("pulumi.com/skipAwait") != "true"]


def timeout(r: Any) -> int:
    return int(annotations_of(r).get("pulumi.com/timeoutSeconds", DEFAULT_TIMEOUT))


def build_chain_seconds(result: RunResult, image: str) -> int:
    """Worst case until `image` exists: the deadlines of the BuildConfig producing it and of those it builds FROM."""
    producers = {}
    for r in result.of_type("kubernetes:build.openshift.io/v1:BuildConfig"):
        ns = r.inputs["metadata"]["namespace"]
        producers[f"{INTERNAL}{ns}/{r.inputs['spec']['output']['to']['name']}"] = r.inputs
    total, seen = 0, set()
    while image in producers and image not in seen:
        seen.add(image)
        bc = producers[image]
        total += int(bc["spec"]["completionDeadlineSeconds"])
        frm = bc["spec"]["strategy"]["dockerStrategy"]["from"]
        image = f"{INTERNAL}{bc['metadata']['namespace']}/{frm['name']}" if frm["kind"] == "ImageStreamTag" else frm["name"]
    return total


def pod_template(r: Any) -> dict[str, Any]:
    return r.inputs["spec"] if r.kind == "Pod" else r.inputs["spec"]["template"]["spec"]


def by_urn(result: RunResult, urn: str) -> Any:
    typ, name = urn.split("::")[2].split("$")[-1], urn.rsplit("::", 1)[1]
    (found,) = [r for r in result.resources if (r.typ, r.name) == (typ, name)]
    return found


def dependencies(result: RunResult, r: Any) -> list[Any]:
    return [by_urn(result, urn) for urn in r.options.get("dependencies", [])]


def waited_image(job: Any) -> str | None:
    """The image a wait Job polls for (`--image <ref>` in its command), if it is one."""
    (container,) = pod_template(job)["containers"]
    args = container.get("command", []) + container.get("args", [])
    return args[args.index("--image") + 1] if "--image" in args else None


def pods_ready_bound(result: RunResult, workload: Any) -> int:
    """What a pod-owning object waits on: its images (built by the stack or not) plus pulling and starting.

    An image that an awaited Job this object depends on waits for already exists when the object is applied.
    """
    ready = {waited_image(d) for d in dependencies(result, workload) if d.kind == "Job" and d in awaited(result)}
    images = [c["image"] for c in pod_template(workload).get("containers", [])]
    return max(0 if image in ready else build_chain_seconds(result, image) for image in images) + MIN_PULL_SECONDS + rolling_stops(workload)


def rolling_stops(workload: Any) -> int:
    """A StatefulSet's template change stops its pods one at a time, largest ordinal first, each replacement healthy
    before the next (kubernetes pkg/controller/statefulset/stateful_set_control.go, updateStatefulSet); each stop may
    last the pod's whole terminationGracePeriodSeconds (the checkpoint grace + the servers' margin)."""
    if workload.kind != "StatefulSet":
        return 0
    grace = int(pod_template(workload).get("terminationGracePeriodSeconds", 30))  # the API's default
    return int(workload.inputs["spec"].get("replicas", 1)) * grace


def selects(selector: dict[str, str], workload: Any) -> bool:
    meta = workload.inputs["metadata"] if workload.kind == "Pod" else workload.inputs["spec"]["template"]["metadata"]
    labels = meta.get("labels", {})
    name = workload.inputs["metadata"]["name"]
    for key, value in selector.items():
        if key == "statefulset.kubernetes.io/pod-name":  # set on each pod by the StatefulSet controller
            if not (workload.kind == "StatefulSet" and value.startswith(f"{name}-")):
                return False
        elif labels.get(key) != value:
            return False
    return True


def needed_seconds(result: RunResult, r: Any) -> int:
    """The slowest thing the awaited object `r` waits on."""
    if r.kind == "Job" and waited_image(r):
        return build_chain_seconds(result, waited_image(r) or "")
    if r.kind in POD_KINDS:
        return pods_ready_bound(result, r)
    if r.kind == "Service":
        spec = r.inputs.get("spec", {})
        selector = spec.get("selector") or {}
        if not selector or spec.get("clusterIP") == "None" or spec.get("type") == "ExternalName":
            return 0  # service.go shouldWaitForPods: no endpoints wait
        workloads = [w for w in result.resources if w.custom and w.kind in POD_KINDS - {"Job"} and selects(selector, w)]
        assert workloads, f"Service {r.name} selects no pods of this stack: its await could never end"
        return max(pods_ready_bound(result, w) for w in workloads)
    return 0  # claims, service accounts, …: the cluster's own controllers, seconds


VARIANTS: dict[str, tuple[str, Any]] = {
    **{stack: (stack, lambda o: None) for stack in STACKS},
    "barcelona tcp/shared": ("barcelona", tcp_shared_variant),
    "barcelona 6 h build deadline": ("barcelona", lambda o: o["image"]["build"].update(completionDeadlineSeconds=6 * 3600)),
    "barcelona token auth": ("barcelona", lambda o: o["access"].update(auth="token", tensorboard=False)),
    "barcelona 3600 s grace": ("barcelona", lambda o: o.setdefault("lifecycle", {}).update(checkpointGraceSeconds=3600)),
    "barcelona prePull daemonSet": ("barcelona", lambda o: o["image"].update(prePull="daemonSet")),
}
SECRETS = {"vscodePassword": "p" * 16, "jupyterToken": "t" * 32}


def render(variant: str) -> RunResult:
    stack, mutate = VARIANTS[variant]
    objects = stack_objects(stack)
    mutate(objects)
    result = run_objects(stack, objects, SECRETS)
    assert result.error is None, result.error
    return result


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_await_outlasts_what_it_waits_on(variant: str) -> None:
    result = render(variant)
    short = [(r.kind, r.name, timeout(r), needed_seconds(result, r)) for r in awaited(result) if timeout(r) < needed_seconds(result, r)]
    assert not short, f"awaits that time out before what they wait on can finish (kind, name, timeout s, needed s): {short}"
    waits_for = [(r.kind, r.name) for r in result.resources if "pulumi.com/waitFor" in annotations_of(r)]
    assert not waits_for, f"custom waits need a timeout analysis here: {waits_for}"


def longest_await_chain(result: RunResult) -> int:
    """Upper bound of `pulumi up`'s waiting: the longest path of awaits through the dependency graph."""
    waiting = awaited(result)
    memo: dict[tuple[str, str], int] = {}

    def path(r: Any) -> int:
        key = (r.typ, r.name)
        if key not in memo:
            memo[key] = (timeout(r) if r in waiting else 0) + max((path(d) for d in dependencies(result, r)), default=0)
        return memo[key]

    return max(path(r) for r in result.resources)


def test_deploy_job_outlives_the_longest_await_of_every_stack() -> None:
    deploy = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    job = deploy["jobs"]["up"]
    limit = int(job["timeout-minutes"]) * 60
    for stack in [*STACKS, "barcelona prePull daemonSet"]:  # the pre-pull DaemonSet's await comes before the StatefulSet's
        needed = longest_await_chain(render(stack)) + SETUP_MARGIN_SECONDS
        assert limit >= needed, f"deploy.yml timeout-minutes {limit // 60} < {needed / 60:.0f} min that `pulumi up {stack}` may wait"
    assert "PULUMI_K8S_AWAIT_ALL" not in str(deploy), "generic awaits would wait for PipelineRuns (hours)"


def test_the_pod_zero_service_is_not_awaited_but_the_statefulset_is() -> None:
    result = render("barcelona")
    dev = result.one("kubernetes:core/v1:Service", "gpu-dev")
    assert annotations_of(dev)["pulumi.com/skipAwait"] == "true"
    sts = result.one("kubernetes:apps/v1:StatefulSet")
    assert "pulumi.com/skipAwait" not in annotations_of(sts)
    # the pods switch to a built tag only after the wait Job saw it pushed
    job = result.one("kubernetes:batch/v1:Job")
    assert job in dependencies(result, sts) and waited_image(job) == result.outputs["runtime_image"]
    assert timeout(job) >= build_chain_seconds(result, result.outputs["runtime_image"])


def test_the_wait_job_is_new_for_every_runtime_tag_and_runs_the_wait_program() -> None:
    from steps.embed import step_script

    before, after = render("barcelona"), render("barcelona 6 h build deadline")
    job, job2 = before.one("kubernetes:batch/v1:Job"), after.one("kubernetes:batch/v1:Job")
    assert job.name == job2.name == "image-wait"  # stable Pulumi identity
    assert job.inputs["metadata"]["name"].endswith(before.outputs["runtime_image"].rsplit("-", 1)[1])
    changed = render_with(lambda o: o["image"]["build"].update(runtimeRequirements=["peft==0.17.1"]))
    new = changed.one("kubernetes:batch/v1:Job")
    assert new.inputs["metadata"]["name"] != job.inputs["metadata"]["name"], "a new tag needs a new (never completed) Job"
    (container,) = pod_template(job)["containers"]
    assert container["command"][:3] == ["python3", "-c", step_script("wait_image")]
    assert int(container["command"][container["command"].index("--timeout") + 1]) >= build_chain_seconds(before, waited_image(job) or "")
    assert job.inputs["spec"]["backoffLimit"] == 0 and pod_template(job)["restartPolicy"] == "Never"
    # same name, other template (here: the deadline) = replacement of an immutable Job: delete first
    assert job2.inputs["metadata"]["name"] == job.inputs["metadata"]["name"] and job2.inputs["spec"] != job.inputs["spec"]
    assert job.options["delete_before_replace"] is True


def render_with(mutate: Any) -> RunResult:
    objects = stack_objects("barcelona")
    mutate(objects)
    result = run_objects("barcelona", objects, SECRETS)
    assert result.error is None, result.error
    return result


ENVIRONMENT_STACKS = [s for s in STACKS if "environment" in stack_objects(s)]


@pytest.mark.parametrize("stack", ENVIRONMENT_STACKS)
def test_an_environment_up_is_bounded_by_pull_and_start_only(stack: str) -> None:
    """A second environment never waits on a build: no Job, no BuildConfig in its graph; its pods' bound is pull + start
    (and, for the StatefulSet, the stops of a rolling update)."""
    result = render(stack)
    assert not [r for r in result.resources if r.kind in ("Job", "BuildConfig")]
    for r in awaited(result):
        assert needed_seconds(result, r) <= MIN_PULL_SECONDS + rolling_stops(r), (r.kind, r.name)
    sts = result.one("kubernetes:apps/v1:StatefulSet")
    assert longest_await_chain(result) == timeout(sts) + max((path_timeout(result, d) for d in dependencies(result, sts)), default=0)
    assert not [d for d in dependencies(result, sts) if d.kind == "Job"]


def path_timeout(result: RunResult, r: Any) -> int:
    return (timeout(r) if r in awaited(result) else 0) + max((path_timeout(result, d) for d in dependencies(result, r)), default=0)


def test_a_failed_wait_job_is_replaced_by_the_next_up() -> None:
    job = render("barcelona").one("kubernetes:batch/v1:Job")
    assert annotations_of(job)["pulumi.com/replaceUnready"] == "true"
    (container,) = pod_template(job)["containers"]
    command = container["command"]
    configs = [command[i + 1] for i, arg in enumerate(command) if arg == "--build-config"]
    built = {r.inputs["metadata"]["name"] for r in render("barcelona").of_type("kubernetes:build.openshift.io/v1:BuildConfig")}
    assert len(configs) == 2 and set(configs) <= built
    sa = pod_template(job)["serviceAccountName"]
    role = render("barcelona").one("kubernetes:rbac.authorization.k8s.io/v1:Role", "image-wait-role")
    assert role.inputs["rules"] == [{"apiGroups": ["build.openshift.io"], "resources": ["builds"], "verbs": ["get", "list", "watch"]}]
    binding = render("barcelona").one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "image-wait-binding")
    assert binding.inputs["subjects"][0]["name"] == sa and binding.inputs["roleRef"]["name"] == role.inputs["metadata"]["name"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_destroy_waits_for_the_pods_to_stop(variant: str) -> None:
    """`pulumi destroy` deletes the StatefulSet in the foreground and waits `pulumi.com/timeoutSeconds` (else 10
    minutes) for it to be gone (pulumi-kubernetes provider/pkg/await/await.go `Deletion`, `metadata.TimeoutDuration`;
    provider/pkg/metadata/overrides.go `DeletionPropagation`: Foreground unless annotated). The garbage collector
    deletes the pods together, so the wait must cover one termination grace: the checkpoint grace + 15 s."""
    result = render(variant)
    sts = result.one("kubernetes:apps/v1:StatefulSet")
    assert "pulumi.com/deletionPropagationPolicy" not in annotations_of(sts), "the analysis assumes a foreground deletion"
    stack, mutate = VARIANTS[variant]
    objects = stack_objects(stack)
    mutate(objects)
    checkpoint_grace = int((objects.get("lifecycle") or {}).get("checkpointGraceSeconds", 30))  # the schema's default
    grace = int(pod_template(sts)["terminationGracePeriodSeconds"])
    assert grace == checkpoint_grace + 15
    assert timeout(sts) >= grace + MIN_PULL_SECONDS


def test_a_3600_s_grace_lengthens_both_waits_by_the_rolling_stops() -> None:
    """At the largest grace the StatefulSet's await grows by replicas x (3600 + 15) s against the default grace."""
    before, after = render("barcelona"), render("barcelona 3600 s grace")
    sts, sts2 = before.one("kubernetes:apps/v1:StatefulSet"), after.one("kubernetes:apps/v1:StatefulSet")
    assert pod_template(sts2)["terminationGracePeriodSeconds"] == 3615
    replicas = int(sts.inputs["spec"]["replicas"])
    assert replicas >= 1
    grown = replicas * (3615 - int(pod_template(sts)["terminationGracePeriodSeconds"]))
    assert timeout(sts2) - timeout(sts) == grown
    assert timeout(sts2) >= needed_seconds(after, sts2) and timeout(sts2) >= 3615
