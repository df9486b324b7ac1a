"""Every rendered object of every stack (and of the tested variants) passes the strict schema check."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import STACKS, run_objects, stack_objects, tcp_shared_variant
from tests.fixtures import schema_check
from tools import render


def _token_variant(o: dict[str, Any]) -> None:
    o["access"] = {"auth": "token", "tensorboard": False}


def _privileged_variant(o: dict[str, Any]) -> None:
    o["security"]["memlock"] = {"mode": "privileged"}
    o["security"]["createServiceAccount"] = False
    o["cluster"]["createNamespace"] = True
    o["network"]["rdma"].update(createAttachments=True, subnets=["10.0.103.0/24", "10.0.104.0/24", "10.0.105.0/24", "10.0.106.0/24"])


RUNTIME_DIGEST = "image-registry.openshift-image-registry.svc:5000/ml-dev/runtime@sha256:" + "ab" * 32


def _pre_pull_daemonset_variant(o: dict[str, Any]) -> None:
    """barcelona builds its image: the DaemonSet pulls the built runtime tag on the listed GPU nodes."""
    o["image"]["prePull"] = "daemonSet"
    o["nodes"]["gpuNodes"] = ["gpu-a", "gpu-b"]


def _pinned_image_set_variant(o: dict[str, Any]) -> None:
    o["image"] = {"reference": RUNTIME_DIGEST, "prePull": "pinnedImageSet", "machineConfigPool": "gpu"}


def _model_mount_variant(o: dict[str, Any]) -> None:
    """models[].mountInEnv: an image volume (`volumes[].image`, the vendored 1.33 PodSpec knows it) mounted with subPath."""
    o["cluster"]["imageVolumes"] = True
    o["models"][0].update(mountInEnv="/models/mistral", registeredImage=RUNTIME_DIGEST.replace("runtime", "mistral"))


VARIANTS: dict[str, tuple[str, Callable[[dict[str, Any]], None] | None]] = {
    **{stack: (stack, None) for stack in STACKS},
    "barcelona-tcp-shared": ("barcelona", tcp_shared_variant),
    "barcelona-token": ("barcelona", _token_variant),
    "barcelona-privileged-nads": ("barcelona", _privileged_variant),
    "barcelona-prepull-daemonset": ("barcelona", _pre_pull_daemonset_variant),
    "barcelona-model-mount": ("barcelona", _model_mount_variant),
    "nerc-production-pinned-image-set": ("nerc-production", _pinned_image_set_variant),
}
SECRET = "s3cret-value-that-must-not-leak"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_objects_pass_strict_schema_check(variant: str, tmp_path: Path) -> None:
    stack, mutate = VARIANTS[variant]
    objects = stack_objects(stack)
    if mutate:
        mutate(objects)
    result = run_objects(stack, objects, {"vscodePassword": SECRET, "jupyterToken": SECRET})
    assert result.error is None, result.error
    written = render.write(result, tmp_path / variant)
    assert len(written) >= 10
    proc = schema_check.check(str(tmp_path / variant))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"summary: {len(written)} ok, 0 invalid" in proc.stdout
    # secrets never reach rendered files or outputs
    for path in (tmp_path / variant).iterdir():
        assert SECRET not in path.read_text(), path.name
    assert SECRET not in json.dumps(result.outputs)


def test_render_cli_writes_one_file_per_object(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(Path(render.__file__)), "nerc-production", "--out", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(p.name for p in (tmp_path / "nerc-production").iterdir())
    assert "statefulset-ml-dev-env.yaml" in files and "route-ml-dev-env-vscode.yaml" in files
    assert "vscode_url: https://ml-dev-env-vscode-coops-767192.apps.shift.nerc.mghpcc.org" in proc.stdout
    assert f"== {len(files)} Kubernetes objects written to " in proc.stdout, proc.stdout


def test_render_fails_on_a_mandatory_policy_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    real = render.run_program

    def unpinned(*args: Any, **kwargs: Any):
        result = real(*args, **kwargs)
        sts = next(r for r in result.resources if r.typ == "kubernetes:apps/v1:StatefulSet")
        sts.inputs["spec"]["template"]["spec"]["containers"][0]["image"] = "quay.io/org/ml-dev-env:latest"
        return result

    monkeypatch.setattr(render, "run_program", unpinned)
    assert render.render("nerc-production", tmp_path, validate=False) == 1
    out = capsys.readouterr()
    assert "images-pinned" in out.out and "violates a mandatory policy" in out.err
