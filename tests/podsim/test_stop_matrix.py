"""Every stop × every launcher, on 3 pods started from the render (tests/podsim): issue 35, items 1-5.

Each cell runs the job of tests/podsim/stopjob.py (a real collective every step, the stop agreed by an all-reduce
MAX before saving) through `ml-dev run` from pod 0, applies one stop and checks:
(a) every rank writes a complete checkpoint within checkpointGraceSeconds of the stop, all at the same step;
(b) no rank is left blocked in the collective (each rank's record names how it left; a killed rank keeps `running`);
(c) nothing of the job (job.py, train.sh, torchrun, the rank agent) runs afterwards on a pod that remains;
(d) `ml-dev run`'s exit status, where it outlives the stop, is non-zero, and its output names the stop.

Stops: the idle stop and `suspended: true` scale the StatefulSet to 0, `pulumi destroy` deletes it; with
`podManagementPolicy: Parallel` (components/gpu_cluster.py) the controller deletes every pod at once, and so does
the garbage collector after a delete, so all three are every pod's kubelet termination at once (`sim.terminate`:
preStop, SIGTERM to PID 1, SIGKILL at the grace). (The idle agent counts an `ml-dev run` heartbeat as activity, so
an idle stop meets a job only when it starts in the stop's last round; the pods end the same way.) A drain evicts
one pod: the same termination of that pod alone. Ctrl-C is the terminal's SIGINT to `ml-dev run`; a rank failing
exits 3 at step 40. Launchers: `python` directly (`--per-pod`), a wrapper script (`./train.sh`, python a child of
bash), `torchrun` (the documented `ml-dev run -- torchrun job.py`; stopjob.TORCHRUN where torch is absent). The
documented DeepSpeed launch (`deepspeed --hostfile`, pdsh/ssh) bypasses `ml-dev`: its column is
test_deepspeed_hostfile_ranks_get_no_signal, which pins that they get nothing (docs/use/suspend-and-idle.md).

The stack lists a Secret of the namespace (`env.secrets`): every scenario runs under the shared leak scan
(tests/podsim/leakscan.py, argv and environment of every pod process sampled from before the launch), and at its end
the job's processes on every pod held the value and nothing else did, and it is in no output, SSH command, file of a
remaining pod's state dir, container log (`oc logs` outlives the pod) or file of the workspace volumes (checkpoints,
records). A terminated pod's state dir went with its container (/tmp is the container's): the sampler covers its
stop hook and agents while they run.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.podsim import stopjob
from tests.podsim.idlestop import complete, mine, wait_for, with_grace
from tests.podsim.leakscan import SSH_ARGV_PROGRAM, LeakScan, list_secret, new_value
from tests.podsim.pods import PodSim, missing_requirements, render_stack
from tests.podsim.stopjob import JOB, PROJECT, TORCHRUN, TRAIN_SH, ckpt_dir, job_processes, records

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")]

GRACE = 5
SAVE_SECONDS = 1.0
PODS = 3
FAIL_RANK, FAIL_STEP = 1, 40
SECRET, SECRET_KEY = "stop-canary", "STOP_CANARY_TOKEN"  # a Secret of the namespace, listed in env.secrets
VALUE = new_value()

LAUNCHERS = {
    "python": "ml-dev run --per-pod -- python3 job.py",
    "wrapper": "ml-dev run --per-pod -- ./train.sh",
    "torchrun": "ml-dev run -- torchrun job.py",
}
DOCS_COLUMNS = {
    "python": "ml-dev run --per-pod -- python train.py",
    "wrapper": "ml-dev run --per-pod -- ./train.sh",
    "torchrun": "ml-dev run -- torchrun train.py",
    "deepspeed": "deepspeed --hostfile $DEEPSPEED_HOSTFILE train.py",
}
"""The launchers as docs/use/suspend-and-idle.md's table names them (tests/inpod/test_stop_rules.py)."""
STOP_LABELS = {
    "idle-stop": "idle stop",
    "suspend": "suspend",
    "destroy": "destroy",
    "drain-pod-0": "drain of pod 0",
    "drain-worker": "drain of a worker",
    "ctrl-c": "Ctrl-C of `ml-dev run`",
    "rank-fails": "one rank failing",
}
STOPS = ("idle-stop", "suspend", "destroy", "drain-pod-0", "drain-worker", "ctrl-c", "rank-fails")
STOPPED_PODS = {"idle-stop": (0, 1, 2), "suspend": (0, 1, 2), "destroy": (0, 1, 2), "drain-pod-0": (0,), "drain-worker": (2,)}


