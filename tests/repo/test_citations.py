"""The repository speaks for itself: no file cites a document a reader of this repository does not have
(a specification's sections, a `reference/` tree, numbered seeds, a history file). State the fact, or
link a file of this repository instead.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# schemas/: upstream schema data, copied unchanged (its descriptions link upstream's own documentation)
SKIP_DIRS = {".git", ".venv", "rendered", "site", "bench-out", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "schemas"}

SECTION = "\u00a7"  # spelled as an escape so that this file does not match itself
CITATION = re.compile(
    "|".join(
        [
            r"\bSPEC\.md\b",
            rf"\bSPEC\s*{SECTION}",
            r"\breference/",
            rf"\breference\s*{SECTION}",
            r"\bseeds?/",
            r"\bseed \d+",
            rf"\bhistory\s*{SECTION}",
            SECTION,
        ]
    )
)


def files() -> list[Path]:
    return sorted(
        p for p in ROOT.rglob("*") if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts) and p != Path(__file__).resolve()
    )


def test_no_citation_of_documents_outside_the_repository() -> None:
    found = []
    for path in files():
        rel = path.relative_to(ROOT).as_posix()
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary
        found += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if CITATION.search(line)]
    assert not found, "cite the fact or a file of this repository instead:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_citation() -> None:
    for cited in (
        f"see SPEC.md {SECTION}5.1",
        f"(SPEC {SECTION}5.5)",
        "reference/ml-dev-env-framework.md",
        "seed 004",
        f"history {SECTION}4.1",
        f"reference {SECTION}3.6",
    ):
        assert CITATION.search(cited), cited
    for fine in ("POD_SPEC_PATHS", "def write_model(directory, seed: int = 0)", "random.Random(seed)", "a reference to a Secret"):
        assert not CITATION.search(fine), fine
