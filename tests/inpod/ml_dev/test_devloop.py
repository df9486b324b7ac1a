"""The dev loop on 4 pods started from the render (tests/podsim): real sshd, ssh, rsync, pdsh; the rendered scripts.

A variant of nerc-production (restricted-v2: the namespace UID, no capabilities) with 4 pods of 2 GPUs and a
per-pod workspace; pod 3's image leaves /etc/passwd read-only (nss_wrapper). From pod 0 (`oc exec`) the `ml-dev`
launcher syncs, launches, streams and stops ranks; users' keys log in and strangers do not; DeepSpeed's pdsh
launch path reaches every pod; the laptop ssh_config parses and logs in through a stub `oc`.

The stack lists a Secret of the namespace (`env.secrets`, a random value): the shared leak scan
(tests/podsim/leakscan.py) samples every pod process's argv and environment through the whole module, and at its end
(test_the_secret_reached_every_rank_and_nothing_else) finds the value only in ranks' environments: no argv, no SSH
command, no output, no file of any pod's state dir, no container log, no process but a rank's or an SSH session's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from components import devloop
from core import naming
from core.servers import DEV_SERVERS
from tests.conftest import stack_objects
from tests.podsim.leakscan import SSH_ARGV_PROGRAM, LeakScan, list_secret, new_value
from tests.podsim.pods import PREFIX, PodSim, leftovers, missing_requirements
from tests.podsim.pods import render_stack as render

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]

APP = "ml-dev-env"
WORKSPACE = "/workspace"
STATE = "/tmp/ml-dev-env"
PROJECT = f"{WORKSPACE}/proj"
LAUNCHER = "python3 /opt/ml-dev-env/ml-dev"
NS = stack_objects("nerc-production")["cluster"]["namespace"]
SECRET, SECRET_KEY = "devloop-canary", "DEVLOOP_CANARY_TOKEN"  # a Secret of the namespace, listed in env.secrets
VALUE = new_value()
HOME_PORT = next(s.port for s in DEV_SERVERS if s.name == "home")
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
# The test program: what every rank saw (its rank environment, its pod, the tree it ran on; of the secret a digest).
PROGRAM = r"""
import hashlib, json, os, socket, stat, sys, time
root = os.path.dirname(os.path.abspath(__file__))
files = []
for d, dirs, names in os.walk(root):
    dirs[:] = [x for x in dirs if x not in ("out", ".git")]
    for n in names:
        p = os.path.join(d, n)
        rel = os.path.relpath(p, root)
        if rel == ".ml-dev-synced":
            continue
        files.append((rel, oct(os.lstat(p).st_mode & 0o111 != 0), hashlib.sha256(open(p, "rb").read()).hexdigest()))
