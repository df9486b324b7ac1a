"""How `ml-dev run` is attached × launcher × stop, on 3 pods started from the render (tests/podsim): issue 45, items 1-3.

The stop matrix (test_stop_matrix.py) starts `ml-dev run` from a harness that keeps its output open to the end. Users
do not: their terminal drops, they pipe to `tee`, they kill the launcher. Each cell here runs the job of
tests/podsim/stopjob.py (a line per step, JOB_PRINT_STEPS=1; a real collective every step) attached one way, applies
the attachment's own event (alone, or with a drain of pod 2 right after it, during the grace) and checks item 1:
(a) every rank writes a complete checkpoint within checkpointGraceSeconds of the event, all at the same step;
(b) nothing of the job (job.py, train.sh, torchrun, the rank agent) runs on any remaining pod grace + 15 s after it;
(c) each rank's output is in its run log on its pod's workspace, through the save and the agent's last line (item 2);
(d) where `ml-dev run` outlives the event and something reads it, its status and last line name the event (item 4).

Attachments:
* pty: `ml-dev run` is the session leader of a pseudo-terminal (pty.openpty; `setsid -c`, as sshd makes `ssh -t`'s
  command), the terminal's master closes (the SSH connection or the terminal window went): the kernel sends SIGHUP to
  the session leader (drivers/tty/tty_jobctrl.c tty_signal_session_leader) and every later write gets EIO.
* tee: `ml-dev run … 2>&1 | tee train.log` (the real tee), Ctrl-C to the process group: tee dies with ml-dev run's
  output pipe still open, and every later write of ml-dev run gets EPIPE.
* sighup: `ml-dev run` the leader of a session without a terminal (`setsid`, as an SSH session without a pty runs it),
  SIGHUP to that session leader.
* sigkill: `ml-dev run` SIGKILLed: the rank agents see their stdin's EOF and nothing else.
* stdout-closed: the reader of `ml-dev run`'s stdout closes it (`| head`); its stderr still read.

The pods are shared by every cell of the module (each cell removes what the last one left: checkpoints; a drained pod
is restarted); each cell is a real launch, stop and save.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from inpod import contract
from tests.podsim.idlestop import complete, mine, wait_for, with_grace
from tests.podsim.pods import PodSim, missing_requirements, render_stack
from tests.podsim.stopjob import JOB, JOB_PROCESSES, PROJECT, TORCHRUN, TRAIN_SH, ckpt_dir, job_processes, records

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")]

GRACE = 5
SAVE_SECONDS = 1.0
PODS = 3
DRAINED = 2
LAUNCHERS = {
    "python": "ml-dev run --per-pod -- python3 job.py",
    "wrapper": "ml-dev run --per-pod -- ./train.sh",
    "torchrun": "ml-dev run -- torchrun job.py",
}
ATTACHMENTS = ("pty", "tee", "sighup", "sigkill", "stdout-closed")
STOPS = ("own", "drain-during")


def three_pods(objects: dict[str, Any]) -> None:
    with_grace(GRACE)(objects)
    objects["nodes"] = {**objects["nodes"], "count": PODS, "gpusPerPod": 1}


@pytest.fixture(scope="module")
def sim() -> Any:
    sim = PodSim(render_stack("barcelona", three_pods), count=PODS, image_programs={"/usr/local/bin/torchrun": TORCHRUN})
    with sim.start():
        sim.write(0, f"{PROJECT}/job.py", JOB)
        sim.write(0, f"{PROJECT}/train.sh", TRAIN_SH, mode=0o755)
        yield sim
    assert not mine(sim), mine(sim)


def workspace(sim: PodSim, index: int) -> Path:
    return sim.volume_dir(index, "/workspace")


def ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        out.add(pid)
    return out


def launcher_pid(root: int) -> int:
    """The host pid of `ml-dev run` below `root` (the test's nsenter)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"ml-dev") for a in argv) and b"run" in argv and root in ancestors(int(entry)):
            return int(entry)
    raise AssertionError(f"no `ml-dev run` below pid {root}")


class Reader(threading.Thread):
    """Reads a file descriptor until told to stop (then the test closes it: the reader gone)."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.data, self.halt = fd, bytearray(), threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: a pty whose slave side is closed everywhere
                return
            if not chunk:
                return
            self.data += chunk

    def close(self) -> None:
        self.halt.set()
        self.join(timeout=5)
        os.close(self.fd)

    def text(self) -> str:
        return self.data.decode(errors="replace")


class Attached:
    """`ml-dev run` on pod 0, attached as `kind` says; `event()` is that attachment's own event."""

    def __init__(self, sim: PodSim, kind: str, launcher: str) -> None:
        self.sim, self.kind = sim, kind
        command = "export JOB_PRINT_STEPS=1; "
        run = f"{LAUNCHERS[launcher]} {SAVE_SECONDS}"
        self.readers: list[Reader] = []
        self.err: Reader | None = None
        if kind == "pty":
            master, slave = os.openpty()
            argv = sim.command(0, command + f"exec setsid -c {run}", cwd=PROJECT)
            self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave)
            os.close(slave)
            self.out = Reader(master)
        elif kind == "tee":
            argv = sim.command(0, command + f"{run} 2>&1 | tee train.log", cwd=PROJECT)
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            self.out = Reader(os.dup(self.proc.stdout.fileno()))  # type: ignore[union-attr]
        else:
            prefix = "exec setsid " if kind == "sighup" else "exec "
            argv = sim.command(0, command + prefix + run, cwd=PROJECT)
            separate = subprocess.PIPE if kind == "stdout-closed" else subprocess.STDOUT
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=separate, start_new_session=True)
            self.out = Reader(os.dup(self.proc.stdout.fileno()))  # type: ignore[union-attr]
            if kind == "stdout-closed":
                self.err = Reader(os.dup(self.proc.stderr.fileno()))  # type: ignore[union-attr]
                self.err.start()
                self.proc.stderr.close()  # type: ignore[union-attr]
        if self.proc.stdout is not None:
            self.proc.stdout.close()  # the Reader's dup is the one read end
        self.out.start()

    def log(self) -> str:
        return self.out.text() + (self.err.text() if self.err else "") + "\n" + self.sim.pods[0].log.read_text()[-4000:]

    def event(self) -> None:
        if self.kind in ("pty", "stdout-closed"):
            self.out.close()  # the pty's master (a hangup) or the pipe's read end (its reader gone)
        elif self.kind == "tee":
            self.sim.interrupt(self.proc)  # Ctrl-C: SIGINT to the foreground process group (bash, ml-dev run, tee)
        elif self.kind == "sighup":
            os.kill(launcher_pid(self.proc.pid), signal.SIGHUP)
        elif self.kind == "sigkill":
            os.kill(launcher_pid(self.proc.pid), signal.SIGKILL)

    def finish(self) -> int:
        code = self.proc.wait(timeout=GRACE + 40)
        for reader in (self.out, self.err):
            if reader is not None and not reader.halt.is_set():
                reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def run_log(sim: PodSim, index: int) -> Path:
    # the workspace volume as this machine holds it: a drained pod's own view (/proc/<pid>/root) is gone
    runs = Path(contract.records_dir(str(workspace(sim, index)), sim.app)) / contract.RUNS_SUBDIR
    latest = sorted(runs.iterdir())[-1]
    return latest / contract.RUN_LOG_DIR / f"{contract.RUN_LOG_PREFIX}{index}{contract.RUN_LOG_SUFFIX}"


