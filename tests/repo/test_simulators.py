"""One pod simulator: pods are built from the render (tests/podsim), never by hand.

* No class or function named `SimPod` (the hand-made pod directory that ran agents with its own env) comes back, in
  any Python file of the repository.
* The product knobs only it used stay gone: pod 0 learns a worker's activity from rank.env (ML_DEV_PODS /
  ML_DEV_HOSTS on the activity port), a worker reads pod 0's decision at MASTER_ADDR, as on a cluster.
* The idle, home and podsim tests have one nvidia-smi stub: the node's (tests/podsim/nodetool.py, driven by
  nodetools.py `Node.gpu` on pods and `HostNode` in process); none writes one of its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

GONE_NAMES = {"SimPod"}
GONE_KNOBS = ("ML_DEV_MASTER_ACTIVITY", "ML_DEV_ACTIVITY_PEERS")
SKIP = {".git", ".venv", "node_modules", "__pycache__", "site", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
TEXT = {".py", ".sh", ".md", ".yml", ".yaml", ".json", ".toml", ".cfg", ".txt", ".j2"}
STUB_DIRS = ("tests/inpod/idle", "tests/inpod/home", "tests/podsim")
STUB_OWNERS = {"tests/podsim/nodetool.py", "tests/podsim/nodetools.py", "tests/podsim/pods.py"}
"""Where the node's nvidia-smi is installed: its stub and state (nodetool.py, nodetools.py) and PodSim's pod start."""
WRITES_A_STUB = re.compile(r"""(/\s*["']nvidia-smi["']|path\(\s*["']/usr/bin/nvidia-smi["']\s*\))""")


def files(suffixes: set[str]) -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        if any(part in SKIP for part in path.relative_to(ROOT).parts) or not path.is_file():
            continue
        if path.suffix in suffixes:
            out.append(path)
    return sorted(out)


def defined_names(source: str) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)}


def test_no_hand_made_pod_class_or_function() -> None:
    found = [
        f"{path.relative_to(ROOT)}: defines {name}"
        for path in files({".py"})
        for name in sorted(defined_names(path.read_text()) & GONE_NAMES)
    ]
    assert found == [], "pods are tests/podsim's PodSim (built from the render), or the agent's functions called in process"


def test_the_simulator_knobs_stay_gone() -> None:
    me = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}: {knob}"
        for path in files(TEXT)
        if path.resolve() != me
        for knob in GONE_KNOBS
        if knob in path.read_text(errors="replace")
    ]
    assert found == [], "pod 0 finds the workers through rank.env, a worker finds pod 0 at MASTER_ADDR"


def test_one_nvidia_smi_stub() -> None:
    found = [
        str(path.relative_to(ROOT))
        for d in STUB_DIRS
        for path in sorted((ROOT / d).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in STUB_OWNERS and WRITES_A_STUB.search(path.read_text())
    ]
    assert found == [], "change the node's GPUs with tests/podsim/nodetools.py Node.gpu (pods) or HostNode (in process)"


def test_the_gates_see_what_they_forbid() -> None:
    """The checks above would catch a comeback (each pattern matches what it forbids)."""
    assert defined_names("class SimPod:\n    pass\n") & GONE_NAMES == {"SimPod"}
    assert defined_names("def SimPod():\n    pass\n") & GONE_NAMES == {"SimPod"}
    assert WRITES_A_STUB.search('smi = pod.bin / "nvidia-smi"') and WRITES_A_STUB.search('pod.path("/usr/bin/nvidia-smi")')
    assert not WRITES_A_STUB.search('ML_DEV_NVIDIA_SMI", "nvidia-smi")')
