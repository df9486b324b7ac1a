"""The tree's fan-out on 6 simulated pods from the render (tests/podsim): real sshd, ssh and rsync, one network namespace
and veth per pod, a per-pod workspace; the threshold lowered ($ML_DEV_FANOUT) so that a small tree passes through
relays (inpod/ml_dev/fanout.py, contract.FANOUT_DEFAULTS).

The synced tree is the whole workspace (git top level /workspace), so HOME (`/workspace/.home/<pod>`, a per-pod
directory of the render) lies inside it. A relay's hop is held open by a slow link to its receiver (a tbf qdisc on
the receiver's veth, on the bridge side), so the test can break the relay in the middle of its round; what
happens then is read from the launcher's own lines, never from a clock.

The stack lists a Secret (`env.secrets`) and every pod's `ssh` records its argv (tests/podsim/leakscan.py): the
launches through relays run under the shared leak scan, and the recorded SSH commands show what a launch costs
(`ml-dev run`'s rank agents answer the tree check at their gate: inpod/ml_dev/sync.py serve_gate).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets as pysecrets
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core import naming
from inpod import contract
from tests.podsim.leakscan import SSH_ARGV_LOG, SSH_ARGV_PROGRAM, LeakScan
from tests.podsim.pods import GATEWAY, PREFIX, PodSim, leftovers, missing_requirements
from tests.podsim.pods import render_stack as render

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(420)]

APP = "ml-dev-env"
PODS = 6
WORKSPACE = "/workspace"
STATE = "/tmp/ml-dev-env"
LAUNCHER = "python3 /opt/ml-dev-env/ml-dev"
BLOB = 512 << 10
FANOUT = {"ML_DEV_FANOUT": json.dumps({"minBytes": 0, "stallSeconds": 3})}
SECRET, SECRET_KEY = "fanout-canary", "FANOUT_CANARY_TOKEN"  # a Secret of the namespace, listed in env.secrets
VALUE = pysecrets.token_urlsafe(24)[:32]
PROGRAM = f"""import os
assert os.environ.get({SECRET_KEY!r}), "the listed Secret's key from this pod's mount"
open("/tmp/ml-dev-env/ran", "w").write(os.environ["NODE_RANK"])
"""

SEEN = """import hashlib, sys
open("/tmp/ml-dev-env/seen", "w").write(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())
"""
MTIME_NS = 1_700_000_000_123_456_789


def six_pods_per_pod_workspace(objects: dict[str, Any]) -> None:
    objects["nodes"] = {**objects["nodes"], "count": PODS, "gpusPerPod": 1}
    objects["storage"] = {"mode": "per-pod", "volumes": [{"name": "workspace", "mountPath": WORKSPACE, "size": "1Gi"}]}
    objects["env"] = {"secrets": [{"secret": SECRET, "keys": [SECRET_KEY]}]}


@pytest.fixture(scope="module")
def sim() -> Iterator[PodSim]:
    before = set(leftovers())
    c = PodSim(
        render("nerc-production", six_pods_per_pod_workspace),
        namespace_secrets={SECRET: {SECRET_KEY: VALUE}},
        image_programs=SSH_ARGV_PROGRAM,
    )
    try:
        c.start()
        for i in range(4):
            c.write(0, f"{WORKSPACE}/data/blob-{i}.bin", "").write_bytes(os.urandom(BLOB))
        c.write(0, f"{WORKSPACE}/prog.py", PROGRAM)
        c.write(0, f"{WORKSPACE}/seen.py", SEEN)
        c.write(0, f"{WORKSPACE}/gone-later.txt", "deleted on pod 0 later\n")
        c.write(0, f"{WORKSPACE}/.gitignore", "out/\n")
        c.write(0, f"{WORKSPACE}/.home/{naming.pod_name(APP, 0)}/notes.txt", "pod 0's own\n")  # HOME is there too
        git = c.exec(0, "git init -q .", cwd=WORKSPACE)
        assert git.returncode == 0, git.stderr
        yield c
    finally:
        c.stop()
        assert not [x for x in set(leftovers()) - before if f"{PREFIX}{c.run_id}-" in x]


def tree(c: PodSim, index: int) -> dict[str, str]:
    """{path: sha256} of pod `index`'s workspace, without HOME, .git, the manifest and `.ml-dev-env/` (pod 0's home
    page writes its GPU history there at its own pace, inpod/home/page.py history_file: a sync cannot keep up)."""
    root = c.pods[index].path(WORKSPACE)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == root and d in (".home", ".git", ".ml-dev-env"))]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel != ".ml-dev-synced":
                out[rel] = hashlib.sha256(Path(dirpath, name).read_bytes()).hexdigest()
    return out


def last_sync(c: PodSim) -> dict[str, Any]:
    return json.loads(c.pods[0].path(f"{STATE}/sync-last.json").read_text())


def tx_bytes(c: PodSim, index: int) -> int:
    """Bytes pod `index` sent out of its eth0 (the veth's counter, read in the pod's network namespace)."""
    return int(c.pods[index].path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def change(c: PodSim, name: str = "data/blob-0.bin", size: int = BLOB) -> None:
    c.write(0, f"{WORKSPACE}/{name}", "").write_bytes(os.urandom(size))


def checked(c: PodSim, res: subprocess.CompletedProcess[str]) -> None:
    """Every pod holds pod 0's tree; every hop's source held the verified tree before the hop's round."""
    assert res.returncode == 0, res.stdout + res.stderr
    want = tree(c, 0)
    for i in range(1, PODS):
        assert tree(c, i) == want, f"pod {i}"
    record = last_sync(c)
    got_in = {0: 0}
    for h in sorted(record["hops"], key=lambda h: h["round"]):
        if not h.get("error") and h["hash"] == record["tree"]:
            got_in.setdefault(h["dst"], h["round"])
    for h in record["hops"]:
        assert got_in[h["src"]] < h["round"], h


