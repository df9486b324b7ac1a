"""RDMA pods of an SCC run as UID 0: root logs in with a key only, and root's sshd needs CAP_SYS_CHROOT."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from components import devloop
from tests.devloop.sim import Cluster, missing_requirements

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")
RDMA_CAPS = ("IPC_LOCK", "SYS_RESOURCE")


def test_root_pods_admit_keys_only_and_run_ranks_as_root(tmp_path: Path) -> None:
    c = Cluster(2, gpus=1, uid=0, capabilities=(*RDMA_CAPS, "SYS_CHROOT"))
    try:
        c.start()
        res = c.exec(0, "python3 /opt/ml-dev-env/ml-dev exec -- id -u", cwd="/tmp")
        assert res.returncode == 0, res.stdout + res.stderr + (c.pods[1].state / "logs" / "sshd.log").read_text()
        assert sorted(res.stdout.split()) == ["0", "0", "[0]", "[1]"]
        known = tmp_path / "known_hosts"
        known.write_text(f"[{c.pods[1].addr}]:{devloop.SSH_PORT} {c.host_pub}\n")

        def ssh(key: str, *extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    "ssh",
                    "-F",
                    "none",
                    "-p",
                    str(devloop.SSH_PORT),
                    "-i",
                    str(c.keys / key),
                    "-o",
                    "IdentitiesOnly=yes",
                    "-o",
                    f"UserKnownHostsFile={known}",
                    "-o",
                    "BatchMode=yes",
                    *extra,
                    f"root@{c.pods[1].addr}",
                    "id -u; hostname",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )

        ok = ssh("user")
        assert ok.returncode == 0 and ok.stdout.split() == ["0", "ml-dev-env-1"], ok.stderr
        for key, extra in (("stranger", ()), ("stranger", ("-o", "PreferredAuthentications=password,keyboard-interactive"))):
            refused = ssh(key, *extra)
            assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr
    finally:
        c.stop()


def test_root_without_sys_chroot_says_what_to_configure() -> None:
    c = Cluster(1, gpus=1, uid=0, capabilities=RDMA_CAPS)  # CRI-O's defaults + the RDMA ones: no SYS_CHROOT
    try:
        with pytest.raises(RuntimeError, match="not ready"):
            c.start(timeout=5)  # sshd never starts
        log = c.pods[0].state / "logs" / "sshd.log"
        deadline = time.monotonic() + 5
        while "CAP_SYS_CHROOT" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "add SYS_CHROOT to ml-dev-env:security.memlock.capabilities" in log.read_text()
    finally:
        c.stop()
