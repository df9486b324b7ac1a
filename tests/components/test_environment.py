"""Team environments on one cluster: cluster stack + environment stacks, no object with two owners.

Runs the committed barcelona stack and its two example environments (barcelona-alice in the cluster's
namespace, barcelona-bob in its own) through the real program.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components import environment as layers
from components.environment import (
    PROBE_PATH,
    READ_TIMEOUT,
    STACK_LABEL,
    api_path,
    attachments_problem,
    guarded_reader,
    nad_path,
    ownership_conflict,
    stack_label_transformation,
)
from components.preflight import KubeClient, LiveReadError, gpu_capacity_problem
from core import naming
from stacks.config import StackConfig
from stacks.environment import FACTS_OUTPUT, FACTS_VERSION, reserved_words
from stacks.loader import SECRET_KEYS, check, stack_raw, validate_all
from tests.conftest import PLACEHOLDER_SECRETS, ROOT, STACKS, run_objects, stack_objects
from tools.mock_engine import ORGANIZATION, RunResult, flatten, run_program, stack_config

ENVIRONMENTS = [s for s in STACKS if "environment" in stack_objects(s)]
SHARED_KINDS = {"BuildConfig", "ImageStream", "Task", "Pipeline", "PipelineRun", "SecurityContextConstraints", "Job", "Namespace"}


def render(stack: str, **kwargs: Any) -> RunResult:
    result = run_objects(stack, stack_objects(stack), **kwargs)
    assert result.error is None, result.error
    return result


def objects(result: RunResult) -> list[dict[str, Any]]:
    return [r.inputs for r in result.resources if r.typ.startswith("kubernetes:") and "kind" in r.inputs]


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


@pytest.fixture(scope="module")
def renders() -> dict[str, RunResult]:
    return {stack: render(stack) for stack in ["barcelona", *ENVIRONMENTS]}


def test_two_example_environments_of_at_most_15_lines() -> None:
    examples = {s: stack_objects(s)["environment"] for s in ENVIRONMENTS}
    assert {e["cluster"] for e in examples.values()} == {"barcelona"}
    assert any("namespace" in e for e in examples.values()) and any("namespace" not in e for e in examples.values())
    for stack in ENVIRONMENTS:
        lines = (ROOT / f"Pulumi.{stack}.yaml").read_text().splitlines()
        assert len(lines) <= 15, f"Pulumi.{stack}.yaml has {len(lines)} lines"


def test_no_object_has_two_owners(renders: dict[str, RunResult]) -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for stack, result in renders.items():
        for obj in objects(result):
            assert key(obj) not in seen, f"{key(obj)} is rendered by {seen.get(key(obj))} and {stack}"
            seen[key(obj)] = stack


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_an_environment_owns_only_its_own_objects(renders: dict[str, RunResult], stack: str) -> None:
    name = stack_objects(stack)["environment"]["name"]
    for obj in objects(renders[stack]):
        assert obj["kind"] not in SHARED_KINDS, key(obj)
        assert obj["metadata"].get("namespace"), f"cluster-scoped {key(obj)}"
        assert name in obj["metadata"]["name"], f"{key(obj)} does not carry the environment name {name!r}"


def test_every_object_carries_its_stack_label_and_pod_templates_stay(renders: dict[str, RunResult]) -> None:
    for stack, result in renders.items():
        for obj in objects(result):
            assert obj["metadata"]["labels"][STACK_LABEL] == stack, key(obj)
            template = (obj.get("spec") or {}).get("template")
            if isinstance(template, dict):
                assert STACK_LABEL not in (template.get("metadata") or {}).get("labels", {}), key(obj)


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_its_service_account_redirects_to_its_own_routes_only(renders: dict[str, RunResult], stack: str) -> None:
    result = renders[stack]
    routes = {o["metadata"]["name"] for o in objects(result) if o["kind"] == "Route"}
    (sts,) = [o for o in objects(result) if o["kind"] == "StatefulSet"]
    (sa,) = [
        o
        for o in objects(result)
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == sts["spec"]["template"]["spec"]["serviceAccountName"]
    ]
    refs = [json.loads(v)["reference"]["name"] for k, v in sa["metadata"]["annotations"].items() if "oauth-redirectreference" in k]
    assert refs and set(refs) == routes


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_its_pods_run_exactly_the_cluster_runtime_tag(renders: dict[str, RunResult], stack: str) -> None:
    runtime = renders["barcelona"].outputs["runtime_image"]
    (sts,) = [o for o in objects(renders[stack]) if o["kind"] == "StatefulSet"]
    (main,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "ml-dev"]
    assert main["image"] == runtime and renders[stack].outputs["image"] == runtime


def test_in_its_own_namespace_it_pulls_the_cluster_image_and_has_its_own_claims(renders: dict[str, RunResult]) -> None:
    cluster_ns = stack_objects("barcelona")["cluster"]["namespace"]
    for stack in ENVIRONMENTS:
        env = stack_objects(stack)["environment"]
        objs = objects(renders[stack])
        pullers = [o for o in objs if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == "system:image-puller"]
        claims = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
        (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
        mounted = {
            v["persistentVolumeClaim"]["claimName"] for v in sts["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v
        }
        if env.get("namespace"):
            (binding,) = pullers
            assert binding["metadata"]["namespace"] == cluster_ns
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": sts["spec"]["template"]["spec"]["serviceAccountName"], "namespace": env["namespace"]}
            ]
            assert mounted == {c["metadata"]["name"] for c in claims} and all(
                c["metadata"]["namespace"] == env["namespace"] for c in claims
            )
        else:
            assert not pullers and not claims
            cluster_claims = {o["metadata"]["name"] for o in objects(renders["barcelona"]) if o["kind"] == "PersistentVolumeClaim"}
            assert mounted == cluster_claims


def test_the_cluster_stack_exports_versioned_facts(renders: dict[str, RunResult]) -> None:
    facts = renders["barcelona"].outputs[FACTS_OUTPUT]
    assert facts["version"] == FACTS_VERSION and facts["runtimeImage"] == renders["barcelona"].outputs["runtime_image"]


def env_config(stack: str, **changes: Any) -> dict[str, Any]:
    config = stack_config(ROOT / f"Pulumi.{stack}.yaml")
    for k, v in changes.items():
        config[f"ml-dev-env:{k}"] = v
    return config


CLUSTER_REF = f"{ORGANIZATION}/ml-dev-env/barcelona"


def test_an_environment_whose_cluster_was_never_deployed_stops_with_one_line() -> None:
    result = run_program("barcelona-alice", env_config("barcelona-alice"), stack_outputs={})
    assert result.error is not None and len(result.error.strip().splitlines()) == 1
    assert f"cluster stack {CLUSTER_REF} has no environment_facts output" in result.error
    assert "ask the cluster owner to deploy it" in result.error and "pulumi up" not in result.error


def facts_of(outputs: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The cluster's outputs with its facts changed (a value of `DROP` removes the field)."""
    facts = {k: v for k, v in {**outputs[FACTS_OUTPUT], **changes}.items() if v is not DROP}
    return {**outputs, FACTS_OUTPUT: facts}


