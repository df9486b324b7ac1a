"""Faults over the long run: a retry resumes in both modes, credentials stay where they belong, an outage
costs what it must. Real docker-registry and moto S3 behind the counting, fault-injecting proxy; every
test counts the request body bytes that reach the registry."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.hf_hub import FakeHub, run_hub
from tests.fixtures.proxy import HttpProxy
from tests.fixtures.registry import Registry
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import StepRun, StepRunner, needs_registry, needs_skopeo, write_model
from tests.steps.test_package import (
    assert_image_holds,
    layer_sizes,
    package_args,
    reply_with,
    tag_exists,
    unauthorized,
    via,
)
from tests.steps.test_package_stream import upload

pytestmark = [needs_registry, needs_skopeo]
MiB = 1 << 20
Deployed = Callable[[str], types.ModuleType]
SHARDS = {"a.safetensors": 7 * MiB + 11, "b.safetensors": 6 * MiB + 5, "c.safetensors": 5 * MiB, "config.json": 300}
CHUNK = 2 * MiB


def open_uploads(registry: Registry, repo: str) -> list[str]:
    """Upload sessions distribution still holds for `repo`: directories repositories/<repo>/_uploads/<id> with a
    `startedat` file, without which distribution cannot resume (so neither continue nor commit) an upload
    (registry/storage/linkedblobstore.go, Resume: ErrBlobUploadUnknown). A cancelled session may leave files
    without it: the DELETE handler is wrapped in closeResources, which closes the writer again after Cancel
    removed the directory (registry/handlers/blobupload.go, blobUploadDispatcher), and a PATCH whose body was
    cut off may close its writer after the DELETE was served."""
    uploads = registry.root / "data" / "docker" / "registry" / "v2" / "repositories" / repo / "_uploads"
    found = uploads.iterdir() if uploads.is_dir() else iter(())
    return sorted(p.name for p in found if (p / "startedat").exists())


def reread(stdout: str) -> int:
    for line in stdout.splitlines():
        if "source bytes re-read to rebuild hash states" in line:
            return int(line.split(": ")[-1].split(" ")[0])
    return 0


@pytest.mark.parametrize("mode", ["stream", "pvc"])
def test_retry_after_a_failure_resends_at_most_one_chunk(
    tmp_path: Path,
    run_step: StepRunner,
    deployed: Deployed,
    s3: S3Server,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    repo_name: str,
    mode: str,
) -> None:
    """The run fails in the middle of the 2nd of 4 blobs (an outage the retries cannot outlast); the retry
    is a fresh process (stream: a fresh workspace too; PVC: the same claim). It sends nothing for the
    finished blob, continues the one in flight at the registry's offset, and sends the rest once."""
    layers = layer_sizes(deployed, {rel: bytes(size) for rel, size in SHARDS.items()})
    if mode == "stream":
        files = {rel: os.urandom(size) for rel, size in SHARDS.items()}
        upload(s3, f"resume-{os.getpid()}", {f"m/{k}": v for k, v in files.items()})
        source: list[str | Path] = ["--source", f"s3://resume-{os.getpid()}/m", "--s3-endpoint-url", s3.endpoint]
        env = s3.env()
    else:
        model = tmp_path / "claim" / "models"
        files = write_model(model, SHARDS)
        source, env = ["--model-dir", model], dict(os.environ)
    args = [
        *source, "--image", f"{quay_proxy.host}/{repo_name}:v1", "--base-image", via(quay_proxy, quay, base_image),
        "--authfile", quay.authfile(tmp_path / "auth.json", host=quay_proxy.host), "--plain-http", "--retry-delay", "0.05",
        "--chunk-threshold", "4MiB", "--chunk-size", "2MiB", "--jobs", 1,
    ]  # fmt: skip
    a_chunks = -(-layers["a.safetensors"] // CHUNK)
    quay_proxy.add_outage("PATCH", "/blobs/uploads/", seconds=600, skip=a_chunks + 2)  # b's 3rd chunk and after
    first = run_step("package", *args, "--retries", 1, env=env)
    assert first.returncode == 6, first.stderr
    assert "b.safetensors: upload session kept at byte 4194304" in first.stdout, first.stdout
    assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1")
    sent_first = quay_proxy.sent("PATCH")
    assert sent_first == layers["a.safetensors"] + 2 * CHUNK

    quay_proxy.end_outage()
    quay_proxy.reset()
    second = run_step("package", *args, env=env)  # a fresh process; stream mode has no workspace at all
    assert second.returncode == 0, second.stderr
    skipped = "nothing sent (found via the resume record)" if mode == "stream" else "skipped"
    assert "a.safetensors: sha256:" in second.stdout and skipped in second.stdout, second.stdout
    assert "b.safetensors: continuing the upload an earlier run left at byte 4194304" in second.stdout
    remaining = layers["b.safetensors"] - 2 * CHUNK + layers["c.safetensors"] + layers["config.json"]
    config_blob = quay_proxy.sent("PATCH") - remaining
    assert 0 < config_blob < 64 << 10, f"sent {quay_proxy.sent('PATCH')} bytes, expected {remaining} + the image config"
    assert reread(second.stdout) == 2 * CHUNK, "the acknowledged prefix is read again from the source, reported apart"
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")
    assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1.resume"), "the resume record is deleted after success"
    assert open_uploads(quay, repo_name) == [], "no upload session is left behind"


def test_outage_longer_than_the_status_retries_keeps_the_session(
    tmp_path: Path, run_step: StepRunner, deployed: Deployed, quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    """Every request answered 503 for longer than one status request's own retries (scaled: retry delay 0.05 s,
    so 5 retries span at most 1.6 s; the outage lasts 3.5 s). ML_DEV_ENV_OUTAGE_S=90 runs the real case with
    the default 2 s retry delay (about 3 minutes). The session and its hash marks are kept: at most one chunk
    is sent again."""
    seconds = float(os.environ.get("ML_DEV_ENV_OUTAGE_S", "3.5"))
    delay = "0.05" if seconds < 10 else "2"
    model = tmp_path / "ws" / "models"
    files = write_model(model, {"big.safetensors": 6 * MiB, "config.json": 300})
    layers = layer_sizes(deployed, files)
    quay_proxy.add_outage("PATCH", "/blobs/uploads/", seconds=seconds, skip=2)
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)
    args[args.index("--retry-delay") + 1] = delay
    started = time.monotonic()
    step = run_step("package", *args, "--chunk-threshold", "2MiB", "--chunk-size", "1MiB", timeout=seconds * 4 + 120)
    print(f"outage {seconds}s, retry delay {delay}s: step took {time.monotonic() - started:.1f}s")
    assert quay_proxy.outage_answers > 5
    assert step.returncode == 0, step.stderr
    assert "new session" not in step.stdout, step.stdout
    assert quay_proxy.sent("PATCH") <= sum(layers.values()) + (64 << 10) + MiB  # + image config, + at most one chunk
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")
    assert open_uploads(quay, repo_name) == []


def test_token_renewals_that_work_are_not_failures(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    """Short-lived tokens: a 401 on most chunks of one blob, injected as the registry's own answer to an expired
    token (the test token service signs 5-minute tokens). Each renewal works and is followed by progress; the
    old count ended the run (exit 4) at the third expiry within one blob."""
    model = tmp_path / "ws" / "models"
    files = write_model(model, {"big.safetensors": 6 * MiB, "config.json": 300})
    for skip in (1, 2, 3, 4, 5):
        quay_proxy.add_fault("reject_request", "PATCH", "/blobs/uploads/", skip=skip, reply=unauthorized(quay))
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)
    step = run_step("package", *args, "--chunk-threshold", "2MiB", "--chunk-size", "1MiB", "--retries", 1)
    assert len(quay_proxy.fired) >= 4
    assert step.returncode == 0, step.stderr
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A host that should never see a secret: records every request and answers 401 naming itself as realm."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        remaining = length
        while remaining > 0:
            remaining -= len(self.rfile.read(min(remaining, 1 << 20)))
        self.seen.append((self.command, self.path, self.headers.get("Authorization") or ""))
        address = self.server.server_address
        assert isinstance(address, tuple), f"a TCP server has a (host, port) address, not {address!r}"
        host, port = address[:2]
        self.send_response(401)
        self.send_header("WWW-Authenticate", f'Bearer realm="http://{host!s}:{port}/token",service="hostile"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hostile() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    seen: list[tuple[str, str, str]] = []
    handler = type("Hostile", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("which", ["quay", "internal"], ids=["bearer-registry", "basic-registry"])
def test_a_hostile_location_host_gets_no_credentials(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    internal: Registry,
    base_image: str,
    model_dir: tuple[Path, dict[str, bytes]],
    hostile: tuple[str, list[tuple[str, str, str]]],
    which: str,
) -> None:
    """The registry (here: a proxy rewriting its answers) names an upload URL on a host that answers 401 with
    its own realm. That host may see a Bearer token of the registry, never Basic credentials; its realm is
    never asked; the push fails (exit 4) instead of succeeding with the password handed out."""
    from tests.fixtures.proxy import run_proxy

    registry = quay if which == "quay" else internal
    host, seen = hostile
    model, _ = model_dir
    with run_proxy(registry.port) as proxy:

        def elsewhere(method: str, path: str, status: int, head: bytes) -> bytes:
            if method == "POST" and status == 202:
                return head.replace(f"Location: http://{proxy.host}".encode(), f"Location: http://{host}".encode())
            return head

        proxy.rewrite_head = elsewhere
        base = via(proxy, quay, base_image) if which == "quay" else base_image
        args = package_args(tmp_path, registry, proxy.host, base, "ns/hostile", model, "--jobs", 1, "--retries", 1)
        if which == "internal":
            args += ["--base-authfile", quay.authfile(tmp_path / "base.json")]
        step = run_step("package", *args)
    assert step.returncode == 4, step.stdout + step.stderr
    assert seen, step.stdout + step.stderr
    assert not [p for _, p, _ in seen if p.startswith("/token")], "the hostile realm was asked for a token"
    assert all(not auth or auth.startswith("Bearer ") for _, _, auth in seen), seen
    assert not [a for _, _, a in seen if registry.password in a or "Basic" in a]
    if which == "internal":
        assert all(not auth for _, _, auth in seen), "a Basic-auth registry's credentials never leave it"


def test_an_http_upload_url_from_an_https_registry_gets_nothing(deployed: Deployed) -> None:
    package = deployed("package")
    import ssl

    client = package.RegistryClient(
        "registry.example", ("u", "p"), [], plain_http=False, tls_context=ssl.create_default_context(), timeout=5
    )
    client._auth = "Bearer t"
    client._locations.add("http://upload.example")
    client._locations.add("https://upload.example")
    assert "Authorization" not in client._headers("http://upload.example/v2/x/blobs/uploads/1", None)
    assert client._headers("https://upload.example/v2/x/blobs/uploads/1", None)["Authorization"] == "Bearer t"
    client._auth = "Basic dTpw"
    assert "Authorization" not in client._headers("https://upload.example/v2/x/blobs/uploads/1", None)
    assert client._headers("/v2/x/blobs/uploads/1", None)["Authorization"] == "Basic dTpw"


def _run_while(scripts_dir: Path, args: list[object], env: dict[str, str], when: Callable[[], bool], do: Callable[[], None]) -> StepRun:
    """Run the deployed package step and call `do` once `when` holds (polled), e.g. in the middle of an upload."""
    proc = subprocess.Popen(
        [sys.executable, str(scripts_dir), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not when() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        do()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return StepRun(proc.returncode, out, err)


def test_a_shard_swapped_for_a_symlink_during_the_upload_is_refused(
    tmp_path: Path, scripts: dict[str, Path], quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    model = tmp_path / "ws" / "models"
    write_model(model, {"big.safetensors": 4 * MiB, "config.json": 300})
    outside = tmp_path / "secret"
    outside.write_bytes(b"s" * (4 * MiB))
    quay_proxy.add_fault("delay_response", "PATCH", "/blobs/uploads/", at=1500)  # the first chunk's answer comes late
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)
    args += ["--chunk-threshold", "2MiB", "--chunk-size", "1MiB"]

    def swap() -> None:
        link = model / "swap.tmp"
        link.symlink_to(outside)
        link.replace(model / "big.safetensors")

    step = _run_while(scripts["package"], args, dict(os.environ), lambda: quay_proxy.count("PATCH") >= 1, swap)
    assert step.returncode == 3, step.stdout + step.stderr
    assert "big.safetensors became a symbolic link" in step.error
    assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1")
    assert open_uploads(quay, repo_name) == [], step.stdout


def test_a_fifo_named_like_a_shard_is_refused_by_name(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str, model_dir: tuple[Path, dict[str, bytes]], repo_name: str
) -> None:
    model, _ = model_dir
    os.mkfifo(model / "model-00003-of-00003.safetensors")
    step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, repo_name, model), timeout=60)
    assert step.returncode == 1, step.stderr
    assert "model-00003-of-00003.safetensors is not a regular file" in step.error


def test_a_source_object_gone_mid_run_ends_at_once_with_exit_5(
    tmp_path: Path, scripts: dict[str, Path], s3: S3Server, quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    bucket = f"gone-{os.getpid()}"
    upload(s3, bucket, {"m/big.safetensors": os.urandom(3 * MiB), "m/config.json": b"{}"})
    quay_proxy.add_fault("delay_response", "PATCH", "/blobs/uploads/", at=1500)
    args = [
        "--source", f"s3://{bucket}/m", "--s3-endpoint-url", s3.endpoint, "--image", f"{quay_proxy.host}/{repo_name}:v1",
        "--base-image", via(quay_proxy, quay, base_image), "--authfile", quay.authfile(tmp_path / "a.json", host=quay_proxy.host),
        "--plain-http", "--retry-delay", "0.05", "--jobs", 1,
    ]  # fmt: skip
    step = _run_while(
        scripts["package"],
        args,
        s3.env(),
        lambda: quay_proxy.count("PATCH") >= 1,
        lambda: s3.client(True).delete_object(Bucket=bucket, Key="m/config.json"),
    )
    assert step.returncode == 5, step.stdout + step.stderr
    assert "config.json" in step.error and "no longer exists" in step.error
    assert "config.json: reading" not in step.stdout and "retry" not in step.stdout, "a 404 is not retried"
    assert open_uploads(quay, repo_name) == []


def test_a_persistent_416_names_the_chunk_size_setting(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    model_dir: tuple[Path, dict[str, bytes]],
    repo_name: str,
) -> None:
    model, _ = model_dir
    quay_proxy.add_fault(
        "reject_request", "PATCH", "/blobs/uploads/", times=100, reply=reply_with(416, "Range Not Satisfiable", "Range: 0-0")
    )
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1, "--retries", 2)
    step = run_step("package", *args)
    assert step.returncode == 6, step.stderr
    assert "HTTP 416" in step.error and "--chunk-size" in step.error and "modelPipeline.chunkSize" in step.error


def test_path_rule_serves_every_source(
    tmp_path: Path, run_step: StepRunner, deployed: Deployed, s3: S3Server, quay: Registry, base_image: str, repo_name: str
) -> None:
    rule = deployed("lib.model").path_rule
    assert [rule(p) for p in ("a/b.json", ".cache/x.json", "a/.git/c", "a//b.json", "/a.json", "a/../b.json", "./a.json")] == [
        "ok", "hidden", "hidden", "unsafe", "unsafe", "unsafe", "unsafe",
    ]  # fmt: skip
    files = {"model.safetensors": os.urandom(1000), "config.json": b"{}", ".cache/x.json": b"{}", "sub/.hidden.json": b"{}"}
    base = ["--base-image", base_image, "--authfile", quay.authfile(tmp_path / "a.json"), "--plain-http", "--retry-delay", "0.05"]

    def titles(image: str) -> set[str]:
        from tests.fixtures.images import pull

        manifest = pull(quay, image, tmp_path / image.rsplit(":", 1)[-1]).manifest
        return {layer["annotations"]["org.opencontainers.image.title"] for layer in manifest["layers"][1:]}

    model = tmp_path / "ws" / "models"
    for rel, data in files.items():
        (model / rel).parent.mkdir(parents=True, exist_ok=True)
        (model / rel).write_bytes(data)
    step = run_step("package", "--model-dir", model, "--image", f"{quay.host}/{repo_name}:dir", *base)
    assert step.returncode == 0, step.stderr
    assert titles(f"{quay.host}/{repo_name}:dir") == {"model.safetensors", "config.json"}

    bucket = f"rules-{os.getpid()}"
    upload(s3, bucket, {f"m/{k}": v for k, v in files.items()})
    step = run_step(
        "package",
        "--source",
        f"s3://{bucket}/m",
        "--s3-endpoint-url",
        s3.endpoint,
        "--image",
        f"{quay.host}/{repo_name}:s3",
        *base,
        env=s3.env(),
    )
    assert step.returncode == 0, step.stderr
    assert titles(f"{quay.host}/{repo_name}:s3") == {"model.safetensors", "config.json"}
    s3.client(True).put_object(Bucket=bucket, Key="m/a//b.json", Body=b"{}")
    step = run_step(
        "package",
        "--source",
        f"s3://{bucket}/m",
        "--s3-endpoint-url",
        s3.endpoint,
        "--image",
        f"{quay.host}/{repo_name}:s3b",
        *base,
        env=s3.env(),
    )
    assert step.returncode == 1 and "refusing unsafe path 'a//b.json'" in step.error, step.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(tmp_path / "hf-home")
    with run_hub(FakeHub("org/rules", files)) as hub:
        step = run_step(
            "package", "--source", "hf://org/rules", "--hf-endpoint", hub.endpoint, "--image", f"{quay.host}/{repo_name}:hf", *base, env=env
        )
    assert step.returncode == 0, step.stderr
    assert titles(f"{quay.host}/{repo_name}:hf") == {"model.safetensors", "config.json"}


@pytest.mark.parametrize(
    "when, change, code",
    [
        ("before-its-upload", "symlink", 3),
        ("during-its-only-request", "symlink", 3),
        ("before-its-upload", "delete", 5),
        ("during-its-only-request", "delete", 5),
    ],
)
def test_a_file_swapped_or_gone_ends_at_once_naming_it(
    tmp_path: Path,
    scripts: dict[str, Path],
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    repo_name: str,
    when: str,
    change: str,
    code: int,
) -> None:
    """`config.json` swapped for a symbolic link or deleted while another file uploads (`--jobs 1`: before its own
    upload), or while its one request is answered late (between its last byte read and the commit): exit 3 / 5 at once,
    one line naming it, no retry, no tag, no session left."""
    model = tmp_path / "ws" / "models"
    write_model(model, {"big.safetensors": 3 * MiB, "config.json": 300})
    outside = tmp_path / "secret"
    outside.write_bytes(b"s" * 300)
    target = "/blobs/uploads/"
    skip = 0 if when == "before-its-upload" else 1  # the big file goes first (largest first); config.json's PATCH is the 2nd
    quay_proxy.add_fault("delay_response", "PATCH", target, at=1500, skip=skip)
    args = package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model, "--jobs", 1)

    def swap() -> None:
        if change == "delete":
            (model / "config.json").unlink()
            return
        link = model / "swap.tmp"
        link.symlink_to(outside)
        link.replace(model / "config.json")

    started = time.monotonic()
    step = _run_while(scripts["package"], args, dict(os.environ), lambda: quay_proxy.count("PATCH") >= skip + 1, swap)
    assert step.returncode == code, step.stdout + step.stderr
    assert "config.json" in step.error and ("became a symbolic link" if change == "symlink" else "no longer exists") in step.error
    assert "Traceback" not in step.stderr and "retry" not in step.stdout, step.stdout + step.stderr
    assert time.monotonic() - started < 30, "at once, not after the retries"
    assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1")
    assert open_uploads(quay, repo_name) == [], step.stdout


def test_a_refused_mount_is_dropped_like_any_upload_url(
    tmp_path: Path,
    run_step: StepRunner,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    model_dir: tuple[Path, dict[str, bytes]],
    repo_name: str,
) -> None:
    """A refused cross-repository mount (202) whose upload URL spells the registry's host another way (Quay builds it
    from SERVER_HOSTNAME): the DELETE that drops it goes there with the Bearer token (an answer to our POST named it),
    its failure is logged, not fatal, and the base layer is then uploaded."""
    model, files = model_dir
    location = f"http://localhost:{quay_proxy.port}/v2/{repo_name}/blobs/uploads/0a0a0a0a-0000-4000-8000-000000000000?_state=refused"
    refused = reply_with(202, "Accepted", f"Location: {location}", "Docker-Upload-UUID: 0a0a0a0a-0000-4000-8000-000000000000")
    quay_proxy.add_fault("reject_request", "POST", "mount=", times=10, reply=refused)
    step = run_step("package", *package_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, model))
    assert step.returncode == 0, step.stdout + step.stderr
    assert quay_proxy.fired, "the mount was refused"
    assert quay_proxy.count("DELETE", "/blobs/uploads/0a0a0a0a") >= 1, quay_proxy.requests
    assert "cancelling the upload session answered HTTP" in step.stdout or "could not cancel" in step.stdout, step.stdout
    assert step.stderr == "", step.stderr
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")
