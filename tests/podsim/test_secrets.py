"""env.secrets on 4 simulated pods of the nerc-production render (restricted-v2: an arbitrary UID, fsGroup): one Secret
that exists in the namespace (not rendered: the user made it), a random 32-character value set once.

* Every rank has it, equal, for `ml-dev run -- torchrun ...` (a stand-in that starts its workers as children in
  sessions of their own, as torchrun does), `ml-dev exec -- ...` and the documented DeepSpeed launch (0.17.5's pdsh
  command shape, a stub `deepspeed.launcher.launch` starting its worker as a child); the workers record a SHA-256 of
  what they got (never the value) in their own pod's /tmp.
* It is found 0 times (tests/podsim/leakscan.py, the shared scan): the render's objects and outputs and `make render`'s
  files, the home page's HTML and fragment, `ml-dev status`, the runs' output, every file under each pod's logs/, the
  /proc/*/cmdline of every process of every pod sampled every 50 ms through each launch, and the command of every SSH
  connection the pods open (their `ssh` records its argv).
* The same scan fails when the value is passed the old way: `ml-dev run --env` (argv) and `.deepspeed_env` (DeepSpeed
  turns it into `export K=V;` at the head of the pdsh command and logs the command).
* A listed key missing on a pod stops the launch before any rank starts, naming secret, key and pod; a rotated Secret
  reaches the next run without a pod restart (the kubelet's atomic writer, podsim's layout).
"""

from __future__ import annotations

import hashlib
import json
import secrets as pysecrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.servers import DEV_SERVERS
from inpod import contract
from tests.podsim.leakscan import SSH_ARGV_PROGRAM, LeakScan
from tests.podsim.pods import PREFIX, PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(900)]

SECRET, KEY = "wandb", "WANDB_API_KEY"
PROJECT = "/workspace/proj"
OUT = "/tmp/podsim-secrets"
STATE = contract.STATE_DIR
ML_DEV = "python3 /opt/ml-dev-env/ml-dev"
HOME_PORT = next(s.port for s in DEV_SERVERS if s.name == "home")
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"