DROP = object()


@pytest.fixture(scope="module")
def deployed(renders: dict[str, RunResult]) -> dict[str, Any]:
    return renders["barcelona"].outputs


def run_env(stack: str, outputs: dict[str, Any], config: dict[str, Any] | None = None, main: Path | None = None) -> RunResult:
    kwargs: dict[str, Any] = {"main": main} if main is not None else {}
    return run_program(stack, config or env_config(stack), dict(PLACEHOLDER_SECRETS), stack_outputs={CLUSTER_REF: outputs}, **kwargs)


def main_of(result: RunResult) -> dict[str, Any]:
    (sts,) = [o for o in objects(result) if o["kind"] == "StatefulSet"]
    (main,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "ml-dev"]
    return main


def checkout_with(tmp_path: Path, edit: Callable[[str], str]) -> Path:
    """A checkout whose Pulumi.barcelona.yaml is edited (the program and the environment files as committed)."""
    for path in ROOT.glob("Pulumi.barcelona*.yaml"):
        text = path.read_text()
        (tmp_path / path.name).write_text(edit(text) if path.name == "Pulumi.barcelona.yaml" else text)
    (tmp_path / "__main__.py").write_text((ROOT / "__main__.py").read_text())
    return tmp_path / "__main__.py"


@pytest.mark.parametrize("stack", ENVIRONMENTS)
@pytest.mark.parametrize("suspended", [False, True])
def test_a_requirements_bump_in_the_checkout_runs_the_deployed_tag(
    tmp_path: Path, deployed: dict[str, Any], stack: str, suspended: bool
) -> None:
    """The checkout bumps a runtime requirement the cluster has not built yet: the environment runs what is deployed."""
    main = checkout_with(tmp_path, lambda text: text.replace("peft==0.17.1", "peft==0.17.2"))
    bumped = run_program(
        "barcelona", stack_config(tmp_path / "Pulumi.barcelona.yaml"), dict(PLACEHOLDER_SECRETS), main=main, stack_outputs={}
    )
    assert bumped.error is None and bumped.outputs["runtime_image"] != deployed["runtime_image"]  # the bump changes the tag
    config = env_config(stack)
    if suspended:
        config["ml-dev-env:lifecycle"] = {**config.get("ml-dev-env:lifecycle", {}), "suspended": True}
    result = run_env(stack, deployed, config, main)
    assert result.error is None, result.error
    assert main_of(result)["image"] == deployed["runtime_image"] == result.outputs["image"]


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_its_objects_refer_to_the_deployed_scc_role_and_claims(deployed: dict[str, Any], stack: str) -> None:
    facts = deployed[FACTS_OUTPUT]
    moved = {"scc": "renamed-scc", "sccRole": "system:openshift:scc:renamed-scc", "sharedClaims": {"datasets": "renamed-datasets"}}
    assert set(facts["sharedClaims"]) == {"datasets"} and facts["scc"] and facts["sccRole"]  # the fixture's premise
    result = run_env(stack, facts_of(deployed, **moved))
    assert result.error is None, result.error
    objs = objects(result)
    roles = [o for o in objs if o["kind"] == "Role" and o["rules"][0]["resources"] == ["securitycontextconstraints"]]
    scc_roles = {"system:openshift:scc:renamed-scc", *(r["metadata"]["name"] for r in roles)}
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding" and o["roleRef"]["name"] in scc_roles]
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in sts["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    if stack_objects(stack)["environment"].get("namespace"):  # its own Role grants the deployed SCC; its own claims
        (role,) = roles
        assert role["rules"][0]["resourceNames"] == ["renamed-scc"] and binding["roleRef"]["name"] == role["metadata"]["name"]
        assert "renamed-datasets" not in claims
    else:  # the cluster's Role and claims, by their deployed names
        assert not roles and binding["roleRef"]["name"] == "system:openshift:scc:renamed-scc"
        assert claims == {"renamed-datasets"}


def test_a_cluster_deployed_with_another_image_serves_its_environments(deployed: dict[str, Any]) -> None:
    result = run_env("barcelona-alice", facts_of(deployed, runtimeImage="elsewhere/old:tag"))
    assert result.error is None and main_of(result)["image"] == "elsewhere/old:tag"


SHAPES: list[tuple[str, dict[str, Any], str]] = [
    ("namespace", {"namespace": "other-ns"}, "namespace: deployed 'other-ns', checkout 'nccl-test'"),
    ("appName", {"appName": "other-app"}, "appName: deployed 'other-app', checkout 'ml-dev-env'"),
    ("no SCC", {"scc": None, "sccRole": None}, "scc: deployed none, checkout "),
    (
        "a claim more",
        {"sharedClaims": {"datasets": "x", "models": "y"}},
        "sharedClaims: deployed ['datasets', 'models'], checkout ['datasets']",
    ),
]


@pytest.mark.parametrize(("what", "changes", "shown"), SHAPES, ids=[s[0] for s in SHAPES])
def test_only_a_shape_difference_stops_it_with_one_line(deployed: dict[str, Any], what: str, changes: dict[str, Any], shown: str) -> None:
    result = run_env("barcelona-alice", facts_of(deployed, **changes))
    assert result.error is not None and "\n" not in result.error.strip(), result.error
    assert result.error.startswith("ml-dev-env:environment.cluster: your checkout differs from what is deployed on barcelona (")
    assert shown in result.error and result.error.rstrip().endswith("): git pull, or ask the cluster owner")
    assert "pulumi up" not in result.error


FIELDS = ["version", "cluster", "namespace", "appName", "runtimeImage", "scc", "sccRole", "sharedClaims"]
MISTYPED: dict[str, Any] = {
    "cluster": 3,
    "namespace": ["a"],
    "appName": {"a": 1},
    "runtimeImage": 5,
    "scc": 7,
    "sccRole": [],
    "sharedClaims": "x",
}
VERSIONS: list[tuple[str, Any, str | None]] = [
    ("absent", DROP, "without a version; this checkout reads version 1: the cluster owner redeploys barcelona"),
    ("0", 0, "deployed by an older program (environment_facts version 0, this checkout reads 1): the cluster owner redeploys"),
    ("1", 1, None),
    ("1.0 (a number read back)", 1.0, None),
    ("2", 2, "deployed by a newer program (environment_facts version 2, this checkout reads 1): update your checkout (git pull)"),
    ("'1'", "1", "with version '1' (not an integer)"),
    ("1.5", 1.5, "with version 1.5 (not an integer)"),
    ("true", True, "with version True (not an integer)"),
]
SHAPE_EDITS: list[tuple[str, dict[str, Any]]] = [
    ("as deployed", {}),
    ("one extra field", {"addedByANewerProgram": {"any": "thing"}}),
    *[(f"{field} missing", {field: DROP}) for field in FIELDS if field != "version"],
    *[(f"{field} mistyped", {field: value}) for field, value in MISTYPED.items()],
]


@pytest.mark.parametrize(("version_id", "version", "version_line"), VERSIONS, ids=[v[0] for v in VERSIONS])
@pytest.mark.parametrize(("shape_id", "edit"), SHAPE_EDITS, ids=[s[0] for s in SHAPE_EDITS])
def test_every_facts_version_and_shape_runs_or_says_one_line(
    deployed: dict[str, Any], version_id: str, version: Any, version_line: str | None, shape_id: str, edit: dict[str, Any]
) -> None:
    facts = {k: v for k, v in {**deployed[FACTS_OUTPUT], **edit, "version": version}.items() if v is not DROP}
    problem = layers.checked_facts(facts, layers.cluster_facts(barcelona_config()), CLUSTER_REF)[1]
    if version_line is not None:  # the version speaks first, whatever the fields
        assert problem is not None and version_line in problem
    elif shape_id in ("as deployed", "one extra field"):
        assert problem is None
    else:
        field = shape_id.split()[0]
        assert problem is not None and field in problem, problem
        if shape_id in ("scc missing", "sccRole missing"):  # none, as the SDK reads a None back: barcelona has an SCC
            assert f"your checkout differs from what is deployed on barcelona ({field}: deployed none, checkout " in problem
        else:
            assert f"environment_facts version 1 without what this checkout needs ({field}" in problem, problem
    if problem is not None:
        assert "\n" not in problem and problem.startswith("ml-dev-env:environment.cluster: ") and "pulumi up" not in problem


@pytest.mark.parametrize("name", ["wait", "alice-headless", "Carol"])
def test_a_refused_name_stops_the_program_with_one_line_on_environment_name(deployed: dict[str, Any], name: str) -> None:
    config = env_config("barcelona-alice", environment={"cluster": "barcelona", "name": name})
    result = run_env("barcelona-alice", deployed, config)
    assert result.error is not None
    (line,) = result.error.strip().splitlines()[1:]
    assert line.startswith(f"  - ml-dev-env:environment.name: got {name!r}; ") and "Pulumi.barcelona-alice.yaml" in result.error


@pytest.mark.parametrize("case", ["absent", "2", "runtimeImage missing", "sharedClaims mistyped"])
def test_facts_problems_stop_the_program_with_that_one_line(deployed: dict[str, Any], case: str) -> None:
    edits: dict[str, dict[str, Any]] = {
        "absent": {"version": DROP},
        "2": {"version": 2},
        "runtimeImage missing": {"runtimeImage": DROP},
        "sharedClaims mistyped": {"sharedClaims": "x"},
    }
    result = run_env("barcelona-bob", facts_of(deployed, **edits[case]))
    assert result.error is not None and len(result.error.strip().splitlines()) == 1, result.error
    assert result.error.startswith("ml-dev-env:environment.cluster: the cluster stack") and "Traceback" not in result.error


def barcelona_config() -> StackConfig:
    config = validate_all(stack_raw(flatten(stack_config(ROOT / "Pulumi.barcelona.yaml"))[0], ROOT)[0])[0]
    assert config is not None
    return config


def test_cluster_keys_and_foreign_nodes_in_an_environment_are_one_line_each() -> None:
    config = env_config(
        "barcelona-alice", storage={"mode": "shared", "volumes": []}, nodes={"count": 1, "gpuNodes": ["not-a-cluster-node"]}
    )
    result = run_program("barcelona-alice", config, stack_outputs={})
    assert result.error is not None
    lines = [line.strip().removeprefix("- ") for line in result.error.splitlines()[1:]]
    assert len(lines) == 2, result.error
    assert any(
        "ml-dev-env:storage: an environment stack" in line and "takes only environment, nodes, access, ssh, lifecycle" in line
        for line in lines
    ), result.error
    assert any("ml-dev-env:nodes.gpuNodes: got ['not-a-cluster-node']" in line for line in lines), result.error


def test_a_cluster_destroy_keeps_what_its_environments_use(renders: dict[str, RunResult]) -> None:
    """`pulumi destroy` of the cluster stack keeps the runtime ImageStream, the SCC and its Role (retainOnDelete), and
    every deployed fact an environment refers to names a kept object."""
    result = renders["barcelona"]
    facts = result.outputs[FACTS_OUTPUT]
    kept = {key(r.inputs): r for r in result.resources if r.options.get("retain_on_delete") and "kind" in r.inputs}
    stream = facts["runtimeImage"].rsplit("/", 1)[1].split(":")[0]
    assert ("ImageStream", facts["namespace"], stream) in kept
    assert ("SecurityContextConstraints", "", facts["scc"]) in kept
    assert ("Role", facts["namespace"], facts["sccRole"]) in kept
    assert {("PersistentVolumeClaim", facts["namespace"], c) for c in facts["sharedClaims"].values()} <= set(kept)


def test_a_cluster_destroy_keeps_the_network_attachments_and_teams_md_lists_every_kept_kind() -> None:
    """With createAttachments the cluster stack creates the NetworkAttachmentDefinitions its environments' pods name
    (`k8s.v1.cni.cncf.io/networks`): retained too, and docs/use/teams.md's destroy section names every kept kind."""

    def attachments(o: dict[str, Any]) -> None:
        o["network"]["rdma"]["createAttachments"] = True
        o["network"]["rdma"]["subnets"] = ["10.0.103.0/24", "10.0.104.0/24", "10.0.105.0/24", "10.0.106.0/24"]

    objects = stack_objects("barcelona")
    attachments(objects)
    cluster = run_objects("barcelona", objects)
    assert cluster.error is None, cluster.error
    kept = {key(r.inputs) for r in cluster.resources if r.options.get("retain_on_delete") and "kind" in r.inputs}
    sts = next(r.inputs for r in cluster.resources if r.inputs.get("kind") == "StatefulSet")
    named = sts["spec"]["template"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]
    used = {n.split("@")[0].split("/")[-1] for n in named.replace(" ", "").split(",")}
    nads = {name for kind, _, name in kept if kind == "NetworkAttachmentDefinition"}
    assert used and used <= nads, (used, kept)
    teams = (ROOT / "docs" / "use" / "teams.md").read_text()
    section = teams.split("## Destroying the cluster stack", 1)[1].split("\n## ", 1)[0].lower()
    words = {"ImageStream": "imagestream", "SecurityContextConstraints": "scc", "Role": "role", "PersistentVolumeClaim": "pvc"}
    words["NetworkAttachmentDefinition"] = "network-attachment-definitions"
    assert set(words) <= {k for k, _, _ in kept}  # what an environment uses (the PipelineRuns are the cluster's own)
    for kind, word in words.items():
        assert word in section, f"teams.md does not say a cluster destroy keeps the {kind}s"


CLUSTER_FILE_MISTAKES: list[tuple[str, str, str, str]] = [
    ("a size", "size: 500Gi", "size: 100GB", "Pulumi.barcelona.yaml: ml-dev-env:storage.volumes[2].size: got '100GB'"),
    ("a key twice", "    count: 2\n", "    count: 2\n    count: 3\n", "Pulumi.barcelona.yaml:"),
    ("an unknown key", "  ml-dev-env:nodes:", "  ml-dev-env:nodez: {}\n  ml-dev-env:nodes:", "Pulumi.barcelona.yaml: ml-dev-env:nodez:"),
    ("broken YAML", "    count: 2\n", "    count: [2\n", "Pulumi.barcelona.yaml:"),
]


@pytest.mark.parametrize(("what", "old", "new", "shown"), CLUSTER_FILE_MISTAKES, ids=[m[0] for m in CLUSTER_FILE_MISTAKES])
@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_a_cluster_file_mistake_names_the_cluster_file(tmp_path: Path, stack: str, what: str, old: str, new: str, shown: str) -> None:
    """Rendered through an environment (what `make render` runs: the cluster stack first, then the environment): the
    one line names Pulumi.barcelona.yaml, never a traceback; the environment's file is only the message's head."""
    main = checkout_with(tmp_path, lambda text: text.replace(old, new, 1))
    assert (tmp_path / "Pulumi.barcelona.yaml").read_text() != (ROOT / "Pulumi.barcelona.yaml").read_text()
    result = run_program(stack, stack_config(tmp_path / f"Pulumi.{stack}.yaml"), dict(PLACEHOLDER_SECRETS), main=main)
    assert result.error is not None
    head, *lines = result.error.strip().splitlines()
    assert head == f"invalid stack configuration in Pulumi.{stack}.yaml:", result.error
    assert len(lines) == 1 and lines[0].startswith(f"  - {shown}"), result.error


def test_an_unknown_cluster_is_one_line(tmp_path: Path) -> None:
    config = env_config("barcelona-bob", environment={"cluster": "nerc", "name": "bob", "namespace": "bob-dev"})
    result = run_program("barcelona-bob", config, dict(PLACEHOLDER_SECRETS))
    assert result.error is not None
    (line,) = result.error.strip().splitlines()[1:]
    assert line.startswith("  - ml-dev-env:environment.cluster: got 'nerc'; no cluster stack file Pulumi.nerc.yaml in this project")


# ------------------------------------------------------------------------------------------ names


def names_of(result: RunResult) -> set[tuple[str, str, str]]:
    """Every (kind, namespace, name) a run creates, the per-pod claims of its StatefulSet's templates included
    (`<template>-<statefulset>-<ordinal>`: kubernetes pkg/controller/statefulset/stateful_set_utils.go getPersistentVolumeClaimName)."""
    out = {key(obj) for obj in objects(result) if not obj["kind"].endswith("Patch")}
    for sts in (o for o in objects(result) if o["kind"] == "StatefulSet"):
        for template in sts["spec"].get("volumeClaimTemplates") or []:
            for ordinal in range(8):
                name = f"{template['metadata']['name']}-{sts['metadata']['name']}-{ordinal}"
                out.add(("PersistentVolumeClaim", sts["metadata"]["namespace"], name))
    return out


def candidate_names(renders: dict[str, RunResult], app: str) -> set[str]:
    """Environment names made from every suffix the cluster and the examples render: what follows `<appName>-` in
    each name, and each of its `-`-separated beginnings (`wait-2b0d…` gives `wait` and `wait-2b0d…`)."""
    out: set[str] = set()
    for result in renders.values():
        for _, _, name in names_of(result):
            rest = name.split(f"{app}-", 1)[1] if f"{app}-" in name else ""
            words = rest.split("-")
            out |= {"-".join(words[:i]) for i in range(1, len(words) + 1) if naming.DNS_LABEL.match("-".join(words[:i]))}
    return {n for n in out if n} | {f"alice-{n}" for n in out if n and len(n) < 20}


def test_every_name_the_cluster_renders_follows_appname_with_a_reserved_word(renders: dict[str, RunResult]) -> None:
    for stack in ["barcelona", "nerc-production", *ENVIRONMENTS]:
        result = renders.get(stack) or render(stack)
        app = stack_objects(stack)["cluster"]["appName"] if "cluster" in stack_objects(stack) else None
        cluster_raw = stack_objects(stack if app else stack_objects(stack)["environment"]["cluster"])
        app = app or f"{cluster_raw['cluster']['appName']}-{stack_objects(stack)['environment']['name']}"
        reserved = reserved_words(cluster_raw)
        for kind, _, name in names_of(result):
            if name.startswith(f"{app}-") and not name.startswith(tuple(f"{app}-{e}-" for e in ("alice", "bob"))):
                word = name[len(app) + 1 :].split("-")[0]
                assert word in reserved or word.isdigit(), f"{kind} {name}: {word!r} is no reserved word (core/naming.py APP_SUFFIX_WORDS)"


def test_no_environment_name_collides_with_another_stack_or_it_is_refused_in_one_line(renders: dict[str, RunResult]) -> None:
    app = stack_objects("barcelona")["cluster"]["appName"]
    taken: dict[tuple[str, str, str], str] = {}
    for stack, result in renders.items():
        for name in names_of(result):
            taken[name] = stack
    candidates = sorted(candidate_names(renders, app) - {"alice", "bob"})
    assert {"wait", "headless", "alice-headless", "0", "datasets", "usage", "vscode"} <= set(candidates)
    accepted = []
    for candidate in candidates:
        for namespace in (None, "carol-dev"):
            objects_ = stack_objects("barcelona-alice")
            objects_["environment"] = {"cluster": "barcelona", "name": candidate, **({"namespace": namespace} if namespace else {})}
            config = {f"ml-dev-env:{k}": v for k, v in objects_.items()}
            # what the program checks first (stacks/loader.py check); only an accepted name is rendered
            _, problems = check(flatten(config)[0], set(SECRET_KEYS), ROOT)
            if problems:
                assert problems == [line for line in problems if line.startswith(f"ml-dev-env:environment.name: got {candidate!r}; ")]
                assert len(problems) == 1, problems
                continue
            result = run_program(
                f"barcelona-{candidate}", config, dict(PLACEHOLDER_SECRETS), stack_outputs={CLUSTER_REF: renders["barcelona"].outputs}
            )
            assert result.error is None, result.error
            accepted.append(candidate)
            clash = names_of(result) & set(taken)
            assert not clash, f"environment {candidate!r} renders {sorted(clash)[0]} of {taken[sorted(clash)[0]]}"
    assert accepted  # some names made from the suffixes are fine (e.g. the hash of a build: `2b0db34724` is no word)


# ------------------------------------------------------------------------------------------ ownership guard


def transform(reader: Any, stack: str = "barcelona-alice", name: str = "ml-dev-env-alice") -> Any:
    args = pulumi.ResourceTransformationArgs(
        resource=None,  # type: ignore[arg-type]  # no Resource exists outside a Pulumi run; the transform never reads it
        type_="kubernetes:apps/v1:StatefulSet",
        name="gpu-statefulset",
        props={"metadata": {"name": name, "namespace": "nccl-test", "labels": {"a": "b"}}, "spec": {}},
        opts=pulumi.ResourceOptions(),
    )
    return stack_label_transformation(stack, reader)(args)


def test_the_guard_stops_a_second_owner_with_one_line_naming_both_stacks() -> None:
    reads: list[str] = []

    def live(path: str) -> dict[str, Any]:
        reads.append(path)
        return {"metadata": {"labels": {STACK_LABEL: "barcelona-bob"}}}

    with pytest.raises(pulumi.RunError) as err:
        transform(live)
    assert reads == ["/apis/apps/v1/namespaces/nccl-test/statefulsets/ml-dev-env-alice"]
    message = str(err.value)
    assert "\n" not in message and "'barcelona-bob'" in message and "'barcelona-alice'" in message
    assert "StatefulSet nccl-test/ml-dev-env-alice" in message


@pytest.mark.parametrize(
    "live", [None, {"metadata": {"labels": {"app": "by-hand"}}}, {"metadata": {"labels": {STACK_LABEL: "barcelona-alice"}}}]
)
def test_the_guard_adopts_unowned_objects_and_keeps_its_own(live: Any) -> None:
    result = transform(lambda path: live)
    assert result.props["metadata"]["labels"] == {"a": "b", STACK_LABEL: "barcelona-alice"}


def test_api_paths_of_the_kinds_the_program_creates() -> None:
    assert api_path("kubernetes:core/v1:ServiceAccount", "ns", "x") == "/api/v1/namespaces/ns/serviceaccounts/x"
    assert (
        api_path("kubernetes:networking.k8s.io/v1:NetworkPolicy", "ns", "x") == "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/x"
    )
    assert (
        api_path("kubernetes:security.openshift.io/v1:SecurityContextConstraints", None, "x")
        == "/apis/security.openshift.io/v1/securitycontextconstraints/x"
    )
    assert api_path("ml-dev-env:cluster:GpuCluster", "ns", "x") is None
    assert ownership_conflict({"metadata": {}}, "a", "ConfigMap", "ns", "x") is None


# ------------------------------------------------------------------------------------------ the guard fails fast


@pytest.fixture
def silent_api() -> Iterator[str]:
    """An API server that accepts connections and never answers (a black-holed API behind a load balancer)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def kubeconfig(server: str) -> dict[str, Any]:
    return {
        "current-context": "c",
        "contexts": {"c": {"cluster": "k", "user": "u"}},
        "clusters": {"k": {"server": server}},
        "users": {"u": {"token": "t"}},
    }


def test_a_silent_api_costs_one_check_and_one_warning(silent_api: str) -> None:
    calls: list[tuple[str, float]] = []
    warnings: list[str] = []

    class Counting(KubeClient):
        def get(self, path: str, timeout: float = 20) -> dict[str, Any] | None:
            calls.append((path, timeout))
            return super().get(path, timeout=0.3)  # the real client, against the silent server (0.3 s: the test's own bound)

    reader = guarded_reader(lambda: Counting(config=kubeconfig(silent_api)), warnings.append)
    assert reader is None  # no reads at all: every object of the run goes unchecked, not 48 timeouts
    assert calls == [(PROBE_PATH, READ_TIMEOUT)] and READ_TIMEOUT * 2 <= 30
    (warning,) = warnings
    assert "could not reach the cluster's API" in warning and "timed out" in warning


def test_an_api_that_stops_answering_costs_one_failed_read() -> None:
    answers: list[Any] = [{"major": "1"}, LiveReadError("GET /x: timed out")]
    calls: list[str] = []
    warnings: list[str] = []

    class Scripted:
        def get(self, path: str, timeout: float = 20) -> dict[str, Any] | None:
            calls.append(path)
            answer = answers.pop(0) if answers else {"metadata": {}}
            if isinstance(answer, Exception):
                raise answer
            return dict(answer)

    reader = guarded_reader(Scripted, warnings.append)
    assert reader is not None
    assert [reader(f"/api/v1/namespaces/ns/configmaps/c{i}") for i in range(48)] == [None] * 48
    assert calls == [PROBE_PATH, "/api/v1/namespaces/ns/configmaps/c0"] and len(warnings) == 1


def test_an_own_namespace_without_its_attachments_stops_with_one_line() -> None:
    """carol-dev lacks two of the four SR-IOV attachments: one line naming them and the SriovNetwork recipe."""
    names = ["eno5np0-network", "eno6np0-network", "eno7np0-network", "eno8np0-network"]
    present = {nad_path("carol-dev", n) for n in names[:2]}
    reads: list[str] = []

    def get(path: str) -> dict[str, Any] | None:
        reads.append(path)
        return {"metadata": {}} if path in present else None

    problem = attachments_problem(get, "carol-dev", names, 1800)
    assert problem is not None and "\n" not in problem and len(reads) == 4
    assert problem.startswith(
        "ml-dev-env:environment.namespace: carol-dev has no NetworkAttachmentDefinition eno7np0-network, eno8np0-network"
    )
    assert "SriovNetwork per attachment in openshift-sriov-network-operator with spec.networkNamespace: carol-dev" in problem
    assert attachments_problem(lambda path: {"metadata": {}}, "carol-dev", names, 1800) is None


def test_preview_compares_gpus_per_pod_with_the_nodes_allocatable() -> None:
    nodes: dict[str, dict[str, Any]] = {
        "/api/v1/nodes/a": {"status": {"allocatable": {"nvidia.com/gpu": "4"}}},
        "/api/v1/nodes/b": {"status": {"allocatable": {}}},
    }

    def get(path: str) -> dict[str, Any] | None:
        return nodes.get(path)

    assert gpu_capacity_problem(get, ["a"], 4) is None
    problem = gpu_capacity_problem(get, ["a", "b", "gone"], 8)
    assert problem == (
        "ml-dev-env:nodes.gpusPerPod: got 8; the nodes' allocatable nvidia.com/gpu is lower on a (4), b (0): such a pod stays "
        "Pending; ask for at most that many, or choose other nodes.gpuNodes"
    )


def test_an_environment_on_its_clusters_scc_adds_what_that_scc_allows() -> None:
    """The cluster stack's SCC (createScc) allows root's sshd's SYS_CHROOT also when the cluster file lists the default
    capabilities only: its environments' pods add it too, and no warning says otherwise."""
    from stacks.environment import environment_config
    from stacks.loader import warnings_for

    cluster = stack_objects("barcelona")
    cluster["security"]["memlock"].pop("capabilities")
    raw, problems = environment_config(cluster, stack_objects("barcelona-alice"))
    memlock = raw["security"]["memlock"]
    assert problems == [] and memlock["createScc"] is False and memlock["capabilities"] == ["IPC_LOCK", "SYS_RESOURCE", "SYS_CHROOT"]
    assert not [w for w in warnings_for(StackConfig.model_validate(raw)) if "SYS_CHROOT" in w]


# ------------------------------------------------------------------------------------------ usage recorders' node reads


def recorder_of(result: RunResult) -> dict[str, str]:
    """The usage recorder's ServiceAccount of a render, as a binding subject."""
    (sts,) = [o for o in objects(result) if o["kind"] == "StatefulSet"]
    meta = sts["metadata"]
    return {"kind": "ServiceAccount", "name": naming.usage_recorder(meta["name"]), "namespace": meta["namespace"]}


def node_reader_bindings(result: RunResult) -> list[dict[str, Any]]:
    """Every binding a render makes of a node reader (cluster-scoped, or in kube-node-lease)."""
    return [
        o
        for o in objects(result)
        if o["kind"] == "ClusterRoleBinding" or (o["kind"] == "RoleBinding" and o["metadata"].get("namespace") == "kube-node-lease")
    ]


def env_warnings(result: RunResult) -> list[str]:
    return [w for w in result.warnings if w.startswith("lifecycle.usageReadsNodes:")]


def test_the_cluster_stack_binds_every_environments_recorder_to_its_node_reader(renders: dict[str, RunResult]) -> None:
    """The committed environments (alice in the cluster's namespace, bob in his own): one ClusterRoleBinding and one
    RoleBinding in kube-node-lease, both naming the cluster's recorder and each environment's, and the facts say so."""
    cluster = renders["barcelona"]
    expected = [recorder_of(cluster), *(recorder_of(renders[s]) for s in ENVIRONMENTS)]
    assert {s["namespace"] for s in expected} == {"nccl-test", "bob-dev"}  # the premise: another namespace too
    bindings = node_reader_bindings(cluster)
    assert sorted(b["kind"] for b in bindings) == ["ClusterRoleBinding", "RoleBinding"]
    for binding in bindings:
        assert binding["subjects"] == expected, binding["kind"]
    assert cluster.outputs[FACTS_OUTPUT]["usageNodeReaders"] == [f"{s['namespace']}/{s['name']}" for s in expected]
    for stack in ENVIRONMENTS:
        assert node_reader_bindings(renders[stack]) == [], "an environment stack creates no such binding itself"
        assert env_warnings(renders[stack]) == [], "granted by the cluster's up: nothing to say"


def test_an_environment_added_to_the_checkout_is_bound_by_the_clusters_next_up(tmp_path: Path) -> None:
    main = checkout_with(tmp_path, lambda text: text)
    (tmp_path / "Pulumi.barcelona-carol.yaml").write_text(
        "config:\n  ml-dev-env:environment:\n    cluster: barcelona\n    name: carol\n    namespace: carol-dev\n"
        "  ml-dev-env:nodes:\n    count: 1\n    gpusPerPod: 1\n    gpuNodes: [moc-r4pcc02u17-nairr]\n"
    )
    result = run_program(
        "barcelona", stack_config(tmp_path / "Pulumi.barcelona.yaml"), dict(PLACEHOLDER_SECRETS), main=main, stack_outputs={}
    )
    assert result.error is None, result.error
    carol = {"kind": "ServiceAccount", "name": "ml-dev-env-carol-usage", "namespace": "carol-dev"}
    for binding in node_reader_bindings(result):
        assert carol in binding["subjects"] and len(binding["subjects"]) == 4, binding
    assert "carol-dev/ml-dev-env-carol-usage" in result.outputs[FACTS_OUTPUT]["usageNodeReaders"]


@pytest.mark.parametrize("stack", ENVIRONMENTS)
@pytest.mark.parametrize("deployed_by", ["before it was added", "an older program"])
def test_an_environment_the_clusters_last_up_did_not_bind_says_so_in_one_line(
    renders: dict[str, RunResult], deployed: dict[str, Any], stack: str, deployed_by: str
) -> None:
    """Added after the cluster's last `up` (its facts name the other recorders), or a cluster deployed before the facts
    said: the environment's preview and render say once to re-run the cluster's `up`, and the environment still deploys
    (its recorder reads the pods alone meanwhile, tests/inpod/usage/test_usage.py)."""
    me = recorder_of(renders[stack])
    readers = [r for r in deployed[FACTS_OUTPUT]["usageNodeReaders"] if r != f"{me['namespace']}/{me['name']}"]
    result = run_env(stack, facts_of(deployed, usageNodeReaders=readers if deployed_by.startswith("before") else DROP))
    assert result.error is None, result.error
    (line,) = env_warnings(result)
    assert f"({me['namespace']}/{me['name']})" in line and f"run `pulumi up` of {CLUSTER_REF} again" in line, line
    assert "\n" not in line


def test_usage_reads_nodes_false_makes_no_cluster_scoped_object_and_no_line(tmp_path: Path) -> None:
    """On the cluster stack: no ClusterRole, no binding, nothing in kube-node-lease, for nobody; its environments say
    nothing (there is no `up` that would grant them)."""
    main = checkout_with(tmp_path, lambda text: text + "  ml-dev-env:lifecycle:\n    usageReadsNodes: false\n")
    cluster = run_program(
        "barcelona", stack_config(tmp_path / "Pulumi.barcelona.yaml"), dict(PLACEHOLDER_SECRETS), main=main, stack_outputs={}
    )
    assert cluster.error is None, cluster.error
    scoped = [o for o in objects(cluster) if o["kind"].startswith("Cluster") or o["metadata"].get("namespace") == "kube-node-lease"]
    assert [key(o) for o in scoped if "usage" in o["metadata"]["name"]] == []
    assert cluster.outputs[FACTS_OUTPUT]["usageNodeReaders"] == [], "the facts say: nobody's recorder reads the nodes"
    for stack in ENVIRONMENTS:
        result = run_env(stack, cluster.outputs, env_config(stack), main)
        assert result.error is None and env_warnings(result) == [], result.warnings


def test_an_environment_that_turns_node_reads_off_is_left_out_and_says_nothing(tmp_path: Path) -> None:
    main = checkout_with(tmp_path, lambda text: text)
    bob = tmp_path / "Pulumi.barcelona-bob.yaml"
    bob.write_text(
        bob.read_text().replace("  ml-dev-env:access:", "  ml-dev-env:lifecycle:\n    usageReadsNodes: false\n  ml-dev-env:access:")
    )
    cluster = run_program(
        "barcelona", stack_config(tmp_path / "Pulumi.barcelona.yaml"), dict(PLACEHOLDER_SECRETS), main=main, stack_outputs={}
    )
    assert cluster.error is None, cluster.error
    readers = cluster.outputs[FACTS_OUTPUT]["usageNodeReaders"]
    assert "nccl-test/ml-dev-env-alice-usage" in readers and not any(r.startswith("bob-dev/") for r in readers), readers
    result = run_env("barcelona-bob", cluster.outputs, stack_config(bob), main)
    assert result.error is None and env_warnings(result) == [], result.warnings
