"""Stops that keep the work, on pods started from the render (tests/podsim): issue 24 items 1 and 2 end to end.

* A checkpoint before every stop, through the launcher: `ml-dev run` from pod 0 starts one rank on each of 2 pods
  (tests/podsim/stopjob.py: the docs' loop with a collective each step, the stop agreed by an all-reduce MAX, save
  to a temporary file, rename); then
  both pods get the kubelet's termination at once, as a StatefulSet scale to 0 or delete does (`sim.terminate`:
  preStop exec, SIGTERM to PID 1, SIGKILL at terminationGracePeriodSeconds). 10 trials: a complete checkpoint
  on every rank, every pod gone within checkpointGraceSeconds + 10 s.
* The idle stop's path: with pod 1 off the network, pod 0's idle agent reports it (an IdleAgentPodUnreachable
  Event) after the bound and, with the pod's mounted service-account token and CA, scales the StatefulSet to 0
  through an API stand-in at the `kubernetes` Service address (HTTPS); the controller then deletes the
  pods, which is the same kubelet termination (an `ml-dev run` job never meets an idle stop: its heartbeat is
  activity, so what the stop must save is covered by the trial above).
* An unreachable worker: pod 1's network goes away (its veth down on the node side); pod 0's idle agent counts it as active
  until the bound, then writes it off (it no longer holds the stop); `ml-dev status` on pod 0 names it
  UNREACHABLE with since-when; when it answers again it counts again.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components import lifecycle
from tests.inpod.idle.conftest import ROLE, TOKEN, FakeApiServer
from tests.podsim import stopjob
from tests.podsim.idlestop import IdleSim, complete, mine, wait_for, with_grace, with_idle_stop
from tests.podsim.pods import PodSim, missing_requirements, render_stack
from tests.podsim.render import pod_rules

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")]

PROJECT = "/workspace/job"
GRACE = 5  # lifecycle.checkpointGraceSeconds of the variant (short: 10 trials)
SAVE_SECONDS = 1.0  # how long the job takes to write its checkpoint
TRIALS = 10

# The docs' loop, standard library only, with a collective every step and the stop agreed by an all-reduce MAX
# (tests/podsim/stopjob.py): each rank saves at the same step (temporary name, fsync, rename).
JOB = stopjob.JOB


# ------------------------------------------------------------------------------ checkpoint trial


@pytest.fixture(scope="module")
def grace_render() -> Any:
    return render_stack("barcelona", with_grace(GRACE))


def test_the_variant_renders_the_short_grace(grace_render: Any) -> None:
    sts = next(r.inputs for r in grace_render.resources if r.kind == "StatefulSet")
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == GRACE + lifecycle.STOP_MARGIN_SECONDS


def one_trial(result: Any, trial: int, sims: list[PodSim], stop: tuple[int, ...] = (0, 1)) -> tuple[list[float], list[str]]:
    """Start 2 pods, `ml-dev run` the job from pod 0, terminate the pods `stop` at once; (stop seconds, problems)."""
    problems: list[str] = []
    with PodSim(result, count=2) as sim:
        sims.append(sim)
        sim.write(0, f"{PROJECT}/job.py", JOB)
        launcher = sim.popen(0, f"ml-dev run --per-pod -- python3 job.py {SAVE_SECONDS}", cwd=PROJECT)
        try:
            for i in range(2):
                started = sim.pods[i].path(f"{PROJECT}/ckpt/rank{i}.started")
                wait_for(f"trial {trial}: rank {i} started", started.exists, 60, lambda: sim.pods[0].log.read_text())
            stopped: dict[int, tuple[str, float]] = {}

            def kubelet(i: int) -> None:
                t0 = time.monotonic()
                how = sim.terminate(i)
                stopped[i] = (how, time.monotonic() - t0)

            threads = [threading.Thread(target=kubelet, args=(i,)) for i in stop]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=sim.grace + 60)
            out, _ = launcher.communicate(timeout=30)
            for i in set(range(2)) - set(stop):  # a pod that stays: its rank was stopped by the launcher's end
                ckpt = sim.pods[i].path(f"{PROJECT}/ckpt")

                def saved_checkpoints(c: Path = ckpt, i: int = i) -> list[Path]:
                    return list(c.glob(f"step*-rank{i}.txt"))

                wait_for(f"trial {trial}: rank {i} saved", saved_checkpoints, GRACE + 10)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.communicate(timeout=30)
        times = []
        for i in range(2):
            how, seconds = stopped.get(i, ("not stopped", float("inf"))) if i in stop else ("exited", 0.0)
            times += [seconds] if i in stop else []
            if how != "exited":
                problems.append(f"trial {trial}: pod {i} {how} (needed SIGKILL at the grace)")
            if seconds > GRACE + 10:
                problems.append(f"trial {trial}: pod {i} took {seconds:.1f} s > grace {GRACE} s + 10 s")
            ckpt = sim.volume_dir(i, "/workspace") / PROJECT.removeprefix("/workspace/") / "ckpt"
            saved = sorted(ckpt.glob(f"step*-rank{i}.txt"))
            if len(saved) != 1 or not complete(saved[0]) or list(ckpt.glob("*.tmp")):
                problems.append(f"trial {trial}: rank {i} checkpoint {[p.name for p in ckpt.iterdir()]} incomplete\n{out}")
    return times, problems


@pytest.mark.timeout(900)
def test_every_rank_saves_a_complete_checkpoint_when_every_pod_is_terminated(grace_render: Any) -> None:
    times: list[float] = []
    problems: list[str] = []
    sims: list[PodSim] = []
    for trial in range(TRIALS):
        got, bad = one_trial(grace_render, trial, sims)
        times += got
        problems += bad
    assert not [item for sim in sims for item in mine(sim)]
    print(
        f"\ncheckpoint trials: {TRIALS} x 2 pods, grace {GRACE} s, save {SAVE_SECONDS} s: pod stop seconds "
        f"median {statistics.median(times):.2f}, max {max(times):.2f}, min {min(times):.2f}"
    )
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(300)
def test_the_configured_signal_reaches_every_rank_through_the_launcher() -> None:
    """checkpointSignal SIGUSR1: the job handles only SIGUSR1 (SIGTERM would kill it unsaved); on both pods it saves."""

    def usr1(objects: dict[str, Any]) -> None:
        with_grace(GRACE)(objects)
        objects["lifecycle"]["checkpointSignal"] = "SIGUSR1"

    sims: list[PodSim] = []
    times, problems = one_trial(render_stack("barcelona", usr1), 0, sims)
    assert not [item for sim in sims for item in mine(sim)]
    assert not problems, "\n".join(problems)
    assert max(times) <= GRACE + 10


@pytest.mark.timeout(300)
def test_deleting_only_the_launchers_pod_still_saves_every_rank(grace_render: Any) -> None:
    """Pod 0 (where `ml-dev run` runs) deleted or evicted alone: its rank saves through preStop; the launcher's end
    closes the SSH channel to pod 1, whose rank agent gives its rank the signal and the grace too."""
    sims: list[PodSim] = []
    times, problems = one_trial(grace_render, 0, sims, stop=(0,))
    assert not [item for sim in sims for item in mine(sim)]
    assert not problems, "\n".join(problems)
    assert times and max(times) <= GRACE + 10


STUBBORN = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a job that never handles the checkpoint signal
os.makedirs("ckpt", exist_ok=True)
open("ckpt/rank%s.started" % os.environ["NODE_RANK"], "w").close()
while True:
    time.sleep(0.05)
"""


