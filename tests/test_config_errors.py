"""Every user-facing configuration mistake gives one clear message (key path, value, what is allowed)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, run_objects, stack_objects

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
    ("typo in a key", "barcelona", setter("nodes.gpuNode", ["x"]),
     "ml-dev-env:nodes.gpuNode: unknown key (did you mean 'gpuNodes'?); allowed keys:"),
    ("typo in a top-level key", "barcelona", setter("netwrok", {"mode": "tcp"}),
     "ml-dev-env:netwrok: unknown key (did you mean 'network'?)"),
    ("wrong type for count", "barcelona", setter("nodes.count", "two"),
     "ml-dev-env:nodes.count: got 'two'; input should be a valid integer"),
    ("negative GPU count", "barcelona", setter("nodes.gpusPerPod", -1),
     "ml-dev-env:nodes.gpusPerPod: got -1; input should be greater than or equal to 1"),
    ("more pods than listed nodes", "barcelona", setter("nodes.count", 6),
     "ml-dev-env:nodes.count: got 6; at most 5 (the number of listed gpuNodes)"),
    ("duplicate node", "barcelona", setter("nodes.gpuNodes.1", "moc-r4pcc02u17-nairr"),
     "ml-dev-env:nodes.gpuNodes: got ['moc-r4pcc02u17-nairr']; each node may be listed once"),
    ("bad memory quantity", "barcelona", setter("nodes.resources.requests.memory", "128GB"),
     "ml-dev-env:nodes.resources.requests.memory: got '128GB'; '128GB' is not a Kubernetes quantity"),
    ("negative size", "nerc-production", setter("storage.volumes.0.size", "-5Gi"),
     "ml-dev-env:storage.volumes[0].size: got '-5Gi'; '-5Gi' is not a Kubernetes quantity"),
    ("request above limit", "barcelona", setter("nodes.resources.requests.cpu", "128"),
     "ml-dev-env:nodes.resources.requests.cpu: got '128'; must not exceed limits.cpu (64)"),
    ("unknown network mode", "barcelona", setter("network.mode", "infiniband"),
     "ml-dev-env:network.mode: got 'infiniband'; allowed: 'tcp' or 'rdma'"),
    ("RDMA without attachments", "barcelona", setter("network.rdma.attachments", []),
     "ml-dev-env:network.rdma.attachments: got []; RDMA needs at least one NetworkAttachmentDefinition"),
    ("RDMA with fewer SR-IOV resources", "barcelona", setter("network.rdma.sriovResources", ["openshift.io/eno5np0rdma"]),
     "ml-dev-env:network.rdma.sriovResources: got ['openshift.io/eno5np0rdma']; one SR-IOV resource per attachment: expected 4"),
    ("RDMA with missing HCAs", "barcelona", setter("network.rdma.hcas", ["mlx5_6", "mlx5_7"]),
     "ml-dev-env:network.rdma.hcas: got ['mlx5_6', 'mlx5_7']; with hcaMode 'explicit', one HCA per attachment: expected 4"),
    ("RDMA with mismatched socket interfaces", "barcelona", setter("network.rdma.socketInterfaces", ["net1"]),
     "ml-dev-env:network.rdma.socketInterfaces: got ['net1']; one pod interface per attachment: expected 4"),
    ("malformed SR-IOV resource", "barcelona", setter("network.rdma.sriovResources.0", "eno5np0rdma"),
     "ml-dev-env:network.rdma.sriovResources[0]: got 'eno5np0rdma'; must be '<domain>/<name>'"),
    ("overlapping NIC subnets", "barcelona",
     lambda o: o["network"]["rdma"].update(createAttachments=True, subnets=["10.0.103.0/24"] * 4),
     "ml-dev-env:network.rdma.subnets[1]: got '10.0.103.0/24'; overlaps subnets[0] (10.0.103.0/24)"),
    ("NCCL variable set twice", "barcelona", setter("network.ncclEnv", {"NCCL_IB_HCA": "mlx5_0"}),
     "ml-dev-env:network.ncclEnv.NCCL_IB_HCA: got 'mlx5_0'; NCCL_IB_HCA comes from network.rdma.hcas in rdma mode"),
    ("non-NCCL env key", "barcelona", setter("network.ncclEnv", {"LD_PRELOAD": "/x.so"}),
     "ml-dev-env:network.ncclEnv.LD_PRELOAD: got '/x.so'; keys must be NCCL_*, TORCH_NCCL_* or UCX_* variables"),
    ("unknown storage mode", "nerc-production", setter("storage.mode", "rwx"),
     "ml-dev-env:storage.mode: got 'rwx'; allowed: 'shared', 'per-pod' or 'hybrid'"),
    ("hybrid volume without scope", "barcelona", deleter("storage.volumes.0.scope"),
     "ml-dev-env:storage.volumes[0].scope: got None; hybrid mode needs 'shared' or 'per-pod' on every volume"),
    ("duplicate mount path", "nerc-production", setter("storage.volumes.1.mountPath", "/workspace"),
     "ml-dev-env:storage.volumes[].mountPath: got ['/workspace']; must be unique"),
    ("reserved mount path", "nerc-production", setter("storage.volumes.1.mountPath", "/dev/shm"),
     "ml-dev-env:storage.volumes[1].mountPath: got '/dev/shm'; /dev/shm is reserved"),
    ("scc mode without SCC name", "barcelona", setter("security.memlock", {"mode": "scc"}),
     "ml-dev-env:security.memlock.sccName: got None; required with mode 'scc'"),
    ("unknown memlock mode", "barcelona", setter("security.memlock.mode", "unlimited"),
     "ml-dev-env:security.memlock.mode: got 'unlimited'; allowed: 'none', 'scc' or 'privileged'"),
    ("unpinned image", "barcelona", setter("image.reference", "quay.io/org/ml-dev-env:latest"),
     "ml-dev-env:image.reference: got 'quay.io/org/ml-dev-env:latest'; 'quay.io/org/ml-dev-env:latest' uses the 'latest' tag"),
    ("missing apps domain", "barcelona", deleter("cluster.appsDomain"),
     "ml-dev-env:cluster.appsDomain: required key is missing"),
    ("invalid namespace", "barcelona", setter("cluster.namespace", "NCCL_Test"),
     "ml-dev-env:cluster.namespace: got 'NCCL_Test'; 'NCCL_Test' is not a valid name"),
    ("route host longer than a DNS label", "barcelona", setter("cluster.namespace", "a-very-long-namespace-name-for-the-team-x"),
     "ml-dev-env:cluster.appName: got 'ml-dev-env'; route hosts start with '<appName>-<server>-<namespace>'"),
    ("TensorBoard with token auth", "barcelona", setter("access", {"auth": "token"}),
     "ml-dev-env:access.tensorboard: got True; TensorBoard has no authentication of its own"),
    ("token auth without its secrets", "barcelona", setter("access", {"auth": "token", "tensorboard": False, "vscode": False}),
     "ml-dev-env:jupyterToken: missing; Jupyter token (access.auth: token)"),
    ("config value that is not an object", "barcelona", setter("nodes", "big"),
     "ml-dev-env:nodes: got 'big'; must be an object (use `pulumi config set --path`)"),
]


@pytest.mark.parametrize(("stack", "mutate", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_configuration_is_one_clear_message(stack: str, mutate: Mutation, expected: str) -> None:
    objects = stack_objects(stack)
    mutate(objects)
    result = run_objects(stack, objects)
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
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "error: invalid stack configuration in Pulumi.broken.yaml:\n  - ml-dev-env:network.mode: got 'roce'" in proc.stderr
    assert not (tmp_path / "out" / "broken").exists()
