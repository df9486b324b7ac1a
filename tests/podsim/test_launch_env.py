"""`ml-dev run` from the shells people open, before a node-count change: each rank gets its own pod's current values.

Interactive and login shells source rank.env when they start (startup.sh's env.sh hooks in ~/.bashrc, ~/.profile,
~/.bash_profile and $ENV; /etc/profile.d/ml-dev-env.sh; ssh-session.sh for SSH sessions), so a terminal opened
before the cluster ConfigMap's count changed holds that count. Every shell here is opened on pod 0 of
nerc-production (2 pods, from the render) before a resize (2 -> 1, then 1 -> 2: the kubelet swaps cluster.env's
`..data` and every startup script rewrites rank.env in place), waits, then launches: `bash -lic`, `bash -ic`,
`sh -ic` (dash: $ENV) and an SSH login shell (pod 0's own fabric client, no command: ssh-session.sh `exec -l`).

Each shell also exports a variable of its own (it travels), a stale RANK/LOCAL_RANK (they do not), and launches
three times: plain, with `--env` (a rank key and a shell key), and with `--per-pod`.

The stack lists a Secret that exists in the namespace (`env.secrets`): every rank of every launch gets its value from
its own pod's mount, and the shared leak scan (tests/podsim/leakscan.py) finds the value nowhere else while the
shells launch: no argv on any pod, no SSH command, no run output, no file under the state dir's logs/.
"""

from __future__ import annotations

import hashlib
import json
import secrets as pysecrets
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from subprocess import PIPE

import pytest

from inpod import contract as pod_contract
from tests.podsim.leakscan import SSH_ARGV_PROGRAM, LeakScan
from tests.podsim.pods import PREFIX, PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(600)]

STATE = "/tmp/ml-dev-env"
GO = "/tmp/podsim-launch-go"
SHOW = "/tmp/podsim-show.py"
KEYS = (*pod_contract.RANK_ENV, "RANK", "LOCAL_RANK", "MY_FLAG")
SECRET, SECRET_KEY = "launch-canary", "LAUNCH_CANARY_TOKEN"  # a Secret of the namespace, listed in env.secrets
VALUE = pysecrets.token_urlsafe(24)[:32]
# What every rank saw: one JSON line (the launcher prefixes it with `[rank] `); of the secret only a digest, so the
# run's output holds no value for the leak scan to find.
SHOW_PROGRAM = f"""
import hashlib, json, os, sys
env = {{k: os.environ.get(k) for k in {KEYS!r}}}
env["secret"] = hashlib.sha256(os.environ.get({SECRET_KEY!r}, "").encode()).hexdigest()
print("REC " + json.dumps({{"tag": sys.argv[1], "env": env}}), flush=True)
"""
LAUNCH = "ml-dev run --no-sync --timeout 60"
BODY = f"""
echo "SHELL NNODES=${{NNODES:-unset}} WORLD_SIZE=${{WORLD_SIZE:-unset}}"
export MY_FLAG=from-shell RANK=7 LOCAL_RANK=3
while [ ! -e {GO} ]; do sleep 0.2; done
cd /tmp
{LAUNCH} -- python3 {SHOW} plain; echo "RC plain $?"
{LAUNCH} --env MASTER_PORT=29611 --env MY_FLAG=from-env -- python3 {SHOW} env; echo "RC env $?"
{LAUNCH} --per-pod -- python3 {SHOW} per-pod; echo "RC per-pod $?"
"""
SHELLS = ("bash -lic", "bash -ic", "sh -ic", "ssh login shell")


def rank_env(sim: PodSim, index: int) -> dict[str, str]:
    """Pod `index`'s current rank.env, as a shell sourcing it sees it."""
    res = sim.exec(index, f"set -a; . {STATE}/rank.env; env -0", timeout=30)
    assert res.returncode == 0, res.stderr
    values = dict(item.split("=", 1) for item in res.stdout.split("\0") if "=" in item)
    return {k: values[k] for k in pod_contract.RANK_ENV if k in values}


def resize(sim: PodSim, nnodes: int) -> None:
    """The cluster ConfigMap's count changed (`pulumi up` with another nodes.count): wait for the rank.env of every
    pod of the new count (a pod beyond it keeps its file: startup.sh writes none for a pod not in the count)."""
    name = next(n for n in sim.configmaps if n.endswith("-cluster"))
    text = sim.configmaps[name]["cluster.env"]
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    values["NNODES"] = str(nnodes)
    sim.swap_configmap(name, {"cluster.env": "".join(f"{k}={v}\n" for k, v in values.items())})
    deadline = time.monotonic() + 60
    for pod in sim.pods[:nnodes]:
        while rank_env(sim, pod.index).get("NNODES") != str(nnodes):
            assert time.monotonic() < deadline, pod.log.read_text()
            time.sleep(0.5)