@pytest.mark.timeout(300)
def test_the_launchers_rank_stop_waits_the_checkpoint_grace(grace_render: Any) -> None:
    """Ctrl-C on `ml-dev run`: every rank gets the checkpoint signal and checkpointGraceSeconds (5 s here, not a
    fixed 10 s) before its process group is killed; the launcher then returns 130."""
    with PodSim(grace_render, count=2) as sim:
        sim.write(0, f"{PROJECT}/stubborn.py", STUBBORN)
        launcher = sim.popen(0, "ml-dev run -- python3 stubborn.py", cwd=PROJECT)
        try:
            for i in range(2):
                started = sim.pods[i].path(f"{PROJECT}/ckpt/rank{i}.started")
                wait_for(f"rank {i} started", started.exists, 60, lambda: sim.pods[0].log.read_text())
            t0 = time.monotonic()
            sim.interrupt(launcher)
            out, _ = launcher.communicate(timeout=GRACE + 30)
            elapsed = time.monotonic() - t0
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.communicate(timeout=30)
        print(f"\nCtrl-C to exit with ranks ignoring the signal: {elapsed:.2f} s (grace {GRACE} s)")
        assert launcher.returncode == 130, out
        assert "interrupted; stopping every rank" in out, out
        assert GRACE - 0.5 <= elapsed <= GRACE + 4, (elapsed, out)
        for i in range(2):  # no rank left behind
            left = sim.exec(i, "pgrep -f 'python3 [s]tubborn' || true", timeout=30).stdout.split()
            assert left == [], (i, left)