WORKER = f"""
import hashlib, json, os, sys, time
tag = sys.argv[1]
value = os.environ.get({KEY!r})
rec = {{"sha": None if value is None else hashlib.sha256(value.encode()).hexdigest(), "node": os.environ.get("NODE_RANK"),
       "local": os.environ.get("LOCAL_RANK"), "ppid": os.getppid(), "host": os.uname().nodename}}
os.makedirs({OUT!r}, exist_ok=True)
with open(os.path.join({OUT!r}, "%s-%s-%s.json" % (tag, rec["node"], rec["local"])), "w") as f:
    json.dump(rec, f)
time.sleep(0.3)  # alive through several samples of the scan
print("worker", tag, rec["node"], rec["local"], "done", flush=True)
"""
TORCHRUN = """
# torchrun's shape: one worker per --nproc-per-node, each a child in a session of its own
# (torch/distributed/elastic/multiprocessing/api.py start_processes, start_new_session), LOCAL_RANK/RANK set
import os, subprocess, sys
args = sys.argv[1:]
n = int(args[args.index("--nproc-per-node") + 1])
script = args[args.index("--nproc-per-node") + 2 :]
node = int(os.environ.get("NODE_RANK", "0"))
procs = [subprocess.Popen([sys.executable, *script], env={**os.environ, "LOCAL_RANK": str(i), "RANK": str(node * n + i)},
                          start_new_session=True) for i in range(n)]
sys.exit(max(p.wait() for p in procs))
"""
DS_LAUNCH = """
# deepspeed.launcher.launch stub: its worker as a child (launch.py main: subprocess.Popen per local rank)
import argparse, os, subprocess, sys
p = argparse.ArgumentParser()
p.add_argument("--world_info"); p.add_argument("--node_rank", type=int); p.add_argument("--master_addr"); p.add_argument("--master_port")
a, rest = p.parse_known_args()
child = subprocess.Popen([sys.executable, "-u", *rest], env={**os.environ, "LOCAL_RANK": "0", "RANK": str(a.node_rank)})
sys.exit(child.wait())
"""
# deepspeed 0.17.5's runner on the pdsh path (deepspeed/launcher/runner.py main; multinode_runner.py
# PDSHRunner.get_cmd): `.deepspeed_env` (cwd, then ~) becomes `export K=V; ` at the head of the remote command, the
# whole command is logged (`cmd = ...`), pdsh runs it with PDSH_RCMD_TYPE=ssh on every host of the hostfile
DS_RUNNER = """
import os, shlex, subprocess, sys
env_file = next((p for p in (".deepspeed_env", os.path.expanduser("~/.deepspeed_env")) if os.path.isfile(p)), None)
exports = ""
if env_file:
    for line in open(env_file):
        if "=" in line:
            k, v = line.rstrip("\\n").split("=", 1)
            exports += "export {}={}; ".format(k, shlex.quote(v))
hosts = ",".join(line.split()[0] for line in open(os.environ["DEEPSPEED_HOSTFILE"]) if line.strip())
cmd = ["pdsh", "-S", "-f", "1024", "-w", hosts, exports + "cd {};".format(os.path.abspath(".")), "python3", "-u", "-m",
       "deepspeed.launcher.launch", "--world_info=e30=", "--node_rank=%n", "--master_addr=" + os.environ["MASTER_ADDR"],
       "--master_port=29500", *sys.argv[1:]]
print("cmd = {}".format(" ".join(cmd)), flush=True)
sys.exit(subprocess.call(cmd, env={**os.environ, "PDSH_RCMD_TYPE": "ssh", "PYTHONPATH": os.path.abspath(".")}))
"""
DEEPSPEED = (  # docs/use: `ml-dev sync && deepspeed --hostfile $DEEPSPEED_HOSTFILE train.py` (runner.py checks the first host)
    f'cd {PROJECT} && . {STATE}/rank.env && ssh -o BatchMode=yes "${{ML_DEV_HOSTS%% *}}" hostname >/dev/null && '
    "python3 ds_runner.py worker.py deepspeed"
)

MPIRUN = (  # Open MPI 4.1 (inpod/fabric/allreduce.py's flags): one rank a pod, the remote daemons started over ssh
    f'. {STATE}/rank.env && ssh -o BatchMode=yes "${{ML_DEV_HOSTS%% *}}" '
    f"\"cd {PROJECT} && mpirun --allow-run-as-root --host \\$(echo \\$ML_DEV_HOSTS | tr ' ' ,) -np 4 -npernode 1 "
    "--bind-to none --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
    'python3 worker.py mpi"'
)

DIGEST = f"import hashlib, os\nprint(hashlib.sha256(os.environ[{KEY!r}].encode()).hexdigest())\n"


def with_secret(objects: dict[str, Any]) -> None:
    objects["nodes"] = {**objects["nodes"], "count": 4, "gpusPerPod": 2}
    objects["env"] = {"secrets": [{"secret": SECRET, "keys": [KEY]}]}


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture(scope="module")
def value() -> str:
    return pysecrets.token_urlsafe(24)[:32]


@pytest.fixture(scope="module")
def result() -> Any:
    return render_stack("nerc-production", with_secret)


@pytest.fixture(scope="module")
def sim(result: Any, value: str) -> Iterator[PodSim]:
    before = set(leftovers())
    s = PodSim(result, namespace_secrets={SECRET: {KEY: value}}, image_programs=SSH_ARGV_PROGRAM)
    try:
        s.start()
        for name, text in (("worker.py", WORKER), ("torchrun.py", TORCHRUN), ("ds_runner.py", DS_RUNNER)):
            s.write(0, f"{PROJECT}/{name}", text)
        s.write(0, f"{PROJECT}/deepspeed/__init__.py", "")
        s.write(0, f"{PROJECT}/deepspeed/launcher/__init__.py", "")
        s.write(0, f"{PROJECT}/deepspeed/launcher/launch.py", DS_LAUNCH)
        yield s
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


