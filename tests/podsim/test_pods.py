"""Two pods of each committed stack, started from the render (tests/podsim): the dev loop works there.

Each test here failed on the main of before issue 22 (no sshd: sshd.sh read APP_NAME/HEADLESS_SERVICE from an env
the render never gives; remote ranks got pod 0's `..<timestamp>` path; a launch-time variable reached rank 0 only;
short names did not resolve between pods; root's sshd died without SETUID/SETGID on barcelona).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.podsim.pods import (
    BASHRC_HOOK,
    CAPABILITY_BITS,
    MEMLOCK_LIMITS,
    PREFIX,
    REPO,
    SERVICE_ACCOUNT,
    PodSim,
    capability_mask,
    held_pid_namespaces,
    image_env,
    leftovers,
    missing_requirements,
    pids_in_namespace_of,
    render_stack,
)
from tests.podsim.render import service_links

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]

# What a running container has beyond its rendered env: the runtime's HOSTNAME, the kubelet's service links of
# the default `kubernetes` Service (envvars.go FromServices), the image's ENV (images/base.Containerfile) and the
# device plugins' variables for the extended resources it requests (read from the rendered limits below).
PLATFORM_ENV = {
    "HOSTNAME",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "KUBERNETES_SERVICE_PORT_HTTPS",
    "KUBERNETES_PORT",
    "KUBERNETES_PORT_443_TCP",
    "KUBERNETES_PORT_443_TCP_PROTO",
    "KUBERNETES_PORT_443_TCP_PORT",
    "KUBERNETES_PORT_443_TCP_ADDR",
}
# Mounts every container has besides its volumeMounts: the image root, /proc, /sys, the runtime's /dev
# (OCI default devices, devpts, mqueue), the kubelet's /etc/hosts, /etc/resolv.conf, /etc/hostname and the
# service-account token; /tmp, /var/tmp and /run are the image's empty directories (tmpfs here).
PLATFORM_MOUNTS = {
    "/",
    "/proc",
    "/sys",
    "/dev",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/pts",
    "/dev/mqueue",
    "/tmp",
    "/var/tmp",
    "/run",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/hostname",
    SERVICE_ACCOUNT,
}


render = render_stack


@pytest.fixture(scope="module", params=["barcelona", "nerc-production"])
def sim(request: pytest.FixtureRequest) -> Iterator[PodSim]:
    before = set(leftovers())
    s = PodSim(render(request.param), count=2)
    try:
        s.start()
        yield s
    finally:
        with held_pid_namespaces(p.pid for p in s.pods if p.pid) as pid_ns:
            s.stop()
            mine = [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]  # other runs have their own
            assert not mine, f"left behind: {mine}"
            assert not [pid for ns in pid_ns for pid in pids_in_namespace_of(ns)], "processes left in a pod's PID namespace"


def rendered_main(s: PodSim) -> dict[str, Any]:
    """An independent reading of the rendered StatefulSet: the first container of the pod template."""
    return s.statefulset["spec"]["template"]["spec"]["containers"][0]


def test_environ_and_mounts_are_the_rendered_ones(sim: PodSim) -> None:
    main = rendered_main(sim)
    rendered_env = {e["name"]: e for e in main["env"]}
    limits = main["resources"]["limits"]
    device_plugins = {f"PCIDEVICE_OPENSHIFT_IO_{r.split('/')[1].upper()}" for r in limits if r.startswith("openshift.io/")}
    device_plugins |= {"NVIDIA_VISIBLE_DEVICES"} if "nvidia.com/gpu" in limits else set()
    links = service_links(sim.resources, sim.pod_spec)  # the kubelet's service links (enableServiceLinks)
    assert links or sim.pod_spec.get("enableServiceLinks") is False
    allowed = set(rendered_env) | PLATFORM_ENV | set(image_env()) | device_plugins | set(links)
    for pod in sim.pods:
        raw = Path(f"/proc/{pod.pid}/environ").read_bytes().split(b"\0")
        environ = dict(item.decode().split("=", 1) for item in raw if item)
        assert set(environ) <= allowed, f"{pod.name}: not rendered, not platform: {sorted(set(environ) - allowed)}"
        assert set(rendered_env) <= set(environ)
        for name, item in rendered_env.items():
            if "value" in item and "$(" not in item["value"]:
                assert environ[name] == item["value"], name
        assert environ["POD_NAME"] == environ["HOSTNAME"] == pod.name and environ["POD_IP"] == pod.ip
        assert environ["POD_NAMESPACE"] == sim.statefulset["metadata"]["namespace"]
        assert environ["HOME"] == f"/workspace/.home/{pod.name}" == environ["ML_DEV_HOME"]
        # mounts: the rendered volumeMounts (read-only where rendered) and the platform's, nothing else
        mounts = {}
        for line in Path(f"/proc/{pod.pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            mounts[fields[4]] = "ro" in fields[5].split(",")
        want = {m["mountPath"]: bool(m.get("readOnly")) for m in main["volumeMounts"]}
        assert set(mounts) == set(want) | PLATFORM_MOUNTS, f"{pod.name}: {sorted(set(mounts) ^ (set(want) | PLATFORM_MOUNTS))}"
        for path, ro in want.items():
            assert mounts[path] == ro, path
        cmdline = Path(f"/proc/{pod.pid}/cmdline").read_bytes().split(b"\0")[:-1]
        assert [a.decode() for a in cmdline] == main["command"] + main.get("args", [])


def test_kubelet_files_and_dns(sim: PodSim) -> None:
    ns = sim.namespace
    for pod in sim.pods:
        hosts = sim.exec(pod.index, "cat /etc/hosts; cat /etc/resolv.conf; readlink /opt/ml-dev-env/..data", timeout=30).stdout
        assert re.search(rf"^{re.escape(pod.ip)}\t{pod.name}\.{sim.headless}\.{ns}\.svc\.cluster\.local\t{pod.name}$", hosts, re.M)
        other = sim.pods[1 - pod.index]
        assert other.name not in hosts  # the kubelet writes only the pod itself
        assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in hosts and "options ndots:5" in hosts
    stamps = {sim.exec(i, "readlink /opt/ml-dev-env/..data", timeout=30).stdout.strip() for i in (0, 1)}
    assert len(stamps) == 2 and all(s.startswith("..20") for s in stamps)  # a different ..<timestamp> per pod
    res = sim.exec(
        0, f"getent hosts {sim.pods[1].name}.{sim.headless}; getent hosts {sim.pods[1].name} || echo short-unresolved", timeout=30
    )
    assert res.stdout.split()[0] == sim.pods[1].ip and "short-unresolved" in res.stdout


def test_sshd_up_on_every_pod(sim: PodSim) -> None:
    for pod in sim.pods:
        assert sim.probe(pod.index)
        res = sim.exec(pod.index, 'kill -0 "$(cat /tmp/ml-dev-env/ssh/sshd.pid)" && test -f /tmp/ml-dev-env/ssh/wanted', timeout=30)
        assert res.returncode == 0, sim.sshd_log(pod.index)


def test_exec_hostname_reaches_both_pods(sim: PodSim) -> None:
    res = sim.exec(0, "ml-dev exec -- hostname", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr + sim.sshd_log(1)
    assert sorted(res.stdout.split()) == sorted(["[0]", "[1]", *(p.name for p in sim.pods)])


def test_run_sees_each_rank_and_a_launch_time_variable(sim: PodSim) -> None:
    cmd = "mkdir -p /workspace/proj && cd /workspace/proj && MYVAR=hello ml-dev run -- sh -c 'echo rank=$NODE_RANK var=$MYVAR'"
    res = sim.exec(0, cmd, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[0] rank=0 var=hello" in res.stdout and "[1] rank=1 var=hello" in res.stdout, res.stdout


def test_ssh_and_pdsh_by_short_name_from_pod_0(sim: PodSim) -> None:
    other = sim.pods[1].name
    res = sim.exec(0, f"ssh -o BatchMode=yes {other} hostname", timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == other, res.stderr
    names = " ".join(p.name for p in sim.pods)
    res = sim.exec(0, f"pdsh -R ssh -w {','.join(names.split())} hostname", timeout=60)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == sorted(f"{n}: {n}" for n in names.split())


def test_preflight_all_starts_on_every_pod(sim: PodSim) -> None:
    res = sim.exec(0, "python3 /opt/ml-dev-env/fabric_check.py preflight --all", timeout=180)
    out = res.stdout + res.stderr
    assert "can't open file" not in out and "..20" not in out, out
    for pod in sim.pods:  # each pod ran its own preflight and reported (what it finds is this machine's hardware)
        assert re.search(rf"^preflight {pod.name}: ", out, re.M), out


def test_a_data_swap_while_running_breaks_nothing(sim: PodSim) -> None:
    before = sim.exec(1, "readlink /opt/ml-dev-env/..data", timeout=30).stdout.strip()
    sim.swap_configmap(next(n for n in sim.configmaps if n.endswith("-startup")))
    sim.swap_configmap(next(n for n in sim.configmaps if n.endswith("-cluster")))
    after = sim.exec(1, "readlink /opt/ml-dev-env/..data; ls -a /opt/ml-dev-env", timeout=30).stdout
    assert after.split()[0] != before and before not in after.split()[1:]  # the old directory is gone
    res = sim.exec(0, "ml-dev exec -- hostname", timeout=120)
    assert res.returncode == 0 and sorted(res.stdout.split())[-1] == sim.pods[1].name, res.stdout + res.stderr
    assert all(sim.probe(p.index) for p in sim.pods)


def test_capabilities_are_what_admission_gives(sim: PodSim) -> None:
    status = Path(f"/proc/{sim.pods[1].pid}/status").read_text()
    caps = capability_mask(status)
    assert caps == set(sim.identity.capabilities) & set(CAPABILITY_BITS)
    uid_line = re.search(r"^Uid:\s+(\d+)", status, re.M)
    assert uid_line, f"/proc/<pid>/status has a Uid line: {status!r}"
    uid = int(uid_line.group(1))
    assert uid == sim.identity.uid
    if sim.identity.scc == "restricted-v2":
        assert caps == set() and "NoNewPrivs:\t1" in status and uid >= 1000000000
    else:
        # barcelona's own SCC: required drops KILL and MKNOD leave root's sshd SETUID/SETGID (and SYS_CHROOT)
        assert {"SETUID", "SETGID", "SYS_CHROOT"} <= caps and not {"KILL", "MKNOD"} & caps and uid == 0


def test_a_laptop_key_logs_in_to_a_pod_ip(sim: PodSim, tmp_path: Path) -> None:
    """ssh from inside the test's own network namespace (the pod network) with the user's key: the pod's sshd
    accepts with the capabilities admission gives (root on barcelona, the namespace UID on nerc-production)."""
    pod = sim.pods[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{pod.ip}]:2222 {sim.host_pub}\n")
    user = "root" if sim.identity.uid == 0 else "ml-dev"
    argv = ["nsenter", f"--net=/run/netns/{sim.pods[0].netns}", "ssh", "-F", "none", "-p", "2222", "-i", str(sim.keys / "user")]
    argv += ["-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={known}", "-o", "BatchMode=yes", f"{user}@{pod.ip}", "id -u; hostname"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout.split() == [str(sim.identity.uid), pod.name], res.stderr + sim.sshd_log(1)
    # a key the stack does not know is refused, also when password or keyboard-interactive is asked for
    for extra in ([], ["-o", "PreferredAuthentications=password,keyboard-interactive"]):
        stranger = [*argv[:8], str(sim.keys / "stranger"), *extra, *argv[9:]]
        refused = subprocess.run(stranger, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr, refused.stderr


def default_capabilities(objects: dict[str, Any]) -> None:
    """barcelona's memlock as a newcomer writes it: the stack's own SCC, the default capabilities (no SYS_CHROOT)."""
    objects["security"]["memlock"].pop("capabilities", None)


def test_the_stacks_own_scc_with_default_capabilities_gives_ssh_between_pods() -> None:
    """createScc with the default capabilities (IPC_LOCK, SYS_RESOURCE): the SCC the stack writes allows what its pods
    add, SYS_CHROOT for root's sshd included, admission admits them (tests/podsim/admission.py: defaults + add - drops),
    and rank 0 reaches rank 1 over SSH. On the code before issue 52 the pods lacked SYS_CHROOT: no sshd, not Ready."""
    result = render("barcelona", default_capabilities)
    assert not [w for w in result.warnings if "SYS_CHROOT" in w]
    before = set(leftovers())
    s = PodSim(result, count=2)
    try:
        assert "SYS_CHROOT" in s.identity.capabilities and s.identity.uid == 0
        s.start()
        res = s.exec(0, "ml-dev exec -- hostname", timeout=120)
        want = [f"[{p.index}] {p.name}" for p in s.pods]  # rank 1 answers through its sshd
        assert res.returncode == 0 and res.stdout.splitlines() == want, res.stdout + res.stderr + s.sshd_log(1)
    finally:
        s.stop()
        assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


def admins_scc(result: Any, allowed: list[str]) -> Any:
    """`result` with an SCC the admin made (createScc false): `nccl-rdma-scc` allowing `allowed`, usable through
    OpenShift's per-SCC ClusterRole the stack's RoleBinding names, required drops as the stack's own would have."""
    name = "nccl-rdma-scc"
    scc: dict[str, Any] = {"metadata": {"name": name}, "allowedCapabilities": allowed, "requiredDropCapabilities": ["KILL", "MKNOD"]}
    scc |= {"runAsUser": {"type": "RunAsAny"}, "allowPrivilegeEscalation": True}
    role = {"metadata": {"name": f"system:openshift:scc:{name}"}, "rules": [{"verbs": ["use"], "resourceNames": [name]}]}
    extra = [SimpleNamespace(kind="SecurityContextConstraints", inputs=scc), SimpleNamespace(kind="ClusterRole", inputs=role)]
    return SimpleNamespace(resources=[*result.resources, *extra])


