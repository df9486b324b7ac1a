"""The README's configuration reference is exactly what the models generate."""

from __future__ import annotations

from tests.conftest import ROOT
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
