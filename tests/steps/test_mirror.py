"""mirror.py: skopeo copy --preserve-digests from the token-auth "Quay" to the Basic-auth "internal" registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.registry import Registry
from tests.steps.conftest import StepRunner, needs_registry, needs_skopeo

pytestmark = [needs_registry, needs_skopeo]


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory, run_step: StepRunner, quay: Registry, base_image: str) -> str:
    """A modelcar in "Quay", by digest."""
    work = tmp_path_factory.mktemp("mirror-src")
    (work / "models").mkdir()
    (work / "models" / "weights.safetensors").write_bytes(b"\x01" * 300_000)
    step = run_step(
        "package", "--model-dir", work / "models", "--image", f"{quay.host}/mirror/src:v1", "--base-image", base_image,
        "--authfile", quay.authfile(work / "auth.json"), "--plain-http", "--result-image", work / "image",
    )  # fmt: skip
    assert step.returncode == 0, step.stderr
    return (work / "image").read_text()


def mirror_args(tmp_path: Path, quay: Registry, src: str, dest: str, *extra: object) -> list[object]:
    return ["--src", src, "--dest", dest, "--src-authfile", quay.authfile(tmp_path / "quay.json"),
            "--no-src-tls-verify", "--no-dest-tls-verify", *extra]  # fmt: skip


def test_token_file_and_digest_verified(tmp_path: Path, run_step: StepRunner, quay: Registry, internal: Registry, pushed: str) -> None:
    token = tmp_path / "token"
    token.write_text(internal.password)
    dest = f"{internal.host}/team/mirrored:v1"
    step = run_step(
        "mirror", *mirror_args(tmp_path, quay, pushed, dest, "--dest-token-file", token, "--tmpdir", tmp_path / "tmp"),
        "--result-digest", tmp_path / "digest",
    )  # fmt: skip
    assert step.returncode == 0, step.stderr + quay.diagnosis() + internal.diagnosis()
    digest = pushed.split("@")[1]
    assert (tmp_path / "digest").read_text() == digest
    assert f"{dest} verified: {digest}" in step.stdout
    assert list((tmp_path / "tmp").iterdir()) == [], "the generated authfile is removed"


def test_a_token_service_5xx_is_run_again(tmp_path: Path, run_step: StepRunner, quay: Registry, internal: Registry, pushed: str) -> None:
    """skopeo ends at once on a 5xx from the token service (its --retry-times does not cover it): the step runs it again."""
    authfile = internal.authfile(tmp_path / "internal.json")
    before = len(quay.token_requests)
    quay.token_outage[0] = 1
    try:
        step = run_step(
            "mirror", *mirror_args(tmp_path, quay, pushed, f"{internal.host}/team/retried:v1", "--dest-authfile", authfile),
            "--retry-delay", "0.05",
        )  # fmt: skip
    finally:
        quay.token_outage[0] = 0
    assert step.returncode == 0, step.stderr + quay.diagnosis() + internal.diagnosis()
    assert quay.token_requests[before] == "503" and quay.token_requests[before + 1].startswith("200 pusher")
    assert "invalid status code from registry 503" in step.stdout  # skopeo's lines, logged
    assert "skopeo copy: transient failure; retry 1/3 in " in step.stdout
    assert f"{internal.host}/team/retried:v1 verified: {pushed.split('@')[1]}" in step.stdout


def test_expired_token_is_an_auth_error(tmp_path: Path, run_step: StepRunner, quay: Registry, internal: Registry, pushed: str) -> None:
    token = tmp_path / "token"
    token.write_text("expired-token")
    step = run_step("mirror", *mirror_args(tmp_path, quay, pushed, f"{internal.host}/team/x:v1", "--dest-token-file", token))
    assert step.returncode == 4, step.stderr
    assert step.error.startswith("ERROR: skopeo copy failed:")
    assert "retry" not in step.stdout, "an auth failure is not run again"


def test_dest_authfile(tmp_path: Path, run_step: StepRunner, quay: Registry, internal: Registry, pushed: str) -> None:
    authfile = internal.authfile(tmp_path / "internal.json")
    step = run_step("mirror", *mirror_args(tmp_path, quay, pushed, f"{internal.host}/team/y:v1", "--dest-authfile", authfile))
    assert step.returncode == 0, step.stderr + quay.diagnosis() + internal.diagnosis()


def test_unknown_source_digest(tmp_path: Path, run_step: StepRunner, quay: Registry, internal: Registry, pushed: str) -> None:
    missing = pushed.split("@")[0] + "@sha256:" + "0" * 64
    authfile = internal.authfile(tmp_path / "internal.json")
    step = run_step("mirror", *mirror_args(tmp_path, quay, missing, f"{internal.host}/team/z:v1", "--dest-authfile", authfile))
    assert step.returncode == 5, step.stderr
    assert "manifest unknown" in step.error


def test_source_must_be_by_digest(tmp_path: Path, run_step: StepRunner, quay: Registry) -> None:
    step = run_step("mirror", *mirror_args(tmp_path, quay, f"{quay.host}/mirror/src:v1", "127.0.0.1:1/a/b:v1"))
    assert step.returncode == 1 and "by digest" in step.error
