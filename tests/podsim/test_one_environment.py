"""One environment on every rank (inpod/ml_dev/envgate.py): the drift gate of `ml-dev run` on 3 simulated pods of a
hybrid-storage stack (the workspace, hence every HOME, per pod; /datasets shared), with real `pip` installing small
wheels this module writes as zip files (no index).

* install once: `ml-dev pip install <wheel>` on pod 0 makes it importable on every rank;
* ten drifts, each injected on one pod and undone after: each launch is refused (status 1, RUN_EXIT_STATUSES), one
  line naming the rank, its pod and the package (or library, interpreter, sys.path entry) with both values;
* identical ranks, launched ten times (synced tree and --no-sync, with bytecode caches written and folders touched
  between launches): never refused;
* `--allow-drift` launches and the run's record says so; `ml-dev status` shows the last gate's verdict.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inpod import contract
from tests.podsim.pods import PREFIX, REPO, PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(600)]

PODS = 3
WHEELS = "/tmp/wheels"
PIP = "--break-system-packages --no-index --no-warn-script-location -q"  # the test machine's Python is Debian's (PEP 668)
IMPORTS = "python3 -c 'import demo_a; print(\"DEMO\", demo_a.VERSION)'"


def wheel(name: str, version: str) -> tuple[str, bytes]:
    """A pure-Python wheel (PEP 427) of one package whose VERSION is `version`, written by hand."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: podsim\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(text.encode())}\n"
    files[f"{dist}/RECORD"] = record + f"{dist}/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return f"{name}-{version}-py3-none-any.whl", out.getvalue()


def hybrid(objects: dict[str, Any]) -> None:
    objects["nodes"] = {**objects["nodes"], "count": PODS, "gpusPerPod": 1}
    objects["storage"] = {
        "mode": "hybrid",
        "volumes": [
            {"name": "workspace", "mountPath": "/workspace", "size": "1Gi", "scope": "per-pod"},
            {"name": "datasets", "mountPath": "/datasets", "size": "1Gi", "scope": "shared"},
        ],
    }


