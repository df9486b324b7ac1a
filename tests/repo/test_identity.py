"""Pulumi resource identity must only change on purpose.

The provider adopts existing objects (`upsertExistingObjects`). A resource whose URN changes — its type, its
name or its parent chain — is, to Pulumi, a new resource plus a deleted one: the new one adopts the live
object (server-side apply), then the old one's delete removes that very object (or, with `retainOnDelete`,
orphans it). Every rename therefore needs `pulumi.ResourceOptions(aliases=[...])` with the old name/parent.

This test compares the URNs of both committed stacks (without the stack/project prefix; content-hash name
suffixes shown as `{hash}`) with the snapshot in tests/identity/<stack>.txt. When a change is deliberate
(a new object, or a rename that carries an alias), regenerate the snapshot and commit it:

    .venv/bin/python tests/repo/test_identity.py --write
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

if __name__ == "__main__" and not __package__:
    # Run as a file (`python tests/repo/test_identity.py --write`): re-run as the module of the repository package.
    os.execve(
        sys.executable,
        [sys.executable, "-m", "tests.repo.test_identity", *sys.argv[1:]],
        {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])),
        },
    )

from tests.conftest import STACKS, run_objects, stack_objects

ROOT = Path(__file__).resolve().parents[2]

SNAPSHOTS = Path(__file__).resolve().parents[1] / "identity"
HASH = re.compile(r"-[0-9a-f]{10}$")


def urns(stack: str) -> list[str]:
    """`<parent type chain>$<type>::<name>` of every resource the stack registers (URN minus its prefix)."""
    result = run_objects(stack, stack_objects(stack))
    assert result.error is None, result.error
    lines = []
    for r in result.resources:
        parent = r.options.get("parent") or ""
        # urn:pulumi:<stack>::<project>::<type chain>::<name>
        chain = parent.split("::")[2] if parent.count("::") >= 3 else ""
        lines.append(f"{chain}${r.typ}::{HASH.sub('-{hash}', r.name)}" if chain else f"{r.typ}::{r.name}")
    return sorted(set(lines))


def snapshot(stack: str) -> Path:
    return SNAPSHOTS / f"{stack}.txt"


@pytest.mark.parametrize("stack", STACKS)
def test_resource_identities_match_the_committed_snapshot(stack: str) -> None:
    path = snapshot(stack)
    assert path.exists(), f"no identity snapshot for stack {stack}: run `.venv/bin/python tests/repo/test_identity.py --write`"
    expected = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    current = urns(stack)
    gone = sorted(set(expected) - set(current))
    new = sorted(set(current) - set(expected))
    assert not gone and not new, (
        f"Pulumi resource identities of stack {stack} changed.\n"
        + "".join(f"  - gone (a live object would be DELETED, or orphaned if retained): {u}\n" for u in gone)
        + "".join(f"  + new: {u}\n" for u in new)
        + "A rename needs `aliases=[pulumi.Alias(name=<old name>, parent=<old parent>)]` on the resource. "
        "If the change is deliberate, regenerate with `.venv/bin/python tests/repo/test_identity.py --write` and commit "
        "tests/identity/."
    )


def test_the_snapshot_covers_the_stateful_objects() -> None:
    text = snapshot("barcelona").read_text()
    for line in (
        "kubernetes:apps/v1:StatefulSet::gpu-statefulset",
        "kubernetes:core/v1:PersistentVolumeClaim::gpu-storage-datasets",
        "kubernetes:tekton.dev/v1:PipelineRun::models-run-mistral-small-24b-fp16",
        "kubernetes:build.openshift.io/v1:BuildConfig::image-runtime",
    ):
        assert line in text, line


def write() -> None:
    SNAPSHOTS.mkdir(exist_ok=True)
    for stack in STACKS:
        header = f"# Pulumi resource identities of stack {stack}; regenerate: .venv/bin/python tests/repo/test_identity.py --write\n"
        snapshot(stack).write_text(header + "\n".join(urns(stack)) + "\n")
        print(f"wrote {snapshot(stack).relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: tests/repo/test_identity.py --write")
    write()
