"""package.py --source s3://…: weights streamed from (moto) S3 straight into the registry upload, no local copy."""

from __future__ import annotations

import io
import json
import os
import ssl
import types
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from tests.fixtures.hf_hub import FakeHub, run_hub
from tests.fixtures.images import pull
from tests.fixtures.proxy import HttpProxy, run_proxy
from tests.fixtures.registry import Registry
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import StepRunner, needs_registry, needs_skopeo
from tests.steps.test_package import assert_image_holds, layer_sizes, tag_exists, via

pytestmark = [needs_registry, needs_skopeo]
MiB = 1 << 20


def upload(s3: S3Server, bucket: str, files: dict[str, bytes], checksums: bool = True) -> None:
    client = s3.client(checksums)
    client.create_bucket(Bucket=bucket)
    for key, data in files.items():
        if len(data) > 8 * MiB:  # multipart: the ETag is the MD5 of the part MD5s
            parts = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
            client.upload_fileobj(io.BytesIO(data), bucket, key, Config=parts)
        else:
            extra = {"ChecksumAlgorithm": "SHA256"} if checksums else {}
            client.put_object(Bucket=bucket, Key=key, Body=data, **extra)


def stream_args(tmp_path: Path, quay: Registry, host: str, base: str, repo: str, bucket: str, endpoint: str) -> list[object]:
    return [
        "--source", f"s3://{bucket}/m", "--s3-endpoint-url", endpoint, "--image", f"{host}/{repo}:v1", "--base-image", base,
        "--authfile", quay.authfile(tmp_path / "auth.json", host=host), "--plain-http", "--retry-delay", "0.05",
        "--chunk-threshold", "4MiB", "--chunk-size", "2MiB",
    ]  # fmt: skip


def test_streams_from_s3_verifies_and_reruns_skip(
    tmp_path: Path,
    run_step: StepRunner,
    deployed: Callable[[str], types.ModuleType],
    s3: S3Server,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    repo_name: str,
) -> None:
    files = {"model-00001-of-00002.safetensors": os.urandom(11 * MiB + 7), "model-00002-of-00002.safetensors": os.urandom(3 * MiB),
             "config.json": b'{"architectures": ["X"]}', "notes.md": b"not part of the model"}  # fmt: skip
    upload(s3, "stream", {f"m/{k}": v for k, v in files.items()})
    files["tokenizer.json"] = b'{"model": {}}'  # a full-object CRC32
    s3.client().put_object(Bucket="stream", Key="m/tokenizer.json", Body=files["tokenizer.json"], ChecksumAlgorithm="CRC32")
    args = stream_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, "stream", s3.endpoint)
    step = run_step("package", *args, env=s3.env())
    assert step.returncode == 0, step.stderr
    assert "crc32-multipart" in step.stdout and "sha256-base64" in step.stdout and "source crc32 " in step.stdout
    packaged = {k: v for k, v in files.items() if k != "notes.md"}  # the default include patterns
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", packaged, tmp_path / "pulled")
    manifest = pull(quay, f"{quay.host}/{repo_name}:v1", tmp_path / "again").manifest
    assert all(layer["annotations"]["io.ml-dev-env.source"].startswith("s3:") for layer in manifest["layers"][1:])
    assert not list(tmp_path.glob("**/*.safetensors")), "nothing of the model was written locally"

    quay_proxy.reset()
    step = run_step("package", *args, env=s3.env())
    assert step.returncode == 0, step.stderr
    # The tag names every layer; each is reused only once the source's bytes, read again, make its digest.
    assert step.stdout.count("verified to be the source's bytes: nothing sent (found via the tag)") == len(packaged), step.stdout
    assert (
        f"source bytes read to check the layers a record or the tag named: {sum(layer_sizes(deployed, packaged).values())}" in step.stdout
    )
    assert quay_proxy.count("PATCH") == 0


@dataclass
class UploadSessions:
    """The blob upload requests a proxy saw, by upload session (the id in `/blobs/uploads/<id>`)."""

    opened: int = 0  # POSTs that open a session (distribution's StartBlobUpload answers 202 with its URL)
    mounts: int = 0  # POSTs with ?mount= (cross-repo mounts: 201, no session)
    committed: dict[str, str] = field(default_factory=dict)  # session id -> the digest its final PUT committed
    patches: Counter[str] = field(default_factory=Counter)  # session id -> PATCHes
    cancelled: int = 0  # DELETEs of sessions


