"""Architecture diagrams, drawn offline with Graphviz: how traffic and bytes flow, and what each component creates.

Per stack, flow pictures built from the render's objects (names and ports read from them, so a renamed Route or
port changes the picture): a browser through each Route and the Service port it names to the OAuth proxy and the
server behind it; a laptop's SSH through `oc exec`; pod 0 to every pod over the SSH fabric (port, key Secret,
NetworkPolicy), which `ml-dev run` and the fabric check's `mpirun` use; a model's bytes from its source through
the pipeline's steps to Quay, the internal registry and the model registry. Then the components picture:

Runs the real program offline (tools/mock_engine.py, the same run as `make render`), nests every
resource under its parent ComponentResource (the `parent` URN the engine recorded) and groups each
component's direct children by kind with counts, as a Graphviz DOT source. The docs show each stack's
picture as an SVG drawn by Debian's `dot -Tsvg` (no browser-side diagram script, nothing fetched: the site
works offline); the DOT sources sit next to the SVGs in docs/img/architecture/. Output is deterministic
(sorted, no run-specific values), so the pictures only change when the architecture does; each SVG
carries its source's sha256, so `--check` needs no Graphviz.

    python tools/diagram.py [STACK ...]               print the DOT sources (default: every stack's pictures)
    python tools/diagram.py --write docs/ref/architecture.md   draw the pictures, replace the block between the markers
    python tools/diagram.py --check docs/ref/architecture.md   exit 1 if the block, a source or a picture is stale

Why one module: one command that measures the imports and draws the pictures of docs/ref/architecture.md; its parts
(graph, layout, SVG) are only ever used together.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file (`python tools/diagram.py`): re-run as the module of the repository package, which needs
    # no sys.path edits (`python -m tools.diagram`, what the Makefile runs).
    os.execve(
        sys.executable,
        [sys.executable, "-m", "tools.diagram", *sys.argv[1:]],
        {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])),
        },
    )

from stacks.loader import SECRET_KEYS
from tools.mock_engine import ROOT, Recorded, RunResult, run_stack

START = "<!-- architecture:start -->"
END = "<!-- architecture:end -->"
STACK_TYPE = "pulumi:pulumi:Stack"
MAX_NAMES = 6
IMAGES = ROOT / "docs" / "img" / "architecture"


def stacks_in(config_dir: Path = ROOT) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in config_dir.glob("Pulumi.*.yaml"))


def offline_run(stack: str) -> RunResult:
    """The program's resources for `stack`, with placeholder values for secrets (as `make render`)."""
    result = run_stack(stack, secrets={key: f"render-placeholder-{key}" for key in SECRET_KEYS})
    if result.error:
        raise SystemExit(f"error: stack {stack}: {result.error}")
    return result


def urn_key(urn: str | None) -> tuple[str, str] | None:
    """(type, name) of a URN `urn:pulumi:<stack>::<project>::<parent types$type>::<name>`."""
    if not urn:
        return None
    parts = urn.split("::")
    if len(parts) < 4:
        return None
    return parts[2].rsplit("$", 1)[-1], "::".join(parts[3:])


def short_type(typ: str) -> str:
    """`GpuCluster` for `ml-dev-env:cluster:GpuCluster`, `StatefulSet` for `kubernetes:apps/v1:StatefulSet`."""
    if typ.startswith("pulumi:providers:"):
        return f"{typ.rsplit(':', 1)[-1]} provider"
    return typ.rsplit(":", 1)[-1]


def display_name(resource: Recorded) -> str:
    """The Kubernetes object name where there is one, else the Pulumi resource name."""
    metadata = resource.inputs.get("metadata") if isinstance(resource.inputs, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not (isinstance(name, str) and name):
        return resource.name
    # Content-hash names (per-input-hash BuildConfigs, PipelineRuns) change with every input edit: show the pattern.
    return re.sub(r"-[0-9a-f]{10}$", "-{hash}", name)


@dataclass
class Node:
    typ: str
    name: str
    resource: Recorded | None
    children: list[Node]

    @property
    def is_component(self) -> bool:
        return self.resource is None or not self.resource.custom


def build_tree(result: RunResult) -> Node:
    root = Node(STACK_TYPE, result.stack, None, [])
    nodes = {(r.typ, r.name): Node(r.typ, r.name, r, []) for r in result.resources}
    for (_, _), node in sorted(nodes.items()):
        assert node.resource is not None
        parent_key = urn_key(node.resource.options.get("parent"))
        parent = nodes.get(parent_key) if parent_key else None
        (parent or root).children.append(node)
    return root


def _html(text: str) -> str:
    return html.escape(text, quote=True)


def _quoted(text: str) -> str:
    """A DOT double-quoted string's content (Graphviz doc/lang: in a quoted string `\\"` is the only escape)."""
    return text.replace('"', '\\"')


class _Ids:
    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, *parts: str) -> str:
        base = re.sub(r"[^A-Za-z0-9]+", "_", "_".join(parts)).strip("_") or "n"
        ident, n = base, 1
        while ident in self.used:
            n += 1
            ident = f"{base}_{n}"
        self.used.add(ident)
        return ident