def three_pods(objects: dict[str, Any]) -> None:
    with_grace(GRACE)(objects)
    objects["nodes"] = {**objects["nodes"], "count": PODS, "gpusPerPod": 1}
    list_secret(objects, SECRET, SECRET_KEY)


def pods(render: Any, programs: dict[str, str] | None = None) -> PodSim:
    """3 pods of the render; the listed Secret exists in the namespace; every ssh a pod runs records its command."""
    return PodSim(
        render, count=PODS, namespace_secrets={SECRET: {SECRET_KEY: VALUE}}, image_programs={**SSH_ARGV_PROGRAM, **(programs or {})}
    )


def scanned(sim: PodSim) -> LeakScan:
    """The leak scan's sampler (argv and environment of every pod process), from now to the scenario's end."""
    return LeakScan(sim, [VALUE], interval=0.1, environ=True).__enter__()


def all_started(sim: PodSim, scan: LeakScan, program: str, log: Callable[[], str]) -> None:
    """Every rank wrote its `started` file and the leak scan has seen `program` hold the value on every pod: a stop
    right after the last rank started must not end a job before the sampler's next sweep of its pod (under load a
    sweep of every pod's processes takes seconds)."""
    for i in range(PODS):
        started = sim.pods[i].path(f"{PROJECT}/ckpt/rank{i}.started")
        wait_for(f"rank {i} started", started.exists, 90, log)
    every = {p.name for p in sim.pods}
    wait_for(f"the leak scan saw {program} on every pod", lambda: job_holders(scan, program) == every, 60, lambda: str(scan.holders))


def job_holders(scan: LeakScan, program: str) -> set[str]:
    """The pods where the job's own process (`python3 [-u] <program>`) was seen holding the value."""
    job = re.compile(rf"\S*python3? (-u )?{re.escape(program)}\b")
    return {pod for pod, cmdline in set(scan.holders) if job.match(cmdline)}


def leak_check(scan: LeakScan, sim: PodSim, outputs: dict[str, str], program: str = "job.py") -> None:
    """At the scenario's end: the job's own processes (`python3 [-u] <program>`) held the value on every pod, nothing
    else did, and it is in no output, SSH command, file of a remaining pod, container log or workspace file."""
    scan.stop()
    for where, text in outputs.items():
        scan.text(where, text)
    files = scan.pods_state() + scan.pods_files() + scan.container_logs()
    files += scan.files("workspace of", [sim.volume_dir(i, "/workspace") for i in range(PODS)])
    assert scan.hits == [], "\n".join(scan.hits)
    assert job_holders(scan, program) == {p.name for p in sim.pods}, scan.holders
    assert scan.samples > 0 and files >= PODS, (scan.samples, files)


@pytest.fixture(scope="module")
def render() -> Any:
    return render_stack("barcelona", three_pods)


