"""A checkpoint before every stop: PID 1 (the real startup.sh) and the preStop hook (checkpoint_stop.sh)
give every rank of `ml-dev run` (the real `ml-dev _rank` agent) the configured signal and wait for it.

Each simulated pod is a real `startup.sh` process with its own state directory and one rank agent running a
small "training job" that saves a checkpoint when signalled. The stop settings (terminationGracePeriodSeconds, the preStop
command, the container env) come from the render, read with tests/podsim. The kubelet's part is simulated as the
kubelet does it (kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go, killContainer): run the
preStop hook within terminationGracePeriodSeconds, then SIGTERM to PID 1, then SIGKILL to everything
left when the period ends. All pods are terminated at once, like a scale to 0 of a Parallel StatefulSet.
"""

from __future__ import annotations

import calendar
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from components import lifecycle
from tests.conftest import run_objects, stack_objects
from tests.inpod import mount as shipped_mount
from tests.inpod.test_startup_script import base_env, make_stubs, wait_ready, wait_until
from tests.podsim.render import PodFacts, container_env, main_container

MOUNT = shipped_mount.shipped()  # the startup ConfigMap as the pod has it
ML_DEV = MOUNT / "ml-dev"
SAVE_SECONDS = 1.0  # how long the job takes to write its checkpoint


@dataclass(frozen=True)
class Rendered:
    """What the render gives the kubelet and the container for a stop (read with tests/podsim's env reading)."""

    grace_period: int  # terminationGracePeriodSeconds
    pre_stop: list[str]  # the preStop exec command, with the mount path mapped to MOUNT
    env: dict[str, str]  # the checkpoint settings in the container env


def rendered_stop(grace: int, signal_name: str) -> Rendered:
    objects = stack_objects("barcelona")
    objects.setdefault("lifecycle", {}).update(checkpointGraceSeconds=grace, checkpointSignal=signal_name)
    res = run_objects("barcelona", objects)
    assert res.error is None, res.error
    sts = next(r for r in res.resources if r.kind == "StatefulSet").inputs
    main = main_container(sts, "ml-dev")
    env = container_env(main, PodFacts("ml-dev-env-0", "nccl-test", "10.128.0.10", "node-a"), {})
    mount = next(m["mountPath"] for m in main["volumeMounts"] if m["name"] == "startup")
    command = [c.replace(mount, str(MOUNT)) for c in main["lifecycle"]["preStop"]["exec"]["command"]]
    keys = ("ML_DEV_CHECKPOINT_GRACE_SECONDS", "ML_DEV_CHECKPOINT_SIGNAL")
    return Rendered(sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], command, {k: env[k] for k in keys})


@functools.cache
def stop_render() -> Rendered:
    """The SIGTERM stop with 5 s of grace, rendered when a test first needs it (not at import: every pytest process,
    xdist's workers and `pytest --co` included, imports this module)."""
    return rendered_stop(5, "SIGTERM")


def grace() -> int:
    """Seconds each rank gets (lifecycle.checkpointGraceSeconds), as the container env says."""
    return int(stop_render().env["ML_DEV_CHECKPOINT_GRACE_SECONDS"])


def test_the_render_ties_grace_period_pre_stop_and_env_together() -> None:
    assert grace() == 5 and stop_render().grace_period == grace() + lifecycle.STOP_MARGIN_SECONDS
    assert stop_render().pre_stop == ["/bin/bash", str(MOUNT / "checkpoint_stop.sh")]
    assert rendered_stop(120, "SIGUSR1").env == {"ML_DEV_CHECKPOINT_GRACE_SECONDS": "120", "ML_DEV_CHECKPOINT_SIGNAL": "SIGUSR1"}


# A training loop as a user writes it (docs: "Checkpoint before a stop"): the handler only sets a flag; the
# loop saves at the next step boundary (write to a temporary file, fsync, rename) and exits.
TRAIN = """
import os, signal, sys, time
stop = False
def on_signal(signum, frame):
    global stop
    stop = True
signal.signal(getattr(signal, os.environ.get("ML_DEV_CHECKPOINT_SIGNAL", "SIGTERM")), on_signal)
out = sys.argv[1]
step = 0
open(out + ".started", "w").close()
while not stop:
    step += 1
    time.sleep(0.02)
tmp = out + ".tmp"
with open(tmp, "w") as f:
    f.write("step=%d\\n" % step)
    for _ in range(10):
        f.write("x" * 1000 + "\\n")
        f.flush()
        time.sleep(float(sys.argv[2]) / 10)
    f.write("END\\n")
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, out)
"""


@dataclass
class Pod:
    name: str
    root: Path
    env: dict[str, str]
    pid1: subprocess.Popen[str] | None = None
    ranks: list[subprocess.Popen[bytes]] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    stopped_after: float | None = None
    killed: bool = False
    log: str = ""


