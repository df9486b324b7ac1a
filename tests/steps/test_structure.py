"""The steps package's structure, held like inpod's (tests/inpod/test_package.py): modules import each other
relatively, with no circle; the launchers in bin/ import the package by its name and run one step's `main`; the
package imports nothing of ours outside it and only the tools image's third-party packages."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from steps.embed import STEPS, STEPS_DIR
from tests.inpod.test_package import cycles

MODULES = sorted(p for p in STEPS_DIR.rglob("*.py") if "__pycache__" not in p.parts and p.parent.name != "bin")
THIRD_PARTY = {"boto3", "botocore", "huggingface_hub", "isal"}  # steps/requirements.in


def module_name(path: Path) -> str:
    rel = path.relative_to(STEPS_DIR.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def imports(path: Path) -> list[tuple[int, str, int]]:
    """(line, module as written, level) of every `from … import` and `import` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or "", node.level))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, 0) for a in node.names]
    return found


def resolved(path: Path, module: str, level: int) -> str:
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (level - 1)]
    return ".".join([*package, *([module] if module else [])])


def test_relative_imports_only_and_only_the_image_packages() -> None:
    found = []
    for path in MODULES:
        for line, module, level in imports(path):
            top = module.split(".")[0]
            if level == 0 and top == "steps":
                found.append(f"{path.relative_to(STEPS_DIR.parent)}:{line}: absolute import of {module}")
            elif level == 0 and top not in set(sys.stdlib_module_names) | THIRD_PARTY | {"__future__"}:
                found.append(f"{path.relative_to(STEPS_DIR.parent)}:{line}: imports {module}")
    assert not found, found


def test_no_import_cycle() -> None:
    known = {module_name(p) for p in MODULES}
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        name = module_name(path)
        edges = {resolved(path, m, level) for _, m, level in imports(path) if level}
        graph[name] = {e for e in edges if e in known and e != name and not name.startswith(e + ".")}
    # the step that packages reaches every lib module through the source, pusher and resume modules
    assert {"steps.lib.source", "steps.lib.pusher", "steps.lib.resume", "steps.lib.layout"} <= graph["steps.package"]
    assert "steps.lib.layout" in graph["steps.lib.resume"] and not graph["steps.lib.layout"] & {"steps.lib.resume"}
    assert not cycles(graph), cycles(graph)


def test_each_launcher_runs_its_step() -> None:
    launchers = sorted(p.stem for p in (STEPS_DIR / "bin").glob("*.py"))
    assert launchers == sorted(STEPS)
    for name in STEPS:
        lines = (STEPS_DIR / "bin" / f"{name}.py").read_text().splitlines()
        assert lines[0] == "#!/usr/bin/env python3" and lines[-1] == "run_step(main)", name
        assert lines[1].startswith(f"from steps.{name} import main  "), name


SCHEME_PREFIXES = ("s3:", "hf:")


def test_no_scheme_is_parsed_outside_the_source_module(tmp_path: Path) -> None:
    """A model source's scheme is read in steps/lib/source.py alone (`split_uri`, `SCHEMES`): no other module slices
    a URI by its prefix or compares a prefix with a scheme."""
    probe = tmp_path / "probe.py"
    probe.write_text('a.startswith(("s3://", "hf://"))\nb = a[len("s3://") :]\nc = a.removeprefix("hf://")\n')
    assert scheme_parses([probe]) == [f"{probe}:1", f"{probe}:2", f"{probe}:3"], "the detector sees each form"
    found = scheme_parses([p for p in MODULES if p.name != "source.py"])
    assert not found, f"scheme prefixes parsed outside steps/lib/source.py: {found}"


def scheme_parses(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "removeprefix"):
                texts = [a.value for a in ast.walk(node) if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if any(t.startswith(SCHEME_PREFIXES) for t in texts):
                    found.append(f"{where(path)}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
                if any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith(SCHEME_PREFIXES) for a in node.args):
                    found.append(f"{where(path)}:{node.lineno}")
    return sorted(set(found))


def where(path: Path) -> str:
    return str(path.relative_to(STEPS_DIR.parent)) if path.is_relative_to(STEPS_DIR.parent) else str(path)
