"""`make racks STACK=<cluster stack> LABEL=<node label>`: `fabricCheck.nodeRacks` from a node topology label.

Rack-aware ranks (docs/operate/fabric-check.md) need each GPU node's rack. The pods could read their node's
labels themselves only with a cluster-scoped grant (`get` on nodes, which a namespace admin cannot give), so
the stack carries the mapping as config, and this tool writes it from the label the cluster already has
(`topology.kubernetes.io/rack`, a leaf-switch label, …) with the rights of whoever runs it (`oc get nodes`).

The nodes are the stack's `nodes.gpuNodes`, or, when it pins none, every node `oc` lists with the stack's GPU
node selector (`nvidia.com/gpu.present=true` and `nodes.gpuProduct`). It prints the `pulumi config set --path`
commands that replace the stack file's mapping with it (and the mapping itself); a node without the label, or
whose label value is no valid rack name, is named in one line and nothing is printed to apply. An environment
stack is refused: the mapping belongs to its cluster stack. Exit status: 0 when every node has the label, else 1.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from core.naming import DNS_LABEL
from stacks.config import StackConfig
from stacks.loader import stack_raw, validate_all
from tools.mock_engine import ROOT, flatten, stack_config
from tools.oc import Oc, run_oc

KEY = "ml-dev-env:fabricCheck.nodeRacks"


def load(stack: str, config_dir: Path) -> StackConfig:
    """The stack's config without its current `nodeRacks` (which this tool replaces: a node added to or removed
    from `nodes.gpuNodes` makes the old mapping invalid, and that must not stop the tool that fixes it)."""
    flat, _ = flatten(stack_config(config_dir / f"Pulumi.{stack}.yaml"))
    raw, problems = stack_raw(flat, config_dir)
    if raw.get("environment"):
        cluster = raw["environment"].get("cluster", "?")
        raise SystemExit(f"ERROR: {stack} is an environment stack; nodeRacks belongs to its cluster stack: make racks STACK={cluster}")
    fabric = raw.get("fabricCheck")
    if isinstance(fabric, dict):
        raw = {**raw, "fabricCheck": {k: v for k, v in fabric.items() if k != "nodeRacks"}}
    config, value_problems = validate_all(raw)
    if config is None:
        raise SystemExit(f"ERROR: Pulumi.{stack}.yaml does not validate: {(problems + value_problems)[0]} (`make render STACK={stack}`)")
    return config


def node_selector(config: StackConfig) -> str:
    selector = ["nvidia.com/gpu.present=true"]
    if config.nodes.gpu_product:
        selector.append(f"nvidia.com/gpu.product={config.nodes.gpu_product}")
    return ",".join(selector)


def racks_from(nodes: list[dict[str, Any]], label: str, wanted: list[str] | None) -> tuple[dict[str, str], list[str]]:
    """Node → rack from the `label` of the listed `nodes` (only `wanted` ones, in that order, when given), and problems."""
    labels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in nodes}
    names = wanted if wanted is not None else sorted(labels)
    racks: dict[str, str] = {}
    problems: list[str] = []
    for name in names:
        if name not in labels:
            problems.append(f"node {name}: not found by `oc get nodes` (nodes.gpuNodes names it)")
        elif not labels[name].get(label):
            problems.append(f"node {name}: has no label {label} (its labels: {', '.join(sorted(labels[name])) or 'none'})")
        elif not DNS_LABEL.match(labels[name][label]):
            value = labels[name][label]
            problems.append(
                f"node {name}: {label}={value} is no rack name nodeRacks accepts (lower-case letters, digits and '-', "
                f"at most 63); set the node's rack by hand, e.g. {re.sub(r'[^a-z0-9-]+', '-', value.lower()).strip('-') or 'rack-1'}"
            )
        else:
            racks[name] = labels[name][label]
    return racks, problems


def commands(stack: str, racks: dict[str, str]) -> list[str]:
    """`pulumi config` lines that replace the stack file's mapping with this one (grouped by rack): the old one
    is removed first, so a node no longer in the stack loses its entry. `config rm --path` of a key that is not
    there does nothing (pulumi sdk/go/common/resource/config/map.go, `Map.Remove`: a missing root returns nil)."""
    order = list(dict.fromkeys(racks.values()))
    ordered = sorted(racks.items(), key=lambda kv: (order.index(kv[1]), kv[0]))
    # with --path, pulumi stores "true"/"false" and integers as such; a rack is a string (--type string, CLI 3.1xx+)
    typed = {rack: " --type string" if rack.isdigit() or rack in ("true", "false") else "" for rack in order}
    return [f"pulumi config rm -s {stack} --path {KEY}"] + [
        f"pulumi config set -s {stack} --path{typed[rack]} {shlex.quote(f'{KEY}[{json.dumps(node)}]')} {shlex.quote(rack)}"
        for node, rack in ordered
    ]


def main(argv: list[str] | None = None, oc: Oc = run_oc) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stack", help="the cluster stack (Pulumi.<stack>.yaml)")
    parser.add_argument("--label", required=True, help="the node label that names the rack, e.g. topology.kubernetes.io/rack")
    parser.add_argument("--config-dir", default=str(ROOT), help="where the Pulumi.<stack>.yaml files are")
    args = parser.parse_args(argv)
    config = load(args.stack, Path(args.config_dir))
    wanted = list(config.nodes.gpu_nodes) or None
    query = ["get", "nodes", *(wanted or []), *([] if wanted else ["-l", node_selector(config)]), "-o", "json"]
    proc = oc(query)
    if proc.returncode != 0:
        print(f"ERROR: oc {' '.join(query)}: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
        return 1
    listed = json.loads(proc.stdout)
    nodes = listed.get("items") if listed.get("kind") == "List" or "items" in listed else [listed]
    racks, problems = racks_from(nodes or [], args.label, wanted)
    for line in problems:
        print(f"ERROR: {line}", file=sys.stderr)
    if problems or not racks:
        if not racks and not problems:
            print(f"ERROR: oc listed no GPU node ({node_selector(config)})", file=sys.stderr)
        return 1
    print(f"# {KEY} from node label {args.label}: {len(racks)} nodes in {len(set(racks.values()))} racks")
    for node, rack in racks.items():
        print(f"#   {node}: {rack}")
    print("\n".join(commands(args.stack, racks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
