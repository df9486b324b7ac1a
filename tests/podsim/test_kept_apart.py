"""Two environments on one workspace claim (docs/use/teams.md: environment stacks of nerc-production, whose
`ml-dev-env-workspace` claim every environment in the namespace mounts at /workspace), on simulated pods, both
running at once with the idle stop on (pod 0's home page samples its own agents):

* records written before records were kept per environment (`/workspace/.ml-dev-env/{home,fabric,runs}`) move once,
  into the first environment that looks, byte for byte; the second finds nothing left to take;
* each page keeps its history under its own name and draws only its own pods; neither rewrites the other's file;
* each environment's DeepSpeed hostfile and TensorBoard folder (the render's TENSORBOARD_LOGDIR) are its own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from core.servers import DEV_SERVERS
from inpod import contract
from tests.podsim.nodetools import Node
from tests.podsim.pods import PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]
HOME_PORT = next(s.port for s in DEV_SERVERS if s.name == "home")
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
LEGACY = {
    "home/history.json": json.dumps({"samples": {"old-pod-0": [[1.0, [50.0]]]}}),
    "fabric/latest.json": json.dumps({"status": "pass", "time": "2026-01-01T00:00:00Z"}),
    "runs/20260101T000000Z-abcdef/why/latest.json": json.dumps({"verdict": {"kind": "straggler"}}),
}


def environment(name: str) -> Any:
    """An environment stack of nerc-production (2 pods of 1 GPU), idle stop on, its page sampling each second."""

    def mutate(objects: dict[str, Any]) -> None:
        objects.clear()
        objects["environment"] = {"cluster": "nerc-production", "name": name}
        objects["nodes"] = {"count": 2, "gpusPerPod": 1}
        objects["lifecycle"] = {"idleStop": {"enabled": True}}

    return render_stack("barcelona-alice", mutate)


def faster(sim: PodSim) -> PodSim:
    settings = f"{sim.app}-lifecycle"
    idle = json.loads(sim.configmaps[settings]["idle.json"])
    idle.update(intervalSeconds=1, warningLeadSeconds=idle["idleTimeoutSeconds"] - 1, servers=[])
    sim.configmaps[settings]["idle.json"] = json.dumps(idle)
    return sim


@pytest.fixture
def two() -> Iterator[tuple[PodSim, PodSim]]:
    first = faster(PodSim(environment("dana"), node=Node()))
    second = faster(PodSim(environment("erin"), node=Node(), claims=first.claims))
    try:
        claim = first._pvc_dir(first.claims / "ml-dev-env-workspace")
        uid, gid = first.identity.uid, first.identity.fs_group or first.identity.gid
        for path, text in LEGACY.items():  # what an older release wrote (as the pods' UID), before either starts
            target = claim / contract.WORKSPACE_RECORDS_DIR / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        for p in [claim / contract.WORKSPACE_RECORDS_DIR, *(claim / contract.WORKSPACE_RECORDS_DIR).rglob("*")]:
            os.chown(p, uid, gid)
        first.start()
        page(first)  # the first environment's page has looked (it moves the old records) before the second starts
        second.start()
        yield first, second
    finally:
        second.stop()
        first.stop()
    assert not [x for x in leftovers() if first.run_id in x or second.run_id in x], "the simulation left things behind"


def page(sim: PodSim, path: str = "fragment") -> str:
    deadline = time.monotonic() + 60
    while True:
        res = sim.exec(0, ["python3", "-c", FETCH, f"http://127.0.0.1:{HOME_PORT}/{path}"], timeout=30)
        if res.returncode == 0:
            return res.stdout
        assert time.monotonic() < deadline, res.stderr
        time.sleep(0.5)


def history(sim: PodSim) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        try:
            samples = json.loads(sim.records(0, "home/history.json").read_text()).get("samples", {})
        except (OSError, ValueError):
            samples = {}
        if all(samples.get(p.name) for p in sim.pods):
            return dict(samples)
        assert time.monotonic() < deadline, f"{sim.app}: its page never sampled both pods: {samples}"
        time.sleep(0.5)


def test_two_environments_on_one_workspace_claim_keep_their_records_apart(two: tuple[PodSim, PodSim]) -> None:
    first, second = two
    assert first.pods[0].path("/workspace").stat().st_ino == second.pods[0].path("/workspace").stat().st_ino
    top = first.pods[0].path(f"/workspace/{contract.WORKSPACE_RECORDS_DIR}")
    # the old records moved once, into the first environment's folder, each byte kept; the top holds no record
    for path, text in LEGACY.items():
        assert not (top / path).exists(), f"{path} is still shared"
        if path.startswith("home/"):
            continue  # the page took its history over and rewrites it (checked below)
        assert first.records(0, path).read_text() == text, path
        assert not second.records(0, path).exists(), f"{path} moved twice"
    assert sorted(p.name for p in top.iterdir()) == [contract.ENV_RECORDS_DIR]
    # each page samples its own pods into its own history and draws only those
    mine, theirs = history(first), history(second)
    assert set(mine) == {p.name for p in first.pods} | {"old-pod-0"}, "the old history was kept (no loss)"
    assert set(theirs) == {p.name for p in second.pods}
    assert sorted(p.name for p in (top / contract.ENV_RECORDS_DIR).iterdir()) == sorted([first.app, second.app])
    for sim, other in ((first, second), (second, first)):
        fragment = page(sim)
        assert all(f"{p.name}<" in fragment for p in sim.pods), fragment
        assert not any(p.name in fragment for p in other.pods), f"{sim.app}'s page shows {other.app}'s pods"
    # DeepSpeed's hostfile (rank.env's DEEPSPEED_HOSTFILE, written by startup.sh) is the environment's own too
    for sim, other in ((first, second), (second, first)):
        rank = sim.exec(0, 'set -a; . /tmp/ml-dev-env/rank.env; printf %s "$DEEPSPEED_HOSTFILE"', timeout=30).stdout
        hosts = sim.pods[0].path(rank).read_text()
        assert all(p.name in hosts for p in sim.pods) and not any(f"{p.name}." in hosts for p in other.pods), (rank, hosts)
    # TensorBoard's default folder is the environment's own
    logdirs = {sim.pods[0].env["TENSORBOARD_LOGDIR"] for sim in two}
    assert logdirs == {f"/workspace/tensorboard/{first.app}", f"/workspace/tensorboard/{second.app}"}
