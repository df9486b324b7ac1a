"""steps/embed.py: what the Tekton steps run — the tools image's step files, or one deterministic,
self-contained script for a step that runs before that image exists."""

from __future__ import annotations

import ast
import base64
import sys
from pathlib import Path

import pytest

from steps.embed import (
    EMBEDDED,
    IMAGE_STEPS_DIR,
    LIB,
    SHIPPED_DIRS,
    SOURCE_DIRS,
    STEPS,
    lib_modules,
    shipped,
    step_command,
    step_script,
    write_tree,
)
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
    assert not {m for m in imported if m and m.startswith("lib")}, "the shared code is inlined, not imported"
    assert all(n.level == 0 for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)), "no relative import is left"
    third_party = {m.split(".")[0] for m in imported if m} - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party <= {"boto3", "botocore", "huggingface_hub", "isal"}, third_party
    if name in EMBEDDED:  # only these are inlined into a Task; the others run from the tools image
        assert len(base64.b64encode(text.encode())) < TEKTON_ARG_LIMIT - 4096


# A ConfigMap holds at most 1 MiB (k8s.io/api core/v1 types.go: MaxSecretSize, the bound the API server
# applies to ConfigMaps too); the tools image build carries the step files in one per SHIPPED_DIRS entry.
CONFIG_MAP_LIMIT = 1 << 20


def test_the_tools_image_ships_the_step_files_as_they_are(tmp_path: Path) -> None:
    steps_dir = Path(__file__).resolve().parents[2] / "steps"
    files = shipped()
    assert set(files) == set(SHIPPED_DIRS)
    for part, data in files.items():
        assert sum(len(k) + len(v.encode()) for k, v in data.items()) < CONFIG_MAP_LIMIT // 2, part  # room to grow
        for name, text in data.items():
            assert text == (steps_dir / SOURCE_DIRS[part][0] / name).read_text(), name
    tree = write_tree(tmp_path)
    for name in STEPS:
        assert (tree / f"{name}.py").read_text() == (steps_dir / "bin" / f"{name}.py").read_text()  # the launcher
        assert (tree / "steps" / f"{name}.py").read_text() == (steps_dir / f"{name}.py").read_text()  # the package's module
        if name not in EMBEDDED:
            assert step_command(name) == ["python3", f"{IMAGE_STEPS_DIR}/{name}.py"]
    with pytest.raises(ValueError, match="not a step of the tools image"):
        step_command("wait_image")


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


def _lib_imports(source: str) -> set[str]:
    tree = ast.parse(source)
    return {n.module.removeprefix("lib.") for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and n.level == 1}


@pytest.mark.parametrize("name", STEPS)
def test_script_is_the_needed_lib_modules_plus_step_from_disk(name: str) -> None:
    """Built from the files at call time: the definitions of the lib modules the step imports (and those
    they import), in `LIB` order, then the step's, nothing else."""
    steps_dir = Path(__file__).resolve().parents[2] / "steps"
    needed, todo = set(), _lib_imports((steps_dir / f"{name}.py").read_text())
    while todo:
        module = todo.pop()
        needed.add(module)
        todo |= _lib_imports((steps_dir / "lib" / f"{module}.py").read_text()) - needed
    assert lib_modules(name) == [m for m in LIB if m in needed]
    expected = [d for m in lib_modules(name) for d in _top_level_names((steps_dir / "lib" / f"{m}.py").read_text())]
    expected += _top_level_names((steps_dir / f"{name}.py").read_text())
    assert _top_level_names(step_script(name)) == expected


def test_each_step_carries_only_what_it_needs() -> None:
    """The point of the split: a step carries the shared code it uses, not all of it."""
    assert lib_modules("register") == ["runtime"]
    assert lib_modules("mirror") == ["runtime", "images"]  # no client, no S3, no model code
    assert lib_modules("wait_image") == ["runtime", "images", "registry"]  # the shared client, no S3, no model code
    assert lib_modules("package") == list(LIB)
    assert len(step_script("register")) < len(step_script("package")) / 3


def test_lib_modules_are_ordered_by_their_imports() -> None:
    """A lib module imports only modules inlined before it, so every name is defined before its use."""
    lib_dir = Path(__file__).resolve().parents[2] / "steps" / "lib"
    for i, module in enumerate(LIB):
        assert _lib_imports((lib_dir / f"{module}.py").read_text()) <= set(LIB[:i]), module
