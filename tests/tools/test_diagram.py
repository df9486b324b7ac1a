"""tools/diagram.py: deterministic Graphviz diagrams, drawn as SVG by `dot` (offline) into docs/img/architecture/ and
shown by the architecture page; stale sources or pictures fail. The flow pictures (browser, laptop, SSH fabric,
model bytes) take their names and ports from the render's objects: changing an object changes the picture. How they
read in a browser is tests/repo/test_docs_site.py's."""

from __future__ import annotations

import copy
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
    assert "old diagram" not in text and "### Stack `nerc-production`" in text
    assert '<img src="../img/architecture/nerc-production.svg"' in text, "the picture, linked relative to the page"
    for flow in ("browser", "laptop", "fabric"):
        assert f"](../img/architecture/nerc-production-{flow}.svg)" in text
        assert (images / f"nerc-production-{flow}.dot").exists() and (images / f"nerc-production-{flow}.svg").exists()
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
    assert out.count("digraph ") == sum(len(diagram.pictures(stack)) for stack in STACKS)
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


LABEL = re.compile(r'^  (\w+) \[label="((?:[^"\\]|\\.)*)"')


def nodes_and_edges(source: str) -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    """node id -> its label's lines; (from, to) edges."""
    nodes = {m.group(1): m.group(2).split("\\n") for line in source.splitlines() if (m := LABEL.match(line))}
    edges = {(m.group(1), m.group(2)) for line in source.splitlines() if (m := re.match(r"^  (\w+) -> (\w+)", line))}
    return nodes, edges


def objects(result: RunResult, kind: str) -> list[dict]:
    return [r.inputs for r in result.resources if r.typ.startswith("kubernetes:") and r.kind == kind]


def flow(result: RunResult, slug: str) -> diagram.Flow | None:
    return next((f for f in diagram.flows(result) if f.slug == slug), None)


def node_with(nodes: dict[str, list[str]], *lines: str) -> str:
    found = [n for n, label in nodes.items() if all(line in label for line in lines)]
    assert len(found) == 1, (lines, nodes)
    return found[0]