def put(sim: PodSim, index: int, path: str, data: bytes, mode: int = 0o644) -> None:
    """A file in pod `index`'s own layer (as the image would have it), owned by the pod's user."""
    target = sim.pods[index].path(path)
    missing = [p for p in [target.parent, *target.parent.parents] if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    for d in missing:
        os.chown(d, sim.identity.uid, sim.identity.gid)
    target.write_bytes(data)
    target.chmod(mode)
    os.chown(target, sim.identity.uid, sim.identity.gid)


@pytest.fixture(scope="module")
def sim() -> Iterator[PodSim]:
    before = set(leftovers())
    s = PodSim(render_stack("nerc-production", hybrid))
    try:
        s.start()
        for i in range(PODS):
            # the image's frozen CUDA-bound packages (images/base.Containerfile, PIP_CONSTRAINT): none on this machine
            put(s, i, "/etc/ml-dev-env/constraints.txt", b"")
            for name, version in (("demo_a", "1.0"), ("demo_a", "1.1"), ("demo_b", "1.0")):
                filename, data = wheel(name, version)
                put(s, i, f"{WHEELS}/{filename}", data)
        yield s
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


def launch(sim: PodSim, extra: str = "", env: dict[str, str] | None = None, cwd: str = "/tmp") -> subprocess.CompletedProcess[str]:
    return sim.exec(0, f"ml-dev run --no-sync --timeout 30 {extra} -- {IMPORTS}", cwd=cwd, env=env, timeout=120)


def pip(sim: PodSim, index: int, args: str) -> None:
    res = sim.exec(index, f"python3 -m pip {args}", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def assert_launched(res: subprocess.CompletedProcess[str], version: str = "1.0") -> None:
    assert res.returncode == 0, res.stdout + res.stderr
    assert "differ" not in res.stderr, res.stderr
    assert sorted(line.split()[-1] for line in res.stdout.splitlines() if "DEMO" in line) == [version] * PODS, res.stdout


def test_install_once_then_every_rank_imports_it(sim: PodSim) -> None:
    res = sim.exec(0, f"cd /tmp && ml-dev pip install {PIP} {WHEELS}/demo_a-1.0-py3-none-any.whl", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_launched(launch(sim))
    assert json.loads(sim.records(0, f"{contract.ENV_GATE_DIR}/{contract.ENV_GATE_LAST}").read_text())["one_environment"]
    status = sim.exec(0, "ml-dev status --timeout 30", timeout=120)
    assert "environment: one environment" in status.stdout, status.stdout + status.stderr


def touch_and_compile(sim: PodSim, index: int) -> None:
    """What is no difference: bytecode caches written, a site folder's time changed, a new empty log in HOME."""
    sim.exec(index, "python3 -c 'import demo_a, sysconfig' && python3 -m compileall -q ~/.local/lib >/dev/null", timeout=60)
    sim.exec(index, "touch ~/.local/lib/python3*/site-packages ~/.local/lib/python3*/site-packages/demo_a*", timeout=30)


def test_identical_ranks_are_never_refused(sim: PodSim) -> None:
    sim.exec(0, "mkdir -p /workspace/proj && cd /workspace/proj && git init -q && echo x > a.txt", timeout=30)
    # a PYTHONPATH folder that holds nothing importable on pod 1 and is absent elsewhere: no difference
    put(sim, 1, "/tmp/only-here/README", b"nothing to import\n")
    assert_launched(launch(sim, env={"PYTHONPATH": "/tmp/only-here"}))
    for n in range(10):
        touch_and_compile(sim, n % PODS)
        if n % 2:
            res = sim.exec(0, f"ml-dev run --timeout 30 -- {IMPORTS}", cwd="/workspace/proj", timeout=120)  # the tree's gate
        else:
            res = launch(sim)
        assert_launched(res)
    # the startup ConfigMap is read-only: each pod's agents keep their bytecode in its state dir (inpod/__init__.py)
    cached = [p.name for p in sim.pods[1].path("/tmp/ml-dev-env/pycache").rglob("envgate.*.pyc")]
    assert cached, "no bytecode of envgate.py in pod 1's state dir"


def drift_version(sim: PodSim) -> Callable[[], None]:
    pip(sim, 1, f"install {PIP} --force-reinstall {WHEELS}/demo_a-1.1-py3-none-any.whl")
    return lambda: pip(sim, 1, f"install {PIP} --force-reinstall {WHEELS}/demo_a-1.0-py3-none-any.whl")


def drift_extra(sim: PodSim) -> Callable[[], None]:
    pip(sim, 2, f"install {PIP} {WHEELS}/demo_b-1.0-py3-none-any.whl")
    return lambda: pip(sim, 2, f"uninstall {PIP.split(' --no-index')[0]} -y demo_b")


def drift_missing(sim: PodSim) -> Callable[[], None]:
    pip(sim, 1, "uninstall --break-system-packages -q -y demo_a")
    return lambda: pip(sim, 1, f"install {PIP} {WHEELS}/demo_a-1.0-py3-none-any.whl")


def drift_target(sim: PodSim) -> Callable[[], None]:
    """demo_b 1.0 installed with --target into a PYTHONPATH folder on pod 2 only."""
    pip(sim, 2, f"install {PIP} --target /tmp/extra {WHEELS}/demo_b-1.0-py3-none-any.whl")
    return lambda: shutil.rmtree(sim.pods[2].path("/tmp/extra/demo_b"))


def nccl(sim: PodSim, index: int, folder: str, data: bytes) -> Callable[[], None]:
    put(sim, index, f"{folder}/libnccl.so.2", data)
    return lambda: sim.pods[index].path(f"{folder}/libnccl.so.2").unlink()


def shadow(sim: PodSim) -> Callable[[], None]:
    put(sim, 1, "/tmp/shadow/demo_a/__init__.py", b"VERSION = 'shadow'\n")
    return lambda: shutil.rmtree(sim.pods[1].path("/tmp/shadow/demo_a"))


def other_python(sim: PodSim) -> Callable[[], None]:
    """Another `python3` first on PATH on pod 2 (a copy of this machine's interpreter: the same version elsewhere)."""
    put(sim, 2, "/usr/local/bin/python3", Path(os.path.realpath("/usr/bin/python3")).read_bytes(), 0o755)
    return lambda: sim.pods[2].path("/usr/local/bin/python3").unlink()


def other_minor(sim: PodSim) -> Callable[[], None]:
    """Pod 1's cached fingerprint says another minor (the machine has one system Python; the cache is what the agent
    answers while nothing under the environment's paths changed)."""
    time.sleep(2.2)  # the folders the last undo changed are older than the cache's 2 s guard (envgate RACY_NS)
    assert_launched(launch(sim))
    cache = sim.pods[1].path("/tmp/ml-dev-env/envgate-cache.json")
    held = json.loads(cache.read_text())
    held["fingerprint"]["python"]["version"] = "3.12.1"
    cache.write_text(json.dumps(held))
    return lambda: cache.unlink()


def missing_entry(sim: PodSim) -> Callable[[], None]:
    for i in (0, 1):
        put(sim, i, "/tmp/common/common_mod.py", b"# a PYTHONPATH folder's module pod 2 lacks\n")

    def undo() -> None:
        for i in (0, 1):
            shutil.rmtree(sim.pods[i].path("/tmp/common"))

    return undo


STANDIN = b"\x7fELF stand-in libnccl\n"
LIB_PATH = {"LD_LIBRARY_PATH": "/tmp/nccl-first:/tmp/nccl"}
DRIFTS: list[tuple[str, Callable[[PodSim], Callable[[], None]], dict[str, str], int, str]] = [
    ("a different wheel version", drift_version, {}, 1, "package demo-a 1.1; rank 0 (ml-dev-env-0), this pod: 1.0"),
    ("a package on one pod only", drift_extra, {}, 2, "package demo-b 1.0; rank 0 (ml-dev-env-0), this pod: (none)"),
    ("a package missing on one pod", drift_missing, {}, 1, "package demo-a (none); rank 0 (ml-dev-env-0), this pod: 1.0"),
    ("a package in a PYTHONPATH folder", drift_target, {"PYTHONPATH": "/tmp/extra"}, 2, "package demo-b 1.0"),
    (
        "a second libnccl earlier on the path",
        lambda s: nccl(s, 1, "/tmp/nccl-first", STANDIN),
        LIB_PATH,
        1,
        "library libnccl /tmp/nccl-first/libnccl.so.2",
    ),
    (
        "a libnccl of other content",
        lambda s: nccl(s, 2, "/tmp/nccl", STANDIN + b"2"),
        LIB_PATH,
        2,
        "library libnccl /tmp/nccl/libnccl.so.2 sha256",
    ),
    (
        "a PYTHONPATH entry shadowing a package",
        shadow,
        {"PYTHONPATH": "/tmp/shadow"},
        1,
        "sys.path entry /tmp/shadow demo_a importable from it",
    ),
    ("another python3 first on PATH", other_python, {}, 2, "python3 3."),
    ("another interpreter minor", other_minor, {}, 1, "python3 3.12.1"),
    (
        "a PYTHONPATH folder one pod lacks",
        missing_entry,
        {"PYTHONPATH": "/tmp/common"},
        2,
        "/tmp/common (none); rank 0 (ml-dev-env-0), this pod: common_mod importable",
    ),
]


def test_every_drift_is_refused_naming_rank_pod_and_what(sim: PodSim) -> None:
    for i in range(PODS):  # the libraries every pod has alike (the stand-in's common folder)
        put(sim, i, "/tmp/nccl/libnccl.so.2", STANDIN)
    for i in range(PODS):  # PYTHONPATH folders every pod has (empty)
        for folder in ("/tmp/shadow", "/tmp/extra"):
            put(sim, i, f"{folder}/README", b"a folder of PYTHONPATH\n")
    refused: dict[str, str] = {}
    for what, inject, env, rank, words in DRIFTS:
        assert_launched(launch(sim, env=env))  # the same environment, with this cell's variables: launched
        undo = inject(sim)
        try:
            res = launch(sim, env=env)
        finally:
            undo()
        assert res.returncode == 1, f"{what}: {res.returncode}\n{res.stdout}\n{res.stderr}"
        assert "DEMO" not in res.stdout, f"{what}: a rank started\n{res.stdout}"
        lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip().startswith(f"rank {rank} (ml-dev-env-{rank}): ")]
        assert any(words in ln for ln in lines), f"{what}: expected {words!r} on a line of rank {rank}:\n{res.stderr}"
        assert all(ln.startswith(f"  rank {rank} ") for ln in res.stderr.splitlines() if ln.startswith("  rank ")), res.stderr
        refused[what] = res.stderr
    assert len(refused) == 10
    assert "to align every pod with this one: ml-dev pip install demo-a==1.0" in refused["a different wheel version"]
    assert "ml-dev pip uninstall -y demo-b" in refused["a package on one pod only"]


def test_allow_drift_launches_and_the_run_record_says_so(sim: PodSim) -> None:
    undo = drift_version(sim)
    try:
        res = launch(sim, "--allow-drift")
        status = sim.exec(0, "ml-dev status --timeout 30", timeout=120)
    finally:
        undo()
    assert res.returncode == 0, res.stderr
    assert "launching with --allow-drift" in res.stderr and "package demo-a 1.1" in res.stderr, res.stderr
    last = json.loads(sim.records(0, f"{contract.ENV_GATE_DIR}/{contract.ENV_GATE_LAST}").read_text())
    assert last["allowed"] and last["differs"] == ["rank 1 (ml-dev-env-1)"], last
    record = json.loads(sim.records(0, f"{contract.RUNS_SUBDIR}/{last['run']}/{contract.RUN_DRIFT_FILE}").read_text())
    assert record["lines"] == last["lines"]
    assert "environment: ranks differ: rank 1 (ml-dev-env-1)" in status.stdout, status.stdout


def test_a_pod_with_a_new_home_gets_the_pip_log_before_its_first_rank(sim: PodSim) -> None:
    """A pod added by a resize comes with a new HOME (its own claim): no user site, no record of the pip log. The gate
    runs the log there first (install.replay), then checks it like every other rank."""
    res = sim.exec(2, "rm -rf ~/.local ~/.cache/ml-dev-env && python3 -c 'import demo_a'", timeout=30)
    assert res.returncode != 0, "demo_a is gone from pod 2"
    res = launch(sim)
    assert "rank 2 (ml-dev-env-2) has not run 1 command(s) of the pip log: running them there first" in res.stdout, res.stdout
    assert_launched(res)


def test_freeze_pins_what_was_installed_on_top_of_the_image(sim: PodSim) -> None:
    image_file = (REPO / "images" / "runtime-requirements.txt").read_text()
    put(sim, 0, "/workspace/proj/images/runtime-requirements.txt", image_file.encode())
    res = sim.exec(0, "ml-dev freeze", cwd="/workspace/proj", timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    frozen = sim.pods[0].path("/workspace/proj/images/runtime-requirements.txt").read_text()
    assert frozen.startswith(image_file) and frozen[len(image_file) :].splitlines()[1:] == ["demo-a==1.0"], frozen
    assert "demo-a 1.0 came from file:///tmp/wheels/demo_a-1.0-py3-none-any.whl" in res.stdout, res.stdout
    again = sim.exec(0, "ml-dev freeze", cwd="/workspace/proj", timeout=60)
    assert again.returncode == 0 and sim.pods[0].path("/workspace/proj/images/runtime-requirements.txt").read_text() == frozen


@pytest.mark.parametrize("mode", ["shared", "per-pod"])
def test_install_once_on_every_storage_mode(mode: str) -> None:
    """4 pods; shared: the workspace (and every HOME in it, each pod's own folder) is one claim; per-pod: one claim
    each. Installed into each pod's user site, and (shared) once into a --target folder on the shared workspace."""

    def storage(objects: dict[str, Any]) -> None:
        objects["nodes"] = {**objects["nodes"], "count": 4, "gpusPerPod": 1}
        objects["storage"] = {"mode": mode, "volumes": [{"name": "workspace", "mountPath": "/workspace", "size": "1Gi"}]}

    s = PodSim(render_stack("nerc-production", storage))
    try:
        s.start()
        put(s, 0, "/etc/ml-dev-env/constraints.txt", b"")
        filename, data = wheel("demo_a", "1.0")
        put(s, 0, f"/tmp/{filename}", data)  # on pod 0 only: ml-dev pip copies it to the others
        for i in range(1, 4):
            put(s, i, "/etc/ml-dev-env/constraints.txt", b"")
        started = time.monotonic()
        res = s.exec(0, f"ml-dev pip install {PIP} /tmp/{filename}", cwd="/tmp", timeout=180)
        print(f"{mode}: ml-dev pip install at 4 pods took {time.monotonic() - started:.1f} s")
        assert res.returncode == 0 and "ran on 4 pods" in res.stdout, res.stdout + res.stderr
        res = s.exec(0, f"ml-dev run --no-sync --timeout 30 -- {IMPORTS}", cwd="/tmp", timeout=120)
        assert res.returncode == 0 and res.stdout.count("DEMO 1.0") == 4, res.stdout + res.stderr
        if mode == "shared":
            other, data = wheel("demo_b", "1.0")
            put(s, 0, f"/workspace/wheels/{other}", data)
            res = s.exec(0, f"ml-dev pip install {PIP} --target /workspace/pylib /workspace/wheels/{other}", cwd="/tmp", timeout=180)
            assert res.returncode == 0 and "ran once, into /workspace/pylib on shared storage" in res.stdout, res.stdout + res.stderr
            env = {"PYTHONPATH": "/workspace/pylib"}
            res = s.exec(
                0, "ml-dev run --no-sync --timeout 30 -- python3 -c 'import demo_b; print(\"B\")'", cwd="/tmp", env=env, timeout=120
            )
            assert res.returncode == 0 and [ln[-2:] for ln in res.stdout.splitlines()].count(" B") == 4, res.stdout + res.stderr
    finally:
        s.stop()