# ---------------------------------------------------------------------------- unreachable worker


@pytest.fixture(scope="module")
def idle_render() -> Any:
    return render_stack("barcelona", with_idle_stop)


@pytest.fixture(scope="module")
def idle_sim(idle_render: Any) -> Iterator[IdleSim]:
    sim = IdleSim(idle_render, count=2)  # the node's GPUs: idle, in nvidia-smi's real CSV
    try:
        sim.start()
        yield sim
    finally:
        sim.stop()
        assert not mine(sim), mine(sim)


@pytest.mark.timeout(300)
def test_an_unreachable_worker_is_shown_by_ml_dev_status_and_stops_holding_the_idle_stop(idle_sim: IdleSim) -> None:
    sim = idle_sim
    bound = 4
    settings = sim.settings()
    assert settings["enabled"] and settings["unreachableSeconds"] == 120
    # a quicker clock for the test (the stack's bounds: interval >= 15 s, unreachableAfter >= 2 min): the ConfigMap
    # edited as the kubelet delivers an update; the agent looks at it every second between rounds
    sim.quicken(intervalSeconds=1, unreachableSeconds=bound)
    agent_log = sim.agent_log
    wait_for(
        "pod 0's agent reads the new bound",
        lambda: sim.decision().get("unreachableSeconds") == bound and not sim.decision()["unreachable"],
        45,
        agent_log,
    )
    # pod 1 off the network: the node side of its veth down (the pod's own interface and routes stay as they are)
    subprocess.run(["ip", "-n", sim.cluster_ns, "link", "set", "v1", "down"], check=True, timeout=30)
    down_at = time.time()
    try:
        held = wait_for("pod 1 unreachable", lambda: sim.decision().get("unreachable", {}).get("ml-dev-env-1"), 60)
        assert not held["writtenOff"] and held["since"] >= down_at - 1
        view = sim.decision()
        assert "ml-dev-env-1/reachable: probe failed" in view["reason"], "within the bound it counts as active"
        off = wait_for("pod 1 written off", lambda: (sim.decision().get("unreachable", {}).get("ml-dev-env-1") or {}).get("writtenOff"), 60)
        assert off
        view = sim.decision()
        entry = view["unreachable"]["ml-dev-env-1"]
        assert entry["seconds"] >= bound and entry["since"] == held["since"]
        # its veto is gone: the idle clock runs on from its last activity (pod 0 itself is idle)
        later = wait_for("the idle clock runs", lambda: sim.decision()["idleSeconds"] >= view["idleSeconds"] + 2 and sim.decision(), 30)
        assert later["lastActive"] == view["lastActive"] <= entry["since"] + bound + 2, later
        status = sim.exec(0, "ml-dev status --timeout 5", timeout=60)
        out = status.stdout + status.stderr
        print(f"\n$ ml-dev status  (pod 0, pod 1 off the network)\n{out}")
        assert status.returncode == 1, out
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry["since"]))
        lines = out.splitlines()
        i = next(n for n, line in enumerate(lines) if line.strip().startswith("ml-dev-env-1"))
        assert lines[i].split()[1] == "UNREACHABLE", out  # its SSH check
        assert f"UNREACHABLE for the idle agent since {since}" in lines[i + 1], out
        assert "written off after 4 s: the idle stop no longer waits for it" in lines[i + 1], out
        assert any(line.startswith("idle stop: idle ") for line in lines), out
        assert "Pod ml-dev-env-1 unreachable for" in agent_log()
    finally:
        subprocess.run(["ip", "-n", sim.cluster_ns, "link", "set", "v1", "up"], check=True, timeout=30)
    # it answers again: it counts again and is no longer listed
    wait_for("pod 1 reachable again", lambda: sim.decision().get("unreachable") == {}, 60)
    status = sim.exec(0, "ml-dev status --timeout 5", timeout=60)
    assert status.returncode == 0 and "UNREACHABLE" not in status.stdout, status.stdout + status.stderr
    # from a worker, the same view comes from pod 0's GET /decision
    status = sim.exec(1, "ml-dev status --timeout 5", timeout=60)
    assert status.returncode == 0 and "\nidle stop: idle " in status.stdout, status.stdout + status.stderr


