"""Model-packaging pipeline: Tekton v1 objects, sizing, secrets and preflight, on the recorded inputs."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from core import model_sizing
from stacks.loader import SECRET_KEYS
from steps.embed import EMBEDDED, STEPS, step_command, step_script
from tests.conftest import ROOT, run_objects, stack_objects
from tools.mock_engine import RunResult

TASK = "kubernetes:tekton.dev/v1:Task"
PIPELINE = "kubernetes:tekton.dev/v1:Pipeline"
RUN = "kubernetes:tekton.dev/v1:PipelineRun"
SECRET = "kubernetes:core/v1:Secret"
SECRETS = {"quayDockerConfigJson": '{"auths":{"quay.io":{"auth":"dXNlcjpwYXNz"}}}', "hfToken": "hf_" + "x" * 34}


@pytest.fixture(scope="module")
def barcelona() -> RunResult:
    result = run_objects("barcelona", stack_objects("barcelona"), SECRETS)
    assert result.error is None, result.error
    return result


def pvc_objects() -> dict[str, Any]:
    """barcelona with `stream: false` on its models: the download-onto-a-PVC pipeline (available, not the default)."""
    objects = stack_objects("barcelona")
    for model in objects["models"]:
        model["stream"] = False
    return objects


@pytest.fixture(scope="module")
def pvc() -> RunResult:
    result = run_objects("barcelona", pvc_objects(), SECRETS)
    assert result.error is None, result.error
    return result


def tasks(result: RunResult) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in result.of_type(TASK)}


def runs(result: RunResult) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs for r in result.of_type(RUN)}


def run_for(result: RunResult, model: str) -> dict[str, Any]:
    return runs(result)[result.outputs["model_pipeline_runs"][model]]


def test_barcelona_declares_both_mistral_models(barcelona: RunResult) -> None:
    assert set(barcelona.outputs["model_pipeline_runs"]) == {"mistral-small-24b-w4a16", "mistral-small-24b-fp16"}
    full = {p["name"]: p["value"] for p in run_for(barcelona, "mistral-small-24b-fp16")["spec"]["params"]}
    assert full["source-uri"] == "hf://mistralai/Mistral-Small-24B-Instruct-2501"
    quant = {p["name"]: p["value"] for p in run_for(barcelona, "mistral-small-24b-w4a16")["spec"]["params"]}
    assert quant["source-uri"] == "hf://RedHatAI/Mistral-Small-24B-Instruct-2501-quantized.w4a16"
    assert quant["quantization"] == "w4a16" and full["quantization"] == "none"
    assert full["internal-image"] == "image-registry.openshift-image-registry.svc:5000/nccl-test/mistral-small-24b-fp16:fp16-2501"


def test_only_v1_compute_resources_and_steps_embed_the_step_programs(pvc: RunResult) -> None:
    specs = tasks(pvc)
    scripts = {
        "modelcar-download": "download",
        "modelcar-package": "package",
        "modelcar-mirror": "mirror",
        "modelcar-register": "register",
        "modelcar-upload-s3": "upload_s3",
        "modelcar-wait-tools": "wait_image",
    }
    assert set(specs) == set(scripts)
    for name, spec in specs.items():
        assert "stepTemplate" not in spec
        (step,) = spec["steps"]
        assert "resources" not in step
        if scripts[name] in EMBEDDED:
            assert step["script"] == step_script(scripts[name]) and "command" not in step, name
        else:  # from the tools image, whose hash covers the step files (test_image_build)
            assert step["command"] == step_command(scripts[name]) and "script" not in step, name
        tools = "image-registry.openshift-image-registry.svc:5000/nccl-test/ml-dev-env-tools:tools-"
        if name == "modelcar-wait-tools":  # runs before the tools image exists: the public base, stdlib only
            assert step["image"] == "registry.access.redhat.com/ubi9/python-311:9.6"
            assert step["args"][:2] == ["--image", "$(params.image)"]
        else:
            assert step["image"].startswith(tools)
        assert step["securityContext"]["allowPrivilegeEscalation"] is False and "privileged" not in step["securityContext"]
        res = step["computeResources"]
        assert set(res["requests"]) == set(res["limits"]) == {"cpu", "memory", "ephemeral-storage"}
    download = specs["modelcar-download"]["steps"][0]["computeResources"]
    assert download["limits"]["memory"] == "8Gi"  # 20-worker downloads were OOM-killed at 2Gi


def test_each_task_is_its_row_in_the_step_table(pvc: RunResult) -> None:
    """A Task's name, step name, program, resources, workspace use, timeout and retries all come from its
    `model_sizing.STEP` row; the rows name exactly the step programs `steps/embed.py` knows."""
    assert {row.program for row in model_sizing.STEP.values()} == set(STEPS)
    specs = tasks(pvc)
    pipeline = next(r.inputs["spec"] for r in pvc.of_type(PIPELINE) if r.inputs["metadata"]["name"] == "modelcar")
    by_task = {t["taskRef"]["name"]: t for t in pipeline["tasks"]}
    size = barcelona_max_size_gi()
    for row in model_sizing.PIPELINE_STEPS:
        (step,) = specs[row.task]["steps"]
        assert step["name"] == row.name
        assert step.get("script") == (step_script(row.program) if row.program in EMBEDDED else None)
        assert step.get("command") == (None if row.program in EMBEDDED else step_command(row.program))
        res = step["computeResources"]
        assert (res["requests"]["cpu"], res["limits"]["cpu"]) == row.cpu
        assert (res["requests"]["memory"], res["limits"]["memory"]) == row.memory
        assert (res["requests"]["ephemeral-storage"], res["limits"]["ephemeral-storage"]) == row.ephemeral
        assert ("TMPDIR" in {e["name"] for e in step["env"]}) == row.uses_workspace
        task = by_task[row.task]
        assert task["name"] == row.name and task.get("retries", 0) == row.retries
        assert task["timeout"] == model_sizing.duration(model_sizing.task_timeout_minutes(row.key, size))
        assert model_sizing.task_timeout_minutes(row.key, size) >= row.min_timeout_min
    stream = model_sizing.STEP["package-stream"]
    assert (stream.name, stream.program, stream.cpu, stream.retries) == ("package", "package", model_sizing.STEP["package"].cpu, 2)


def barcelona_max_size_gi() -> float:
    return float(stack_objects("barcelona")["modelPipeline"]["maxModelSizeGi"])


def test_scratch_is_constant_and_on_the_pvc(pvc: RunResult) -> None:
    for spec in tasks(pvc).values():
        step = spec["steps"][0]
        limit = step["computeResources"]["limits"]["ephemeral-storage"]
        assert limit in ("1Gi", "256Mi", "64Mi"), limit  # does not grow with the model
        env = {e["name"]: e.get("value") for e in step["env"]}
        if spec["workspaces"]:
            assert env["TMPDIR"] == "$(workspaces.model.path)" and env["HOME"].startswith("$(workspaces.model.path)")


def test_pipeline_wires_digests_through_results(pvc: RunResult) -> None:
    (pipeline,) = [r.inputs["spec"] for r in pvc.of_type(PIPELINE)]
    by_name = {t["name"]: t for t in pipeline["tasks"]}
    mirror = {p["name"]: p["value"] for p in by_name["mirror"]["params"]}
    register = {p["name"]: p["value"] for p in by_name["register"]["params"]}
    assert mirror["source-image"] == "$(tasks.package.results.IMAGE_URL)"
    assert register["image"] == "$(tasks.mirror.results.IMAGE_URL)"
    args = tasks(pvc)["modelcar-register"]["steps"][0]["args"]
    assert args[args.index("--image") + 1] == "$(params.image)"  # repo@sha256:… → registered as oci://repo@sha256:…
    assert by_name["upload-s3"]["when"] == [{"input": "$(params.upload-s3)", "operator": "in", "values": ["true"]}]
    assert "timeouts" not in pipeline
    assert by_name["download"]["runAfter"] == ["wait-tools"]
    run_params = {p["name"]: p["value"] for p in run_for(pvc, "mistral-small-24b-fp16")["spec"]["params"]}
    assert run_params["tools-image"] == tasks(pvc)["modelcar-package"]["steps"][0]["image"]
    for task in pipeline["tasks"]:
        assert task["timeout"], task["name"]
    # sized for the 48 GB model: 2 × transfer time at 25 MB/s
    assert by_name["package"]["timeout"] == model_sizing.duration(model_sizing.task_timeout_minutes("package", 48))
    assert by_name["package"]["timeout"] == "1h10m0s"


def test_pipelinerun_scheduling_sizing_and_no_fsgroup(pvc: RunResult) -> None:
    full = run_for(pvc, "mistral-small-24b-fp16")
    spec = full["spec"]
    assert full["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    template = spec["taskRunTemplate"]
    assert template["serviceAccountName"] == "model-pipeline"
    assert template["podTemplate"] == {"nodeSelector": {"kubernetes.io/hostname": "moc-r4pcc02u15-yunshi"}}
    assert "securityContext" not in json.dumps(template)
    ws = {w["name"]: w for w in spec["workspaces"]}
    claim = ws["model"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "60Gi"  # ceil(48 × 1.15 + 4)
    assert claim["storageClassName"] == "ocs-external-storagecluster-ceph-rbd"
    assert ws["quay-auth"]["secret"] == {"secretName": "model-pipeline-quay"}
    assert spec["timeouts"]["pipeline"] == model_sizing.duration(model_sizing.pipeline_timeout_minutes(48, False))  # maxModelSizeGi
    quant = run_for(pvc, "mistral-small-24b-w4a16")["spec"]
    assert {w["name"]: w for w in quant["workspaces"]}["model"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == "14Gi"


def test_secrets_rbac_and_key_names_match_the_steps(pvc: RunResult) -> None:
    secrets = {r.inputs["metadata"]["name"]: r.inputs for r in pvc.of_type(SECRET)}
    assert secrets["model-pipeline-quay"]["type"] == "kubernetes.io/dockerconfigjson"
    assert set(secrets["model-pipeline-quay"]["stringData"]) == {".dockerconfigjson"}
    assert set(secrets["model-pipeline-hf"]["stringData"]) == {"HF_TOKEN"}
    env = tasks(pvc)["modelcar-download"]["steps"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "model-pipeline-hf", "key": "HF_TOKEN"}}} in env
    assert "--authfile" in (args := tasks(pvc)["modelcar-package"]["steps"][0]["args"])
    assert "$(workspaces.quay-auth.path)/.dockerconfigjson" in args
    binding = next(
        r.inputs
        for r in pvc.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
        if r.inputs["metadata"]["name"] == "model-pipeline-image-builder"
    )
    assert binding["roleRef"]["name"] == "system:image-builder"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "model-pipeline", "namespace": "nccl-test"}]
    dump = json.dumps([r.inputs for r in pvc.resources])
    assert SECRETS["hfToken"] not in dump and "dXNlcjpwYXNz" not in dump


def test_credential_table_is_what_the_stack_renders_and_requires(barcelona: RunResult) -> None:
    """`PIPELINE_CREDENTIALS` is the one place that says which Secret holds which keys: the rendered Secrets,
    the steps' secretKeyRefs and the loader's list of secrets all follow it."""
    from stacks.config import PIPELINE_CREDENTIALS
    from stacks.loader import SECRET_KEYS

    rendered = {r.inputs["metadata"]["name"]: r.inputs for r in barcelona.of_type(SECRET)}
    table = {cred.secret: cred for cred in PIPELINE_CREDENTIALS.values()}
    assert {"model-pipeline-quay", "model-pipeline-hf"} <= set(rendered)  # barcelona: Hugging Face models, no S3
    for secret, cred in table.items():
        if secret not in rendered:
            continue
        assert rendered[secret]["type"] == cred.type
        assert list(rendered[secret]["stringData"]) == [env for env, _, _ in cred.keys]
        assert {key for _, key, _ in cred.keys} <= set(SECRET_KEYS)
    refs = {
        (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"], e["name"])
        for spec in tasks(barcelona).values()
        for e in spec["steps"][0]["env"]
        if "valueFrom" in e
    }
    assert refs and refs <= {(cred.secret, env, env) for cred in PIPELINE_CREDENTIALS.values() for env, _, _ in cred.keys}


def test_tools_image_is_built_by_the_stack(barcelona: RunResult) -> None:
    bc = next(
        r.inputs
        for r in barcelona.of_type("kubernetes:build.openshift.io/v1:BuildConfig")
        if r.inputs["metadata"]["labels"].get("ml-dev-env/stage") == "tools"
    )
    args = {a["name"]: a["value"] for a in bc["spec"]["strategy"]["dockerStrategy"]["buildArgs"]}
    assert "boto3==" in args["STEP_REQUIREMENTS"]
    tag = bc["spec"]["output"]["to"]["name"].split(":")[1]
    step_image = tasks(barcelona)["modelcar-package-stream"]["steps"][0]["image"]
    assert step_image.endswith(f"ml-dev-env-tools:{tag}")


def _with_models(mutate: Any, secrets: dict[str, str] | None = None, stream: bool = True) -> RunResult:
    """barcelona changed by `mutate`; `stream=False` starts from its PVC-mode variant (`pvc_objects`); `secrets`
    given: exactly those are set (the others unset)."""
    objects = stack_objects("barcelona") if stream else pvc_objects()
    mutate(objects)
    return run_objects("barcelona", objects, SECRETS if secrets is None else {**{k: None for k in SECRET_KEYS}, **secrets})


def test_run_name_is_a_hash_of_its_inputs(barcelona: RunResult) -> None:
    same = _with_models(lambda o: None)
    assert same.outputs["model_pipeline_runs"] == barcelona.outputs["model_pipeline_runs"]

    def add_model(o: dict[str, Any]) -> None:
        extra = copy.deepcopy(o["models"][0])
        extra.update(name="another", sizeGi=40, tag="another-2501")  # its own image (one image per model)
        o["models"].append(extra)

    more = _with_models(add_model).outputs["model_pipeline_runs"]
    assert {k: more[k] for k in barcelona.outputs["model_pipeline_runs"]} == barcelona.outputs["model_pipeline_runs"]

    def bump(o: dict[str, Any]) -> None:
        o["models"][0]["source"]["huggingFace"]["revision"] = "0123abc"

    changed = _with_models(bump)
    before, after = barcelona.outputs["model_pipeline_runs"], changed.outputs["model_pipeline_runs"]
    assert after["mistral-small-24b-w4a16"] != before["mistral-small-24b-w4a16"]
    assert all(len(n) <= 63 for n in after.values())
    assert all(r.options["retain_on_delete"] for r in changed.of_type(RUN))


def test_s3_source_and_upload_need_s3_secrets() -> None:
    def s3(o: dict[str, Any]) -> None:
        model = copy.deepcopy(o["models"][0])
        model["name"] = "from-s3"
        model["source"] = {"s3": {"endpoint": "http://minio.model-storage.svc:9000", "bucket": "llm-models", "prefix": "mistral/w4a16"}}
        model["uploadToS3"] = {"endpoint": "http://minio.model-storage.svc:9000", "bucket": "archive", "prefix": "w4a16"}
        o["models"] = [model]

    missing = _with_models(s3, {"quayDockerConfigJson": "{}"})
    assert missing.error and "ml-dev-env:s3AccessKeyId: missing" in missing.error
    ok = _with_models(s3, {"quayDockerConfigJson": "{}", "s3AccessKeyId": "AKIAEXAMPLE", "s3SecretAccessKey": "shh"})
    assert ok.error is None, ok.error
    params = {p["name"]: p["value"] for p in runs(ok)[ok.outputs["model_pipeline_runs"]["from-s3"]]["spec"]["params"]}
    assert params["source-uri"] == "s3://llm-models/mistral/w4a16" and params["upload-s3"] == "true"
    env = {e["name"] for e in tasks(ok)["modelcar-upload-s3"]["steps"][0]["env"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env


def test_preflight_pvc_too_small_is_one_clear_message() -> None:
    result = _with_models(lambda o: o["models"][1].update(workspaceSize="40Gi"))
    assert result.error is not None
    assert (
        "ml-dev-env:models[1]: got 'mistral-small-24b-fp16'; needs a workspace PVC of at least 60Gi for ~48Gi of weights "
        "(1.15 × size + 4Gi); workspaceSize is 40Gi"
    ) in result.error


def test_preflight_model_above_the_sized_maximum() -> None:
    result = _with_models(lambda o: o["models"][1].update(sizeGi=60))
    assert (
        result.error
        and ("ml-dev-env:models[1]: got 'mistral-small-24b-fp16'; sizeGi 60 is above modelPipeline.maxModelSizeGi (48)") in result.error
    )


def test_preflight_scratch_does_not_fit_the_node() -> None:
    result = _with_models(lambda o: o["modelPipeline"].update(nodeEphemeralFree="512Mi"))
    assert result.error and "needs up to 1Gi of node ephemeral storage; modelPipeline.nodeEphemeralFree is 512Mi" in result.error


def test_full_model_fits_a_node_with_13gb_free() -> None:
    model = stack_objects("barcelona")["models"][1]
    assert model["sizeGi"] == 48
    from stacks.config import ModelConfig, ModelPipelineConfig

    pipeline = ModelPipelineConfig.model_validate({"nodeEphemeralFree": "13Gi", "maxModelSizeGi": 48})
    assert model_sizing.preflight(ModelConfig.model_validate(model), pipeline) is None


def _minutes(duration: str) -> int:
    match = re.fullmatch(r"(?:(\d+)h)?(\d+)m0s", duration)
    assert match, duration
    return int(match.group(1) or 0) * 60 + int(match.group(2))


def test_transfer_tasks_retry_and_the_run_timeout_covers_every_attempt(pvc: RunResult) -> None:
    """Tekton times each retry attempt on its own (tektoncd/pipeline pkg/reconciler/taskrun/taskrun.go,
    `retryTaskRun` resets StartTime), so the run must last Σ (retries + 1) × task timeout + margin."""
    (pipeline,) = [r.inputs["spec"] for r in pvc.of_type(PIPELINE)]
    by_name = {t["name"]: t for t in pipeline["tasks"]}
    for task in ("download", "package", "mirror", "upload-s3"):
        assert by_name[task].get("retries", 0) >= 2, task
    assert by_name["wait-tools"].get("retries", 0) == 0  # waiting again would only double a timeout
    for model in ("mistral-small-24b-w4a16", "mistral-small-24b-fp16"):
        spec = run_for(pvc, model)["spec"]
        params = {p["name"]: p["value"] for p in spec["params"]}
        running = [t for t in pipeline["tasks"] if t["name"] != "upload-s3" or params["upload-s3"] == "true"]
        needed = sum((t.get("retries", 0) + 1) * _minutes(t["timeout"]) for t in running)
        assert _minutes(spec["timeouts"]["pipeline"]) >= needed + 15, model


def test_max_layer_size_reaches_the_download_and_package_steps(pvc: RunResult) -> None:
    for task in ("modelcar-download", "modelcar-package"):
        args = tasks(pvc)[task]["steps"][0]["args"]
        assert args[args.index("--max-layer-size") + 1] == "20000000000", task  # Quay's default MAXIMUM_LAYER_SIZE, 20G
    raised = _with_models(lambda o: o["modelPipeline"].update(maxLayerSize="40Gi"), stream=False)
    assert raised.error is None, raised.error
    args = tasks(raised)["modelcar-download"]["steps"][0]["args"]
    assert args[args.index("--max-layer-size") + 1] == str(40 * 2**30)
    args = tasks(_with_models(lambda o: o["modelPipeline"].update(maxLayerSize="40Gi")))["modelcar-package-stream"]["steps"][0]["args"]
    assert args[args.index("--max-layer-size") + 1] == str(40 * 2**30)


def test_secured_model_registry_ca_and_opt_in_role_binding(pvc: RunResult) -> None:
    args = tasks(pvc)["modelcar-register"]["steps"][0]["args"]
    assert args[args.index("--ca-file") + 1] == "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt"
    bindings = [r.inputs for r in pvc.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")]
    assert not [b for b in bindings if b["roleRef"]["name"].startswith("registry-user-")], "opt-in only"

    def secured(o: dict[str, Any]) -> None:
        o["modelPipeline"].update(
            registryUrl="https://modelregistry-public.rhoai-model-registries.svc:8443",
            registryAccess={"namespace": "rhoai-model-registries", "name": "modelregistry-public"},
        )

    result = _with_models(secured)
    assert result.error is None, result.error
    (binding,) = [
        r.inputs
        for r in result.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
        if r.inputs["roleRef"]["name"].startswith("registry-user-")
    ]
    assert binding["metadata"]["namespace"] == "rhoai-model-registries"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "registry-user-modelregistry-public"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "model-pipeline", "namespace": "nccl-test"}]
    params = {p["name"]: p["value"] for p in run_for(result, "mistral-small-24b-fp16")["spec"]["params"]}
    assert params["registry-url"] == "https://modelregistry-public.rhoai-model-registries.svc:8443"


def test_hf_token_only_for_gated_repositories() -> None:
    from tools.mock_engine import run_program

    objects = stack_objects("barcelona")
    quay_only = {"quayDockerConfigJson": SECRETS["quayDockerConfigJson"]}
    result = run_program("barcelona", {f"ml-dev-env:{k}": v for k, v in objects.items()}, quay_only)
    assert result.error and "ml-dev-env:hfToken: missing" in result.error  # the fp16 repository is gated

    objects["models"][1]["source"]["huggingFace"]["gated"] = False
    result = run_program("barcelona", {f"ml-dev-env:{k}": v for k, v in objects.items()}, quay_only)
    assert result.error is None, result.error
    assert "model-pipeline-hf" not in {r.inputs["metadata"]["name"] for r in result.of_type(SECRET)}
    env = {e["name"] for e in tasks(result)["modelcar-package-stream"]["steps"][0]["env"]}
    assert "HF_TOKEN" not in env


def test_default_include_is_what_the_download_step_accepts(pvc: RunResult) -> None:
    from steps.lib.model import DEFAULT_INCLUDE

    params = {p["name"]: p["value"] for p in run_for(pvc, "mistral-small-24b-fp16")["spec"]["params"]}
    assert params["include"] == list(DEFAULT_INCLUDE)
    assert "*.bin" in params["include"] and "*.py" in params["include"]  # bin-only and remote-code repositories
    assert "    DOWNLOAD_INCLUDE = DEFAULT_INCLUDE" in step_script("download")  # HfSource's, inlined from lib/source.py


def test_streaming_is_the_default_barcelona_reserves_no_volume_for_weights(barcelona: RunResult) -> None:
    """barcelona's two models (8 and 48 GiB) stream: no weights claim, no download Task, no PVC Pipeline."""
    assert "volumeClaimTemplate" not in json.dumps([r.inputs for r in barcelona.of_type(RUN)])
    assert set(tasks(barcelona)) == {"modelcar-wait-tools", "modelcar-package-stream", "modelcar-mirror", "modelcar-register"}
    assert {r.inputs["metadata"]["name"] for r in barcelona.of_type(PIPELINE)} == {"modelcar-stream"}
    for model in ("mistral-small-24b-w4a16", "mistral-small-24b-fp16"):
        spec = run_for(barcelona, model)["spec"]
        assert spec["pipelineRef"] == {"name": "modelcar-stream"}
        assert {"name": "model", "emptyDir": {}} in spec["workspaces"]