# DejaVu Sans: the font Debian's chromium draws with (fonts-dejavu-core, the first font alternative of
# fontconfig-config, which both chromium and Graphviz pull in; fontconfig's fallback for Helvetica and sans-serif),
# and the one Graphviz's pango layout measures with, so a label's box fits its text in the browser
# (tests/repo/test_docs_site.py measures it there). Named, not left to a fallback: a machine with other fonts
# (Liberation, Arial) lays out and draws the same font as long as DejaVu Sans is installed.
FONT = "DejaVu Sans"
COMPONENT_STYLE = 'style="rounded,filled", fillcolor="#e8eefc", color="#3b5bdb"'


def graph(result: RunResult) -> str:
    """Graphviz DOT of the stack: Stack -> components -> (nested components, kind groups with counts).

    One line per node (declared where it is first reached) and per edge, in a sorted walk: deterministic."""
    root = build_tree(result)
    ids = _Ids()
    lines = [
        f'digraph "{_quoted(result.stack)}" {{',
        f"  // stack {result.stack}: generated by tools/diagram.py",
        f'  graph [rankdir=LR, fontname="{FONT}", bgcolor="white", nodesep=0.15, ranksep=0.5]',
        f'  node [fontname="{FONT}", fontsize=11, shape=box, margin="0.12,0.06"]',
        '  edge [color="#868e96", arrowsize=0.6]',
    ]
    root_id = ids("stack", result.stack)
    lines.append(f'  {root_id} [label="Stack {_quoted(result.stack)}", shape=oval, style=filled, fillcolor="#f1f3f5"]')

    def emit(node: Node, node_id: str) -> None:
        components = sorted((c for c in node.children if c.is_component), key=lambda c: (short_type(c.typ), c.name))
        for child in components:
            child_id = ids("c", short_type(child.typ), child.name)
            label = _quoted(f"{short_type(child.typ)} {child.name}")
            lines.append(f'  {child_id} [label="{label}", {COMPONENT_STYLE}]')
            lines.append(f"  {node_id} -> {child_id}")
            emit(child, child_id)
        groups: dict[str, list[str]] = defaultdict(list)
        for child in node.children:
            if not child.is_component:
                assert child.resource is not None
                groups[short_type(child.typ)].append(display_name(child.resource))
                # a custom resource's own children (rare) are grouped under it as well
                if child.children:
                    emit(child, ids("r", short_type(child.typ), child.name))
        for kind, names in sorted(groups.items()):
            names = sorted(names)
            shown = names[:MAX_NAMES] + ([f"… {len(names) - MAX_NAMES} more"] if len(names) > MAX_NAMES else [])
            title = kind if len(names) == 1 else f"{len(names)} × {kind}"
            group_id = ids("k", node_id, kind)
            rows = "".join(f'<br align="left"/>{_html(n)}' for n in shown)
            lines.append(f'  {group_id} [label=<<b>{_html(title)}</b>{rows}<br align="left"/>>]')
            lines.append(f"  {node_id} -> {group_id}")

    emit(root, root_id)
    lines.append("}")
    return "\n".join(lines) + "\n"


# --- Flow pictures: how traffic and bytes move, drawn from the render's objects (names and ports from them) ---

FLOW_FONT = FONT
FLOW_SIZE = 13  # pt: with the widths below, at least 12 px on the docs site at 1280 px (the column is ~688 px)
FLOW_HEAD = [
    f'  graph [fontname="{FLOW_FONT}", fontsize={FLOW_SIZE}, bgcolor="white", nodesep=0.2, ranksep=0.3, pad=0.1]',
    f'  node [fontname="{FLOW_FONT}", fontsize={FLOW_SIZE}, shape=box, style="rounded,filled", fillcolor="#f8f9fa", color="#495057", '
    'margin="0.14,0.07"]',
    f'  edge [fontname="{FLOW_FONT}", fontsize={FLOW_SIZE}, color="#495057", arrowsize=0.7]',
]
PEOPLE = 'fillcolor="#fff3bf", color="#e67700"'
OBJECT = 'fillcolor="#e8eefc", color="#3b5bdb"'
STORE = 'fillcolor="#ebfbee", color="#2b8a3e"'
MAX_PODS = 3  # pods drawn on the fabric picture besides pod 0; more are summarised in one node


