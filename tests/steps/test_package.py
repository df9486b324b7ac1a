"""package.py against docker-registry (token and Basic auth) through a fault-injecting proxy."""

from __future__ import annotations

import hashlib
import io
import math
import re
import subprocess
import tarfile
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.images import pull
from tests.fixtures.proxy import FaultKind, HttpProxy
from tests.fixtures.registry import Registry
from tests.steps.conftest import StepRunner, needs_registry, needs_skopeo, write_model

pytestmark = [needs_registry, needs_skopeo]

Model = tuple[Path, dict[str, bytes]]


def package_args(tmp_path: Path, registry: Registry, host: str, base: str, repo: str, model: Path, *extra: object) -> list[object]:
    authfile = registry.authfile(tmp_path / f"auth-{host.replace(':', '-')}.json", host=host)
    return [
        "--model-dir", model, "--image", f"{host}/{repo}:v1", "--base-image", base, "--authfile", authfile,
        "--plain-http", "--retry-delay", "0.05", "--result-digest", tmp_path / "digest", *extra,
    ]  # fmt: skip


def via(proxy: HttpProxy, quay: Registry, base_image: str) -> str:
    return base_image.replace(quay.host, proxy.host)


def tag_exists(registry: Registry, image: str) -> bool:
    proc = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", "--creds", f"{registry.username}:{registry.password}", f"docker://{image}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 and "manifest unknown" not in proc.stderr:
        raise AssertionError(proc.stderr)
    return proc.returncode == 0


def assert_image_holds(registry: Registry, image: str, files: dict[str, bytes], dest: Path) -> None:
    pulled = pull(registry, image, dest)
    titles = {}
    for layer in pulled.manifest["layers"][1:]:
        with tarfile.open(fileobj=io.BytesIO(pulled.blob_path(layer["digest"]).read_bytes())) as tar:
            entry = tar.getmembers()[-1]
            data = tar.extractfile(entry)
            assert data is not None
            titles[entry.name.removeprefix("models/")] = hashlib.sha256(data.read()).hexdigest()
    assert titles == {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


def layer_sizes(deployed: Callable[[str], types.ModuleType], files: dict[str, bytes]) -> dict[str, int]:
    layout = deployed("package").LayerLayout
    return {rel: layout.for_file(rel, len(data)).size for rel, data in files.items()}


def test_chunked_upload_above_threshold(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    model_dir: Model,
    repo_name: str,
    deployed: Callable[[str], types.ModuleType],
) -> None:
    model, files = model_dir
    threshold, chunk = 1 << 20, 256 << 10
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model)
    step = run_step("package", *args, "--chunk-threshold", threshold, "--chunk-size", chunk)
    assert step.returncode == 0, step.stderr
    sizes = layer_sizes(deployed, files)
    expected = sum(math.ceil(s / chunk) if s > threshold else 1 for s in sizes.values()) + 1  # + config blob
    assert quay_proxy.count("PATCH") == expected
    assert sum(1 for s in sizes.values() if s > threshold) == 2
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_default_threshold_sends_one_patch_per_blob(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert step.returncode == 0, step.stderr
    assert quay_proxy.count("PATCH") == len(files) + 1
    assert quay_proxy.count("PUT", "/blobs/uploads/") == len(files) + 1


def test_same_input_same_digest(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, _ = model_dir
    digests = []
    for suffix in ("a", "b"):
        step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, f"{repo_name}-{suffix}", model))
        assert step.returncode == 0, step.stderr
        digests.append((tmp_path / "digest").read_text())
    (model / "config.json").touch()  # new mtime: the cached digest is not trusted, the layer is re-hashed
    step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, f"{repo_name}-c", model))
    assert step.returncode == 0, step.stderr
    digests.append((tmp_path / "digest").read_text())
    assert len(set(digests)) == 1


