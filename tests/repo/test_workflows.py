"""GitHub workflows: valid against the GitHub workflow schema (check-jsonschema's vendored copy, no
network), the preview matrix really comes from the Pulumi.<stack>.yaml files, deploys are opt-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
STACKS = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
# Any network access fails fast: the schema check must work offline.
OFFLINE = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def step(job: dict[str, Any], *, id: str | None = None, uses: str | None = None) -> dict[str, Any]:
    found = [s for s in job["steps"] if (id and s.get("id") == id) or (uses and str(s.get("uses", "")).startswith(uses))]
    assert len(found) == 1, f"expected one step id={id} uses={uses}, found {len(found)}"
    return found[0]


def check_jsonschema(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        env=OFFLINE,
    )


def run_bash(script: str, cwd: Path, **env: str) -> dict[str, str]:
    """Run a workflow `run:` script like the runner does; return what it wrote to $GITHUB_OUTPUT."""
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "github_output"
        output.write_text("")
        subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=cwd,
            check=True,
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "GITHUB_OUTPUT": str(output), **env},
        )
        return dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)


# ----------------------------------------------------------------------------------------- schema


def test_workflow_files_exist() -> None:
    assert sorted(p.name for p in WORKFLOWS.glob("*.y*ml")) == ["ci.yml", "deploy.yml"]


def test_every_workflow_passes_the_github_workflow_schema() -> None:
    proc = check_jsonschema(*sorted(WORKFLOWS.glob("*.y*ml")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok -- validation done" in proc.stdout


def test_the_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: pull_request\njobs:\n  test:\n    runs-on: ubuntu-24.04\n    steps:\n      - uses: actions/checkout@v6\n"
        "        whith: {path: main}\n"
    )
    proc = check_jsonschema(broken)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "whith" in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------ pull requests


def test_ci_runs_on_every_pull_request_with_read_only_default_permissions() -> None:
    ci = load("ci.yml")
    assert "pull_request" in ci["on"] and (ci["on"]["pull_request"] in (None, {}))
    assert ci["permissions"] == {"contents": "read"}
    for name, job in ci["jobs"].items():
        assert set(job.get("permissions", {}).items()) <= {("contents", "read"), ("pull-requests", "write")}, name
    assert ci["jobs"]["preview"]["permissions"] == {"contents": "read", "pull-requests": "write"}


def test_test_job_runs_the_suite_renders_and_uploads_the_manifests() -> None:
    job = load("ci.yml")["jobs"]["test"]
    runs = [s.get("run", "") for s in job["steps"]]
    make_test = [r for r in runs if r.startswith("make test")]
    assert len(make_test) == 1 and "make render-all" in runs
    assert runs.index(make_test[0]) < runs.index("make render-all")
    setup = step(job, uses="actions/setup-python@")
    assert setup["with"]["python-version"] == "3.11"
    upload = step(job, uses="actions/upload-artifact@")
    assert upload["with"]["path"] == "main/rendered/"
    # one checkout, alone: the schema check is the repository's own (nothing is fetched beside it)
    [checkout] = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert checkout["with"]["path"] == "main"
    assert "SHARED_REPOSITORY" not in (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert all(s.get("working-directory") == "main" for s in job["steps"] if str(s.get("run", "")).startswith("make"))


def test_stack_list_step_finds_exactly_the_stack_files() -> None:
    script = step(load("ci.yml")["jobs"]["stacks"], id="list")["run"]
    out = run_bash(script, ROOT)
    assert sorted(json.loads(out["stacks"])) == STACKS  # glob order ('barcelona-alice' before 'barcelona')
    assert len(STACKS) >= 2


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["Pulumi.yaml", "Pulumi.b.yaml", "Pulumi.a-1.yaml", "README.md"], ["a-1", "b"]),
        (["Pulumi.yaml"], []),
    ],
)
def test_stack_list_step_in_other_repositories(tmp_path: Path, files: list[str], expected: list[str]) -> None:
    for name in files:
        (tmp_path / name).write_text("config: {}\n")
    script = step(load("ci.yml")["jobs"]["stacks"], id="list")["run"]
    assert json.loads(run_bash(script, tmp_path)["stacks"]) == expected


def test_preview_is_a_matrix_over_the_listed_stacks() -> None:
    ci = load("ci.yml")
    assert ci["jobs"]["stacks"]["outputs"]["stacks"] == "${{ steps.list.outputs.stacks }}"
    job = ci["jobs"]["preview"]
    assert job["needs"] == "stacks"
    assert job["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.stacks) }}"
    assert job["strategy"]["fail-fast"] is False
    preview = step(job, uses="pulumi/actions@")
    assert preview["uses"] == "pulumi/actions@v7"
    assert (
        preview["with"].items()
        >= {
            "command": "preview",
            "stack-name": "${{ matrix.stack }}",
            "comment-on-pr": True,
            "edit-pr-comment": True,
            "diff": True,
            "policyPacks": "policy",
            "github-token": "${{ secrets.GITHUB_TOKEN }}",
        }.items()
    )
    assert preview["env"]["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_ACCESS_TOKEN }}"
    assert (ROOT / preview["with"]["policyPacks"] / "PulumiPolicy.yaml").exists()


@pytest.mark.parametrize("workflow", ["ci.yml", "deploy.yml"])
def test_kubeconfig_secret_name_per_stack(workflow: str, tmp_path: Path) -> None:
    data = load(workflow)
    job = data["jobs"]["preview" if workflow == "ci.yml" else "up"]
    names = step(job, id="names")
    for stack, secret in (("barcelona", "KUBECONFIG_BARCELONA"), ("nerc-production", "KUBECONFIG_NERC_PRODUCTION")):
        assert run_bash(names["run"], tmp_path, STACK=stack) == {"kubeconfig": secret}
    uses_secret = [s for s in job["steps"] if "${{ secrets[steps.names.outputs.kubeconfig] }}" in s.get("env", {}).values()]
    assert uses_secret, "the kubeconfig must come from the per-stack secret"


def test_preview_is_skipped_not_failed_without_secrets(tmp_path: Path) -> None:
    job = load("ci.yml")["jobs"]["preview"]
    creds = step(job, id="creds")
    out = run_bash(creds["run"], tmp_path, PULUMI_ACCESS_TOKEN="", KUBECONFIG_DATA="", SECRET_NAME="KUBECONFIG_X", STACK="x")
    assert out == {"ok": "false"}
    assert run_bash(creds["run"], tmp_path, PULUMI_ACCESS_TOKEN="t", KUBECONFIG_DATA="k", SECRET_NAME="K", STACK="x") == {"ok": "true"}
    assert step(job, uses="pulumi/actions@")["if"] == "steps.creds.outputs.ok == 'true'"


# ------------------------------------------------------------------------------------------ deploys


def test_deploy_is_manual_from_main_behind_an_environment_per_stack() -> None:
    deploy = load("deploy.yml")
    assert set(deploy["on"]) == {"workflow_dispatch"}, "deploys must never start on their own"
    stack_input = deploy["on"]["workflow_dispatch"]["inputs"]["stack"]
    assert stack_input["type"] == "choice" and sorted(stack_input["options"]) == STACKS
    assert deploy["permissions"] == {"contents": "read"}
    job = deploy["jobs"]["up"]
    assert job["if"] == "github.ref == 'refs/heads/main'"
    assert job["environment"]["name"] == "${{ inputs.stack }}"
    up = step(job, uses="pulumi/actions@")
    assert up["uses"] == "pulumi/actions@v7"
    assert up["with"]["command"] == "up" and up["with"]["stack-name"] == "${{ inputs.stack }}" and up["with"]["policyPacks"] == "policy"
    assert deploy["concurrency"]["cancel-in-progress"] is False
