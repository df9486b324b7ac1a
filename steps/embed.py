"""How the step programs reach the cluster: as files of the tools image, or as one inlined script.

`steps/` is a package like `inpod/`: each step is a module (`download`, `package`, …) whose `main` a 4-line
launcher in `bin/` runs, and the code the steps share lives in `lib/`, one concern per module; inside the
package every import is relative (`from .lib.registry import RegistryClient`, in lib `from .runtime import log`).

Most steps run from the tools image: `shipped()` is their source (the launchers, the package and its `lib/`),
which the tools image build copies to `/opt/ml-dev-env/steps` (one immutable ConfigMap per directory, in its
build context: `SHIPPED_DIRS`) and which is an input of the image's hash, so a change to a step rebuilds it. A
Task runs `python3 /opt/ml-dev-env/steps/<name>.py` (`step_command`), the launcher; Python puts the launcher's
directory first on sys.path, and that directory holds the package `steps/`. The tests run the same files from a
tree `write_tree` lays out the same way. A script inlined into a Task is bound by Linux's 128 KiB limit on one
argument (Tekton's place-scripts init container); the files are not (a ConfigMap holds up to 1 MiB).

`EMBEDDED` steps run before the tools image exists (wait_image, on its public base image): for them
`step_script(name)` inlines the `steps/lib` modules a step imports into one script text, then the step module and
its launcher's call. Only the modules a step needs, directly or through another lib module, are inlined, in the
order of `LIB`. Both forms are deterministic (pure functions of the files).
"""

from __future__ import annotations

import ast
from pathlib import Path

STEPS_DIR = Path(__file__).resolve().parent
STEPS = ("download", "package", "mirror", "register", "upload_s3", "wait_image")
# Inlined in this order; a module may import only the ones before it.
LIB = ("runtime", "s3", "images", "registry", "model", "layout", "pusher", "checksum", "source", "resume")
EMBEDDED = ("wait_image",)  # run as inlined scripts (before the tools image exists); the rest from the image
IMAGE_STEPS_DIR = "/opt/ml-dev-env/steps"  # where images/tools.Containerfile puts `shipped()`
# ConfigMap (name suffix) -> directory under IMAGE_STEPS_DIR: ConfigMap keys cannot hold a `/`. The launchers at
# the root, the package (`steps/`: its __init__ and the step modules) and its lib.
SHIPPED_DIRS = {"steps": "", "steps-package": "steps", "steps-lib": "steps/lib"}
# ConfigMap (name suffix) -> (the directory of this package its files come from, their module names).
SOURCE_DIRS = {"steps": ("bin", STEPS), "steps-package": ("", ("__init__", *STEPS)), "steps-lib": ("lib", ("__init__", *LIB))}


def shipped() -> dict[str, dict[str, str]]:
    """The tools image's step files, per ConfigMap (see SHIPPED_DIRS): file name -> text."""
    return {
        part: {f"{m}.py": (STEPS_DIR / directory / f"{m}.py").read_text(encoding="utf-8") for m in names}
        for part, (directory, names) in SOURCE_DIRS.items()
    }


def write_tree(root: Path) -> Path:
    """Lay `shipped()` out under `root` as the tools image has it; returns the steps directory."""
    for config_map, files in shipped().items():
        directory = root / "steps" / SHIPPED_DIRS[config_map]
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text, encoding="utf-8")
    return root / "steps"


def step_command(name: str) -> list[str]:
    """The command of a Task step that runs step `name` from the tools image."""
    if name not in STEPS or name in EMBEDDED:
        raise ValueError(f"{name!r} is not a step of the tools image; those are: {', '.join(s for s in STEPS if s not in EMBEDDED)}")
    return ["python3", f"{IMAGE_STEPS_DIR}/{name}.py"]


_parsed: dict[str, ast.Module] = {}
"""Syntax trees by source text: a render asks for each step's modules several times (the trees are only read)."""


def _source(path: Path) -> tuple[ast.Module, str]:
    source = path.read_text(encoding="utf-8")
    if source not in _parsed:
        _parsed[source] = ast.parse(source)
    return _parsed[source], source


def _lib_imports(tree: ast.Module) -> set[str]:
    """The lib modules a module imports: `from .lib.X import …` (a step) or `from .X import …` (a lib module)."""
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 1:
            found.add(node.module.removeprefix("lib."))
    unknown = found - set(LIB)
    if unknown:
        raise ValueError(f"imports unknown lib modules {sorted(unknown)}; known: {', '.join(LIB)}")
    return found


def lib_modules(name: str) -> list[str]:
    """The lib modules step `name` needs (its imports and theirs), in inlining order."""
    if name not in STEPS:
        raise ValueError(f"unknown step {name!r}; known: {', '.join(STEPS)}")
    needed: set[str] = set()
    todo = _lib_imports(_source(STEPS_DIR / f"{name}.py")[0])
    while todo:
        module = todo.pop()
        if module not in needed:
            needed.add(module)
            todo |= _lib_imports(_source(STEPS_DIR / "lib" / f"{module}.py")[0])
    return [m for m in LIB if m in needed]


def _body(path: Path, keep_docstring: bool) -> tuple[str | None, str]:
    """Split a module into (docstring, code) without `from __future__` and the lib imports."""
    tree, source = _source(path)
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    docstring = ast.get_docstring(tree, clean=False)
    for node in tree.body:
        is_doc = node is tree.body[0] and docstring is not None
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        is_lib = isinstance(node, ast.ImportFrom) and node.level == 1
        if is_doc or is_future or is_lib:
            drop.update(range(node.lineno - 1, (node.end_lineno or node.lineno)))
    code = "".join(line for i, line in enumerate(lines) if i not in drop).strip("\n")
    return (docstring if keep_docstring else None), code


def step_script(name: str) -> str:
    """The complete script for step `name`: shebang, docstring, the inlined lib modules, step code, then what its
    launcher does (`run_step(main)`, when run as a script)."""
    modules = lib_modules(name)
    docstring, step = _body(STEPS_DIR / f"{name}.py", keep_docstring=True)
    sources = ", ".join(f"steps/lib/{m}.py" for m in modules)
    parts = [f"# --- steps/lib/{m}.py ---\n\n{_body(STEPS_DIR / 'lib' / f'{m}.py', keep_docstring=False)[1]}\n\n\n" for m in modules]
    return (
        "#!/usr/bin/env python3\n"
        f'"""{docstring}"""\n\n'
        f"# Generated by steps/embed.py from {sources} and steps/{name}.py; edit those files.\n"
        "from __future__ import annotations\n\n"
        f"{''.join(parts)}"
        f"# --- steps/{name}.py ---\n\n"
        f"{step}\n\n\n"
        f'if __name__ == "__main__":  # as steps/bin/{name}.py does\n'
        "    run_step(main)\n"
    )
