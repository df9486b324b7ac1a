"""The in-pod programs on the Pythons they meet: their unit tests (tests/inpod/pod_units.py, standard
library only) run under every CPython from `inpod.MIN_PYTHON` to 3.13 that this machine has (pyenv's
versions, then `python3.X` on PATH), and every parser gives there what it gives under the suite's own
Python. A missing interpreter is a skip with the reason (pytest -ra lists it); the oldest, 3.10 and 3.12
(the presets' images) are the ones that matter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import inpod
from inpod.idle.probes import APPS_QUERY, GPU_QUERY
from tests.conftest import ROOT
from tests.inpod import mount, pod_units
from tests.podsim.nodetools import HostNode

UNITS = Path(__file__).resolve().parent / "pod_units.py"
VERSIONS = [f"3.{minor}" for minor in range(inpod.MIN_PYTHON[1], 14)]
MOUNT = mount.shipped()  # the startup ConfigMap as a pod has it: the package under inpod/, the launchers at the root
ENV = {**os.environ, "PYTHONPATH": str(MOUNT), "POD_UNITS_MOUNT": str(MOUNT), "PYTHONDONTWRITEBYTECODE": "1"}


def version_of(python: str) -> str | None:
    try:
        code = "import sys; print('%d.%d' % sys.version_info[:2])"
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def interpreter(version: str) -> str | None:
    """A CPython `version` (major.minor) of this machine: pyenv's, then python3.X on PATH, or the suite's own."""
    if version_of(sys.executable) == version:
        return sys.executable
    roots = [os.environ.get("PYENV_ROOT"), str(Path.home() / ".pyenv")]
    for root in filter(None, roots):
        for found in sorted(Path(root, "versions").glob(f"{version}.*"), reverse=True):
            python = found / "bin" / "python"
            if python.is_file() and version_of(str(python)) == version:
                return str(python)
    on_path = shutil.which(f"python{version}")
    return on_path if on_path and version_of(on_path) == version else None


def run_units(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(UNITS), *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def reference_dump() -> str:
    proc = run_units(sys.executable, "--dump")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("version", VERSIONS)
def test_unit_tests_pass_and_parsers_agree(version: str, reference_dump: str) -> None:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no CPython {version} here (pyenv versions/{version}.*, python{version} on PATH)")
    proc = run_units(python)
    assert proc.returncode == 0, f"{python}:\n{proc.stdout}{proc.stderr}"
    dump = run_units(python, "--dump")
    assert dump.returncode == 0, dump.stderr
    assert dump.stdout == reference_dump, f"the programs' parsers give other results under {python} than under {sys.executable}"


def test_the_units_run_the_node_tool_as_host_node_does(tmp_path: Path) -> None:
    """pod_units.py's nvidia-smi (`node_tool`: it cannot import tests/podsim/nodetools.py) is the node's: the same
    nodetool.py, the node.json `HostNode` writes for the same replay, the same output for each query."""
    gpu, apps = pod_units.H200 / "gpu-busy-0.csv", pod_units.H200 / "apps-busy-0.csv"
    host = HostNode(tmp_path / "host", gpus=1)
    host.gpu(replay={"gpu": gpu, "apps": apps, "rc": 0})
    units = pod_units.node_tool(tmp_path / "units", "nvidia-smi", replay=pod_units.replay(gpu, apps))
    assert (tmp_path / "units" / "nodetool.py").read_bytes() == (tmp_path / "host" / "nodetool.py").read_bytes()
    assert json.loads((tmp_path / "units" / "node.json").read_text()) == json.loads((tmp_path / "host" / "node.json").read_text())
    queries = [["-L"], [f"--query-gpu={GPU_QUERY}", "--format=csv"], [f"--query-compute-apps={APPS_QUERY}", "--format=csv"]]
    for query in queries:
        ours, hosts = (subprocess.run([smi, *query], capture_output=True, text=True, timeout=60) for smi in (units, str(host.nvidia_smi)))
        assert (ours.returncode, ours.stdout) == (hosts.returncode, hosts.stdout), query
    assert ours.stdout == apps.read_text()  # the replay reached the tool


def test_minimum_python_is_stated_once_and_followed() -> None:
    """ruff's target for the programs (and their unit tests) and the README's promise follow inpod.MIN_PYTHON."""
    major, minor = inpod.MIN_PYTHON
    target = f"py{major}{minor}"
    per_file = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["per-file-target-version"]
    assert per_file == {"inpod/**": target, "tests/inpod/pod_units.py": target}
    assert VERSIONS[0] == f"{major}.{minor}" and {"3.10", "3.12"} <= set(VERSIONS)
    readme = (ROOT / "README.md").read_text()
    assert f"Python {major}.{minor}+" in readme and "inpod.MIN_PYTHON" in readme
