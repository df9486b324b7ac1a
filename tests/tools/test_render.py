"""`make render` tells what `pulumi preview` would: secrets, cluster prerequisites, objects needing admin."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.naming import node_reader, stack_scc_name
from stacks.config import StackConfig
from tests.conftest import ROOT, STACKS, run_objects, stack_objects
from tools import render
from tools.prerequisites import Need, admin_needs, image_needs, prerequisites, secret_status


def rendered(stack: str, mutate: Callable[[dict[str, Any]], None] | None = None, with_patches: bool = False) -> Any:
    """The validated config and the Kubernetes objects a (mutated) committed stack creates (and patches)."""
    objects = stack_objects(stack)
    if mutate:
        mutate(objects)
    result = run_objects(stack, objects, {"vscodePassword": "x", "jupyterToken": "y"})
    assert result.error is None, result.error
    created = [render.manifest(r) for r in result.resources if not r.typ.endswith("Patch")]
    patched = [render.manifest(r) for r in result.resources if r.typ.endswith("Patch")]
    config = StackConfig.model_validate(objects)
    created = [m for m in created if m is not None]
    return (config, created, [m for m in patched if m is not None]) if with_patches else (config, created)


def find(needs: list[Need], start: str) -> list[Need]:
    return [n for n in needs if n.what.startswith(start)]


def test_barcelona_prerequisites_follow_from_its_config() -> None:
    config, objects = rendered("barcelona")
    needs = prerequisites(config, objects)
    rdma = config.network.rdma

    [namespace] = find(needs, "namespace ")
    assert namespace.what == f"namespace {config.cluster.namespace} exists" and "createNamespace is false" in namespace.why
    [nads] = find(needs, "NetworkAttachmentDefinitions")
    assert nads.what == f"NetworkAttachmentDefinitions in namespace {config.cluster.namespace}: {', '.join(rdma.attachments)}"
    assert "StatefulSet/" in nads.why and "createAttachments is false" in nads.why

    classes = {n.what for n in find(needs, "StorageClass ")}
    volumes = {v.storage_class for v in config.storage.volumes} | {config.model_pipeline.storage_class}
    matches = [re.match(r"StorageClass (\S+)", c) for c in classes]
    assert all(matches), f"every need starts 'StorageClass <name>': {sorted(classes)}"
    assert {m[1] for m in matches if m} == volumes
    assert "StorageClass nfs-csi (ReadWriteMany)" in classes  # the shared datasets volume

    [gpu] = find(needs, "NVIDIA GPU operator")
    assert f"nvidia.com/gpu.product={config.nodes.gpu_product}" in gpu.what
    [pinned] = find(needs, "nodes ")
    assert pinned.what == f"nodes {', '.join(config.nodes.gpu_nodes)}"
    [sriov] = find(needs, "SR-IOV network operator")
    assert sriov.what == f"SR-IOV network operator: nodes advertise {', '.join(sorted(rdma.sriov_resources))}"
    [tekton] = find(needs, "OpenShift Pipelines operator")
    assert {"Pipeline", "PipelineRun", "Task"} <= set(tekton.why.split(": ", 1)[1].split(", "))
    [registry] = find(needs, "model registry at ")
    assert registry.what == f"model registry at {config.model_pipeline.registry_url}"
    assert all(n.check.startswith("oc get ") for n in needs)


def test_tcp_stack_without_models_needs_no_rdma_operators_or_pipelines() -> None:
    config, objects = rendered("nerc-production")
    whats = [n.what for n in prerequisites(config, objects)]
    assert not [w for w in whats if w.startswith(("NetworkAttachmentDefinitions", "SR-IOV", "OpenShift Pipelines", "model registry"))]
    assert any(w.startswith("NVIDIA GPU operator") for w in whats)
    assert admin_needs(objects, config.cluster.namespace) == []


def test_an_image_the_stack_does_not_build_must_carry_what_the_pods_run(tmp_path: Path) -> None:
    config, objects = rendered("nerc-production")
    [image] = find(prerequisites(config, objects), "image ")
    assert image.what.startswith(f"image {config.image.reference} carries bash, awk, python3 (>= 3.8), sshd, ssh, rsync, ")
    servers = [s.program for s in config.access.enabled() if s.program]
    assert servers and image.what.split("sshd, ssh, rsync, ", 1)[1].startswith(", ".join(servers) + ";")
    assert image.what.endswith("for the fabric check mpirun, all_reduce_perf")  # TCP: no ib_write_bw

    # the check, run for real on an "image" (a PATH) that lacks rsync and code-server
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("bash", "awk", "sshd", "ssh", "jupyter", "tensorboard", "mpirun", "all_reduce_perf"):
        (bin_dir / program).write_text("#!/bin/sh\n")
        (bin_dir / program).chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    argv = shlex.split(image.check)
    assert argv[:3] == ["oc", "run", "image-check"] and f"--image={config.image.reference}" in argv
    assert argv[argv.index("--") - 1] == "--command", "sh replaces the image's entrypoint, not its arguments"
    assert argv[argv.index("--") + 1 : argv.index("--") + 3] == ["sh", "-c"]
    script = argv[argv.index("--") + 3]
    probe = subprocess.run(["/bin/sh", "-c", script], env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60)
    assert probe.stdout.splitlines()[:2] == ["missing: rsync", "missing: code-server"], probe.stdout + probe.stderr
    assert probe.stdout.splitlines()[2:] == sys.version.splitlines(), "then the interpreter's version (>= 3.8?)"

    def token_rdma(o: dict[str, Any]) -> None:
        o["access"] = {**o.get("access", {}), "auth": "token", "tensorboard": False}
        o["network"] = {"mode": "rdma", "rdma": {"enabled": True, "hcas": ["mlx5_0"], "attachments": ["net1"],
                        "sriovResources": ["openshift.io/roce"], "socketInterfaces": ["net1"]}}  # fmt: skip

    config, objects = rendered("nerc-production", token_rdma)
    [image] = find(prerequisites(config, objects), "image ")
    assert "tensorboard" not in image.what  # off: no login of its own under token auth
    assert image.what.endswith("for the fabric check mpirun, all_reduce_perf, ib_write_bw")
    config, objects = rendered("barcelona")
    assert find(prerequisites(config, objects), "image ") == [], "a stack that builds its image needs none"
    for stack in ("barcelona-alice", "barcelona-bob"):  # environments run the image their cluster stack builds
        settings = render.stack_settings(yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"])
        assert settings.image.build is not None and image_needs(settings) == [], stack

    # an environment on a cluster that runs a given image: checked with the dev servers it enables itself
    (tmp_path / "Pulumi.nerc-production.yaml").write_text((ROOT / "Pulumi.nerc-production.yaml").read_text())
    carol = {"ml-dev-env:environment": {"cluster": "nerc-production", "name": "carol"},
             "ml-dev-env:nodes": {"count": 1, "gpusPerPod": 4}, "ml-dev-env:access": {"jupyter": False}}  # fmt: skip
    settings = render.stack_settings(carol, tmp_path)
    [need] = image_needs(settings)
    assert need.what.startswith(f"image {settings.image.reference} carries ") and "jupyter" not in need.what
    assert "code-server" in need.what and f"-n {settings.cluster.namespace} " in need.check


def _self_contained(o: dict[str, Any]) -> None:
    o["cluster"]["createNamespace"] = True
    o["network"]["rdma"].update(createAttachments=True, subnets=["10.0.103.0/24", "10.0.104.0/24", "10.0.105.0/24", "10.0.106.0/24"])


def test_what_the_stack_creates_is_no_prerequisite_but_may_need_admin() -> None:
    config, objects = rendered("barcelona", _self_contained)
    needs = prerequisites(config, objects)
    assert not find(needs, "namespace ") and not find(needs, "NetworkAttachmentDefinitions")
    admin = {n.what: n.why for n in admin_needs(objects, config.cluster.namespace)}
    assert admin[f"Namespace/{config.cluster.namespace}"] == "cluster-scoped: needs cluster-admin"
    memlock, cluster = config.security.memlock, config.cluster
    assert memlock.scc_name is not None
    created = stack_scc_name(memlock.scc_name, cluster.namespace, cluster.app_name)  # a created SCC is named per stack
    assert admin[f"SecurityContextConstraints/{created}"].startswith("cluster-scoped: needs cluster-admin (ml-dev-env: unlimited memlock")
    # the usage recorder's read of the nodes and their Leases, each saying what it is for
    reader = node_reader(cluster.namespace, cluster.app_name)
    for what, where in (
        ("ClusterRole", ""),
        ("ClusterRoleBinding", ""),
        ("Role", " in namespace kube-node-lease"),
        ("RoleBinding", " in namespace kube-node-lease"),
    ):
        assert "read the nodes and their Leases" in admin[f"{what}/{reader}{where}"], admin


def _existing_scc_and_account(o: dict[str, Any]) -> None:
    o["security"]["memlock"]["createScc"] = False
    o["security"]["createServiceAccount"] = False


def test_objects_the_stack_only_refers_to_are_prerequisites() -> None:
    config, objects, patches = rendered("barcelona", _existing_scc_and_account, with_patches=True)
    needs = prerequisites(config, objects, patches)
    scc, account, ns = config.security.memlock.scc_name, config.security.service_account, config.cluster.namespace
    assert [n.what for n in find(needs, "SecurityContextConstraints ")] == [
        f"SecurityContextConstraints {scc} (created by a cluster admin)"
    ]
    # OpenShift ships `system:openshift:scc:<name>` ClusterRoles only for its own SCCs
    assert [n.what for n in find(needs, "ClusterRole ")] == [f"ClusterRole system:openshift:scc:{scc} (created by an admin)"]
    # the adopted ServiceAccount is patched (OAuth redirect annotations), so it must exist
    assert [(n.what, n.why) for n in find(needs, "ServiceAccount ")] == [
        (f"ServiceAccount {ns}/{account}", "the stack only patches it (created elsewhere)")
    ]
    admin = [n for n in admin_needs(objects + patches, ns) if node_reader(ns, config.cluster.app_name) not in n.what]
    assert [n.what for n in admin] == [f"RoleBinding/{config.cluster.app_name}-scc-{scc}"]
    assert "binds a role granting use of SCC" in admin[0].why and "RBAC escalation check" in admin[0].why
    # the Role a RoleBinding in kube-node-lease names is the rendered one there, no prerequisite
    assert not find(needs, "Role kube-node-lease/") and not find(needs, f"Role {ns}/{node_reader(ns, config.cluster.app_name)}")


def test_a_referenced_service_account_nobody_creates_is_a_prerequisite() -> None:
    config, objects = rendered("nerc-production")
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    sts["spec"]["template"]["spec"]["serviceAccountName"] = "someone-elses"
    assert [n.what for n in find(prerequisites(config, objects), "ServiceAccount ")] == [
        f"ServiceAccount {config.cluster.namespace}/someone-elses"
    ]


def test_admin_marking_is_generic() -> None:
    """Cluster-scoped kinds and objects in another namespace (e.g. a model-registry RoleBinding) are marked."""
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "team"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "registry-user-x", "namespace": "rhoai-model-registries"},
        },
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"}},
    ]
    expected = [
        Need("ClusterRole/reader", "cluster-scoped: needs cluster-admin"),
        Need(
            "RoleBinding/registry-user-x in namespace rhoai-model-registries",
            "outside the stack's namespace team: needs admin in rhoai-model-registries",
        ),
    ]
    assert admin_needs(objects, "team") == expected
    assert admin_needs(objects[::-1], "team") == expected  # the same list whatever order the render registered them in


def test_networks_annotation_forms() -> None:
    from tools.prerequisites import _networks

    assert _networks("a/n1@net1, n2", "ns") == [("a", "n1"), ("ns", "n2")]
    assert _networks('[{"name": "n3", "namespace": "b"}, {"name": "n4"}]', "ns") == [("b", "n3"), ("ns", "n4")]
    assert _networks("", "ns") == []


def test_secret_status_set_means_a_secure_value_in_the_stack_file() -> None:
    objects = stack_objects("barcelona")
    objects["access"] = {"auth": "token", "tensorboard": False}
    config = StackConfig.model_validate(objects)
    stack_file = {f"ml-dev-env:{k}": v for k, v in objects.items()}
    stack_file["ml-dev-env:hfToken"] = {"secure": "v1:abc"}
    stack_file["ml-dev-env:s3AccessKeyId"] = {"secure": "v1:def"}
    status = {s.key: s for s in secret_status(config, stack_file)}
    assert set(status) == {"vscodePassword", "jupyterToken", "quayDockerConfigJson", "hfToken", "s3AccessKeyId"}
    assert status["hfToken"].needed and status["hfToken"].is_set
    assert status["quayDockerConfigJson"].needed and not status["quayDockerConfigJson"].is_set
    assert status["vscodePassword"].command == "pulumi config set --secret ml-dev-env:vscodePassword …"
    assert not status["s3AccessKeyId"].needed and status["s3AccessKeyId"].is_set


def test_render_prints_a_summary_with_secrets_prerequisites_and_admin_objects(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "Pulumi.barcelona.yaml").read_text())
    config["config"]["ml-dev-env:hfToken"] = {
        "secure": "v1:AAAAAAAAAAAAAAAA:AAAAAAAAAAAAAAAAAAAAAAAA"
    }  # well-formed passphrase ciphertext (stacks/stackfile.py)
    (tmp_path / "Pulumi.demo.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, str(Path(render.__file__)), "demo", "--config-dir", str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    written = len(list((tmp_path / "out" / "demo").iterdir()))
    assert f"== {written} Kubernetes objects written to " in out
    assert re.search(r"^  .*\bStatefulSet 1\b", out, re.M)
    assert not re.search(r"^OK ", out, re.M), "valid objects must not be listed one by one"
    assert f"== schema check: {written} ok, 0 invalid" in out
    assert "  hfToken: set — " in out
    assert "  quayDockerConfigJson: missing — " in out
    assert "      pulumi config set --secret ml-dev-env:quayDockerConfigJson …" in out
    assert "pulumi preview stops until 1 missing secret(s) are set" in out
    assert "== cluster prerequisites" in out and "  - NetworkAttachmentDefinitions in namespace nccl-test: " in out
    assert "== needs more than namespace admin in nccl-test (7 objects)" in out
    scc = stack_scc_name("nccl-rdma-scc", "nccl-test", "ml-dev-env")
    assert f"  - SecurityContextConstraints/{scc}: cluster-scoped: needs cluster-admin (ml-dev-env: unlimited memlock" in out


def test_schema_check_detail_only_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = render.run_program

    def broken(*args: Any, **kwargs: Any):
        result = real(*args, **kwargs)
        sts = next(r for r in result.resources if r.typ == "kubernetes:apps/v1:StatefulSet")
        sts.inputs["spec"]["replicaz"] = 2
        return result

    monkeypatch.setattr(render, "run_program", broken)
    assert render.render("nerc-production", tmp_path) == 1
    out = capsys.readouterr()
    assert "schema check" in out.out and "FAILED" in out.out
    assert "replicaz" in out.out
    assert "fail the schema check" in out.err


def test_attachments_in_another_namespace_are_listed_there() -> None:
    config, objects = rendered("barcelona", lambda o: o["network"]["rdma"].update(attachmentNamespace="sriov-networks"))
    [nads] = find(prerequisites(config, objects), "NetworkAttachmentDefinitions")
    assert nads.what == f"NetworkAttachmentDefinitions in namespace sriov-networks: {', '.join(config.network.rdma.attachments)}"
    assert nads.check == "oc get network-attachment-definitions -n sriov-networks"


def python_reprs(value: Any, where: str = "") -> list[str]:
    """Where a value (walked through mappings and lists) holds a string that is a Python repr of a dict or list:
    `ast.literal_eval` reads it as one and JSON does not (a stringified dict, a list printed with str())."""
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in python_reprs(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in python_reprs(v, f"{where}[{i}]")]
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            return []
        try:
            json.loads(value)
        except ValueError:
            return [where] if isinstance(parsed, dict | list | tuple) else []
    return []


@pytest.mark.parametrize("stack", STACKS)
def test_no_output_of_a_committed_stack_is_a_python_repr(stack: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`make render`'s outputs section is YAML that reads back as the outputs themselves (nested mappings and lists as
    blocks, multi-line strings as literal blocks); no output value is a stringified Python dict or list. Before issue 52
    the section printed `environment_facts: {'version': 1, ...}`, which YAML reads as a flow mapping only by luck and
    `model_runs`' values (`'{.status…}{"\\n"}'`) not at all."""
    result = run_objects(stack, stack_objects(stack))
    assert result.error is None, result.error
    assert python_reprs(result.outputs, stack) == []
    assert render.render(stack, tmp_path, validate=False) == 0
    out = capsys.readouterr().out
    section = out.split(f"\n== outputs ({stack})\n", 1)[1].split("\n\n== ", 1)[0]
    assert not re.search(r"[{\[]'", section), section  # no `{'key': …}` / `['a', …]` anywhere
    shown = yaml.safe_load(textwrap.dedent(section))
    secret = {k: "[secret]" for k in result.secret_outputs}
    assert shown == {**flatten_outputs(result.outputs), **secret}


