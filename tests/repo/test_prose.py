"""Prose that cannot drift: what the docs and comments say about the repository is checked against it.

* A commit the prose cites (`at 6fdb437`, `baseline a916fa9`, `commit <40 hex>`) is in this repository's history,
  unless its line names the upstream repository it belongs to (a GitHub address: a cited upstream source).
* Words the code contradicts are not used: `DRIFT` holds each with what the code says instead.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROSE_SUFFIXES = {".md", ".py", ".sh", ".yml", ".yaml", ".txt", ".toml", ".Containerfile", ".in"}
SKIP_DIRS = {".git", ".venv", "rendered", "__pycache__", "site", "node_modules"}
# a hash after the words that cite a commit; a hash has a digit and a letter (a word like `deadbeef` or a number is none)
CITED = re.compile(
    r"\b(?:commit|commits|at|baseline|against|of|tree of|A =|B =|--baseline)\s+`?"
    r"(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])([0-9a-f]{7,40})\b"
)
UPSTREAM = re.compile(r"https?://github\.com/|\bgithub\.com/")

DRIFT = {
    # the usage recorder is a Deployment (components/lifecycle.py `usage_deployment`), not a CronJob
    re.compile(r"\busage\s+CronJob|CronJob(?:'s)?\s+schedule|usage\W+\w*\s*CronJob", re.I): "the usage recorder is a Deployment",
}


def prose_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    return [
        ROOT / f
        for f in tracked
        if f and not SKIP_DIRS & set(Path(f).parts) and (Path(f).suffix in PROSE_SUFFIXES or Path(f).name in ("Makefile",))
        and (ROOT / f).is_file()
    ]  # fmt: skip


def cited(text: str) -> list[tuple[int, str]]:
    """(line, hash) of each commit the text cites to this repository (not an upstream's: see UPSTREAM)."""
    return [(n, m.group(1)) for n, line in enumerate(text.splitlines(), 1) if not UPSTREAM.search(line) for m in CITED.finditer(line)]


def in_history(hashes: set[str]) -> set[str]:
    """The hashes that name a commit of this repository's history."""
    if not hashes:
        return set()
    proc = subprocess.run(
        ["git", "cat-file", "--batch-check=%(objecttype)"], cwd=ROOT, input="".join(f"{h}^{{commit}}\n" for h in sorted(hashes)),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {h for h, answer in zip(sorted(hashes), proc.stdout.splitlines(), strict=True) if answer == "commit"}


def test_the_detector_sees_a_cited_commit() -> None:
    text = (
        "measured at 6d3dfbd (3 runs)\nagainst `ca9fafc`\nbaseline a916fa9\ncommit 0123456789abcdef0123456789abcdef01234567\n"
        "upstream (commit 691953d8d502f54088f776c5ba2aeed0a5ac945d): https://github.com/linux-rdma/rdma-core\n"
        "at 1234567 and at deadbeef and sha256 634a1d92\n"
    )
    assert cited(text) == [(1, "6d3dfbd"), (2, "ca9fafc"), (3, "a916fa9"), (4, "0123456789abcdef0123456789abcdef01234567")]


def test_cited_commits_are_in_the_history() -> None:
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True, check=True)
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone holds no history to check against (CI's checkout fetches it all: fetch-depth 0)")
    found = [(path, n, h) for path in prose_files() if path != Path(__file__) for n, h in cited(path.read_text(errors="replace"))]
    known = in_history({h for _, _, h in found})
    missing = [f"{path.relative_to(ROOT)}:{n}: {h}" for path, n, h in found if h not in known]
    assert found, "the detector found no cited commit at all"
    assert not missing, f"commits cited that are not in this repository's history: {missing}"


def test_no_word_the_code_contradicts() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]} ({why})"
        for path in prose_files()
        if path != Path(__file__)
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for pattern, why in DRIFT.items()
        if pattern.search(line)
    ]
    assert not found, found
