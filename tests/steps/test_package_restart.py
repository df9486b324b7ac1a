"""A restart costs what docs/models/registry.md says: the registry (Debian's docker-registry, distribution 2.8, and
distribution 3 where one was built: `make registry3`) SIGKILLed between chunks and in the middle of one, restarted
with the same and with a new `http.secret`; and the
source failing for good in the middle of a file (moto S3 behind the fault proxy answering 503 to everything after
part of the object was read), chunked and not. Each run is a fresh process; the bytes that reach the registry are
counted by the proxy in front of it and compared with the documented bound."""

from __future__ import annotations

import os
import re
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.images import pull
from tests.fixtures.proxy import HttpProxy, run_proxy
from tests.fixtures.registry import Registry, run_registry
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import REGISTRY_MISSING, StepRunner, needs_registry, needs_skopeo, write_model
from tests.steps.test_package import assert_image_holds, layer_sizes, tag_exists, via
from tests.steps.test_package_faults import _run_while, open_uploads
from tests.steps.test_package_stream import upload

pytestmark = [needs_registry, needs_skopeo]
MiB = 1 << 20
CHUNK = 2 * MiB
Deployed = Callable[[str], types.ModuleType]
CONFIG_BLOB = 64 << 10  # the image config blob is a few KiB: an upper bound for the counts


