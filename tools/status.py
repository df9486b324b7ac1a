"""`make status CLUSTER=<name>`: every environment of a cluster — owner, namespace, size, state, GPU-hours of 7 days.

Who holds the GPUs, from the live objects, with the rights a team member has. `oc` reads, in each
namespace that a stack of this project deploys to on that cluster (every `Pulumi.<stack>.yaml` whose
`cluster.name` is the cluster: the cluster stack and its environment stacks), the StatefulSets,
ConfigMaps and pods labelled `ml-dev-env/cluster=<cluster>` (the pods say why a running environment's
pods hold no GPUs: pending with the scheduler's reason, gated, crash-looping). List rights in those namespaces are enough; a
namespace `oc` cannot read is named on stderr in one line and the table shows the others.
`--all-namespaces` (`make status ALL=1`) reads the whole cluster instead (cluster-wide list rights): it
also finds environments whose stack file is not in this checkout. The table is `inpod/usage.py`'s, the
same one `ml-dev status --all` prints in a pod.

`--start APP` (`make status START=<appName>`): the start ledger of that environment instead (inpod/lib/ledger.py,
the table `ml-dev status --start` prints in a pod): its pods, their events and Kueue Workloads read with `oc get`,
each pod's own marks with `oc exec`.

Exit status: 0 when every namespace was read, 1 when some could not be, 2 when none could.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inpod import usage
from inpod.lib import ledger
from stacks.loader import stack_raw, validate_all
from tools.mock_engine import ROOT, StackFileError, flatten, stack_config
from tools.oc import Oc, run_oc

KINDS = "statefulsets,configmaps,pods"
# managedFields say whether the idle agent or a `pulumi up` last set a StatefulSet's replicas (inpod/usage.py
# replicas_set_by_idle_agent); kubectl leaves them out of `get -o json` unless asked (k8s.io/kubectl pkg/cmd/get/get.go,
# `--show-managed-fields`).
SHOW_MANAGED = "--show-managed-fields"


def cluster_namespaces(cluster: str, config_dir: Path) -> tuple[list[str], list[str]]:
    """The namespaces this project's stacks of `cluster` deploy to, and one line per stack file that could not be read."""
    namespaces: set[str] = set()
    problems: list[str] = []
    for path in sorted(config_dir.glob("Pulumi.*.yaml")):
        try:
            flat, _ = flatten(stack_config(path))
        except StackFileError as exc:
            problems.append(f"{path.name}: skipped: {exc}")
            continue
        raw, raw_problems = stack_raw(flat, config_dir)
        config, value_problems = validate_all(raw)
        if config is None:
            problems.append(f"{path.name}: skipped: {(raw_problems + value_problems + ['not a valid stack'])[0]} (`make render` says all)")
        elif config.cluster.name == cluster:
            namespaces.add(config.cluster.namespace)
    return sorted(namespaces), problems


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def read(cluster: str, namespaces: Sequence[str] | None, oc: Oc = run_oc) -> tuple[list[dict[str, Any]], list[str]]:
    """The labelled live objects of `namespaces` (None: all namespaces), and one line per namespace `oc` could not read."""
    selector = f"ml-dev-env/cluster={cluster}"
    scopes = [["--all-namespaces"]] if namespaces is None else [["-n", ns] for ns in namespaces]
    items: list[dict[str, Any]] = []
    failed: list[str] = []
    for scope in scopes:
        proc = oc(["get", KINDS, *scope, "-l", selector, "-o", "json", SHOW_MANAGED])
        where = "all namespaces" if namespaces is None else f"namespace {scope[1]}"
        if proc.returncode != 0:
            failed.append(f"{where}: not read: {last_line(proc.stderr)}")
            continue
        try:
            items += json.loads(proc.stdout).get("items") or []
        except ValueError:
            failed.append(f"{where}: not read: oc printed no JSON list")
    # the nodes, where this login may list them: a pod on a NotReady or gone node is `lost` since the node's last
    # heartbeat (inpod/usage.py lost); without them the pods alone say it (a deletion no kubelet ends)
    proc = oc(["get", "nodes", "-o", "json"])
    if proc.returncode == 0:
        try:
            items += [{**n, "kind": "Node"} for n in json.loads(proc.stdout).get("items") or []]
        except ValueError:
            pass
    return items, failed