def records(sim: PodSim, tag: str) -> dict[tuple[int, str | None], dict[str, Any]]:
    """{(pod, LOCAL_RANK): record} of the workers of one launch, from every pod's /tmp."""
    out = {}
    for pod in sim.pods:
        for f in sorted(pod.path(OUT).glob(f"{tag}-*.json")):
            rec = json.loads(f.read_text())
            out[(pod.index, rec["local"])] = rec
    return out


def clear(sim: PodSim) -> None:
    for pod in sim.pods:
        for f in pod.path(OUT).glob("*.json"):
            f.unlink()


def launch(sim: PodSim, cmd: str, scan: LeakScan | None = None, timeout: float = 180) -> str:
    res = sim.exec(0, cmd, cwd=PROJECT, timeout=timeout)
    output = res.stdout + res.stderr
    if scan is not None:
        scan.text(f"output of {cmd.split(' --', 1)[0]}", output)
    assert res.returncode == 0, output
    return output


def test_the_mount_is_the_kubelets_read_only_and_not_world_readable(sim: PodSim) -> None:
    """restricted-v2: root-owned, group fsGroup, 0440 (defaultMode | roMask), behind `..data`; the pod's UID reads
    it through its supplementary fsGroup; nothing but the listed key is there."""
    assert sim.identity.uid != 0 and sim.identity.fs_group is not None
    for pod in sim.pods:
        mount = pod.path(f"{contract.SECRETS_MOUNT}/{SECRET}")
        assert sorted(p.name for p in mount.iterdir() if not p.name.startswith("..")) == [KEY]
        assert (mount / KEY).is_symlink() and str((mount / KEY).readlink()) == f"..data/{KEY}"
        st = (mount / KEY).stat()
        assert stat.S_IMODE(st.st_mode) == 0o440 and st.st_uid == 0 and st.st_gid == sim.identity.fs_group
    check = sim.exec(1, f"id -G; test -r {contract.SECRETS_MOUNT}/{SECRET}/{KEY} && echo readable; env | grep -c {KEY} || true")
    assert str(sim.identity.fs_group) in check.stdout.split("\n")[0].split() and "readable" in check.stdout, check.stdout + check.stderr
    assert check.stdout.strip().endswith("0"), "never in the container env (`oc exec` shells, PID 1, session.env)"
    assert KEY not in sim.pods[1].path(f"{STATE}/ssh/session.env").read_text()