def test_an_admins_scc_without_sys_chroot_warns_and_the_pod_says_what_to_configure() -> None:
    """An admin's SCC (createScc false) and capabilities without SYS_CHROOT: the render warns with the `oc` commands
    that fix it; root's sshd cannot run, the pod is not Ready and its log says the same."""

    def admins(objects: dict[str, Any]) -> None:
        default_capabilities(objects)
        objects["security"]["memlock"]["createScc"] = False

    result = render("barcelona", admins)
    warned = [w for w in result.warnings if "SYS_CHROOT" in w]
    assert len(warned) == 1 and "oc patch scc nccl-rdma-scc" in warned[0] and "oc get scc nccl-rdma-scc" in warned[0], warned
    s = PodSim(admins_scc(result, ["IPC_LOCK", "SYS_RESOURCE"]), count=1)
    try:
        assert s.identity.scc == "nccl-rdma-scc" and "SYS_CHROOT" not in s.identity.capabilities
        s.start(wait=False)
        deadline = time.monotonic() + 30
        while "add SYS_CHROOT to ml-dev-env:security.memlock.capabilities" not in s.sshd_log(0):
            assert time.monotonic() < deadline, s.sshd_log(0)
            time.sleep(0.2)
        assert not s.probe(0)
    finally:
        s.stop()


