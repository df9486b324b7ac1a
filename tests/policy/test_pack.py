"""The pulumi-policy pack: it builds from `rules.POLICIES`, its adapters tolerate preview unknowns, and
served the way the Pulumi CLI runs it (`python policy/`), it answers the analyzer protocol."""

from __future__ import annotations

import importlib
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.policy import PolicyCustomTimeouts
from pulumi_policy.proxy import UnknownValueError, unknown_checking_proxy

from policy import rules
from tests.conftest import run_objects, stack_objects
from tests.policy.objects import UNKNOWN, container, oauth_proxy, route, service, statefulset

ROOT = Path(__file__).resolve().parents[2]
PACK = importlib.import_module("policy.__main__")  # importing builds policies but serves nothing


def test_pack_project_file_is_a_python_pack() -> None:
    project = yaml.safe_load((ROOT / "policy" / "PulumiPolicy.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    venv = ROOT / "policy" / project["runtime"]["options"]["virtualenv"]
    assert venv.resolve() == (ROOT / ".venv").resolve()
    pins = {line.split("==")[0]: line for line in (ROOT / "policy" / "requirements.txt").read_text().splitlines() if "==" in line}
    project_pins = (ROOT / "requirements.txt").read_text() + (ROOT / "requirements-dev.txt").read_text()
    assert pins and all(pin in project_pins.splitlines() for pin in pins.values()), "policy/requirements.txt drifted from the project pins"


def test_policies_mirror_the_rules_catalogue() -> None:
    policies = PACK.build_policies()
    assert [p.name for p in policies] == [*rules.POLICY_NAMES, "api-server-accepts"]
    for policy, spec in zip(policies, (*rules.POLICIES, rules.API_SERVER_ACCEPTS), strict=True):
        assert isinstance(policy, StackValidationPolicy if spec.scope == "stack" else ResourceValidationPolicy)
        assert policy.enforcement_level == (EnforcementLevel.MANDATORY if spec.level == "mandatory" else EnforcementLevel.ADVISORY)
        assert policy.description == spec.description and policy.remediation_steps
    levels = {p.name: p.enforcement_level for p in policies}
    assert levels["route-tls-redirect"] == EnforcementLevel.ADVISORY
    assert sum(level == EnforcementLevel.MANDATORY for level in levels.values()) == 13
    assert {p.name for p in policies if isinstance(p, StackValidationPolicy)} == {
        "routes-require-authentication",
        "privileges-require-scc-binding",
        "ssh-only-from-stack-pods",
        "ingress-by-design",
        "user-secrets-stay-the-users",
    }


def test_main_builds_the_named_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    built: dict[str, Any] = {}
    monkeypatch.setattr(PACK, "PolicyPack", lambda name, **kwargs: built.update(name=name, **kwargs))
    PACK.main()
    assert built["name"] == "ml-dev-env-guardrails"
    assert built["enforcement_level"] == EnforcementLevel.MANDATORY and "| `route-tls-redirect` | advisory |" in built["readme"]
    assert [p.name for p in built["policies"]] == [*rules.POLICY_NAMES, "api-server-accepts"]


def test_plain_unwraps_proxies_and_keeps_unknowns() -> None:
    proxied = unknown_checking_proxy({"a": {"b": [1, UNKNOWN, {"c": UNKNOWN}]}, "d": UNKNOWN})
    with pytest.raises(UnknownValueError):
        _ = proxied["d"]
    assert PACK.plain(proxied) == {"a": {"b": [1, UNKNOWN, {"c": UNKNOWN}]}, "d": UNKNOWN}


def _opts() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], None)


def _by_name(name: str) -> Any:
    return next(p for p in PACK.build_policies() if p.name == name)


