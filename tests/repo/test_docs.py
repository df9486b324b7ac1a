"""The documentation: the site's generated pages are exactly what the code generates, the README stays short
and links only to what exists (the site itself is built --strict by `make docs`, which `make test` runs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT
from tools import config_reference, docs_reference

DOCS = ROOT / "docs"
README_MAX_LINES = 250


def test_config_reference_is_current() -> None:
    page = (DOCS / "ref" / "configuration.md").read_text()
    assert config_reference.generate() in page, "docs/ref/configuration.md is stale: run `make docs-generate`"


def test_outputs_exit_codes_and_prerequisites_are_current() -> None:
    pages = [str(DOCS / "ref" / "outputs.md"), str(DOCS / "ref" / "exit-codes.md"), str(DOCS / "operate" / "prerequisites.md")]
    assert docs_reference.main(["--check", *pages]) == 0, "run `make docs-generate`"
    for block, (start, _) in docs_reference.blocks():
        assert any(start in Path(p).read_text() for p in pages), f"no page holds {start}"
        assert block.count("\n| ") >= 5, block


def test_readme_is_short_and_links_only_to_what_exists() -> None:
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail into docs/"
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/") for link in links), "the README points into the documentation site"
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        target = link.split("#", 1)[0]
        assert target and (ROOT / target).exists(), f"README links to {link!r}, which does not exist"


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert pages and all(f": {page}" in nav for page in pages), [p for p in pages if f": {p}" not in nav]


# The pages by reader that issue 20 asks for, in its order (other pages may sit between them).
READER_PAGES = {
    "Use": ["use/day-in-the-life.md", "use/laptop-and-vscode.md", "use/debugging.md", "use/suspend-and-idle.md", "use/teams.md"],
    "Operate": [
        "operate/prerequisites.md",
        "operate/first-up.md",
        "operate/rebuilds.md",
        "operate/adoption.md",
        "operate/sccs.md",
        "operate/images.md",
        "operate/fabric-check.md",
        "operate/kueue.md",
    ],
    "Models": ["models/pipeline.md", "models/sources.md", "models/registry.md", "models/benchmarks.md"],
    "Reference": ["ref/configuration.md", "ref/outputs.md", "ref/guard-rails.md", "ref/exit-codes.md"],
}


def test_nav_lists_the_pages_by_reader_in_order() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    sections = {
        title: [page for entry in pages for page in entry.values()]
        for item in nav
        for title, pages in item.items()
        if isinstance(pages, list)
    }
    for section, wanted in READER_PAGES.items():
        listed = [page for page in sections.get(section, []) if page in wanted]
        assert listed == wanted, f"nav section {section!r}: {listed} (want {wanted}, in this order)"
    # The pages split out of longer ones open with one sentence: who the page is for and what they get.
    for page in ("use/laptop-and-vscode.md", "use/debugging.md", "operate/rebuilds.md", "operate/adoption.md", "operate/sccs.md",
                 "models/sources.md", "models/registry.md"):  # fmt: skip
        intro = (DOCS / page).read_text().split("\n\n")[1]
        assert intro.startswith("For ") and intro.rstrip().endswith("."), f"{page} opens with: {intro!r}"


def test_reference_covers_every_top_level_key() -> None:
    block = config_reference.generate()
    for key in ("cluster", "nodes", "network", "security", "access", "storage", "image", "buildNodes"):
        assert f"| `{key}` |" in block
    assert "`network.rdma.hcas`" in block and "`storage.volumes[].scope`" in block


def test_presets_table_is_current() -> None:
    page = (DOCS / "operate" / "images.md").read_text()
    assert config_reference.presets_table() in page, "docs/operate/images.md is stale: run `make docs-generate`"


def test_every_config_key_has_a_description() -> None:
    rows = [line for line in config_reference.generate().splitlines() if line.startswith("| `")]
    assert rows, "the reference lists no keys"
    undescribed = [row.split("|")[1].strip() for row in rows if not row.rstrip("| ").rsplit("|", 1)[-1].strip()]
    assert not undescribed, f"keys without a description (add Field(description=...) or a model docstring): {undescribed}"


def test_render_example_matches_a_real_render(tmp_path: Path) -> None:
    """Every line of the getting-started page's barcelona render example is in the real report (`...` abridges)."""
    readme = (DOCS / "getting-started.md").read_text()
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
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("...")) + ("" if line.endswith("...") else "$"))
        assert any(pattern.match(out) for out in report), f"docs/getting-started.md render example line not in the report: {line!r}"


