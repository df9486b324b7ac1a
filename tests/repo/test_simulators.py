"""One pod simulator: pods are built from the render (tests/podsim), never by hand.

* No class or function named `SimPod` (the hand-made pod directory that ran agents with its own env) comes back, in
  any Python file of the repository.
* The product knobs only it used stay gone: pod 0 learns a worker's activity from rank.env (ML_DEV_PODS /
  ML_DEV_HOSTS on the activity port), a worker reads pod 0's decision at MASTER_ADDR, as on a cluster.
* The tests have one nvidia-smi stub: the node's (tests/podsim/nodetool.py, driven by nodetools.py `Node.gpu` on
  pods and `HostNode` in process; tests/inpod/pod_units.py, which runs on every interpreter of the matrix and cannot
  import nodetools.py, runs nodetool.py as a script with the node.json `HostNode` writes). No file under tests/
  writes one of its own.
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
STUB_OWNERS = {"tests/podsim/nodetool.py", "tests/podsim/nodetools.py", "tests/podsim/pods.py"}
"""Where the node's nvidia-smi is installed: its stub and state (nodetool.py, nodetools.py) and PodSim's pod start."""
WRITES_A_STUB = re.compile(
    r"""/\s*["']nvidia-smi["']"""  # a file named nvidia-smi: bin_dir / "nvidia-smi"
    r"""|path\(\s*["']/usr/bin/nvidia-smi["']\s*\)"""  # a pod's: pod.path("/usr/bin/nvidia-smi")
    r"""|["']nvidia-smi["']\s*:\s*[rbfuRBFU]*["']"""  # a table of stub scripts: {"nvidia-smi": 'echo "0, H100"'}
    r"""|>>?\s*["']?[^\s"'<>|;]*/nvidia-smi\b"""  # a shell redirect into one: cat > "$BIN/nvidia-smi"
)
"""What writing an nvidia-smi of one's own looks like (a file, a pod path, a stub table's script, a shell redirect);
running the tool (`"exec -- nvidia-smi"`, the programs table's `"nvidia-smi": STUB`) is not."""


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


GATE = Path(__file__).resolve().relative_to(ROOT).as_posix()
"""This file, which spells the patterns it forbids."""


def inline_stubs(root: Path) -> list[str]:
    """Python and shell files anywhere under `root`/tests but the node's own (and this gate) that write an nvidia-smi stub."""
    found = []
    for path in sorted((root / "tests").rglob("*")):
        rel = path.relative_to(root)
        if path.suffix not in (".py", ".sh") or any(part in SKIP for part in rel.parts) or not path.is_file():
            continue
        if rel.as_posix() not in {*STUB_OWNERS, GATE} and WRITES_A_STUB.search(path.read_text(errors="replace")):
            found.append(rel.as_posix())
    return found


def test_one_nvidia_smi_stub() -> None:
    assert inline_stubs(ROOT) == [], "change the node's GPUs with tests/podsim/nodetools.py Node.gpu (pods) or HostNode (in process)"


def test_the_stub_gate_catches_a_planted_stub_anywhere_under_tests(tmp_path: Path) -> None:
    """A stub planted outside tests/podsim (the two this gate once missed: a startup-script stub table, a unit
    test's one-row script) and one inside it are found; the node's own files and a plain call of the tool are not."""
    planted = {
        "tests/inpod/test_startup_script.py": """STUBS = {"nvidia-smi": 'echo "0, NVIDIA H100 80GB HBM3, 81559 MiB"'}\n""",
        "tests/inpod/pod_units.py": """stub = self.tmp / "nvidia-smi"\nstub.write_text("#!/bin/sh\\necho 0")\n""",
        "tests/steps/helpers.sh": """cat > "$BIN/nvidia-smi" <<'EOF'\necho 0\nEOF\n""",
        "tests/podsim/stopjob.py": """smi = pod.path("/usr/bin/nvidia-smi")\n""",
    }
    clean = {
        "tests/inpod/ml_dev/test_devloop.py": """launch(cluster, "exec -- nvidia-smi --query-gpu=name --format=csv,noheader")\n""",
        "tests/fixtures/programs.py": """PROGRAMS = {"nvidia-smi": STUB}\n""",
        "tests/inpod/idle/test_real_output.py": """monkeypatch.setenv("ML_DEV_NVIDIA_SMI", str(node.nvidia_smi))\n""",
    }
    owners = {rel: (ROOT / rel).read_text() for rel in STUB_OWNERS}
    for rel, text in {**planted, **clean, **owners}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert inline_stubs(tmp_path) == sorted(planted)


def test_the_gates_see_what_they_forbid() -> None:
    """The checks above would catch a comeback (each pattern matches what it forbids)."""
    assert defined_names("class SimPod:\n    pass\n") & GONE_NAMES == {"SimPod"}
    assert defined_names("def SimPod():\n    pass\n") & GONE_NAMES == {"SimPod"}
    assert WRITES_A_STUB.search('smi = pod.bin / "nvidia-smi"') and WRITES_A_STUB.search('pod.path("/usr/bin/nvidia-smi")')
    assert not WRITES_A_STUB.search('ML_DEV_NVIDIA_SMI", "nvidia-smi")')
