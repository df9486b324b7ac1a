"""inpod/lib/usersecrets.py: the listed keys, their values from a mount laid out as the kubelet's atomic writer does,
and what is shown (names and present/missing only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inpod import contract
from inpod.lib import usersecrets
from inpod.ml_dev import common
from tests.podsim.layout import AtomicVolume

VALUE = "s3cr3t-value-0123456789abcdef"


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    root = tmp_path / "secrets"
    AtomicVolume(root / "wandb", mode=0o440).write_volume(
        {"secretName": "wandb", "items": [{"key": "WANDB_API_KEY", "path": "WANDB_API_KEY"}], "optional": True},
        {"WANDB_API_KEY": VALUE + "\n", "UNLISTED": "never-mounted-value"},
    )
    AtomicVolume(root / "hf", mode=0o440).write_volume(
        {"secretName": "hf", "items": [{"key": "HF_TOKEN", "path": "HF_TOKEN"}], "optional": True}, {}
    )
    return root


def test_values_are_the_listed_keys_of_the_mount_without_trailing_newlines(mount: Path) -> None:
    assert usersecrets.values(mount) == {"WANDB_API_KEY": VALUE}
    assert usersecrets.values(mount / "nowhere") == {}


def test_presence_names_what_is_missing(mount: Path) -> None:
    listed = usersecrets.parse("wandb/WANDB_API_KEY hf/HF_TOKEN bad/not-a-name")
    assert listed == [("wandb", "WANDB_API_KEY"), ("hf", "HF_TOKEN")]
    found = usersecrets.presence(listed, mount)
    assert found == {"wandb": {"WANDB_API_KEY": True}, "hf": {"HF_TOKEN": False}}
    lines = usersecrets.missing_lines({"ml-dev-env-0": found, "ml-dev-env-1": None})
    assert lines[0].startswith("Secret hf key HF_TOKEN is missing on pod ml-dev-env-0") and "ml-dev-env-1" in lines[1]
    assert usersecrets.status_line(found) == "secrets: wandb (WANDB_API_KEY) hf (HF_TOKEN MISSING)"
    assert usersecrets.status_line({}) == ""


def test_what_is_shown_holds_no_value_length_or_hash(mount: Path) -> None:
    import hashlib

    found = usersecrets.presence([("wandb", "WANDB_API_KEY")], mount)
    shown = (
        usersecrets.html_section({"p0": found}) + usersecrets.status_line(found) + usersecrets.presence_script([("wandb", "WANDB_API_KEY")])
    )
    for leak in (VALUE, str(len(VALUE)), hashlib.sha256(VALUE.encode()).hexdigest()[:12]):
        assert leak not in shown
    assert 'id="secrets"' in shown and "present" in shown
    assert usersecrets.html_section({"p0": {}}) == "", "no card when none is listed"


def test_read_listed_parses_devloop_env(tmp_path: Path) -> None:
    env = tmp_path / "devloop.env"
    env.write_text(f"ML_DEV_SSH_PORT=2222\n{contract.SECRETS_ENV}='wandb/WANDB_API_KEY hf/HF_TOKEN'\n")
    assert usersecrets.read_listed(env) == [("wandb", "WANDB_API_KEY"), ("hf", "HF_TOKEN")]
    env.write_text(f"{contract.SECRETS_ENV}=''\n")
    assert usersecrets.read_listed(env) == [] and usersecrets.read_listed(tmp_path / "none") == []


def test_listed_keys_never_travel_from_the_shell_and_never_go_in_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = tmp_path / "devloop.env"
    env.write_text(f"{contract.SECRETS_ENV}=wandb/WANDB_API_KEY\n")
    monkeypatch.setenv("ML_DEV_DEVLOOP_ENV", str(env))
    monkeypatch.setattr(common, "container_env", lambda: {})
    monkeypatch.setenv("WANDB_API_KEY", "stale-shell-value")
    monkeypatch.setenv("MY_FLAG", "travels")
    carried = common.launch_env(["OTHER=x"])
    assert "WANDB_API_KEY" not in carried and carried["MY_FLAG"] == "travels" and carried["OTHER"] == "x"
    with pytest.raises(SystemExit):
        common.launch_env(["WANDB_API_KEY=typed"])


def test_the_home_page_fragment_has_the_card_from_the_agents_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page (inpod/home/page.py fragment) shows each pod's names and present/missing from its /activity report."""
    from inpod.home import page

    monkeypatch.setenv(contract.STATE_DIR_ENV, str(tmp_path))
    col = page.Collector()
    col.pods = ["ml-dev-env-0", "ml-dev-env-1", "ml-dev-env-2"]
    col.reports = {
        "ml-dev-env-0": {"signals": [], "secrets": {"wandb": {"WANDB_API_KEY": True}}},
        "ml-dev-env-1": {"signals": [], "secrets": {"wandb": {"WANDB_API_KEY": False}}},
    }
    html = page.fragment(col, now=0.0)
    card = html[html.index('<section id="secrets"') :]
    assert 'class="card bad"' in card, "a missing key or an unreachable pod marks the card"
    assert 'ml-dev-env-0</td><td>wandb/WANDB_API_KEY <span class="ok">present' in card
    assert 'ml-dev-env-1</td><td>wandb/WANDB_API_KEY <span class="bad">MISSING' in card
    assert 'ml-dev-env-2</td><td class="neutral">unknown' in card
    col.reports = {p: {"signals": [], "secrets": {}} for p in col.pods}
    assert 'id="secrets"' not in page.fragment(col, now=0.0), "none listed: no card"
