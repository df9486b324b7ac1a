"""Why a rank could not start, in words: each class of `Cluster.explain` made to happen, its message asserted.

nerc-production (2 pods, from the render). `ml-dev run --timeout 0` from pod 0 tries each other pod once over the
fabric (inpod/ml_dev/common.py wait_reachable), so no retry races a repair. Each case causes what a user meets:

* name not resolved: the cluster ConfigMap says 3 pods and the third does not exist yet (a scale-up in progress;
  the headless Service has no record for it);
* connection refused: pod 1's sshd is gone (its supervisor held, sshd and its sessions killed): nothing listens;
* host key: pod 0's known_hosts holds another key for the stack's pods than the one they serve;
* authentication refused: pod 0 offers a key the stack's pods do not accept;
* closed during key exchange: what answers on pod 1's port closes the connection at once (an sshd that dies).

Before each case pod 0's shared SSH connections are closed (`ssh -O exit`): a live one would skip the handshake.

The stack lists a Secret of the namespace (`env.secrets`): each failing start and each repair runs under the shared
leak scan (tests/podsim/leakscan.py), and the module's last test finds the value in no argv, SSH command, output, file
of either pod's state dir (the sshd log every message points to included), container log, or environment but a rank's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from core import naming
from tests.podsim.leakscan import SSH_ARGV_PROGRAM, LeakScan, list_secret, new_value
from tests.podsim.pods import PREFIX, PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]

STATE = "/tmp/ml-dev-env"
D = f"{STATE}/ssh"
SECRET, SECRET_KEY = "start-canary", "START_CANARY_TOKEN"  # a Secret of the namespace, listed in env.secrets
VALUE = new_value()
OUTPUTS: list[tuple[str, str]] = []  # every start's output, for the leak scan
# accepts each connection and closes it before sending anything (sshd dying during the key exchange)
CLOSER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(8)
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[PodSim]:
    before = set(leftovers())
    s = PodSim(
        render_stack("nerc-production", lambda objects: list_secret(objects, SECRET, SECRET_KEY)),
        count=2,
        namespace_secrets={SECRET: {SECRET_KEY: VALUE}},
        image_programs=SSH_ARGV_PROGRAM,  # every ssh a pod runs records its command (the leak scan reads it)
    )
    try:
        s.start()
        yield s
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


@pytest.fixture(scope="module", autouse=True)
def scan(sim: PodSim) -> Iterator[LeakScan]:
    """The leak scan's sampler, through every test of the module (argv and environment of every pod process)."""
    with LeakScan(sim, [VALUE], interval=0.1, environ=True) as s:
        yield s


def hosts(sim: PodSim) -> list[str]:
    res = sim.exec(0, f". {STATE}/rank.env && echo $ML_DEV_HOSTS", timeout=30)
    return res.stdout.split()


def close_shared_connections(sim: PodSim) -> None:
    """`ssh -O exit` for every host's shared connection (the launcher's ControlPath): the next ssh shakes hands."""
    for host in hosts(sim):
        sim.exec(0, ["ssh", "-F", f"{D}/client.conf", "-o", f"ControlPath={D}/cm-%C", "-O", "exit", host], timeout=30)


def start(sim: PodSim) -> subprocess.CompletedProcess[str]:
    """A rank start from pod 0: one try per pod."""
    close_shared_connections(sim)
    res = sim.exec(0, "ml-dev run --no-sync --timeout 0 -- true", cwd="/tmp", timeout=60)
    OUTPUTS.append(("output of a rank start", res.stdout + res.stderr))
    return res