def test_pvc_mode_stays_available_and_upload_to_s3_implies_it(pvc: RunResult) -> None:
    """`stream: false` brings back the download Task, the PVC Pipeline and the weights claim; a model with
    `uploadToS3` and no `stream` downloads (its upload reads the files) while the others keep streaming."""
    assert {r.inputs["metadata"]["name"] for r in pvc.of_type(PIPELINE)} == {"modelcar"}
    assert "modelcar-package-stream" not in tasks(pvc)
    assert "volumeClaimTemplate" in json.dumps(run_for(pvc, "mistral-small-24b-fp16")["spec"]["workspaces"])
    upload = {"endpoint": "http://minio:9000", "bucket": "bkt", "prefix": "p"}
    mixed = _with_models(lambda o: o["models"][0].update(uploadToS3=upload), {**SECRETS, "s3AccessKeyId": "A", "s3SecretAccessKey": "B"})
    assert mixed.error is None, mixed.error
    assert {r.inputs["metadata"]["name"] for r in mixed.of_type(PIPELINE)} == {"modelcar", "modelcar-stream"}
    assert set(tasks(mixed)) >= {"modelcar-download", "modelcar-package", "modelcar-upload-s3", "modelcar-package-stream"}
    assert run_for(mixed, "mistral-small-24b-w4a16")["spec"]["pipelineRef"] == {"name": "modelcar"}
    assert run_for(mixed, "mistral-small-24b-fp16")["spec"]["pipelineRef"] == {"name": "modelcar-stream"}