def test_resource_adapter_reports_and_tolerates_unknowns() -> None:
    reports: list[tuple[str, str | None]] = []
    typ, inputs, _ = statefulset("app", [container(image="busybox"), container("later", image=UNKNOWN)])
    args = ResourceValidationArgs(typ, unknown_checking_proxy(inputs), "urn:x", "app", _opts(), None)
    _by_name("images-pinned").validate(args, lambda message, urn=None: reports.append((message, urn)))
    assert len(reports) == 1 and "image 'busybox' has no tag" in reports[0][0] and reports[0][1] is None


def test_resource_adapter_cannot_see_retain_on_delete_and_stays_quiet() -> None:
    reports: list[str] = []
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"}, "spec": {}}
    args = ResourceValidationArgs("kubernetes:core/v1:PersistentVolumeClaim", unknown_checking_proxy(pvc), "urn:x", "data", _opts(), None)
    _by_name("persistent-data-retained").validate(args, lambda message, urn=None: reports.append(message))
    assert reports == []


def test_stack_adapter_reports_against_the_offending_urn() -> None:
    items = [
        statefulset("app", [container("server", ports=[{"name": "http", "containerPort": 80}]), oauth_proxy()]),
        service("app", {"app": "app"}, [{"name": "web", "port": 80, "targetPort": "http"}]),
        route("app", "app", "web"),
        route("later", UNKNOWN, "web"),
    ]
    resources = [
        PolicyResource(typ, unknown_checking_proxy(inputs), f"urn:{i}", f"r{i}", _opts(), None, None, [], {})
        for i, (typ, inputs, _) in enumerate(items)
    ]
    reports: list[tuple[str, str | None]] = []
    _by_name("routes-require-authentication").validate(
        StackValidationArgs(resources), lambda message, urn=None: reports.append((message, urn))
    )
    assert [urn for _, urn in reports] == ["urn:2"]
    assert reports[0][0].startswith("Route team/app: Service app port web -> StatefulSet team/app port 'http'")


# ----------------------------------------------------------------- the pack as the CLI runs it