def assert_named(sim: PodSim, res: subprocess.CompletedProcess[str], ordinal: int, words: str, ssh_said: str) -> None:
    """Exit status 1; one line naming the pod, its DNS name, the class in words, what ssh said, the sshd log."""
    assert res.returncode == 1, f"{res.returncode}\n{res.stdout}\n{res.stderr}"
    pod, fqdn = naming.pod_name(sim.app, ordinal), naming.pod_dns(sim.app, sim.namespace, ordinal)
    log = f"oc exec -n {sim.namespace} {pod} -c ml-dev -- cat {STATE}/logs/sshd.log"
    head = f"ml-dev: pod {pod} ({fqdn}) is not reachable over SSH after 0 s: {words} ["
    pattern = re.escape(head) + r"(.*)\]; its sshd log: (.*)"
    found = re.search(pattern, res.stderr)
    assert found, f"expected {words!r} for {pod}:\n{res.stderr}"
    assert re.search(ssh_said, found.group(1)), f"ssh's last line {found.group(1)!r} does not match {ssh_said!r}"
    assert found.group(2) == log
    assert not re.search(rf"pod {re.escape(naming.pod_name(sim.app, 0))} ", res.stderr), "pod 0 runs its rank locally"


def wait_reachable(sim: PodSim, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while start(sim).returncode != 0:
        assert time.monotonic() < deadline, sim.sshd_log(1)
        time.sleep(0.5)


def test_every_pod_is_reachable_to_begin_with(sim: PodSim) -> None:
    res = start(sim)
    assert res.returncode == 0, res.stderr


# ----------------------------------------------------------------------------------------- name not resolved


def set_count(sim: PodSim, nnodes: int) -> None:
    name = next(n for n in sim.configmaps if n.endswith("-cluster"))
    values = dict(line.split("=", 1) for line in sim.configmaps[name]["cluster.env"].splitlines() if "=" in line)
    values["NNODES"] = str(nnodes)
    sim.swap_configmap(name, {"cluster.env": "".join(f"{k}={v}\n" for k, v in values.items())})
    deadline = time.monotonic() + 60  # every startup script re-reads it every ML_DEV_POLL_SECONDS (2)
    while len(hosts(sim)) != nnodes:
        assert time.monotonic() < deadline, sim.pods[0].log.read_text()
        time.sleep(0.5)


def test_a_pod_that_does_not_exist_yet_is_a_name_that_does_not_resolve(sim: PodSim) -> None:
    set_count(sim, 3)
    try:
        res = start(sim)
        assert_named(sim, res, 2, "the name does not resolve", r"Could not resolve hostname|Name or service not known")
        assert f"pod {naming.pod_name(sim.app, 1)} " not in res.stderr, "pod 1 answers"
    finally:
        set_count(sim, 2)
    wait_reachable(sim)


# ---------------------------------------------------------------------------------- pod 1's sshd taken away


def stat(pid: int) -> tuple[str, str, int]:
    """(comm, state, parent pid) of /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    comm, _, rest = text.partition(" (")[2].rpartition(") ")
    fields = rest.split()
    return comm, fields[0], int(fields[1])


def sshd_pids(sim: PodSim, index: int) -> list[int]:
    """Live sshd processes of pod `index` (a killed one whose parent is stopped stays a zombie until reaped)."""
    out = []
    for pid in sim.pod_pids(index):
        try:
            comm, state, _ = stat(pid)
        except OSError:
            continue
        if comm.startswith("sshd") and state != "Z":
            out.append(pid)
    return out


@contextmanager
def no_sshd(sim: PodSim, index: int) -> Iterator[None]:
    """Pod `index` without sshd: its supervisor (startup.sh's supervise_sshd subshell, sshd's parent) stopped, sshd
    and every session it served killed; afterwards the supervisor continues and restarts it."""
    pids = set(sshd_pids(sim, index))
    listener = next(p for p in pids if stat(p)[2] not in pids)
    supervisor = stat(listener)[2]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while sshd_pids(sim, index):
            assert time.monotonic() < deadline, "sshd did not end"
            time.sleep(0.05)
        yield
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_reachable(sim)


def test_no_sshd_listening_is_connection_refused(sim: PodSim) -> None:
    with no_sshd(sim, 1):
        assert_named(sim, start(sim), 1, "connection refused (no sshd listening on the pod)", r"Connection refused")


def test_a_listener_that_closes_at_once_is_closed_during_key_exchange(sim: PodSim) -> None:
    with no_sshd(sim, 1):
        proc = sim.popen(1, ["python3", "-c", CLOSER, sim.pods[1].ip, "2222"])
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
            res = start(sim)
            assert_named(sim, res, 1, "connection closed during key exchange (sshd died, see its log)", r"Connection closed|reset")
            assert "kex_exchange_identification" in res.stderr
        finally:
            sim.interrupt(proc, signal.SIGKILL)
            proc.kill()
            proc.wait(timeout=30)


# ------------------------------------------------------------------------------------ pod 0's client files


@contextmanager
def replaced(sim: PodSim, files: dict[str, Callable[[str], str]]) -> Iterator[None]:
    """Pod 0's files rewritten (as the pod's user, mode kept), restored afterwards."""
    saved = {}
    for path, change in files.items():
        text = sim.exec(0, ["cat", path], timeout=30).stdout
        saved[path] = text
        res = sim.exec(0, ["sh", "-c", 'cat > "$1"', "_", path], input=change(text), timeout=30)
        assert res.returncode == 0, res.stderr
    try:
        yield
    finally:
        for path, text in saved.items():
            sim.exec(0, ["sh", "-c", 'cat > "$1"', "_", path], input=text, timeout=30)
    wait_reachable(sim)


def test_another_host_key_than_known_hosts_holds_is_a_host_key_mismatch(sim: PodSim) -> None:
    served, other = sim.host_pub.split()[1], sim.stranger_pub.split()[1]
    with replaced(sim, {f"{D}/known_hosts": lambda text: text.replace(served, other)}):
        res = start(sim)
        assert_named(sim, res, 1, "the host key does not match the stack's known_hosts", r"Host key verification failed")


def test_a_key_the_pods_do_not_accept_is_authentication_refused(sim: PodSim) -> None:
    stranger = (sim.keys / "stranger").read_text()
    stranger_pub = (sim.keys / "stranger.pub").read_text()
    with replaced(sim, {f"{D}/id_ed25519": lambda _: stranger, f"{D}/id_ed25519.pub": lambda _: stranger_pub}):
        res = start(sim)
        assert_named(sim, res, 1, "authentication refused (the stack key is not accepted)", r"Permission denied")


# ------------------------------------------------------------------------------------ the leak scan, last


def test_the_secret_reached_every_rank_and_nothing_else(sim: PodSim, scan: LeakScan) -> None:
    """After every failed start and repair: a rank on each pod holds the value (sampled), nothing else has it. The
    same scan finds it when planted in an SSH connection's command (the recorded argv and the remote `bash -c`)."""
    res = sim.exec(0, "ml-dev run --no-sync --timeout 30 -- sleep 3", cwd="/tmp", timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    OUTPUTS.append(("output of a run", res.stdout + res.stderr))
    scan.stop()
    assert {pod for pod, cmdline in scan.holders if cmdline == "sleep 3"} == {p.name for p in sim.pods}, scan.holders
    for where, text in OUTPUTS:
        scan.text(where, text)
    files = scan.pods_state() + scan.pods_files() + scan.container_logs()
    scan.render(sim.result)
    assert scan.hits == [], "\n".join(scan.hits)
    assert scan.samples >= 10 and files > 10, (scan.samples, files)

    host = hosts(sim)[1]
    with LeakScan(sim, [VALUE], environ=True) as planted:
        res = sim.exec(0, ["ssh", "-o", "BatchMode=yes", host, f"sleep 1; true {VALUE}"], timeout=60)
    assert res.returncode == 0, res.stderr
    planted.pods_state()
    assert any(h.startswith("SSH command from ml-dev-env-0") for h in planted.hits), planted.hits
    assert any(h.startswith("/proc/") and "cmdline on ml-dev-env-1" in h for h in planted.hits), planted.hits
    assert all(VALUE not in h for h in planted.hits), "the scan's own lines never hold the value"