def test_streaming_model_has_no_download_task_and_no_weights_pvc() -> None:
    def stream(o: dict[str, Any]) -> None:
        model = copy.deepcopy(o["models"][0])
        model.update(name="streamed", stream=True, tag="streamed-2501")
        model["source"] = {"s3": {"endpoint": "http://minio.model-storage.svc:9000", "bucket": "llm-models", "prefix": "mistral/w4a16"}}
        o["models"].append(model)

    secrets = {"quayDockerConfigJson": "{}", "hfToken": "x", "s3AccessKeyId": "A", "s3SecretAccessKey": "B"}
    result = _with_models(stream, secrets, stream=False)
    assert result.error is None, result.error
    pipelines = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in result.of_type(PIPELINE)}
    assert [t["name"] for t in pipelines["modelcar-stream"]["tasks"]] == ["wait-tools", "package", "mirror", "register"]
    spec = runs(result)[result.outputs["model_pipeline_runs"]["streamed"]]["spec"]
    assert spec["pipelineRef"] == {"name": "modelcar-stream"}
    assert "volumeClaimTemplate" not in json.dumps(spec["workspaces"])
    args = tasks(result)["modelcar-package-stream"]["steps"][0]["args"]
    assert args[args.index("--source") + 1] == "$(params.source-uri)"
    env = {e["name"] for e in tasks(result)["modelcar-package-stream"]["steps"][0]["env"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env
    by_name = {t["name"]: t for t in pipelines["modelcar-stream"]["tasks"]}
    needed = sum((t.get("retries", 0) + 1) * _minutes(t["timeout"]) for t in by_name.values())
    assert _minutes(spec["timeouts"]["pipeline"]) >= needed + 15
    others = runs(result)[result.outputs["model_pipeline_runs"]["mistral-small-24b-fp16"]]["spec"]
    assert others["pipelineRef"] == {"name": "modelcar"}


def test_hugging_face_model_can_stream_but_not_with_an_s3_upload() -> None:
    result = _with_models(lambda o: o["models"][0].update(stream=True))
    assert result.error is None, result.error
    spec = runs(result)[result.outputs["model_pipeline_runs"]["mistral-small-24b-w4a16"]]["spec"]
    assert spec["pipelineRef"] == {"name": "modelcar-stream"}
    step = tasks(result)["modelcar-package-stream"]["steps"][0]
    assert step["args"][step["args"].index("--hf-revision") + 1] == "$(params.revision)"
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "model-pipeline-hf", "key": "HF_TOKEN"}}} in step["env"]
    upload = {"endpoint": "http://minio:9000", "bucket": "bkt", "prefix": "p"}
    result = _with_models(lambda o: o["models"][0].update(stream=True, uploadToS3=upload),
                          {"quayDockerConfigJson": "{}", "s3AccessKeyId": "A", "s3SecretAccessKey": "B"})  # fmt: skip
    assert result.error and "ml-dev-env:models[0].stream: got 'stream: true'; not with uploadToS3" in result.error


