"""`ml-dev why` on simulated pods (4, from the nerc-production and barcelona renders, real sshd, real py-spy of the dev lock).

The job (data/barrier_job.py) is pure Python: every rank meets the others at a TCP barrier rank 0 serves, a line per
round; one rank, chosen at random, sleeps inside `stall_here` before round 2. Each case is what a user meets:

* a stalled run: `ml-dev why` from another pod than the launching one names the rank, its pod and its frame, the others'
  barrier, exits 3, and keeps the verdict (with the stacks it used) in the run's directory of the launching pod, where
  the home page shows it;
* a healthy run: "no straggler", exit 0;
* the watchdog: `ml-dev run` under `lifecycle.stallVerdictSeconds: 10` (rendered into the pods' env) prints the verdict
  itself, once for the stall;
* no secret leaks: the stack lists a Secret in env.secrets, so every rank's environment holds its value, which the
  sampler reads (/proc/<pid>/environ: RANK, Flight Recorder's paths); the shared leak scan (tests/podsim/leakscan.py)
  finds the value in no output of `ml-dev why` or of the watchdog, no kept verdict, no pod process's command line, no
  SSH command of the fan-out, no file under the pods' logs/, and not on the home page;
* refused by the kernel (barcelona: the container runs as UID 0, so the job can drop to another UID; nerc-production's
  restricted-v2 UID has no SETUID capability, so there the sampler and the ranks always share the UID): the ranks run as
  UID 4321, the sampler as the container's UID 0 without CAP_SYS_PTRACE; the verdict says the kernel refused, why, and
  which source stood in; exit 5. Ctrl-C then ends `ml-dev run` at once: no agent may signal its rank (barcelona's SCC
  drops KILL), each says so and leaves it, rather than waiting out the grace.

py-spy is the image's (images/base-requirements.in): the simulated image is this machine's root, whose py-spy is the
dev lock's in the virtual environment; /usr/local/bin/py-spy (the base image's pip prefix) is it, as the image has it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import secrets as pysecrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inpod import contract
from inpod.ml_dev import launch, why
from tests.podsim.leakscan import SSH_ARGV_PROGRAM, LeakScan
from tests.podsim.pods import PREFIX, PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
PY_SPY = Path(sys.executable).parent / "py-spy"
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"),
    pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy of the dev lock is not installed (make venv)"),
    pytest.mark.timeout(600),
]

JOB = (Path(__file__).parent / "data" / "barrier_job.py").read_text()
JOB_DIR = "/tmp/why-job"
COUNT = 4
SECRET, SECRET_KEY = "why-canary", "WHY_CANARY_TOKEN"  # a Secret of the namespace, listed in env.secrets
VALUE = pysecrets.token_urlsafe(24)[:32]
RANK_SECRET = f"""
import glob, hashlib
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        argv = open(path, "rb").read().split(b"\\0")
        environ = open(path[: -len("cmdline")] + "environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    if argv[1:2] == [b"barrier_job.py"]:  # a rank: python3 barrier_job.py ...
        env = dict(x.split(b"=", 1) for x in environ if b"=" in x)
        print(hashlib.sha256(env.get({SECRET_KEY!r}.encode(), b"")).hexdigest())
"""
"""On a pod: the digest of the Secret's value in each rank process's environment (never the value itself)."""


def runs_dir(pod_env: dict[str, str]) -> str:
    """Where a pod of this environment keeps its runs (the environment's own records folder)."""
    app = pod_env["POD_NAME"].rpartition("-")[0]
    return f"{contract.records_dir(pod_env['ML_DEV_WORKSPACE'], app)}/{contract.RUNS_SUBDIR}"


def four_pods(objects: dict[str, Any]) -> None:
    """4 pods, one GPU each, no dev servers (the machine has 2 CPUs), the watchdog at its shortest, a Secret for every
    rank (the leak scan's value)."""
    objects["access"] = {**objects["access"], "vscode": False, "jupyter": False, "tensorboard": False}
    objects["nodes"] = {**objects["nodes"], "count": COUNT, "gpusPerPod": 1}
    objects.setdefault("lifecycle", {})["stallVerdictSeconds"] = contract.STALL_MIN
    objects["env"] = {**objects.get("env", {}), "secrets": [{"secret": SECRET, "keys": [SECRET_KEY]}]}


@contextlib.contextmanager
def pods_of(stack: str) -> Iterator[PodSim]:
    before = set(leftovers())
    s = PodSim(
        render_stack(stack, four_pods),
        image_programs={"/usr/local/bin/py-spy": PY_SPY, **SSH_ARGV_PROGRAM},  # py-spy as the base image ships it
        namespace_secrets={SECRET: {SECRET_KEY: VALUE}},
    )
    try:
        s.start()
        for i in range(COUNT):
            s.write(i, f"{JOB_DIR}/barrier_job.py", JOB)
        yield s
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


@pytest.fixture(scope="module", params=["nerc-production", "barcelona"])
def sim(request: pytest.FixtureRequest) -> Iterator[PodSim]:
    with pods_of(request.param) as s:
        yield s


def start_job(sim: PodSim, args: str, env: dict[str, str] | None = None, prefix: str = "") -> subprocess.Popen[str]:
    """`ml-dev run` of the job on pod 0 (its shell), in the background."""
    return sim.popen(0, f"cd {JOB_DIR} && exec ml-dev run --no-sync -- {prefix}python3 barrier_job.py {args}", env=env)


def wait_rounds(proc: subprocess.Popen[str], rounds: int, timeout: float = 90) -> list[str]:
    """Read the run's output until every rank printed round `rounds - 1`."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    done = {f"round {rounds - 1} rank {r}" for r in range(COUNT)}
    while not done <= {line.split("] ", 1)[-1].strip() for line in seen}:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
        seen.append(proc.stdout.readline())
    return seen


def stop(sim: PodSim, proc: subprocess.Popen[str]) -> str:
    sim.interrupt(proc)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    return out


def barrier_port(sim: PodSim) -> int:
    """The job's barrier port on pod 0 (rank 0 serves it): MASTER_PORT of the rank contract + the job's offset."""
    res = sim.exec(0, f". {contract.STATE_DIR}/{contract.RANK_ENV_FILE} && echo $MASTER_PORT", timeout=30)
    return int(res.stdout.strip() or "29500") + 7  # data/barrier_job.py PORT_OFFSET


def connected_to(sim: PodSim, port: int) -> int:
    """Established connections to `port` on pod 0 (its network namespace's /proc/net/tcp, state 01)."""
    rows = Path(f"/proc/{sim.pods[0].pid}/net/tcp").read_text().splitlines()[1:]
    return sum(1 for r in rows if r.split()[1].endswith(f":{port:04X}") and r.split()[3] == "01")


def stalled_ranks_wait(sim: PodSim, proc: subprocess.Popen[str], stalled: int, timeout: float = 90) -> list[str]:
    """Output until the others finished round 1, then until they wait in the barrier of round 2: every rank but 0
    and the stalled one connected to rank 0's barrier (the stalled rank sleeps before it)."""
    seen = wait_rounds(proc, 2)
    port, want = barrier_port(sim), len([r for r in range(1, COUNT) if r != stalled])
    deadline = time.monotonic() + timeout
    while connected_to(sim, port) < want:
        assert time.monotonic() < deadline and proc.poll() is None, f"{connected_to(sim, port)} of {want} in the barrier"
        time.sleep(0.1)
    return seen


def ranks_hold_the_secret(sim: PodSim) -> None:
    """Every pod's rank has the Secret's value in its environment (so the sampler, which reads it, had it in hand)."""
    want = hashlib.sha256(VALUE.encode()).hexdigest()
    for pod in sim.pods:
        res = sim.exec(pod.index, ["python3", "-c", RANK_SECRET], timeout=60)
        assert res.returncode == 0 and res.stdout.split() == [want], f"{pod.name}: {res.stdout}{res.stderr}"


def scan_after(scan: LeakScan, sim: PodSim) -> None:
    """The leak scan's files, once the verdicts are in: each pod's logs/ and SSH commands (the fan-out's included), the
    run state ml-dev run and the sampler use (heartbeats, runs/), every kept verdict in the workspace of pod 0."""
    for pod in sim.pods:
        for sub in (contract.HEARTBEAT_DIR, contract.RUN_STATE_DIR):
            scan.files(f"{pod.name} {sub}/", [pod.path(f"{contract.STATE_DIR}/{sub}")])
    kept = scan.files("kept verdict", [sim.pods[0].path(runs_dir(sim.pods[0].env))])
    scan.pods_state()
    assert scan.hits == [], "\n".join(scan.hits)
    assert scan.samples > 0 and kept > 0, (scan.samples, kept)
    assert any("_why-sample" in c for c in scan.ssh_commands()), "the scan saw the fan-out's SSH commands"


def test_names_the_stalled_rank_from_another_pod_and_keeps_it(sim: PodSim) -> None:
    stalled = random.randrange(COUNT)
    proc = start_job(sim, f"--stall {stalled} --round 2")
    try:
        with LeakScan(sim, [VALUE]) as scan:
            stalled_ranks_wait(sim, proc, stalled)
            ranks_hold_the_secret(sim)
            asked = 1 if stalled != 1 else 2  # never the launching pod
            res = sim.exec(asked, "ml-dev why", timeout=120)
            scan.text("ml-dev why", res.stdout + res.stderr)
            check_stalled(sim, stalled, res, scan)
        scan_after(scan, sim)
    finally:
        stop(sim, proc)


def check_stalled(sim: PodSim, stalled: int, res: subprocess.CompletedProcess[str], scan: LeakScan) -> None:
    """What the verdict of a stalled run must say and keep (every later command's output goes to the leak scan)."""
    assert res.returncode == why.EXIT_STRAGGLER, f"stalled rank {stalled}\n{res.stdout}\n{res.stderr}"
    first = res.stdout.splitlines()[0]
    pod = sim.pods[stalled].name
    assert first.startswith(f"ml-dev why: rank {stalled} ({pod}"), first
    assert "stall_here (barrier_job.py:" in first and "wait in barrier (barrier_job.py:" in first, first
    others = [r for r in range(COUNT) if r != stalled]
    assert why.ranks_text([str(r) for r in others]) in first, first
    assert re.search(r"py-spy: used for ranks 0–3", res.stdout), res.stdout
    assert "flight-recorder: not used: no torch in the ranks" in res.stdout, res.stdout
    assert "ras: silent:" in res.stdout, res.stdout
    # kept on the launching pod (pod 0), with every rank's stacks
    kept = re.search(r"kept: (\S+):(\S+\.json)", res.stdout)
    assert kept and kept.group(1) == sim.pods[0].name, res.stdout
    run = re.search(r"run (\S+); kept", res.stdout)
    assert run, res.stdout
    latest = sim.pods[0].path(f"{runs_dir(sim.pods[0].env)}/{run.group(1)}/{contract.WHY_LATEST}")
    record = json.loads(latest.read_text())
    assert record["verdict"]["straggler"]["ranks"] == [str(stalled)] and record["verdict"]["straggler"]["pod"] == pod
    stacks = [
        f["name"]
        for r in record["reports"]
        for a in r["agents"]
        for p in a["processes"]
        for s in p["samples"]
        for t in s.get("threads", [])
        for f in t["frames"]
    ]
    assert "stall_here" in stacks and "barrier" in stacks
    assert "locals" not in latest.read_text() and "MASTER_ADDR" not in latest.read_text()  # stacks only, no env
    # --run names the run; another run's id finds none of its ranks, a path is no run id
    again = sim.exec(3, f"ml-dev why --run {run.group(1)}", timeout=120)
    scan.text("ml-dev why --run", again.stdout + again.stderr)
    assert again.returncode == why.EXIT_STRAGGLER and again.stdout.startswith(first.split("; ")[0]), again.stdout
    other = sim.exec(3, "ml-dev why --run 20000101T000000Z-000000", timeout=120)
    assert other.returncode == why.EXIT_NOTHING and "no rank process found" in other.stdout, other.stdout
    bad = sim.exec(3, "ml-dev why --run ../../etc", timeout=60)
    assert bad.returncode == 2 and "--run '../../etc': a run id is" in bad.stderr, bad.stderr
    # the home page (pod 0) shows the live run's last verdict
    page = sim.exec(0, "python3 /opt/ml-dev-env/home_page.py render", timeout=60)
    scan.text("home page", page.stdout)
    assert page.returncode == 0, page.stderr
    section = page.stdout[page.stdout.index('id="card-why"') :]
    assert f'<span class="why-rank"><span data-k="why-rank">{stalled}</span></span>' in section, section[:2000]
    assert f'<span class="why-pod"><span data-k="why-pod">{pod}</span></span>' in section, section[:2000]
    assert "stall_here (barrier_job.py:" in section


def test_healthy_run_has_no_straggler(sim: PodSim) -> None:
    proc = start_job(sim, "--work 0.3")
    try:
        with LeakScan(sim, [VALUE]) as scan:
            wait_rounds(proc, 2)
            res = sim.exec(2, "ml-dev why", timeout=120)
            scan.text("ml-dev why", res.stdout + res.stderr)
        assert res.returncode == why.EXIT_NO_STRAGGLER, f"{res.stdout}\n{res.stderr}"
        first = res.stdout.splitlines()[0]
        assert first.startswith("ml-dev why: no straggler: ") and "ranks 0–3" in first, res.stdout
        scan_after(scan, sim)
    finally:
        stop(sim, proc)


def test_nothing_to_sample_without_a_run(sim: PodSim) -> None:
    res = sim.exec(1, "ml-dev why", timeout=120)
    assert res.returncode == why.EXIT_NOTHING, f"{res.stdout}\n{res.stderr}"
    assert "nothing could be sampled: no rank process found" in res.stdout


def test_watchdog_prints_the_verdict_once_per_stall(sim: PodSim) -> None:
    stalled = random.randrange(COUNT)
    assert sim.pods[0].env[contract.STALL_SECONDS_ENV] == str(contract.STALL_MIN)  # rendered from the stack setting
    proc = start_job(sim, f"--stall {stalled} --round 2")
    try:
        with LeakScan(sim, [VALUE]) as scan:
            seen = stalled_ranks_wait(sim, proc, stalled)
            assert proc.stdout is not None
            deadline = time.monotonic() + contract.STALL_MIN + 60
            while not any(line.startswith("ml-dev why: ") for line in seen):
                assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
                seen.append(proc.stdout.readline())
            while not any("; kept: " in line for line in seen):
                seen.append(proc.stdout.readline())
            time.sleep(contract.STALL_MIN + 3)  # the stall goes on: no second verdict
    finally:
        out = stop(sim, proc)
    text = "".join(seen) + out
    scan.text("ml-dev run and its watchdog's verdict", text)
    scan_after(scan, sim)
    verdicts = [line for line in text.splitlines() if line.startswith("ml-dev why: ")]
    assert len(verdicts) == 1, text
    assert verdicts[0].startswith(f"ml-dev why: rank {stalled} ({sim.pods[stalled].name}"), text
    assert "no progress for" in text


def test_refused_by_the_kernel_says_why_and_what_stood_in() -> None:
    """Only barcelona's render: nerc-production's container runs as a namespace UID without SETUID, so its ranks
    cannot take another UID and the sampler always shares theirs (the cell cannot exist there; docs/use/debugging.md).
    Pods of its own: ranks that took another UID were seen to outlive the stopped run on shared pods, holding the
    barrier's port for the next test (a rank's own UID switch is the job's business, not ml-dev's)."""
    with pods_of("barcelona") as sim:
        refused_case(sim)


def refused_case(sim: PodSim) -> None:
    assert sim.identity.uid == 0, f"{sim.app}: the refused case needs a container that may take another UID"
    proc = start_job(sim, "--stall 1 --round 2", prefix="setpriv --reuid=4321 --regid=4321 --clear-groups ")
    try:
        wait_rounds(proc, 2)
        res = sim.exec(1, "ml-dev why", timeout=120)
        assert res.returncode == why.EXIT_NOTHING, f"{res.stdout}\n{res.stderr}"
        assert res.stdout.startswith("ml-dev why: nothing could be sampled: no rank could be sampled"), res.stdout
        line = next(x for x in res.stdout.splitlines() if x.strip().startswith("py-spy:"))
        assert "refused by the kernel: the sampler runs as UID 0, the rank as UID 4321" in line, line
        assert "CAP_SYS_PTRACE" in line and "stood in: process states from /proc" in line, line
        assert re.search(r"\(0 [SR], 1 [SR], 2 [SR], 3 [SR]\)", line), line
    finally:
        out = stop(sim, proc)
    # no agent may signal its rank (UID 4321; barcelona's SCC drops KILL): each says so at once and leaves it
    left = [x for x in out.splitlines() if "run as UID 4321, which this agent (UID 0, without CAP_KILL)" in x]
    assert len(left) == COUNT and all(x.endswith(launch.LEFT_RUNNING_MARK) for x in left), out
    assert "killed" not in out, out
