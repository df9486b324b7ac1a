"""tools/diagram.py: deterministic Graphviz diagrams of components and what each creates, drawn as SVG by `dot`
(offline) into docs/img/architecture/ and shown by the architecture page; stale sources or pictures fail."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import STACKS
from tests.fixtures import programs
from tools import diagram, mock_engine
from tools.mock_engine import RunResult

GROUP = re.compile(r"^  (\w+) \[label=<<b>(?:(\d+) × )?([^<]+)</b>")
COMPONENT = re.compile(r'^  (\w+) \[label="(\S+) (\S+)", style="rounded,filled"')
EDGE = re.compile(r"^  (\w+) -> (\w+)$")
SVG = "{http://www.w3.org/2000/svg}"
DOT = shutil.which("dot")
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "ref" / "architecture.md"


def parents(text: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for line in text.splitlines() if (m := EDGE.match(line))}


@pytest.fixture(scope="module")
def runs() -> dict[str, RunResult]:
    return {stack: diagram.offline_run(stack) for stack in STACKS}


def test_output_is_deterministic(runs: dict[str, RunResult]) -> None:
    for stack, result in runs.items():
        first = diagram.graph(result)
        assert first == diagram.graph(result)
        with mock_engine.uncached():
            fresh = diagram.offline_run(stack)
        assert first == diagram.graph(fresh), "a fresh run of the program draws the same diagram"
        assert first.startswith(f'digraph "{stack}" {{\n') and first.endswith("}\n")


@pytest.mark.parametrize("stack", STACKS)
def test_every_component_type_and_kubernetes_kind_is_drawn_with_its_count(stack: str, runs: dict[str, RunResult]) -> None:
    result = runs[stack]
    text = diagram.graph(result)
    components = {diagram.short_type(r.typ) for r in result.resources if not r.custom}
    assert components and all(f'[label="{c} ' in text for c in components)
    kinds = Counter(diagram.short_type(r.typ) for r in result.resources if r.custom)
    assert {k for k in kinds if not k.endswith("provider")} >= {r.kind for r in result.resources if r.typ.startswith("kubernetes:")}
    drawn: Counter[str] = Counter()
    for line in text.splitlines():
        if match := GROUP.match(line):
            drawn[match.group(3)] += int(match.group(2) or 1)
    assert drawn == kinds
    for r in result.resources:  # every Kubernetes object is named
        name = r.inputs.get("metadata", {}).get("name")
        if r.typ.startswith("kubernetes:") and name:
            assert f'<br align="left"/>{diagram.display_name(r)}<br' in text, name
            assert diagram.display_name(r) in (name, name[:-10] + "{hash}"), name


def test_children_nest_under_their_component(runs: dict[str, RunResult]) -> None:
    text = diagram.graph(runs["nerc-production"])
    ids = {f"{m.group(2)} {m.group(3)}": m.group(1) for line in text.splitlines() if (m := COMPONENT.match(line))}
    up = parents(text)
    assert up[ids["WorkspaceStorage gpu-storage"]] == ids["GpuCluster gpu"]
    groups = {m.group(3): (up[m.group(1)], m.group(2)) for line in text.splitlines() if (m := GROUP.match(line))}
    assert groups["PersistentVolumeClaim"] == (ids["WorkspaceStorage gpu-storage"], "2")
    assert groups["StatefulSet"] == (ids["GpuCluster gpu"], None)
    assert groups["Route"] == (ids["GpuCluster gpu"], "4")  # vscode, jupyter, tensorboard, home


def test_dot_syntax_basics(runs: dict[str, RunResult]) -> None:
    for result in runs.values():
        lines = diagram.graph(result).splitlines()
        declared = [m.group(1) for line in lines if (m := re.match(r"^  (\w+) \[label=", line))]
        assert len(declared) == len(set(declared)), "every node is declared once"
        edges = [m.groups() for line in lines if (m := EDGE.match(line))]
        assert all(a in declared and b in declared for a, b in edges)
        assert len(edges) == len(declared) - 1, "a tree: every node but the stack has one parent"
        for line in lines[1:-1]:
            assert line.startswith("  ") and line.count('"') % 2 == 0, line


def test_labels_are_escaped() -> None:
    assert diagram._quoted('a "b"') == 'a \\"b\\"'
    assert diagram._html("<b>&") == "&lt;b&gt;&amp;"


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


@pytest.mark.skipif(DOT is None, reason=programs.missing("dot") or "")
def test_write_replaces_only_the_marked_block_and_check_detects_staleness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "docs" / "ref" / "page.md"
    images = tmp_path / "docs" / "img" / "architecture"
    page.parent.mkdir(parents=True)
    page.write_text(f"# Title\n\nintro\n\n{diagram.START}\nold diagram\n{diagram.END}\n\n## After\ntext\n")
    args = ["nerc-production", "--images", str(images)]
    assert diagram.main([*args, "--check", str(page)]) == 1
    assert diagram.main([*args, "--write", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Title\n\nintro\n\n<!-- architecture:start -->\n") and text.endswith(f"{diagram.END}\n\n## After\ntext\n")
    assert "old diagram" not in text and "**Stack `nerc-production`**" in text
    assert "](../img/architecture/nerc-production.svg)" in text, "the picture, linked relative to the page"
    source = (images / "nerc-production.dot").read_text()
    assert source == diagram.graph(diagram.offline_run("nerc-production"))
    svg = ET.parse(images / "nerc-production.svg").getroot()
    assert svg.tag == f"{SVG}svg"
    shown = {t.text for t in svg.iter(f"{SVG}text")}
    assert {"Stack nerc-production", "GpuCluster gpu", "4 × Route", "ml-dev-env-home"} <= shown, shown
    assert diagram.main([*args, "--check", str(page)]) == 0
    assert diagram.main([*args, "--write", str(page)]) == 0 and page.read_text() == text
    # a picture that no longer matches its source is stale (the SVG carries the source's hash)
    (images / "nerc-production.svg").write_text(diagram.render_svg(source.replace("GpuCluster gpu", "GpuCluster old")))
    assert diagram.main([*args, "--check", str(page)]) == 1
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
    assert out.count("digraph ") == len(STACKS)
    for stack in STACKS:
        assert f"Stack {stack}" in out


def test_architecture_page_and_pictures_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert diagram.START in ARCHITECTURE.read_text()
    assert diagram.main(["--check", str(ARCHITECTURE)]) == 0, "the architecture page or its pictures are stale: run `make docs-generate`"
    capsys.readouterr()
    for stack in STACKS:  # every picture is an SVG drawing of its stack, with nothing to fetch
        text = (diagram.IMAGES / f"{stack}.svg").read_text()
        svg = ET.fromstring(text[text.index("<svg") :])  # after the prolog, doctype and comments
        assert svg.tag == f"{SVG}svg" and f"Stack {stack}" in {t.text for t in svg.iter(f"{SVG}text")}
        assert not [e for e in svg.iter() if e.get("{http://www.w3.org/1999/xlink}href") or e.tag == f"{SVG}image"]
