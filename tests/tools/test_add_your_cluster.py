"""docs/operate/add-your-cluster.md: its example stack renders as written (and as its TCP variant), with no warning,
and every fact it asks for comes with an `oc` command and names keys the program reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, VALIDATOR
from tools import config_reference, render

PAGE = ROOT / "docs" / "operate" / "add-your-cluster.md"


def example() -> tuple[str, str]:
    """The page's stack file: (stack name, text), from the yaml block that opens with `# Pulumi.<stack>.yaml`."""
    for block in re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S):
        named = re.match(r"# Pulumi\.([a-z0-9-]+)\.yaml\n", block)
        if named:
            return named[1], block
    raise AssertionError(f"{PAGE.name} has no ```yaml block opening with `# Pulumi.<stack>.yaml`")


def render_in(tmp_path: Path, stack: str, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(text)
    status = render.render(stack, tmp_path / "out", validate=VALIDATOR.exists(), config_dir=tmp_path)
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    return out.out


def test_the_example_stack_renders_without_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack, text = example()
    out = render_in(tmp_path, stack, text, capsys)
    assert "warning:" not in out, out
    assert "network_mode: rdma" in out and "== cluster prerequisites" in out
    # the page's stack is its own: a name no committed stack has
    assert not (ROOT / f"Pulumi.{stack}.yaml").exists()


def test_its_tcp_variant_renders_as_the_page_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ "A TCP cluster: `network: {mode: tcp}`, no `security`"."""
    assert "`network: {mode: tcp}`, no `security`" in PAGE.read_text()
    stack, text = example()
    config = yaml.safe_load(text)
    config["config"]["ml-dev-env:network"] = {"mode": "tcp"}
    del config["config"]["ml-dev-env:security"]
    out = render_in(tmp_path, stack, yaml.safe_dump(config), capsys)
    assert "warning:" not in out and "network_mode: tcp" in out, out


def test_every_fact_has_an_oc_command_and_keys_the_program_reads() -> None:
    table = PAGE.read_text().split("## 1. Collect the facts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| fact")]
    assert len(rows) >= 8, rows
    reference = config_reference.generate()
    for row in rows:
        fact, key_cell, ask = (cell.strip() for cell in row.strip("|").split(" | ", 2))
        assert "`oc " in ask, f"{fact}: no oc command"
        for key in re.findall(r"`([a-zA-Z.\[\]]+)`", key_cell):
            assert f"| `{key}` |" in reference, f"{fact}: {key} is not a configuration key"
    for fact in ("nodes", "GPUs per node", "SR-IOV", "TCP", "storage classes", "namespace"):
        assert fact in table, fact