def test_the_tools_box_names_the_pulumi_cli_the_program_is_tested_with() -> None:
    """docs/operate/deploy.md's tools box: the Pulumi CLI version is the locked Python SDK's (released together), and
    the backend choices and the passphrase variable of a self-managed backend are there."""
    sdk = re.search(r"^pulumi==([0-9.]+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert sdk, "requirements.txt pins pulumi"
    box = (DOCS / "operate" / "deploy.md").read_text().split("## Tools", 1)[1].split("\n## ", 1)[0]
    versions = set(re.findall(r"\b3\.\d+\.\d+\b", box))
    assert versions == {sdk[1]}, f"the tools box names {versions}, the lock pulumi=={sdk[1]}"
    for needed in ("--version " + sdk[1], "`oc`", "pulumi login --local", "s3://", "PULUMI_CONFIG_PASSPHRASE"):
        assert needed in box, needed


def test_day_in_the_life_is_day_one_on_one_screen() -> None:
    """docs/use/day-in-the-life.md: at most 60 lines, edit -> run -> watch -> debug -> stop, each step one command (one
    line in one bash block) and what it shows; the internals are a linked Reference page; the messages it quotes
    are the ones `ml-dev` prints."""
    page = (DOCS / "use" / "day-in-the-life.md").read_text()
    assert len(page.splitlines()) <= 60, len(page.splitlines())
    steps = re.findall(r"^\*\*(\d)\. (\w+)\*\*", page, re.M)
    assert steps == [("1", "Edit"), ("2", "Run"), ("3", "Watch"), ("4", "Debug"), ("5", "Stop")], steps
    for part in re.split(r"^\*\*\d\. ", page, flags=re.M)[1:]:
        blocks = re.findall(r"```bash\n(.*?)```", part, re.S)
        assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) == 1, part
        assert "You see" in part or "You edit" in part, part
    assert "(../ref/dev-loop.md)" in page and (DOCS / "ref" / "dev-loop.md").exists()
    shipped = " ".join(p.read_text() for p in (ROOT / "inpod" / "ml_dev").glob("*.py"))
    for quoted in ("ml-dev: synced ", "is on shared storage: nothing to sync", "; stopping every rank", " exited with status ",
                   "runs under debugpy on 127.0.0.1:", "then attach to localhost:"):  # fmt: skip
        assert quoted in page and quoted in shipped, quoted
    # the run's closing line is `ml-dev: <kind>: <words>` (launch.py RunEvents.lines): a failed rank's kind is FAILED
    assert "ml-dev: FAILED: rank " in page and 'f"ml-dev: {e.kind}: {e.words}"' in shipped and '"FAILED"' in shipped


def test_reference_defaults_are_written_as_a_stack_file_writes_them() -> None:
    """Defaults read as YAML (`false`, `["IPC_LOCK", "SYS_RESOURCE"]`), never as a Python repr (`False`, `['IPC_LOCK']`)."""
    block = config_reference.generate()
    defaults = [row.split(" | ")[2] for row in block.splitlines() if row.startswith("| `")]
    reprs = [d for d in defaults if re.search(r"`(True|False|None)`|\['|\{'|': '", d)]
    assert not reprs, reprs
    assert "`false`" in defaults and '`["IPC_LOCK", "SYS_RESOURCE"]`' in defaults
