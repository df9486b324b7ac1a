"""`ml-dev why` never guesses (issue 45, item 6), on 4 simulated pods of the barcelona render with real sshd and py-spy.

"No straggler" only when every rank was sampled. Each case is one a user meets:
* the stalled rank's pod refuses SSH (its sshd listener stopped; the rank's own session, which `ml-dev run` holds,
  stays): the three ranks seen agree in the barrier, so the verdict is undecided (exit 4), naming that pod and why, and
  py-spy is not said to be missing there;
* a `bash` rank (a shell waiting on `sleep`) beside Python ranks waiting for it at the barrier: undecided, the rank
  named as not Python with what /proc tells (state, kernel wait, children);
* no Python rank at all: undecided, every rank named.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inpod import contract
from inpod.ml_dev import why
from tests.inpod.ml_dev.test_why import COUNT, JOB_DIR, PY_SPY, REASON, barrier_port, connected_to, pods_of, stalled_ranks_wait, stop
from tests.podsim.pods import PodSim

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"),
    pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy of the dev lock is not installed (make venv)"),
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def sim() -> Iterator[PodSim]:
    with pods_of("barcelona") as s:
        yield s


def stat(pid: int) -> tuple[str, str, int]:
    """(comm, state, parent pid) of /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    comm, _, rest = text.partition(" (")[2].rpartition(") ")
    fields = rest.split()
    return comm, fields[0], int(fields[1])


