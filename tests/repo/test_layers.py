"""Dependencies flow one way: core → stacks → components → __main__; tools, policy and bench only look down.

Walks every import statement (ast, including imports inside functions and `if TYPE_CHECKING:` blocks) of
every module of the repository and fails on an edge that points up or sideways between packages.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A package may import itself and packages of a LOWER rank only. `inpod` (the programs the environment's pods
# run, with the pod contract the render reads) and `steps` (the programs the pipeline pods run) are the ground
# floor: they import nothing of ours; `core` may read the contract.
RANK = {
    "inpod": 0,
    "steps": 0,
    "core": 1,
    "stacks": 2,
    "components": 3,
    "__main__": 4,
    "policy": 4,
    "tools": 5,
    "bench": 5,
}
SKIP_DIRS = {".git", ".venv", "rendered", "tests", "__pycache__", "images"}


def modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(ROOT).parts[:-1]))


def package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, top-level name) of every absolute import in the file."""
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            edges.append((node.lineno, node.module.split(".")[0]))
    return edges


def test_every_package_is_ranked() -> None:
    assert {package_of(p) for p in modules()} <= set(RANK), "a new top-level package needs a rank in RANK"


def test_imports_point_down() -> None:
    upward = []
    for path in modules():
        own = package_of(path)
        for line, name in imported(path):
            if name in RANK and name != own and RANK[name] >= RANK[own]:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {own} (rank {RANK[own]}) imports {name} (rank {RANK[name]})")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(upward)


def test_lower_layers_import_no_kubernetes_sdk() -> None:
    """Validating a stack's config needs neither pulumi_kubernetes nor (for core) Pulumi at all."""
    forbidden = {"core": {"pulumi", "pulumi_kubernetes", "pulumi_random"}, "stacks": {"pulumi_kubernetes", "pulumi_random"}}
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in modules()
        if package_of(path) in forbidden
        for line, name in imported(path)
        if name in forbidden[package_of(path)]
    ]
    assert not found, found


def test_validating_config_loads_no_kubernetes_sdk() -> None:
    """At run time too: loading and validating a committed stack file leaves pulumi_kubernetes unloaded."""
    code = (
        "import sys\n"
        "from stacks import loader\n"
        "from pathlib import Path\nfrom tools.mock_engine import stack_config\n"
        "config, problems = loader.check(stack_config(Path('Pulumi.barcelona.yaml')), set())\n"
        "assert config is not None, problems\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi_kubernetes', 'pulumi_random')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def sys_path_edits(path: Path) -> list[int]:
    """Lines that touch `sys.path` (call a method on it, assign or augment it)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.value if isinstance(t, ast.Subscript) else t for t in targets), None)
        if isinstance(target, ast.Attribute) and target.attr == "path" and isinstance(target.value, ast.Name) and target.value.id == "sys":
            assert isinstance(node, (ast.expr, ast.stmt)), f"a call or an assignment, not {node!r}"
            lines.append(node.lineno)
    return sorted(lines)


def test_no_module_edits_sys_path(tmp_path: Path) -> None:
    """The repository root is the import root (`python -m tools.x`, pytest's `pythonpath`); nothing patches sys.path."""
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nsys.path.insert(0, 'x')\nsys.path += ['y']\nsys.path[0] = 'z'\nprint(sys.path)\n")
    assert sys_path_edits(probe) == [2, 3, 4], "the detector must see each form of edit"
    skip = {".git", ".venv", "rendered", "__pycache__"}
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(ROOT.rglob("*.py"))
        if not skip & set(path.relative_to(ROOT).parts)
        for line in sys_path_edits(path)
    ]
    assert not found, f"sys.path edits: {found}"


def test_inpod_imports_only_the_standard_library() -> None:
    """The in-pod programs run on whatever python3 the image has: no Pulumi, nothing of ours outside the package
    (`components`, `stacks`, …), no third-party package; inside it modules import each other relatively (the
    launchers import `inpod` by its name)."""
    allowed = set(sys.stdlib_module_names) | {"inpod"}
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in modules()
        if package_of(path) == "inpod"
        for line, name in imported(path)
        if name not in allowed
    ]
    assert {package_of(p) for p in modules()} >= {"inpod"} and not found, found