def on_deploy_and_idle_stop(objects: dict[str, Any]) -> None:
    objects["fabricCheck"] = {**objects.get("fabricCheck", {}), "onDeploy": True}
    objects["lifecycle"] = {**objects.get("lifecycle", {}), "idleStop": {"enabled": True}}


def test_on_deploy_holds_pod_0_with_the_idle_agent_running_until_released() -> None:
    """Variant of barcelona with fabricCheck.onDeploy and lifecycle.idleStop: the gate cannot pass here (no GPUs),
    so pod 0 holds and is not Ready, its idle agent runs anyway; `fabric_check.py release` lets it turn Ready."""
    before = set(leftovers())
    s = PodSim(render("barcelona", on_deploy_and_idle_stop), count=2)
    try:
        s.start(wait=False)
        s.wait_ready(1, timeout=90)
        assert not s.probe(0)
        agents = s.exec(0, "pgrep -f idle_agent.py; pgrep -f 'fabric_check.py hold'", timeout=30)
        assert len(agents.stdout.split()) >= 2, agents.stdout + s.pods[0].log.read_text()
        released = s.exec(0, "python3 /opt/ml-dev-env/fabric_check.py release", timeout=30)
        assert released.returncode == 0, released.stderr
        s.wait_ready(0, timeout=90)
        assert s.terminate(1, grace=10) == "exited"  # startup.sh stops its children on SIGTERM
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