@dataclass
class Shell:
    name: str
    proc: subprocess.Popen[str]


def open_shell(sim: PodSim, name: str) -> Shell:
    """A shell on pod 0 (`oc exec` as a terminal would run it), sourcing its start files now, launching on GO."""
    if name == "ssh login shell":
        host = rank_env(sim, 0)["ML_DEV_HOSTS"].split()[0]
        argv = sim.command(0, ["ssh", "-F", f"{STATE}/ssh/client.conf", "-T", "-o", "BatchMode=yes", host])
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=PIPE, stderr=PIPE, text=True, start_new_session=True)
        assert proc.stdin is not None
        proc.stdin.write(BODY)  # no command: ssh-session.sh runs `exec -l $SHELL`, which reads these lines
        proc.stdin.close()
        proc.stdin = None  # communicate() must not flush it again
    else:
        argv = sim.command(0, [*name.split(), BODY])
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=PIPE, stderr=PIPE, text=True, start_new_session=True)
    return Shell(name, proc)


def wait_started(shell: Shell) -> str:
    """The shell's first line: the count it sourced when it started."""
    assert shell.proc.stdout is not None and shell.proc.stderr is not None
    line = shell.proc.stdout.readline()  # the shell prints it at once (or ends: then its stderr says why)
    assert line.startswith("SHELL "), f"{shell.name}: {line!r} {shell.proc.stderr.read() if shell.proc.poll() is not None else ''}"
    return line.split()[1]


def stop(sim: PodSim, shell: Shell) -> None:
    """SIGKILL to everything the shell started in the pod (its process group), then to the `oc exec` stand-in."""
    if shell.proc.poll() is not None:
        return
    sim.interrupt(shell.proc, signal.SIGKILL)
    shell.proc.kill()
    try:
        shell.proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pass  # a child that left the group still holds the pipe; the simulation's stop kills it


def finish(shell: Shell) -> tuple[dict[str, dict[int, dict[str, str | None]]], str]:
    """{tag: {rank: env}} of the three launches, and the whole output (for messages)."""
    try:
        out, err = shell.proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{shell.name}: the launches did not finish in 240 s") from None
    records: dict[str, dict[int, dict[str, str | None]]] = {}
    for line in out.splitlines():
        head, _, rest = line.partition(" REC ")
        if rest:
            rec = json.loads(rest)
            records.setdefault(rec["tag"], {})[int(head.strip("[] "))] = rec["env"]
    for tag in ("plain", "env", "per-pod"):
        assert f"RC {tag} 0" in out, f"{shell.name}: ml-dev run ({tag}) failed\n{out}\n{err}"
    return records, out + err


def with_secret(objects: dict[str, object]) -> None:
    objects["env"] = {"secrets": [{"secret": SECRET, "keys": [SECRET_KEY]}]}


