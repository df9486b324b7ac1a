"""tools/diagram.py: deterministic Mermaid of components and what each creates, written into README."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import STACKS
from tools import diagram
from tools.mock_engine import RunResult

GROUP = re.compile(r'^  (\w+) --> (\w+)\["<b>(?:(\d+) × )?([^<]+)</b>')
COMPONENT = re.compile(r'^  (\w+) --> (\w+)\[\["(\S+) (\S+)"\]\]$')


@pytest.fixture(scope="module")
def runs() -> dict[str, RunResult]:
    return {stack: diagram.offline_run(stack) for stack in STACKS}


def test_output_is_deterministic(runs: dict[str, RunResult]) -> None:
    for stack, result in runs.items():
        first = diagram.mermaid(result)
        assert first == diagram.mermaid(result)
        assert first == diagram.mermaid(diagram.offline_run(stack)), "a fresh run of the program draws the same diagram"
        assert first.startswith("flowchart LR\n")


@pytest.mark.parametrize("stack", STACKS)
def test_every_component_type_and_kubernetes_kind_is_drawn_with_its_count(stack: str, runs: dict[str, RunResult]) -> None:
    result = runs[stack]
    text = diagram.mermaid(result)
    components = {diagram.short_type(r.typ) for r in result.resources if not r.custom}
    assert components and all(f'[["{c} ' in text for c in components)
    kinds = Counter(diagram.short_type(r.typ) for r in result.resources if r.custom)
    assert {k for k in kinds if not k.endswith("provider")} >= {r.kind for r in result.resources if r.typ.startswith("kubernetes:")}
    drawn: Counter[str] = Counter()
    for line in text.splitlines():
        if match := GROUP.match(line):
            drawn[match.group(4)] += int(match.group(3) or 1)
    assert drawn == kinds
    for r in result.resources:  # every Kubernetes object is named
        name = r.inputs.get("metadata", {}).get("name")
        if r.typ.startswith("kubernetes:") and name:
            assert f"<br/>{diagram.display_name(r)}" in text, name
            assert diagram.display_name(r) in (name, name[:-10] + "{hash}"), name


def test_children_nest_under_their_component(runs: dict[str, RunResult]) -> None:
    text = diagram.mermaid(runs["nerc-production"])
    ids = {f"{m.group(3)} {m.group(4)}": m.group(2) for line in text.splitlines() if (m := COMPONENT.match(line))}
    parents = {m.group(2): m.group(1) for line in text.splitlines() if (m := COMPONENT.match(line))}
    assert parents[ids["WorkspaceStorage gpu-storage"]] == ids["GpuCluster gpu"]
    groups = {m.group(4): (m.group(1), m.group(3)) for line in text.splitlines() if (m := GROUP.match(line))}
    assert groups["PersistentVolumeClaim"] == (ids["WorkspaceStorage gpu-storage"], "2")
    assert groups["StatefulSet"] == (ids["GpuCluster gpu"], None)
    assert groups["Route"] == (ids["GpuCluster gpu"], "4")  # vscode, jupyter, tensorboard, home


def test_mermaid_syntax_basics(runs: dict[str, RunResult]) -> None:
    for result in runs.values():
        lines = diagram.mermaid(result).splitlines()
        ids = [m.group(2) for line in lines if (m := re.match(r"^  (\w+) --> (\w+)", line))]
        assert len(ids) == len(set(ids)), "every node is declared once"
        for line in lines[1:]:
            assert line.startswith("  ") and line.count('"') % 2 == 0, line


@pytest.mark.parametrize(
    ("urn", "key"),
    [
        ("urn:pulumi:s::p::pulumi:pulumi:Stack$ml-dev-env:cluster:GpuCluster::gpu", ("ml-dev-env:cluster:GpuCluster", "gpu")),
        (
            "urn:pulumi:s::p::ml-dev-env:cluster:GpuCluster$ml-dev-env:storage:WorkspaceStorage::gpu-storage",
            ("ml-dev-env:storage:WorkspaceStorage", "gpu-storage"),
        ),
        ("", None),
        ("not-a-urn", None),
    ],
)
def test_urn_key(urn: str, key: tuple[str, str] | None) -> None:
    assert diagram.urn_key(urn) == key


def test_write_replaces_only_the_marked_block_and_check_detects_staleness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n\n{diagram.START}\nold diagram\n{diagram.END}\n\n## After\ntext\n")
    assert diagram.main(["nerc-production", "--check", str(readme)]) == 1
    assert diagram.main(["nerc-production", "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n<!-- architecture:start -->\n") and text.endswith(f"{diagram.END}\n\n## After\ntext\n")
    assert "old diagram" not in text and "```mermaid\nflowchart LR\n" in text and "**Stack `nerc-production`**" in text
    assert diagram.main(["nerc-production", "--check", str(readme)]) == 0
    assert diagram.main(["nerc-production", "--write", str(readme)]) == 0 and readme.read_text() == text
    capsys.readouterr()


def test_missing_markers_and_unknown_stacks_are_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert diagram.main(["nerc-production", "--write", str(readme)]) == 2
    assert "markers" in capsys.readouterr().err and readme.read_text() == "# no markers\n"
    assert diagram.main(["no-such-stack"]) == 2
    assert "no stack file for no-such-stack" in capsys.readouterr().err


def test_prints_every_stack_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert diagram.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("flowchart LR") == len(STACKS)
    for stack in STACKS:
        assert f"Stack {stack}" in out


def test_readme_architecture_block_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    readme = Path(__file__).resolve().parent.parent / "docs" / "ref" / "architecture.md"
    if diagram.START not in readme.read_text():
        pytest.skip("docs/ref/architecture.md has no architecture markers yet")
    assert diagram.main(["--check", str(readme)]) == 0, "the architecture page is stale: run `make docs-generate`"
    capsys.readouterr()