@pytest.fixture
def analyzer(tmp_path: Path) -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """`python policy/` from another directory (what pulumi-language-python does), over gRPC."""
    # -u and a deadline on the read: the port line must never wait in a block buffer (without PYTHONUNBUFFERED
    # the child's stdout is a pipe, fully buffered), and a pack that never prints fails instead of hanging
    proc = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "policy")], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        if not ready:
            pytest.fail("`python -u policy/` printed no port within 60 s")
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            proc.kill()
            pytest.fail(f"no port from `python policy/`: {port!r} {proc.communicate(timeout=10)[1]}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def test_served_pack_describes_its_policies(analyzer: analyzer_pb2_grpc.AnalyzerStub) -> None:
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
    assert info.name == "ml-dev-env-guardrails" and "guard rails" in info.readme
    served = {p.name: (p.enforcementLevel, p.policy_type) for p in info.policies}
    assert set(served) == {*rules.POLICY_NAMES, "api-server-accepts"}
    assert served["api-server-accepts"] == (analyzer_pb2.MANDATORY, analyzer_pb2.POLICY_TYPE_RESOURCE)
    assert served["routes-require-authentication"] == (analyzer_pb2.MANDATORY, analyzer_pb2.POLICY_TYPE_STACK)
    assert served["route-tls-redirect"] == (analyzer_pb2.ADVISORY, analyzer_pb2.POLICY_TYPE_RESOURCE)


def test_served_pack_analyzes_a_resource_with_unknowns(analyzer: analyzer_pb2_grpc.AnalyzerStub) -> None:
    typ, inputs, _ = statefulset("app", [container(image="busybox", resources={"requests": {"nvidia.com/gpu": UNKNOWN}})])
    request = analyzer_pb2.AnalyzeRequest(
        type=typ, properties=_struct(inputs), urn="urn:pulumi:s::p::t::app", name="app", options=analyzer_pb2.AnalyzerResourceOptions()
    )
    response = analyzer.Analyze(request, timeout=30)
    assert [(d.policyName, d.enforcementLevel) for d in response.diagnostics] == [("images-pinned", analyzer_pb2.MANDATORY)]
    assert "image 'busybox' has no tag" in response.diagnostics[0].message


def test_served_pack_refuses_what_the_api_server_refuses(analyzer: analyzer_pb2_grpc.AnalyzerStub) -> None:
    """The schema check runs at preview: an unknown field and a name the API server refuses; unknowns pass."""
    typ, inputs, _ = statefulset("app", [container(image="busybox:1@sha256:" + "0" * 64)])
    inputs["spec"]["replicaz"] = 2
    inputs["spec"]["serviceName"] = UNKNOWN
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"}, "spec": {"storageClassName": "NFS_Client"}}
    diagnostics = []
    for i, (t, props) in enumerate([(typ, inputs), ("kubernetes:core/v1:PersistentVolumeClaim", claim)]):
        request = analyzer_pb2.AnalyzeRequest(
            type=t, properties=_struct(props), urn=f"urn:{i}", name=f"r{i}", options=analyzer_pb2.AnalyzerResourceOptions()
        )
        diagnostics += [d for d in analyzer.Analyze(request, timeout=30).diagnostics if d.policyName == "api-server-accepts"]
    messages = [d.message for d in diagnostics]
    assert len(messages) == 2, messages
    assert "spec.replicaz: unknown field" in messages[0]
    assert 'spec.storageClassName: "NFS_Client": storage class name: a lowercase RFC 1123 subdomain' in messages[1]


def test_served_pack_analyzes_the_stack(analyzer: analyzer_pb2_grpc.AnalyzerStub) -> None:
    items = [
        statefulset("app", [container("server", ports=[{"name": "http", "containerPort": 80}])]),
        service("app", {"app": "app"}, [{"name": "web", "port": 80, "targetPort": "http"}]),
        route("app", "app", "web"),
    ]
    resources = [
        analyzer_pb2.AnalyzerResource(
            type=typ, properties=_struct(inputs), urn=f"urn:{i}", name=f"r{i}", options=analyzer_pb2.AnalyzerResourceOptions()
        )
        for i, (typ, inputs, _) in enumerate(items)
    ]
    response = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources), timeout=30)
    assert [(d.policyName, d.urn) for d in response.diagnostics] == [("routes-require-authentication", "urn:2")]


def test_readme_documents_every_policy_with_its_level() -> None:
    readme = (ROOT / "policy" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \| (mandatory|advisory)", readme, flags=re.M))
    assert rows == {spec.name: spec.level for spec in (*rules.POLICIES, rules.API_SERVER_ACCEPTS)}


@pytest.mark.parametrize("stack", ["barcelona", "nerc-production"])
def test_a_suspended_stack_passes_the_served_pack(stack: str, analyzer: analyzer_pb2_grpc.AnalyzerStub) -> None:
    """The README's suspend procedure (`lifecycle.suspended: true`) passes the guard rails CI and deploy run."""
    objects = stack_objects(stack)
    objects.setdefault("lifecycle", {})["suspended"] = True
    result = run_objects(stack, objects, {"vscodePassword": "x", "jupyterToken": "y"})
    assert result.error is None, result.error
    sts = [r for r in result.resources if r.kind == "StatefulSet"]
    assert sts and all(r.inputs["spec"]["replicas"] == 0 for r in sts)
    # what `make render` (and so CI and deploy.yml) checks
    found = rules.evaluate((r.typ, r.inputs, r.options) for r in result.resources)
    assert [(v.policy, v.message) for v in found if v.level == rules.MANDATORY] == []
    resources = [
        analyzer_pb2.AnalyzerResource(
            type=r.typ, properties=_struct(r.inputs), urn=f"urn:{i}", name=r.name, options=analyzer_pb2.AnalyzerResourceOptions()
        )
        for i, r in enumerate(result.resources)
        if r.custom
    ]
    response = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources), timeout=60)
    mandatory = [(d.policyName, d.message) for d in response.diagnostics if d.enforcementLevel == analyzer_pb2.MANDATORY]
    assert mandatory == []
