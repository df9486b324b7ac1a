"""Local-file edge cases of the steps: full disks, files rewritten behind the digest cache, symbolic links."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.images import pull
from tests.fixtures.registry import Registry
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import StepRun, StepRunner, needs_registry, needs_skopeo, write_model
from tests.steps.test_download import put_files, s3_args
from tests.steps.test_package import assert_image_holds, package_args

Model = tuple[Path, dict[str, bytes]]


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs filled to the last byte (needs root to mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill it needs root")
    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN)")
    try:
        (mount / "dir").mkdir()
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def assert_one_line(step: StepRun, *parts: str) -> None:
    assert step.returncode == 1, step.stderr
    assert "Traceback" not in step.stderr, step.stderr
    for part in parts:
        assert part in step.error, step.error


def test_download_into_a_full_disk(tmp_path: Path, run_step: StepRunner, s3: S3Server, full_disk: Path) -> None:
    put_files(s3, "disk-full", {"m/model.safetensors": os.urandom(256 << 10)})
    dest = full_disk / "dir" / "models"
    step = run_step("download", *s3_args(s3.endpoint, "disk-full", dest), "--digest-cache", tmp_path / "cache.json", env=s3.env())
    assert_one_line(step, "ERROR: cannot", str(full_disk / "dir"), "No space left on device")


@needs_registry
@needs_skopeo
@pytest.mark.parametrize("where", ["--digest-cache", "--result-digest"])
def test_package_with_a_full_disk(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str, model_dir: Model, repo_name: str, full_disk: Path, where: str
) -> None:
    model, _ = model_dir
    target = full_disk / "dir" / "file"
    step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, repo_name, model), where, target)
    what = "digest cache" if where == "--digest-cache" else "result file"
    assert_one_line(step, f"ERROR: cannot write {what} {target}: No space left on device")


@needs_registry
@needs_skopeo
def test_file_rewritten_with_the_same_size_and_mtime_is_not_packaged_stale(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str, model_dir: Model, repo_name: str
) -> None:
    model, files = model_dir
    step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, repo_name, model))
    assert step.returncode == 0, step.stderr
    shard = model / "model-00002-of-00002.safetensors"
    before = shard.stat()
    files["model-00002-of-00002.safetensors"] = new = os.urandom(before.st_size)
    shard.write_bytes(new)  # same size, in place (same inode) ...
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... and the old mtime
    step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, repo_name, model))
    assert step.returncode == 0, step.stderr
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_symlink_out_of_the_model_dir_is_refused(tmp_path: Path, run_step: StepRunner) -> None:
    model = tmp_path / "models"
    write_model(model, {"config.json": 10})
    (model / "token").symlink_to("/var/run/secrets/kubernetes.io/serviceaccount/token")
    step = run_step("package", "--model-dir", model, "--image", "127.0.0.1:1/x/y:v1", "--base-image", "127.0.0.1:1/b:1", "--plain-http")
    assert step.returncode == 1, step.stderr
    assert "token is a symbolic link to /var/run/secrets/kubernetes.io/serviceaccount/token, outside the model directory" in step.error


def test_dangling_symlink_is_reported(tmp_path: Path, run_step: StepRunner) -> None:
    model = tmp_path / "models"
    write_model(model, {"config.json": 10})
    (model / "weights.safetensors").symlink_to("missing.safetensors")
    step = run_step("package", "--model-dir", model, "--image", "127.0.0.1:1/x/y:v1", "--base-image", "127.0.0.1:1/b:1", "--plain-http")
    assert step.returncode == 5, step.stderr
    assert "weights.safetensors is a dangling symbolic link (to missing.safetensors)" in step.error


@needs_registry
@needs_skopeo
def test_symlink_inside_is_packaged_as_a_link(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str, repo_name: str
) -> None:
    model = tmp_path / "models"
    files = write_model(model, {"original/model.safetensors": 70_000, "config.json": 10})
    (model / "model.safetensors").symlink_to(model / "original" / "model.safetensors")  # absolute, inside
    step = run_step("package", *package_args(tmp_path, quay, quay.host, base_image, repo_name, model))
    assert step.returncode == 0, step.stderr
    pulled = pull(quay, f"{quay.host}/{repo_name}:v1", tmp_path / "pulled")
    entries = {}
    for layer in pulled.manifest["layers"][1:]:
        with tarfile.open(fileobj=io.BytesIO(pulled.blob_path(layer["digest"]).read_bytes())) as tar:
            entry = tar.getmembers()[-1]
            entries[entry.name] = entry
    assert set(entries) == {"models/config.json", "models/model.safetensors", "models/original/model.safetensors"}
    link = entries["models/model.safetensors"]
    assert link.issym() and link.linkname == "original/model.safetensors" and link.size == 0
    sizes = {layer["annotations"]["org.opencontainers.image.title"]: layer["size"] for layer in pulled.manifest["layers"][1:]}
    assert sizes["model.safetensors"] <= 10240 < sizes["original/model.safetensors"], "the bytes are stored once"
    assert len(files) == 2
