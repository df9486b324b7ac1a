"""Every user-facing configuration mistake gives one clear message (key path, value, what is allowed)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import MODEL_SECRETS, ONLY_MODEL_SECRETS, ROOT, run_objects, stack_objects

Mutation = Callable[[dict[str, Any]], None]


def setter(path: str, value: Any) -> Mutation:
    """Set a dotted path (list indices as numbers) in the stack objects."""

    def mutate(objects: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = objects
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def deleter(path: str) -> Mutation:
    def mutate(objects: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = objects
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return mutate


CASES: list[tuple[str, str, Mutation, str]] = [
    (
        "typo in a key",
        "barcelona",
        setter("nodes.gpuNode", ["x"]),
        "ml-dev-env:nodes.gpuNode: unknown key (did you mean 'gpuNodes'?); allowed keys:",
    ),
    (
        "typo in a top-level key",
        "barcelona",
        setter("netwrok", {"mode": "tcp"}),
        "ml-dev-env:netwrok: unknown key (did you mean 'network'?)",
    ),
    (
        "wrong type for count",
        "barcelona",
        setter("nodes.count", "two"),
        "ml-dev-env:nodes.count: got 'two'; input should be a valid integer",
    ),
    (
        "negative GPU count",
        "barcelona",
        setter("nodes.gpusPerPod", -1),
        "ml-dev-env:nodes.gpusPerPod: got -1; input should be greater than or equal to 1",
    ),
    (
        "more pods than listed nodes",
        "barcelona",
        setter("nodes.count", 6),
        "ml-dev-env:nodes.count: got 6; at most 5 (the number of listed gpuNodes)",
    ),
    (
        "duplicate node",
        "barcelona",
        setter("nodes.gpuNodes.1", "moc-r4pcc02u17-nairr"),
        "ml-dev-env:nodes.gpuNodes: got ['moc-r4pcc02u17-nairr']; each node may be listed once",
    ),
    (
        "bad memory quantity",
        "barcelona",
        setter("nodes.resources.requests.memory", "128GB"),
        "ml-dev-env:nodes.resources.requests.memory: got '128GB'; '128GB' is not a Kubernetes quantity",
    ),
    (
        "negative size",
        "nerc-production",
        setter("storage.volumes.0.size", "-5Gi"),
        "ml-dev-env:storage.volumes[0].size: got '-5Gi'; '-5Gi' is not a Kubernetes quantity",
    ),
    (
        "request above limit",
        "barcelona",
        setter("nodes.resources.requests.cpu", "128"),
        "ml-dev-env:nodes.resources.requests.cpu: got '128'; must not exceed limits.cpu (64)",
    ),
    (
        "unknown network mode",
        "barcelona",
        setter("network.mode", "infiniband"),
        "ml-dev-env:network.mode: got 'infiniband'; allowed: 'tcp' or 'rdma'",
    ),
    (
        "RDMA without attachments",
        "barcelona",
        setter("network.rdma.attachments", []),
        "ml-dev-env:network.rdma.attachments: got []; RDMA needs at least one NetworkAttachmentDefinition",
    ),
    (
        "RDMA with fewer SR-IOV resources",
        "barcelona",
        setter("network.rdma.sriovResources", ["openshift.io/eno5np0rdma"]),
        "ml-dev-env:network.rdma.sriovResources: got ['openshift.io/eno5np0rdma']; one SR-IOV resource per attachment: expected 4",
    ),
    (
        "RDMA with missing HCAs",
        "barcelona",
        setter("network.rdma.hcas", ["mlx5_6", "mlx5_7"]),
        "ml-dev-env:network.rdma.hcas: got ['mlx5_6', 'mlx5_7']; with hcaMode 'explicit', one HCA per attachment: expected 4",
    ),
    (
        "RDMA with mismatched socket interfaces",
        "barcelona",
        setter("network.rdma.socketInterfaces", ["net1"]),
        "ml-dev-env:network.rdma.socketInterfaces: got ['net1']; one pod interface per attachment: expected 4",
    ),
    (
        "malformed SR-IOV resource",
        "barcelona",
        setter("network.rdma.sriovResources.0", "eno5np0rdma"),
        "ml-dev-env:network.rdma.sriovResources[0]: got 'eno5np0rdma'; must be '<domain>/<name>'",
    ),
    (
        "overlapping NIC subnets",
        "barcelona",
        lambda o: o["network"]["rdma"].update(createAttachments=True, subnets=["10.0.103.0/24"] * 4),
        "ml-dev-env:network.rdma.subnets[1]: got '10.0.103.0/24'; overlaps subnets[0] (10.0.103.0/24)",
    ),
    (
        "NCCL variable set twice",
        "barcelona",
        setter("network.ncclEnv", {"NCCL_IB_HCA": "mlx5_0"}),
        "ml-dev-env:network.ncclEnv.NCCL_IB_HCA: got 'mlx5_0'; NCCL_IB_HCA comes from network.rdma.hcas in rdma mode",
    ),
    (
        "non-NCCL env key",
        "barcelona",
        setter("network.ncclEnv", {"LD_PRELOAD": "/x.so"}),
        "ml-dev-env:network.ncclEnv.LD_PRELOAD: got '/x.so'; keys must be NCCL_*, TORCH_NCCL_* or UCX_* variables",
    ),
    (
        "unknown storage mode",
        "nerc-production",
        setter("storage.mode", "rwx"),
        "ml-dev-env:storage.mode: got 'rwx'; allowed: 'shared', 'per-pod' or 'hybrid'",
    ),
    (
        "hybrid volume without scope",
        "barcelona",
        deleter("storage.volumes.0.scope"),
        "ml-dev-env:storage.volumes[0].scope: got None; hybrid mode needs 'shared' or 'per-pod' on every volume",
    ),
    (
        "duplicate mount path",
        "nerc-production",
        setter("storage.volumes.1.mountPath", "/workspace"),
        "ml-dev-env:storage.volumes[].mountPath: got ['/workspace']; must be unique",
    ),
    (
        "reserved mount path",
        "nerc-production",
        setter("storage.volumes.1.mountPath", "/dev/shm"),
        "ml-dev-env:storage.volumes[1].mountPath: got '/dev/shm'; /dev/shm is reserved",
    ),
    (
        "scc mode without SCC name",
        "barcelona",
        setter("security.memlock", {"mode": "scc"}),
        "ml-dev-env:security.memlock.sccName: got None; required with mode 'scc'",
    ),
    (
        "unknown memlock mode",
        "barcelona",
        setter("security.memlock.mode", "unlimited"),
        "ml-dev-env:security.memlock.mode: got 'unlimited'; allowed: 'none', 'scc' or 'privileged'",
    ),
    (
        "unpinned image",
        "barcelona",
        setter("image.reference", "quay.io/org/ml-dev-env:latest"),
        "ml-dev-env:image.reference: got 'quay.io/org/ml-dev-env:latest'; 'quay.io/org/ml-dev-env:latest' uses the 'latest' tag",
    ),
    ("missing apps domain", "barcelona", deleter("cluster.appsDomain"), "ml-dev-env:cluster.appsDomain: required key is missing"),
    (
        "invalid namespace",
        "barcelona",
        setter("cluster.namespace", "NCCL_Test"),
        "ml-dev-env:cluster.namespace: got 'NCCL_Test'; 'NCCL_Test' is not a valid name",
    ),
    (
        "route host longer than a DNS label",
        "barcelona",
        setter("cluster.namespace", "a-very-long-namespace-name-for-the-team-x"),
        "ml-dev-env:cluster.appName: got 'ml-dev-env'; route hosts start with '<appName>-<server>-<namespace>'",
    ),
    (
        "TensorBoard with token auth",
        "barcelona",
        setter("access", {"auth": "token"}),
        "ml-dev-env:access.tensorboard: got True; TensorBoard has no authentication of its own",
    ),
    (
        "home page asked for with token auth",
        "barcelona",
        setter("access", {"auth": "token", "tensorboard": False, "home": True}),
        "ml-dev-env:access.home: got True; home page has no authentication of its own",
    ),
    (
        "token auth without its secrets",
        "barcelona",
        setter("access", {"auth": "token", "tensorboard": False, "vscode": False}),
        "ml-dev-env:jupyterToken: missing; Jupyter token (access.auth: token)",
    ),
    (
        "config value that is not an object",
        "barcelona",
        setter("nodes", "big"),
        "ml-dev-env:nodes: got 'big'; must be an object (use `pulumi config set --path`)",
    ),
    (
        "memory limit without a unit",
        "barcelona",
        setter("nodes.resources.limits.memory", 256),
        "ml-dev-env:nodes.resources.limits.memory: got 256; a size needs a unit (a bare number means bytes): did you mean '256Gi'?",
    ),
    (
        "shm size without a unit",
        "barcelona",
        setter("nodes.shmSize", "128"),
        "ml-dev-env:nodes.shmSize: got '128'; a size needs a unit (a bare number means bytes): did you mean '128Gi'?",
    ),
    (
        "volume size in milli-bytes",
        "nerc-production",
        setter("storage.volumes.0.size", "100m"),
        "ml-dev-env:storage.volumes[0].size: got '100m'; at least 1Mi (100m is 0.1 bytes): did you mean '100Mi'?",
    ),
    (
        "build memory below 1Mi",
        "barcelona",
        setter("image.build.resources.limits.memory", "64Ki"),
        "ml-dev-env:image.build.resources.limits.memory: got '64Ki'; at least 1Mi (64Ki is 65536 bytes): did you mean '64Gi'?",
    ),
    (
        "one NIC removed from the attachments",
        "barcelona",
        lambda o: o["network"]["rdma"]["attachments"].pop(),
        "ml-dev-env:network.rdma.attachments: got ['eno5np0-network', 'eno6np0-network', 'eno7np0-network']; one "
        "NetworkAttachmentDefinition per NIC: expected 4 entries (per-NIC lists: attachments 3, sriovResources 4, hcas 4, "
        "socketInterfaces 4)",
    ),
    (
        "stall verdict time too short to sample",
        "nerc-production",
        setter("lifecycle.stallVerdictSeconds", 5),
        "ml-dev-env:lifecycle.stallVerdictSeconds: got 5; 0 (never) or 10 to 86400 seconds (the verdict itself takes a few seconds)",
    ),
    (
        "stall verdict time negative",
        "barcelona",
        setter("lifecycle.stallVerdictSeconds", -1),
        "ml-dev-env:lifecycle.stallVerdictSeconds: got -1;",
    ),
]


@pytest.mark.parametrize(("stack", "mutate", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_configuration_is_one_clear_message(stack: str, mutate: Mutation, expected: str) -> None:
    objects = stack_objects(stack)
    mutate(objects)
    result = run_objects(stack, objects, ONLY_MODEL_SECRETS)
    assert result.error is not None, "the program accepted a bad configuration"
    assert "Traceback" not in result.error
    problems = [line for line in result.error.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1, result.error
    assert expected in problems[0], result.error
    assert result.resources == [] or all(r.typ.startswith("pulumi:providers") for r in result.resources)


def test_at_least_twenty_distinct_mistakes() -> None:
    assert len({c[3] for c in CASES}) >= 20


def test_plain_text_secret_is_refused() -> None:
    objects = stack_objects("barcelona")
    config = {f"ml-dev-env:{k}": v for k, v in objects.items()} | {"ml-dev-env:jupyterToken": "plain"}
    from tools.mock_engine import run_program

    result = run_program("barcelona", config)
    assert result.error is not None
    assert "ml-dev-env:jupyterToken: is stored in plain text; set it with `pulumi config set --secret" in result.error


def test_render_cli_reports_without_traceback(tmp_path: Path) -> None:
    objects = stack_objects("barcelona")
    objects["network"]["mode"] = "roce"
    (tmp_path / "Pulumi.broken.yaml").write_text(yaml.safe_dump({"config": {f"ml-dev-env:{k}": v for k, v in objects.items()}}))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "broken", "--config-dir", str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "error: invalid stack configuration in Pulumi.broken.yaml:\n  - ml-dev-env:network.mode: got 'roce'" in proc.stderr
    assert not (tmp_path / "out" / "broken").exists()


def problem_lines(error: str | None) -> list[str]:
    assert error is not None, "the program accepted a bad configuration"
    assert "Traceback" not in error
    return [line.removeprefix("  - ") for line in error.splitlines() if line.startswith("  - ")]


def test_cpu_quantities_may_stay_unit_less() -> None:
    objects = stack_objects("barcelona")
    objects["nodes"]["resources"]["requests"]["cpu"] = 16
    objects["nodes"]["resources"]["limits"]["cpu"] = "500m"
    objects["nodes"]["resources"]["requests"]["cpu"] = "250m"
    result = run_objects("barcelona", objects)
    assert result.error is None, result.error


def test_every_mistake_is_reported_in_one_run() -> None:
    """Mistakes in different objects, several in one model, and the per-NIC lists: all in one message."""
    objects = stack_objects("barcelona")
    rdma = objects["network"]["rdma"]
    rdma["hcas"] = rdma["hcas"][:3]
    rdma["socketInterfaces"] = rdma["socketInterfaces"][:2]
    objects["network"]["ncclEnv"] = {"LD_PRELOAD": "/x.so"}
    objects["nodes"]["shmSize"] = 64
    objects["storage"]["volumes"][1]["mountPath"] = "/tmp"
    objects["storage"]["volumes"][2]["scope"] = None
    objects["security"]["memlock"] = {"mode": "none", "createScc": True}
    objects["cluster"]["namespace"] = "a-very-long-namespace-name-for-the-team-x"
    result = run_objects("barcelona", objects)
    table = "per-NIC lists: attachments 4, sriovResources 4, hcas 3, socketInterfaces 2"
    assert problem_lines(result.error) == [
        "ml-dev-env:cluster.appName: got 'ml-dev-env'; route hosts start with '<appName>-<server>-<namespace>', which must fit "
        "a 63-character DNS label ('ml-dev-env-tensorboard-a-very-long-namespace-name-for-the-team-x' has 64); choose a shorter appName",
        "ml-dev-env:nodes.shmSize: got 64; a size needs a unit (a bare number means bytes): did you mean '64Gi'?",
        "ml-dev-env:network.ncclEnv.LD_PRELOAD: got '/x.so'; keys must be NCCL_*, TORCH_NCCL_* or UCX_* variables",
        f"ml-dev-env:network.rdma.hcas: got ['mlx5_6', 'mlx5_7', 'mlx5_8']; with hcaMode 'explicit', one HCA per attachment: "
        f"expected 4 entries ({table}; auto-detection is opt-in with hcaMode: auto)",
        f"ml-dev-env:network.rdma.socketInterfaces: got ['net1', 'net2']; one pod interface per attachment: "
        f"expected 4 entries ({table}; Multus names them net1..net4)",
        "ml-dev-env:security.memlock.createScc: got True; only valid with mode 'scc'",
        "ml-dev-env:storage.volumes[1].mountPath: got '/tmp'; /tmp is reserved",
        "ml-dev-env:storage.volumes[2].scope: got None; hybrid mode needs 'shared' or 'per-pod' on every volume",
    ], result.error
    assert result.error is not None, "the run fails"
    assert result.error.startswith("invalid stack configuration in Pulumi.barcelona.yaml (8 problems):\n")


def test_key_errors_values_and_plain_secrets_come_together() -> None:
    objects = stack_objects("barcelona")
    objects["nodes"]["count"] = 9
    config = {f"ml-dev-env:{k}": v for k, v in objects.items()}
    config["ml-dev-env:jupyterTokn"] = "x"
    config["ml-dev-env:hfToken"] = "hf_plain"
    from tools.mock_engine import run_program

    lines = problem_lines(run_program("barcelona", config).error)
    assert len(lines) == 3, lines
    assert lines[0].startswith("ml-dev-env:jupyterTokn: unknown key (did you mean 'jupyterToken'?)")
    assert lines[1] == "ml-dev-env:hfToken: is stored in plain text; set it with `pulumi config set --secret ml-dev-env:hfToken …`"
    assert lines[2].startswith("ml-dev-env:nodes.count: got 9; at most 5")


@pytest.mark.parametrize("prefix", ["mldevenv", "ml-dev", "ml_dev_env", "ML-DEV-ENV"])
def test_key_under_a_mistyped_project_prefix_is_named(prefix: str) -> None:
    objects = stack_objects("barcelona")
    config = {f"ml-dev-env:{k}": v for k, v in objects.items() if k != "cluster"}
    config[f"{prefix}:cluster"] = objects["cluster"]
    from tools.mock_engine import run_program

    result = run_program("barcelona", config, MODEL_SECRETS)
    assert problem_lines(result.error) == [
        f"{prefix}:cluster: key under project prefix '{prefix}:', which this program ignores; did you mean "
        "'ml-dev-env:cluster'? (this project is 'ml-dev-env', see Pulumi.yaml)"
    ], result.error


def test_object_under_an_unknown_prefix_is_named_but_other_packages_keys_are_not() -> None:
    objects = stack_objects("nerc-production")
    config = {f"ml-dev-env:{k}": v for k, v in objects.items()}
    config |= {
        "kubernetes:context": "shift",
        "kubernetes:cluster": "shift-cluster",
        "kubernetes:namespace": "x",
        "pulumi:disable-default-providers": ["kubernetes"],
        "aws:region": "us-east-1",
        "team:owner": "alice",  # someone else's plain value: not ours
    }
    from tools.mock_engine import run_program

    assert run_program("nerc-production", config).error is None
    config["myproject:storage"] = {"mode": "shared", "volumes": []}
    result = run_program("nerc-production", config)
    assert problem_lines(result.error) == [
        "myproject:storage: key under project prefix 'myproject:', which this program ignores; did you mean "
        "'ml-dev-env:storage'? (this project is 'ml-dev-env', see Pulumi.yaml)"
    ]


BROKEN_YAML = """\
config:
  ml-dev-env:cluster:
    name: demo
   namespace: demo