def test_tools_image_installs_exactly_the_hash_lock(barcelona: RunResult, tmp_path: Path) -> None:
    """The rendered BuildConfig's RUN line, executed as written, hands pip the whole lock with every hash,
    in a file pip parses, installed with --require-hashes (pip itself stands in only for the install)."""
    bc = next(
        r.inputs
        for r in barcelona.of_type("kubernetes:build.openshift.io/v1:BuildConfig")
        if r.inputs["metadata"]["labels"].get("ml-dev-env/stage") == "tools"
    )
    args = {a["name"]: a["value"] for a in bc["spec"]["strategy"]["dockerStrategy"]["buildArgs"]}
    parser = DockerfileParser(path=str(tmp_path / "Dockerfile"))
    parser.content = bc["spec"]["source"]["dockerfile"]
    run = next(i["value"] for i in parser.structure if i["instruction"] == "RUN" and "STEP_REQUIREMENTS" in i["value"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = (
        f'#!/bin/bash\necho "$@" >> {tmp_path}/pip-calls\nfor a in "$@"; do last="$a"; done\n'
        f'if [[ " $* " == *" -r "* ]]; then cp "$last" {tmp_path}/installed.txt; fi\n'
    )
    (bin_dir / "python3").write_text(stub)
    (bin_dir / "python3").chmod(0o755)
    script = run.replace("/tmp/", f"{tmp_path}/")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STEP_REQUIREMENTS": args["STEP_REQUIREMENTS"]}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--require-hashes" in (tmp_path / "pip-calls").read_text()
    installed = (tmp_path / "installed.txt").read_text().splitlines()
    lock = (ROOT / "steps" / "requirements.txt").read_text()
    locked = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*==\S+)", lock, flags=re.M)
    assert [line.split()[0] for line in installed] == locked
    assert sum(line.count("--hash=sha256:") for line in installed) == lock.count("--hash=sha256:")
    # pip parses the file (a syntax problem is "Invalid requirement"); the venv already holds these versions
    # (the dev lock includes this one), else with no index it would find nothing to install
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--no-index", "--require-hashes",
         "-r", str(tmp_path / "installed.txt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert "Invalid requirement" not in check.stdout + check.stderr
    assert check.returncode == 0 or "No matching distribution found" in check.stderr, check.stderr