def test_every_rank_has_it_and_it_is_found_nowhere_else(sim: PodSim, result: Any, value: str, tmp_path: Path) -> None:
    from tools import render as render_tool

    clear(sim)
    with LeakScan(sim, [value]) as scan:
        launch(sim, f"{ML_DEV} run --no-sync -- python3 torchrun.py --nproc-per-node 2 worker.py torchrun", scan)
        launch(sim, f"{ML_DEV} exec -- python3 {PROJECT}/worker.py exec", scan)
        launch(sim, DEEPSPEED, scan)
        launch(sim, MPIRUN, scan)  # from an SSH session on pod 0 (`ssh <pod> cmd`): mpirun's daemons over the fabric
        status = sim.exec(0, f"{ML_DEV} status", timeout=120)
        scan.text("ml-dev status", status.stdout + status.stderr)
        page = fragment = ""
        deadline = time.monotonic() + 90
        # every pod's agent has reported (under load one may answer a refresh later than another)
        while fragment.count(f'{SECRET}/{KEY} <span class="ok">present</span>') < 4 and time.monotonic() < deadline:
            page = sim.exec(0, ["python3", "-c", FETCH, f"http://127.0.0.1:{HOME_PORT}/"], timeout=30).stdout
            fragment = sim.exec(0, ["python3", "-c", FETCH, f"http://127.0.0.1:{HOME_PORT}/fragment"], timeout=30).stdout
            time.sleep(1)
        scan.text("home page", page)
        scan.text("home page fragment", fragment)
    files = scan.pods_state()
    render_tool.write(result, tmp_path / "rendered")  # what `make render` writes
    scan.render(result, tmp_path / "rendered")
    # every rank, equal
    want = sha(value)
    torchrun, execd, deepspeed = records(sim, "torchrun"), records(sim, "exec"), records(sim, "deepspeed")
    mpi = records(sim, "mpi")
    assert sorted(mpi) == [(i, None) for i in range(4)] and all(r["sha"] == want for r in mpi.values()), mpi
    assert sorted(torchrun) == [(i, str(local)) for i in range(4) for local in (0, 1)], torchrun
    assert sorted(execd) == [(i, None) for i in range(4)] and sorted(deepspeed) == [(i, "0") for i in range(4)], (execd, deepspeed)
    for tag, recs in (("torchrun", torchrun), ("exec", execd), ("deepspeed", deepspeed)):
        assert [k for k, r in recs.items() if r["sha"] != want] == [], f"{tag}: ranks without the value (or another one)"
    # names, never values, in status and on the page
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count(f"secrets: {SECRET} ({KEY})") == 4, status.stdout
    assert 'id="secrets"' in fragment and fragment.count(f'{SECRET}/{KEY} <span class="ok">present</span>') == 4, fragment
    # found nowhere, and the scan looked: samples through the launches, the pods' processes, files, SSH commands
    assert scan.hits == [], "\n".join(scan.hits)
    assert scan.samples >= 20 and len(scan.processes_seen) > 40 and files > 4, (scan.samples, len(scan.processes_seen), files)
    commands = scan.ssh_commands()
    print(f"leak scan: {scan.samples} samples, {len(scan.processes_seen)} processes, {files} files, {len(commands)} SSH commands")
    assert any("deepspeed.launcher.launch" in c for c in commands) and any("_rank" in c for c in commands), commands[:5]


def test_the_scan_fails_when_the_value_is_passed_the_old_way(sim: PodSim, value: str) -> None:
    listed = sim.exec(0, f"{ML_DEV} run --no-sync --env {KEY}=x -- true", cwd=PROJECT, timeout=60)
    assert listed.returncode != 0 and f"{KEY} comes from a Secret of env.secrets" in listed.stderr, listed.stderr
    clear(sim)
    with LeakScan(sim, [value]) as scan:  # --env: the value in ml-dev's argv, readable by every process of the pod
        launch(sim, f"{ML_DEV} run --no-sync --env OLD_WAY_KEY={value} -- python3 worker.py old-env", scan)
    assert any("/proc/" in h and "cmdline" in h for h in scan.hits), scan.hits
    sim.write(0, f"{PROJECT}/.deepspeed_env", f"OLD_WAY_KEY={value}\n")
    try:
        with LeakScan(sim, [value]) as scan:  # .deepspeed_env: in the logged command, pdsh's and ssh's argv, bash -c
            launch(sim, DEEPSPEED, scan)
        scan.pods_state()
    finally:
        sim.pods[0].path(f"{PROJECT}/.deepspeed_env").unlink()
    assert any(h.startswith("output of") for h in scan.hits), scan.hits
    assert any(h.startswith("SSH command from") for h in scan.hits), scan.hits
    assert any("/proc/" in h for h in scan.hits), scan.hits
    assert all(value not in h for h in scan.hits), "the scan's own lines never hold the value"


