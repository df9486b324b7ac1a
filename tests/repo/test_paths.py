"""Every repository path the project quotes exists (issue 36 item 6): in docs/, every README, CONTRIBUTING, and the
code's docstrings and comments (Python, shell, Makefile, Containerfiles, YAML), each path that starts at one of the
repository's top-level folders must name a file or folder that is there, and each "README, '<section>'" reference
(or "<file>.md, '<section>'") must name a heading of that file. Paths of other projects that happen to start like
ours are listed in UPSTREAM with the repository they belong to; a path in a pattern (`docs/img/architecture/<stack>.svg`)
needs its folder."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Paths of other repositories, quoted where the code cites upstream behaviour: path -> the repository it is in.
UPSTREAM: dict[str, str] = {
    "core/v1": "kubernetes/api",  # k8s.io/api's core group (also how type tokens spell it: kubernetes:core/v1:Pod)
    "core/v1/types.go": "kubernetes/api",
    "images/router/haproxy/conf/haproxy-config.template": "openshift/router",
    "site/content/en/docs/tasks/run/statefulset.md": "kubernetes-sigs/kueue",
}


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    return [line for line in out.splitlines() if (ROOT / line).exists()]


FILES = tracked()
TOP = sorted({f.split("/", 1)[0] for f in FILES if "/" in f})
PATH = re.compile(r"(?<![\w./~$@:+-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w.@+-]+(?:/[\w.@+-]+)*/?)")
PATTERN_NEXT = "<{*$["  # a path that goes on with one of these is a pattern: its folder must exist
SECTION = re.compile(
    r"(?P<file>(?:[\w./-]+/)?README(?:\.md)?|[\w./-]+\.md)`?(?:'s)?,?\s+(?:section\s+)?[\"'“*](?P<title>[^\"'”*\n]{3,80})[\"'”*]"
    r"|[\"'“*](?P<title2>[^\"'”*\n]{3,80})[\"'”*] in the (?:top-level |repository's )?(?P<file2>README)\b"
)
COMMENTED = re.compile(r"(^|/)(Makefile|[^/]*\.(sh|ya?ml|toml|Containerfile|cfg|ini))$|Containerfile")


def prose_files() -> list[str]:
    return [f for f in FILES if f.endswith(".md") and (f.startswith("docs/") or "README" in f.rsplit("/", 1)[-1] or f == "CONTRIBUTING.md")]


def python_prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python source."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                yield first.lineno, first.value.value


def hash_comments(text: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            yield number, line


def quoted() -> Iterator[tuple[str, int, str]]:
    """(file, first line, text) of the prose that quotes paths: whole Markdown files (a reference may wrap), each
    docstring and comment of the code."""
    for name in prose_files():
        yield name, 1, (ROOT / name).read_text()
    for name in FILES:
        if name.endswith(".py"):
            for number, text in python_prose((ROOT / name).read_text()):
                yield name, number, text
        elif COMMENTED.search(name):
            for number, text in hash_comments((ROOT / name).read_text(errors="replace")):
                yield name, number, text


def line_of(text: str, first: int, offset: int) -> int:
    return first + text.count("\n", 0, offset)


def paths_in(text: str) -> Iterator[tuple[int, str]]:
    """(offset, path) of each repository path in `text`."""
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        after = text[match.end() : match.end() + 1]
        if after and after in PATTERN_NEXT:
            path = path.rsplit("/", 1)[0] if not path.endswith("/") else path.rstrip("/")
        yield match.start(), path


def headings(markdown: str) -> set[str]:
    """The headings of a Markdown file, as a reader quotes them (no `#`, emphasis or code marks, any case)."""
    return {re.sub(r"[`*_]", "", m.group(1)).strip().lower() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", markdown, re.MULTILINE)}


def missing_paths() -> list[str]:
    have = set(FILES) | {str(Path(f).parent) for f in FILES} | {str(p) for f in FILES for p in Path(f).parents}
    out = []
    for name, first, text in quoted():
        for offset, path in paths_in(text):
            if path.rstrip("/") not in have and path not in UPSTREAM:
                out.append(f"{name}:{line_of(text, first, offset)}: {path}")
    return out


def sections(text: str, source: str) -> Iterator[tuple[int, str, str]]:
    """(offset, Markdown file, section title) of each "<file>, '<section>'" reference in `text` (quoted in `source`)."""
    for match in SECTION.finditer(text):
        file, title = (match.group("file"), match.group("title")) if match.group("title") else (match.group("file2"), match.group("title2"))
        if file in UPSTREAM or re.fullmatch(r"<[^>]+>", title.strip()):  # another repository's, or a placeholder
            continue
        if file.endswith("README") or file == "README.md":
            folder = file.rsplit("/", 1)[0] if "/" in file else ""
            file = f"{folder}/README.md" if folder else "README.md"
        elif not (ROOT / file).exists():  # a page named relative to the quoting file (docs links)
            file = str(Path(source).parent / file)
        yield match.start(), file, " ".join(title.split())


def missing_sections() -> list[str]:
    out = []
    for name, first, text in quoted():
        for offset, file, title in sections(text, name):
            target = ROOT / file
            if not target.is_file() or title.lower() not in headings(target.read_text()):
                out.append(f"{name}:{line_of(text, first, offset)}: {file}, {title!r}")
    return out


def test_every_quoted_repository_path_exists() -> None:
    missing = missing_paths()
    assert not missing, (
        "quoted paths that are not in the repository (fix the pointer, or list an upstream path in UPSTREAM):\n" + "\n".join(missing)
    )


def test_every_quoted_readme_section_exists() -> None:
    missing = missing_sections()
    assert not missing, "sections quoted that are not headings of that file:\n" + "\n".join(missing)


def test_upstream_paths_are_named_with_their_repository_and_are_not_ours() -> None:
    for path, repo in UPSTREAM.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo), (path, repo)
        assert not (ROOT / path).exists(), f"{path} is in this repository: no need to list it"


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("see `components/naming.py`, `stack_scc_name`", ["components/naming.py"]),
        ("(components/nccl.py), all_reduce_perf", ["components/nccl.py"]),
        ("steps/README.md:170 and tests/repo/test_paths.py::test_x.", ["steps/README.md", "tests/repo/test_paths.py"]),
        ("docs/img/architecture/<stack>.svg", ["docs/img/architecture"]),
        ("/opt/ml-dev-env/inpod/home/page.py and https://github.com/o/r/blob/main/tools/x.go", []),
        ("the folder docs/img/ holds", ["docs/img/"]),
    ],
)
def test_paths_are_found_in_prose(text: str, found: list[str]) -> None:
    assert [path for _, path in paths_in(text)] == found


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('in the top-level README, "Long and flaky pushes".', [("README.md", "Long and flaky pushes")]),
        ("see *Image build (admins)* in the top-level README", [("README.md", "Image build (admins)")]),
        ("steps/README.md, 'Resumable pushes'", [("steps/README.md", "Resumable pushes")]),
        ("the README's suspend procedure", []),
        ("each \"README, '<section>'\" reference", []),
        ('the top-level README,\n  "Long and flaky pushes"', [("README.md", "Long and flaky pushes")]),
    ],
)
def test_section_references_are_found(text: str, found: list[tuple[str, str]]) -> None:
    assert [(file, title) for _, file, title in sections(text, "steps/README.md")] == found
