"""register.py against the model-registry REST stand-in."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from tests.fixtures.model_registry import ModelRegistryStandIn, run_model_registry, throwaway_ca
from tests.steps.conftest import StepRunner

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
IMAGE = "image-registry.openshift-image-registry.svc:5000/ml-dev/mistral"


def register(run_step: StepRunner, url: str, *extra: object, image: str = f"{IMAGE}@{DIGEST_A}") -> tuple[int, str]:
    step = run_step(
        "register", "--registry-url", url, "--model-name", "Mistral-Small-24B", "--version", "2501-w4a16", "--image", image,
        "--base-model", "mistralai/Mistral-Small-24B-Instruct-2501", "--quantization", "w4a16", "--source", "hf://org/m", *extra,
    )  # fmt: skip
    return step.returncode, step.stderr if step.returncode else step.stdout


def test_registers_then_rerun_is_a_no_op(tmp_path: Path, run_step: StepRunner, model_registry: ModelRegistryStandIn) -> None:
    code, out = register(run_step, model_registry.url, "--result-model-id", tmp_path / "m", "--result-version-id", tmp_path / "v")
    assert code == 0, out
    (model,) = model_registry.objects["registered_model"].values()
    (version,) = model_registry.objects["model_version"].values()
    (artifact,) = model_registry.objects["model_artifact"].values()
    assert (tmp_path / "m").read_text() == model["id"] and (tmp_path / "v").read_text() == version["id"]
    assert artifact["uri"] == f"oci://{IMAGE}@{DIGEST_A}"
    assert (artifact["modelFormatName"], artifact["modelFormatVersion"]) == ("ModelCar", "1")
    props = {k: v["string_value"] for k, v in version["customProperties"].items()}
    assert props == {"base_model": "mistralai/Mistral-Small-24B-Instruct-2501", "quantization": "w4a16", "source": "hf://org/m",
                     "format": "ModelCar"}  # fmt: skip

    writes = len(model_registry.writes())
    code, out = register(run_step, model_registry.url)
    assert code == 0, out
    assert "up to date" in out and "already points at" in out
    assert len(model_registry.writes()) == writes, "an unchanged re-run writes nothing"


def test_new_digest_registers_a_new_version_and_never_overwrites(
    tmp_path: Path, run_step: StepRunner, model_registry: ModelRegistryStandIn
) -> None:
    assert register(run_step, model_registry.url)[0] == 0
    (first,) = model_registry.objects["model_artifact"].values()
    code, out = register(run_step, model_registry.url, "--result-version-name", tmp_path / "name", image=f"{IMAGE}@{DIGEST_B}")
    assert code == 0, out
    assert (tmp_path / "name").read_text() == "2501-w4a16-bbbbbbbbbbbb"
    versions = {v["name"]: v for v in model_registry.objects["model_version"].values()}
    assert set(versions) == {"2501-w4a16", "2501-w4a16-bbbbbbbbbbbb"}
    uris = sorted(a["uri"] for a in model_registry.objects["model_artifact"].values())
    assert uris == [f"oci://{IMAGE}@{DIGEST_A}", f"oci://{IMAGE}@{DIGEST_B}"]
    assert model_registry.objects["model_artifact"][first["id"]]["uri"] == f"oci://{IMAGE}@{DIGEST_A}", "the old version is untouched"

    writes = len(model_registry.writes())  # the same new image again: nothing new
    code, out = register(run_step, model_registry.url, image=f"{IMAGE}@{DIGEST_B}")
    assert code == 0, out
    assert len(model_registry.writes()) == writes
    assert len(model_registry.objects["model_version"]) == 2

    code, out = register(run_step, model_registry.url, "--version", "2502-w4a16", image=f"{IMAGE}@{DIGEST_B}")
    assert code == 0, out  # a bumped version name is used as given
    assert "2502-w4a16" in {v["name"] for v in model_registry.objects["model_version"].values()}


def test_https_registry_with_a_private_ca(tmp_path: Path, run_step: StepRunner) -> None:
    """A secured RHOAI registry serves HTTPS only (kube-rbac-proxy, service-serving certificate)."""
    bundle, server_tls = throwaway_ca(tmp_path)
    with run_model_registry(tls=server_tls) as registry:
        assert registry.url.startswith("https://")
        code, out = register(run_step, registry.url, "--ca-file", bundle)
        assert code == 0, out
        assert len(registry.objects["model_artifact"]) == 1
        code, out = register(run_step, registry.url, "--retries", 0)
        assert code == 6 and "TLS certificate not trusted" in out and "--ca-file" in out and "Traceback" not in out


@pytest.mark.parametrize("api_version", ["v1", "v1alpha3"])
def test_api_version_and_bearer_token(tmp_path: Path, run_step: StepRunner, api_version: str) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    with run_model_registry(api_version=api_version, token="sa-token") as registry:
        code, out = register(run_step, registry.url, "--api-version", api_version, "--token-file", token)
        assert code == 0, out
        assert all(f"/api/model_registry/{api_version}/" in path for _, path, _ in registry.calls)
        code, out = register(run_step, registry.url, "--api-version", api_version)
        assert code == 4 and "HTTP 401" in out


@pytest.mark.parametrize(
    ("image_or_uri", "message"),
    [
        (("--image", f"{IMAGE}:latest"), "must pin a digest"),
        (("--uri", "bucket/prefix/"), "needs a scheme"),
    ],
)
def test_uri_must_be_pinned_and_have_a_scheme(
    run_step: StepRunner, model_registry: ModelRegistryStandIn, image_or_uri: tuple[str, str], message: str
) -> None:
    step = run_step("register", "--registry-url", model_registry.url, "--model-name", "m", "--version", "1", *image_or_uri)
    assert step.returncode == 1 and message in step.error
    assert model_registry.calls == []


def test_s3_uri(run_step: StepRunner, model_registry: ModelRegistryStandIn) -> None:
    step = run_step("register", "--registry-url", model_registry.url, "--model-name", "m", "--version", "1",
                    "--uri", "s3://llm-models/m/1/", "--model-format-name", "WeightsInS3")  # fmt: skip
    assert step.returncode == 0, step.stderr
    (artifact,) = model_registry.objects["model_artifact"].values()
    assert (artifact["uri"], artifact["modelFormatName"]) == ("s3://llm-models/m/1/", "WeightsInS3")


def test_unreachable_registry(run_step: StepRunner) -> None:
    step = run_step("register", "--registry-url", "http://127.0.0.1:9", "--model-name", "m", "--version", "1",
                    "--image", f"{IMAGE}@{DIGEST_A}", "--timeout", "2", "--retries", "1", "--retry-delay", "0")  # fmt: skip
    assert step.returncode == 6 and "unreachable" in step.error


@pytest.mark.parametrize(("status", "code", "requests"), [(400, 7, 1), (409, 7, 1), (403, 4, 1), (408, 6, 2), (429, 6, 2), (503, 6, 2)])
def test_the_exit_code_says_whether_running_again_may_succeed(run_step: StepRunner, status: int, code: int, requests: int) -> None:
    """A model registry answering every request with `status`: 408, 429 and 5xx are retried and exit 6 (running the
    Task again may succeed), any other 4xx exits 7 at once (it will not), 403 exits 4. Before issue 52 every 4xx but
    401/403 exited 6, and 408/429 were not retried."""
    seen: list[str] = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"{self.command} {self.path}")
            body = b'{"code": "refused", "message": "as asked"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PATCH = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        step = run_step("register", "--registry-url", url, "--model-name", "m", "--version", "1",
                        "--image", f"{IMAGE}@{DIGEST_A}", "--timeout", "5", "--retries", "1", "--retry-delay", "0")  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert step.returncode == code, step.stderr
    assert len(seen) == requests, seen
    assert f"HTTP {status}" in step.error and step.stderr.count("ERROR:") == 1, step.stderr
