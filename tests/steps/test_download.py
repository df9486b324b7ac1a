"""download.py against moto S3 (through a fault-injecting proxy) and a fake Hugging Face Hub."""

from __future__ import annotations

import io
import json
import os
import re
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from tests.fixtures.hf_hub import FakeHub, run_hub
from tests.fixtures.proxy import FaultKind, run_proxy
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import StepRunner

MiB = 1 << 20


def put_files(s3: S3Server, bucket: str, files: dict[str, bytes], multipart: bool = False, store_checksums: bool = True) -> None:
    client = s3.client(store_checksums)
    client.create_bucket(Bucket=bucket)
    for key, data in files.items():
        if multipart:
            config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
            client.upload_fileobj(io.BytesIO(data), bucket, key, Config=config)
        else:
            client.put_object(Bucket=bucket, Key=key, Body=data)


def s3_args(endpoint: str, bucket: str, dest: Path) -> list[object]:
    return ["--source", f"s3://{bucket}/m", "--dest", dest, "--endpoint-url", endpoint, "--max-workers", 4]


def cache_of(dest: Path) -> dict[str, dict[str, object]]:
    return json.loads((dest.parent / f".{dest.name}.digests.json").read_text())["files"]


def test_multipart_etag_verified_and_rerun_skips(
    tmp_path: Path, run_step: StepRunner, s3: S3Server, deployed: Callable[[str], types.ModuleType]
) -> None:
    big = os.urandom(11 * MiB + 3)
    put_files(s3, "multipart", {"m/model.safetensors": big}, multipart=True)
    dest = tmp_path / "models"
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as proxy:
        step = run_step("download", *s3_args(f"http://{proxy.host}", "multipart", dest), env=s3.env())
        assert step.returncode == 0, step.stderr
        assert "md5-multipart" in step.stdout and "-3" in step.stdout  # 3 parts: 5 + 5 + 1 MiB
        assert (dest / "model.safetensors").read_bytes() == big
        entry = cache_of(dest)["model.safetensors"]
        layer = deployed("download").LayerLayout.for_file("model.safetensors", len(big))
        assert entry["layer_size"] == layer.size and str(entry["layer_digest"]).startswith("sha256:")

        proxy.reset()
        step = run_step("download", *s3_args(f"http://{proxy.host}", "multipart", dest), env=s3.env())
        assert step.returncode == 0, step.stderr
        assert "already downloaded and verified" in step.stdout
        assert proxy.count("GET", "/model.safetensors") == 0


