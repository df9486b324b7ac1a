"""`make racks` (tools/racks.py): fabricCheck.nodeRacks from a node topology label, against a stub `oc`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, run_objects, stack_objects
from tests.fixtures import programs
from tools import racks

LABEL = "topology.kubernetes.io/rack"
BARCELONA = ["moc-r4pcc02u17-nairr", "moc-r4pcc02u18-nairr", "moc-r4pcc02u25-nairr", "moc-r4pcc02u15-yunshi", "moc-r4pcc02u16-yunshi"]


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


def stub_oc(nodes: list[dict[str, Any]], calls: list[list[str]]) -> racks.Oc:
    """`oc get nodes [names…] [-l selector] -o json` over `nodes`, as oc answers (a List; one object for one name)."""

    def oc(args: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        names = [a for a in args[2 : args.index("-o")] if not a.startswith("-") and "=" not in a]
        found = [n for n in nodes if n["metadata"]["name"] in names] if names else nodes
        if names and len(found) < len(names):
            missing = sorted(set(names) - {n["metadata"]["name"] for n in found})
            return subprocess.CompletedProcess(args, 1, "", f'Error from server (NotFound): nodes "{missing[0]}" not found\n')
        body = found[0] if len(names) == 1 else {"kind": "List", "items": found}
        return subprocess.CompletedProcess(args, 0, json.dumps(body), "")

    return oc


def test_commands_write_the_mapping_that_the_stack_then_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    rack_of = {n: ("rack-a" if n.endswith("yunshi") else "rack-b") for n in BARCELONA}
    calls: list[list[str]] = []
    assert racks.main(["barcelona", "--label", LABEL], stub_oc([node(n, **{LABEL: r}) for n, r in rack_of.items()], calls)) == 0
    assert calls == [["get", "nodes", *BARCELONA, "-o", "json"]], "the stack's gpuNodes, by name"
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("pulumi config set")]
    assert len(lines) == len(BARCELONA)
    # apply each command as `pulumi config set --path` would, onto the stack file's config, and render
    objects = stack_objects("barcelona")
    for line in lines:
        argv = shlex.split(line)
        assert argv[:6] == ["pulumi", "config", "set", "-s", "barcelona", "--path"]
        key, value = argv[6], argv[7]
        assert key.startswith('ml-dev-env:fabricCheck.nodeRacks["') and key.endswith('"]')
        objects.setdefault("fabricCheck", {}).setdefault("nodeRacks", {})[json.loads(key.split("nodeRacks[", 1)[1][:-1])] = value
    assert objects["fabricCheck"]["nodeRacks"] == rack_of
    result = run_objects("barcelona", objects)
    assert result.error is None, result.error
    fabric = next(r for r in result.resources if r.kind == "ConfigMap" and "fabric.json" in (r.inputs.get("data") or {}))
    assert json.loads(fabric.inputs["data"]["fabric.json"])["nodeRacks"] == rack_of


def test_racks_that_pulumi_would_store_as_numbers_stay_strings() -> None:
    lines = racks.commands("barcelona", {"n1": "12", "n2": "rack-b", "n3": "12"})
    assert lines == [
        "pulumi config rm -s barcelona --path ml-dev-env:fabricCheck.nodeRacks",
        """pulumi config set -s barcelona --path --type string 'ml-dev-env:fabricCheck.nodeRacks["n1"]' 12""",
        """pulumi config set -s barcelona --path --type string 'ml-dev-env:fabricCheck.nodeRacks["n3"]' 12""",
        """pulumi config set -s barcelona --path 'ml-dev-env:fabricCheck.nodeRacks["n2"]' rack-b""",
    ]


def test_a_node_without_the_label_is_named_and_nothing_is_applied(capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [node(n, **({LABEL: "r1"} if n != "moc-r4pcc02u25-nairr" else {})) for n in BARCELONA]
    assert racks.main(["barcelona", "--label", LABEL], stub_oc(nodes, [])) == 1
    captured = capsys.readouterr()
    assert "pulumi config set" not in captured.out
    assert captured.err.splitlines() == [f"ERROR: node moc-r4pcc02u25-nairr: has no label {LABEL} (its labels: kubernetes.io/hostname)"]


def test_without_pinned_nodes_the_gpu_selector_picks_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load((ROOT / "Pulumi.nerc-production.yaml").read_text())
    assert not data["config"]["ml-dev-env:nodes"].get("gpuNodes"), "nerc-production pins no nodes"
    (tmp_path / "Pulumi.nerc-production.yaml").write_text(yaml.safe_dump(data))
    calls: list[list[str]] = []
    nodes = [node("gpu-1", **{LABEL: "r1"}), node("gpu-2", **{LABEL: "r2"})]
    assert racks.main(["nerc-production", "--label", LABEL, "--config-dir", str(tmp_path)], stub_oc(nodes, calls)) == 0
    product = data["config"]["ml-dev-env:nodes"]["gpuProduct"]
    assert calls == [["get", "nodes", "-l", f"nvidia.com/gpu.present=true,nvidia.com/gpu.product={product}", "-o", "json"]]
    assert capsys.readouterr().out.count("pulumi config set -s nerc-production --path") == 2


@pytest.mark.skipif(programs.missing("make") is not None, reason=programs.missing("make") or "")
def test_make_racks_runs_the_tool_with_oc_on_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    listed = tmp_path / "nodes.json"
    listed.write_text(json.dumps({"kind": "List", "items": [node(n, **{LABEL: "r1"}) for n in BARCELONA]}))
    (bin_dir / "oc").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/oc.args\ncat {listed}\n')
    (bin_dir / "oc").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["make", "-s", "racks", "STACK=barcelona", f"LABEL={LABEL}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "oc.args").read_text().split() == ["get", "nodes", *BARCELONA, "-o", "json"]
    assert proc.stdout.count("pulumi config set") == len(BARCELONA)
    usage = subprocess.run(["make", "-s", "racks", "STACK=barcelona"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert usage.returncode == 2 and "usage: make racks" in usage.stderr


def test_a_label_value_that_is_no_rack_name_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [node(n, **{LABEL: "R4_PCC02" if n == "moc-r4pcc02u17-nairr" else "r1"}) for n in BARCELONA]
    assert racks.main(["barcelona", "--label", LABEL], stub_oc(nodes, [])) == 1
    captured = capsys.readouterr()
    assert "pulumi config" not in captured.out
    assert captured.err.splitlines() == [
        f"ERROR: node moc-r4pcc02u17-nairr: {LABEL}=R4_PCC02 is no rack name nodeRacks accepts (lower-case letters, "
        "digits and '-', at most 63); set the node's rack by hand, e.g. r4-pcc02"
    ]


def test_a_stale_mapping_does_not_stop_the_tool_that_replaces_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """nodeRacks still names a node that nodes.gpuNodes dropped (the stack no longer validates): the tool still runs,
    and its commands remove the old mapping before writing the new one."""
    data = yaml.safe_load((ROOT / "Pulumi.barcelona.yaml").read_text())
    kept = BARCELONA[:4]
    data["config"]["ml-dev-env:nodes"]["gpuNodes"] = kept
    data["config"].setdefault("ml-dev-env:fabricCheck", {})["nodeRacks"] = {n: "r1" for n in BARCELONA}
    (tmp_path / "Pulumi.barcelona.yaml").write_text(yaml.safe_dump(data))
    nodes = [node(n, **{LABEL: "r2"}) for n in BARCELONA]
    assert racks.main(["barcelona", "--label", LABEL, "--config-dir", str(tmp_path)], stub_oc(nodes, [])) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pulumi config")]
    assert lines[0] == "pulumi config rm -s barcelona --path ml-dev-env:fabricCheck.nodeRacks"
    assert [shlex.split(line)[6] for line in lines[1:]] == [f'ml-dev-env:fabricCheck.nodeRacks["{n}"]' for n in sorted(kept)]


def test_an_environment_stack_is_sent_to_its_cluster_stack() -> None:
    with pytest.raises(
        SystemExit, match="barcelona-bob is an environment stack; nodeRacks belongs to its cluster stack: make racks STACK=barcelona"
    ):
        racks.main(["barcelona-bob", "--label", LABEL], stub_oc([], []))