@pytest.fixture(scope="module")
def sim() -> Iterator[PodSim]:
    before = set(leftovers())
    s = PodSim(
        render_stack("nerc-production", with_secret),
        count=2,
        namespace_secrets={SECRET: {SECRET_KEY: VALUE}},
        image_programs=SSH_ARGV_PROGRAM,
    )
    try:
        s.start()
        for pod in s.pods:
            s.write(pod.index, SHOW, SHOW_PROGRAM)
        yield s
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2)])
def test_every_shell_opened_before_a_resize_launches_with_each_pods_current_values(sim: PodSim, old: int, new: int) -> None:
    if rank_env(sim, 0).get("NNODES") != str(old):
        resize(sim, old)
    sim.exec(0, f"rm -f {GO}", timeout=30)
    shells = [open_shell(sim, name) for name in SHELLS]
    try:
        for shell in shells:
            assert wait_started(shell) == f"NNODES={old}", f"{shell.name} sources rank.env when it starts"
        resize(sim, new)
        current = {i: rank_env(sim, i) for i in range(new)}
        gpus = int(current[0]["GPUS_PER_NODE"])
        with LeakScan(sim, [VALUE]) as scan:
            sim.exec(0, f"touch {GO}", timeout=30)
            finished = [(shell, *finish(shell)) for shell in shells]
        for shell, _, output in finished:
            scan.text(f"{shell.name}: run output", output)
        scan.pods_state()
        assert scan.hits == [], scan.hits
        assert scan.samples > 0
        digest = hashlib.sha256(VALUE.encode()).hexdigest()
        for shell, records, output in finished:
            assert set(records) == {"plain", "env", "per-pod"}, output
            for tag, ranks in records.items():
                assert sorted(ranks) == list(range(new)), f"{shell.name} ({tag}): ranks {sorted(ranks)}\n{output}"
                for rank, env in ranks.items():
                    where = f"{shell.name} ({tag}), rank {rank}"
                    # every rank.env key is that pod's current one (but one named with --env, or set by --per-pod)
                    for key, value in current[rank].items():
                        if (tag, key) not in {("env", "MASTER_PORT"), ("per-pod", "WORLD_SIZE")}:
                            assert env[key] == value, f"{where}: {key}={env[key]!r}, its pod's rank.env says {value!r}"
                    assert env["NODE_RANK"] == str(rank) and env["NNODES"] == env["PET_NNODES"] == str(new), where
                    assert len((env["ML_DEV_HOSTS"] or "").split()) == new, where
                    assert env["MY_FLAG"] == ("from-env" if tag == "env" else "from-shell"), where  # the shell's own key travels
                    assert env["secret"] == digest, f"{where}: the listed Secret's key from its own pod's mount"
                    if tag == "env":
                        assert env["MASTER_PORT"] == "29611", f"{where}: --env sets a rank key on every rank"
                    if tag == "per-pod":
                        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), "0", str(new)), where
                    else:  # nothing without --per-pod: not the shell's stale RANK/LOCAL_RANK either
                        assert env["RANK"] is None and env["LOCAL_RANK"] is None, where
                        assert env["WORLD_SIZE"] == str(new * gpus), where
    finally:
        for shell in shells:
            stop(sim, shell)
        sim.exec(0, f"rm -f {GO}", timeout=30)


def test_the_launch_rule_is_in_the_help(sim: PodSim) -> None:
    res = sim.exec(0, "ml-dev run --help", timeout=30)
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "rank.env" in text and all(k in text for k in (*pod_contract.RANK_ENV, "NCCL_IB_HCA")), text
    assert "--per-pod" in text and "--env" in text


TOOL = """#!/bin/sh
printf 'TOOL pod=%s owner=%s home=%s path=%s cache=%s\\n' "$POD_NAME" OWNER "$HOME" "$PATH" "${XDG_CACHE_HOME:-}"
"""


@pytest.mark.parametrize("shell", ["bash -lic", "bash -ic"])
def test_per_pod_values_stay_each_pods_own(sim: PodSim, shell: str) -> None:
    """`mytool` in each pod's own ~/.local/bin (HOME is per pod): a login shell puts pod 0's ~/.local/bin first in
    PATH and env.sh sets the caches under pod 0's HOME; each rank gets its own pod's instead, and the tool runs
    everywhere (before: rank 1 exited 127, its PATH naming pod 0's home)."""
    if rank_env(sim, 0).get("NNODES") != "2":
        resize(sim, 2)
    homes = [pod.env["ML_DEV_HOME"] for pod in sim.pods]
    assert homes[0] != homes[1]
    for pod in sim.pods:
        sim.write(pod.index, f"{homes[pod.index]}/.local/bin/mytool", TOOL.replace("OWNER", pod.name), mode=0o755)
    try:
        res = sim.exec(0, [*shell.split(), f"cd /tmp && {LAUNCH} -- mytool"], timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        seen = {}
        for line in res.stdout.splitlines():
            _, _, rest = line.partition("TOOL ")
            if rest:
                fields = dict(word.split("=", 1) for word in rest.split())
                seen[fields["pod"]] = fields
        assert sorted(seen) == [pod.name for pod in sim.pods], res.stdout
        for i, pod in enumerate(sim.pods):
            got = seen[pod.name]
            assert got["home"] == homes[i] and got["owner"] == pod.name, got  # its own pod's tool ran
            assert f"{homes[i]}/.local/bin" in got["path"].split(":"), got["path"]
            assert not any(homes[j] in got["path"] or homes[j] in got["cache"] for j in range(len(homes)) if j != i), got
            assert got["cache"] in ("", f"{homes[i]}/.cache"), got
    finally:
        for pod in sim.pods:
            pod.path(f"{homes[pod.index]}/.local/bin/mytool").unlink()
