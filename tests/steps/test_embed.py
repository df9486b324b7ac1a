"""steps/embed.py: what the Tekton steps run is one deterministic, self-contained script per step."""

from __future__ import annotations

import ast
import base64
import sys
from pathlib import Path

import pytest

from steps.embed import STEPS, step_script
from tests.steps.conftest import StepRunner

# Tekton writes every step script of a Task, base64-encoded, into ONE `sh -c` argument of its
# place-scripts init container; Linux caps a single argument at 128 KiB (MAX_ARG_STRLEN).
TEKTON_ARG_LIMIT = 128 * 1024


@pytest.mark.parametrize("name", STEPS)
def test_script_is_self_contained_and_deterministic(name: str) -> None:
    text = step_script(name)
    assert text == step_script(name)
    assert text.startswith("#!/usr/bin/env python3\n")
    tree = ast.parse(text)
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "common" not in imported, "the shared code is inlined, not imported"
    third_party = {m.split(".")[0] for m in imported if m} - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party <= {"boto3", "botocore", "huggingface_hub"}, third_party
    assert len(base64.b64encode(text.encode())) < TEKTON_ARG_LIMIT - 4096


@pytest.mark.parametrize("name", STEPS)
def test_help_runs(name: str, run_step: StepRunner) -> None:
    step = run_step(name, "--help")
    assert step.returncode == 0, step.stderr
    assert step.stdout.startswith("usage:")


def test_unknown_step() -> None:
    with pytest.raises(ValueError, match="unknown step"):
        step_script("nope")


def _top_level_names(source: str) -> list[str]:
    return [n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


@pytest.mark.parametrize("name", STEPS)
def test_script_is_common_plus_step_from_disk(name: str) -> None:
    """Built from the files at call time: common.py's definitions, then the step's, nothing else."""
    steps_dir = Path(__file__).resolve().parents[2] / "steps"
    expected = _top_level_names((steps_dir / "common.py").read_text()) + _top_level_names((steps_dir / f"{name}.py").read_text())
    assert _top_level_names(step_script(name)) == expected