def test_dropped_connection_is_retried_in_the_same_run(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    quay_proxy.add_fault("drop_request", "PATCH", "/blobs/uploads/", at=1 << 20)
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    assert "retry 1/5" in step.stdout
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_crash_leaves_no_tag_and_rerun_skips_finished_blobs(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)
    quay_proxy.add_fault("drop_request", "PATCH", "/blobs/uploads/", at=1 << 20, skip=1)  # the 2nd largest file
    step = run_step("package", *args, "--retries", 0)
    assert step.returncode == 6
    assert "model-00002-of-00002.safetensors failed after 0 retries" in step.error
    assert "Traceback" not in step.stderr
    assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1"), "no tag may point at a partial image"
    assert quay_proxy.count("PATCH") == 2, "queued uploads stop after the failure"

    quay_proxy.reset()
    step = run_step("package", *args)
    assert step.returncode == 0, step.stderr
    assert "model-00001-of-00002.safetensors: sha256:" in step.stdout and "skipped" in step.stdout
    assert quay_proxy.count("PATCH") == len(files) - 1 + 1  # all but the finished layer, plus the config
    assert tag_exists(quay, f"{quay.host}/{repo_name}:v1")
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


@pytest.mark.parametrize("at", [0, 100_000], ids=["nothing-sent", "halfway"])
def test_failed_chunk_resumes_from_the_registry_offset(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    model_dir: Model,
    repo_name: str,
    at: int,
) -> None:
    """A chunk that broke before any byte reached the registry continues from the offset the registry
    reports (GET on the upload URL), in the same session. One that broke halfway left bytes that
    distribution's signed upload state does not cover: distribution cancels that session
    (registry/handlers/blobupload.go, `blobUploadDispatcher`), so the blob needs one new session."""
    model, files = model_dir
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)
    quay_proxy.add_fault("drop_request", "PATCH", "/blobs/uploads/", at=at, skip=2)  # 3rd chunk of the largest file
    step = run_step("package", *args, "--chunk-threshold", "1MiB", "--chunk-size", "512KiB")
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    if at == 0:
        assert f"resuming at byte {1 << 20}" in step.stdout, step.stdout
        assert upload_sessions(quay_proxy) == len(files) + 1  # one per blob (+ config): the broken one was continued
    else:
        assert "upload session lost at byte 1048576 (HTTP 404); new session" in step.stdout, step.stdout
        assert upload_sessions(quay_proxy) == len(files) + 2
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_lost_answer_to_final_put(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    quay_proxy.add_fault("drop_response", "PUT", "/blobs/uploads/")
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert step.returncode == 0, step.stderr
    assert "the final request had completed" in step.stdout
    assert quay_proxy.count("PATCH") == len(files) + 1, "nothing is sent twice"


def unauthorized(registry: Registry) -> bytes:
    """The answer a registry gives once a bearer token has expired."""
    return f"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: {registry.challenge}\r\nContent-Length: 0\r\n\r\n".encode()


def test_token_expiring_mid_upload_is_renewed(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    quay_proxy.add_fault("reject_request", "PATCH", "/blobs/uploads/", skip=1, reply=unauthorized(quay))
    tokens = len(quay.token_requests)
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert step.returncode == 0, step.stderr
    assert "credentials expired (HTTP 401)" in step.stdout
    assert len(quay.token_requests) - tokens == 2, "one token at the start, one renewal"
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_token_expiring_while_reading_the_base_is_renewed(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, internal: Registry, base_image: str, model_dir: Model
) -> None:
    model, _ = model_dir
    quay_proxy.add_fault("reject_request", "GET", "/blobs/sha256:", reply=unauthorized(quay))
    tokens = len(quay.token_requests)
    args = package_args(tmp_path, internal, internal.host, via(quay_proxy, quay, base_image), "ns/renewed", model)
    step = run_step("package", *args, "--base-authfile", quay.authfile(tmp_path / "base.json", host=quay_proxy.host))
    assert step.returncode == 0, step.stderr
    assert quay_proxy.fired
    assert len(quay.token_requests) - tokens == 2


def test_basic_auth_registry_with_base_streamed_from_another(
    tmp_path: Path, run_step: StepRunner, quay: Registry, internal: Registry, base_image: str, model_dir: Model
) -> None:
    model, files = model_dir
    args = package_args(tmp_path, internal, internal.host, base_image, "ns/model", model)
    step = run_step("package", *args, "--base-authfile", quay.authfile(tmp_path / "base-auth.json"))
    assert step.returncode == 0, step.stderr
    assert_image_holds(internal, f"{internal.host}/ns/model:v1", files, tmp_path / "pulled")
    source = pull(quay, base_image, tmp_path / "base")
    target = pull(internal, f"{internal.host}/ns/model:v1", tmp_path / "target")
    assert target.manifest["layers"][0]["digest"] == source.manifest["layers"][0]["digest"]
    assert target.config["architecture"] == "amd64" and target.config["config"]["Cmd"] == ["/bin/sh"]


@pytest.mark.parametrize(
    ("target", "password", "message"),
    [
        ("quay", "wrong", "credentials rejected by token service"),
        ("internal", "wrong", "credentials rejected"),
        ("internal", None, "authentication required, no credentials in the authfile"),
    ],
)
def test_wrong_credentials(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    internal: Registry,
    base_image: str,
    model_dir: Model,
    target: str,
    password: str | None,
    message: str,
) -> None:
    registry = quay if target == "quay" else internal
    authfile = registry.authfile(tmp_path / "auth.json", host=registry.host if password else "other.example:5000", password=password)
    base_auth = quay.authfile(tmp_path / "base.json")
    step = run_step(
        "package", "--model-dir", model_dir[0], "--image", f"{registry.host}/x/y:v1", "--base-image", base_image,
        "--authfile", authfile, "--base-authfile", base_auth, "--plain-http",
    )  # fmt: skip
    assert step.returncode == 4, step.stderr
    assert message in step.error and "Traceback" not in step.stderr


def test_usage_errors(tmp_path: Path, run_step: StepRunner) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    common = ["--base-image", "127.0.0.1:1/b:1", "--plain-http"]
    step = run_step("package", "--model-dir", empty, "--image", "127.0.0.1:1/x/y:v1", *common)
    assert step.returncode == 5 and "no model files" in step.error
    step = run_step("package", "--model-dir", empty, "--image", "127.0.0.1:1/x/y", *common)
    assert step.returncode == 1 and "needs a tag" in step.error
    chunks = ["--chunk-threshold", "1MiB", "--chunk-size", "2MiB"]
    step = run_step("package", "--model-dir", empty, "--image", "127.0.0.1:1/x/y:v1", *chunks, *common)
    assert step.returncode == 2 and "--chunk-size" in step.stderr


def test_token_expiring_during_a_large_chunk_is_renewed_and_resumed(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    """A registry answers an expired token with 401 before reading the body (the proxy does the same,
    and drops the connection while the client is still sending): renew the token, resume the blob."""
    model = tmp_path / "ws" / "models"
    files = write_model(model, {"big.safetensors": 96 << 20, "config.json": 300})
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)
    quay_proxy.add_fault("reject_request", "PATCH", "/blobs/uploads/", skip=1, reply=unauthorized(quay))  # 2nd chunk
    tokens = len(quay.token_requests)
    step = run_step("package", *args, "--chunk-threshold", "64MiB", "--chunk-size", "48MiB")
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    assert "credentials expired (HTTP 401)" in step.stdout
    assert f"resuming at byte {48 << 20}" in step.stdout, step.stdout
    assert len(quay.token_requests) - tokens == 2, "one token at the start, one renewal"
    sessions = sum(1 for method, path in quay_proxy.requests if method == "POST" and "mount=" not in path)
    assert sessions == len(files) + 1, "the blob was resumed, not restarted"
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def reply_with(status: int, reason: str, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status} {reason}\r\n{extra}Content-Length: 0\r\n\r\n".encode()


def chunked_args(tmp_path: Path, quay: Registry, proxy: HttpProxy, base_image: str, repo: str, model: Path, *extra: object) -> list[object]:
    args = package_args(tmp_path, quay, proxy.host, via(proxy, quay, base_image), repo, model, "--jobs", 1, *extra)
    return [*args, "--chunk-threshold", "1MiB", "--chunk-size", "512KiB"]


def upload_sessions(proxy: HttpProxy) -> int:
    return sum(1 for method, path in proxy.requests if method == "POST" and "mount=" not in path)


@pytest.mark.parametrize("kind", ["drop_response", "replace_response"], ids=["lost-answer", "http-500"])
def test_stored_chunk_without_its_answer_on_distribution(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    model_dir: Model,
    repo_name: str,
    kind: FaultKind,
) -> None:
    """distribution keeps the upload offset in the signed `_state` of each answer's Location and
    cancels a session asked about with an older one (registry/handlers/blobupload.go,
    `blobUploadDispatcher`: "upload resumed at wrong offset"). A stored chunk whose answer is lost
    therefore costs the session there: the client sees the 404 and opens one new session."""
    model, files = model_dir
    quay_proxy.add_fault(kind, "PATCH", "/blobs/uploads/", skip=2, reply=reply_with(500, "Internal Server Error"))
    step = run_step("package", *chunked_args(tmp_path, quay, quay_proxy, base_image, repo_name, model))
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    assert "upload session lost at byte 1048576 (HTTP 404); new session" in step.stdout, step.stdout
    assert upload_sessions(quay_proxy) == len(files) + 2
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")
    # The session the registry no longer accepts is DELETEd. distribution cannot honour that one: the request
    # with the stale `_state` closes the writer (ResumeBlobUpload's deferred upload.Close) before its handler
    # calls Cancel, whose fileWriter.Cancel then fails "already closed", so removeResources never runs
    # (registry/handlers/blobupload.go, registry/storage/blobwriter.go); its upload purger removes it later.
    assert quay_proxy.count("DELETE", "/blobs/uploads/") >= 1


def quay_range(method: str, path: str, status: int, head: bytes) -> bytes:
    """Rewrite distribution's upload-status `Range: 0-<last>` into Quay's `bytes=0-<count>`."""
    if method != "GET" or "/blobs/uploads/" not in path or status != 204:
        return head
    return re.sub(rb"\r\nRange: 0-(\d+)", lambda m: b"\r\nRange: bytes=0-%d" % (int(m.group(1)) + 1), head)


def test_quay_range_form_resumes_at_the_acknowledged_offset(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    quay_proxy.rewrite_head = quay_range
    quay_proxy.add_fault("drop_request", "PATCH", "/blobs/uploads/", skip=2)
    step = run_step("package", *chunked_args(tmp_path, quay, quay_proxy, base_image, repo_name, model))
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    assert f"resuming at byte {1 << 20}" in step.stdout, step.stdout
    assert upload_sessions(quay_proxy) == len(files) + 1
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_500_on_a_final_put_that_succeeded(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    model_dir: Model,
    repo_name: str,
    deployed: Callable[[str], types.ModuleType],
) -> None:
    model, files = model_dir
    quay_proxy.add_fault("replace_response", "PUT", "/blobs/uploads/", reply=reply_with(500, "Internal Server Error"))
    step = run_step("package", *chunked_args(tmp_path, quay, quay_proxy, base_image, repo_name, model))
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    assert "the final request had completed" in step.stdout, step.stdout
    sizes = layer_sizes(deployed, files)
    assert quay_proxy.count("PATCH") == sum(-(-s // (512 << 10)) if s > 1 << 20 else 1 for s in sizes.values()) + 1, "nothing sent twice"
    assert upload_sessions(quay_proxy) == len(files) + 1


def test_413_shrinks_the_chunk(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    """A proxy in front of the registry refuses bodies of 2 MiB or more: the 3 MiB layer goes in smaller chunks."""
    model, files = model_dir
    quay_proxy.add_fault("reject_request", "PATCH", "/blobs/uploads/", times=99, min_length=2 << 20, reply=reply_with(413, "Too Large"))
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert step.returncode == 0, step.stderr
    assert "(HTTP 413); continuing in chunks of 1.5 MiB" in step.stdout, step.stdout
    assert upload_sessions(quay_proxy) == len(files) + 1
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_413_below_the_minimum_chunk_is_one_clear_failure(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, _ = model_dir

    def min_length(method: str, path: str, status: int, head: bytes) -> bytes:
        if method == "POST" and status == 202:
            return head.replace(b"\r\n\r\n", b"\r\nOCI-Chunk-Min-Length: 2621440\r\n\r\n")
        return head

    quay_proxy.rewrite_head = min_length
    quay_proxy.add_fault("reject_request", "PATCH", "/blobs/uploads/", times=99, min_length=2 << 20, reply=reply_with(413, "Too Large"))
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert step.returncode == 7, step.stderr  # the same refusal again: running again will not succeed
    assert "refuses requests of 2.5 MiB (HTTP 413) and the chunk cannot shrink further" in step.error
    assert "Traceback" not in step.stderr
    assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1")


def test_416_reads_the_upload_status_and_resumes(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    refused = reply_with(416, "Range Not Satisfiable", "Range: 0-1048575")
    quay_proxy.add_fault("reject_request", "PATCH", "/blobs/uploads/", skip=2, reply=refused)
    step = run_step("package", *chunked_args(tmp_path, quay, quay_proxy, base_image, repo_name, model))
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    assert "HTTP 416" in step.stdout and f"resuming at byte {1 << 20}" in step.stdout, step.stdout
    assert upload_sessions(quay_proxy) == len(files) + 1
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_failure_budget_resets_after_progress(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    """Two dropped chunks of one blob with progress in between pass with --retries 1."""
    model, files = model_dir
    quay_proxy.add_fault("drop_request", "PATCH", "/blobs/uploads/", skip=2)  # 3rd chunk
    quay_proxy.add_fault("drop_request", "PATCH", "/blobs/uploads/", skip=4)  # 5th chunk (counting the retry)
    step = run_step("package", *chunked_args(tmp_path, quay, quay_proxy, base_image, repo_name, model, "--retries", 1))
    assert len(quay_proxy.fired) == 2
    assert step.returncode == 0, step.stderr
    assert step.stdout.count("retry 1/1") == 2, step.stdout
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_unfinished_chunked_upload_continues_in_the_next_run(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    """A run that gives up keeps the session and its offset in the digest cache; the next run (a Tekton
    retry) continues it after rebuilding the hash from the file, instead of sending the blob again."""
    model, files = model_dir
    quay_proxy.add_fault("drop_request", "PATCH", "/blobs/uploads/", skip=2)
    args = chunked_args(tmp_path, quay, quay_proxy, base_image, repo_name, model)
    step = run_step("package", *args, "--retries", 0)
    assert step.returncode == 6, step.stderr
    quay_proxy.reset()
    step = run_step("package", *args)
    assert step.returncode == 0, step.stderr
    assert "continuing the upload an earlier run left at byte 1048576" in step.stdout, step.stdout
    assert f"resuming at byte {1 << 20}" in step.stdout, step.stdout
    assert upload_sessions(quay_proxy) == len(files) + 1 - 1  # every blob but the continued one (+ config)
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


@pytest.mark.parametrize(("method", "path"), [("GET", "/manifests/"), ("HEAD", "/blobs/sha256:"), ("PUT", "/manifests/v1")])
def test_503_on_small_requests_is_retried(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    model_dir: Model,
    repo_name: str,
    method: str,
    path: str,
) -> None:
    model, files = model_dir
    quay_proxy.add_fault("reject_request", method, path, times=2, reply=reply_with(503, "Service Unavailable"))
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert len(quay_proxy.fired) == 2
    assert step.returncode == 0, step.stderr
    assert f"{method} {quay_proxy.host}: HTTP 503; retry 2/5" in step.stdout, step.stdout
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_token_service_outage_is_retried_and_not_called_wrong_credentials(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, _ = model_dir
    try:  # the token service is the session's: never leave it failing for later tests
        quay.token_outage[0] = 2
        step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, repo_name, model))
        assert step.returncode == 0, step.stderr
        assert "HTTP 503; retry 2/5" in step.stdout
        quay.token_outage[0] = 100
        step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, f"{repo_name}-b", model), "--retries", 1)
    finally:
        quay.token_outage[0] = 0
    assert step.returncode == 6, step.stderr
    assert "token service" in step.error and "HTTP 503 after 1 retries" in step.error


def test_upload_urls_on_another_host_name_get_the_token(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    """Quay builds upload URLs from its SERVER_HOSTNAME, which may differ from the name pushed to."""
    model, files = model_dir
    canonical = f"localhost:{quay_proxy.port}".encode()

    def server_hostname(method: str, path: str, status: int, head: bytes) -> bytes:
        return head.replace(f"Location: http://{quay_proxy.host}".encode(), b"Location: http://" + canonical)

    quay_proxy.rewrite_head = server_hostname
    step = run_step("package", *chunked_args(tmp_path, quay, quay_proxy, base_image, repo_name, model))
    assert step.returncode == 0, step.stderr
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_slow_commit_of_a_large_blob_is_waited_for(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    """The answer to the final PUT comes after the registry committed the blob (minutes for 40+ GB):
    the socket timeout of that request grows with the blob size instead of cutting it off."""
    model = tmp_path / "ws" / "models"
    files = write_model(model, {"big.safetensors": 128 << 20, "config.json": 300})
    quay_proxy.add_fault("delay_response", "PUT", "/blobs/uploads/", at=5000)
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)
    step = run_step("package", *args, "--timeout", 3)
    assert quay_proxy.fired
    assert step.returncode == 0, step.stderr
    assert "retry" not in step.stdout and "had completed" not in step.stdout, step.stdout
    assert quay_proxy.count("PUT", "/blobs/uploads/") == len(files) + 1
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_file_above_the_maximum_layer_size_is_refused_before_any_upload(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, _ = model_dir
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model)
    step = run_step("package", *args, "--max-layer-size", "3MiB")
    assert step.returncode == 1, step.stderr
    assert step.error.startswith("ERROR: model-00001-of-00002.safetensors: 3.0 MiB (3145745 bytes) makes a")
    assert "above the registry's maximum layer size 3145728 bytes" in step.error
    assert quay_proxy.count("POST") == 0 and quay_proxy.count("PATCH") == 0


def test_oci_annotations_name_source_revision_license_and_quantization(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, _ = model_dir
    notes = {
        "org.opencontainers.image.source": "hf://mistralai/Mistral-Small-24B-Instruct-2501",
        "org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
        "org.opencontainers.image.licenses": "apache-2.0",
        "io.ml-dev-env.model.quantization": "w4a16",
    }
    flags = [arg for key, value in notes.items() for arg in ("--annotation", f"{key}={value}")]
    step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, repo_name, model), *flags,
                    "--annotation", "org.opencontainers.image.url=")  # fmt: skip
    assert step.returncode == 0, step.stderr
    manifest = pull(quay, f"{quay.host}/{repo_name}:v1", tmp_path / "pulled").manifest
    assert {k: v for k, v in manifest["annotations"].items() if not k.startswith("org.opencontainers.image.base.")} == notes
