"""The startup script (inpod/sh/startup.sh) as PID 1 of pods started from the render (tests/podsim).

What each pod gets is the render's (env, ConfigMaps, identity); the dev servers the image has (code-server,
jupyter, tensorboard: images/base.Containerfile) are stubs at the image's paths that record argv, env and PID
under /run/podsim-image and then stay up like a server. Variants: token auth, hcaMode auto, an SCC without
SYS_RESOURCE, a scale-up pod outside the count, restricted-v2 (nerc-production) on a workspace it cannot write.
The cases the render cannot express (a pod name without an ordinal, no writable /tmp, no idle settings mounted)
stay plain-process unit tests in tests/inpod/test_startup_script.py.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core import naming
from inpod import contract as pod_contract
from tests.podsim.nodetools import Node
from tests.podsim.pods import (
    PREFIX,
    PodSim,
    held_pid_namespaces,
    leftovers,
    missing_requirements,
    pids_in_namespace_of,
    render_stack,
)

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]

STATE = "/tmp/ml-dev-env"
WORKSPACE = "/workspace"
STUBS = "/run/podsim-image"
SERVERS = {"code-server": "/usr/local/bin/code-server", "jupyter": "/usr/local/bin/jupyter", "tensorboard": "/usr/local/bin/tensorboard"}
SERVER_STUB = f"""#!/bin/sh
# stub of the image's dev server: record argv, env and PID, then stay up like a server (exec keeps the PID)
name=$(basename "$0")
echo "$name $*" >> {STUBS}/calls.log
echo $$ > {STUBS}/$name.pid
env -0 > {STUBS}/$name.env.tmp && mv {STUBS}/$name.env.tmp {STUBS}/$name.env
exec sleep 600
"""
# `touch` of the image, wrapped: when startup.sh creates its ready file, was "ready" already in PID 1's log?
TOUCH = f"""#!/bin/sh
if grep -qxF "[ml-dev-env] ready" /proc/1/fd/1 2>/dev/null; then echo logged > {STUBS}/touch-checked; fi
exec /usr/bin/touch "$@"
"""
IMAGE_PROGRAMS = {**dict.fromkeys(SERVERS.values(), SERVER_STUB), "/usr/local/bin/touch": TOUCH}
ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("up", flush=True)
c, _ = s.accept(); c.sendall(b"jupyter on loopback\\n"); c.close()
"""
ASK = "import socket, sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).recv(100).decode().strip())"
RANK_KEYS = pod_contract.RANK_ENV  # what rank.env holds: the one contract (inpod/contract.py)


# ----------------------------------------------------------------------------------------------- helpers


def cluster(sim: PodSim) -> tuple[str, dict[str, str]]:
    """The cluster ConfigMap's name and its cluster.env values (as rendered or last swapped)."""
    name = next(n for n in sim.configmaps if n.endswith("-cluster"))
    text = sim.configmaps[name]["cluster.env"]
    return name, dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def swap_count(sim: PodSim, nnodes: int) -> None:
    name, values = cluster(sim)
    values["NNODES"] = str(nnodes)
    sim.swap_configmap(name, {"cluster.env": "".join(f"{k}={v}\n" for k, v in values.items())})


def hostfile_of(sim: PodSim) -> str:
    """DeepSpeed's hostfile: under the environment's name in the workspace (another environment may mount it)."""
    return f"{WORKSPACE}/.deepspeed/{sim.app}/hostfile"


def expected_rank(sim: PodSim, index: int, hostfile: str | None = None, nnodes: int = 2) -> dict[str, str]:
    """The rank contract for pod `index`, from the naming helpers the Pulumi program uses and the rendered cluster.env."""
    hostfile = hostfile or hostfile_of(sim)
    _, values = cluster(sim)
    gpus, master = int(values["GPUS_PER_NODE"]), naming.pod_dns(sim.app, sim.namespace, 0)
    return {
        "ML_DEV_POD": naming.pod_name(sim.app, index),
        "NODE_RANK": str(index),
        "NNODES": str(nnodes),
        "GPUS_PER_NODE": str(gpus),
        "WORLD_SIZE": str(nnodes * gpus),
        "MASTER_ADDR": master,
        "MASTER_PORT": values["MASTER_PORT"],
        "PET_NNODES": str(nnodes),
        "PET_NODE_RANK": str(index),
        "PET_NPROC_PER_NODE": str(gpus),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": values["MASTER_PORT"],
        "DEEPSPEED_HOSTFILE": hostfile,
        "ML_DEV_HOSTS": " ".join(naming.pod_dns(sim.app, sim.namespace, i) for i in range(nnodes)),
        "ML_DEV_PODS": " ".join(naming.pod_names(sim.app, nnodes)),
    }