class Cell:
    """One job under `ml-dev run` on 3 fresh pods; `stopped` holds each terminated pod's kubelet outcome."""

    def __init__(self, render: Any, launcher: str, args: str) -> None:
        self.sim = pods(render, {"/usr/local/bin/torchrun": TORCHRUN})
        self.launcher_cmd = f"{LAUNCHERS[launcher]} {args}"
        self.stopped: dict[int, str] = {}
        self.out = ""
        self.leaks_checked = False

    def __enter__(self) -> Cell:
        self.sim.start()
        self.sim.write(0, f"{PROJECT}/job.py", JOB)
        self.sim.write(0, f"{PROJECT}/train.sh", TRAIN_SH, mode=0o755)
        self.scan = scanned(self.sim)
        self.launcher = self.sim.popen(0, self.launcher_cmd, cwd=PROJECT)
        try:
            all_started(self.sim, self.scan, "job.py", self.log)
        except BaseException as exc:  # `with` calls no __exit__ when __enter__ fails: the sampler and pods end here
            self.__exit__(type(exc), exc, None)
            raise
        return self

    def __exit__(self, failed: object, *exc: object) -> None:
        try:
            if self.launcher.poll() is None:
                self.launcher.kill()
                self.launcher.communicate(timeout=30)
            self.scan.stop()
            if failed is None and not self.leaks_checked:
                self.leak_check()
        finally:
            self.sim.stop()
        assert not mine(self.sim), mine(self.sim)

    def leak_check(self) -> None:
        """The scenario's leak scan (at its end: __exit__ runs it unless the test did)."""
        self.leaks_checked = True
        leak_check(self.scan, self.sim, {"output of `ml-dev run`": self.out})

    def log(self) -> str:
        return self.out + "\n" + self.sim.pods[0].log.read_text()

    def terminate(self, pods: tuple[int, ...], how: Callable[[int], str] | None = None) -> None:
        kill = how or self.sim.terminate

        def one(i: int) -> None:
            self.stopped[i] = kill(i)

        threads = [threading.Thread(target=one, args=(i,)) for i in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=self.sim.grace + 60)

    def finish(self) -> int:
        self.out, _ = self.launcher.communicate(timeout=GRACE + 40)
        return self.launcher.returncode


def check_saved(cell: Cell, since: float, ranks: list[int]) -> list[int]:
    """(a) and (b) for `ranks`: a complete renamed checkpoint within the grace, at one step; returns the steps."""
    got = records(cell.sim, PODS)
    steps = []
    for r in ranks:
        rec = got.get(r)
        assert rec is not None, (r, cell.log())
        assert rec["exit"] in ("saved", "saved-after-peer-lost"), (r, rec, cell.log())  # (b): never left in the collective
        saved = ckpt_dir(cell.sim, r) / Path(rec["path"]).name
        assert complete(saved), (r, saved)
        assert rec["at"] - since <= GRACE, (r, rec["at"] - since, cell.log())  # (a): within checkpointGraceSeconds
        steps.append(rec["step"])
    assert len(set(steps)) == 1, (steps, cell.log())  # every rank stopped at the same step
    return steps


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_every_stop_every_launcher(render: Any, launcher: str, stop: str) -> None:
    args = f"{SAVE_SECONDS} {FAIL_RANK} {FAIL_STEP}" if stop == "rank-fails" else f"{SAVE_SECONDS}"
    with Cell(render, launcher, args) as cell:
        sim = cell.sim
        since = time.time()
        if stop in STOPPED_PODS:
            cell.terminate(STOPPED_PODS[stop])
        elif stop == "ctrl-c":
            sim.interrupt(cell.launcher)
        code = cell.finish()
        if stop == "rank-fails":
            failed = records(sim, PODS)[FAIL_RANK]
            assert failed["exit"] == "failed", failed
            since = failed["at"]
        ranks = [r for r in range(PODS) if not (stop == "rank-fails" and r == FAIL_RANK)]
        check_saved(cell, since, ranks)
        gone = STOPPED_PODS.get(stop, ())
        assert all(how == "exited" for how in cell.stopped.values()), cell.stopped  # ended before the kubelet's SIGKILL
        for i in set(range(PODS)) - set(gone):  # (c)
            assert job_processes(sim, i) == [], (i, job_processes(sim, i))
        # (d): non-zero, naming the stop
        assert code != 0, cell.out
        if stop == "drain-worker":
            assert code == 143, cell.out
            assert "ml-dev: STOPPED: pod ml-dev-env-2 is stopping (SIGTERM from its stop hook)" in cell.out, cell.out
        elif stop == "ctrl-c":
            assert code == 130 and "ml-dev: interrupted; stopping every rank" in cell.out, cell.out
        elif stop == "rank-fails":
            assert f"ml-dev: FAILED: rank {FAIL_RANK} (ml-dev-env-{FAIL_RANK})" in cell.out, cell.out
        else:  # pod 0 went with the launcher (its output came back until then)
            assert "ml-dev: STOP: pod ml-dev-env-" in cell.out, cell.out