def test_a_count_change_in_the_cluster_configmap_rewrites_rank_env_in_place(sim: PodSim) -> None:
    """The kubelet swaps cluster.env's ..data; every startup script (polling every ML_DEV_POLL_SECONDS, 2 s by
    default) rewrites rank.env without a restart, and the launcher follows."""
    name = next(n for n in sim.configmaps if n.endswith("-cluster"))
    before = dict(sim.configmaps[name])
    pid1 = [p.pid for p in sim.pods]
    try:
        sim.swap_configmap(name, {"cluster.env": before["cluster.env"].replace("NNODES=2", "NNODES=1")})
        deadline = time.monotonic() + 40
        while "NNODES='1'" not in sim.exec(0, "cat /tmp/ml-dev-env/rank.env", timeout=30).stdout:
            assert time.monotonic() < deadline, sim.pods[0].log.read_text()
            time.sleep(0.5)
        res = sim.exec(0, "ml-dev exec -- hostname", timeout=120)
        assert res.returncode == 0 and res.stdout.split() == ["[0]", sim.pods[0].name], res.stdout + res.stderr
    finally:
        sim.swap_configmap(name, before)
        deadline = time.monotonic() + 40
        while "NNODES='2'" not in sim.exec(0, "cat /tmp/ml-dev-env/rank.env", timeout=30).stdout and time.monotonic() < deadline:
            time.sleep(0.5)
    assert [p.pid for p in sim.pods] == pid1 and all(p.proc and p.proc.poll() is None for p in sim.pods)