def start_pod(tmp: Path, name: str, ranks: int, signal_name: str) -> Pod:
    root = tmp / name
    root.mkdir(parents=True)
    bin_dir, _ = make_stubs(root)
    stop = stop_render() if signal_name == "SIGTERM" else rendered_stop(grace(), signal_name)
    env = base_env(root, bin_dir, name, ML_DEV_SERVERS="", ML_DEV_IDLE_SETTINGS=str(root / "no-idle.json"), **stop.env)
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    pod = Pod(name, root, env)
    # PID 1 in its own process group: the simulated runtime kills the whole container at the end
    pod.pid1 = subprocess.Popen(
        ["bash", str(MOUNT / "startup.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    wait_ready(pod.pid1, root / "state")
    train = root / "train.py"
    train.write_text(TRAIN)
    for r in range(ranks):
        ckpt = root / f"ckpt-{r}.txt"
        pod.checkpoints.append(ckpt)
        # as over SSH: the agent's stdin is the launcher's channel (kept open here), its own session
        agent = subprocess.Popen(
            [sys.executable, str(ML_DEV), "_rank", "--cwd", str(root), "--", sys.executable, str(train), str(ckpt), str(SAVE_SECONDS)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        pod.ranks.append(agent)
    for r, ckpt in enumerate(pod.checkpoints):
        started = Path(str(ckpt) + ".started")
        assert wait_until(started.exists, 20), f"{name} rank {r} never started"
    assert wait_until(lambda: len(list((root / "state" / "heartbeat").glob("rank-*.json"))) == ranks, 20)
    return pod


def kubelet_terminate(pod: Pod, grace_period: int) -> None:
    """preStop hook, SIGTERM to PID 1, SIGKILL at the end of the grace period (killContainer's order)."""
    assert pod.pid1 is not None
    start = time.monotonic()
    deadline = start + grace_period
    try:
        subprocess.run(stop_render().pre_stop, env=pod.env, timeout=grace_period, capture_output=True, check=False)
    except subprocess.TimeoutExpired:
        pass
    # the kubelet gives the container at least 2 s after the hook (minimumGracePeriodInSeconds)
    deadline = max(deadline, time.monotonic() + 2)
    pod.pid1.send_signal(signal.SIGTERM)
    try:
        out, _ = pod.pid1.communicate(timeout=max(0.1, deadline - time.monotonic()))
        pod.log = out
    except subprocess.TimeoutExpired:
        pod.killed = True
    # the runtime removes the container: everything still in it dies
    # Popen[str] and Popen[bytes]: only pid and wait() are used
    everything: list[subprocess.Popen[Any]] = [pod.pid1, *pod.ranks]
    for proc in everything:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in everything:
        proc.wait(timeout=10)
    pod.stopped_after = time.monotonic() - start


def complete(path: Path) -> bool:
    if not path.exists():
        return False
    lines = path.read_text().splitlines()
    return bool(lines) and lines[0].startswith("step=") and lines[-1] == "END" and len(lines) == 12


def run_trial(tmp: Path, pods: int, ranks: int, signal_name: str = "SIGTERM") -> list[Pod]:
    started = [start_pod(tmp, f"ml-dev-env-{i}", ranks, signal_name) for i in range(pods)]
    period = stop_render().grace_period
    threads = [threading.Thread(target=kubelet_terminate, args=(p, period)) for p in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=period + 30)
    return started


def test_every_rank_saves_a_complete_checkpoint_before_every_stop(tmp_path: Path) -> None:
    """10 trials of 2 pods x 2 ranks: every checkpoint complete, every pod gone within grace + 10 s."""
    times: list[float] = []
    for trial in range(10):
        pods = run_trial(tmp_path / f"trial-{trial}", pods=2, ranks=2)
        for pod in pods:
            assert not pod.killed, f"trial {trial}: {pod.name} needed SIGKILL\n{pod.log}"
            assert pod.stopped_after is not None and pod.stopped_after <= grace() + 10, (trial, pod.name, pod.stopped_after)
            for ckpt in pod.checkpoints:
                assert complete(ckpt), f"trial {trial}: {ckpt} incomplete\n{pod.log}"
            times.append(pod.stopped_after)
    print(f"stop time per pod over 10 trials: max {max(times):.2f} s, min {min(times):.2f} s (grace {grace()} s)")


def test_the_configured_signal_reaches_the_rank(tmp_path: Path) -> None:
    """checkpointSignal SIGUSR1: a job that handles only SIGUSR1 still saves (SIGTERM would kill it)."""
    (pod,) = run_trial(tmp_path, pods=1, ranks=1, signal_name="SIGUSR1")
    assert not pod.killed, pod.log
    assert complete(pod.checkpoints[0]), pod.log


def test_pid1_alone_forwards_and_waits(tmp_path: Path) -> None:
    """No preStop hook (a runtime that sends only SIGTERM): PID 1's trap forwards and waits itself."""
    pod = start_pod(tmp_path, "ml-dev-env-0", 1, "SIGTERM")
    assert pod.pid1 is not None
    start = time.monotonic()
    pod.pid1.send_signal(signal.SIGTERM)
    out, _ = pod.pid1.communicate(timeout=grace() + 10)
    elapsed = time.monotonic() - start
    for proc in pod.ranks:
        proc.wait(timeout=10)
    assert pod.pid1.returncode == 0, out
    assert complete(pod.checkpoints[0]), out
    assert elapsed >= SAVE_SECONDS * 0.8, f"PID 1 exited after {elapsed:.2f} s, before the rank saved"
    assert f"stop: 1 rank(s) of ml-dev run get SIGTERM and up to {grace()}s to save a checkpoint" in out, out


def test_a_rank_that_ignores_the_signal_is_killed_at_the_grace(tmp_path: Path) -> None:
    """A job without a handler for the configured signal is killed after the grace; PID 1 still ends in time."""
    root = tmp_path / "pod"
    root.mkdir()
    bin_dir, _ = make_stubs(root)
    env = base_env(root, bin_dir, "ml-dev-env-0", ML_DEV_SERVERS="", ML_DEV_CHECKPOINT_GRACE_SECONDS="2")
    env["ML_DEV_IDLE_SETTINGS"] = str(root / "none.json")
    pid1 = subprocess.Popen(["bash", str(MOUNT / "startup.sh")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_ready(pid1, root / "state")
    agent = subprocess.Popen(
        [sys.executable, str(ML_DEV), "_rank", "--cwd", str(root), "--", "bash", "-c", "trap '' TERM; while :; do sleep 0.1; done"],
        env=env,
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    assert wait_until(lambda: len(list((root / "state" / "heartbeat").glob("rank-*.json"))) == 1, 20)
    start = time.monotonic()
    pid1.send_signal(signal.SIGTERM)
    out, _ = pid1.communicate(timeout=20)
    assert agent.wait(timeout=10) == 128 + signal.SIGKILL, out
    assert 1.5 <= time.monotonic() - start <= 2 + 10, out


@pytest.mark.parametrize(
    ("signal_name", "preset", "want"),
    [
        ("SIGUSR1", None, "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"),
        ("SIGTERM", None, None),  # torchrun's default list already has it
        ("SIGUSR2", "SIGTERM,SIGUSR2", "SIGTERM,SIGUSR2"),  # the user's own list is kept
    ],
)
def test_a_rank_tells_torchrun_to_forward_the_checkpoint_signal(
    tmp_path: Path, signal_name: str, preset: str | None, want: str | None
) -> None:
    """torchrun forwards only the signals in TORCHELASTIC_SIGNALS_TO_HANDLE to its workers (own sessions)."""
    env = {**os.environ, "ML_DEV_STATE_DIR": str(tmp_path), "ML_DEV_CHECKPOINT_SIGNAL": signal_name}
    env.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
    if preset:
        env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = preset
    show = "import os; print(os.environ.get('TORCHELASTIC_SIGNALS_TO_HANDLE'))"
    run = subprocess.run(
        [sys.executable, str(ML_DEV), "_rank", "--no-stdin-watch", "--cwd", str(tmp_path), "--", sys.executable, "-c", show],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(want), run.stdout


def test_ml_dev_status_shows_a_pod_that_got_its_stop(tmp_path: Path) -> None:
    """checkpoint_stop.sh (preStop or PID 1's trap) leaves its marker; `ml-dev status`'s per-pod line shows it."""
    from inpod.ml_dev.status import STATUS_SCRIPT

    env = {"PATH": "/usr/bin:/bin", "ML_DEV_STATE_DIR": str(tmp_path), "NODE_RANK": "1", "NNODES": "2"}

    def line() -> str:
        run = subprocess.run(["bash", "-c", STATUS_SCRIPT], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert "STOPPING" not in line()
    before = time.time()
    stop = subprocess.run(stop_render().pre_stop, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert stop.returncode == 0, stop.stderr
    shown = line().split(" STOPPING since ", 1)[1]
    stamp = calendar.timegm(time.strptime(shown, "%Y-%m-%d %H:%M:%S UTC"))
    assert before - 1 <= stamp <= time.time() + 1, shown


def test_the_launchers_stop_takes_the_grace_from_the_container_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ml-dev run`'s stop of its clients waits the checkpoint grace the container env holds (contract.STOP_ENV);
    rank.env never holds it (contract.RANK_ENV), so a value there is not what it reads."""
    from inpod import contract
    from inpod.ml_dev import launch

    assert contract.CHECKPOINT_GRACE_ENV not in contract.RANK_ENV
    (tmp_path / contract.RANK_ENV_FILE).write_text(f"export {contract.CHECKPOINT_GRACE_ENV}=999\n")
    monkeypatch.setenv(contract.STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(contract.CHECKPOINT_GRACE_ENV, "0")
    asked: list[object] = []
    real = launch.stop_grace

    def spy(values: dict[str, str] | None = None) -> int:
        asked.append(values)
        return real(values)

    monkeypatch.setattr(launch, "stop_grace", spy)
    launch.stop_all({})
    assert asked == [None], "the grace is looked up in the environment, not in rank.env"
    assert real() == 0