@dataclass
class Flow:
    slug: str  # the picture's file: <stack>-<slug>.svg
    caption: str
    source: str


def _label(*lines: str) -> str:
    """A multi-line DOT label (centred lines)."""
    return "\\n".join(_quoted(line) for line in lines)


def _objects(result: RunResult, kind: str) -> list[dict]:
    return [r.inputs for r in result.resources if r.typ.startswith("kubernetes:") and r.kind == kind and isinstance(r.inputs, dict)]


def _name(obj: dict) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _split_image(ref: str) -> tuple[str, str]:
    """(registry host, the rest) of an image reference or URL, for two short lines instead of one long one."""
    host, _, rest = ref.partition("/")
    return (host, rest) if rest else (ref, "")


def browser_flow(result: RunResult) -> Flow | None:
    """Browser → Route (and the Service port it names) → OAuth proxy container → server, per Route of the
    StatefulSet's Service."""
    sets = _objects(result, "StatefulSet")
    if not sets:
        return None
    sts = sets[0]
    pod_spec = sts["spec"]["template"]["spec"]
    containers = pod_spec.get("containers", [])
    by_port_name = {p["name"]: (c, p) for c in containers for p in c.get("ports", []) if "name" in p}
    services = {_name(s): s for s in _objects(result, "Service")}
    ids = _Ids()
    lines = [f'digraph "{_quoted(result.stack)} browser" {{', "  // generated by tools/diagram.py from the render", *FLOW_HEAD]
    lines.append("  graph [rankdir=LR]")
    browser = ids("browser")
    lines.append(f'  {browser} [label="{_label("browser", "(OpenShift", "login)")}", {PEOPLE}]')
    routes = sorted(_objects(result, "Route"), key=_name)
    for route in routes:
        spec = route.get("spec", {})
        service = services.get(spec.get("to", {}).get("name", ""))
        target = spec.get("port", {}).get("targetPort")
        port = next((p for p in (service or {}).get("spec", {}).get("ports", []) if p.get("name") == target), None)
        if service is None or port is None:
            continue
        container, cport = by_port_name.get(str(port.get("targetPort")), (None, None))
        tls = spec.get("tls", {}).get("termination", "none")
        # the Route and the Service port it names share a node: one rank less, so the picture fits the page's column
        r_id = ids("route", _name(route))
        label = _label("Route", _name(route), f"https :443, {tls} TLS", f"Service {_name(service)}", f"port {port.get('port')}")
        lines.append(f'  {r_id} [label="{label}", {OBJECT}]')
        lines.append(f"  {browser} -> {r_id}")
        s_id = r_id
        if container is None or cport is None:
            continue
        upstream = next((a.split("=", 1)[1] for a in container.get("args", []) if a.startswith("--upstream=")), "")
        proxied = "oauth-proxy" in str(container.get("image", "")) or any(a.startswith("--provider=") for a in container.get("args", []))
        c_id = ids("proxy", container["name"])
        kind = "OAuth proxy" if proxied else "container"
        listen = cport["containerPort"]
        lines.append(f'  {c_id} [label="{_label(kind, container["name"], f"pod 0 :{listen}")}", {OBJECT}]')
        lines.append(f"  {s_id} -> {c_id}")
        if upstream:
            server = str(route.get("spec", {}).get("port", {}).get("targetPort", ""))
            u_id = ids("server", server)
            lines.append(f'  {u_id} [label="{_label(server, upstream.removeprefix("http://"))}", {STORE}]')
            lines.append(f"  {c_id} -> {u_id}")
    lines.append("}")
    return Flow("browser", f"How a browser reaches the servers: Routes and ports (stack {result.stack})", "\n".join(lines) + "\n")