def blob_sessions(proxy: HttpProxy) -> UploadSessions:
    seen = UploadSessions()
    for method, target in proxy.requests:
        parts = urllib.parse.urlsplit(target)
        if "/blobs/uploads/" not in parts.path:
            continue
        session = parts.path.rsplit("/blobs/uploads/", 1)[1]
        query = urllib.parse.parse_qs(parts.query)
        if method == "POST" and "mount" in query:
            seen.mounts += 1
        elif method == "POST":
            seen.opened += 1
        elif method == "PATCH":
            seen.patches[session] += 1
        elif method == "PUT" and "digest" in query:
            assert session not in seen.committed, f"session {session} committed twice"
            seen.committed[session] = query["digest"][0]
        elif method == "DELETE":
            seen.cancelled += 1
    return seen


def one_session_per_blob(proxy: HttpProxy, what: str) -> tuple[UploadSessions, dict[str, str]]:
    """Every session opened committed a blob, and no blob took two sessions: returns the sessions and digest -> id."""
    seen = blob_sessions(proxy)
    digests = Counter(seen.committed.values())
    assert seen.opened == len(seen.committed) and seen.cancelled == 0, f"{what}: a session was opened and not committed: {seen}"
    assert max(digests.values()) == 1, f"{what}: a blob took more than one session: {digests}"
    return seen, {digest: session for session, digest in seen.committed.items()}