def env0(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


def shell_env(sim: PodSim, index: int, cmd: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `cmd` (a shell ending in `env -0`) prints inside the pod (`oc exec`)."""
    res = sim.exec(index, cmd, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    return env0(res.stdout)


def sourced(sim: PodSim, index: int, path: str) -> dict[str, str]:
    """What a shell in the pod has after sourcing `path`, started with nothing but PATH."""
    return shell_env(sim, index, f"env -i PATH=/usr/bin:/bin bash -c '. {shlex.quote(path)} && env -0'")


def rank_env(sim: PodSim, index: int) -> dict[str, str]:
    values = sourced(sim, index, f"{STATE}/rank.env")
    return {k: values[k] for k in RANK_KEYS if k in values}


def calls(sim: PodSim, index: int) -> list[str]:
    path = sim.pods[index].path(f"{STUBS}/calls.log")
    return path.read_text().splitlines() if path.exists() else []


def recorded_env(sim: PodSim, index: int, server: str) -> dict[str, str]:
    return env0(sim.pods[index].path(f"{STUBS}/{server}.env").read_text())


def wait_until(predicate: Callable[[], bool], timeout: float = 40, what: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what()
        time.sleep(0.2)


def log(sim: PodSim, index: int) -> str:
    return sim.pods[index].log.read_text()


@pytest.fixture
def started() -> Iterator[Callable[..., PodSim]]:
    """started(result, count=, wait=, **PodSim kw): a PodSim with the stub dev servers, stopped after the test; nothing
    of it may be left behind."""
    sims: list[PodSim] = []
    before = set(leftovers())

    def start(result: Any, count: int = 1, wait: bool = True, prepare: Callable[[PodSim], None] | None = None, **kw: Any) -> PodSim:
        s = PodSim(result, count=count, image_programs=IMAGE_PROGRAMS, **kw)
        sims.append(s)
        if prepare:
            prepare(s)
        return s.start(wait=wait)

    try:
        yield start
    finally:
        for s in sims:
            s.stop()
        mine = [x for x in set(leftovers()) - before for s in sims if f"{PREFIX}{s.run_id}-" in x]
        assert not mine, f"left behind: {mine}"


@pytest.fixture(scope="module", params=["barcelona", "nerc-production"])
def sim(request: pytest.FixtureRequest) -> Iterator[PodSim]:
    """Two pods of a committed stack with the stub dev servers (tests run in file order on it)."""
    before = set(leftovers())
    s = PodSim(render_stack(request.param), count=2, image_programs=IMAGE_PROGRAMS)
    try:
        s.start()
        wait_until(lambda: len(calls(s, 0)) >= 3, 30, lambda: log(s, 0))  # the three dev servers are up
        yield s
    finally:
        with held_pid_namespaces(p.pid for p in s.pods if p.pid) as pid_ns:
            s.stop()
            assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]
            assert not [pid for ns in pid_ns for pid in pids_in_namespace_of(ns)], "processes left in a pod's PID namespace"


# ------------------------------------------------------------------------------ two pods of each committed stack


def test_pod0_computes_rank_writes_hostfile_and_starts_servers_on_loopback(sim: PodSim) -> None:
    _, values = cluster(sim)
    hostfile = sim.pods[0].path(hostfile_of(sim)).read_text()
    assert hostfile == naming.hostfile(sim.app, sim.namespace, 2, int(values["GPUS_PER_NODE"]))
    assert hostfile.splitlines()[1] == f"{sim.fqdn(1)} slots={values['GPUS_PER_NODE']}"
    assert rank_env(sim, 0) == expected_rank(sim, 0)
    servers = {line.split()[0]: line for line in calls(sim, 0)}
    assert set(servers) == set(SERVERS)
    assert "--bind-addr 127.0.0.1:8080 --auth none" in servers["code-server"]
    assert "lab --no-browser --allow-root --ip=127.0.0.1 --port=8888" in servers["jupyter"]
    assert "--host 127.0.0.1 --port 6006" in servers["tensorboard"]
    rendered = {e["name"]: e.get("value") for e in sim.main.get("env") or []}
    # the servers start without the rank values (kernels and terminals read rank.env when they start)
    for name in SERVERS:
        server_env = recorded_env(sim, 0, name)
        assert not set(RANK_KEYS) & set(server_env), name
        assert server_env["ML_DEV_STATE_DIR"] == STATE, name
        assert server_env.get("NCCL_IB_HCA") == rendered.get("NCCL_IB_HCA"), name
    env_sh = sourced(sim, 0, f"{STATE}/env.sh")
    assert env_sh["NODE_RANK"] == "0" and env_sh.get("NCCL_IB_HCA") == rendered.get("NCCL_IB_HCA")
    assert "NODE_RANK=0 of NNODES=2" in log(sim, 0)
    # the ready file came after "ready" in PID 1's log (whoever sees the file finds the line)
    for i in range(2):
        assert sim.pods[i].path(f"{STUBS}/touch-checked").read_text().strip() == "logged", log(sim, i)


def test_worker_starts_no_dev_servers(sim: PodSim) -> None:
    assert calls(sim, 1) == []
    out = log(sim, 1)
    assert "worker pod: no dev servers" in out and "NODE_RANK=1 of NNODES=2" in out
    _, values = cluster(sim)
    assert sim.pods[1].path(hostfile_of(sim)).read_text() == naming.hostfile(sim.app, sim.namespace, 2, int(values["GPUS_PER_NODE"]))
    rank = rank_env(sim, 1)
    assert rank == expected_rank(sim, 1)
    # the rank the pod computes from the rendered cluster ConfigMap is the one the program reports in its outputs
    outputs = sim.result.outputs
    assert (rank["MASTER_ADDR"], int(rank["WORLD_SIZE"]), rank["ML_DEV_PODS"].split()) == (
        outputs["master_addr"],
        outputs["world_size"],
        outputs["pod_names"],
    )


def test_the_idle_agent_runs_on_a_worker_and_shells_get_the_warning(sim: PodSim) -> None:
    """The rendered idle settings are mounted on every pod: startup.sh starts the agent (a worker: no IDE probes)
    and hooks the idle warning into interactive shells."""
    assert "starting idle-agent: python3" in log(sim, 1)
    addr = sim.pods[1].path(f"{STATE}/activity.addr")
    wait_until(lambda: addr.exists() and bool(addr.read_text().strip()), 30, lambda: log(sim, 1))
    url = f"http://{addr.read_text().split()[0]}/activity"
    res = sim.exec(1, ["python3", "-c", f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"])
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["pod"] == sim.pods[1].name
    assert [s["name"] for s in report["signals"]] == ["gpu", "terminals", "ssh", "launcher", "warm"]
    bashrc = sim.pods[1].path(f"{WORKSPACE}/.home/{sim.pods[1].name}/.bashrc").read_text()
    assert bashrc.count("idle-warning.sh") == 2 and "ml-dev-env/idle-warning.sh" in bashrc  # one line, path twice


def test_count_change_rewrites_rank_files_in_place_and_new_kernels_and_terminals_see_it(sim: PodSim) -> None:
    """nodes.count 2 -> 3 -> 2 changes only the cluster ConfigMap: the kubelet swaps ..data, the running script
    rewrites rank.env and the hostfile and does not restart the dev servers. The Jupyter server keeps its start-time
    env; a kernel inherits it and runs the IPython startup file, which loads the current rank.env; a terminal is
    bash: .bashrc -> env.sh -> rank.env."""
    servers_before = calls(sim, 0)
    pids = {name: sim.pods[0].path(f"{STUBS}/{name}.pid").read_text() for name in SERVERS}
    pid1 = sim.pods[0].pid
    _, values = cluster(sim)
    gpus = int(values["GPUS_PER_NODE"])
    try:
        swap_count(sim, 3)
        wait_until(lambda: rank_env(sim, 0).get("NNODES") == "3", 40, lambda: log(sim, 0))
        assert sim.pods[0].path(hostfile_of(sim)).read_text() == naming.hostfile(sim.app, sim.namespace, 3, gpus)
        assert rank_env(sim, 0) == expected_rank(sim, 0, nnodes=3)

        server_env = recorded_env(sim, 0, "jupyter")  # what the server hands to every kernel and terminal
        assert "NNODES" not in server_env
        startup = f"{server_env['IPYTHONDIR']}/profile_default/startup/00-ml-dev-env-rank.py"
        kernel = "import json, os, runpy, sys; runpy.run_path(sys.argv[1]); print(json.dumps(dict(os.environ)))"
        res = sim.exec(0, ["env", "-i", *(f"{k}={v}" for k, v in server_env.items()), "python3", "-c", kernel, startup])
        assert res.returncode == 0, res.stderr
        seen = json.loads(res.stdout)
        assert {k: seen.get(k) for k in RANK_KEYS} == expected_rank(sim, 0, nnodes=3)
        terminal = shell_env(sim, 0, "env -i " + shlex.join(f"{k}={v}" for k, v in server_env.items()) + " bash -ic 'env -0'")
        assert {k: terminal.get(k) for k in RANK_KEYS} == expected_rank(sim, 0, nnodes=3)
    finally:
        swap_count(sim, 2)
        wait_until(lambda: rank_env(sim, 0).get("NNODES") == "2", 40, lambda: log(sim, 0))
    assert sim.pods[0].path(hostfile_of(sim)).read_text() == naming.hostfile(sim.app, sim.namespace, 2, gpus)
    assert calls(sim, 0) == servers_before and sim.pods[0].pid == pid1
    assert {name: sim.pods[0].path(f"{STUBS}/{name}.pid").read_text() for name in SERVERS} == pids
    out = log(sim, 0)
    assert out.count("cluster.env changed") == 2 and "NODE_RANK=0 of NNODES=3" in out


def test_home_is_persistent_per_pod_and_shells_see_the_rank(sim: PodSim) -> None:
    """HOME (rendered: /workspace/.home/<pod>) keeps the servers' caches; login shells (ssh, `bash -l`),
    interactive shells (IDE terminals) and `oc rsh`'s /bin/sh ($ENV, rendered) see rank.env; what a user put in
    HOME survives a container restart. Runs last on the module's pods (it restarts pod 0)."""
    pod = sim.pods[0]
    home = f"{WORKSPACE}/.home/{pod.name}"
    assert pod.env["HOME"] == home
    assert pod.path(home).is_dir() and (pod.path(home).stat().st_mode & 0o777) == 0o700
    server_env = recorded_env(sim, 0, "code-server")
    assert server_env["HOME"] == home
    for key in (
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "PIP_CACHE_DIR",
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_DATA_DIR",
        "HISTFILE",
    ):
        assert server_env[key].startswith(f"{home}/"), key
    args = next(line for line in calls(sim, 0) if line.startswith("code-server"))
    assert f"--user-data-dir {home}/.local/share/code-server --extensions-dir {home}/.local/share/code-server/extensions" in args

    for cmd in ("bash -lc 'env -0'", "bash -ic 'env -0'", "sh -ic 'env -0'"):
        seen = shell_env(sim, 0, f"cd / && exec {cmd}")
        assert (seen.get("NODE_RANK"), seen.get("WORLD_SIZE"), seen.get("MASTER_ADDR")) == (
            "0",
            expected_rank(sim, 0)["WORLD_SIZE"],
            naming.pod_dns(sim.app, sim.namespace, 0),
        ), cmd
        assert seen["HOME"] == home and f"{home}/.local/bin" in seen["PATH"].split(":"), cmd

    sim.write(0, f"{home}/.local/lib/installed-with-pip-user", "kept")
    sim.restart(0)
    assert pod.path(f"{home}/.local/lib/installed-with-pip-user").read_text() == "kept"
    for rc in (".bashrc", ".profile"):
        assert sum("ml-dev-env: rank.env" in line for line in pod.path(f"{home}/{rc}").read_text().splitlines()) == 1, rc
    assert rank_env(sim, 0) == expected_rank(sim, 0)


# ------------------------------------------------------------------------------------------------- variants


def test_pod_outside_the_count_waits_for_the_configmap(started: Callable[..., PodSim]) -> None:
    """A scale-up pod started before the cluster ConfigMap says so (replicas 3, NNODES=2): it warns, turns Ready
    without a rank, and takes rank 2 when the kubelet swaps in NNODES=3."""
    s = started(render_stack("nerc-production"), count=3)
    assert not s.pods[2].path(f"{STATE}/rank.env").exists()
    swap_count(s, 3)
    wait_until(lambda: s.pods[2].path(f"{STATE}/rank.env").exists() and rank_env(s, 2).get("NODE_RANK") == "2", 40, lambda: log(s, 2))
    assert f"WARNING: pod {s.pods[2].name} is not one of the NNODES=2 pods" in log(s, 2)
    assert rank_env(s, 2) == expected_rank(s, 2, nnodes=3)


def token_auth(objects: dict[str, Any]) -> None:
    # tensorboard has no login of its own: off under auth 'token' (stacks/config.py AccessConfig)
    objects["access"] = {**objects["access"], "vscode": True, "jupyter": True, "tensorboard": False, "auth": "token"}


def token_secrets(sim_result: Any) -> dict[str, dict[str, str]]:
    """env name -> (Secret, key) for the token-mode secrets of the rendered main container."""
    sts = next(r.inputs for r in sim_result.resources if r.kind == "StatefulSet")
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in (e.get("valueFrom") or {})}


def test_token_mode_binds_the_pod_ip_with_auth(started: Callable[..., PodSim]) -> None:
    result = render_stack("nerc-production", token_auth)
    refs = token_secrets(result)
    assert {"PASSWORD", "JUPYTER_TOKEN"} <= set(refs), refs
    s = started(result, count=2, secrets={refs["JUPYTER_TOKEN"]["name"]: {refs["JUPYTER_TOKEN"]["key"]: "tok"}})
    wait_until(lambda: len(calls(s, 0)) >= 2, 30, lambda: log(s, 0))
    servers = {line.split()[0]: line for line in calls(s, 0)}
    assert set(servers) == {"code-server", "jupyter"}
    # the servers listen on loopback; forward.py on the pod IP, bound to the interface that holds it (never net1..N)
    assert "--bind-addr 127.0.0.1:8080 --auth password" in servers["code-server"]
    assert "--ip=127.0.0.1 " in servers["jupyter"] and "--IdentityProvider.token=tok" in servers["jupyter"]
    assert "--ServerApp.allow_remote_access=True" in servers["jupyter"]
    ip = s.pods[0].ip

    def forwarded() -> set[str]:
        out = subprocess.run(["ip", "netns", "exec", s.pods[0].netns, "ss", "-ltnpH"], capture_output=True, text=True, timeout=30)
        return {line.split()[3] for line in out.stdout.splitlines() if "forward.py" in line or "python3" in line}

    wait_until(lambda: {f"{ip}%eth0:8080", f"{ip}%eth0:8888"} <= forwarded(), 30, lambda: log(s, 0))
    # a connection from the other pod to the pod IP reaches the server on loopback
    server = s.popen(0, ["python3", "-c", ECHO, "8888"])
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        got = s.exec(1, ["python3", "-c", ASK, ip, "8888"], timeout=30)
        assert got.stdout.strip() == "jupyter on loopback", got.stdout + got.stderr
    finally:
        s.interrupt(server, signal.SIGKILL)
        server.wait(timeout=30)
    assert recorded_env(s, 0, "code-server")["PASSWORD"] == s.secrets[refs["PASSWORD"]["name"]][refs["PASSWORD"]["key"]]


def test_token_mode_with_an_empty_password_fails_fast_and_leaves_nothing(started: Callable[..., PodSim]) -> None:
    """The stack's Secret holds an empty vscodePassword: PID 1 exits non-zero at once, naming it; the pod's PID
    namespace is empty afterwards (nothing it started, e.g. sshd or a `sleep`, outlives it)."""
    result = render_stack("nerc-production", token_auth)
    refs = token_secrets(result)
    s = started(result, wait=False, secrets={refs["PASSWORD"]["name"]: {refs["PASSWORD"]["key"]: ""}})
    proc = s.pods[0].proc
    assert proc is not None
    with held_pid_namespaces([s.pods[0].pid]) as (pid_ns,):
        proc.wait(timeout=60)
        assert proc.returncode != 0 and "token mode needs PASSWORD" in log(s, 0), log(s, 0)
        assert not pids_in_namespace_of(pid_ns)


def test_auto_hca_detection_drops_the_header(started: Callable[..., PodSim]) -> None:
    """barcelona with hcaMode auto (no NCCL_IB_HCA rendered): the node's `ibv_devinfo -l` header is dropped."""

    def auto(objects: dict[str, Any]) -> None:
        objects["network"]["rdma"] = {**objects["network"]["rdma"], "hcaMode": "auto", "hcas": []}

    result = render_stack("barcelona", auto)
    sts = next(r.inputs for r in result.resources if r.kind == "StatefulSet")
    assert "NCCL_IB_HCA" not in {e["name"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    node = Node(overrides={0: {"hcas": ["mlx5_7", "mlx5_6", "mlx5_9", "mlx5_8"]}})
    s = started(result, node=node)
    assert "NCCL_IB_HCA auto-detected: mlx5_6,mlx5_7,mlx5_8,mlx5_9" in log(s, 0)
    assert sourced(s, 0, f"{STATE}/rank.env")["NCCL_IB_HCA"] == "mlx5_6,mlx5_7,mlx5_8,mlx5_9"
    assert "HCAs found" not in s.pods[0].path(f"{STATE}/env.sh").read_text()


def test_refused_memlock_cannot_kill_the_pod(started: Callable[..., PodSim]) -> None:
    """memlock 'scc' with an SCC that does not add SYS_RESOURCE (nor IPC_LOCK): `ulimit -l unlimited` fails
    against the runtime's 8 MiB hard limit, the pod still turns Ready."""

    def no_resource(objects: dict[str, Any]) -> None:
        objects["security"]["memlock"]["capabilities"] = ["SYS_CHROOT"]

    s = started(render_stack("barcelona", no_resource))
    assert "SYS_RESOURCE" not in s.identity.capabilities
    out = log(s, 0)
    assert "WARNING: could not raise memlock (now 8192 KiB)" in out and "[ml-dev-env] ready" in out


def unwritable_warnings(pod: str) -> list[str]:
    app = pod.rpartition("-")[0]
    warnings = [
        f"WARNING: cannot write {WORKSPACE}/.deepspeed/{app}/hostfile",
        f"WARNING: cannot create or write HOME {WORKSPACE}/.home/{pod}",
    ]
    if pod.endswith("-0"):
        warnings.append(f"WARNING: cannot create {WORKSPACE}/tensorboard")
    return warnings


def test_random_uid_with_read_only_workspace_reaches_ready(started: Callable[..., PodSim]) -> None:
    """nerc-production (restricted-v2: a UID of the namespace range, GID 0) on a workspace volume owned by someone
    else (NFS, root:root 0755): every use of the workspace degrades with a warning, both pods turn Ready with their
    rank, HOME falls back to the state dir, pod 0 still starts its servers."""

    def foreign_workspace(s: PodSim) -> None:
        for i in range(s.count):
            d = s.volume_dir(i, WORKSPACE)
            d.mkdir(parents=True, exist_ok=True)  # a shared claim: one directory for both pods
            d.chmod(0o755)  # root-owned, no fsGroup ownership change (the volume is someone else's)

    s = started(render_stack("nerc-production"), count=2, prepare=foreign_workspace)
    assert s.identity.scc == "restricted-v2" and s.identity.uid != 0
    wait_until(lambda: len(calls(s, 0)) >= 3, 30, lambda: log(s, 0))
    for i, pod in enumerate(s.pods):
        out = log(s, i)
        for warning in unwritable_warnings(pod.name):
            assert warning in out, (warning, out)
        assert rank_env(s, i) == expected_rank(s, i, hostfile=f"{STATE}/hostfile")
        assert pod.path(STATE).stat().st_uid == s.identity.uid and pod.path(f"{STATE}/home").is_dir()
        assert sourced(s, i, f"{STATE}/env.sh")["HOME"] == f"{STATE}/home"
    assert sorted(line.split()[0] for line in calls(s, 0)) == sorted(SERVERS)
    assert calls(s, 1) == []