"""


def test_yaml_syntax_error_is_one_line_with_file_line_column(tmp_path: Path) -> None:
    from tools.mock_engine import StackFileError, stack_config

    (tmp_path / "Pulumi.broken.yaml").write_text(BROKEN_YAML)
    with pytest.raises(StackFileError) as caught:
        stack_config(tmp_path / "Pulumi.broken.yaml")
    # the file as the user would name it (relative to the working directory when inside it)
    assert str(caught.value).endswith(
        "Pulumi.broken.yaml:4:4: invalid YAML: expected <block end>, but found '<block mapping start>' "
        "(while parsing a block mapping at line 2)"
    )
    assert "\n" not in str(caught.value)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "broken", "--config-dir", str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"error: {caught.value}"], proc.stderr
    assert "Traceback" not in proc.stdout


SHM_LINE = "ml-dev-env:nodes.shmSize: got 64; a size needs a unit (a bare number means bytes): did you mean '64Gi'?"


def test_a_field_mistake_does_not_hide_the_rules_of_its_model() -> None:
    """Pydantic runs NodesConfig's rules only once its fields validated: the count rule must still report."""
    objects = stack_objects("barcelona")
    objects["nodes"]["shmSize"] = 64
    objects["nodes"]["count"] = 9  # barcelona lists 5 gpuNodes
    result = run_objects("barcelona", objects)
    assert problem_lines(result.error) == [
        SHM_LINE,
        "ml-dev-env:nodes.count: got 9; at most 5 (the number of listed gpuNodes): pods use required anti-affinity, one pod per node",
    ], result.error
    assert result.error is not None and result.error.startswith("invalid stack configuration in Pulumi.barcelona.yaml (2 problems):\n")