@pytest.fixture
def slow_link(sim: PodSim) -> Iterator[Any]:
    """slow(i): traffic towards pod i crawls (1 Mbit/s), until fast(i) or the test's end."""
    slowed: set[int] = set()

    def slow(i: int) -> None:
        subprocess.run(
            sim.in_network(["tc", "qdisc", "add", "dev", f"v{i}", "root", "tbf", "rate", "1mbit", "burst", "32kbit", "latency", "10s"]),
            check=True,
            timeout=30,
        )
        slowed.add(i)

    def fast(i: int) -> None:
        if i in slowed:
            subprocess.run(sim.in_network(["tc", "qdisc", "del", "dev", f"v{i}", "root"]), check=False, timeout=30)
            slowed.discard(i)

    slow.fast = fast  # type: ignore[attr-defined]
    try:
        yield slow
    finally:
        for i in list(slowed):
            fast(i)


def wait_for_process(
    c: PodSim, pod: int, wanted: Callable[[list[bytes]], bool], what: str, proc: subprocess.Popen[str], timeout: float = 120
) -> None:
    """Until a process of pod `pod` has an argv `wanted` accepts; the launcher ending first fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in c.pod_pids(pod):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if wanted(argv):
                return
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.05)
    raise AssertionError(f"pod {pod} never ran {what}")


def wait_for_relay(c: PodSim, relay: int, to: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until pod `relay` runs the hop to pod `to` (its `ml-dev _relay` process)."""

    def wanted(argv: list[bytes]) -> bool:
        return b"_relay" in argv and argv[argv.index(b"--to") + 1] == str(to).encode()

    wait_for_process(c, relay, wanted, f"the hop to pod {to}", proc, timeout)


def wait_for_agent(c: PodSim, pod: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until pod `pod` runs the launch's rank agent (`ml-dev _rank`, started over its SSH session)."""
    wait_for_process(c, pod, lambda argv: b"_rank" in argv, "its rank agent", proc, timeout)


def read_until(proc: subprocess.Popen[str], pattern: str, seen: list[str]) -> str:
    """The launcher's output lines (kept in `seen`) until one matches; the stream's end fails."""
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(seen)}")


def finish(proc: subprocess.Popen[str], seen: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The rest of the launcher's output (through the text stream: lines it read ahead stay) and its status."""
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout)
    assert not reader.is_alive(), "".join(seen)
    proc.wait(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen + rest), "")


def link(c: PodSim, index: int, state: str) -> None:
    """Pod `index`'s veth down or up; up again, its default route back: the kernel deletes routes through a device
    that goes down (linux net/ipv4/fib_semantics.c fib_sync_down_dev) and does not restore them (a CNI would)."""
    pod = c.pods[index]
    subprocess.run(["ip", "-n", pod.netns, "link", "set", "eth0", state], check=True, timeout=30)
    if state == "up":
        subprocess.run(["ip", "-n", pod.netns, "route", "replace", "default", "via", GATEWAY], check=True, timeout=30)


def ran_everywhere(c: PodSim) -> bool:
    return all(c.pods[i].path(f"{STATE}/ran").read_text() == str(i) for i in range(PODS))


