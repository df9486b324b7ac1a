"""End to end: S3 → download → package (push to "Quay") → mirror ("internal") → register, then
pull the image back and check it byte by byte."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.fixtures.images import pull, unpack_rootfs
from tests.fixtures.model_registry import ModelRegistryStandIn
from tests.fixtures.proxy import HttpProxy
from tests.fixtures.registry import Registry
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import StepRunner, needs_registry, needs_skopeo

pytestmark = [needs_registry, needs_skopeo]

LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"


def upload_model(s3: S3Server, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    for i, (rel, data) in enumerate(sorted(files.items())):
        extra = {"ChecksumAlgorithm": "SHA256"} if i % 2 else {}
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data, **extra)


def blob_uploads(proxy: HttpProxy) -> int:
    """Requests that carry or commit blob data (cross-repo mounts are POSTs with ?mount=)."""
    return proxy.count("PATCH") + proxy.count("PUT", "/blobs/") + sum(1 for m, p in proxy.requests if m == "POST" and "mount=" not in p)


@pytest.mark.root  # its last step runs the image in a chroot
def test_s3_to_registered_modelcar(
    tmp_path: Path,
    run_step: StepRunner,
    s3: S3Server,
    quay: Registry,
    quay_proxy: HttpProxy,
    internal: Registry,
    base_image: str,
    model_registry: ModelRegistryStandIn,
    model_dir: tuple[Path, dict[str, bytes]],
    repo_name: str,
    has_chroot: bool,
) -> None:
    _, files = model_dir
    upload_model(s3, "models", "mistral/v1", files)
    workspace = tmp_path / "pvc"
    models = workspace / "models"
    results = tmp_path / "results"
    results.mkdir()

    # 1. download from S3 into the workspace, verified
    step = run_step(
        "download", "--source", "s3://models/mistral/v1", "--dest", models, "--endpoint-url", s3.endpoint,
        "--result-size", results / "size", env=s3.env(),
    )  # fmt: skip
    assert step.returncode == 0, step.stderr
    assert (results / "size").read_text() == str(sum(len(d) for d in files.values()))
    for rel, data in files.items():
        assert (models / rel).read_bytes() == data

    # 2. package and push to "Quay" through the counting proxy (bearer-token auth)
    authfile = quay.authfile(tmp_path / "quay-auth.json", host=quay_proxy.host)
    base = base_image.replace(quay.host, quay_proxy.host)
    image = f"{quay_proxy.host}/{repo_name}:v1"
    package_args = [
        "--model-dir", models, "--image", image, "--base-image", base, "--authfile", authfile, "--plain-http",
        "--result-digest", results / "digest", "--result-image", results / "image",
    ]  # fmt: skip
    step = run_step("package", *package_args)
    assert step.returncode == 0, step.stderr
    digest = (results / "digest").read_text()
    assert digest.startswith("sha256:") and digest in step.stdout
    assert (results / "image").read_text() == f"{quay_proxy.host}/{repo_name}@{digest}"
    assert quay_proxy.count("POST", "mount=") == 1, "base layer is cross-repo mounted, not copied"
    assert blob_uploads(quay_proxy) > 0

    # 3. a second run finds every blob (digests from the cache) and uploads nothing
    quay_proxy.reset()
    step = run_step("package", *package_args)
    assert step.returncode == 0, step.stderr
    assert (results / "digest").read_text() == digest
    assert blob_uploads(quay_proxy) == 0, quay_proxy.requests
    assert quay_proxy.count("HEAD", "/blobs/") == len(files) + 2  # model layers, base layer, config

    # 4. mirror to the "internal registry" by digest, with a service-account token file
    token = tmp_path / "token"
    token.write_text(internal.password + "\n")
    dest = f"{internal.host}/ml-dev/mistral:v1"
    step = run_step(
        "mirror", "--src", f"{quay.host}/{repo_name}@{digest}", "--dest", dest, "--src-authfile", quay.authfile(tmp_path / "src.json"),
        "--dest-token-file", token, "--no-src-tls-verify", "--no-dest-tls-verify", "--tmpdir", tmp_path / "skopeo-tmp",
        "--result-digest", results / "mirrored", "--result-image", results / "internal-image",
    )  # fmt: skip
    assert step.returncode == 0, step.stderr
    assert (results / "mirrored").read_text() == digest
    internal_image = (results / "internal-image").read_text()
    assert internal_image == f"{internal.host}/ml-dev/mistral@{digest}"

    # 5. register oci://…@sha256:… in the model registry
    step = run_step(
        "register", "--registry-url", model_registry.url, "--model-name", "Mistral-Small-24B", "--version", "v1",
        "--image", internal_image, "--base-model", "mistralai/Mistral-Small-24B-Instruct-2501", "--quantization", "w4a16",
        "--source", "s3://models/mistral/v1", "--result-version-id", results / "version",
    )  # fmt: skip
    assert step.returncode == 0, step.stderr
    (artifact,) = model_registry.objects["model_artifact"].values()
    assert artifact["uri"] == f"oci://{internal_image}"
    assert artifact["modelFormatName"] == "ModelCar"
    version = model_registry.objects["model_version"][(results / "version").read_text()]
    assert version["customProperties"]["quantization"]["string_value"] == "w4a16"

    # 6. pull the mirrored image back and check it
    pulled = pull(internal, dest, tmp_path / "pulled")
    assert pulled.manifest_digest == digest
    base_layers, model_layers = pulled.manifest["layers"][:1], pulled.manifest["layers"][1:]
    assert base_layers[0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert [layer["annotations"]["org.opencontainers.image.title"] for layer in model_layers] == sorted(files)
    assert pulled.config["rootfs"]["diff_ids"][1:] == [layer["digest"] for layer in model_layers]
    for layer in model_layers:
        assert layer["mediaType"] == LAYER_TAR  # uncompressed
        rel = layer["annotations"]["org.opencontainers.image.title"]
        blob = pulled.blob_path(layer["digest"]).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == layer["digest"].split(":")[1]
        assert blob[257:265] == b"ustar  \0", "GNU tar magic"
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            members = tar.getmembers()
            assert members[0].name == "models" and members[0].isdir() and members[0].mode == 0o775
            entry = members[-1]
            assert (entry.name, entry.mode, entry.mtime, entry.uid, entry.gid) == (f"models/{rel}", 0o644, 0, 0, 0)
            extracted = tar.extractfile(entry)
            assert extracted is not None
            assert hashlib.sha256(extracted.read()).digest() == hashlib.sha256(files[rel]).digest()

    # 7. the image runs: its shell sees the weights under /models
    if not has_chroot:
        pytest.skip("running the image needs root and chroot")
    rootfs = unpack_rootfs(pulled, tmp_path / "rootfs")
    out = subprocess.run(
        ["chroot", str(rootfs), "/bin/sh", "-c", "cd /models && sha256sum config.json tokenizer/tokenizer.json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert out.split()[::2] == [hashlib.sha256(files[r]).hexdigest() for r in ("config.json", "tokenizer/tokenizer.json")]