def test_a_field_mistake_does_not_hide_the_rules_of_the_models_above() -> None:
    """StackConfig's rule (unique model names) runs only when every object validated."""
    objects = stack_objects("barcelona")
    objects["nodes"]["shmSize"] = 64
    objects["models"].append(dict(objects["models"][0]))
    name = objects["models"][0]["name"]
    result = run_objects("barcelona", objects)
    assert problem_lines(result.error) == [SHM_LINE, f"ml-dev-env:models[].name: got [{name!r}]; model names must be unique"], result.error


def test_a_default_standing_in_for_a_reported_value_adds_no_line() -> None:
    """`memlock.mode` is reported and removed; its default 'none' would break the createScc rule — not the user's mistake.
    A missing required key that is removed after its report is not reported again as missing."""
    objects = stack_objects("barcelona")
    objects["security"]["memlock"]["mode"] = "unlimited"
    objects["storage"]["volumes"][1]["mountPath"] = "/tmp"
    objects["nodes"]["count"] = 9
    result = run_objects("barcelona", objects)
    lines = problem_lines(result.error)
    assert [line.split(": got ")[0] for line in lines] == [
        "ml-dev-env:nodes.count",
        "ml-dev-env:security.memlock.mode",
        "ml-dev-env:storage.volumes[1].mountPath",
    ], result.error