def clear_ran(c: PodSim) -> None:
    for pod in c.pods:
        pod.path(f"{STATE}/ran").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ tests


def test_the_first_copy_fans_out_in_log2_rounds_and_pod0_sends_it_once(sim: PodSim) -> None:
    size = sum(len(p.read_bytes()) for p in sim.pods[0].path(f"{WORKSPACE}/data").iterdir())
    before = tx_bytes(sim, 0)
    res = sim.exec(0, f"{LAUNCHER} sync", cwd=WORKSPACE, env=FANOUT, timeout=180)
    sent = tx_bytes(sim, 0) - before
    checked(sim, res)
    rounds = math.ceil(math.log2(PODS))
    assert [int(n) for n in re.findall(r"round (\d+)/(?:\d+):", res.stdout)] == list(range(1, rounds + 1)), res.stdout
    assert f"round {rounds}/{rounds}:" in res.stdout
    record = last_sync(sim)
    assert record["fan_out"] and record["rounds"] == rounds
    assert [h["dst"] for h in record["hops"] if h["src"] == 0] == [1]  # pod 0 sends once
    assert sorted(h["dst"] for h in record["hops"]) == list(range(1, PODS))
    # what left pod 0's veth: one copy of the tree and the SSH traffic around it, never two copies
    assert size < sent <= 2 * size, (sent, size)


def test_per_pod_and_relay_only_files_spread_nowhere_and_deletions_pass_through_relays(sim: PodSim) -> None:
    own = {i: sim.write(i, f"{WORKSPACE}/.home/{naming.pod_name(APP, i)}/mine.txt", f"pod {i}\n") for i in range(1, PODS)}
    sim.write(1, f"{WORKSPACE}/relay-only.txt", "made on the first relay\n")
    # pod 0's own records in the workspace (a run's verdicts, the page's history): rendered per pod, never synced
    mine = contract.records_dir(WORKSPACE, APP)
    records = [f"{mine}/{contract.RUNS_SUBDIR}/r1/why/verdict.json", f"{mine}/home/history.json"]
    for path in records:
        sim.write(0, path, "{}\n")
    sim.pods[0].path(f"{WORKSPACE}/gone-later.txt").unlink()
    change(sim)
    res = sim.exec(0, f"{LAUNCHER} sync", cwd=WORKSPACE, env=FANOUT, timeout=180)
    assert "round 3/3" in res.stdout, res.stdout + res.stderr
    relays = {h["src"] for h in last_sync(sim)["hops"]} - {0}
    assert 1 in relays and len(relays) >= 2
    for i in range(1, PODS):
        assert not sim.pods[i].path(f"{WORKSPACE}/gone-later.txt").exists(), f"pod {i}: the deletion did not pass"
        assert "relay-only.txt" not in tree(sim, i) or i == 1
        homes = {p.name for p in sim.pods[i].path(f"{WORKSPACE}/.home").iterdir()}
        assert homes == {naming.pod_name(APP, i)}, f"pod {i} holds another pod's HOME: {homes}"
        assert own[i].read_text() == f"pod {i}\n"
        assert not sim.pods[i].path(f"{WORKSPACE}/{contract.WORKSPACE_RECORDS_DIR}").exists(), f"pod {i} got pod 0's records"
    assert not sim.pods[0].path(f"{WORKSPACE}/relay-only.txt").exists()
    sim.pods[1].path(f"{WORKSPACE}/relay-only.txt").unlink()
    checked(sim, res)


def test_a_relay_whose_sshd_dies_mid_round_costs_a_retry_and_the_run_starts(sim: PodSim, slow_link: Any) -> None:
    change(sim, size=2 * BLOB)
    clear_ran(sim)
    slow_link(2)
    proc = sim.popen(0, f"exec {LAUNCHER} run --timeout 30 -- python3 prog.py", cwd=WORKSPACE, env=FANOUT)
    seen: list[str] = []
    try:
        wait_for_relay(sim, 1, 2, proc)
        for pid in sim.pod_pids(1):  # pod 1's sshd and every session it serves
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        line = read_until(proc, r"ml-dev-env-2\) from rank 1 .* failed", seen)
        assert "retried" in line
        # pod 1's sshd comes back (startup.sh supervises it) before pod 2's retry may finish: the run needs pod 1
        deadline = time.monotonic() + 60
        while sim.exec(0, "ssh -o BatchMode=yes -o ConnectTimeout=5 ml-dev-env-1 true").returncode != 0:
            assert time.monotonic() < deadline, sim.sshd_log(1)
            time.sleep(0.3)
        slow_link.fast(2)
        res = finish(proc, seen)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    checked(sim, res)
    retried = [h for h in last_sync(sim)["hops"] if h["dst"] == 2]
    assert retried[0]["src"] == 1 and retried[0]["source_failed"] and retried[-1]["src"] != 1
    assert ran_everywhere(sim)