def laptop_flow(result: RunResult) -> Flow | None:
    """The laptop's SSH (the stack's ssh_config output): `oc exec` through the API server (the user's own login,
    RBAC pods/exec) → sshd in inetd mode in the pod's main container; no Route, NodePort or LoadBalancer."""
    sets = _objects(result, "StatefulSet")
    if not sets:
        return None
    sts = sets[0]
    containers = sts["spec"]["template"]["spec"].get("containers", [])
    main = containers[0]["name"] if containers else "?"
    namespace = sts.get("metadata", {}).get("namespace", "")
    app = _name(sts)
    startup = next((m["mountPath"] for c in containers[:1] for m in c.get("volumeMounts", []) if m.get("name") == "startup"), "")
    ids = _Ids()
    lines = [f'digraph "{_quoted(result.stack)} laptop" {{', "  // generated by tools/diagram.py from the render", *FLOW_HEAD]
    lines.append("  graph [rankdir=LR]")
    laptop, exec_id, sshd = ids("laptop"), ids("exec"), ids("sshd")
    # the first pod's host alias as the stack's ssh_config output names it (<cluster>-<environment>-0)
    hosts = [line.split()[1] for line in str(result.outputs.get("ssh_config", "")).splitlines() if line.startswith("Host ")]
    alias = hosts[0] if hosts else f"{app}-0"
    lines.append(f'  {laptop} [label="{_label("laptop", f"ssh {alias}", "(VS Code, rsync)")}", {PEOPLE}]')
    lines.append(f'  {exec_id} [label="{_label("oc exec -i", f"-n {namespace}", "(your login,", "pods/exec)")}", {OBJECT}]')
    lines.append(f'  {sshd} [label="{_label("sshd -i (inetd)", f"{startup}/sshd.sh", f"container {main}", f"pod {app}-<i>")}", {STORE}]')
    lines += [f"  {laptop} -> {exec_id}", f"  {exec_id} -> {sshd}", "}"]
    return Flow("laptop", f"How a laptop reaches a pod: SSH through oc exec (stack {result.stack})", "\n".join(lines) + "\n")


def fabric_flow(result: RunResult) -> Flow | None:
    """Pod 0 → every other pod over SSH: the port (the pod template's annotation), the key Secret mounted in every
    pod, the NetworkPolicy that admits the app's own pods; `ml-dev run` and the fabric check's `mpirun` use it."""
    sets = _objects(result, "StatefulSet")
    if not sets:
        return None
    sts = sets[0]
    count = int(sts["spec"].get("replicas", 1))
    if count < 2:
        return None
    app = _name(sts)
    template = sts["spec"]["template"]
    port = template.get("metadata", {}).get("annotations", {}).get("ml-dev-env/ssh-port", "?")
    pod_spec = template["spec"]
    secret_vol = next((v for v in pod_spec.get("volumes", []) if v.get("secret") and v["name"] == "ssh-keys"), None)
    mount = next((m["mountPath"] for c in pod_spec["containers"][:1] for m in c.get("volumeMounts", []) if m.get("name") == "ssh-keys"), "")
    headless = sts["spec"].get("serviceName", "")
    namespace = sts.get("metadata", {}).get("namespace", "")
    ids = _Ids()
    lines = [f'digraph "{_quoted(result.stack)} fabric" {{', "  // generated by tools/diagram.py from the render", *FLOW_HEAD]
    lines.append("  graph [rankdir=TB]")
    zero = ids("pod", "0")
    lines.append(f'  {zero} [label="{_label(f"pod {app}-0", "ml-dev run (ranks),", "fabric check (mpirun)")}", {PEOPLE}]')
    others = list(range(1, count))
    shown: list[tuple[str, str]] = [(f"{app}-{i}", f"{app}-{i}.{headless}") for i in others]
    if len(others) > MAX_PODS:
        shown = [shown[0], (f"… {len(others) - 2} more", ""), shown[-1]]
    for name, host in shown:
        node = ids("pod", name)
        text = _label(f"pod {name}", f"sshd :{port}") if host else _label(name, "pods")
        lines.append(f'  {node} [label="{text}", {STORE}]')
        lines.append(f'  {zero} -> {node} [label="{_label(f"ssh :{port}")}"]')
    if secret_vol is not None:
        secret = ids("secret")
        name = secret_vol["secret"]["secretName"]
        lines.append(f'  {secret} [label="{_label(f"Secret {name}", "client key, host key,", f"authorized_keys: {mount}")}", {OBJECT}]')
        lines.append(f'  {secret} -> {zero} [style=dashed, arrowhead=none, label="{_label("in every pod")}"]')
    for policy in _objects(result, "NetworkPolicy"):
        pid = ids("policy", _name(policy))
        # who may connect: the ingress rules' pod selectors (any port), as the policy spells them
        peers = [
            ", ".join(f"{key.rsplit('/', 1)[-1]}={value}" for key, value in sorted(peer["podSelector"].get("matchLabels", {}).items()))
            for rule in policy.get("spec", {}).get("ingress", [])
            if not rule.get("ports")
            for peer in rule.get("from", [])
            if "podSelector" in peer and "namespaceSelector" not in peer
        ]
        label = _label(f"NetworkPolicy {_name(policy)}", f"admits pods of {namespace} with", *(peers or ["(no pod rule)"]))
        lines.append(f'  {pid} [label="{label}", {OBJECT}]')
        lines.append(f"  {pid} -> {zero} [style=dashed, arrowhead=none]")
    lines.append("}")
    return Flow("fabric", f"How pod 0 reaches every pod (stack {result.stack})", "\n".join(lines) + "\n")


