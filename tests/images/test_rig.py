"""The image rig retries buildah only when its self re-exec hits the kernel's transient memfd EBUSY."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.images.conftest import REEXEC_ATTEMPTS, REEXEC_EBUSY, BuildFailed, ImageRig


def fake_buildah(tmp_path: Path, failures: int, message: str) -> ImageRig:
    """An ImageRig whose `buildah` fails `failures` times with `message`, then succeeds; it counts its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "buildah"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{tmp_path}/calls" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "{tmp_path}/calls"\n'
        f'if [ "$n" -le {failures} ]; then echo "{message}" >&2; echo "Error: exit status 1" >&2; exit 1; fi\n'
        'echo "ran: $*"\n'
    )
    script.chmod(0o755)
    return ImageRig(tmp_path / "rig", env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})


def calls(tmp_path: Path) -> int:
    return int((tmp_path / "calls").read_text())


def test_memfd_ebusy_is_run_again(tmp_path: Path) -> None:
    rig = fake_buildah(tmp_path, failures=REEXEC_ATTEMPTS - 1, message=f"Close_Fd {REEXEC_EBUSY}")
    proc = rig.buildah("run", "ctr", "--", "true")
    assert proc.returncode == 0 and "ran: " in proc.stdout
    assert calls(tmp_path) == REEXEC_ATTEMPTS
    assert sum("memfd EBUSY" in line for line in rig.log) == REEXEC_ATTEMPTS - 1


def test_memfd_ebusy_every_time_still_fails(tmp_path: Path) -> None:
    rig = fake_buildah(tmp_path, failures=REEXEC_ATTEMPTS, message=f"Close_Fd {REEXEC_EBUSY}")
    with pytest.raises(BuildFailed, match="sealing memfd copy"):
        rig.buildah("run", "ctr", "--", "true")
    assert calls(tmp_path) == REEXEC_ATTEMPTS


def test_other_failures_are_not_run_again(tmp_path: Path) -> None:
    rig = fake_buildah(tmp_path, failures=1, message="error: RUN step failed")
    proc = rig.buildah("run", "ctr", "--", "false", check=False)
    assert proc.returncode == 1 and "RUN step failed" in proc.stderr
    assert calls(tmp_path) == 1