def test_a_relay_whose_veth_goes_down_mid_round_costs_a_retry_and_the_run_starts(sim: PodSim, slow_link: Any) -> None:
    change(sim, size=2 * BLOB)
    clear_ran(sim)
    slow_link(2)
    proc = sim.popen(0, f"exec {LAUNCHER} run --timeout 30 -- python3 prog.py", cwd=WORKSPACE, env=FANOUT)
    seen: list[str] = []
    try:
        wait_for_relay(sim, 1, 2, proc)
        link(sim, 1, "down")
        line = read_until(proc, r"ml-dev-env-2\) from rank 1 .* failed", seen)
        assert "sent no word for 3 s" in line and "retried" in line
        link(sim, 1, "up")
        slow_link.fast(2)
        res = finish(proc, seen)
    finally:
        link(sim, 1, "up")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    checked(sim, res)
    assert ran_everywhere(sim)


def test_a_pod_unreachable_for_good_fails_the_launch_naming_it(sim: PodSim, slow_link: Any) -> None:
    change(sim, size=2 * BLOB)
    clear_ran(sim)
    slow_link(2)
    proc = sim.popen(0, f"exec {LAUNCHER} run --timeout 30 -- python3 prog.py", cwd=WORKSPACE, env=FANOUT)
    seen: list[str] = []
    try:
        wait_for_relay(sim, 1, 2, proc)  # round 2: pod 4's copy comes in round 3
        wait_for_agent(sim, 4, proc)  # pod 4 answered the check: its rank agent waits at its gate (on a loaded machine
        link(sim, 4, "down")  # the relay can start before the last pod's session is up)
        slow_link.fast(2)
        res = finish(proc, seen, timeout=240)
    finally:
        link(sim, 4, "up")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert res.returncode != 0, res.stdout
    assert re.search(r"rank 4 \(ml-dev-env-4\): sync failed: .*\(tried 3 times, from ranks \d+, \d+, \d+\)", res.stdout), res.stdout
    assert re.findall(r"rank (\d+) \(ml-dev-env-\d+\): sync failed", res.stdout) == ["4"], res.stdout  # the others got it
    sources = re.search(r"tried 3 times, from ranks ([\d, ]+)\)", res.stdout)
    assert sources and len(set(sources.group(1).split(", "))) == 3, res.stdout  # each try from another holder
    assert "oc exec" in res.stdout and "sshd.log" in res.stdout  # where to look, as for any unreachable pod
    assert not any(sim.pods[i].path(f"{STATE}/ran").exists() for i in range(PODS))  # no rank started


def test_a_pod_where_the_tree_cannot_land_is_named_at_once(sim: PodSim) -> None:
    """The check makes the tree's directory; where it cannot, the pod's own words come back (no wait for the
    reachability timeout: the pod answered)."""
    sim.write(0, f"{WORKSPACE}/elsewhere/prog.py", PROGRAM)
    assert sim.exec(0, "git init -q .", cwd=f"{WORKSPACE}/elsewhere").returncode == 0
    sim.write(2, f"{WORKSPACE}/elsewhere", "a file where pod 0's tree goes\n")
    try:
        res = sim.exec(0, f"{LAUNCHER} sync --timeout 600", cwd=f"{WORKSPACE}/elsewhere", timeout=120)
    finally:
        sim.pods[2].path(f"{WORKSPACE}/elsewhere").unlink()
        shutil.rmtree(sim.pods[0].path(f"{WORKSPACE}/elsewhere"))  # a tree of its own: not the workspace's
    assert res.returncode != 0
    assert f"pod ml-dev-env-2 ({sim.fqdn(2)}): ml-dev: cannot make {WORKSPACE}/elsewhere here" in res.stderr, res.stderr
    assert "not reachable" not in res.stderr


def ssh_commands(c: PodSim) -> dict[int, list[str]]:
    """Every SSH command each pod's clients ran so far (argv joined; leakscan.SSH_ARGV_PROGRAM records them)."""
    out = {}
    for pod in c.pods:
        log = pod.path(SSH_ARGV_LOG)
        out[pod.index] = [ln.replace("\037", " ") for ln in log.read_text().splitlines()] if log.is_file() else []
    return out