def test_checksum_sha256_and_consolidated_skipped(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    client = s3.client()
    client.create_bucket(Bucket="sha")
    files = {"model-00001-of-00001.safetensors": os.urandom(MiB), "consolidated.safetensors": os.urandom(MiB), "config.json": b"{}"}
    for rel, data in files.items():
        client.put_object(Bucket="sha", Key=f"m/{rel}", Body=data, ChecksumAlgorithm="SHA256")
    step = run_step("download", *s3_args(s3.endpoint, "sha", tmp_path / "models"), env=s3.env())
    assert step.returncode == 0, step.stderr
    assert "sha256-base64" in step.stdout
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["config.json", "model-00001-of-00001.safetensors"]


def test_tekton_style_arguments(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    """Array params expand to several values after one flag (or none); unset string params arrive as ""."""
    put_files(s3, "tekton-args", {"m/a.safetensors": b"1", "m/b/config.json": b"{}", "m/notes.md": b"x", "m/skip.json": b"{}"})
    dest = tmp_path / "models"
    args = ["--source", "s3://tekton-args/m", "--dest", dest, "--endpoint-url", s3.endpoint, "--region", ""]
    step = run_step("download", *args, "--include", "*.safetensors", "*.json", "--exclude", "skip.json", "--exclude", env=s3.env())
    assert step.returncode == 0, step.stderr
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == ["a.safetensors", "b/config.json"]


@pytest.mark.parametrize(
    ("fault", "store_checksums"),
    [
        ("corrupt_response", False),  # only the ETag (MD5) can tell: the step's own verification
        ("corrupt_response", True),  # the object has a CRC: botocore's response check trips first
        ("truncate_response", False),  # the connection drops mid-body on every attempt
    ],
)
def test_corrupt_or_partial_download_fails_cleanly(
    tmp_path: Path, run_step: StepRunner, s3: S3Server, fault: FaultKind, store_checksums: bool
) -> None:
    bucket = f"bad-{fault.split('_')[0]}-{'crc' if store_checksums else 'etag'}"
    put_files(s3, bucket, {"m/weights.bin": os.urandom(2 * MiB)}, store_checksums=store_checksums)
    dest = tmp_path / "models"
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as proxy:
        proxy.add_fault(fault, "GET", "/weights.bin", at=MiB, times=100)  # every attempt, so retries cannot save it
        step = run_step("download", *s3_args(f"http://{proxy.host}", bucket, dest), env=s3.env())
    assert "Traceback" not in step.stderr
    if fault == "corrupt_response":
        assert step.returncode == 3, step.stderr
        assert "checksum mismatch" in step.error and "weights.bin" in step.error
    else:
        assert step.returncode == 6, step.stderr
        assert "downloading s3://" in step.error and "weights.bin" in step.error
    assert not (dest / "weights.bin").exists()
    assert not [p for p in dest.rglob("*") if p.is_file()], "no partial file is left behind"


def test_dropped_transfer_is_retried(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    data = os.urandom(2 * MiB)
    put_files(s3, "flaky", {"m/weights.bin": data})
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as proxy:
        proxy.add_fault("truncate_response", "GET", "/weights.bin", at=MiB, times=1)
        step = run_step("download", *s3_args(f"http://{proxy.host}", "flaky", tmp_path / "models"), env=s3.env())
        assert proxy.fired, "the fault was injected"
    assert step.returncode == 0, step.stderr
    assert (tmp_path / "models" / "weights.bin").read_bytes() == data


def test_wrong_credentials(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    put_files(s3, "creds", {"m/a.json": b"{}"})
    step = run_step("download", *s3_args(s3.endpoint, "creds", tmp_path / "m"), env=s3.env(secret_key="wrong-secret"))
    assert step.returncode == 4
    assert "rejected the credentials" in step.error and "SignatureDoesNotMatch" in step.error
    assert "Traceback" not in step.stderr


def test_missing_credentials(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    env = {k: v for k, v in s3.env().items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # CI machines in a cloud must not answer from instance metadata
    step = run_step("download", *s3_args(s3.endpoint, "creds", tmp_path / "m"), env=env)
    assert step.returncode == 4 and "AWS_ACCESS_KEY_ID" in step.error


def test_missing_bucket(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    step = run_step("download", *s3_args(s3.endpoint, "no-such-bucket", tmp_path / "m"), env=s3.env())
    assert step.returncode == 5
    assert "NoSuchBucket" in step.error and "s3://no-such-bucket/m/" in step.error


def test_empty_prefix(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    s3.client().create_bucket(Bucket="empty")
    step = run_step("download", *s3_args(s3.endpoint, "empty", tmp_path / "m"), env=s3.env())
    assert step.returncode == 5 and "no objects" in step.error


HF_FILES = {
    "config.json": b'{"architectures": ["MistralForCausalLM"]}',
    "model-00001-of-00002.safetensors": os.urandom(MiB + 1),
    "model-00002-of-00002.safetensors": os.urandom(MiB // 2),
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "consolidated.safetensors": os.urandom(MiB),
    "tokenizer.json": b"{}",
    "README.md": b"# model card",
}


def hf_env(tmp_path: Path, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(tmp_path / "hf-home")
    if token:
        env["HF_TOKEN"] = token
    return env


def test_hf_snapshot_verified(tmp_path: Path, run_step: StepRunner) -> None:
    dest = tmp_path / "ws" / "models"
    with run_hub(FakeHub("mistralai/Mistral-Small", HF_FILES, token="hf_secret")) as hub:
        args = ["--source", "hf://mistralai/Mistral-Small", "--dest", dest, "--hf-endpoint", hub.endpoint]
        args += ["--result-size", tmp_path / "size", "--revision", "", "--endpoint-url", "", "--include"]  # unset Tekton params
        step = run_step("download", *args, env=hf_env(tmp_path, "hf_secret"))
        assert step.returncode == 0, step.stderr
        expected = {r for r in HF_FILES if r not in ("consolidated.safetensors", "README.md")}
        assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and ".cache" not in p.parts} == expected
        for rel in expected:
            assert (dest / rel).read_bytes() == HF_FILES[rel]
        assert (tmp_path / "size").read_text() == str(sum(len(HF_FILES[r]) for r in expected))
        assert "consolidated.safetensors" not in hub.downloads
        assert set(cache_of(dest)) == expected

        hub.downloads.clear()
        step = run_step("download", *args, env=hf_env(tmp_path, "hf_secret"))
        assert step.returncode == 0, step.stderr
        assert hub.downloads == [], "verified files are not downloaded again"


def test_hf_corrupt_file_detected(tmp_path: Path, run_step: StepRunner) -> None:
    dest = tmp_path / "models"
    with run_hub(FakeHub("org/model", HF_FILES, corrupt={"model-00002-of-00002.safetensors"})) as hub:
        step = run_step("download", "--source", "hf://org/model", "--dest", dest, "--hf-endpoint", hub.endpoint, env=hf_env(tmp_path))
    assert step.returncode == 3
    assert "model-00002-of-00002.safetensors: checksum mismatch" in step.error
    assert not (dest / "model-00002-of-00002.safetensors").exists()


def test_hf_private_repo_without_token(tmp_path: Path, run_step: StepRunner) -> None:
    with run_hub(FakeHub("org/gated", HF_FILES, token="hf_secret")) as hub:
        args = ["--source", "hf://org/gated", "--dest", tmp_path / "m", "--hf-endpoint", hub.endpoint]
        step = run_step("download", *args, env=hf_env(tmp_path))
    assert step.returncode == 4
    assert "not accessible" in step.error and "HF_TOKEN is not set" in step.error


def test_file_above_the_maximum_layer_size_is_refused_before_downloading(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    put_files(s3, "too-large", {"m/model.safetensors": os.urandom(2 * MiB), "m/config.json": b"{}"})
    dest = tmp_path / "models"
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as proxy:
        step = run_step("download", *s3_args(f"http://{proxy.host}", "too-large", dest), "--max-layer-size", "2MiB", env=s3.env())
        assert step.returncode == 1, step.stderr
        assert "model.safetensors: 2.0 MiB (2097152 bytes) makes a" in step.error and "maxLayerSize" in step.error
        assert proxy.count("GET", "/model.safetensors") == 0
    assert not dest.exists() or not any(dest.iterdir())


def hf_files(run_step: StepRunner, tmp_path: Path, repo: str, files: dict[str, bytes], *include: str) -> tuple[int, str, set[str]]:
    dest = tmp_path / repo.replace("/", "-")
    with run_hub(FakeHub(repo, files)) as hub:
        args = ["--source", f"hf://{repo}", "--dest", dest, "--hf-endpoint", hub.endpoint]
        step = run_step("download", *args, *(["--include", *include] if include else []), env=hf_env(tmp_path))
    got = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and ".cache" not in p.parts} if dest.exists() else set()
    return step.returncode, step.error or step.stdout, got


def test_bin_only_repository_is_downloaded_completely(tmp_path: Path, run_step: StepRunner) -> None:
    files = {"pytorch_model.bin": os.urandom(4096), "config.json": b"{}", "tokenizer.json": b"{}"}
    code, out, got = hf_files(run_step, tmp_path, "org/bin-only", files)
    assert code == 0, out
    assert got == set(files)


def test_pytorch_copies_are_skipped_next_to_safetensors(tmp_path: Path, run_step: StepRunner) -> None:
    files = {"model.safetensors": os.urandom(4096), "pytorch_model.bin": os.urandom(4096), "config.json": b"{}"}
    code, out, got = hf_files(run_step, tmp_path, "org/both", files)
    assert code == 0, out
    assert got == {"model.safetensors", "config.json"}


def test_remote_code_is_included_or_refused(tmp_path: Path, run_step: StepRunner) -> None:
    config = json.dumps({"auto_map": {"AutoModelForCausalLM": "modeling_foo.FooForCausalLM", "AutoConfig": "configuration_foo.FooConfig"}})
    files = {"model.safetensors": os.urandom(4096), "config.json": config.encode(), "modeling_foo.py": b"", "configuration_foo.py": b""}
    code, out, got = hf_files(run_step, tmp_path, "org/remote-code", files)
    assert code == 0, out
    assert got == set(files)
    code, out, _ = hf_files(run_step, tmp_path / "narrow", "org/remote-code", files, "*.safetensors", "*.json")
    assert code == 1
    assert "config.json's auto_map needs configuration_foo.py, modeling_foo.py, which the include patterns leave out" in out


def test_include_without_weights_is_refused(tmp_path: Path, run_step: StepRunner) -> None:
    files = {"model.safetensors": os.urandom(4096), "config.json": b"{}"}
    code, out, got = hf_files(run_step, tmp_path, "org/no-weights", files, "*.json")
    assert code == 1 and "select none of the weight files (model.safetensors)" in out
    assert not got, "refused before downloading"


def test_hf_revision_and_license_results(tmp_path: Path, run_step: StepRunner) -> None:
    files = {"model.safetensors": os.urandom(4096), "config.json": b"{}"}
    with run_hub(FakeHub("org/licensed", files, license="apache-2.0")) as hub:
        args = ["--source", "hf://org/licensed", "--dest", tmp_path / "m", "--hf-endpoint", hub.endpoint]
        results = ["--result-revision", tmp_path / "revision", "--result-license", tmp_path / "license"]
        step = run_step("download", *args, *results, env=hf_env(tmp_path))
    assert step.returncode == 0, step.stderr
    assert re.fullmatch(r"[0-9a-f]{40}", (tmp_path / "revision").read_text())
    assert (tmp_path / "license").read_text() == "apache-2.0"


def test_s3_writes_empty_revision_and_license(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    put_files(s3, "no-card", {"m/model.safetensors": os.urandom(4096)})
    results = ["--result-revision", tmp_path / "revision", "--result-license", tmp_path / "license"]
    step = run_step("download", *s3_args(s3.endpoint, "no-card", tmp_path / "m"), *results, env=s3.env())
    assert step.returncode == 0, step.stderr
    assert (tmp_path / "revision").read_text() == "" and (tmp_path / "license").read_text() == ""
