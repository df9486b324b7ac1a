"""The models mounted from their images (contract.MODELS_ENV): what `ml-dev status` and the home page say of them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from inpod import contract
from inpod.lib.pod import model_line, mounted_models

DIGEST = "sha256:" + "cd" * 32


def rendered(tmp_path: Path) -> list[dict[str, str]]:
    (tmp_path / "w4a16").mkdir()
    return [
        {"name": "mistral-w4a16", "path": str(tmp_path / "w4a16"), "image": f"registry:5000/ns/mistral@{DIGEST}"},
        {"name": "mistral-fp16", "path": str(tmp_path / "fp16"), "image": f"registry:5000/ns/mistral@{DIGEST.replace('cd', 'ef')}"},
    ]


def test_each_mounted_model_is_named_with_its_digest_and_a_missing_path_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.MODELS_ENV, json.dumps(rendered(tmp_path)))
    w4a16, fp16 = mounted_models()
    assert w4a16["digest"] == DIGEST and w4a16["present"] and not fp16["present"]
    assert model_line(w4a16) == f"mistral-w4a16 at {tmp_path / 'w4a16'} ({DIGEST})"
    assert model_line(fp16).endswith("NOT MOUNTED in this pod (the cluster dropped the image volume?)")


@pytest.mark.parametrize("value", ["", "not json", "{}", "[1]"])
def test_no_or_a_garbled_list_is_no_model(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.MODELS_ENV, value)
    assert mounted_models() == []


def test_the_home_page_lists_them_and_marks_the_card_when_one_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inpod.home import page

    view = page.View(None, {}, time.time(), None)  # type: ignore[arg-type]  # the card reads the env only
    monkeypatch.delenv(contract.MODELS_ENV, raising=False)
    assert page.models_html(view) == ("", "")
    monkeypatch.setenv(contract.MODELS_ENV, json.dumps(rendered(tmp_path)))
    body, _ = page.models_html(view)
    assert body.count("<tr>") == 3 and f"<code>{DIGEST}</code>" in body and "NOT MOUNTED" in body
    assert 'class="card bad"' in body
    (tmp_path / "x").mkdir()
    monkeypatch.setenv(contract.MODELS_ENV, json.dumps(rendered(tmp_path / "x")[:1]))
    body, _ = page.models_html(view)
    assert "NOT MOUNTED" not in body and 'class="card "' in body