def new_commands(before: dict[int, list[str]], after: dict[int, list[str]]) -> dict[int, list[str]]:
    return {i: after[i][len(before[i]) :] for i in after}


def test_run_checks_an_unchanged_tree_with_the_rank_start_itself_under_the_leak_scan(sim: PodSim) -> None:
    """An unchanged tree: one SSH command per other pod (its rank agent, which answers the hash at its gate), no
    `_check`, rsync or `_apply`; one changed file (a direct push): no SSH command more, the agent writes the change
    (sync.apply_patch); a first copy through relays: no relay runs `_apply` (the receiver's agent does). No launch
    leaks the Secret."""
    with LeakScan(sim, [VALUE]) as scan:
        change(sim, size=2 * BLOB)  # through relays
        clear_ran(sim)
        before = ssh_commands(sim)
        res = sim.exec(0, f"{LAUNCHER} run -- python3 prog.py", cwd=WORKSPACE, env=FANOUT, timeout=180)
        scan.text("fan-out run output", res.stdout + res.stderr)
        checked(sim, res)
        assert last_sync(sim)["fan_out"] and ran_everywhere(sim)
        relays = {h["src"] for h in last_sync(sim)["hops"]} - {0}
        assert relays, last_sync(sim)
        after_fan = new_commands(before, ssh_commands(sim))
        for i in relays:
            assert any("--server" in cmd for cmd in after_fan[i]), f"pod {i} relayed with rsync"
        assert not [cmd for i in range(PODS) for cmd in after_fan[i] if " _apply " in cmd], "a relay ran _apply"

        clear_ran(sim)
        before = ssh_commands(sim)
        res = sim.exec(0, f"{LAUNCHER} run -- python3 prog.py", cwd=WORKSPACE, env=FANOUT, timeout=180)
        scan.text("unchanged run output", res.stdout + res.stderr)
        checked(sim, res)
        assert ran_everywhere(sim) and "0 copied" in res.stdout, res.stdout
        ran = new_commands(before, ssh_commands(sim))
        assert len(ran[0]) == PODS - 1 and all(" _rank " in cmd for cmd in ran[0]), ran[0]
        assert sorted(int(re.search(r"ml-dev-env-(\d+)\.", cmd).group(1)) for cmd in ran[0]) == list(range(1, PODS))  # type: ignore[union-attr]
        assert not any(ran[i] for i in range(1, PODS)), ran

        clear_ran(sim)
        change(sim, "data/blob-1.bin")
        before = ssh_commands(sim)
        res = sim.exec(0, f"{LAUNCHER} run -- python3 prog.py", cwd=WORKSPACE, timeout=180)  # default threshold: a direct push
        scan.text("one-file run output", res.stdout + res.stderr)
        checked(sim, res)
        assert ran_everywhere(sim) and f"{PODS - 1} copied, direct push, {PODS - 1} through the gate, 0 by rsync" in res.stdout, res.stdout
        ran = new_commands(before, ssh_commands(sim))
        assert len(ran[0]) == PODS - 1 and all(" _rank " in cmd for cmd in ran[0]), ran[0]  # the change rides the rank start
        assert not any(ran[i] for i in range(1, PODS)), ran
    scan.pods_state()
    assert scan.hits == [], scan.hits
    assert scan.samples > 0


# ------------------------------------------------------------------ ml-dev run: a small change through the gate