def reset(sim: PodSim) -> None:
    """What a previous cell left: a drained pod comes back; checkpoints and run logs go."""
    for i in range(PODS):
        pod = sim.pods[i]
        if pod.proc is None or pod.proc.poll() is not None:
            sim.restart(i)
        sim.exec(i, f"pkill -KILL -f '{JOB_PROCESSES}' || true", timeout=30)
        for d in (ckpt_dir(sim, i), Path(contract.records_dir(str(workspace(sim, i)), sim.app)) / contract.RUNS_SUBDIR):
            if d.exists():
                subprocess.run(["rm", "-rf", str(d)], check=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
@pytest.mark.parametrize("attachment", ATTACHMENTS)
def test_every_attachment_keeps_every_checkpoint(sim: PodSim, attachment: str, launcher: str, stop: str) -> None:
    reset(sim)
    cell = Attached(sim, attachment, launcher)
    drained: dict[int, str] = {}
    try:
        for i in range(PODS):
            wait_for(f"rank {i} started", (ckpt_dir(sim, i) / f"rank{i}.started").exists, 90, cell.log)
        wait_for("a step line", lambda: "step 3" in cell.out.text(), 30, cell.log)
        since = time.time()
        cell.event()
        drain = threading.Thread(target=lambda: drained.update({DRAINED: sim.terminate(DRAINED)}))
        if stop == "drain-during":
            time.sleep(0.3)
            drain.start()
        code = cell.finish()
        if stop == "drain-during":
            drain.join(timeout=sim.grace + 60)
            assert drained == {DRAINED: "exited"}, drained
        # (b) nothing of the job on a remaining pod grace + 15 s after the event (ml-dev run SIGKILLed ends at once:
        # the agents still work then)
        for i in range(PODS):
            if i in drained:
                continue

            def quiet(i: int = i) -> bool:
                return job_processes(sim, i) == [] or time.time() - since > GRACE + 15

            left = wait_for(f"nothing of the job on pod {i}", quiet, GRACE + 20)
            assert left and job_processes(sim, i) == [], (i, job_processes(sim, i), cell.log())
        # (a) every rank saved, within the grace, at one step
        got = records(sim, PODS)
        steps = []
        for r in range(PODS):
            rec = got.get(r)
            assert rec is not None and rec["exit"] in ("saved", "saved-after-peer-lost"), (r, rec, cell.log())
            assert complete(ckpt_dir(sim, r) / Path(rec["path"]).name), (r, rec)
            assert rec["at"] - since <= GRACE, (r, rec["at"] - since, cell.log())
            steps.append(rec["step"])
        assert len(set(steps)) == 1, (steps, cell.log())
        # (c) the run log of each rank holds its output through the save, and the agent's last line
        for i in range(PODS):
            text = run_log(sim, i).read_text()
            assert f"rank {i} step 1\n" in text and f"rank {i} saved ckpt/step{steps[0]}-rank{i}.txt" in text, (i, text[-2000:])
            assert text.splitlines()[-1].startswith(contract.RUN_LOG_END), (i, text[-2000:])
        # (d) the status and last line, where ml-dev run outlived the event and is read
        out = cell.out.text() + (cell.err.text() if cell.err else "")
        if attachment == "pty":
            assert code == 129, (code, out)
        elif attachment == "sighup":
            assert code == 129 and "ml-dev: INTERRUPTED: ml-dev run got SIGHUP" in out, (code, out)
        elif attachment == "sigkill":
            assert code in (-9, 137), (code, out)
        elif attachment == "stdout-closed":
            assert code == 141 and "ml-dev: INTERRUPTED: ml-dev run: its stdout took no more output" in out, (code, out)
        elif attachment == "tee":
            tee = (workspace(sim, 0) / PROJECT.removeprefix("/workspace/") / "train.log").read_text()
            assert "rank 0 step 1" in tee, tee[-2000:]  # tee got the output until Ctrl-C
    finally:
        cell.kill()
        for reader in (cell.out, cell.err):
            if reader is not None and not reader.halt.is_set():
                reader.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("attachment", ["sigkill", "stdout-closed"])
def test_an_agent_whose_pipe_is_gone_still_kills_a_stubborn_rank(sim: PodSim, attachment: str) -> None:
    """The job ignores SIGTERM behind `./run.sh` (stopjob.STUBBORN): the launcher gone (SIGKILL) or its output's
    reader gone, the agents' "still running … killed" line meets a closed pipe at the grace's end; each agent has
    SIGKILLed its group before it writes the line (RankGroup.wait), so nothing of the job runs at grace + 15 s, and
    each rank's run log ends with the agent's lines."""
    from tests.podsim.stopjob import RUN_SH, STUBBORN

    reset(sim)
    sim.write(0, f"{PROJECT}/stubborn.py", STUBBORN)
    sim.write(0, f"{PROJECT}/run.sh", RUN_SH, mode=0o755)
    LAUNCHERS["stubborn"] = "ml-dev run --per-pod -- ./run.sh"
    try:
        cell = Attached(sim, attachment, "stubborn")
    finally:
        del LAUNCHERS["stubborn"]
    try:
        for i in range(PODS):
            wait_for(f"rank {i} started", (ckpt_dir(sim, i) / f"rank{i}.started").exists, 90, cell.log)
        time.sleep(1)
        since = time.time()
        if attachment == "sigkill":
            cell.event()
        else:  # the job prints nothing: the launcher finds its stdout gone at its own next line (the stop's)
            cell.out.close()
            sim.interrupt(cell.proc, signal.SIGTERM)
        cell.finish()
        for i in range(PODS):

            def gone(i: int = i) -> bool:
                return sim.exec(i, "pgrep -af '[s]tubborn|[r]un[.]sh|ml-dev [_]rank' || true", timeout=30).stdout == ""

            wait_for(f"nothing of the job on pod {i}", gone, GRACE + 15 - (time.time() - since), cell.log)
            text = run_log(sim, i).read_text()
            assert f"still running after {GRACE} s: killed" in text and text.splitlines()[-1].startswith(contract.RUN_LOG_END), text
    finally:
        cell.kill()
        for reader in (cell.out, cell.err):
            if reader is not None and not reader.halt.is_set():
                reader.close()


# ------------------------------------------------------------------------------ exit statuses (issue 45, item 4)


def launch(sim: PodSim, command: str) -> subprocess.Popen[str]:
    return sim.popen(0, f"exec {command}", cwd=PROJECT)  # no step lines: the output is read at the end


@pytest.mark.timeout(300)
def test_a_failed_rank_then_a_drain_reports_both_the_failure_deciding(sim: PodSim) -> None:
    """Rank 1 exits 3 at step 40, pod 2 is drained 0.5 s later (during the others' grace): the status is 3 (the first
    event), the last lines name the failed rank and its status, then the stop (pod, signal)."""
    reset(sim)
    launcher = launch(sim, f"{LAUNCHERS['python']} {SAVE_SECONDS} 1 40")
    drained: dict[int, str] = {}
    try:
        wait_for("rank 1 failed", lambda: records(sim, PODS).get(1, {}).get("exit") == "failed", 90, lambda: sim.pods[0].log.read_text())
        time.sleep(0.5)
        drained[DRAINED] = sim.terminate(DRAINED)
        out, _ = launcher.communicate(timeout=GRACE + 40)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=30)
    assert launcher.returncode == 3, out
    lines = out.splitlines()
    failed = [
        i for i, line in enumerate(lines) if line.startswith("ml-dev: FAILED: rank 1 (ml-dev-env-1) on ") and line.endswith("status 3")
    ]
    then = [
        i
        for i, line in enumerate(lines)
        if line.startswith("ml-dev: then STOPPED: pod ml-dev-env-2 is stopping (SIGTERM from its stop hook)")
    ]
    assert failed and then and failed[0] < then[0], out


