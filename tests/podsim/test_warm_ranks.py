"""Warm ranks (`ml-dev ranks`, issue 51) on 3 simulated pods of the render, 2 ranks per pod: one session for every check.

The ranks form a process group with the stop matrix's stand-in collective (tests/podsim/stopjob.py: rank 0 serves an
all-reduce on MASTER_ADDR:MASTER_PORT; torch is not installed here), each call tagged so an interrupted call leaves
nothing for the next (GROUP). Cells run from pod 0's terminal (`ml-dev ranks exec`); the checks, in order:
variables persist and every rank has `ml-dev run`'s environment (rank values, the listed Secret); output labelled per
rank in order; `--ranks` subsets; a cell, an interrupt and a client gone from pod 2's terminal (through the fabric's
SSH to the hub on pod 0); an exception names its rank with its traceback and interrupts the others; Ctrl-C while
every rank is blocked in a collective interrupts every rank and the group works in the next cell, 10/10; `ml-dev run`
is refused while warm ranks hold the GPUs; `ml-dev ranks stop` during a cell gives every rank the checkpoint signal
(a cell's handler saves) and leaves no warm process on any pod.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inpod import contract as pod_contract
from inpod.ml_dev import why
from tests.podsim.idlestop import mine, wait_for, with_grace
from tests.podsim.leakscan import list_secret, new_value
from tests.podsim.pods import PodSim, missing_requirements, render_stack
from tests.podsim.warmgroup import GROUP

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}")]

PROJECT = "/workspace/warm"
PODS, NPROC = 3, 2
WORLD = PODS * NPROC
GRACE = 5
SECRET, SECRET_KEY = "warm-canary", "WARM_CANARY_TOKEN"
VALUE = new_value()
PY_SPY = Path(sys.executable).parent / "py-spy"
WARM = "_warm-(node|worker|bridge)|_ranks-(hub|relay)"  # pgrep -f: what of the warm ranks may run on a pod


def objects(objects: dict[str, Any]) -> None:
    with_grace(GRACE)(objects)
    objects["nodes"] = {**objects["nodes"], "count": PODS, "gpusPerPod": 1}
    list_secret(objects, SECRET, SECRET_KEY)


@pytest.fixture(scope="module")
def sim() -> Iterator[PodSim]:
    render = render_stack("barcelona", objects)
    programs = {"/usr/local/bin/py-spy": PY_SPY} if PY_SPY.exists() else {}  # as the base image ships it (test_why.py)
    pods = PodSim(render, count=PODS, namespace_secrets={SECRET: {SECRET_KEY: VALUE}}, image_programs=programs)
    pods.start()
    try:
        pods.write(0, f"{PROJECT}/group.py", GROUP)
        res = pods.exec(0, f"ml-dev ranks start --nproc-per-node {NPROC}", cwd=PROJECT, timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"{WORLD} warm ranks on {PODS} pods" in res.stdout, res.stdout + res.stderr
        yield pods
    finally:
        pods.exec(0, "ml-dev ranks stop", timeout=60)
        pods.stop()
    assert not mine(pods), mine(pods)


def cell(sim: PodSim, code: str, *flags: str, timeout: float = 60, pod: int = 0) -> subprocess.CompletedProcess[str]:
    sim.write(pod, "/tmp/cell.py", code)
    return sim.exec(pod, ["ml-dev", "ranks", "exec", "-f", "/tmp/cell.py", *flags], timeout=timeout)


def warm_processes(sim: PodSim, index: int) -> list[str]:
    res = sim.exec(index, f"pgrep -af '{WARM}' || true")
    return [line for line in res.stdout.splitlines() if "pgrep" not in line]


def records_dir(sim: PodSim) -> str:
    """The environment's records folder, as pod 0 names it (contract.records_dir)."""
    env = sim.pods[0].env
    return pod_contract.records_dir(env["ML_DEV_WORKSPACE"], env["POD_NAME"].rpartition("-")[0])


def none_left(sim: PodSim, index: int) -> bool:
    return not warm_processes(sim, index)