def sshd_listener_down(sim: PodSim, index: int) -> int:
    """Stop pod `index`'s sshd listener (its supervisor stopped first, so nothing restarts it); the sessions it served
    go on. Returns the supervisor's pid (SIGCONT it to restart sshd)."""
    pids = set()
    for pid in sim.pod_pids(index):
        try:
            comm, state, _ = stat(pid)
        except OSError:
            continue
        if comm.startswith("sshd") and state != "Z":
            pids.add(pid)
    listener = next(p for p in pids if stat(p)[2] not in pids)
    supervisor = stat(listener)[2]
    os.kill(supervisor, signal.SIGSTOP)
    os.kill(listener, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{listener}").exists() and stat(listener)[1] != "Z":
        assert time.monotonic() < deadline, "sshd's listener did not end"
        time.sleep(0.05)
    return supervisor


def launch(sim: PodSim, command: str) -> subprocess.Popen[str]:
    return sim.popen(0, f"cd {JOB_DIR} && exec ml-dev run --no-sync -- {command}")


def test_the_stalled_ranks_pod_refusing_ssh_is_undecided_and_named(sim: PodSim) -> None:
    stalled = COUNT - 1
    proc = launch(sim, f"python3 barrier_job.py --stall {stalled} --round 2")
    try:
        stalled_ranks_wait(sim, proc, stalled)
        supervisor = sshd_listener_down(sim, stalled)
        try:
            res = sim.exec(1, "ml-dev why --timeout 20", timeout=120)
        finally:
            os.kill(supervisor, signal.SIGCONT)
    finally:
        stop(sim, proc)
    pod = sim.pods[stalled].name
    assert res.returncode == why.EXIT_UNDECIDED, f"{res.stdout}\n{res.stderr}"
    first = res.stdout.splitlines()[0]
    assert first == (
        f"ml-dev why: undecided: no straggler among ranks 0–2, and not every rank was sampled; "
        f"not seen: the ranks of {pod} (its pod did not answer)"
    ), res.stdout
    assert re.search(
        rf"^  not seen: the ranks of {pod} \(node rank {stalled}\): its pod did not answer: .*connection refused", res.stdout, re.M
    )
    spy = next(x for x in res.stdout.splitlines() if x.strip().startswith("py-spy:"))
    assert "missing" not in spy and f"not asked on {pod} (the pod did not answer)" in spy, spy


def test_a_bash_rank_beside_python_ranks_is_named_not_python(sim: PodSim) -> None:
    shell = 2
    proc = launch(sim, f"""bash -c 'if [ "$NODE_RANK" = {shell} ]; then sleep 600; true; else exec python3 barrier_job.py; fi'""")
    try:
        port, deadline = barrier_port(sim), time.monotonic() + 90
        while connected_to(sim, port) < COUNT - 2:  # ranks 1 and 3 wait in rank 0's barrier; the shell never comes
            assert time.monotonic() < deadline and proc.poll() is None, "the Python ranks never met in the barrier"
            time.sleep(0.1)
        res = sim.exec(1, "ml-dev why", timeout=120)
    finally:
        stop(sim, proc)
    assert res.returncode == why.EXIT_UNDECIDED, f"{res.stdout}\n{res.stderr}"
    first = res.stdout.splitlines()[0]
    assert first.startswith("ml-dev why: undecided: no straggler among ranks 0–1, 3") and first.endswith("not seen: rank 2 (not Python)"), (
        first
    )
    line = next(x for x in res.stdout.splitlines() if x.startswith("  not seen: rank 2"))
    assert re.fullmatch(
        rf"  not seen: rank 2 \({sim.pods[shell].name}\): not Python: bash \(pid \d+, state S(, waiting in \w+)?\); "
        r"children: sleep \(pid \d+, state S(, waiting in \w+)?\); no Python process below it",
        line,
    ), line
    spy = next(x for x in res.stdout.splitlines() if x.strip().startswith("py-spy:"))
    assert "used for ranks 0–1, 3" in spy and "not used for rank 2 (not Python)" in spy and "missing" not in spy, spy


def test_no_python_rank_at_all_is_undecided_naming_every_rank(sim: PodSim) -> None:
    proc = launch(sim, "bash -c 'sleep 600; true'")
    try:
        deadline = time.monotonic() + 60
        while sum(1 for p in sim.pods if sim.exec(p.index, "pgrep -fx 'sleep 600' || true", timeout=30).stdout.strip()) < COUNT:
            assert time.monotonic() < deadline and proc.poll() is None, "the ranks never started"
            time.sleep(0.2)
        res = sim.exec(1, "ml-dev why", timeout=120)
    finally:
        stop(sim, proc)
    assert res.returncode == why.EXIT_UNDECIDED, f"{res.stdout}\n{res.stderr}"
    assert res.stdout.startswith("ml-dev why: undecided: no rank's stack could be sampled; not seen: rank 0 (not Python)"), res.stdout
    named = [x for x in res.stdout.splitlines() if x.startswith("  not seen: rank ")]
    assert len(named) == COUNT and all("not Python: bash" in x and "children: sleep" in x for x in named), res.stdout


def test_the_watchdog_shows_an_undecided_verdict_with_the_rank_not_seen(sim: PodSim) -> None:
    """lifecycle.stallVerdictSeconds (10 s here): a bash rank keeps the Python ranks in the barrier, nothing prints;
    `ml-dev run`'s own verdict reads undecided and names the rank it could not see, as `ml-dev why` does."""
    shell = 2
    proc = launch(sim, f"""bash -c 'if [ "$NODE_RANK" = {shell} ]; then sleep 600; true; else exec python3 barrier_job.py; fi'""")
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + contract.STALL_MIN + 90
        while not any("; kept: " in line for line in seen):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
            seen.append(proc.stdout.readline())
    finally:
        out = stop(sim, proc)
    text = "".join(seen) + out
    verdicts = [line for line in text.splitlines() if line.startswith("ml-dev why: ")]
    assert len(verdicts) == 1 and verdicts[0].startswith("ml-dev why: undecided: no straggler among ranks 0–1, 3"), text
    assert verdicts[0].endswith("not seen: rank 2 (not Python)"), text
    assert re.search(rf"^  not seen: rank 2 \({sim.pods[shell].name}\): not Python: bash ", text, re.M), text
