"""The startup ConfigMap as a simulated pod of each committed stack has it, and every documented path on it.

The mount is compared with a derivation from the rendered volume written here from the API's rules alone (not with
podsim's writer): k8s.io/api core/v1/types.go KeyToPath.Path puts each listed key at its relative path, and kubernetes
pkg/volume/util/atomic_writer.go lays the payload out as `..data -> ..<timestamp>` (writePayloadToDir: the files and
their directories inside the timestamped directory) plus one link per first path component (createUserVisibleFiles:
`inpod -> ..data/inpod`). A ConfigMap update swaps `..data` and removes the old directory (Write, step 11) while
programs run from it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import pytest

from core import naming
from tests.podsim.pods import PodSim, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]

MOUNT = naming.STARTUP_MOUNT
LAUNCHERS = ("ml-dev", "fabric_check.py", "idle_agent.py", "home_page.py", "usage.py")
SHELL = ("startup.sh", "sshd.sh", "ssh-session.sh", "checkpoint_stop.sh", "idle-warning.sh", "rank_order.sh")


@pytest.fixture(scope="module", params=["barcelona", "nerc-production"])
def pod(request: pytest.FixtureRequest) -> Iterator[PodSim]:
    sim = PodSim(render_stack(request.param), count=1)
    try:
        sim.start()
        yield sim
    finally:
        sim.stop()


def startup_volume(sim: PodSim) -> dict[str, Any]:
    mount = next(m for m in sim.main["volumeMounts"] if m["mountPath"] == MOUNT)
    return next(v for v in sim.pod_spec["volumes"] if v["name"] == mount["name"])["configMap"]


def derived(items: list[dict[str, str]], stamp: str) -> set[str]:
    """`find -printf '%y %p %l'` of the mount as the API's rules make it, the timestamped directory named `stamp`."""
    lines = {f"d {MOUNT} ", f"l {MOUNT}/..data {stamp}", f"d {MOUNT}/{stamp} "}
    for item in items:
        path = PurePosixPath(item["path"])
        first = path.parts[0]
        lines.add(f"l {MOUNT}/{first} ..data/{first}")
        for parent in list(path.parents)[:-1]:
            lines.add(f"d {MOUNT}/{stamp}/{parent} ")
        lines.add(f"f {MOUNT}/{stamp}/{path} ")
    return lines


def listing(sim: PodSim) -> tuple[set[str], str]:
    out = sim.exec(0, ["find", MOUNT, "-printf", "%y %p %l\\n"], timeout=60)
    assert out.returncode == 0, out.stderr
    stamp = re.search(rf"^l {re.escape(MOUNT)}/\.\.data (\S+)$", out.stdout, re.M)
    assert stamp, out.stdout
    return set(out.stdout.splitlines()), stamp.group(1)


def test_the_mount_is_the_volume_as_the_kubelet_writes_it(pod: PodSim) -> None:
    volume = startup_volume(pod)
    data = pod.configmaps[volume["name"]]
    assert sorted(i["key"] for i in volume["items"]) == sorted(data), "every key listed (unlisted keys would be absent)"
    found, stamp = listing(pod)
    assert stamp.startswith("..") and stamp != "..data"
    assert found == derived(volume["items"], stamp)
    assert f"l {MOUNT}/inpod ..data/inpod" in found and f"d {MOUNT}/{stamp}/inpod/lib " in found, "nested, linked by its first component"
    modes = pod.exec(0, ["find", f"{MOUNT}/{stamp}", "-type", "f", "-printf", "%m\\n"], timeout=60).stdout.split()
    assert set(modes) == {format(volume["defaultMode"], "o")}


def run_every_path(sim: PodSim) -> None:
    items = {i["path"] for i in startup_volume(sim)["items"]}
    for launcher in LAUNCHERS:
        if launcher in items:  # the fabric check ships when the stack enables it
            out = sim.exec(0, ["python3", f"{MOUNT}/{launcher}", "--help"], timeout=60)
            assert out.returncode == 0 and "usage:" in out.stdout, f"{launcher}: {out.stdout}{out.stderr}"
    for shell in SHELL:
        if shell in items:
            out = sim.exec(0, ["bash", "-n", f"{MOUNT}/{shell}"], timeout=60)
            assert out.returncode == 0, f"{shell}: {out.stderr}"
    assert {"ml-dev", "idle_agent.py", "home_page.py", "usage.py", "startup.sh"} <= items


def test_every_documented_path_runs(pod: PodSim) -> None:
    run_every_path(pod)


def test_a_data_swap_during_a_run_breaks_nothing(pod: PodSim) -> None:
    """A program started before a ConfigMap update keeps serving after the kubelet removed the directory it started
    from (its modules were all imported at start), and every path works on the new directory."""
    state = "/tmp/swap-test"
    proc = pod.popen(0, ["python3", f"{MOUNT}/home_page.py", "serve", "--listen", "127.0.0.1:0"], env={"ML_DEV_STATE_DIR": state})
    try:
        addr = pod.pods[0].path(f"{state}/home.addr")
        deadline = time.monotonic() + 60
        while not (addr.exists() and addr.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        url = f"http://{addr.read_text().split()[0]}/healthz"
        probe = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
        _, before = listing(pod)
        pod.swap_configmap(startup_volume(pod)["name"])
        _, after = listing(pod)
        assert after != before and not pod.pods[0].path(f"{MOUNT}/{before}").exists(), "the old directory is gone"
        assert proc.poll() is None, "the running program survived the swap"
        out = pod.exec(0, ["python3", "-c", probe], timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
        run_every_path(pod)
    finally:
        PodSim.interrupt(proc)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