ROLES = {"source-uri": "model source", "quay-image": "Quay", "internal-image": "internal registry", "registry-url": "model registry"}


def models_flow(result: RunResult) -> Flow | None:
    """Model source → package step → Quay → mirror step → internal registry → register step → model registry: the
    PipelineRuns' parameters (one line per model) along their Pipeline's tasks in order."""
    runs = sorted(_objects(result, "PipelineRun"), key=_name)
    if not runs:
        return None
    pipelines = {_name(p): p for p in _objects(result, "Pipeline")}
    ids = _Ids()
    lines = [f'digraph "{_quoted(result.stack)} models" {{', "  // generated by tools/diagram.py from the render", *FLOW_HEAD]
    lines.append("  graph [rankdir=TB]")
    for pipeline_name in sorted({r["spec"]["pipelineRef"]["name"] for r in runs}):
        pipeline = pipelines.get(pipeline_name)
        if pipeline is None:
            continue
        mine = [r for r in runs if r["spec"]["pipelineRef"]["name"] == pipeline_name]
        values = [{p["name"]: p["value"] for p in r["spec"].get("params", [])} for r in mine]

        def store(param: str, pipeline_name: str = pipeline_name, values: list[dict] = values) -> str:
            node = ids("store", pipeline_name, param)
            refs = [r for r in dict.fromkeys(str(v.get(param, "")) for v in values) if r]  # one row per model, in run order
            if param in ("quay-image", "internal-image"):  # the registry once, then each model's repository and tag
                rows = list(dict.fromkeys(_split_image(r)[0] for r in refs)) + [_split_image(r)[1] for r in refs]
            else:
                rows = refs
            lines.append(f'  {node} [label="{_label(ROLES[param], *rows)}", {STORE if param != "source-uri" else PEOPLE}]')
            return node

        previous = store("source-uri")
        for task in pipeline["spec"].get("tasks", []):
            refs = {str(p["value"]) for p in task.get("params", [])}
            outputs = [param for param in ("quay-image", "internal-image", "registry-url") if f"$(params.{param})" in refs]
            if not outputs:
                continue
            step = ids("task", pipeline_name, task["name"])
            title = f"{task['name']}: Task {task['taskRef']['name']}"
            lines.append(f'  {step} [label="{_label(title, f"(Pipeline {pipeline_name})")}", {OBJECT}]')
            lines.append(f"  {previous} -> {step}")
            previous = store(outputs[0])
            lines.append(f"  {step} -> {previous}")
    lines.append("}")
    return Flow("models", f"Where a model's bytes go (stack {result.stack}: {len(runs)} PipelineRuns)", "\n".join(lines) + "\n")


def flows(result: RunResult) -> list[Flow]:
    return [f for f in (browser_flow(result), laptop_flow(result), fabric_flow(result), models_flow(result)) if f is not None]


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def render_svg(source: str) -> str:
    """`dot -Tsvg` of a DOT source (Debian's graphviz), marked with the source's sha256 so that a test can tell
    a stale picture without Graphviz."""
    dot = shutil.which("dot")
    if dot is None:
        raise SystemExit("error: drawing the architecture diagrams needs Graphviz's `dot` (Debian: graphviz; `make system-deps`)")
    out = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise SystemExit(f"error: dot -Tsvg failed: {out.stderr.strip()}")
    svg = out.stdout
    at = svg.index("<svg")
    return f"{svg[:at]}<!-- {HASH_MARK} {source_hash(source)} -->\n{svg[at:]}"


HASH_MARK = "tools/diagram.py source sha256"