def by_rank(text: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\[\s*(\d+)\] (.*)", line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


@pytest.mark.timeout(300)
def test_cells_keep_their_namespace_and_the_environment_of_a_rank(sim: PodSim) -> None:
    res = cell(sim, "import group, hashlib, os\ng = group.Group()\nmine = int(os.environ['RANK']) * 10\nprint('set', mine)\n")
    assert res.returncode == 0, res.stdout + res.stderr
    show = (
        "for i in range(3):\n    print('line', i, mine)\n"
        "print('env', os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'], os.environ['NODE_RANK'],"
        f" os.environ['MASTER_ADDR'] != '', hashlib.sha256(os.environ[{SECRET_KEY!r}].encode()).hexdigest())\n"
        "g.all_reduce(mine)\n"
    )
    res = cell(sim, show)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = by_rank(res.stdout)
    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    total = sum(r * 10 for r in range(WORLD))
    assert sorted(lines) == list(range(WORLD)), res.stdout
    for rank, got in lines.items():
        # in order per rank; the last bare expression's value shown as a notebook shows it
        assert got == [
            *(f"line {i} {rank * 10}" for i in range(3)),
            f"env {rank} {rank % NPROC} {WORLD} {rank // NPROC} True {digest}",
            str(total),
        ]
    assert VALUE not in res.stdout + res.stderr
    only = cell(sim, "print('here')", "--ranks", "0,3")
    assert only.returncode == 0 and by_rank(only.stdout) == {0: ["here"], 3: ["here"]}, only.stdout + only.stderr
    # the home page (pod 0) lists every pod's warm ranks and its last cell's state (cell 3 ran on pods 0 and 1 only)
    page = sim.exec(0, "python3 /opt/ml-dev-env/home_page.py render", timeout=60)
    assert page.returncode == 0, page.stderr
    for index, pod in enumerate(p.name for p in sim.pods):
        item = re.search(rf'<li class="warm">ranks <span data-k="warm:{pod}:ranks">{index * 2},{index * 2 + 1}</span>.*?</li>', page.stdout)
        assert item, page.stdout[page.stdout.find("Warm ranks") :][:2000]
        assert f'last cell <span data-k="warm:{pod}:cell">{2 if index == 2 else 3}</span> ok' in item.group(0), item.group(0)


@pytest.mark.timeout(300)
def test_an_exception_names_its_rank_and_interrupts_every_other(sim: PodSim) -> None:
    started = time.monotonic()
    res = cell(sim, "import time\nif int(os.environ['RANK']) == 3:\n    time.sleep(0.5)\n    1 / 0\ntime.sleep(120)\n")
    assert time.monotonic() - started < 60, res.stdout + res.stderr  # the others' 120 s sleep was interrupted
    assert res.returncode == 1, res.stdout + res.stderr
    errors = by_rank(res.stderr)
    assert "ZeroDivisionError: division by zero" in errors[3] and "Traceback (most recent call last):" in errors[3], res.stderr
    assert any("1 / 0" in line for line in errors[3]), res.stderr  # the cell's own line in its traceback
    assert "ml-dev: the cell raised on rank 3; every other rank's cell was interrupted" in res.stderr
    assert set(errors) == {3}, res.stderr  # an interrupt is not an error
    after = cell(sim, "print(mine)")
    assert after.returncode == 0 and by_rank(after.stdout) == {r: [str(r * 10)] for r in range(WORLD)}, after.stdout + after.stderr


@pytest.mark.timeout(600)
def test_ctrl_c_in_a_collective_interrupts_every_rank_and_the_group_still_works_10_of_10(sim: PodSim) -> None:
    """Every rank blocked in an all-reduce that cannot complete (rank 1 joins another one), Ctrl-C of `ranks exec`:
    every rank's cell ends with KeyboardInterrupt, and the next cell's all-reduce over the same group answers."""
    sim.write(0, "/tmp/stuck.py", "print('in', flush=True)\ng.all_reduce(1, tag='other-%d' % g.seq if g.rank == 1 else None)\n")
    worked = 0
    for trial in range(10):
        proc = sim.popen(0, "ml-dev ranks exec -f /tmp/stuck.py")
        seen = entered(proc)
        time.sleep(0.3)  # into the collective's recv
        sim.interrupt(proc)
        out, _ = proc.communicate(timeout=30)
        text = "\n".join(seen) + out
        assert proc.returncode == 130, (trial, text)
        assert "ml-dev: interrupted on every rank; the ranks stay warm" in text, (trial, text)
        res = cell(sim, "g.all_reduce(1)")
        if res.returncode == 0 and by_rank(res.stdout) == {r: [str(WORLD)] for r in range(WORLD)}:
            worked += 1
    assert worked == 10


@pytest.mark.timeout(300)
def test_a_broken_bridge_is_replaced_at_the_next_cell(sim: PodSim) -> None:
    """The hub's SSH sessions to pods 1 and 2 end (their clients killed, as a broken connection ends them): the
    next cell reaches every rank through new ones, the ranks' namespaces intact."""
    found = sim.exec(0, "pgrep -f '^ssh .*_warm-bridge'").stdout.split()
    assert len(found) == PODS - 1, found  # pod 0's own bridge is a local process
    sim.exec(0, f"kill {' '.join(found)}")
    res = cell(sim, "print(mine)")
    assert res.returncode == 0 and by_rank(res.stdout) == {r: [str(r * 10)] for r in range(WORLD)}, res.stdout + res.stderr
    again = sim.exec(0, "pgrep -f '^ssh .*_warm-bridge'").stdout.split()
    assert len(again) == PODS - 1 and not set(again) & set(found), (found, again)


def relays(sim: PodSim) -> list[str]:
    """The hub's pod's relay sessions (`ml-dev _ranks-relay`, a client on another pod)."""
    return [w for w in warm_processes(sim, 0) if "_ranks-relay" in w]


@pytest.mark.timeout(300)
def test_a_cell_its_interrupt_and_a_client_gone_from_another_pod(sim: PodSim) -> None:
    """`ranks exec` in pod 2's terminal (the hub on pod 0): the cell runs on every rank in the same namespaces; its
    Ctrl-C interrupts every rank blocked in a collective (the SSH session to the hub survives it) and the group works
    in the next cell; a client killed mid-cell is a client gone: the hub interrupts the cell, the next one runs."""
    res = cell(sim, "print(mine)", pod=2)
    assert res.returncode == 0 and by_rank(res.stdout) == {r: [str(r * 10)] for r in range(WORLD)}, res.stdout + res.stderr
    sim.write(2, "/tmp/stuck.py", "print('in', flush=True)\ng.all_reduce(1, tag='far-%d' % g.seq if g.rank == 1 else None)\n")
    proc = sim.popen(2, "ml-dev ranks exec -f /tmp/stuck.py")
    seen = entered(proc)
    time.sleep(0.3)
    sim.interrupt(proc)
    out, _ = proc.communicate(timeout=30)
    text = "\n".join(seen) + out
    assert proc.returncode == 130 and "ml-dev: interrupted on every rank; the ranks stay warm" in text, text
    res = cell(sim, "g.all_reduce(1)", pod=2)
    assert res.returncode == 0 and by_rank(res.stdout) == {r: [str(WORLD)] for r in range(WORLD)}, res.stdout + res.stderr
    proc = sim.popen(2, "ml-dev ranks exec -f /tmp/stuck.py")
    entered(proc)
    assert relays(sim), warm_processes(sim, 0)
    sim.interrupt(proc, signal.SIGKILL)  # the terminal's client gone: only its SSH session (a session of its own) is left
    proc.communicate(timeout=30)
    wait_for("the relay's end on pod 0", lambda: not relays(sim), 30)
    wait_for("the cell interrupted", lambda: ": interrupted on ranks" in sim.exec(0, "ml-dev ranks status").stdout, 30)
    res = cell(sim, "g.all_reduce(1)", pod=2)
    assert res.returncode == 0 and by_rank(res.stdout) == {r: [str(WORLD)] for r in range(WORLD)}, res.stdout + res.stderr


def entered(proc: subprocess.Popen[str]) -> list[str]:
    """`ranks exec`'s output until every rank printed `in` (then it blocks)."""
    assert proc.stdout is not None
    seen: list[str] = []
    while len([s for s in seen if s.endswith("] in")]) < WORLD:
        line = proc.stdout.readline()
        assert line, "".join(seen)
        seen.append(line.rstrip("\n"))
    return seen


@pytest.mark.timeout(300)
@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy of the dev lock is not installed (make venv)")
def test_ml_dev_why_names_the_rank_a_cell_left_out_of_the_collective(sim: PodSim) -> None:
    """Rank 1 sleeps in the cell's `stall_here`, every other rank waits in the all-reduce: `ml-dev why` from another
    pod names rank 1 and its frame in the cell, and the others' collective; then Ctrl-C ends the cell everywhere."""
    stuck = (
        "import time\ndef stall_here():\n    time.sleep(300)\nprint('in', flush=True)\n"
        "if g.rank == 1:\n    g.seq += 1  # the collective it skips, counted: the next cells' tags agree\n    stall_here()\n"
        "else:\n    g.all_reduce(1)\n"
    )
    sim.write(0, "/tmp/stall.py", stuck)
    proc = sim.popen(0, "ml-dev ranks exec -f /tmp/stall.py")
    entered(proc)
    time.sleep(1)
    res = sim.exec(2, "ml-dev why", timeout=120)
    sim.interrupt(proc)
    out, _ = proc.communicate(timeout=30)
    assert res.returncode == why.EXIT_STRAGGLER, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith(f"ml-dev why: rank 1 ({sim.pods[0].name}"), first
    assert re.search(r"stall_here \(cell-\d+\.py:3\)", first) and "ranks 0, 2–5 wait in Group.all_reduce (group.py:" in first, first
    assert proc.returncode == 130, out


KERNEL = r"""
import json, sys, time
from jupyter_client.manager import start_new_kernel

WORLD = int(sys.argv[1])
km, kc = start_new_kernel(kernel_name="python3")


def run(code, interrupt_after=None):
    msg_id = kc.execute(code)
    out, error, interrupted = [], None, False
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
            if interrupt_after and not interrupted and "".join(out).count(interrupt_after) >= WORLD:
                time.sleep(0.3)
                km.interrupt_kernel()  # the notebook's stop button: SIGINT to the kernel (interrupt_mode signal)
                interrupted = True
        elif kind == "error":
            error = {"ename": msg["content"]["ename"], "evalue": msg["content"]["evalue"]}
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            return {"out": "".join(out), "error": error}


cells = [
    run("%%ranks\nprint('nb', mine)"),
    run("%%ranks\nprint('in', flush=True)\ng.all_reduce(1, tag='nb-%d-%d' % (g.rank, g.seq))", interrupt_after="] in"),
    run("%%ranks\ng.all_reduce(1)"),
    run("%%ranks --ranks 1\n1 / 0"),
]
print(json.dumps(cells))
km.shutdown_kernel(now=True)
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("ipykernel") is None, reason="ipykernel of the dev lock is not installed (make venv)")
@pytest.mark.parametrize("pod", [0, 2], ids=["hub-pod", "other-pod"])
def test_a_notebook_cell_runs_on_every_rank_and_its_stop_button_interrupts(sim: PodSim, pod: int) -> None:
    """A real IPython kernel (ipykernel, started by jupyter_client as jupyter_server starts one) on pod 0 (the hub's)
    or pod 2 (through the fabric's SSH), with the startup files the pod's startup script wrote in its IPYTHONDIR:
    `%%ranks` cells share the ranks' namespaces with `ranks exec`, the stop button (the kernel's SIGINT, to its process
    group) interrupts every rank blocked in a collective, the group works in the next cell, and an exception fails the
    notebook cell naming its rank."""
    sim.write(pod, "/tmp/kernel.py", KERNEL)
    res = sim.exec(pod, [sys.executable, "/tmp/kernel.py", str(WORLD)], cwd="/tmp", timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    plain, stopped, after, failed = json.loads(res.stdout.splitlines()[-1])
    assert plain["error"] is None and by_rank(plain["out"]) == {r: [f"nb {r * 10}"] for r in range(WORLD)}, plain
    assert stopped["error"] == {"ename": "RanksError", "evalue": "interrupted on every rank; the ranks stay warm"}, stopped
    assert after["error"] is None and by_rank(after["out"]) == {r: [str(WORLD)] for r in range(WORLD)}, after
    assert failed["error"]["evalue"].startswith("the cell raised on rank 1;"), failed
    assert "ZeroDivisionError: division by zero" in by_rank(failed["out"])[1], failed


@pytest.mark.timeout(300)
def test_ml_dev_run_is_refused_while_warm_ranks_hold_the_gpus(sim: PodSim) -> None:
    for index in (0, 2):
        res = sim.exec(index, "ml-dev run --no-sync -- true", timeout=60)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "warm ranks hold this environment's GPUs" in res.stderr and "ml-dev ranks stop" in res.stderr, res.stderr


@pytest.mark.timeout(300)
def test_a_stop_during_a_cell_gives_every_rank_the_checkpoint_signal(sim: PodSim) -> None:
    save = (
        "import signal, sys, time\n"
        "def save(signum, frame):\n"
        "    f = open('saved-%s' % os.environ['RANK'], 'w')\n"
        "    time.sleep(0.5)\n"  # a save takes time: another rank's exit must not cut it (no interrupt during a stop)
        "    f.write(str(signum))\n"
        "    f.close()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "print('in', flush=True)\n"
        "g.all_reduce(1, tag='never-%d' % g.rank)\n"  # never complete: one tag per rank
    )
    sim.write(0, "/tmp/save.py", save)
    proc = sim.popen(0, "ml-dev ranks exec -f /tmp/save.py")
    assert proc.stdout is not None
    seen = [proc.stdout.readline() for _ in range(WORLD)]
    assert all(line.rstrip().endswith("] in") for line in seen), seen
    stop = sim.exec(0, "ml-dev ranks stop", timeout=GRACE + 60)
    assert stop.returncode == 0 and "warm ranks stopped" in stop.stdout, stop.stdout + stop.stderr
    out, _ = proc.communicate(timeout=30)
    for rank in range(WORLD):
        pod = rank // NPROC
        saved = sim.volume_dir(pod, "/workspace") / "warm" / f"saved-{rank}"
        assert saved.exists() and saved.read_text() == "15", (rank, stop.stderr, out)
    for index in range(PODS):
        wait_for(f"no warm process on pod {index}", functools.partial(none_left, sim, index), 30)
    status = sim.exec(0, "ml-dev ranks status")
    assert "not running" in status.stdout and "last cell" in status.stdout, status.stdout


@pytest.mark.timeout(300)
def test_a_pods_stop_gives_every_warm_rank_the_checkpoint_signal(sim: PodSim) -> None:
    """Warm ranks without a cell, each with a save handler a cell installed; pod 2 drained (the kubelet's stop:
    preStop hook, SIGTERM): its ranks save, the hub's run names the stop and every other pod's ranks save too."""
    res = sim.exec(0, f"ml-dev ranks start --nproc-per-node {NPROC}", cwd=PROJECT, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    save = (
        "import os, signal, sys\n"
        "def save(signum, frame):\n"
        "    open('drained-%s' % os.environ['RANK'], 'w').write(str(signum))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
    )
    assert cell(sim, save).returncode == 0
    assert sim.terminate(2) == "exited"
    wait_for("the hub's end", lambda: "not running" in sim.exec(0, "ml-dev ranks status").stdout, GRACE + 60)
    for rank in range(WORLD):
        saved = sim.volume_dir(rank // NPROC, "/workspace") / "warm" / f"drained-{rank}"
        assert saved.exists() and saved.read_text() == "15", rank
    log = sim.pods[0].path(f"{records_dir(sim)}/{pod_contract.WARM_DIR}/{pod_contract.WARM_HUB_LOG}").read_text()
    assert f"ml-dev: STOPPED: pod {sim.pods[2].name} is stopping (SIGTERM from its stop hook)" in log, log
    for index in (0, 1):
        wait_for(f"no warm process on pod {index}", functools.partial(none_left, sim, index), 30)