# ------------------------------------------------------------------------------------ idle stop


@pytest.mark.timeout(300)
def test_the_idle_stop_scales_to_zero_from_the_pod_and_the_pods_end_in_time(idle_render: Any) -> None:
    """Pod 1 off the network: after the bound an IdleAgentPodUnreachable Event, and it no longer holds the stop:
    pod 0's agent scales to 0 (its record names pod 1); then both pods end through the kubelet's termination."""
    # every Role bound to the pods' ServiceAccount: the agent's, and the reader's (the home page on pod 0 reads the usage record)
    rules = pod_rules(idle_render)
    assert idle_render.one(ROLE, "gpu-idle-agent").inputs["rules"][0] in rules
    api = FakeApiServer(rules, replicas=2)
    # the API stand-in at the `kubernetes` Service address, the pods' service-account token and CA its own
    with IdleSim(idle_render, count=2, api=api, token=TOKEN) as sim:
        try:
            subprocess.run(["ip", "-n", sim.cluster_ns, "link", "set", "v1", "down"], check=True, timeout=30)
            sim.quicken(intervalSeconds=1, idleTimeoutSeconds=6, warningLeadSeconds=3, unreachableSeconds=2)
            wait_for("the idle agent scales to 0 and records why", api.stopped, 90, sim.agent_log)
            assert api.denied == [], api.denied
            assert [s["spec"]["replicas"] for s in api.scales] == [0]
            (unreachable,) = [e for e in api.events if e["reason"] == "IdleAgentPodUnreachable"]
            assert unreachable["message"].startswith("Pod ml-dev-env-1 unreachable for "), unreachable
            (event,) = [e for e in api.events if e["reason"] == "IdleStop"]
            assert "replicas 2 -> 0" in event["message"] and "Unreachable pods not waited for: ml-dev-env-1." in event["message"]
            assert api.configmap["data"]["replicasBefore"] == "2" and api.configmap["data"]["unreachablePods"] == "ml-dev-env-1"
        finally:
            subprocess.run(["ip", "-n", sim.cluster_ns, "link", "set", "v1", "up"], check=True, timeout=30)
            api.close()
        # the StatefulSet controller deletes both pods: the kubelet's termination, at once
        outcome: dict[int, tuple[str, float]] = {}

        def kubelet(i: int) -> None:
            t0 = time.monotonic()
            outcome[i] = (sim.terminate(i), time.monotonic() - t0)

        threads = [threading.Thread(target=kubelet, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=sim.grace + 60)
        assert [outcome[i][0] for i in range(2)] == ["exited", "exited"], outcome
        assert max(seconds for _, seconds in outcome.values()) <= sim.grace, outcome
