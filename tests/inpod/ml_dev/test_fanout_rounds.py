"""The fan-out's rounds (inpod/ml_dev/fanout.py) with the hops stood in for: who sends to whom, how many rounds, what a
failed relay or an unreachable pod costs, and the settings' one-line refusals; and which pods of a direct push get a
small change through their rank agent's gate (sync.copy's `patch`) and which an rsync hop. The real hops (sshd, rsync, veths)
are tests/inpod/ml_dev/test_fanout.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
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
    assert "minPods, minBytes, tries, stallSeconds, patchBytes" in err


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


# ------------------------------------------------------------------ ml-dev run: a small change through the gate


def gate_tree(tmp: Path, monkeypatch: pytest.MonkeyPatch, change: Any = None) -> Any:
    """A launching pod's tree under `tmp` whose record says it sent the tree before `change(root)`; hashes through the
    real functions (their cache under a state dir of the test's)."""
    monkeypatch.setattr(sync, "STATE_DIR", tmp / "state")
    root = tmp / "tree"
    root.mkdir()
    for name in ("a.txt", "b.txt", "gone.txt"):
        (root / name).write_bytes(name.encode() * 10)
    files = ["a.txt", "b.txt", "gone.txt"]
    before = sync.tree_entries(root, files)
    record = {"hash": sync.tree_hash(root, files, before), "files": {rel: list(e) for rel, e in before.items()}}
    (change or (lambda root: (root / "b.txt").write_bytes(b"changed" * 100)))(root)
    files = sorted(p.name for p in root.iterdir())
    entries = sync.tree_entries(root, files)
    listing = "\0".join(files).encode()
    return SimpleNamespace(
        root=root, files=files, entries=entries, hash=sync.tree_hash(root, files, entries), listing=listing, record=record
    )


def gate_copy(
    monkeypatch: pytest.MonkeyPatch,
    tree: Any,
    answers: dict[int, str],
    patched: Any,
    cfg: dict[str, int] | None = None,
    with_patch: bool = True,
) -> tuple[list[tuple[int, bool]], list[tuple[int, bytes]], dict[str, Any]]:
    """sync.copy with the hops stood in for: (rsync hops (rank, --checksum), patches (rank, payload), sync-last.json).
    `patched(rank, payload)` -> (hash, error), the agent's answer."""
    rsynced: list[tuple[int, bool]] = []
    patches: list[tuple[int, bytes]] = []

    def fake_hop(cluster: Any, root: Path, dst: int, listing: bytes, expect: str, stall: int, verify: Any = None, **kw: Any) -> fanout.Hop:
        rsynced.append((dst, kw.get("checksum", False)))
        return {"src": 0, "dst": dst, "hash": expect, "sent": 10, "error": "", "via": "rsync", "seconds": 0.1}

    def patch(rank: int, payload: bytes) -> tuple[str, str]:
        patches.append((rank, payload))
        return patched(rank, payload)

    monkeypatch.setattr(fanout, "hop", fake_hop)
    monkeypatch.setenv(contract.FANOUT_ENV, json.dumps(cfg or {}))
    verify = lambda rank, listing: (tree.hash, "")  # noqa: E731
    sync.copy(FakeCluster(), tree, answers, 0.0, verify=verify, patch=patch if with_patch else None)  # type: ignore[arg-type]
    return sorted(rsynced), sorted(patches), json.loads((tree.root.parent / "state" / sync.LAST_SYNC).read_text())


def test_a_pod_holding_the_tree_sent_last_gets_the_change_through_its_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pods 1 and 2 answered the recorded hash: the changed file (and the deletion, in the list) through the gate; pod
    2's hash then differs: rsync with --checksum; pod 3 holds another tree: rsync at once, never a patch."""
    tree = gate_tree(tmp_path, monkeypatch, lambda root: ((root / "b.txt").write_bytes(b"changed" * 100), (root / "gone.txt").unlink()))
    sent_last = tree.record["hash"]
    rsynced, patches, last = gate_copy(
        monkeypatch, tree, {1: sent_last, 2: sent_last, 3: "other"}, lambda rank, _: (tree.hash if rank == 1 else "bad" * 20, "")
    )
    assert [rank for rank, _ in patches] == [1, 2] and patches[0][1] == patches[1][1]
    header, _, rest = patches[0][1].partition(b"\n")
    got = json.loads(header)["files"]
    assert [(f["path"], f["size"]) for f in got] == [("b.txt", 700)]  # only what changed since the record
    assert got[0]["mtime_ns"] == (tree.root / "b.txt").stat().st_mtime_ns and got[0]["mode"] == (tree.root / "b.txt").stat().st_mode & 0o777
    assert rest == b"changed" * 100 + tree.listing  # then the launching pod's list: gone.txt is not in it
    assert rsynced == [(2, True), (3, False)]
    via = {h["dst"]: (h["via"], h.get("gate_error", "")) for h in last["hops"]}
    assert via[1] == ("gate", "") and via[3] == ("rsync", "")
    assert via[2][0] == "rsync" and "after the patch differs" in via[2][1]
    out = capsys.readouterr().out
    assert "3 copied, direct push, 1 through the gate, 2 by rsync" in out, out
    assert "rank 2 (pod-2): the change through its gate did not land" in out


def test_a_refused_patch_falls_back_to_rsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = gate_tree(tmp_path, monkeypatch)
    rsynced, patches, last = gate_copy(monkeypatch, tree, {1: tree.record["hash"]}, lambda rank, _: (tree.record["hash"], "refused: no"))
    assert len(patches) == 1 and rsynced == [(1, True)]
    assert last["hops"][0]["via"] == "rsync" and last["hops"][0]["gate_error"] == "refused: no"


@pytest.mark.parametrize(
    ("cfg", "with_patch", "change"),
    [
        ({"patchBytes": 0}, True, None),  # off
        ({"patchBytes": 699}, True, None),  # the change (700 bytes) is above the limit
        ({}, False, None),  # no gate (ml-dev sync)
        ({"minBytes": 0}, True, None),  # the fan-out's rounds
        ({}, True, lambda root: ((root / "b.txt").unlink(), (root / "b.txt").symlink_to("a.txt"))),  # not a regular file
    ],
    ids=["patchBytes-0", "above-patchBytes", "no-gate", "fan-out", "symlink"],
)
def test_rsync_copies_what_the_gate_does_not_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: dict[str, int], with_patch: bool, change: Any
) -> None:
    tree = gate_tree(tmp_path, monkeypatch, change)
    monkeypatch.setattr(
        fanout,
        "fan_out",
        lambda cluster, root, stale, *a: ([{"src": 0, "dst": d, "hash": tree.hash, "round": 1, "via": "rsync"} for d in stale], {}),
    )
    rsynced, patches, last = gate_copy(
        monkeypatch, tree, {1: tree.record["hash"], 2: tree.record["hash"]}, lambda r, _: (tree.hash, ""), cfg, with_patch
    )
    assert patches == []
    assert {h["via"] for h in last["hops"]} == {"rsync"} and len(last["hops"]) == 2
    assert rsynced == ([] if "minBytes" in cfg else [(1, False), (2, False)])