# ------------------------------------------------------------------------------ the kubelet's other kills


@pytest.mark.timeout(300)
def test_a_hard_eviction_gives_the_evicted_rank_2_s_and_every_other_rank_the_grace(render: Any) -> None:
    """Pod 2 hard-evicted (`sim.evict_hard`: preStop cut at 1 s, SIGTERM, SIGKILL 2 s later) during a 3.5 s save (it
    starts after the hook has begun, so it ends after the kill at 3 s): its rank is killed with
    only a `.tmp` (never renamed, so a resume never reads it: the last complete renamed checkpoint is what survives),
    every other rank saves the agreed step within the grace, and `ml-dev run` names the pod."""
    with Cell(render, "python", "3.5") as cell:
        since = time.time()
        cell.terminate((2,), how=cell.sim.evict_hard)
        code = cell.finish()
        assert cell.stopped == {2: "killed"}
        check_saved(cell, since, [0, 1])
        evicted = ckpt_dir(cell.sim, 2)
        assert records(cell.sim, PODS)[2]["exit"] == "running"  # killed mid-save
        assert not list(evicted.glob("step*-rank2.txt")) and list(evicted.glob("step*-rank2.txt.tmp")), list(evicted.iterdir())
        for i in (0, 1):
            assert job_processes(cell.sim, i) == [], i
        assert code == 143 and "ml-dev: STOPPED: pod ml-dev-env-2 is stopping" in cell.out, cell.out


@pytest.mark.timeout(300)
def test_a_soft_eviction_gives_the_evicted_rank_the_capped_grace(render: Any) -> None:
    """A soft eviction's grace is min(evictionMaxPodGracePeriod, terminationGracePeriodSeconds) (eviction_manager.go
    synchronize): with a 3 s cap the kubelet kills pod 2 at 3 s whatever checkpointGraceSeconds says; a 1 s save
    fits, every rank saves the agreed step."""
    cap = 3
    with Cell(render, "python", f"{SAVE_SECONDS}") as cell:
        since = time.time()
        cell.terminate((2,), how=lambda i: cell.sim.terminate(i, grace=min(cap, cell.sim.grace)))
        code = cell.finish()
        assert cell.stopped == {2: "exited"}
        check_saved(cell, since, [0, 1, 2])
        assert max(r["at"] for r in records(cell.sim, PODS).values()) - since <= cap
        assert code == 143 and "ml-dev: STOPPED: pod ml-dev-env-2 is stopping" in cell.out, cell.out
        cell.leak_check()
        # the same scan finds the value where it is planted: a line on pod 0's container output (`oc logs`)
        assert cell.sim.exec(0, f"echo token={VALUE} >> /proc/1/fd/1", timeout=30).returncode == 0
        planted = LeakScan(cell.sim, [VALUE])
        planted.container_logs()
        assert [h for h in planted.hits if h.startswith("ml-dev-env-0 container log")], planted.hits
        assert all(VALUE not in h for h in planted.hits), "the scan's own lines never hold the value"


