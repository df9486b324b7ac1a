"""What is deployed is what runs: execute the rendered Tekton Tasks' own scripts and args.

The program is rendered with a model whose source, Quay repository, base image and registry URL point
at the local services. Every `$(params.…)`, `$(tasks.….results.…)`, `$(workspaces.….path)` and
`$(results.….path)` reference is then resolved the way Tekton would — from the PipelineRun's params
through the Pipeline's task params — and each Task's step runs with exactly those args: its embedded
script, or its command against the step files laid out from the rendered tools-image ConfigMaps (where
the tools image build puts them). Only transport flags the local registries need (plain HTTP, no TLS)
are appended.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from components.image_build import TOOLS_STEPS_DIR
from components.model_pipeline import SA_DIR, SA_TOKEN
from steps.embed import IMAGE_STEPS_DIR, SHIPPED_DIRS
from tests.conftest import run_objects, stack_objects
from tests.fixtures.model_registry import ModelRegistryStandIn
from tests.fixtures.registry import Registry
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import needs_registry, needs_skopeo
from tests.steps.test_pipeline_e2e import upload_model

pytestmark = [needs_registry, needs_skopeo]
REF = re.compile(r"\$\((params|tasks|workspaces|results)\.([\w-]+)(?:\.([\w-]+))?(?:\.([\w-]+))?\)")


def render_pipeline(s3: S3Server, quay: Registry, base_image: str, registry_url: str, repo: str, stream: bool = False) -> Any:
    objects = stack_objects("barcelona")
    objects["modelPipeline"].update(registryUrl=registry_url, modelcarBaseImage=base_image)
    objects["models"] = [
        {
            "name": "wired",
            "sizeGi": 1,
            "quantization": "w4a16",
            "quayRepository": f"{quay.host}/{repo}",
            "tag": "v1",
            "source": {"s3": {"endpoint": s3.endpoint, "bucket": "wired", "prefix": "mistral/v1"}},
            "include": ["*.json", "*.safetensors", "tokenizer/*"],
            "registration": {"modelName": "Wired", "versionName": "v1", "baseModel": "mistralai/Mistral-Small-24B-Instruct-2501"},
            "stream": stream,
        }
    ]
    result = run_objects("barcelona", objects, {"s3AccessKeyId": s3.access_key, "s3SecretAccessKey": s3.secret_key})
    assert result.error is None, result.error
    return result


class Tekton:
    """Resolves Tekton variables for one PipelineRun on this machine."""

    def __init__(self, result: Any, tmp: Path, run_params: dict[str, Any], pipeline_name: str = "modelcar") -> None:
        self.tasks = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in result.of_type("kubernetes:tekton.dev/v1:Task")}
        pipelines = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in result.of_type("kubernetes:tekton.dev/v1:Pipeline")}
        pipeline = pipelines[pipeline_name]
        self.pipeline = {t["name"]: t for t in pipeline["tasks"]}
        self.run_params = run_params
        self.tmp = tmp
        # The tools image's step files, from the rendered BuildConfig's ConfigMaps, laid out as the Containerfile does.
        (build,) = [
            r.inputs["spec"]
            for r in result.of_type("kubernetes:build.openshift.io/v1:BuildConfig")
            if "-tools-" in r.inputs["metadata"]["name"]
        ]
        maps = {r.inputs["metadata"]["name"]: r.inputs["data"] for r in result.of_type("kubernetes:core/v1:ConfigMap")}
        self.image_steps = tmp / "image-steps"
        for ref in build["source"]["configMaps"]:
            part = ref["destinationDir"].removeprefix(f"{TOOLS_STEPS_DIR}/")
            target = self.image_steps / SHIPPED_DIRS[part]
            target.mkdir(parents=True, exist_ok=True)
            for key, text in maps[ref["configMap"]["name"]].items():
                (target / key).write_text(text)
        self.workspaces = {"model": tmp / "pvc", "quay-auth": tmp / "quay-auth"}
        self.results: dict[str, dict[str, str]] = {}

    def _sub(self, text: str, params: dict[str, Any], task: str) -> str:
        def one(m: re.Match[str]) -> str:
            kind, name, a, b = m.groups()
            if kind == "params":
                return str(params[name])
            if kind == "tasks":
                assert a == "results"
                return self.results[name][b]
            if kind == "workspaces":
                return str(self.workspaces[name])
            return str(self.tmp / "results" / task / name)

        return REF.sub(one, text)

    def run(self, pipeline_task: str, extra_args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        entry = self.pipeline[pipeline_task]
        params: dict[str, Any] = {}
        for p in entry["params"]:
            value = p["value"]
            params[p["name"]] = self.run_params["include"] if value == "$(params.include[*])" else self._sub(value, self.run_params, "")
        spec = self.tasks[entry["taskRef"]["name"]]
        (step,) = spec["steps"]
        (self.tmp / "results" / pipeline_task).mkdir(parents=True, exist_ok=True)
        args: list[str] = []
        for arg in step["args"]:
            if arg == "$(params.include[*])":
                args += params["include"]
            else:
                args.append(
                    self._sub(arg, params, pipeline_task)
                    .replace(SA_TOKEN, str(self.tmp / "sa-token"))
                    .replace(SA_DIR, str(self.tmp / "sa-certs"))
                )
        step_env = {**env}
        for e in step.get("env", []):
            if "value" in e:
                step_env[e["name"]] = self._sub(e["value"], params, pipeline_task)
        if "script" in step:
            script = self.tmp / f"{pipeline_task}.py"
            script.write_text(step["script"])
            command = [sys.executable, str(script)]
        else:
            python, program = step["command"]
            assert python == "python3" and program.startswith(f"{IMAGE_STEPS_DIR}/")
            command = [sys.executable, str(self.image_steps / program.removeprefix(f"{IMAGE_STEPS_DIR}/"))]
        proc = subprocess.run([*command, *args, *extra_args], capture_output=True, text=True, env=step_env, timeout=300, check=False)
        self.results[pipeline_task] = {
            r["name"]: (self.tmp / "results" / pipeline_task / r["name"]).read_text()
            for r in spec.get("results", [])
            if (self.tmp / "results" / pipeline_task / r["name"]).exists()
        }
        return proc


def test_rendered_tasks_run_end_to_end(
    tmp_path: Path,
    s3: S3Server,
    quay: Registry,
    internal: Registry,
    base_image: str,
    model_registry: ModelRegistryStandIn,
    model_dir: tuple[Path, dict[str, bytes]],
    repo_name: str,
) -> None:
    _, files = model_dir
    upload_model(s3, "wired", "mistral/v1", files)
    result = render_pipeline(s3, quay, base_image, model_registry.url, repo_name)
    (run,) = [r.inputs for r in result.of_type("kubernetes:tekton.dev/v1:PipelineRun")]
    params = {p["name"]: p["value"] for p in run["spec"]["params"]}
    params["internal-image"] = f"{internal.host}/nccl-test/wired:v1"  # the cluster registry, here a local one
    tekton = Tekton(result, tmp_path, params)
    for directory in (tekton.workspaces["model"], tekton.workspaces["quay-auth"], tmp_path / "sa-certs"):
        directory.mkdir(parents=True)
    quay.authfile(tekton.workspaces["quay-auth"] / ".dockerconfigjson")
    (tmp_path / "sa-token").write_text(internal.password)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}

    download = tekton.run("download", [], {**env, **s3.env()})
    assert download.returncode == 0, download.stderr
    assert tekton.results["download"]["BYTES"] == str(sum(len(d) for d in files.values()))

    package = tekton.run("package", ["--plain-http"], env)
    assert package.returncode == 0, package.stderr
    digest = tekton.results["package"]["IMAGE_DIGEST"]
    assert tekton.results["package"]["IMAGE_URL"] == f"{quay.host}/{repo_name}@{digest}"

    mirror = tekton.run("mirror", ["--no-src-tls-verify", "--no-dest-tls-verify"], env)
    assert mirror.returncode == 0, mirror.stderr
    assert tekton.results["mirror"]["IMAGE_URL"] == f"{internal.host}/nccl-test/wired@{digest}"

    # the first task of a run: waits for the tools image (here: the image just mirrored)
    tekton.run_params["tools-image"] = f"{internal.host}/nccl-test/wired:v1"
    wait = tekton.run("wait-tools", ["--plain-http"], env)
    assert wait.returncode == 0, wait.stderr
    assert "is available" in wait.stdout

    register = tekton.run("register", [], env)
    assert register.returncode == 0, register.stderr
    (artifact,) = model_registry.objects["model_artifact"].values()
    assert artifact["uri"] == f"oci://{internal.host}/nccl-test/wired@{digest}"
    version = model_registry.objects["model_version"][tekton.results["register"]["VERSION_ID"]]
    assert version["customProperties"]["quantization"]["string_value"] == "w4a16"

    # nothing but the PVC was written: the weights, the shared digest cache and skopeo's empty temp space
    pvc = sorted(p.relative_to(tekton.workspaces["model"]).as_posix() for p in tekton.workspaces["model"].rglob("*") if p.is_file())
    assert {p.split("/")[0] for p in pvc} <= {"weights", ".weights.digests.json", ".home"}, pvc


def test_streaming_run_packages_from_s3_without_a_weights_volume(
    tmp_path: Path,
    s3: S3Server,
    quay: Registry,
    internal: Registry,
    base_image: str,
    model_registry: ModelRegistryStandIn,
    model_dir: tuple[Path, dict[str, bytes]],
    repo_name: str,
) -> None:
    _, files = model_dir
    upload_model(s3, "wired", "mistral/v1", files)
    result = render_pipeline(s3, quay, base_image, model_registry.url, repo_name, stream=True)
    (run,) = [r.inputs for r in result.of_type("kubernetes:tekton.dev/v1:PipelineRun")]
    assert run["spec"]["pipelineRef"] == {"name": "modelcar-stream"}
    assert {w["name"]: w for w in run["spec"]["workspaces"]}["model"] == {"name": "model", "emptyDir": {}}
    params = {p["name"]: p["value"] for p in run["spec"]["params"]}
    params["internal-image"] = f"{internal.host}/nccl-test/wired:v1"
    tekton = Tekton(result, tmp_path, params, "modelcar-stream")
    assert list(tekton.pipeline) == ["wait-tools", "package", "mirror", "register"]
    for directory in (tekton.workspaces["model"], tekton.workspaces["quay-auth"], tmp_path / "sa-certs"):
        directory.mkdir(parents=True)
    quay.authfile(tekton.workspaces["quay-auth"] / ".dockerconfigjson")
    (tmp_path / "sa-token").write_text(internal.password)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}

    package = tekton.run("package", ["--plain-http"], {**env, **s3.env()})
    assert package.returncode == 0, package.stderr
    digest = tekton.results["package"]["IMAGE_DIGEST"]
    mirror = tekton.run("mirror", ["--no-src-tls-verify", "--no-dest-tls-verify"], env)
    assert mirror.returncode == 0, mirror.stderr
    register = tekton.run("register", [], env)
    assert register.returncode == 0, register.stderr
    (artifact,) = model_registry.objects["model_artifact"].values()
    assert artifact["uri"] == f"oci://{internal.host}/nccl-test/wired@{digest}"
    written = [p for p in tekton.workspaces["model"].rglob("*") if p.is_file()]
    assert not [p for p in written if p.suffix in (".safetensors", ".json") and ".home" not in p.parts], written