def start(namespace: str, app: str, oc: Oc = run_oc) -> tuple[dict[str, Any] | None, str]:
    """The start ledger of environment `app` in `namespace` (None and one line when `oc` could not read its pods)."""

    def get(*what: str) -> list[dict[str, Any]]:
        proc = oc(["get", *what, "-n", namespace, "-o", "json"])
        if proc.returncode != 0:
            raise OSError(last_line(proc.stderr))
        return list(json.loads(proc.stdout).get("items") or [])

    try:
        pods = get("pods", "-l", f"app.kubernetes.io/name=ml-dev-env,app.kubernetes.io/instance={app}")
        events = get("events", "--field-selector", "involvedObject.kind=Pod")
    except (OSError, ValueError) as exc:
        return None, f"namespace {namespace}: not read: {exc}"
    try:
        workloads = get("workloads.kueue.x-k8s.io")
    except (OSError, ValueError):
        workloads = []  # no Kueue here, or no right to list its Workloads: no admission phase
    marks = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        proc = oc(["exec", "-n", namespace, name, "-c", ledger.MAIN_CONTAINER, "--", "sh", "-c", ledger.MARKS_SCRIPT])
        marks[name] = ledger.parse_marks(proc.stdout) if proc.returncode == 0 else {}
    return ledger.build(pods, events, workloads, marks), ""


def main(argv: list[str] | None = None, oc: Oc = run_oc) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cluster", help="the cluster's name (cluster.name of its stacks)")
    parser.add_argument("--namespace", action="append", default=[], help="read these namespaces instead of the stacks' (repeatable)")
    parser.add_argument("--all-namespaces", action="store_true", help="read every namespace (needs cluster-wide list rights)")
    parser.add_argument("--config-dir", default=str(ROOT), help="where the Pulumi.<stack>.yaml files are")
    parser.add_argument("--json", action="store_true", help="rows as JSON")
    parser.add_argument("--start", metavar="APP", help="the start ledger of environment APP (its cluster.appName) instead")
    args = parser.parse_args(argv)
    namespaces: list[str] | None = None
    if not args.all_namespaces:
        namespaces = args.namespace
        if not namespaces:
            namespaces, problems = cluster_namespaces(args.cluster, Path(args.config_dir))
            for line in problems:
                print(f"WARNING: {line}", file=sys.stderr)
            if not namespaces:
                print(
                    f"ERROR: no stack file in {args.config_dir} has cluster.name {args.cluster!r}; "
                    "name the namespaces (NAMESPACES='a b', --namespace) or read all (ALL=1, --all-namespaces)",
                    file=sys.stderr,
                )
                return 2
    if args.start:
        return start_main(args.start, namespaces, args.json, oc)
    items, failed = read(args.cluster, namespaces, oc)
    for line in failed:
        print(f"WARNING: {line}", file=sys.stderr)
    scopes = 1 if namespaces is None else len(namespaces)
    if len(failed) == scopes:
        return 2
    rows = usage.environments(items, time.time())
    sys.stdout.write(json.dumps(rows, indent=2) + "\n" if args.json else usage.table(rows) + usage.NOTE + "\n")
    return 1 if failed else 0


def start_main(app: str, namespaces: list[str] | None, as_json: bool, oc: Oc) -> int:
    """`--start`: the ledger of `app` in the first namespace that has its pods."""
    problems = []
    for namespace in namespaces or []:
        found, problem = start(namespace, app, oc)
        if found is not None and found.get("pods"):
            sys.stdout.write(json.dumps(found, indent=1) + "\n" if as_json else "\n".join(ledger.start_table(found)) + "\n")
            return 0
        problems.append(problem or f"namespace {namespace}: no pods of {app}")
    for line in problems or ["--start needs the namespaces (the stacks' or --namespace), not --all-namespaces"]:
        print(f"WARNING: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