@pytest.mark.timeout(300)
def test_sigterm_to_ml_dev_run_is_named_and_exits_143(sim: PodSim) -> None:
    """`kill <ml-dev run>` (SIGTERM): every rank saves one step, the status is 143 and the line names the signal."""
    reset(sim)
    launcher = launch(sim, f"{LAUNCHERS['python']} {SAVE_SECONDS}")
    try:
        for i in range(PODS):
            wait_for(f"rank {i} started", (ckpt_dir(sim, i) / f"rank{i}.started").exists, 90, lambda: sim.pods[0].log.read_text())
        since = time.time()
        os.kill(launcher_pid(launcher.pid), signal.SIGTERM)
        out, _ = launcher.communicate(timeout=GRACE + 40)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=30)
    assert launcher.returncode == 143, out
    assert "ml-dev: got SIGTERM; stopping every rank" not in out  # the cause reads as the final line does
    assert "ml-dev: ml-dev run got SIGTERM; stopping every rank" in out and out.rstrip().endswith(
        "ml-dev: INTERRUPTED: ml-dev run got SIGTERM"
    ), out
    got = records(sim, PODS)
    assert {got[r]["exit"] for r in range(PODS)} == {"saved"} and len({got[r]["step"] for r in range(PODS)}) == 1, got
    assert max(got[r]["at"] for r in range(PODS)) - since <= GRACE, got