def test_termination_stops_every_process_of_the_pod() -> None:
    """The kubelet's kill on a worker: SIGTERM to PID 1 (startup.sh), which stops sshd, the idle agent and itself
    within the grace period; nothing of the pod is left."""
    s = PodSim(render("nerc-production"), count=2)
    try:
        s.start()
        with held_pid_namespaces([s.pods[1].pid]) as (pid_ns,):
            assert len(pids_in_namespace_of(pid_ns)) >= 3  # startup.sh, sshd, the idle agent at least
            assert s.terminate(1, grace=15) == "exited"
            deadline = time.monotonic() + 10
            while pids_in_namespace_of(pid_ns) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not pids_in_namespace_of(pid_ns)
    finally:
        s.stop()


def test_the_image_layout_is_the_containerfiles(sim: PodSim) -> None:
    """images/base.Containerfile's bash.bashrc hook, memlock limits.d file and ~/.local/bin are in every pod, and the
    hook gives an interactive bash without ~/.bashrc the rank values."""
    containerfile = (REPO / "images" / "base.Containerfile").read_text()
    assert f"'{BASHRC_HOOK}'" in containerfile and ">> /etc/bash.bashrc" in containerfile
    assert all(f"'{line}'" in containerfile for line in MEMLOCK_LIMITS) and "limits.d/99-ml-dev-env-memlock.conf" in containerfile
    assert "/home/ml-dev/.local/bin" in image_env()["PATH"].split(":")
    for pod in sim.pods:
        assert pod.path("/etc/bash.bashrc").read_text().splitlines()[-1] == BASHRC_HOOK
        assert pod.path("/etc/security/limits.d/99-ml-dev-env-memlock.conf").read_text().splitlines() == list(MEMLOCK_LIMITS)
        local_bin = pod.path("/home/ml-dev/.local/bin").stat()
        assert local_bin.st_gid == 0 and (local_bin.st_mode >> 3) & 7 == (local_bin.st_mode >> 6) & 7  # g=u
    res = sim.exec(1, "mkdir -p /tmp/no-dotfiles && HOME=/tmp/no-dotfiles bash -ic 'echo NODE_RANK=$NODE_RANK'", timeout=30)
    assert "NODE_RANK=1" in res.stdout.splitlines(), res.stdout + res.stderr


def test_oc_exec_runs_outside_pid_1s_tree_with_the_containers_env_limits_and_capabilities(sim: PodSim) -> None:
    script = "cat /proc/$$/status; echo LIMIT $(ulimit -l); echo CWD $(pwd); env"
    res = sim.exec(1, script, timeout=30)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"^PPid:\s+0$", out, re.M)  # its parent is outside the pod's PID namespace (runc exec)
    assert capability_mask(out) == set(sim.identity.capabilities) & set(CAPABILITY_BITS)
    assert "LIMIT 8192" in out and "CWD /workspace" in out  # the runtime's memlock, the image's WORKDIR
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith(("LIMIT", "CWD")))
    assert env["POD_NAME"] == sim.pods[1].name and env["HOME"] == f"/workspace/.home/{sim.pods[1].name}"
    assert "ML_DEV_STATE_DIR" in env and "APP_NAME" not in env


def test_nothing_is_routed_outside_the_simulations_namespaces(sim: PodSim) -> None:
    """The bridge namespace has no route off it: a pod's packet to any other address goes nowhere."""
    routes = subprocess.run(["ip", "-n", sim.cluster_ns, "route", "show", "default"], capture_output=True, text=True, timeout=30)
    assert routes.returncode == 0 and routes.stdout.strip() == ""
    res = sim.exec(0, "ip route get 192.0.2.1 2>&1; getent hosts example.org || echo unresolved", timeout=30)
    assert "via 10.128.0.1 dev eth0" in res.stdout and "unresolved" in res.stdout  # to the gateway, which drops it
    other = sim.exec(0, f"python3 -c \"import socket; socket.create_connection(('{sim.pods[1].ip}', 2222), 5); print('reached')\"")
    assert "reached" in other.stdout, other.stderr  # pods reach each other's IPs