def test_a_rotated_secret_reaches_the_next_run_without_a_restart(sim: PodSim, value: str) -> None:
    pids = [pod.pid for pod in sim.pods]
    rotated = pysecrets.token_urlsafe(24)[:32]
    try:
        sim.swap_configmap(SECRET, {KEY: rotated + "\n"})  # `--from-file` of a file ending in a newline: it goes
        clear(sim)
        launch(sim, f"{ML_DEV} run --no-sync -- python3 torchrun.py --nproc-per-node 2 worker.py rotated")
        launch(sim, DEEPSPEED)
        for tag in ("rotated", "deepspeed"):
            recs = records(sim, tag)
            assert len(recs) in (8, 4) and all(r["sha"] == sha(rotated) for r in recs.values()), (tag, recs)
        assert [pod.pid for pod in sim.pods] == pids, "no pod restarted"
    finally:
        sim.swap_configmap(SECRET, {KEY: value})


def test_a_missing_key_stops_the_launch_before_a_rank_starts(sim: PodSim, value: str) -> None:
    try:
        sim.swap_configmap(SECRET, {"OTHER": "x" * 12})  # the Secret lost the key (optional items: the file goes)
        clear(sim)
        for cmd in (
            f"{ML_DEV} run --no-sync -- python3 worker.py missing",
            f"{ML_DEV} run -- python3 worker.py missing",  # the rank agents' gate answers which keys each pod holds
            f"{ML_DEV} exec -- python3 {PROJECT}/worker.py missing",
        ):
            res = sim.exec(0, cmd, cwd=PROJECT, timeout=120)
            assert res.returncode != 0, res.stdout
            for pod in sim.pods:
                assert f"Secret {SECRET} key {KEY} is missing on pod {pod.name}" in res.stderr, res.stderr
            assert records(sim, "missing") == {}, "no rank started"
        status = sim.exec(0, f"{ML_DEV} status", timeout=120)
        assert status.stdout.count(f"secrets: {SECRET} ({KEY} MISSING)") == 4, status.stdout
        sim.delete_secret(SECRET)  # gone from the namespace: the optional volume empties, the pods keep running
        res = sim.exec(0, f"{ML_DEV} exec -- true", cwd=PROJECT, timeout=120)
        assert res.returncode != 0 and f"Secret {SECRET} key {KEY} is missing on pod {sim.pods[3].name}" in res.stderr
    finally:
        sim.secrets[SECRET] = {KEY: value}
        sim.swap_configmap(SECRET, {KEY: value})
    assert sim.exec(0, f"{ML_DEV} exec -- true", cwd=PROJECT, timeout=120).returncode == 0


UNUSABLE: list[tuple[str, str | bytes, str]] = [
    ("140,000 bytes", "x" * 140_000, "is 140000 bytes"),  # over MAX_ARG_STRLEN: execve fails, E2BIG (exit 126 before)
    ("a NUL byte", "ab\0cd", "holds a NUL byte"),
    ("not UTF-8", b"\xff\xfe-latin-1-\xe9", "is not UTF-8 text"),
]


@pytest.mark.parametrize(("what", "bad", "why"), UNUSABLE, ids=[u[0] for u in UNUSABLE])
def test_a_value_that_cannot_travel_is_refused_in_one_line_and_ssh_keeps_working(
    sim: PodSim, value: str, what: str, bad: str | bytes, why: str
) -> None:
    """At the launch (`ml-dev run`, its gate; `ml-dev exec`) and in the SSH session hook the same one line names
    Secret and key; `ssh <pod> echo` still works (the key is not set there), nothing else breaks."""
    from inpod.lib import usersecrets

    line = usersecrets.refusal_line(SECRET, KEY, why)
    assert str(contract.SECRET_VALUE_MAX) in line
    try:
        sim.swap_configmap(SECRET, {KEY: bad})  # type: ignore[dict-item]  # bytes: the Secret's data as it is
        clear(sim)
        hello = sim.exec(
            0, f'. {STATE}/rank.env && set -- $ML_DEV_HOSTS && ssh -o BatchMode=yes "$2" "echo hello; env | grep -c ^{KEY}= || true"'
        )
        assert hello.returncode == 0 and hello.stdout.split() == ["hello", "0"], hello.stdout + hello.stderr
        assert hello.stderr.count(line) == 1, hello.stderr
        for cmd in (f"{ML_DEV} run --no-sync -- python3 worker.py refused", f"{ML_DEV} exec -- python3 {PROJECT}/worker.py refused"):
            res = sim.exec(0, cmd, cwd=PROJECT, timeout=120)
            assert res.returncode != 0 and line in res.stderr, res.stdout + res.stderr
            assert "Argument list too long" not in res.stderr and "Traceback" not in res.stderr, res.stderr
            assert records(sim, "refused") == {}, "no rank started"
    finally:
        sim.swap_configmap(SECRET, {KEY: value})
    assert sim.exec(0, f"{ML_DEV} exec -- true", cwd=PROJECT, timeout=120).returncode == 0