@pytest.mark.timeout(300)
def test_a_drain_during_the_tree_copy_is_named_a_stop(sim: PodSim) -> None:
    """Pod 2 drained while the launch copies a changed tree to it (a large file on the way): no rank starts anywhere,
    the status is 143 and the last line names the pod's stop, said by its agent at the gate before its sshd went."""
    reset(sim)
    big = sim.pods[0].path(f"{PROJECT}/data.bin")
    with open(big, "wb") as f:
        f.write(os.urandom(1 << 20) * 400)  # 400 MiB: the copy to each pod takes a while
    os.chown(big, sim.identity.uid, sim.identity.gid)
    launcher = launch(sim, f"{LAUNCHERS['python']} {SAVE_SECONDS}")
    try:

        def copying() -> bool:
            return sim.exec(DRAINED, "pgrep -af '[r]sync' || true", timeout=30).stdout != ""

        wait_for("the copy to pod 2", copying, 90, lambda: sim.pods[0].log.read_text(), step=0.05)
        outcome = sim.terminate(DRAINED)
        out, _ = launcher.communicate(timeout=GRACE + 60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=30)
        big.unlink()
    assert outcome == "exited"
    assert launcher.returncode == 143, out
    assert out.rstrip().endswith(
        f"ml-dev: STOPPED: pod ml-dev-env-{DRAINED} is stopping (its stop hook ran during the tree copy); no rank started"
    ), out
    assert records(sim, PODS) == {}, records(sim, PODS)


