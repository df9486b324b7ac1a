"""models[].mountInEnv reads the weights the pipeline packaged: a modelcar built by the package step (as the pipeline
runs it, into a local docker-registry), pulled by digest with buildah on private vfs storage, mounted, and read at the
folder the pods' image volume mounts (`subPath` components/pod.py model_volumes gives it): every file's sha256 equals
the source weights'. The kubelet's own image-volume mount is the runtime's (CRI-O: the image's root filesystem, read
only); podman, whose `--mount type=image` is that mount, is not installed here, so buildah's mount of the same image
stands in for it (root: vfs storage and `buildah mount` outside a user namespace)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pulumi_kubernetes as k8s
import pytest

from components import pod
from stacks.config import ModelConfig
from tests.fixtures.registry import Registry
from tests.steps.conftest import SMALL_MODEL, StepRunner, needs_registry, needs_skopeo, write_model

pytestmark = [needs_registry, needs_skopeo, pytest.mark.root, pytest.mark.skipif(not shutil.which("buildah"), reason="no buildah")]


def buildah(storage: Path, *args: str) -> str:
    flags = ["--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver", "vfs"]
    return subprocess.run(["buildah", *flags, *args], capture_output=True, text=True, timeout=300, check=True).stdout.strip()


def model_config(image: str, path: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "small",
            "source": {"huggingFace": {"repo": "org/small"}},
            "sizeGi": 1,
            "quayRepository": "quay.io/org/small",
            "tag": "v1",
            "registration": {"modelName": "small", "versionName": "v1"},
            "mountInEnv": path,
            "registeredImage": image,
        }
    )


def test_the_mounted_folder_of_the_packaged_modelcar_holds_the_source_weights(
    tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str
) -> None:
    model = tmp_path / "ws" / "models"
    files = write_model(model, SMALL_MODEL, seed=49)
    authfile = quay.authfile(tmp_path / "auth.json", host=quay.host)
    # the package step as the pipeline runs it (components/model_pipeline.py): its IMAGE_DIGEST result is what the
    # register step records (`oci://<repo>@<digest>`) and what registeredImage pins
    done = run_step(
        "package",
        "--model-dir", model, "--image", f"{quay.host}/models/mounted:v1", "--base-image", base_image,
        "--authfile", authfile, "--plain-http", "--result-digest", tmp_path / "digest",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    digest = (tmp_path / "digest").read_text().strip()
    image = f"{quay.host}/models/mounted@{digest}"
    # the pods' volume and mount, as the render gives them
    ((volume,), (mount,)) = pod.model_volumes([model_config(image, "/models/small")])
    source, sub_path = volume.image, mount.sub_path
    assert isinstance(source, k8s.core.v1.ImageVolumeSourceArgs) and isinstance(sub_path, str)
    assert source.reference == image and mount.read_only
    storage = tmp_path / "storage"
    container = buildah(
        storage, "from", "--tls-verify=false", "--creds", f"{quay.username}:{quay.password}", "--pull-always", f"docker://{image}"
    )
    try:
        root = Path(buildah(storage, "mount", container))
        folder = root / sub_path
        read = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}
        assert read == {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
        assert not (folder / "bin").exists(), "the subPath is the model's folder, not the image's root"
    finally:
        subprocess.run(
            ["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver", "vfs", "rm", container],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(storage, ignore_errors=True)