def test_one_get_per_file_goes_on_from_chunk_to_chunk(
    tmp_path: Path,
    run_step: StepRunner,
    deployed: Callable[[str], types.ModuleType],
    s3: S3Server,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    repo_name: str,
) -> None:
    """A chunked upload reads each file with one ranged GET that goes on from chunk to chunk: S3 is asked for the
    file's bytes once (a GET per chunk made moto read the whole object per chunk). A GET that breaks in the middle
    of a chunk is replaced by one from the byte it stopped at, inside the same PATCH: no retry, no new session."""
    size = 9 * MiB + 5
    model = os.urandom(size)
    chunks = -(-layer_sizes(deployed, {"model.safetensors": model})["model.safetensors"] // (2 * MiB))
    upload(s3, "ranges", {"m/model.safetensors": model, "m/config.json": b"{}"})
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as s3_proxy:
        args = stream_args(
            tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, "ranges", f"http://{s3_proxy.host}"
        )
        step = run_step("package", *args, env=s3.env())
        assert step.returncode == 0, step.stderr
        ranges = [value for path, value in s3_proxy.ranges if path.endswith("/model.safetensors")]
        assert ranges == [f"bytes=0-{size - 1}"], ranges
        assert quay_proxy.count("PATCH") >= 5 + 1, "the 9 MiB layer went in 2 MiB chunks (+ config.json)"
        clean = one_session_per_blob(quay_proxy, "fault-free run")

        s3_proxy.reset()
        quay_proxy.reset()
        broken = 3 * MiB  # inside the second 2 MiB chunk
        s3_proxy.add_fault("truncate_response", "GET", "/model.safetensors", at=broken)
        step = run_step("package", *args[:5], f"{quay_proxy.host}/{repo_name}-again:v1", *args[6:], env=s3.env())
        assert step.returncode == 0, step.stderr
        assert s3_proxy.fired
        ranges = [value for path, value in s3_proxy.ranges if path.endswith("/model.safetensors")]
    assert ranges == [f"bytes=0-{size - 1}", f"bytes={broken}-{size - 1}"], ranges
    assert f"model.safetensors: the source's GET broke at byte {broken} (" in step.stdout
    assert "retry" not in step.stdout and "new session" not in step.stdout and "2 GETs" in step.stdout
    faulted = one_session_per_blob(quay_proxy, "run with the broken GET")
    # "No session more", per blob: the session count of a whole run is not a constant. The resume record is rewritten
    # at every acknowledged chunk and every finished file, and its config (the base's plus the finished layers) is a
    # blob of its own: with two uploads in parallel, the record gets a config without any model layer (one session
    # more) only when the big file's first chunk is acknowledged before config.json is finished, a race of the two
    # threads (seen under CI load: 7 sessions in one run, 6 in the other). So each run is checked blob by blob: every
    # session opened committed a blob, no blob took two, the image's blobs are the same in both runs, the big file's
    # session took one PATCH per chunk (the broken GET re-sent nothing), and every other session committed a config
    # of the resume record.
    client = deployed("package").RegistryClient(
        quay.host, (quay.username, quay.password), [f"repository:{repo_name}:pull", f"repository:{repo_name}-again:pull"],
        plain_http=True, tls_context=ssl.create_default_context(), timeout=30, retry_delay=0.05,
    )  # fmt: skip
    images = []
    for (seen, by_digest), repo in ((clean, repo_name), (faulted, f"{repo_name}-again")):
        manifest = pull(quay, f"{quay.host}/{repo}:v1", tmp_path / f"image-{repo.rsplit('/', 1)[1]}").manifest
        titles = {layer["annotations"]["org.opencontainers.image.title"]: layer["digest"] for layer in manifest["layers"][1:]}
        image = {manifest["config"]["digest"], *titles.values()}
        assert image <= by_digest.keys(), f"{repo}: every blob of the image was uploaded in this run: {seen}"
        assert seen.patches[by_digest[titles["model.safetensors"]]] == chunks, f"{repo}: one PATCH per chunk: {seen}"
        assert seen.mounts == len(manifest["layers"]) - len(titles), f"{repo}: one mount per base layer"
        for digest in by_digest.keys() - image:
            config = json.loads(client.get_blob(repo, digest))
            assert config["config"]["Labels"]["quay.expires-after"], f"{repo}: {digest} is not a config of the resume record"
        images.append((manifest["config"]["digest"], titles))
    assert images[0] == images[1], "the same image, blob for blob"
    assert_image_holds(quay, f"{quay.host}/{repo_name}-again:v1", {"model.safetensors": model, "config.json": b"{}"}, tmp_path / "p")


@pytest.mark.parametrize(
    "checksums, size, kind",
    [(True, 3 * MiB, "sha256-base64"), (False, 3 * MiB, "md5"), (True, 11 * MiB, "crc32-multipart")],
    ids=["sha256", "etag-md5", "crc32-composite"],
)
def test_source_checksum_mismatch_aborts_the_blob(
    tmp_path: Path,
    run_step: StepRunner,
    s3: S3Server,
    quay: Registry,
    quay_proxy: HttpProxy,
    base_image: str,
    repo_name: str,
    checksums: bool,
    size: int,
    kind: str,
) -> None:
    """Only our own check stands between corrupt source bytes and the registry (botocore reads nothing)."""
    bucket = f"stream-bad-{kind}"
    upload(s3, bucket, {"m/model.safetensors": os.urandom(size), "m/config.json": b"{}"}, checksums)
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as s3_proxy:
        s3_proxy.add_fault("corrupt_response", "GET", "/model.safetensors", at=MiB, times=100)
        args = stream_args(tmp_path, quay, quay_proxy.host, via(quay_proxy, quay, base_image), repo_name, bucket, f"http://{s3_proxy.host}")
        step = run_step("package", *args, "--retries", 1, env=s3.env())
    assert step.returncode == 3, step.stderr
    assert "model.safetensors: source checksum mismatch" in step.error and "blob not committed" in step.error, step.stderr
    assert f"expected {kind} " in step.error
    assert "Traceback" not in step.stderr
    assert not tag_exists(quay, f"{quay.host}/{repo_name}:v1")
    assert quay_proxy.count("DELETE", "/blobs/uploads/") >= 1, "the upload session was cancelled"


def test_streams_from_hugging_face_with_revision_and_license(
    tmp_path: Path, run_step: StepRunner, quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    files = {"model.safetensors": os.urandom(3 * MiB + 3), "config.json": b'{"a": 1}', "tokenizer.json": b"{}"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(tmp_path / "hf-home")
    with run_hub(FakeHub("org/streamed", files, license="apache-2.0")) as hub:
        args = ["--source", "hf://org/streamed", "--hf-endpoint", hub.endpoint, "--image", f"{quay_proxy.host}/{repo_name}:v1",
                "--base-image", via(quay_proxy, quay, base_image), "--authfile", quay.authfile(tmp_path / "a.json", host=quay_proxy.host),
                "--plain-http", "--retry-delay", "0.05"]  # fmt: skip
        step = run_step("package", *args, env=env)
        assert step.returncode == 0, step.stderr
        assert "source sha256" in step.stdout and "source git-sha1" in step.stdout
        assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")
        notes = pull(quay, f"{quay.host}/{repo_name}:v1", tmp_path / "again").manifest["annotations"]
        assert notes["org.opencontainers.image.licenses"] == "apache-2.0"
        assert len(notes["org.opencontainers.image.revision"]) == 40
        assert not list(tmp_path.glob("**/model.safetensors")), "nothing of the model was written locally"

    with run_hub(FakeHub("org/streamed", files, corrupt={"model.safetensors"})) as hub:
        args[args.index("--hf-endpoint") + 1] = hub.endpoint
        args[args.index("--image") + 1] = f"{quay_proxy.host}/{repo_name}-bad:v1"
        step = run_step("package", *args, env=env)
    assert step.returncode == 3, step.stderr
    assert "model.safetensors: source checksum mismatch" in step.error
    assert not tag_exists(quay, f"{quay.host}/{repo_name}-bad:v1")
