"""The fan-out's rounds (inpod/ml_dev/fanout.py) with the hops stood in for: who sends to whom, how many rounds, what a
failed relay or an unreachable pod costs, and the settings' one-line refusals. The real hops (sshd, rsync, veths)
are tests/inpod/ml_dev/test_fanout.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from inpod import contract
from inpod.ml_dev import fanout, sync

TREE = "t" * 64


class FakeCluster:
    def __init__(self, me: int = 0) -> None:
        self.me = me

    def label(self, rank: int) -> str:
        return f"rank {rank} (pod-{rank})"


def run(
    monkeypatch: pytest.MonkeyPatch, pods: int, fail: Any = None, tries: int = 3, me: int = 0
) -> tuple[list[fanout.Hop], dict[int, str]]:
    """fan_out from rank `me` over the other ranks; `fail(src, dst, attempt)` -> None (the hop works) or
    (error, source_failed)."""
    attempts: dict[int, int] = {}

    def fake(src: int, dst: int) -> fanout.Hop:
        attempts[dst] = attempts.get(dst, 0) + 1
        bad = fail(src, dst, attempts[dst]) if fail else None
        if bad:
            return {"hash": "", "sent": 0, "error": bad[0], "source_failed": bad[1], "seconds": 0}
        return {"hash": TREE, "sent": 10, "error": "", "source_failed": False, "seconds": 0}

    monkeypatch.setattr(fanout, "hop", lambda cluster, root, dst, listing, expect, stall: fake(cluster.me, dst))
    monkeypatch.setattr(fanout, "relayed", lambda cluster, src, dst, root, listing, expect, stall: fake(src, dst))
    cfg = {**contract.FANOUT_DEFAULTS, "tries": tries}
    lines: list[str] = []
    others = [r for r in range(pods) if r != me]
    hops, gave_up = fanout.fan_out(FakeCluster(me), Path("/w"), others, b"a", TREE, cfg, lines.append)  # type: ignore[arg-type]
    return hops, gave_up


def holders_by_round(hops: list[fanout.Hop]) -> dict[int, int]:
    got = {0: 0}
    for h in sorted(hops, key=lambda h: h["round"]):
        if not h["error"] and h["hash"] == TREE:
            got.setdefault(h["dst"], h["round"])
    return got


@pytest.mark.parametrize("pods", [2, 3, 4, 5, 6, 8, 9, 16, 17, 33, 64])
def test_holders_double_each_round_and_pod0_sends_once(monkeypatch: pytest.MonkeyPatch, pods: int) -> None:
    hops, gave_up = run(monkeypatch, pods)
    assert not gave_up
    rounds = math.ceil(math.log2(pods))
    assert max(h["round"] for h in hops) == rounds == fanout.rounds_needed(pods - 1)
    got = holders_by_round(hops)
    assert sorted(got) == list(range(pods))
    for r in range(1, rounds + 1):  # after round r: 2**r pods hold the tree (all of them in the last)
        assert sum(1 for v in got.values() if v <= r) == min(pods, 2**r), r
    assert [h["dst"] for h in hops if h["src"] == 0] == [1]
    for h in hops:  # a pod sends only once it holds the verified tree, at most two hops a round
        assert got[h["src"]] < h["round"], h
    per_round: dict[tuple[int, int], int] = {}
    for h in hops:
        per_round[(h["round"], h["src"])] = per_round.get((h["round"], h["src"]), 0) + 1
    assert max(per_round.values()) <= 2


def test_a_relay_that_dies_is_dropped_and_its_receivers_come_from_other_holders(monkeypatch: pytest.MonkeyPatch) -> None:
    hops, gave_up = run(monkeypatch, 8, fail=lambda src, dst, n: ("relay went silent", True) if src == 1 and n == 1 and dst != 1 else None)
    assert not gave_up
    got = holders_by_round(hops)
    assert sorted(got) == list(range(8))
    dead = [h for h in hops if h["src"] == 1]
    assert dead and all(h["error"] for h in dead)  # relay 1 got the tree, then every hop it ran broke
    assert max(h["round"] for h in dead) == min(h["round"] for h in dead)  # never used again after its round
    for h in hops:
        assert got[h["src"]] < h["round"], h


def test_an_unreachable_pod_is_given_up_after_tries_from_different_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    hops, gave_up = run(monkeypatch, 8, fail=lambda src, dst, n: ("connection timed out", False) if dst == 5 else None, tries=3)
    assert list(gave_up) == [5]
    assert "connection timed out" in gave_up[5] and "tried 3 times" in gave_up[5]
    sources = [h["src"] for h in hops if h["dst"] == 5]
    assert len(sources) == 3 and len(set(sources)) == 3
    assert sorted(holders_by_round(hops)) == [0, 1, 2, 3, 4, 6, 7]


def test_when_every_relay_is_gone_the_launching_pod_sends_again(monkeypatch: pytest.MonkeyPatch) -> None:
    hops, gave_up = run(monkeypatch, 4, fail=lambda src, dst, n: ("session broke", True) if src != 0 else None)
    assert not gave_up
    assert {h["dst"] for h in hops if h["src"] == 0 and not h["error"]} == {1, 2, 3}


def test_assign_prefers_a_source_that_has_not_failed_the_pod() -> None:
    assert fanout.assign([1, 2, 1], [5, 6], {5: [1]}) == [(2, 5), (1, 6)]
    assert fanout.assign([1], [5, 6], {5: [1]}) == [(1, 5)]  # none fresh: the first free one


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("nope", "expected a JSON object"),
        ('{"minBytes": -1}', "minBytes=-1"),
        ('{"minbytes": 1}', "minbytes=1"),
        ('{"tries": "3"}', "tries='3'"),
        ('{"tries": true}', "tries=True"),
    ],
)
def test_a_bad_override_is_one_line_naming_the_key(value: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        fanout.settings({contract.FANOUT_ENV: value})
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and contract.FANOUT_ENV in err and words in err
    assert "minPods, minBytes, tries, stallSeconds" in err


def test_settings_default_and_override() -> None:
    assert fanout.settings({}) == contract.FANOUT_DEFAULTS
    assert fanout.settings({contract.FANOUT_ENV: json.dumps({"minBytes": 0})})["minBytes"] == 0


def test_bytes_to_send_counts_changed_files_only_for_a_pod_that_holds_the_last_tree() -> None:
    entries = {"a": ("100644", "x" * 64, 10), "b": ("100644", "y" * 64, 20), "c": ("100755", "z" * 64, 30)}
    sent = {"a": ["100644", "x" * 64, 10], "b": ["100644", "old", 20], "c": ["100644", "z" * 64, 30]}
    record: dict[str, object] = {"hash": "H", "files": sent}
    assert sync.bytes_to_send(entries, record, "H") == 20 + 30  # b's content, c's mode
    assert sync.bytes_to_send(entries, record, "other") == 60
    assert sync.bytes_to_send(entries, {}, "H") == 60


def test_a_launch_from_another_pod_sends_once_from_there(monkeypatch: pytest.MonkeyPatch) -> None:
    hops, gave_up = run(monkeypatch, 8, me=5)
    assert not gave_up and max(h["round"] for h in hops) == 3
    assert [h for h in hops if h["src"] == 5] == [hops[0]]
    assert sorted(h["dst"] for h in hops) == [0, 1, 2, 3, 4, 6, 7]


def test_in_a_run_relays_only_rsync_and_the_receivers_agent_answers_the_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ml-dev run`: the rank agent at each receiver's gate applies the list and answers the hash (sync.serve_gate); a
    receiver whose hash differs after a quick-check copy gets its next copy with --checksum, from another source."""
    relays: list[tuple[int, int, bool, bool]] = []
    asked: list[int] = []
    stale_once = {5}

    def fake_relayed(cluster: Any, src: int, dst: int, root: Path, listing: bytes, expect: str, stall: int, **kw: Any) -> fanout.Hop:
        relays.append((src, dst, kw.get("rsync_only", False), kw.get("checksum", False)))
        return {"hash": "", "sent": 10, "error": "", "source_failed": False, "seconds": 0}

    def fake_hop(cluster: Any, root: Path, dst: int, listing: bytes, expect: str, stall: int, verify: Any = None) -> fanout.Hop:
        assert verify is not None  # the launching pod's own hop asks the agent too
        got, _ = verify(dst, listing)
        return {"hash": got, "sent": 10, "error": "", "source_failed": False, "seconds": 0}

    def verify(dst: int, listing: bytes) -> tuple[str, str]:
        asked.append(dst)
        if dst in stale_once:
            stale_once.discard(dst)
            return "old" * 16, ""
        return TREE, ""

    monkeypatch.setattr(fanout, "relayed", fake_relayed)
    monkeypatch.setattr(fanout, "hop", fake_hop)
    lines: list[str] = []
    cfg = {**contract.FANOUT_DEFAULTS, "tries": 3}
    hops, gave_up = fanout.fan_out(FakeCluster(0), Path("/w"), list(range(1, 8)), b"a", TREE, cfg, lines.append, verify)  # type: ignore[arg-type]
    assert not gave_up
    assert sorted(set(asked)) == list(range(1, 8)) and asked.count(5) == 2  # every receiver's agent answered
    assert all(only for _, _, only, _ in relays)  # no relay runs `_apply` itself
    to5 = [(src, checksum) for src, dst, _, checksum in relays if dst == 5]
    assert [c for _, c in to5] == [False, True] and to5[0][0] != to5[1][0]  # contents compared, another source
    assert sorted(holders_by_round(hops)) == list(range(8))
