"""The dev loop as the stack renders it (no root needed): keys Secret, NetworkPolicy, pod wiring, outputs, config."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import inpod
from components import devloop
from core import naming
from stacks.config import SshConfig
from tests.conftest import run_objects, stack_objects, tcp_shared_variant
from tests.inpod import mount
from tools.mock_engine import MOCK_SSH_PUBLIC_KEY, RunResult

NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
SECRET = "kubernetes:core/v1:Secret"
STS = "kubernetes:apps/v1:StatefulSet"
CM = "kubernetes:core/v1:ConfigMap"
USER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDUxK0twHQP5AsKo46vFCC1SQXzGFDazoq+CmOtH86lL alice@laptop"


def render(stack: str, mutate: Any = None) -> RunResult:
    objects = stack_objects(stack)
    if mutate:
        mutate(objects)
    result = run_objects(stack, objects)
    assert result.error is None, result.error
    return result


@pytest.fixture(scope="module", params=["barcelona", "nerc-production"])
def stack(request: pytest.FixtureRequest) -> tuple[str, RunResult]:
    return request.param, render(request.param)


def pod_spec(result: RunResult) -> dict[str, Any]:
    return result.one(STS).inputs["spec"]["template"]["spec"]


def test_network_policy_admits_the_stacks_pods_everywhere_and_the_router_on_the_proxy_ports_only(stack: tuple[str, RunResult]) -> None:
    _, result = stack
    pol = result.one(NETPOL).inputs
    sts = result.one(STS).inputs
    selector = sts["spec"]["selector"]["matchLabels"]
    assert pol["metadata"]["name"] == naming.ssh_network_policy(sts["metadata"]["name"])
    assert pol["spec"]["podSelector"]["matchLabels"] == selector
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    own, router = pol["spec"]["ingress"]
    # no `ports`: every port and protocol (SSH, 29500, 9099, NCCL, perftest, ICMP) from the stack's pods
    assert own == {"from": [{"podSelector": {"matchLabels": selector}}]}
    # namespaceSelector only: OVN-Kubernetes admits a host-network router only for a nil podSelector
    assert router["from"] == [{"namespaceSelector": {"matchLabels": {devloop.ROUTER_NAMESPACE_LABEL: ""}}}]
    # the router reaches the OAuth proxies' container ports, nothing else (read from the rendered pod)
    proxies = [c for c in pod_spec(result)["containers"] if c["name"] != naming.MAIN_CONTAINER]
    assert proxies, "the stacks use auth oauth-proxy"
    expected = sorted(p["containerPort"] for c in proxies for p in c["ports"])
    assert sorted(p["port"] for p in router["ports"]) == expected
    assert all(p["protocol"] == "TCP" and "endPort" not in p for p in router["ports"])
    assert not {2222, naming.MASTER_PORT, naming.DEBUG_PORT, 9099} & {p["port"] for p in router["ports"]}


def test_keys_secret_is_mounted_into_the_stacks_pods_only(stack: tuple[str, RunResult]) -> None:
    _, result = stack
    secret = result.one(SECRET, "-ssh-secret").inputs
    assert set(secret["stringData"]) == {"host_ed25519_key", "host_ed25519_key.pub", "id_ed25519", "id_ed25519.pub", "authorized_keys"}
    assert "mock-openssh-private-key" not in str(secret)  # secrets stay secrets (redacted in the recording)
    name = secret["metadata"]["name"]
    users = []
    for rec in result.resources:
        spec = rec.inputs.get("spec", {})
        template = spec.get("template", {}).get("spec") if isinstance(spec, dict) else None
        if template and any(v.get("secret", {}).get("secretName") == name for v in template.get("volumes", [])):
            users.append(rec.name)
    assert users == ["gpu-statefulset"]
    spec = pod_spec(result)
    volume = next(v for v in spec["volumes"] if v["name"] == "ssh-keys")
    assert volume["secret"] == {"secretName": name, "defaultMode": 0o440}
    main = next(c for c in spec["containers"] if c["name"] == "ml-dev")
    assert {"name": "ssh-keys", "mountPath": devloop.SECRET_MOUNT, "readOnly": True} in main["volumeMounts"]
    # only the main container (where sshd runs) sees the keys, never the proxy sidecars
    assert all("ssh-keys" not in str(c.get("volumeMounts")) for c in spec["containers"] if c["name"] != "ml-dev")
    annotations = result.one(STS).inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotations[devloop.ANNOTATION_SSH_PORT] == "2222"
    assert len(annotations[devloop.ANNOTATION_HASH]) == 16


def test_the_dev_loop_parts_of_the_pod_template_do_not_depend_on_the_pod_count() -> None:
    """The rank contract: the pod template is the same for N and N+1 pods (the dev loop adds nothing count-dependent)."""

    def grow(objects: dict[str, Any]) -> None:
        objects["nodes"]["count"] += 1

    def parts(result: RunResult) -> tuple[Any, ...]:
        template = result.one(STS).inputs["spec"]["template"]
        main = next(c for c in template["spec"]["containers"] if c["name"] == "ml-dev")
        data = result.one(CM, "-startup").inputs["data"]
        return (
            {k: v for k, v in template["metadata"]["annotations"].items() if k in (devloop.ANNOTATION_SSH_PORT, devloop.ANNOTATION_HASH)},
            [v for v in template["spec"]["volumes"] if v["name"] == "ssh-keys"],
            [m for m in main["volumeMounts"] if m["name"] == "ssh-keys"],
            {k: v for k, v in data.items() if k != "startup.sh"},
            result.one(NETPOL).inputs["spec"],
        )

    for stack in ("barcelona", "nerc-production"):
        assert parts(render(stack)) == parts(render(stack, grow)), stack


def test_keys_are_ed25519_from_pulumi_tls_kept_in_state(stack: tuple[str, RunResult]) -> None:
    _, result = stack
    keys = result.of_type("tls:index/privateKey:PrivateKey")
    assert sorted(k.name for k in keys) == ["gpu-ssh-client-key", "gpu-ssh-host-key"]
    assert all(k.inputs["algorithm"] == "ED25519" for k in keys)


def test_startup_configmap_carries_the_launcher_and_sshd(stack: tuple[str, RunResult]) -> None:
    _, result = stack
    data = result.one(CM, "-startup").inputs["data"]
    assert {"startup.sh", "sshd.sh", "ssh-session.sh", "ml-dev", "devloop.env"} <= set(data)
    assert data["ml-dev"] == inpod.path("ml-dev").read_text()
    assert 'bash "$SCRIPT_DIR/sshd.sh"' in data["startup.sh"]


def test_outputs_give_laptops_ssh_shells_and_debugger_ports() -> None:
    result = render("barcelona")
    out = result.outputs
    cfg = out["ssh_config"]
    for i in range(2):
        # nerc-production's pods are ml-dev-env-<i> too: the alias names the cluster and the environment
        assert f"Host barcelona-ml-dev-env-{i}\n    HostName barcelona-ml-dev-env-{i}\n" in cfg
        assert f"ProxyCommand oc exec -i -n nccl-test -c ml-dev ml-dev-env-{i} -- /bin/bash /opt/ml-dev-env/sshd.sh --inetd" in cfg
    assert "User root" in cfg  # barcelona: RDMA with an SCC runs as UID 0 (keys only)
    assert "Route" not in cfg and "NodePort" not in cfg
    assert out["ssh_known_hosts"] == f"barcelona-ml-dev-env-0,barcelona-ml-dev-env-1 {MOCK_SSH_PUBLIC_KEY}\n"
    assert out["shell_commands"]["ml-dev-env-1"] == "oc exec -it -n nccl-test -c ml-dev ml-dev-env-1 -- bash -l"
    assert out["port_forward_commands"]["ml-dev-env-1"] == "oc port-forward -n nccl-test pod/ml-dev-env-1 5678:5678"
    tcp = render("barcelona", tcp_shared_variant).outputs["ssh_config"]
    assert "User ml-dev" in tcp


def host_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Host ")]


def test_laptop_aliases_are_unique_per_cluster_and_environment_and_every_oc_names_the_context() -> None:
    """Every stack of the project on one laptop: no `Host` alias, known_hosts name or known_hosts file twice; the pod
    name stays an alias only where no other stack has that appName (an environment stack's `<app>-<env>`)."""
    outputs = {name: render(name).outputs for name in ("barcelona", "nerc-production", "barcelona-alice", "barcelona-bob")}
    aliases = [a for out in outputs.values() for line in host_lines(out["ssh_config"]) for a in line.split()[1:]]
    assert len(aliases) == len(set(aliases)), aliases
    nerc = ["Host nerc-production-ml-dev-env-0", "Host nerc-production-ml-dev-env-1"]
    assert host_lines(outputs["nerc-production"]["ssh_config"]) == nerc
    assert host_lines(outputs["barcelona-alice"]["ssh_config"]) == ["Host barcelona-alice-0 ml-dev-env-alice-0"]
    known = [n for out in outputs.values() for n in out["ssh_known_hosts"].split(" ", 1)[0].split(",")]
    assert sorted(known) == sorted(aliases)
    files = {line.split()[1] for out in outputs.values() for line in out["ssh_config"].splitlines() if "UserKnownHostsFile" in line}
    assert len(files) == len(outputs)
    # cluster.kubeContext: every printed oc (and tkn) command names it
    ctx = "admin/api-barcelona:6443"
    out = render("barcelona", lambda o: o["cluster"].update(kubeContext=ctx)).outputs
    printed = [
        *(line.split("ProxyCommand ", 1)[1] for line in out["ssh_config"].splitlines() if "ProxyCommand" in line),
        out["shell_command"],
        out["port_forward_command"],
        *out["shell_commands"].values(),
        *out["port_forward_commands"].values(),
        out["lifecycle"]["stop_record"],
        *(c for k in ("build_command", "build_logs_command") if k in out for c in out[k].split("; ")),
        *(v for run in out.get("model_runs", {}).values() for k, v in run.items() if k not in ("run", "namespace", "retry")),
    ]
    assert len(printed) >= 10 and all(c.startswith(("oc --context admin/api-barcelona:6443 ", "tkn --context ")) for c in printed), printed
    assert all(c.count(" oc ") == 0 for c in printed)


def test_user_keys_from_config_reach_authorized_keys() -> None:
    text = devloop.authorized_keys("ssh-ed25519 AAAAstack", [USER_KEY])
    assert text.splitlines() == ["ssh-ed25519 AAAAstack ml-dev-env-stack", USER_KEY]
    result = render("nerc-production", lambda o: o.update(ssh={"authorizedKeys": [USER_KEY]}))
    assert result.error is None


@pytest.mark.parametrize(
    "bad",
    [
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        "ssh-dss AAAAB3NzaC1kc3MAAACBAP",
        "ssh-ed25519",
        "ssh-ed25519 not base64!",
        "x",
        "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIDUxK0twHQP5AsKo46vFCC1SQXzGFDazoq+CmOtH86lL",
    ],
)
def test_a_bad_user_key_is_one_config_line(bad: str) -> None:
    objects = stack_objects("nerc-production")
    objects["ssh"] = {"authorizedKeys": [USER_KEY, bad]}
    result = run_objects("nerc-production", objects)
    assert result.error is not None
    lines = [ln.strip() for ln in str(result.error).splitlines() if "ssh.authorizedKeys" in ln]
    assert len(lines) == 1 and lines[0].startswith("- ml-dev-env:ssh.authorizedKeys[1]: got '")
    assert lines[0].endswith("; never a private key")
    assert SshConfig(authorized_keys=[USER_KEY]).authorized_keys == [USER_KEY]


def test_shared_paths_tell_the_launcher_when_not_to_sync() -> None:
    from stacks.config import StackConfig

    for stack, expected in (("barcelona", "/datasets"), ("nerc-production", None)):
        objects = stack_objects(stack)
        cfg = StackConfig.model_validate(objects)
        env = devloop.scripts(cfg)["devloop.env"]
        shared = devloop.shared_paths(cfg)
        assert f"ML_DEV_SHARED_PATHS={' '.join(shared)}" in env.replace("'", "")
        if expected:
            assert expected in shared


# --------------------------------------------------------------------------- launcher tree rules (pure)


def launcher() -> Any:
    """The launcher's tree rules: inpod/ml_dev/sync.py, shipped behind `ml-dev` (inpod.SHIPPED), imported as a module."""
    return importlib.import_module("inpod.ml_dev.sync")


@pytest.mark.parametrize(
    ("path", "pattern", "expected"),
    [
        ("a/b/c.pyc", "*.pyc", True),
        ("out/x", "out/", True),
        ("out", "out/", False),  # a file named like a directory pattern
        ("src/out/x", "out/", True),
        ("src/out/x", "/out/", False),
        ("data/raw/x.bin", "data/raw", True),
        ("src/data/raw/x", "data/raw", False),
        ("README.md", "*.pyc", False),
    ],
)
def test_ignore_patterns(path: str, pattern: str, expected: bool) -> None:
    assert launcher().ignored(path, [pattern]) is expected


def test_tree_hash_is_over_sorted_path_mode_and_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ml = launcher()
    monkeypatch.setattr(ml, "STATE_DIR", tmp_path / "state")
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("a\n")
    (root / "pkg" / "b.sh").write_text("b\n")
    (root / "pkg" / "b.sh").chmod(0o755)
    (root / "skip.log").write_text("x")
    (root / ".gitignore").write_text("*.log\n")
    files = ml.tree_files(root)
    assert files == [".gitignore", "a.py", "pkg/b.sh"]
    sha = {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in files}
    modes = {".gitignore": "100644", "a.py": "100644", "pkg/b.sh": "100755"}
    expected = hashlib.sha256("".join(f"{modes[p]} {sha[p]} {p}\n" for p in files).encode()).hexdigest()
    assert ml.tree_hash(root, files) == expected
    (root / "pkg" / "b.sh").chmod(0o644)  # a mode change is a change
    assert ml.tree_hash(root, files) != expected


def test_hash_cache_does_not_trust_a_racy_rewrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ml = launcher()
    monkeypatch.setattr(ml, "STATE_DIR", tmp_path / "state")
    root = tmp_path / "tree"
    root.mkdir()
    f = root / "v.txt"
    f.write_text("v1\n")
    first = ml.tree_hash(root, ["v.txt"])
    st = f.stat()
    f.write_text("v2\n")  # same size; force the same mtime, as a rewrite within one timestamp tick would
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ml.tree_hash(root, ["v.txt"]) != first


def test_launcher_runs_with_plain_python3_and_explains_outside_a_pod(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(mount.shipped() / "ml-dev"), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "ML_DEV_STATE_DIR": str(tmp_path)},
    )
    assert res.returncode == 1
    assert "rank.env has no ML_DEV_HOSTS: is this an ml-dev-env pod" in res.stderr


