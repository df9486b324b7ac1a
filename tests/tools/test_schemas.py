"""The project owns its schema check: vendored upstream schemas (schemas/), their provenance, and a render that
checks every object strictly in a clone with nothing beside it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from policy.rules import kube_api
from tests.conftest import ROOT, STACKS, run_objects, stack_objects
from tests.tools.test_render_schema import VARIANTS
from tools import render, schema_check

SCHEMAS = ROOT / "schemas"


def test_every_schema_file_has_its_provenance_row_and_block() -> None:
    provenance = (SCHEMAS / "PROVENANCE.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+\.json)` \|", provenance, flags=re.M))
    files = {str(p.relative_to(SCHEMAS)) for p in SCHEMAS.rglob("*.json")}
    assert files and files == rows, f"files without a row: {sorted(files - rows)}; rows without a file: {sorted(rows - files)}"
    for rel in files:
        block = json.loads((SCHEMAS / rel).read_text()).get("x-provenance", {})
        assert block.get("source") and block.get("license") == "Apache-2.0", rel
    assert (SCHEMAS / "LICENSE-Apache-2.0.txt").read_text().lstrip().startswith("Apache License")
    # the form another kind follows is written down
    assert "## Adding a kind (the form)" in provenance and "schemas/<group>/<version>/<Kind>.json" in provenance


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_kind_has_a_vendored_schema(variant: str) -> None:
    stack, mutate = VARIANTS[variant]
    objects = stack_objects(stack)
    if mutate:
        mutate(objects)
    result = run_objects(stack, objects)
    assert result.error is None, result.error
    kinds = {(o["apiVersion"], o["kind"]) for o in (render.manifest(r) for r in result.resources) if o}
    missing = sorted(k for k in kinds if not kube_api.schema_file(*k).is_file())
    assert not missing, f"rendered kinds without a schema under schemas/: {missing}"


def test_a_kind_without_a_schema_is_refused() -> None:
    obj = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "q"}}
    [problem] = kube_api.problems(obj)
    assert "no schema for apiVersion kueue.x-k8s.io/v1beta1 kind LocalQueue" in problem.message
    assert "schemas/kueue.x-k8s.io/v1beta1/LocalQueue.json" in problem.message


def test_strict_unknown_fields_and_integral_floats() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}}
    assert kube_api.problems(cm) == []
    assert [p.path for p in kube_api.problems({**cm, "dataz": {}})] == ["dataz"]
    assert kube_api.problems({**cm, "dataz": {}}, strict=False) == []
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "a"},
        "spec": {
            "replicas": 2.0,
            "selector": {"matchLabels": {"app": "a"}},
            "serviceName": "a",
            "template": {"metadata": {"labels": {"app": "a"}}},
        },
    }
    assert kube_api.problems(sts) == []
    sts["spec"]["replicas"] = 2.5
    assert [p.path for p in kube_api.problems(sts)] == ["spec.replicas"]


def test_cli_reports_and_fails(tmp_path: Path) -> None:
    good = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1web"}, "spec": {"portz": []}}
    (tmp_path / "good.yaml").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    out = subprocess.run(
        [sys.executable, "-m", "tools.schema_check", "-q", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "summary: 1 ok, 1 invalid" in out.stdout
    assert "spec.portz: unknown field" in out.stdout and "a DNS-1035 label must" in out.stdout
    assert schema_check.main(["-q", str(tmp_path / "good.yaml")]) == 0


def test_render_checks_schemas_in_a_clone_with_nothing_beside_it(tmp_path: Path) -> None:
    """A fresh copy of the working tree (tracked and new files), alone in its folder: the render checks every object."""
    clone = tmp_path / "alone" / "ml-dev-env"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, cwd=ROOT, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / rel)
    assert not (clone.parent / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.render", "barcelona", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=clone,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    written = len(list((tmp_path / "out" / "barcelona").iterdir()))
    assert f"== schema check: {written} ok, 0 invalid" in proc.stdout
    assert "not found" not in proc.stdout and "skipped" not in proc.stdout


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_of_every_stack_passes_the_rules_beyond_the_schema(stack: str) -> None:
    result = run_objects(stack, stack_objects(stack))
    objects = [(o, r.typ.endswith("Patch")) for r in result.resources if (o := render.manifest(r))]
    found = {schema_check.label(o): [p.text for p in kube_api.rule_problems(o)] for o, _ in objects}
    assert not any(found.values()), {k: v for k, v in found.items() if v}