@pytest.mark.timeout(300)
def test_an_oom_kill_loses_only_that_pods_rank_and_nothing_hangs(render: Any) -> None:
    """Pod 2's container OOM-killed (memory.oom.group: every process at once, no signal): its rank writes nothing;
    the collective fails on the others instead of blocking (the peer's connection closed), they save the last
    step every rank completed, and `ml-dev run` stops every rank and names rank 2 (its SSH session died)."""
    with Cell(render, "python", f"{SAVE_SECONDS}") as cell:
        since = time.time()
        cell.sim.oom_kill(2)
        code = cell.finish()
        got = records(cell.sim, PODS)
        assert got[2]["exit"] == "running" and not list(ckpt_dir(cell.sim, 2).glob("step*")), got[2]
        check_saved(cell, since, [0, 1])
        assert {got[0]["exit"], got[1]["exit"]} == {"saved-after-peer-lost"}, got
        for i in (0, 1):
            assert job_processes(cell.sim, i) == [], i
        assert code != 0 and "ml-dev: FAILED: rank 2 (ml-dev-env-2)" in cell.out, cell.out


@pytest.mark.timeout(300)
def test_a_rolling_update_stops_the_job_at_its_first_pod(render: Any) -> None:
    """A template change replaces pod 2 first: every rank saves the same step within the grace of that first
    termination (not when its own pod's turn comes), `ml-dev run` exits 143 naming pod 2, every pod ends in time."""
    with Cell(render, "python", f"{SAVE_SECONDS}") as cell:
        since = time.time()
        outcomes: list[str] = []
        update = threading.Thread(target=lambda: outcomes.extend(cell.sim.rolling_update()))
        update.start()
        code = cell.finish()
        update.join(timeout=300)
        assert outcomes == ["exited", "exited", "exited"], outcomes
        check_saved(cell, since, [0, 1, 2])
        assert code == 143 and "ml-dev: STOPPED: pod ml-dev-env-2 is stopping" in cell.out, cell.out
        for i in range(PODS):  # the replaced pods run nothing of the job
            assert job_processes(cell.sim, i) == [], i


# ------------------------------------------------------------------------------ a rank is its process tree


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "command, parent",
    [("ml-dev run --per-pod -- ./run.sh", "bash ./run.sh"), ("ml-dev run -- torchrun stubborn.py", "torchrun stubborn.py")],
    ids=["wrapper", "torchrun"],
)
def test_ctrl_c_leaves_nothing_behind_a_wrapper_or_torchrun(render: Any, command: str, parent: str) -> None:
    """The job ignoring SIGTERM behind bash (`./run.sh`) or torchrun (its workers in sessions of their own): Ctrl-C;
    bash dies at the signal (torchrun waits its 30 s), the agent keeps its record while python lives and at the
    grace SIGKILLs every process of the rank, in its group or not; exit 130, nothing left on any pod."""
    sim = pods(render, {"/usr/local/bin/torchrun": TORCHRUN})
    with sim.start():
        sim.write(0, f"{PROJECT}/stubborn.py", stopjob.STUBBORN)
        sim.write(0, f"{PROJECT}/run.sh", stopjob.RUN_SH, mode=0o755)
        scan = scanned(sim)
        launcher = sim.popen(0, command, cwd=PROJECT)
        try:
            all_started(sim, scan, "stubborn.py", lambda: sim.pods[0].log.read_text())
            t0 = time.monotonic()
            sim.interrupt(launcher)
            time.sleep(2)
            for i in range(PODS):
                left = sim.exec(i, "pgrep -af '[s]tubborn|[r]un[.]sh' || true", timeout=30).stdout.splitlines()
                assert [p for p in left if "stubborn.py" in p and parent not in p], left
                assert parent != "bash ./run.sh" or not [p for p in left if parent in p], left
                assert list(sim.pods[i].path("/tmp/ml-dev-env/heartbeat").glob("rank-*.json")), i  # still its rank
            out, _ = launcher.communicate(timeout=GRACE + 30)
            elapsed = time.monotonic() - t0
        finally:
            scan.stop()
            if launcher.poll() is None:
                launcher.kill()
                launcher.communicate(timeout=30)
        assert launcher.returncode == 130, out
        assert GRACE - 0.5 <= elapsed <= GRACE + 4, (elapsed, out)
        for i in range(PODS):
            assert sim.exec(i, "pgrep -af '[s]tubborn|[r]un[.]sh|[t]orchrun' || true", timeout=30).stdout == "", i
        leak_check(scan, sim, {"output of `ml-dev run`": out}, program="stubborn.py")
    assert not mine(sim), mine(sim)


