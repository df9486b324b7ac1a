"""The GPUs every stack of a cluster asks for, against its GPU nodes (stacks/gpus.py): one line with the numbers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks import gpus
from tests.conftest import ROOT, STACKS, stack_objects
from tools import render


def checkout(tmp_path: Path, extra: dict[str, dict[str, Any]] | None = None) -> Path:
    for stack in STACKS:
        shutil.copy(ROOT / f"Pulumi.{stack}.yaml", tmp_path)
    for name, objects in (extra or {}).items():
        (tmp_path / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": {f"ml-dev-env:{k}": v for k, v in objects.items()}}))
    return tmp_path


def asked(stack: str) -> int:
    nodes = stack_objects(stack)["nodes"]
    return int(nodes.get("count", 1)) * int(nodes.get("gpusPerPod", 1))


def test_the_committed_barcelona_stacks_fit() -> None:
    fit = gpus.tally(ROOT, "barcelona-bob")
    assert fit is not None and fit.cluster == "barcelona"
    on_barcelona = [s for s in STACKS if s == "barcelona" or stack_objects(s).get("environment", {}).get("cluster") == "barcelona"]
    assert [a.stack for a in fit.asks] == on_barcelona
    cluster = stack_objects("barcelona")["nodes"]
    capacity = len(cluster["gpuNodes"]) * cluster["gpusPerNode"]
    total = sum(asked(s) for s in on_barcelona)
    assert fit.line.startswith(f"GPUs on cluster barcelona: {total} asked (barcelona 2×4, ")
    assert fit.line.endswith(f"of {capacity} ({len(cluster['gpuNodes'])} gpuNodes × {cluster['gpusPerNode']} gpusPerNode): fits")


def test_one_more_environment_never_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    carol = {"environment": {"cluster": "barcelona", "name": "carol"}, "nodes": {"count": 2, "gpusPerPod": 4}}
    config_dir = checkout(tmp_path, {"barcelona-carol": carol})
    fit = gpus.tally(config_dir, "barcelona")
    assert fit is not None and fit.asked == 24 and fit.capacity == 20
    assert fit.line.endswith(
        "of 20 (5 gpuNodes × 4 gpusPerNode): never fits, 4 more than the nodes have: lower nodes.count or "
        "nodes.gpusPerPod, or suspend a stack (lifecycle.suspended: true)"
    )
    # the render says so in one line (and still renders: the objects are valid, the cluster is what is short)
    assert render.render("barcelona-carol", tmp_path / "out", config_dir=config_dir) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  GPUs on cluster barcelona")]
    assert lines == [f"  {fit.line}"]


def test_suspending_a_stack_frees_its_gpus(tmp_path: Path) -> None:
    carol = {
        "environment": {"cluster": "barcelona", "name": "carol"},
        "nodes": {"count": 2, "gpusPerPod": 4},
        "lifecycle": {"suspended": True},
    }
    fit = gpus.tally(checkout(tmp_path, {"barcelona-carol": carol}), "barcelona")
    assert fit is not None and fit.asked == 16 and "barcelona-carol 2×4 (suspended: 0)" in fit.line and fit.fits


def test_pinned_pods_that_fit_the_sum_but_not_the_nodes(tmp_path: Path) -> None:
    """dave pins a 1-GPU pod to alice's node, which alice's 4-GPU pod fills: 17 of 20, but no placement."""
    dave = {
        "environment": {"cluster": "barcelona", "name": "dave"},
        "nodes": {"count": 1, "gpusPerPod": 1, "gpuNodes": ["moc-r4pcc02u25-nairr"]},
    }
    fit = gpus.tally(checkout(tmp_path, {"barcelona-dave": dave}), "barcelona-dave")
    assert fit is not None and fit.asked == 17 and fit.capacity == 20
    assert ": never fits as pinned: no placement gives every pod a node of its nodes.gpuNodes" in fit.line


def test_an_unknown_capacity_says_what_to_declare() -> None:
    fit = gpus.tally(ROOT, "nerc-production")
    assert fit is not None and fit.capacity is None
    assert "the capacity is unknown: declare nodes.gpuNodes and nodes.gpusPerNode in Pulumi.nerc-production.yaml" in fit.line


def test_the_program_uses_the_config_it_loaded(tmp_path: Path) -> None:
    """The preview's tally counts the stack as loaded (its file may say otherwise in a test or after an edit)."""
    from stacks.config import StackConfig
    from tools.render import stack_settings

    own: StackConfig = stack_settings({f"ml-dev-env:{k}": v for k, v in stack_objects("barcelona").items()})
    fit = gpus.tally(ROOT, "barcelona", own=own.model_copy(update={"nodes": own.nodes.model_copy(update={"count": 5})}))
    assert fit is not None and fit.asks[0].pods == 5 and fit.asked == 5 * 4 + sum(asked(s) for s in ("barcelona-alice", "barcelona-bob"))
