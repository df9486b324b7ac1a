"""wait_image: holds the pipeline until the tools image exists (token flow and Basic auth)."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.registry import Registry
from tests.steps.conftest import StepRunner, needs_registry

pytestmark = [needs_registry]


def token_file(tmp_path: Path, secret: str) -> Path:
    path = tmp_path / "token"
    path.write_text(secret + "\n")
    return path


def test_existing_image_returns_at_once(tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str) -> None:
    step = run_step(
        "wait_image",
        "--image",
        base_image,
        "--token-file",
        token_file(tmp_path, quay.password),
        "--username",
        quay.username,
        "--plain-http",
        "--timeout",
        "30",
    )
    assert step.returncode == 0, step.stderr
    assert f"{base_image} is available" in step.stdout


def test_missing_image_times_out_with_a_clear_error(tmp_path: Path, run_step: StepRunner, internal: Registry) -> None:
    image = f"{internal.host}/nccl-test/ml-dev-env-tools:tools-0000000000"
    step = run_step(
        "wait_image",
        "--image",
        image,
        "--token-file",
        token_file(tmp_path, internal.password),
        "--plain-http",
        "--timeout",
        "1",
        "--interval",
        "0.2",
    )
    assert step.returncode == 5, step.stderr
    assert step.error == f"ERROR: {image} did not appear within 1 s (is its BuildConfig failing?)"
    assert "waiting for" in step.stdout


def test_wrong_token_is_an_auth_error(tmp_path: Path, run_step: StepRunner, quay: Registry, base_image: str) -> None:
    step = run_step(
        "wait_image",
        "--image",
        base_image,
        "--token-file",
        token_file(tmp_path, "expired"),
        "--username",
        quay.username,
        "--plain-http",
        "--timeout",
        "5",
    )
    assert step.returncode == 4, step.stderr
    assert "credentials rejected by token service (HTTP 401)" in step.error