tree = hashlib.sha256(repr(sorted(files)).encode()).hexdigest()
keys = ("NODE_RANK", "NNODES", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PET_NODE_RANK", "ML_DEV_POD", "DEEPSPEED_HOSTFILE")
record = {k: os.environ.get(k) for k in keys}
record.update(host=socket.gethostname(), tree=tree, files=sorted(files), cwd=os.getcwd(),
              version=open(os.path.join(root, "version.txt")).read().strip(), pid=os.getpid())
record["secret"] = hashlib.sha256(os.environ.get("@SECRET_KEY@", "").encode()).hexdigest()
os.makedirs(os.path.join(root, "out"), exist_ok=True)
path = os.path.join(root, "out", "rank-%s.json" % record["NODE_RANK"])
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)  # the test polls for it: never a half-written file
print("hello from rank", record["NODE_RANK"], "on", record["host"], flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "fail":
    if record["NODE_RANK"] == "2":
        time.sleep(1)
        sys.exit(3)
    time.sleep(300)
if mode == "sleep":
    time.sleep(300)
""".replace("@SECRET_KEY@", SECRET_KEY)


class Cluster(PodSim):
    """The pods, every `exec`'s output kept for the leak scan at the end of the module."""

    outputs: list[tuple[str, str]]

    def exec(
        self,
        index: int,
        cmd: str | Sequence[str],
        timeout: float = 120,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        res = super().exec(index, cmd, timeout, cwd, env, input)
        self.outputs.append((f"output of `{cmd if isinstance(cmd, str) else ' '.join(cmd)}`"[:120], res.stdout + res.stderr))
        return res


def four_pods_per_pod_workspace(objects: dict[str, Any]) -> None:
    objects["nodes"] = {**objects["nodes"], "count": 4, "gpusPerPod": 2}
    objects["storage"] = {"mode": "per-pod", "volumes": [{"name": "workspace", "mountPath": WORKSPACE, "size": "1Gi"}]}
    list_secret(objects, SECRET, SECRET_KEY)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    before = set(leftovers())
    c = Cluster(
        render("nerc-production", four_pods_per_pod_workspace),
        read_only_passwd=(3,),
        python_packages=("debugpy",),
        namespace_secrets={SECRET: {SECRET_KEY: VALUE}},
        image_programs=SSH_ARGV_PROGRAM,  # every ssh a pod runs records its command (the leak scan reads it)
    )
    c.outputs = []
    try:
        c.start()
        c.write(0, f"{PROJECT}/prog.py", PROGRAM)
        c.write(0, f"{PROJECT}/version.txt", "v0\n")
        c.write(0, f"{PROJECT}/pkg/__init__.py", "")
        c.write(0, f"{PROJECT}/run.sh", "#!/bin/sh\necho run\n", mode=0o755)
        c.write(0, f"{PROJECT}/.gitignore", "out/\n*.log\n")
        c.write(0, f"{PROJECT}/.ml-devignore", "scratch/\n")
        c.write(0, f"{PROJECT}/train.log", "ignored by git\n")
        c.write(0, f"{PROJECT}/scratch/notes.txt", "ignored by the launcher\n")
        git = c.exec(
            0,
            "git init -q . && git add prog.py version.txt .gitignore && git -c user.email=a@b -c user.name=u commit -qm init",
            cwd=PROJECT,
        )
        assert git.returncode == 0, git.stderr
        yield c
    finally:
        c.stop()
        # this simulation's own (other test runs on the machine have their own run ids)
        assert not [x for x in set(leftovers()) - before if f"{PREFIX}{c.run_id}-" in x]


@pytest.fixture(scope="module", autouse=True)
def scan(cluster: Cluster) -> Iterator[LeakScan]:
    """The leak scan's sampler, through every test of the module (argv and environment of every pod process)."""
    with LeakScan(cluster, [VALUE], interval=0.1, environ=True) as s:
        yield s


def records(c: PodSim) -> dict[int, dict[str, Any]]:
    """Each rank's record (JSON written by the training stand-in), by pod index."""
    out = {}
    for pod in c.pods:
        f = pod.path(f"{PROJECT}/out/rank-{pod.index}.json")
        if f.exists():
            out[pod.index] = json.loads(f.read_text())
    return out


def clear_records(c: PodSim) -> None:
    for pod in c.pods:
        shutil.rmtree(pod.path(f"{PROJECT}/out"), ignore_errors=True)


def launch(c: PodSim, args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return c.exec(0, f"{LAUNCHER} {args}", cwd=PROJECT, timeout=timeout)


def ssh_argv(c: PodSim, index: int, key: str, known: Path, *extra: str, user: str = "ml-dev") -> list[str]:
    """ssh from the pod network (the bridge namespace) to pod `index`'s IP with one of the test's keys."""
    argv = ["ssh", "-F", "none", "-p", str(devloop.SSH_PORT), "-i", str(c.keys / key), "-o", "IdentitiesOnly=yes"]
    argv += ["-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", *extra]
    return c.in_network([*argv, f"{user}@{c.pods[index].ip}"])


def test_run_starts_every_rank_with_its_rank_env_on_the_same_tree(cluster: Cluster) -> None:
    clear_records(cluster)
    res = launch(cluster, "run -- python3 prog.py")
    assert res.returncode == 0, res.stdout + res.stderr
    got = records(cluster)
    assert sorted(got) == [0, 1, 2, 3]
    for i, rec in got.items():
        assert rec["NODE_RANK"] == rec["PET_NODE_RANK"] == str(i)
        assert rec["host"] == rec["ML_DEV_POD"] == naming.pod_name(APP, i)
        assert rec["NNODES"] == "4" and rec["WORLD_SIZE"] == "8"
        assert rec["MASTER_ADDR"] == naming.pod_dns(APP, NS, 0) and rec["MASTER_PORT"] == str(naming.MASTER_PORT)
        assert rec["cwd"] == PROJECT
        # output streamed, prefixed by rank
        assert f"[{i}] hello from rank {i} on {naming.pod_name(APP, i)}" in res.stdout
    # the same files, modes and contents on every pod: pod 0's tree without its git-ignored and launcher-ignored paths
    ignored = {"train.log", "scratch/notes.txt"}
    expected = [f for f in got[0]["files"] if f[0] not in ignored]
    assert len(expected) == len(got[0]["files"]) - 2
    for i in (1, 2, 3):
        assert got[i]["files"] == expected, i
    assert len({got[i]["tree"] for i in (1, 2, 3)}) == 1
    assert {"prog.py", "run.sh", "pkg/__init__.py", ".ml-devignore"} <= {f[0] for f in expected}  # untracked, not ignored: synced
    assert os.access(cluster.pods[2].path(f"{PROJECT}/run.sh"), os.X_OK)  # modes travel
    assert re.search(r"synced /workspace/proj \(\d+ files, tree [0-9a-f]{12}\) to 3 pods in [0-9.]+ s, \d+ bytes sent", res.stdout)


def test_the_start_ledger_marks_of_every_pod_come_from_its_own_sshd_and_first_rank(cluster: Cluster) -> None:
    """The in-pod phases of the start ledger (inpod/lib/ledger.py) are real: sshd.sh marked its sshd listening, the
    first rank of the run above marked its start, once per container, on every pod, in that order."""
    from inpod import contract
    from inpod.lib import ledger

    launch(cluster, "run -- true")  # a second run: the first-rank mark stays the first's
    for i in range(4):
        marks = ledger.read_marks(cluster.pods[i].path(STATE))
        assert set(marks) == {contract.START_SSHD, contract.START_RANK}, (i, marks)
        assert marks[contract.START_SSHD] < marks[contract.START_RANK] <= time.time()


def test_edits_on_pod0_reach_every_pod_before_launch_20_times(cluster: Cluster) -> None:
    for n in range(1, 21):
        clear_records(cluster)
        cluster.write(0, f"{PROJECT}/version.txt", f"v{n}\n")
        extra = cluster.pods[0].path(f"{PROJECT}/pkg/extra.py")
        if n % 2:
            cluster.write(0, f"{PROJECT}/pkg/extra.py", f"N = {n}\n")
        elif extra.exists():
            extra.unlink()  # deletions travel too
        res = launch(cluster, "run -- python3 prog.py")
        assert res.returncode == 0, f"repetition {n}: {res.stdout}{res.stderr}"
        got = records(cluster)
        assert sorted(got) == [0, 1, 2, 3], f"repetition {n}"
        assert {rec["version"] for rec in got.values()} == {f"v{n}"}, f"repetition {n}: {got}"
        assert len({got[i]["tree"] for i in (1, 2, 3)}) == 1, f"repetition {n}"
        assert all(("pkg/extra.py" in [f[0] for f in rec["files"]]) == bool(n % 2) for rec in got.values()), f"repetition {n}"
        if n > 1:  # every pod holds the tree of the run before: the edit (and the deletion) through each rank agent's gate
            hops = json.loads(cluster.pods[0].path(f"{STATE}/sync-last.json").read_text())["hops"]
            assert {h["dst"]: h["via"] for h in hops} == dict.fromkeys((1, 2, 3), "gate"), f"repetition {n}: {hops}"


def _alive(c: PodSim, index: int, pid: int) -> bool:
    """Whether `pid` (as pod `index` numbers it) runs, not a zombie: the pod's own /proc."""
    try:
        return c.pods[index].path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_failing_rank_stops_every_other_rank_and_is_named(cluster: Cluster) -> None:
    clear_records(cluster)
    started = time.monotonic()
    res = launch(cluster, "run -- python3 prog.py fail", timeout=90)
    elapsed = time.monotonic() - started
    assert res.returncode == 3, res.stdout + res.stderr
    assert "rank 2 (ml-dev-env-2)" in res.stderr and "exited with status 3" in res.stderr
    assert naming.pod_dns(APP, NS, 2) in res.stderr
    assert elapsed < 30, elapsed
    got = records(cluster)
    assert sorted(got) == [0, 1, 2, 3]
    for i in (0, 1, 3):
        assert not _alive(cluster, i, int(got[i]["pid"])), f"rank {i} still runs"


def test_ctrl_c_stops_every_rank(cluster: Cluster) -> None:
    clear_records(cluster)
    proc = cluster.popen(0, f"exec {LAUNCHER} run -- python3 prog.py sleep", cwd=PROJECT)
    deadline = time.monotonic() + 60
    while len(records(cluster)) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    got = records(cluster)
    assert sorted(got) == [0, 1, 2, 3], proc.stdout.read() if proc.poll() is not None and proc.stdout else got
    # a heartbeat on the launching pod and on every rank's pod while the run is alive
    assert list(cluster.pods[0].path(f"{STATE}/heartbeat").glob("run-*.json"))
    assert all(list(p.path(f"{STATE}/heartbeat").glob("rank-*.json")) for p in cluster.pods)
    cluster.interrupt(proc)  # the terminal's Ctrl-C reaches the foreground process group
    out, _ = proc.communicate(timeout=40)
    cluster.outputs.append(("output of an interrupted `ml-dev run`", out))
    assert proc.returncode == 130, out
    assert "interrupted; stopping every rank" in out
    for i, rec in got.items():
        assert not _alive(cluster, i, int(rec["pid"])), f"rank {i} still runs"
    assert not list(cluster.pods[0].path(f"{STATE}/heartbeat").glob("run-*.json"))


def test_exec_and_status_cover_every_pod(cluster: Cluster) -> None:
    res = launch(cluster, "exec -- nvidia-smi --query-gpu=name --format=csv,noheader")
    assert res.returncode == 0, res.stderr
    for i in range(4):
        assert res.stdout.count(f"[{i}] NVIDIA H100 80GB HBM3") == 2
    status = launch(cluster, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    for i in range(4):
        line = next(ln for ln in status.stdout.splitlines() if naming.pod_name(APP, i) + " " in ln)
        assert f"rank={i}/4" in line and "gpus=2 NVIDIA H100 80GB HBM3" in line and "rdma=none" in line


def test_ssh_sessions_are_countable(cluster: Cluster) -> None:
    proc = cluster.popen(0, "exec ssh ml-dev-env-1 'sleep 30'")
    try:
        deadline = time.monotonic() + 15
        while not cluster.sessions(1) and time.monotonic() < deadline:
            time.sleep(0.1)
        sessions = cluster.sessions(1)
        assert sessions and sessions[0]["user"] == "ml-dev"
        status = launch(cluster, "status")
        line = next(ln for ln in status.stdout.splitlines() if "ml-dev-env-1 " in ln)
        assert re.search(r"ssh_sessions=[1-9]", line), status.stdout
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_shared_workspace_is_not_synced(cluster: Cluster) -> None:
    cluster.write(0, "/tmp/shared.env", f"ML_DEV_SHARED_PATHS={WORKSPACE}\n")
    cluster.write(0, f"{PROJECT}/only-on-pod0.txt", "x\n")
    res = cluster.exec(0, f"{LAUNCHER} sync", cwd=PROJECT, env={"ML_DEV_DEVLOOP_ENV": "/tmp/shared.env"})
    assert res.returncode == 0, res.stderr
    assert "shared storage: nothing to sync" in res.stdout
    assert not cluster.pods[1].path(f"{PROJECT}/only-on-pod0.txt").exists()
    cluster.pods[0].path(f"{PROJECT}/only-on-pod0.txt").unlink()


def test_user_key_from_config_logs_in_and_an_unknown_key_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[{cluster.pods[1].ip}]:{devloop.SSH_PORT} {cluster.host_pub}\n")

    def ssh(key: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cluster.in_network(
                [
                    "ssh",
                    "-F",
                    "none",
                    "-p",
                    str(devloop.SSH_PORT),
                    "-i",
                    str(cluster.keys / key),
                    "-o",
                    "IdentitiesOnly=yes",
                    "-o",
                    f"UserKnownHostsFile={known}",
                    "-o",
                    "StrictHostKeyChecking=yes",
                    "-o",
                    "BatchMode=yes",
                    *extra,
                    f"ml-dev@{cluster.pods[1].ip}",
                    "hostname; python3 -c 'import getpass; print(getpass.getuser())'; echo $NODE_RANK",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )

    ok = ssh("user")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["ml-dev-env-1", "ml-dev", "1"]
    refused = ssh("stranger")
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr
    # no password or keyboard-interactive method is offered, and root may not log in with a password
    pw = ssh("stranger", "-o", "PreferredAuthentications=password,keyboard-interactive")
    assert pw.returncode == 255 and "Permission denied (publickey)" in pw.stderr
    # a laptop-style login runs the launcher by name (on PATH in SSH sessions)
    status = subprocess.run(
        cluster.in_network(
            [
                "ssh",
                "-F",
                "none",
                "-p",
                str(devloop.SSH_PORT),
                "-i",
                str(cluster.keys / "user"),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "BatchMode=yes",
                f"ml-dev@{cluster.pods[1].ip}",
                "ml-dev status",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert "ml-dev-env-1" in status.stdout and "(this pod)" in status.stdout and "rank=3/4" in status.stdout
    # sftp (IDEs, scp) goes through the session script too
    batch = tmp_path / "sftp.batch"
    batch.write_text("ls -a /workspace\n")
    sftp = subprocess.run(
        cluster.in_network(
            [
                "sftp",
                "-F",
                "none",
                "-P",
                str(devloop.SSH_PORT),
                "-i",
                str(cluster.keys / "user"),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "BatchMode=yes",
                "-b",
                str(batch),
                f"ml-dev@{cluster.pods[1].ip}",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sftp.returncode == 0 and ".deepspeed" in sftp.stdout, sftp.stdout + sftp.stderr
    config = cluster.pods[1].path(f"{STATE}/ssh/sshd_config").read_text()
    assert "PasswordAuthentication no" in config and "PermitRootLogin prohibit-password" in config and "StrictModes yes" in config


def test_nss_wrapper_pod_gives_every_ssh_process_a_passwd_entry(cluster: Cluster) -> None:
    names = "import getpass, pwd, os; print(getpass.getuser(), pwd.getpwuid(os.getuid()).pw_name)"
    res = cluster.exec(0, f"ssh ml-dev-env-3 'id -un; whoami; python3 -c \"{names}\"'")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ml-dev", "ml-dev", "ml-dev", "ml-dev"]
    assert cluster.pods[3].path(f"{STATE}/ssh/nss.env").exists()  # pod 3's /etc/passwd is read-only
    # a shell `oc exec` starts there has no passwd entry, yet the launcher reaches every pod
    plain = cluster.exec(3, f"id -un 2>&1; {LAUNCHER} exec -- hostname", cwd="/tmp")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "cannot find name for user ID" in plain.stdout
    assert sorted(ln for ln in plain.stdout.splitlines() if ln.startswith("[")) == [f"[{i}] ml-dev-env-{i}" for i in range(4)]
    assert not cluster.pods[0].path(f"{STATE}/ssh/nss.env").exists()  # pod 0's image layout: g=u /etc/passwd


def test_a_dead_sshd_is_restarted(cluster: Cluster) -> None:
    pod = cluster.pods[2]

    def kill_sshd() -> None:  # with every connection it served (pod 0 keeps shared connections open)
        for pid in cluster.pod_pids(pod.index):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    kill_sshd()
    # the startup script restarts sshd: the pod is reachable again without a container restart (what a launch
    # says while nothing listens: tests/podsim/test_rank_start.py, with the restart held)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and cluster.exec(0, "ssh -o BatchMode=yes ml-dev-env-2 true").returncode != 0:
        time.sleep(0.2)
    assert launch(cluster, "run --timeout 5 -- true", timeout=60).returncode == 0
    assert "restarting" in pod.path(f"{STATE}/logs/sshd.log").read_text()


def test_deepspeed_pdsh_launch_path_reaches_every_pod(cluster: Cluster) -> None:
    """DeepSpeed's multi-node path (deepspeed/launcher/runner.py main + multinode_runner.py PDSHRunner.get_cmd):
    the hostfile, the `ssh <first host> hostname` check, then `pdsh -S -f 1024 -w <hosts>` running
    `cd <cwd>; python -u -m deepspeed.launcher.launch --world_info=... --node_rank=%n ...` with
    PDSH_RCMD_TYPE=ssh. Only the remote module is a stub (no torch here)."""
    if not shutil.which("pdsh"):
        pytest.skip("needs pdsh (Debian: pdsh)")
    stub = """import argparse, json, os, socket
p = argparse.ArgumentParser()
p.add_argument("--world_info"); p.add_argument("--node_rank", type=int); p.add_argument("--master_addr"); p.add_argument("--master_port")
a, rest = p.parse_known_args()
os.makedirs("out", exist_ok=True)
with open("out/ds-%d.json" % a.node_rank, "w") as f:
    json.dump({"node_rank": a.node_rank, "host": socket.gethostname(), "master": a.master_addr, "script": rest}, f)
print("deepspeed stub rank", a.node_rank, "on", socket.gethostname())
"""
    cluster.write(0, f"{PROJECT}/deepspeed/__init__.py", "")
    cluster.write(0, f"{PROJECT}/deepspeed/launcher/__init__.py", "")
    cluster.write(0, f"{PROJECT}/deepspeed/launcher/launch.py", stub)
    sync = launch(cluster, "sync")
    assert sync.returncode == 0, sync.stderr
    script = (
        ". /tmp/ml-dev-env/rank.env; "
        'hosts=$(cut -d" " -f1 "$DEEPSPEED_HOSTFILE" | paste -sd, -); first=${hosts%%,*}; '
        'ssh -o PasswordAuthentication=no "$first" hostname >/dev/null && '
        'PDSH_RCMD_TYPE=ssh pdsh -S -f 1024 -w "$hosts" '
        f'"export PYTHONPATH={PROJECT}; cd {PROJECT};" python3 -u -m deepspeed.launcher.launch --world_info=e30= '
        '--node_rank=%n "--master_addr=$MASTER_ADDR" --master_port=29500 train.py --deepspeed'
    )
    res = cluster.exec(0, script, cwd=PROJECT, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    hostfile = cluster.pods[0].path(f"{WORKSPACE}/.deepspeed/{APP}/hostfile").read_text()
    assert hostfile == naming.hostfile(APP, NS, 4, 2)
    for i in range(4):
        rec = json.loads(cluster.pods[i].path(f"{PROJECT}/out/ds-{i}.json").read_text())
        assert rec["host"] == naming.pod_name(APP, i) and rec["master"] == naming.pod_dns(APP, NS, 0)
        assert rec["script"] == ["train.py", "--deepspeed"]


def test_laptop_ssh_config_parses_and_logs_in_through_oc(cluster: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(devloop.known_hosts(APP, NS, 4, cluster.host_pub))
    config = tmp_path / "config"
    text = devloop.ssh_config(APP, NS, 4, devloop.TCP_USER, str(known))
    config.write_text(text + f"\nHost *\n    IdentityFile {cluster.keys / 'user'}\n    IdentitiesOnly yes\n    BatchMode yes\n")
    parsed = subprocess.run(["ssh", "-G", "-F", str(config), "ml-dev-env-2"], capture_output=True, text=True, check=True).stdout
    options = dict(line.split(" ", 1) for line in parsed.splitlines() if " " in line)
    assert options["user"] == "ml-dev" and options["hostname"] == "ml-dev-env-2"
    assert options["proxycommand"].startswith(f"oc exec -i -n {NS} -c ml-dev ml-dev-env-2 -- ")
    assert options["stricthostkeychecking"] == "true"
    # a stub `oc` that enters the simulated pod like `oc exec -i` (the container env, the pod's UID)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    oc = bin_dir / "oc"
    oc.write_text(
        "#!/usr/bin/env python3\n"
        "import os, sys, json\n"
        "args = sys.argv[1:]\n"
        "assert args[:2] == ['exec', '-i'], args\n"
        "sep = args.index('--')\n"
        "pod = args[sep - 1]\n"
        f"table = json.load(open({str(tmp_path / 'pods.json')!r}))\n"
        "argv = table[pod] + args[sep + 1:]\n"
        "os.execvp(argv[0], argv)\n"
    )
    oc.chmod(0o755)
    table = {}
    for i in range(4):
        table[naming.pod_name(APP, i)] = cluster.command(i, ["true"])[:-1]
    (tmp_path / "pods.json").write_text(json.dumps(table))
    res = subprocess.run(
        ["ssh", "-F", str(config), "ml-dev-env-2", "hostname; id -un; echo $NODE_RANK"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ml-dev-env-2", "ml-dev", "2"]
    # a wrong host key is refused: the known_hosts lines are what keeps laptops safe across restarts
    known.write_text(devloop.known_hosts(APP, NS, 4, cluster.user_pub))
    bad = subprocess.run(
        ["ssh", "-F", str(config), "ml-dev-env-2", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert bad.returncode == 255 and "Host key verification failed" in bad.stderr


def test_the_pod_user_is_unprivileged(cluster: Cluster) -> None:
    res = cluster.exec(1, "grep -E '^(Uid|CapEff|NoNewPrivs)' /proc/$(cat /tmp/ml-dev-env/ssh/sshd.pid)/status")
    fields = dict(line.split(":", 1) for line in res.stdout.splitlines())
    assert fields["Uid"].split()[0] == str(cluster.identity.uid)
    assert int(fields["CapEff"].strip(), 16) == 0 and fields["NoNewPrivs"].strip() == "1"
    # the key the pod's sshd reads is its own 0600 copy; the Secret stays read-only
    key = cluster.pods[1].path(f"{STATE}/ssh/host_ed25519_key")
    assert key.stat().st_uid == cluster.identity.uid and key.stat().st_mode & 0o777 == 0o600
    assert cluster.pods[1].path(f"{STATE}/ssh").stat().st_mode & 0o777 == 0o700
    assert STATE in cluster.pods[1].path(f"{STATE}/ssh/client.conf").read_text()


def _dap(sock: socket.socket, seq: int, command: str, **arguments: object) -> None:
    body = json.dumps({"seq": seq, "type": "request", "command": command, "arguments": arguments}).encode()
    sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _dap_read(sock: socket.socket, buf: bytearray) -> dict[str, object]:
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = re.search(rb"Content-Length: (\d+)", head)
    assert length, f"a DAP message starts with a Content-Length header: {head!r}"
    size = int(length.group(1))
    while len(rest) < size:
        rest += sock.recv(65536)
    buf[:] = rest[size:]
    return json.loads(rest[:size])


def test_debug_rank_waits_for_a_debugger_on_its_pod_ip_with_debug_host_pod(cluster: Cluster) -> None:
    if "debugpy" not in cluster.python_packages:
        pytest.skip("needs debugpy importable here (requirements-dev.txt)")
    clear_records(cluster)
    proc = cluster.popen(0, f"exec {LAUNCHER} run --debug 1 --debug-host pod -- python3 prog.py", cwd=PROJECT)
    try:
        deadline = time.monotonic() + 60
        while len(records(cluster)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        assert sorted(records(cluster)) == [0, 2, 3]  # rank 1 waits for the debugger before running the program
        sock = None
        while sock is None and time.monotonic() < deadline:
            try:
                sock = cluster.connect(1, naming.DEBUG_PORT)
            except OSError:
                time.sleep(0.2)
        assert sock is not None, "debugpy never listened on rank 1's pod"
        with sock:
            buf = bytearray()
            _dap(sock, 1, "initialize", adapterID="ml-dev-test", clientID="test", pathFormat="path")
            _dap(sock, 2, "attach", justMyCode=True)
            seen = []
            while "initialized" not in seen:
                msg = _dap_read(sock, buf)
                seen.append(str(msg.get("event") or msg.get("command")))
            _dap(sock, 3, "configurationDone")
            while 1 not in records(cluster) and time.monotonic() < deadline:
                time.sleep(0.1)
            _dap(sock, 4, "disconnect")
        out, _ = proc.communicate(timeout=60)
        cluster.outputs.append(("output of `ml-dev run --debug 1`", out))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert f"[1] ml-dev: debugpy listening on {cluster.pods[1].ip} port 5678" in out
    line = f"on its pod IP, port 5678 (--debug-host pod): any pod of the stack can attach to {naming.pod_dns(APP, NS, 1)}:5678"
    assert line in out
    assert sorted(records(cluster)) == [0, 1, 2, 3]


def test_a_key_added_to_the_stack_logs_in_without_a_restart(cluster: Cluster, tmp_path: Path) -> None:
    """The kubelet swaps the mounted Secret's ..data; the pods pick the new authorized_keys up without a restart."""
    known = tmp_path / "known_hosts"
    known.write_text(f"[{cluster.pods[2].ip}]:{devloop.SSH_PORT} {cluster.host_pub}\n")

    def stranger() -> int:
        return subprocess.run(
            cluster.in_network(
                [
                    "ssh",
                    "-F",
                    "none",
                    "-p",
                    str(devloop.SSH_PORT),
                    "-i",
                    str(cluster.keys / "stranger"),
                    "-o",
                    "IdentitiesOnly=yes",
                    "-o",
                    f"UserKnownHostsFile={known}",
                    "-o",
                    "BatchMode=yes",
                    f"ml-dev@{cluster.pods[2].ip}",
                    "true",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=30,
        ).returncode

    def wait_for(code: int) -> bool:
        deadline = time.monotonic() + 60  # sshd.sh re-reads the Secret every 5 s (ML_DEV_SSH_REFRESH_SECONDS)
        while time.monotonic() < deadline:
            if stranger() == code:
                return True
            time.sleep(0.5)
        return False

    name = next(n for n, v in cluster.secrets.items() if "authorized_keys" in v)
    before = dict(cluster.secrets[name])
    assert stranger() == 255
    try:
        cluster.swap_configmap(name, {**before, "authorized_keys": before["authorized_keys"] + cluster.stranger_pub + "\n"})
        assert wait_for(0), "the added key never logged in"
    finally:
        cluster.swap_configmap(name, before)
    assert wait_for(255), "the removed key still logs in"


def test_the_secret_reached_every_rank_and_nothing_else(cluster: Cluster, scan: LeakScan) -> None:
    """Last of the module: the listed Secret's value reached every rank of a run (a digest in each record) and of an
    exec (their environment, sampled), and the scan of everything the module did (and of the home page) finds it
    nowhere else. The same scan finds it where it is planted: an `oc exec` process given it as env (what container env
    would be) and a log line."""
    clear_records(cluster)
    res = launch(cluster, "run -- python3 prog.py")
    assert res.returncode == 0, res.stdout + res.stderr
    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    got = records(cluster)
    assert sorted(got) == [0, 1, 2, 3] and [i for i, rec in got.items() if rec["secret"] != digest] == [], got
    held = launch(cluster, "exec -- sleep 3")
    assert held.returncode == 0, held.stdout + held.stderr
    for page in ("/", "/fragment"):  # the home page (pod 0's dev server) shows names, never a value
        res = cluster.exec(0, ["python3", "-c", FETCH, f"http://127.0.0.1:{HOME_PORT}{page}"], timeout=30)
        assert res.returncode == 0 and res.stdout, res.stderr
    scan.stop()
    assert {pod for pod, cmdline in scan.holders if cmdline == "sleep 3"} == {p.name for p in cluster.pods}, scan.holders
    for where, text in cluster.outputs:
        scan.text(where, text)
    files = scan.pods_state() + scan.pods_files() + scan.container_logs()
    files += scan.files("workspace of", [cluster.volume_dir(i, WORKSPACE) for i in range(4)])
    scan.render(cluster.result)
    assert scan.hits == [], "\n".join(scan.hits)
    commands = scan.ssh_commands()
    print(f"leak scan: {scan.samples} samples, {len(scan.processes_seen)} processes, {files} files, {len(commands)} SSH commands")
    assert scan.samples >= 10 and files > 20 and any("_rank" in c for c in commands), (scan.samples, files, commands[:5])

    planted = LeakScan(cluster, [VALUE], environ=True)
    leaky = None
    try:
        with planted:
            leaky = cluster.popen(1, "exec sleep 30", env={"PLANTED_TOKEN": VALUE})
            deadline = time.monotonic() + 20
            while not planted.hits and time.monotonic() < deadline:
                time.sleep(0.1)
        cluster.write(2, f"{STATE}/logs/planted.log", f"token={VALUE}\n")
        planted.pods_files()
    finally:
        if leaky is not None:
            os.killpg(leaky.pid, signal.SIGKILL)
            leaky.wait(timeout=30)
        cluster.pods[2].path(f"{STATE}/logs/planted.log").unlink(missing_ok=True)
    assert any(h.startswith("/proc/") and "environ on ml-dev-env-1: PLANTED_TOKEN" in h for h in planted.hits), planted.hits
    assert any(h.startswith("ml-dev-env-2 planted.log") for h in planted.hits), planted.hits
    assert all(VALUE not in h for h in planted.hits), "the scan's own lines never hold the value"