# ------------------------------------------------------------------------------ DeepSpeed's own launcher


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("pdsh") is None, reason="needs pdsh (Debian: pdsh)")
def test_deepspeed_hostfile_ranks_get_no_signal(render: Any) -> None:
    """The documented `deepspeed --hostfile` launch (runner.py -> PDSHRunner: pdsh over the fabric's ssh, then
    deepspeed.launcher.launch on each pod) never goes through `ml-dev run`'s rank agent: checkpoint_stop.sh finds
    no rank, so when every pod is terminated no rank gets checkpointSignal and nothing is saved. The docs say so
    (docs/use/suspend-and-idle.md, "Every stop, every launcher") and point to `ml-dev run -- torchrun`."""
    sim = pods(render)
    with sim.start():
        sim.write(0, f"{PROJECT}/job.py", JOB)
        sim.write(0, f"{PROJECT}/deepspeed/__init__.py", "")
        sim.write(0, f"{PROJECT}/deepspeed/launcher/__init__.py", "")
        sim.write(0, f"{PROJECT}/deepspeed/launcher/launch.py", stopjob.DEEPSPEED_LAUNCH)
        assert sim.exec(0, "ml-dev sync", cwd=PROJECT, timeout=120).returncode == 0
        world = base64.urlsafe_b64encode(json.dumps({f"ml-dev-env-{i}": [0] for i in range(PODS)}).encode()).decode()
        script = (
            'hosts=$(cut -d" " -f1 "$DEEPSPEED_HOSTFILE" | paste -sd, -); '
            'PDSH_RCMD_TYPE=ssh pdsh -S -f 1024 -w "$hosts" '
            f'"export PYTHONPATH={PROJECT}; cd {PROJECT};" python3 -u -m deepspeed.launcher.launch --world_info={world} '
            f'--node_rank=%n "--master_addr=$MASTER_ADDR" "--master_port=$MASTER_PORT" job.py {SAVE_SECONDS}'
        )
        scan = scanned(sim)
        launcher = sim.popen(0, f". /tmp/ml-dev-env/rank.env; {script}", cwd=PROJECT)
        out = ""
        try:
            all_started(sim, scan, "job.py", lambda: sim.pods[0].log.read_text())
            outcomes: dict[int, str] = {}
            threads = [threading.Thread(target=lambda i=i: outcomes.update({i: sim.terminate(i)})) for i in range(PODS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=sim.grace + 60)
            out, _ = launcher.communicate(timeout=60)
        finally:
            scan.stop()
            if launcher.poll() is None:
                launcher.kill()
                launcher.communicate(timeout=30)
        got = {i: json.loads((ckpt_dir(sim, i) / f"rank{i}.json").read_text()) for i in range(PODS)}
        assert [got[i]["exit"] for i in range(PODS)] == ["running"] * PODS, got  # no rank heard of the stop
        assert not [p for i in range(PODS) for p in ckpt_dir(sim, i).glob("step*-rank*.txt")]
        # the value reached each pod's job over pdsh's SSH connections (ssh-session.sh), and went nowhere else
        leak_check(scan, sim, {"output of the pdsh launch": out})
    assert not mine(sim), mine(sim)