def kept_at(stdout: str, name: str) -> int:
    found = re.search(rf"{re.escape(name)}: upload session kept at byte (\d+)", stdout)
    assert found, stdout
    return int(found[1])


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "one-request"])
def test_a_source_failing_for_good_mid_file_keeps_finished_work_and_the_session(
    tmp_path: Path,
    run_step: StepRunner,
    deployed: Deployed,
    s3: S3Server,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    repo_name: str,
    chunked: bool,
) -> None:
    """S3 breaks the GET of `b.safetensors` part-way and answers 503 to every GET of it after that (for good). The
    run fails with one line; `a.safetensors` (finished first) and, chunked, the session of `b` at the byte where the
    source stopped are kept. The next healthy run sends nothing for `a` and, of `b`, only what the registry does
    not hold: chunked, less than one chunk more than the rest of the file; as one request, the blob once more (one
    request is its one chunk)."""
    repo_name = f"{repo_name[:50]}-{'chunked' if chunked else 'one'}"  # the parameters share the test name's first 60 characters
    size_b = 9 * MiB + 5 if chunked else 3 * MiB + 5
    files = {"a.safetensors": os.urandom(12 * MiB), "b.safetensors": os.urandom(size_b), "config.json": b"{}"}
    bucket = f"source-cut-{os.getpid()}-{'c' if chunked else 'o'}"
    upload(s3, bucket, {f"m/{k}": v for k, v in files.items()})
    layers = layer_sizes(deployed, files)
    threshold = "4MiB" if chunked else "8MiB"
    a_chunks = -(-layers["a.safetensors"] // CHUNK) if chunked else 1
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as s3_proxy:
        args = [
            "--source", f"s3://{bucket}/m", "--s3-endpoint-url", f"http://{s3_proxy.host}",
            "--image", f"{quay_proxy.host}/{repo_name}:v1", "--base-image", via(quay_proxy, quay, base_image),
            "--authfile", quay.authfile(tmp_path / "auth.json", host=quay_proxy.host), "--plain-http", "--retry-delay", "0.05",
            "--chunk-threshold", threshold, "--chunk-size", "2MiB", "--jobs", 1, "--retries", 2,
        ]  # fmt: skip
        broken = 5 * MiB + 77 if chunked else MiB + 77  # inside b's third chunk / inside its one request
        s3_proxy.add_fault("truncate_response", "GET", "/m/b.safetensors", at=broken)
        s3_proxy.add_outage("GET", "/m/b.safetensors", seconds=600, skip=1)  # every later GET of it: 503
        first = run_step("package", *args, env=s3.env())
        assert first.returncode == 6, first.stdout + first.stderr
        assert len(first.stderr.strip().splitlines()) == 1 and "b.safetensors" in first.error and "503" in first.error, first.stderr
        assert "Traceback" not in first.stderr
        assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1")
        if chunked:
            held = kept_at(first.stdout, "b.safetensors")
            assert 2 * CHUNK < held <= broken + 4096, first.stdout  # where the source stopped (+ the tar header)
        else:
            held = 0
            assert "upload session kept" not in first.stdout, first.stdout
        sent_first = quay_proxy.sent("PATCH")
        assert sent_first >= layers["a.safetensors"] + (held if chunked else 0)

        s3_proxy.end_outage()
        quay_proxy.reset()
        second = run_step("package", *args, env=s3.env())
    assert second.returncode == 0, second.stdout + second.stderr
    assert "a.safetensors" in second.stdout and "nothing sent (found via the resume record)" in second.stdout, second.stdout
    rest = layers["b.safetensors"] - held + layers["config.json"]
    sent = quay_proxy.sent("PATCH")
    print(f"source cut, {'chunked' if chunked else 'one request'}: first run kept {held}; re-run sent {sent} for the rest {rest}")
    assert rest <= sent <= rest + CONFIG_BLOB, f"sent {sent}, the rest of the model is {rest} (+ the image config)"
    if chunked:
        assert f"b.safetensors: continuing the upload an earlier run left at byte {held}" in second.stdout
        assert a_chunks > 1
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", {k: v for k, v in files.items()}, tmp_path / "pulled")
    assert open_uploads(quay, repo_name) == []


@pytest.fixture(params=["distribution-2.8", "distribution-3"])
def restartable(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Registry]:
    """A registry of its own (token auth, like Quay's flow) that a test may SIGKILL and restart: Debian's
    docker-registry (distribution 2.8) and distribution 3 (skipped, with the reason and how to build it, where
    `make registry3` has not built one: neither its binary nor its source comes from a package registry)."""
    from tests.fixtures.registry import REGISTRY3_BIN, REGISTRY_BIN, registry3_missing, registry_available

    if not registry_available():
        pytest.skip(REGISTRY_MISSING)
    if request.param == "distribution-3" and (missing := registry3_missing()):
        pytest.skip(missing)
    binary = REGISTRY3_BIN if request.param == "distribution-3" else REGISTRY_BIN
    with run_registry(tmp_path, "restartable", auth="token", binary=binary) as registry:
        registry.name = request.param
        yield registry


@pytest.mark.parametrize("secret", ["same", "new"])
@pytest.mark.parametrize("when", ["between-chunks", "mid-chunk"])
def test_a_registry_restart_costs_what_the_docs_say(
    tmp_path: Path,
    scripts: dict[str, Path],
    deployed: Deployed,
    quay: Registry,
    base_image: str,
    restartable: Registry,
    when: str,
    secret: str,
) -> None:
    """PVC mode, one blob in flight (`--jobs 1`), 2 MiB chunks. distribution 2.8 (the documented bound, per case):
    * between chunks, same secret: the session goes on, nothing is sent again (at most one chunk);
    * between chunks, new secret: every `_state` fails its HMAC (hmac.go unpackUploadState): the blob in flight
      starts again from byte 0 (at most what was sent of it, plus one chunk);
    * in the middle of a chunk, either secret: the stored size differs from the signed offset, so the registry
      cancels the session (blobupload.go blobUploadDispatcher): the blob starts again from byte 0.
    distribution 3, every case: the status GET reads no `_state` and answers the size it holds with a `_state`
    signed by its current secret (blobupload.go GetUploadStatus, blobUploadResponse), so the session goes on from
    there: at most one chunk again, never a new session."""
    model = tmp_path / "claim" / "models"
    files = write_model(model, {"big.safetensors": 12 * MiB + 3, "config.json": 300})
    layers = layer_sizes(deployed, files)
    with run_proxy(restartable.port) as proxy:
        args = [
            "--model-dir", model, "--image", f"{proxy.host}/ns/restart:v1", "--base-image", base_image,
            "--authfile", restartable.authfile(tmp_path / "auth.json", host=proxy.host),
            "--base-authfile", quay.authfile(tmp_path / "b.json"),
            "--plain-http", "--retry-delay", "0.5", "--retries", 6, "--chunk-threshold", "4MiB", "--chunk-size", "2MiB", "--jobs", 1,
        ]  # fmt: skip
        if when == "between-chunks":  # the 3rd chunk is stored; its answer is held while the registry restarts
            proxy.add_fault("delay_response", "PATCH", "/blobs/uploads/", at=4000, skip=2, min_length=CHUNK)
        else:  # the 3rd chunk stops after 1 MiB while the registry restarts
            proxy.add_fault("stall_request", "PATCH", "/blobs/uploads/", at=MiB, skip=2, min_length=CHUNK, seconds=4.0)

        def restart() -> None:
            restartable.kill()
            proxy.upstream_port = restartable.restart(new_secret=secret == "new")

        step = _run_while(scripts["package"], args, dict(os.environ), lambda: bool(proxy.fired), restart)
        sent = proxy.sent("PATCH")
    assert proxy.fired, "the fault hit the third chunk"
    assert step.returncode == 0, step.stdout + step.stderr
    image = f"{restartable.host}/ns/restart:v1"
    model_bytes = sum(layers.values())
    image_bytes = sum(layer["size"] for layer in pull(restartable, image, tmp_path / "manifest").manifest["layers"])  # + the base's
    extra = sent - image_bytes
    print(f"{restartable.name}, restart {when}, {secret} secret: {sent} bytes sent for {image_bytes} of layers ({extra:+d})")
    # Mid-chunk, whether any of the partial chunk reached the registry's storage before the SIGKILL is a race (the
    # bytes may still sit in socket buffers): if none did, the stored size equals the signed offset and the session
    # goes on; the step's log says which, and each case has its bound.
    v3 = restartable.name == "distribution-3"
    lost = not v3 and (secret == "new" or (when == "mid-chunk" and "new session from byte 0" in step.stdout))
    if when == "mid-chunk" and not lost:
        assert "resuming at byte" in step.stdout, step.stdout
    if lost:  # the session is gone: the blob again from byte 0
        assert "new session from byte 0" in step.stdout, step.stdout
        assert CHUNK < extra <= layers["big.safetensors"] + CONFIG_BLOB, f"sent {sent} for {image_bytes} ({model_bytes} of the model)"
    else:
        assert "new session" not in step.stdout, step.stdout
        assert extra <= CHUNK + CONFIG_BLOB, f"sent {sent} for {image_bytes}: more than one chunk again"
    assert_image_holds(restartable, image, files, tmp_path / "pulled")