# ------------------------------------------------------------------------------ ml-dev logs (issue 45, item 2)


@pytest.mark.timeout(300)
def test_ml_dev_logs_reads_back_what_a_closed_terminal_lost(sim: PodSim) -> None:
    """The terminal of `ml-dev run` closes (pty hangup): what the ranks printed afterwards, their saves included, is in
    their run logs; `ml-dev logs` on the launching pod prints every rank's (prefixed), `--rank 2` one (read from its
    pod over SSH), `-f` follows a live run until its rank's last line."""
    reset(sim)
    cell = Attached(sim, "pty", "python")
    try:
        for i in range(PODS):
            wait_for(f"rank {i} started", (ckpt_dir(sim, i) / f"rank{i}.started").exists, 90, cell.log)
        wait_for("a step line", lambda: "step 3" in cell.out.text(), 30, cell.log)
        cell.event()
        assert cell.finish() == 129
    finally:
        cell.kill()
    for i in range(PODS):

        def ended(i: int = i) -> bool:
            return run_log(sim, i).read_text().splitlines()[-1].startswith(contract.RUN_LOG_END)

        wait_for(f"rank {i}'s log ended", ended, 30)
    steps = {rec["step"] for rec in records(sim, PODS).values()}
    assert len(steps) == 1, records(sim, PODS)
    step = steps.pop()
    every = sim.exec(0, "ml-dev logs", cwd=PROJECT, timeout=60)
    assert every.returncode == 0, every.stdout + every.stderr
    for i in range(PODS):
        assert f"[{i}] rank {i} step 1\n" in every.stdout and f"[{i}] rank {i} saved ckpt/step{step}-rank{i}.txt" in every.stdout, (
            every.stdout
        )
    one = sim.exec(0, "ml-dev logs --rank 2", cwd=PROJECT, timeout=60)
    assert one.returncode == 0 and one.stdout.startswith("rank 2 step 1\n"), one.stdout + one.stderr
    assert one.stdout.splitlines()[-1].startswith(contract.RUN_LOG_END) and "[" not in one.stdout.splitlines()[0]
    # -f on a live run: it ends by itself at the rank's last line, once the run stopped
    reset(sim)
    launcher = launch(sim, f"{LAUNCHERS['python']} {SAVE_SECONDS}")
    follow = None
    try:
        for i in range(PODS):
            wait_for(f"rank {i} started", (ckpt_dir(sim, i) / f"rank{i}.started").exists, 90)
        follow = sim.popen(0, "ml-dev logs -f --rank 1", cwd=PROJECT)
        time.sleep(1)
        assert follow.poll() is None, follow.communicate()
        sim.interrupt(launcher)
        out, _ = follow.communicate(timeout=GRACE + 30)
        assert follow.returncode == 0 and out.splitlines()[-1].startswith(contract.RUN_LOG_END), out
        assert "rank 1 saved ckpt/step" in out, out
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.communicate(timeout=30)
        if launcher.poll() is None:
            launcher.kill()
        launcher.communicate(timeout=60)
