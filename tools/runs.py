"""`make runs STACK=<name>`: where each model's packaging run stands on the cluster.

The run names come from the stack itself (the program runs offline, as `make render` does; the names
are a hash of each run's inputs), the state from `oc` (logged in, current cluster): per model
succeeded / failed / running / not created, for a failed run the failed task and the last lines of
its log, and the commands to follow or retry it. Exit status: 1 when any run failed, else 0.

Tekton labels every TaskRun (and its pod) of a PipelineRun with `tekton.dev/pipelineRun=<run>` and
`tekton.dev/pipelineTask=<task>` (tektoncd/pipeline pkg/apis/pipeline/register.go:
`PipelineRunLabelKey`, `PipelineTaskLabelKey`); the run's condition `Succeeded` is True / False /
Unknown (running).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    # Run as a file (`python tools/runs.py`): re-run as the module of the repository package, which needs
    # no sys.path edits (`python -m tools.runs`, what the Makefile runs).
    os.execve(
        sys.executable,
        [sys.executable, "-m", "tools.runs", *sys.argv[1:]],
        {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])),
        },
    )

from stacks.loader import SECRET_KEYS
from tools.mock_engine import ROOT, run_program, stack_config
from tools.oc import run_oc


def stack_runs(stack: str, config_dir: Path) -> dict[str, dict[str, str]]:
    config = stack_config(config_dir / f"Pulumi.{stack}.yaml")
    placeholders = {k: f"runs-placeholder-{k}" for k in SECRET_KEYS if f"ml-dev-env:{k}" not in config}
    result = run_program(stack, config, placeholders)
    if result.error:
        raise SystemExit(f"error: {result.error}")
    return dict(result.outputs.get("model_runs") or {})


def oc_json(*args: str) -> dict[str, Any] | None:
    """`oc get … -o json`, or None when the object does not exist; a missing or silent `oc` (tools/oc.py) ends the
    tool with one line, like any other refusal."""
    proc = run_oc(["get", *args, "-o", "json"])
    if proc.returncode != 0:
        if proc.returncode not in (124, 127) and ("NotFound" in proc.stderr or "not found" in proc.stderr):
            return None
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise SystemExit(f"error: oc get {' '.join(args)}: {last}")
    return dict(json.loads(proc.stdout))


def condition(obj: dict[str, Any]) -> tuple[str, str, str]:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond.get("type") == "Succeeded":
            return cond.get("status", "Unknown"), cond.get("reason", ""), cond.get("message", "")
    return "Unknown", "Pending", ""


def failed_tasks(run: str, namespace: str, tail: int) -> list[str]:
    lines = []
    listing = oc_json("taskrun", "-n", namespace, "-l", f"tekton.dev/pipelineRun={run}") or {"items": []}
    for taskrun in listing.get("items", []):
        status, reason, message = condition(taskrun)
        if status != "False":
            continue
        labels = taskrun.get("metadata", {}).get("labels", {})
        task = labels.get("tekton.dev/pipelineTask", taskrun["metadata"]["name"])
        retries = len(taskrun.get("status", {}).get("retriesStatus") or [])
        lines.append(f"    failed task: {task} ({reason}{f', after {retries} retries' if retries else ''}): {message}")
        pod = taskrun.get("status", {}).get("podName")
        if pod:
            proc = run_oc(["logs", pod, "-n", namespace, "--all-containers", f"--tail={tail}"])
            log = (proc.stdout if proc.returncode == 0 else proc.stderr).rstrip().splitlines()
            lines += [f"      | {line}" for line in log[-tail:]]
    return lines


def report(model: str, info: dict[str, str], tail: int) -> tuple[str, list[str]]:
    run, ns = info["run"], info["namespace"]
    obj = oc_json("pipelinerun", run, "-n", ns)
    if obj is None:
        return "missing", [f"{model}: {run} not created (run `pulumi up`)"]
    status, reason, message = condition(obj)
    state = {"True": "succeeded", "False": "failed"}.get(status, "running")
    lines = [f"{model}: {run} {state} ({reason}{': ' + message if message and state == 'failed' else ''})"]
    if state == "succeeded":
        results = {r["name"]: r["value"] for r in obj.get("status", {}).get("results", [])}
        if results.get("INTERNAL_IMAGE"):
            lines.append(f"    image: {results['INTERNAL_IMAGE']}")
    elif state == "failed":
        lines += failed_tasks(run, ns, tail)
        lines.append(f"    retry: {info['retry']}")
    else:
        lines.append(f"    follow: {info['follow']}")
        lines.append(f"    without tkn: {info['logs']}")
    return state, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stack", help="stack name (Pulumi.<stack>.yaml)")
    parser.add_argument("--config-dir", default=str(ROOT), help="where the Pulumi.<stack>.yaml files are")
    parser.add_argument("--tail", type=int, default=20, help="log lines shown for a failed task")
    args = parser.parse_args(argv)
    runs = stack_runs(args.stack, Path(args.config_dir))
    if not runs:
        print(f"stack {args.stack} declares no models")
        return 0
    failed = False
    for model, info in sorted(runs.items()):
        state, lines = report(model, info, args.tail)
        failed |= state == "failed"
        print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