def flatten_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """The outputs as plain data (what `pulumi stack output --json` prints)."""
    return json.loads(json.dumps(outputs))


def test_a_python_repr_is_found_where_json_is_not() -> None:
    assert python_reprs({"a": {"b": ["x", "{'version': 1}"]}, "c": "['p', 'q']"}, "s") == ["s.a.b[1]", "s.c"]
    assert python_reprs({"ok": '{"version": 1}', "cmd": "oc get x -o jsonpath='{.status}'", "list": ["[1]"]}) == []


def test_an_environment_needs_its_clusters_shared_claims_and_every_api_it_uses() -> None:
    result = run_objects("barcelona-alice", stack_objects("barcelona-alice"))
    assert result.error is None, result.error
    config = render.stack_settings({f"ml-dev-env:{k}": v for k, v in stack_objects("barcelona-alice").items()})
    objects = [m for m in (render.manifest(r) for r in result.resources if not r.typ.endswith("Patch")) if m is not None]
    needs = prerequisites(config, objects)
    shared = [v for v in config.storage.volumes if v.scope == "shared"]
    assert shared
    [claims] = find(needs, "PersistentVolumeClaims in namespace ")
    names = sorted(f"ml-dev-env-{v.name}" for v in shared)
    assert (
        claims.what
        == f"PersistentVolumeClaims in namespace {config.cluster.namespace}: {', '.join(names)} (created by the cluster stack barcelona)"
    )
    assert claims.check == f"oc get pvc -n {config.cluster.namespace} {' '.join(names)}"
    [registry] = find(needs, "OpenShift's internal image registry")
    assert "managementState" in registry.check
    assert [n.what for n in find(needs, "API ")] == ["API route.openshift.io/v1 served by openshift-apiserver"]


def test_every_api_group_beyond_kubernetes_has_its_line() -> None:
    config, objects = rendered("barcelona")
    groups = {str(o["apiVersion"]).rpartition("/")[0] for o in objects} - {
        "",
        "apps",
        "batch",
        "rbac.authorization.k8s.io",
        "networking.k8s.io",
        "tekton.dev",
    }
    lines = {n.what.split()[1].split("/")[0]: n for n in find(prerequisites(config, objects), "API ")}
    assert set(lines) == groups and groups >= {"route.openshift.io", "build.openshift.io", "image.openshift.io", "security.openshift.io"}
    assert all(n.check == f"oc get apiservice v1.{g}" for g, n in lines.items())
    assert not find(prerequisites(config, objects), "PersistentVolumeClaims in namespace ")  # the cluster stack makes its own