@pytest.mark.parametrize("stack", STACKS)
def test_browser_flow_follows_each_route_to_its_server_with_the_renders_ports(stack: str, runs: dict[str, RunResult]) -> None:
    result = runs[stack]
    picture = flow(result, "browser")
    assert picture is not None
    nodes, edges = nodes_and_edges(picture.source)
    service = {s["metadata"]["name"]: s for s in objects(result, "Service")}
    containers = objects(result, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"]
    routes = objects(result, "Route")
    assert routes
    browser = node_with(nodes, "browser")
    for route in routes:
        target = route["spec"]["port"]["targetPort"]
        svc = service[route["spec"]["to"]["name"]]
        port = next(p for p in svc["spec"]["ports"] if p["name"] == target)
        r = node_with(nodes, "Route", route["metadata"]["name"])
        assert f"Service {svc['metadata']['name']}" in nodes[r] and f"port {port['port']}" in nodes[r]
        container = next(c for c in containers for cp in c.get("ports", []) if cp["name"] == port["targetPort"])
        listen = next(cp["containerPort"] for cp in container["ports"] if cp["name"] == port["targetPort"])
        proxy = node_with(nodes, container["name"], f"pod 0 :{listen}")
        upstream = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--upstream="))
        server = node_with(nodes, target, upstream.removeprefix("http://"))
        assert {(browser, r), (r, proxy), (proxy, server)} <= edges, route["metadata"]["name"]
        assert nodes[proxy][0] == "OAuth proxy"


def test_a_renamed_route_or_port_changes_the_picture(runs: dict[str, RunResult]) -> None:
    result = copy.deepcopy(runs["nerc-production"])
    before = flow(result, "browser")
    route = next(r for r in result.resources if r.kind == "Route" and r.inputs["spec"]["port"]["targetPort"] == "jupyter")
    route.inputs["metadata"]["name"] = "renamed-jupyter"
    service = next(
        r for r in result.resources if r.kind == "Service" and r.inputs["metadata"]["name"] == route.inputs["spec"]["to"]["name"]
    )
    next(p for p in service.inputs["spec"]["ports"] if p["name"] == "jupyter")["port"] = 9999
    after = flow(result, "browser")
    assert before is not None and after is not None and before.source != after.source
    nodes, _ = nodes_and_edges(after.source)
    assert "port 9999" in nodes[node_with(nodes, "renamed-jupyter")]


@pytest.mark.parametrize("stack", STACKS)
def test_fabric_flow_from_pod_0_to_every_pod_with_port_secret_and_policy(stack: str, runs: dict[str, RunResult]) -> None:
    result = runs[stack]
    sts = objects(result, "StatefulSet")[0]
    count, app = sts["spec"]["replicas"], sts["metadata"]["name"]
    picture = flow(result, "fabric")
    if count < 2:
        assert picture is None, "one pod: no fabric to draw"
        return
    assert picture is not None
    nodes, edges = nodes_and_edges(picture.source)
    port = sts["spec"]["template"]["metadata"]["annotations"]["ml-dev-env/ssh-port"]
    zero = node_with(nodes, f"pod {app}-0")
    assert any("ml-dev run" in line for line in nodes[zero]) and any("mpirun" in line for line in nodes[zero])
    for i in range(1, count):
        pod = node_with(nodes, f"pod {app}-{i}", f"sshd :{port}")
        assert (zero, pod) in edges and f'  {zero} -> {pod} [label="ssh :{port}"]' in picture.source
    secret = next(v["secret"]["secretName"] for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "ssh-keys")
    assert (node_with(nodes, f"Secret {secret}"), zero) in edges
    for policy in objects(result, "NetworkPolicy"):
        node = node_with(nodes, f"NetworkPolicy {policy['metadata']['name']}")
        assert (node, zero) in edges
        selected = [p["podSelector"]["matchLabels"] for rule in policy["spec"]["ingress"] if not rule.get("ports") for p in rule["from"]]
        assert selected and all(f"={value}" in " ".join(nodes[node]) for labels in selected for value in labels.values())


def test_fabric_flow_summarises_many_pods(runs: dict[str, RunResult]) -> None:
    result = copy.deepcopy(runs["nerc-production"])
    next(r for r in result.resources if r.kind == "StatefulSet").inputs["spec"]["replicas"] = 8
    picture = flow(result, "fabric")
    assert picture is not None
    nodes, _ = nodes_and_edges(picture.source)
    pods = [label[0] for label in nodes.values() if label[0].startswith(("pod ", "… "))]
    assert pods == ["pod ml-dev-env-0", "pod ml-dev-env-1", "… 5 more", "pod ml-dev-env-7"]


@pytest.mark.parametrize("stack", STACKS)
def test_models_flow_source_to_model_registry_through_the_pipelines_steps(stack: str, runs: dict[str, RunResult]) -> None:
    result = runs[stack]
    runs_ = objects(result, "PipelineRun")
    picture = flow(result, "models")
    if not runs_:
        assert picture is None
        return
    assert picture is not None
    nodes, edges = nodes_and_edges(picture.source)
    succ = dict(edges)
    chain = [node_with(nodes, "model source")]
    while chain[-1] in succ:
        chain.append(succ[chain[-1]])
    titles = [nodes[n][0] for n in chain]
    assert titles[0::2] == ["model source", "Quay", "internal registry", "model registry"], titles
    pipeline = next(p for p in objects(result, "Pipeline") if p["metadata"]["name"] == runs_[0]["spec"]["pipelineRef"]["name"])
    steps = [t for t in pipeline["spec"]["tasks"] if t["name"] in ("package", "mirror", "register")]
    assert titles[1::2] == [f"{t['name']}: Task {t['taskRef']['name']}" for t in steps], titles
    for run in runs_:
        params = {p["name"]: p["value"] for p in run["spec"]["params"]}
        assert params["source-uri"] in nodes[chain[0]] and params["registry-url"] in nodes[chain[6]]
        for node, param in ((chain[2], "quay-image"), (chain[4], "internal-image")):
            host, rest = params[param].split("/", 1)
            assert host in nodes[node] and rest in nodes[node], (param, nodes[node])
