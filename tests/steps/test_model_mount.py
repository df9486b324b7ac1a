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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi_kubernetes as k8s
import pytest

from components import pod
from stacks.config import ModelConfig
from tests.fixtures.registry import Registry
from tests.podsim.pods import PodSim, missing_requirements, render_stack
from tests.steps.conftest import SMALL_MODEL, StepRunner, needs_registry, needs_skopeo, write_model

PODSIM_REASON = missing_requirements()

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


@dataclass
class Modelcar:
    image: str
    """The packaged image by digest, as registeredImage pins it."""
    root: Path
    """`buildah mount` of it: the image's root filesystem."""
    files: dict[str, bytes]


@pytest.fixture(scope="module")
def modelcar(tmp_path_factory: pytest.TempPathFactory, run_step: StepRunner, quay: Registry, base_image: str) -> Iterator[Modelcar]:
    """A modelcar the package step builds as the pipeline runs it (components/model_pipeline.py), pulled by its digest
    (the step's IMAGE_DIGEST result, which the register step records as `oci://<repo>@<digest>`) with buildah on
    private vfs storage and mounted."""
    tmp = tmp_path_factory.mktemp("modelcar")
    model = tmp / "ws" / "models"
    files = write_model(model, SMALL_MODEL, seed=49)
    authfile = quay.authfile(tmp / "auth.json", host=quay.host)
    done = run_step(
        "package",
        "--model-dir", model, "--image", f"{quay.host}/models/mounted:v1", "--base-image", base_image,
        "--authfile", authfile, "--plain-http", "--result-digest", tmp / "digest",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    image = f"{quay.host}/models/mounted@{(tmp / 'digest').read_text().strip()}"
    storage = tmp / "storage"
    container = buildah(
        storage, "from", "--tls-verify=false", "--creds", f"{quay.username}:{quay.password}", "--pull-always", f"docker://{image}"
    )
    try:
        yield Modelcar(image, Path(buildah(storage, "mount", container)), files)
    finally:
        flags = ["--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver", "vfs"]
        subprocess.run(["buildah", *flags, "rm", container], capture_output=True, timeout=120)
        shutil.rmtree(storage, ignore_errors=True)


def sha256s(files: dict[str, bytes]) -> dict[str, str]:
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


def test_the_mounted_folder_of_the_packaged_modelcar_holds_the_source_weights(modelcar: Modelcar) -> None:
    # the pods' volume and mount, as the render gives them
    ((volume,), (mount,)) = pod.model_volumes([model_config(modelcar.image, "/models/small")])
    source, sub_path = volume.image, mount.sub_path
    assert isinstance(source, k8s.core.v1.ImageVolumeSourceArgs) and isinstance(sub_path, str)
    assert source.reference == modelcar.image and mount.read_only
    folder = modelcar.root / sub_path
    read = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}
    assert read == sha256s(modelcar.files)
    assert not (folder / "bin").exists(), "the subPath is the model's folder, not the image's root"


def mounted_variant(image: str) -> Callable[[dict[str, Any]], None]:
    def mutate(objects: dict[str, Any]) -> None:
        objects["cluster"]["imageVolumes"] = True
        objects["models"][0].update(mountInEnv="/models/small", registeredImage=image)
        objects["access"] = {**objects["access"], "vscode": False, "jupyter": False, "tensorboard": False}

    return mutate


def drop_image_volumes(result: Any) -> None:
    """What an API server with the ImageVolume gate off stores (kubernetes pkg/api/pod/util.go dropImageVolumes): the
    pod template without its image volumes and their mounts; the env the render gave the container stays."""
    sts = next(r for r in result.resources if r.kind == "StatefulSet")
    spec = sts.inputs["spec"]["template"]["spec"]
    dropped = {v["name"] for v in spec["volumes"] if "image" in v}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in dropped]
    for container in spec["containers"]:
        container["volumeMounts"] = [m for m in container.get("volumeMounts", []) if m["name"] not in dropped]


@pytest.mark.skipif(PODSIM_REASON is not None, reason=f"simulated pods: {PODSIM_REASON}")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("served", [True, False])
def test_every_rank_reads_the_model_and_status_names_its_digest(modelcar: Modelcar, served: bool) -> None:
    """barcelona's two pods from the render with the model mounted (PodSim mounts the image's root as the runtime
    would, with the mount's subPath, read-only): each pod reads the source's bytes at the path, writes fail, and
    `ml-dev status` lists the model with its digest. With the gate off (the volume dropped) the env still names the
    model: `ml-dev status` says NOT MOUNTED and exits 1."""
    result = render_stack("barcelona", mounted_variant(modelcar.image))
    if not served:
        drop_image_volumes(result)
    sim = PodSim(result, count=2, images={modelcar.image: modelcar.root})
    try:
        sim.start()
        digest = modelcar.image.rpartition("@")[2]
        status = sim.exec(0, "python3 /opt/ml-dev-env/ml-dev status", timeout=120)
        assert "models mounted from their images (read-only, every pod):" in status.stdout, status.stdout + status.stderr
        line = f"mistral-small-24b-w4a16 at /models/small ({digest})"
        if served:
            assert f"  {line}\n" in status.stdout and status.returncode == 0, status.stdout + status.stderr
            for i in range(2):
                listed = sim.exec(i, "cd /models/small && find . -type f -exec sha256sum {} +", timeout=60).stdout.split("\n")
                read = {rel.removeprefix("./"): h for h, _, rel in (x.partition("  ") for x in listed if x)}
                assert read == sha256s(modelcar.files), i
                write = sim.exec(i, "touch /models/small/x", timeout=30)
                assert write.returncode != 0 and "Read-only file system" in write.stderr
        else:
            assert f"{line} - NOT MOUNTED in this pod" in status.stdout and status.returncode == 1, status.stdout
    finally:
        sim.stop()
