"""Architecture diagrams: the components of a stack and what each creates, drawn offline with Graphviz.

Runs the real program offline (tools/mock_engine.py, the same run as `make render`), nests every
resource under its parent ComponentResource (the `parent` URN the engine recorded) and groups each
component's direct children by kind with counts, as a Graphviz DOT source. The docs show each stack's
picture as an SVG drawn by Debian's `dot -Tsvg` (no browser-side diagram script, nothing fetched: the site
works offline); the DOT sources sit next to the SVGs in docs/img/architecture/. Output is deterministic
(sorted, no run-specific values), so the pictures only change when the architecture does; each SVG
carries its source's sha256, so `--check` needs no Graphviz.

    python tools/diagram.py [STACK ...]               print the DOT sources (default: every stack)
    python tools/diagram.py --write docs/ref/architecture.md   draw the pictures, replace the block between the markers
    python tools/diagram.py --check docs/ref/architecture.md   exit 1 if the block, a source or a picture is stale
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


FONT = "Helvetica,Arial,sans-serif"
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


def markdown(stacks: list[str], page: Path, images: Path) -> str:
    """The docs block body: one picture per stack (its SVG under `images`, linked relative to `page`)."""
    rel = Path(os.path.relpath(images, page.parent)).as_posix()
    parts = [
        "<!-- generated by `make docs-generate` (tools/diagram.py: Graphviz sources and SVGs in "
        f"{rel}/); edit the program, not this block -->"
    ]
    for stack in stacks:
        parts += ["", f"**Stack `{stack}`**", "", f"![Stack {stack}: its components and what each creates]({rel}/{stack}.svg)"]
    return "\n".join(parts) + "\n"


def replace_block(text: str, body: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"markers {START} … {END} not found (in this order)")
    return text[: start + len(START)] + "\n" + body + text[end:]


def stale_pictures(stacks: list[str], images: Path) -> list[str]:
    """Which of `images`/<stack>.dot and .svg differ from what the program draws now (no Graphviz needed: the SVG
    carries its source's hash)."""
    stale = []
    for stack in stacks:
        source = graph(offline_run(stack))
        dot_file, svg_file = images / f"{stack}.dot", images / f"{stack}.svg"
        if not dot_file.exists() or dot_file.read_text() != source:
            stale.append(str(dot_file))
        if not svg_file.exists() or svg_source_hash(svg_file.read_text()) != source_hash(source):
            stale.append(str(svg_file))
    return stale


def write_pictures(stacks: list[str], images: Path) -> list[Path]:
    """Write `images`/<stack>.dot and .svg where they changed; returns what was written."""
    images.mkdir(parents=True, exist_ok=True)
    written = []
    for stack in stacks:
        source = graph(offline_run(stack))
        dot_file, svg_file = images / f"{stack}.dot", images / f"{stack}.svg"
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
            print(graph(offline_run(stack)), end="")
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
