"""inpod/lib/pod.py env_records_dir: each environment's records under its own name; the old shared ones move once."""

from __future__ import annotations

from pathlib import Path

import pytest

from inpod import contract
from inpod.lib import pod


def test_old_records_move_once_into_the_environment_that_looks_and_nothing_is_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = tmp_path / contract.WORKSPACE_RECORDS_DIR
    (top / "runs" / "r1").mkdir(parents=True)
    (top / "runs" / "r1" / "x.json").write_text("old r1")
    (top / "fabric").mkdir()
    (top / "fabric" / "latest.json").write_text("old fabric")
    monkeypatch.setenv("ML_DEV_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("POD_NAME", "lab-a-0")
    mine = Path(contract.records_dir(str(tmp_path), "lab-a"))
    (mine / "fabric").mkdir(parents=True)
    (mine / "fabric" / "latest.json").write_text("new fabric")  # written already by this release
    assert pod.env_records_dir() == mine
    assert (mine / "runs" / "r1" / "x.json").read_text() == "old r1"
    assert (mine / "fabric" / "latest.json").read_text() == "new fabric"
    [kept] = [p for p in (mine / "fabric").iterdir() if p.name.startswith("latest.json.before-")]
    assert kept.read_text() == "old fabric"
    assert sorted(p.name for p in top.iterdir()) == [contract.ENV_RECORDS_DIR]
    # the other environment on the claim finds nothing to take
    monkeypatch.setenv("POD_NAME", "lab-b-1")
    assert pod.env_records_dir() == Path(contract.records_dir(str(tmp_path), "lab-b"))
    assert not pod.env_records_dir().exists()
    assert pod.move_legacy(top, mine) == []