def test_the_stacks_own_scc_allows_what_its_pods_add_and_only_an_admins_scc_warns() -> None:
    """Default capabilities (IPC_LOCK, SYS_RESOURCE): with createScc the stack's SCC allows SYS_CHROOT and its pods add it
    (root's sshd), no warning; with an admin's SCC the pods cannot add what it may not allow: one warning, with the `oc`
    commands that check and fix the SCC."""

    def defaults(objects: dict[str, Any]) -> None:
        objects["security"]["memlock"].pop("capabilities")

    def admins(objects: dict[str, Any]) -> None:
        defaults(objects)
        objects["security"]["memlock"]["createScc"] = False

    own = render("barcelona", defaults)
    added = pod_spec(own)["containers"][0]["securityContext"]["capabilities"]["add"]
    assert added == ["IPC_LOCK", "SYS_RESOURCE", "SYS_CHROOT"]
    assert own.one("kubernetes:security.openshift.io/v1:SecurityContextConstraints").inputs["allowedCapabilities"] == added
    assert not any("SYS_CHROOT" in w for w in own.warnings + render("barcelona").warnings)
    theirs = render("barcelona", admins)
    assert "SYS_CHROOT" not in pod_spec(theirs)["containers"][0]["securityContext"]["capabilities"]["add"]
    warned = [w for w in theirs.warnings if "SYS_CHROOT" in w]
    assert len(warned) == 1, theirs.warnings
    assert "`oc get scc nccl-rdma-scc -o jsonpath='{.allowedCapabilities}'`" in warned[0]
    assert (
        """`oc patch scc nccl-rdma-scc --type=json -p '[{"op":"add","path":"/allowedCapabilities/-","value":"SYS_CHROOT"}]'`""" in warned[0]
    )
