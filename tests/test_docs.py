"""The README's configuration reference is exactly what the models generate."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, VALIDATOR
from tools import config_reference


def test_readme_config_reference_is_current() -> None:
    readme = (ROOT / "README.md").read_text()
    assert config_reference.generate() in readme, "README is stale: run `make docs`"


def test_reference_covers_every_top_level_key() -> None:
    block = config_reference.generate()
    for key in ("cluster", "nodes", "network", "security", "access", "storage", "image", "buildNodes"):
        assert f"| `{key}` |" in block
    assert "`network.rdma.hcas`" in block and "`storage.volumes[].scope`" in block


def test_readme_presets_table_is_current() -> None:
    assert config_reference.presets_table() in (ROOT / "README.md").read_text(), "README is stale: run `make docs`"


def test_every_config_key_has_a_description() -> None:
    rows = [line for line in config_reference.generate().splitlines() if line.startswith("| `")]
    assert rows, "the reference lists no keys"
    undescribed = [row.split("|")[1].strip() for row in rows if not row.rstrip("| ").rsplit("|", 1)[-1].strip()]
    assert not undescribed, f"keys without a description (add Field(description=...) or a model docstring): {undescribed}"


def test_readme_render_example_matches_a_real_render(tmp_path: Path) -> None:
    """Every line of the README's barcelona render example is in the real report (`...` marks an abridgement)."""
    readme = (ROOT / "README.md").read_text()
    head = "For barcelona the end of the report reads"
    block = readme[readme.index(head) :].split("```text\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "barcelona", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = [line.replace(str(tmp_path / "out"), "rendered") for line in proc.stdout.splitlines()]
    for line in block.splitlines():
        if line.startswith("== schema check") and not VALIDATOR.exists():
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("...")) + ("" if line.endswith("...") else "$"))
        assert any(pattern.match(out) for out in report), f"README render example line not in the report: {line!r}"