@pytest.mark.parametrize("tty", [True, False], ids=["interactive login", "login without a terminal"])
def test_a_login_over_ssh_prints_the_refusal_once(sim: PodSim, value: str, tty: bool) -> None:
    """`ssh <pod>` with no command: ssh-session.sh reads the mount (user-secrets.sh), then `exec -l bash`, whose start-up
    files source env.sh (and with it user-secrets.sh) from /etc/profile.d, /etc/bash.bashrc, ~/.profile and
    ~/.bashrc: the refusal is printed by the first of them only. A shell started inside (`bash -i`, a subshell of the
    user's) is a new shell and says it again."""
    from inpod.lib import usersecrets

    line = usersecrets.refusal_line(SECRET, KEY, "holds a NUL byte")
    tt = "-tt" if tty else "-T"
    try:
        sim.swap_configmap(SECRET, {KEY: "ab\0cd"})
        res = sim.exec(
            0,
            f'. {STATE}/rank.env && set -- $ML_DEV_HOSTS && ssh {tt} -o BatchMode=yes "$2"',
            input="echo BYE-$((40 + 2)) $(env | grep -c ^ML_DEV_SECRETS_TOLD=)\nbash -ic true\nexit\n",
            timeout=120,
        )
        output = res.stdout + res.stderr
        assert res.returncode == 0 and "BYE-42 0" in output, output  # the marker is no variable of the login's children
        assert output.count(line) == 2, output  # the login once, `bash -ic` once
    finally:
        sim.swap_configmap(SECRET, {KEY: value})


def test_a_uid_0_pod_without_fs_group_reads_it_as_owner(value: str) -> None:
    """barcelona (RDMA, the stack's SCC: UID 0, no fsGroup): SetVolumeOwnership does nothing without an fsGroup
    (pkg/volume/volume_linux.go), so the files stay root:root 0440; root reads them as owner, an SSH session gets the
    key (ssh-session.sh) and `oc exec` shells do not (no container env)."""
    from tests.podsim.nodetools import Node

    def secret_two_pods(objects: dict[str, Any]) -> None:
        objects["nodes"] = {**objects["nodes"], "count": 2}
        objects["env"] = {"secrets": [{"secret": SECRET, "keys": [KEY]}]}

    before = set(leftovers())
    s = PodSim(render_stack("barcelona", secret_two_pods), node=Node(), namespace_secrets={SECRET: {KEY: value}})
    try:
        assert s.identity.uid == 0 and s.identity.fs_group is None
        s.start()
        f = s.pods[1].path(f"{contract.SECRETS_MOUNT}/{SECRET}/{KEY}")
        st = f.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o440, 0, 0)
        s.write(1, "/tmp/digest.py", DIGEST)
        res = s.exec(0, f"ssh -o BatchMode=yes {s.pods[1].name} python3 /tmp/digest.py; env | grep -c {KEY} || true")
        assert res.stdout.split() == [sha(value), "0"], res.stdout + res.stderr
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]