def svg_source_hash(svg: str) -> str | None:
    found = re.search(rf"<!-- {re.escape(HASH_MARK)} ([0-9a-f]{{64}}) -->", svg)
    return found.group(1) if found else None


def pictures(stack: str) -> dict[str, tuple[str, str]]:
    """Every picture of a stack: file stem -> (caption, DOT source); the flow pictures first, then the components."""
    result = offline_run(stack)
    out = {f"{stack}-{flow.slug}": (flow.caption, flow.source) for flow in flows(result)}
    out[stack] = (f"Stack {stack}: its components and what each creates", graph(result))
    return out


def markdown(stacks: list[str], page: Path, images: Path) -> str:
    """The docs block body: per stack, its flow pictures (each fits the page's column) and then its components and
    what each creates (wide: shown at its own size, scrolling sideways, so its text stays readable)."""
    rel = Path(os.path.relpath(images, page.parent)).as_posix()
    parts = [
        "<!-- generated by `make docs-generate` (tools/diagram.py: Graphviz sources and SVGs in "
        f"{rel}/); edit the program, not this block -->"
    ]
    for stack in stacks:
        parts += ["", f"### Stack `{stack}`"]
        for stem, (caption, _) in pictures(stack).items():
            if stem == stack:
                parts += [
                    "",
                    "What each component creates (wide: scroll sideways):",
                    "",
                    f'<div class="diagram-wide" style="overflow-x: auto"><img src="{rel}/{stem}.svg" alt="{_html(caption)}" '
                    'style="max-width: none"></div>',
                ]
            else:
                parts += ["", f"{caption}:", "", f"![{caption}]({rel}/{stem}.svg)"]
    return "\n".join(parts) + "\n"


def replace_block(text: str, body: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"markers {START} … {END} not found (in this order)")
    return text[: start + len(START)] + "\n" + body + text[end:]


def stale_pictures(stacks: list[str], images: Path) -> list[str]:
    """Which of `images`/<picture>.dot and .svg differ from what the program draws now (no Graphviz needed: the SVG
    carries its source's hash)."""
    stale = []
    for stack in stacks:
        for stem, (_, source) in pictures(stack).items():
            dot_file, svg_file = images / f"{stem}.dot", images / f"{stem}.svg"
            if not dot_file.exists() or dot_file.read_text() != source:
                stale.append(str(dot_file))
            if not svg_file.exists() or svg_source_hash(svg_file.read_text()) != source_hash(source):
                stale.append(str(svg_file))
    return stale


def write_pictures(stacks: list[str], images: Path) -> list[Path]:
    """Write `images`/<picture>.dot and .svg where they changed; returns what was written."""
    images.mkdir(parents=True, exist_ok=True)
    written = []
    for stack in stacks:
        for stem, (_, source) in pictures(stack).items():
            dot_file, svg_file = images / f"{stem}.dot", images / f"{stem}.svg"
            if not dot_file.exists() or dot_file.read_text() != source:
                dot_file.write_text(source)
                written.append(dot_file)
            if not svg_file.exists() or svg_source_hash(svg_file.read_text()) != source_hash(source):
                svg_file.write_text(render_svg(source))
                written.append(svg_file)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stacks", nargs="*", help="stack names (default: every Pulumi.<stack>.yaml)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="FILE", help="replace the architecture block of FILE (e.g. docs/ref/architecture.md)")
    mode.add_argument("--check", metavar="FILE", help="exit 1 if FILE's architecture block or the pictures are not up to date")
    parser.add_argument("--images", default=str(IMAGES), help=f"where the DOT sources and SVGs go (default {IMAGES.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    stacks = args.stacks or stacks_in()
    unknown = sorted(set(stacks) - set(stacks_in()))
    if unknown:
        print(f"error: no stack file for {', '.join(unknown)}; available: {', '.join(stacks_in())}", file=sys.stderr)
        return 2
    if not (args.write or args.check):
        for stack in stacks:
            for _, source in pictures(stack).values():
                print(source, end="")
        return 0
    path, images = Path(args.write or args.check), Path(args.images)
    text = path.read_text()
    try:
        updated = replace_block(text, markdown(stacks, path, images))
    except ValueError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = ([str(path)] if updated != text else []) + stale_pictures(stacks, images)
        if stale:
            print(f"architecture diagrams are stale ({', '.join(stale)}); run `make docs-generate`", file=sys.stderr)
            return 1
        return 0
    for written in write_pictures(stacks, images):
        print(f"drew {written}")
    if updated != text:
        path.write_text(updated)
        print(f"updated the architecture diagrams in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
