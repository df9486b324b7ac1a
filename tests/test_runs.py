"""`make runs STACK=…` (tools/runs.py) against a stub `oc` that answers from canned cluster objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_objects, stack_objects

ROOT = Path(__file__).resolve().parent.parent
STUB = """#!{python}
import json, os, sys
answers = json.load(open(os.environ["STUB_OC_ANSWERS"]))
with open(os.environ["STUB_OC_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
key = " ".join(sys.argv[1:])
if key not in answers:
    sys.stderr.write('Error from server (NotFound): "%s" not found\\n' % key)
    sys.exit(1)
sys.stdout.write(answers[key])
"""


def runs_of_barcelona() -> dict[str, dict[str, str]]:
    result = run_objects("barcelona", stack_objects("barcelona"))
    assert result.error is None, result.error
    return dict(result.outputs["model_runs"])


def pipelinerun(status: str, reason: str, message: str = "", results: dict[str, str] | None = None) -> str:
    obj: dict[str, Any] = {"status": {"conditions": [{"type": "Succeeded", "status": status, "reason": reason, "message": message}]}}
    obj["status"]["results"] = [{"name": k, "value": v} for k, v in (results or {}).items()]
    return json.dumps(obj)


def run_tool(tmp_path: Path, answers: dict[str, str], as_file: bool = False) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`make runs`' command (`python -m tools.runs` in the repository root), or `python tools/runs.py` from elsewhere."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "oc"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_OC_ANSWERS": str(tmp_path / "answers.json"),
           "STUB_OC_LOG": str(tmp_path / "oc.log")}  # fmt: skip
    command = [str(ROOT / "tools" / "runs.py")] if as_file else ["-m", "tools.runs"]
    cwd = tmp_path if as_file else ROOT
    proc = subprocess.run([sys.executable, *command, "barcelona"], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    calls = (tmp_path / "oc.log").read_text().splitlines() if (tmp_path / "oc.log").exists() else []
    return proc, calls


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, str]]:
    return runs_of_barcelona()


def test_outputs_name_each_run_with_commands(runs: dict[str, dict[str, str]]) -> None:
    for model, info in runs.items():
        run, ns = info["run"], info["namespace"]
        assert run.startswith(f"modelcar-{model}-") and ns == "nccl-test"
        assert info["follow"] == f"tkn pipelinerun logs -f {run} -n {ns}"
        assert info["logs"].startswith(f"oc logs -n {ns} -l tekton.dev/pipelineRun={run} ")
        assert "retry" in info["retry"] and f"name={model}" in info["retry"]


def test_failed_running_succeeded_and_missing(tmp_path: Path, runs: dict[str, dict[str, str]]) -> None:
    quant, full = runs["mistral-small-24b-w4a16"], runs["mistral-small-24b-fp16"]
    ns = "nccl-test"
    failed_taskrun = {
        "metadata": {"name": f"{full['run']}-package", "labels": {"tekton.dev/pipelineTask": "package"}},
        "status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "Failed", "message": "exit code 6"}],
                   "podName": f"{full['run']}-package-pod", "retriesStatus": [{}, {}]},
    }  # fmt: skip
    ok_taskrun = {"metadata": {"name": f"{full['run']}-download", "labels": {"tekton.dev/pipelineTask": "download"}},
                  "status": {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded"}]}}  # fmt: skip
    answers = {
        f"get pipelinerun {full['run']} -n {ns} -o json": pipelinerun("False", "Failed", "Tasks Completed: 2 (Failed: 1)"),
        f"get taskrun -n {ns} -l tekton.dev/pipelineRun={full['run']} -o json": json.dumps({"items": [ok_taskrun, failed_taskrun]}),
        f"logs {full['run']}-package-pod -n {ns} --all-containers --tail=20": "line 1\nERROR: upload of model.safetensors failed\n",
        f"get pipelinerun {quant['run']} -n {ns} -o json": pipelinerun("Unknown", "Running"),
    }
    proc, calls = run_tool(tmp_path, answers)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert f"mistral-small-24b-fp16: {full['run']} failed (Failed: Tasks Completed: 2 (Failed: 1))" in out
    assert "failed task: package (Failed, after 2 retries): exit code 6" in out
    assert "| ERROR: upload of model.safetensors failed" in out
    assert f"retry: {full['retry']}" in out
    assert f"mistral-small-24b-w4a16: {quant['run']} running (Running)" in out and quant["follow"] in out
    assert "download" not in out.split("failed task:")[1].split("\n")[0], "only the failed task is shown"
    assert calls[0].startswith("get pipelinerun")

    done = pipelinerun("True", "Succeeded", results={"INTERNAL_IMAGE": "r/m@sha256:1"})
    second = tmp_path / "second"
    second.mkdir()
    proc, _ = run_tool(second, {f"get pipelinerun {quant['run']} -n {ns} -o json": done}, as_file=True)
    assert proc.returncode == 0, proc.stderr
    assert f"{quant['run']} succeeded (Succeeded)" in proc.stdout and "image: r/m@sha256:1" in proc.stdout
    assert f"mistral-small-24b-fp16: {full['run']} not created (run `pulumi up`)" in proc.stdout


def test_retry_counter_changes_only_that_run_name(runs: dict[str, dict[str, str]]) -> None:
    objects = stack_objects("barcelona")
    objects["models"][1]["retry"] = 1
    result = run_objects("barcelona", objects)
    assert result.error is None, result.error
    after = result.outputs["model_runs"]
    assert after["mistral-small-24b-fp16"]["run"] != runs["mistral-small-24b-fp16"]["run"]
    assert after["mistral-small-24b-w4a16"]["run"] == runs["mistral-small-24b-w4a16"]["run"]


def test_without_oc_one_line(tmp_path: Path) -> None:
    """No `oc` on PATH (a fresh laptop): one line naming what is missing, no traceback (tools/oc.py's outcome)."""
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing in it: no oc
    proc = subprocess.run([sys.executable, "-m", "tools.runs", "barcelona"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "oc is not installed" in proc.stderr, proc.stderr