def synced_everywhere(c: PodSim) -> None:
    """Every pod holds the tree pod 0 sent last (what the gate's patch starts from): `ml-dev sync` copies where not."""
    res = c.exec(0, f"{LAUNCHER} sync", cwd=WORKSPACE, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr


def run_seeing(c: PodSim, rel: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ml-dev run` (default thresholds: a direct push) of prog.py, each rank then recording the sha256 of `rel` as it
    sees it ($STATE/seen on its pod)."""
    clear_ran(c)
    for pod in c.pods:
        pod.path(f"{STATE}/seen").unlink(missing_ok=True)
    command = shlex.quote(f"python3 prog.py && python3 seen.py {rel}")
    return c.exec(0, f"{LAUNCHER} run -- bash -c {command}", cwd=WORKSPACE, env=env, timeout=180)


def ways(c: PodSim) -> dict[int, str]:
    """How each pod of the last sync got the tree (its hop's `via`)."""
    return {h["dst"]: h["via"] for h in last_sync(c)["hops"]}


def test_one_changed_file_reaches_every_rank_through_its_gate_with_mode_and_mtime(sim: PodSim) -> None:
    synced_everywhere(sim)
    change(sim, "data/blob-2.bin")
    target = sim.pods[0].path(f"{WORKSPACE}/data/blob-2.bin")
    os.chmod(target, 0o750)
    os.utime(target, ns=(MTIME_NS, MTIME_NS))
    res = run_seeing(sim, "data/blob-2.bin")
    checked(sim, res)
    assert ran_everywhere(sim)
    record = last_sync(sim)
    assert not record["fan_out"] and ways(sim) == dict.fromkeys(range(1, PODS), "gate"), record
    assert all(h["hash"] == record["tree"] for h in record["hops"])
    assert f"{PODS - 1} through the gate, 0 by rsync" in res.stdout, res.stdout
    want = hashlib.sha256(target.read_bytes()).hexdigest()
    for i in range(1, PODS):
        got = os.stat(sim.pods[i].path(f"{WORKSPACE}/data/blob-2.bin"))
        assert (got.st_mode & 0o777, got.st_mtime_ns) == (0o750, MTIME_NS), f"pod {i}"  # rsync's quick check agrees
        assert sim.pods[i].path(f"{STATE}/seen").read_text() == want, f"the rank on pod {i} ran on another blob-2.bin"


def test_a_deletion_and_a_change_in_one_run_go_through_the_gate(sim: PodSim) -> None:
    sim.write(0, f"{WORKSPACE}/deleted-next.txt", "on every pod, then deleted on pod 0\n")
    synced_everywhere(sim)
    assert all(sim.pods[i].path(f"{WORKSPACE}/deleted-next.txt").exists() for i in range(PODS))
    sim.pods[0].path(f"{WORKSPACE}/deleted-next.txt").unlink()
    change(sim, "data/blob-3.bin")
    res = run_seeing(sim, "data/blob-3.bin")
    checked(sim, res)
    assert ways(sim) == dict.fromkeys(range(1, PODS), "gate"), last_sync(sim)
    want = hashlib.sha256(sim.pods[0].path(f"{WORKSPACE}/data/blob-3.bin").read_bytes()).hexdigest()
    for i in range(1, PODS):
        assert not sim.pods[i].path(f"{WORKSPACE}/deleted-next.txt").exists(), f"pod {i}"
        assert sim.pods[i].path(f"{STATE}/seen").read_text() == want, f"pod {i}"


def test_a_pod_whose_tree_was_edited_there_gets_an_rsync_hop(sim: PodSim) -> None:
    """Pod 3's copy of a synced file was edited on pod 3: its hash is not the one pod 0 sent last, so what it lacks is
    unknown to pod 0: rsync (the other pods: the gate). Afterwards pod 3 holds pod 0's file again."""
    synced_everywhere(sim)
    sim.write(3, f"{WORKSPACE}/data/blob-1.bin", "").write_bytes(os.urandom(BLOB))
    change(sim, "data/blob-0.bin")
    res = run_seeing(sim, "data/blob-1.bin")
    checked(sim, res)
    assert ways(sim) == {**dict.fromkeys(range(1, PODS), "gate"), 3: "rsync"}, last_sync(sim)
    want = hashlib.sha256(sim.pods[0].path(f"{WORKSPACE}/data/blob-1.bin").read_bytes()).hexdigest()
    assert sim.pods[3].path(f"{STATE}/seen").read_text() == want
    assert "4 through the gate, 1 by rsync" in res.stdout, res.stdout


def test_a_change_above_patch_bytes_and_ml_dev_sync_copy_by_rsync(sim: PodSim) -> None:
    synced_everywhere(sim)
    change(sim, "data/blob-0.bin")
    res = run_seeing(sim, "data/blob-0.bin", env={contract.FANOUT_ENV: json.dumps({"patchBytes": BLOB - 1})})
    checked(sim, res)
    assert ran_everywhere(sim) and ways(sim) == dict.fromkeys(range(1, PODS), "rsync"), last_sync(sim)
    assert f"0 through the gate, {PODS - 1} by rsync" in res.stdout, res.stdout
    change(sim, "data/blob-1.bin")  # `ml-dev sync`: no rank agent waits, so no gate
    res = sim.exec(0, f"{LAUNCHER} sync", cwd=WORKSPACE, timeout=180)
    checked(sim, res)
    assert ways(sim) == dict.fromkeys(range(1, PODS), "rsync"), last_sync(sim)
