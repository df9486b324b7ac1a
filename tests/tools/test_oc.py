"""tools/oc.py: a missing or silent `oc` is a failed outcome with one line, never an exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import oc


def test_missing_oc_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no oc here
    proc = oc.run_oc(["get", "nodes"])
    assert proc.returncode == 127 and proc.stdout == "" and proc.stderr.startswith("oc is not installed")


def test_oc_that_does_not_answer_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "oc").write_text("#!/bin/sh\nexec sleep 30\n")
    (tmp_path / "oc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(oc, "TIMEOUT", 0.5)
    proc = oc.run_oc(["get", "nodes"])
    assert proc.returncode == 124 and proc.stderr == "oc did not answer within 0.5 s"


def test_answers_pass_through(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "oc").write_text('#!/bin/sh\necho "args: $*"; echo "Error from server (Forbidden)" >&2; exit 1\n')
    (tmp_path / "oc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    proc = oc.run_oc(["get", "nodes", "-o", "json"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "args: get nodes -o json\n", "Error from server (Forbidden)\n")
