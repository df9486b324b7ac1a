"""The pod contract (inpod/contract.py) holds from both sides: what the render gives the pods, and what
the shipped programs read and write."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import inpod
from components import lifecycle
from core.servers import DEV_SERVERS
from inpod import contract
from inpod.ml_dev import common as ml_dev_common
from stacks.config import StackConfig
from tests.conftest import ROOT, run_objects, stack_objects
from tools.mock_engine import RunResult


@pytest.fixture(scope="module", params=["barcelona", "nerc-production"])
def result(request: pytest.FixtureRequest) -> RunResult:
    res = run_objects(request.param, stack_objects(request.param), {"vscodePassword": "x", "jupyterToken": "y"})
    assert res.error is None, res.error
    return res


def _kv(text: str) -> list[str]:
    return [ln.split("=", 1)[0] for ln in text.splitlines() if "=" in ln and not ln.startswith("#")]


def test_render_side(result: RunResult) -> None:
    sts = next(r for r in result.resources if r.kind == "StatefulSet")
    main = next(c for c in sts.inputs["spec"]["template"]["spec"]["containers"] if c["name"] == "ml-dev")
    names = [e["name"] for e in main["env"]]
    assert names[: len(contract.CONTAINER_ENV)] == list(contract.CONTAINER_ENV)
    values = {e["name"]: e.get("value") for e in main["env"]}
    assert values[contract.STARTUP_DIR_ENV] == next(m["mountPath"] for m in main["volumeMounts"] if m["name"] == "startup")
    maps = {r.inputs["metadata"]["name"]: r.inputs.get("data", {}) for r in result.resources if r.kind == "ConfigMap"}
    assert _kv(next(d["cluster.env"] for d in maps.values() if "cluster.env" in d)) == list(contract.CLUSTER_ENV)
    assert _kv(next(d["devloop.env"] for d in maps.values() if "devloop.env" in d)) == list(contract.DEVLOOP_ENV)
    # nothing the programs read from the files is expected in the container env (the render never puts it there)
    assert not {"APP_NAME", "HEADLESS_SERVICE", "ML_DEV_SSH_PORT", "ML_DEV_SSH_USER"} & set(names)


def test_program_side() -> None:
    sshd = inpod.text("sshd.sh")
    read = set(re.findall(r"\$\(fact ([A-Z_]+) \"\$CLUSTER_FILE\"\)", sshd))
    assert read and read <= set(contract.CLUSTER_ENV)
    assert set(re.findall(r"\$\(fact ([A-Z_]+) \"\$HERE/devloop.env\"\)", sshd)) <= set(contract.DEVLOOP_ENV)
    startup = inpod.text("startup.sh")
    case = re.search(r"^\s+(NNODES\|[A-Z_|]+)\) printf -v", startup, re.M)
    assert case and case.group(1).split("|") == list(contract.CLUSTER_ENV)
    written = re.findall(r"printf 'export ([A-Z_]+)=%s\\n'", startup[startup.index("refresh_rank() {") :])
    assert [w for w in written if w != "NCCL_IB_HCA"] == list(contract.RANK_ENV)
    ml_dev = "".join(text for key, text in inpod.group("devloop").items() if key == "ml-dev" or key.startswith("inpod.ml_dev."))
    assert all(f"{k}" in ml_dev for k in ("ML_DEV_SHARED_PATHS", "ML_DEV_PER_POD_PATHS", contract.STARTUP_DIR_ENV))


@pytest.mark.parametrize("key", ["inpod.ml_dev.common.py", "inpod.fabric.util.py"])
def test_programs_hand_other_pods_the_mount_path(key: str) -> None:
    """The kubelet's ..<timestamp> directory behind the mount differs per pod: never resolve() our own path.
    (The fabric check's modules hand the path on through inpod.fabric.util.PROGRAM, ml-dev's through inpod.ml_dev.common.HERE.)"""
    text = inpod.text(key)
    assert contract.STARTUP_DIR_ENV in text
    python = [k for g in ("fabric", "devloop") for k in inpod.group(g) if k.endswith(".py") or k == "ml-dev"]
    for other in [key, *python]:
        assert not re.search(r"Path\(__file__\)\.resolve\(\)", inpod.text(other)), other


# ------------------------------------------------------------------------------------------ one contract, no copies

# Facts of inpod/contract.py that Python elsewhere must take from it, never spell again: exact strings (env names,
# file names of the state directory, labels), paths (also inside longer strings: `<SA_DIR>/service-ca.crt`) and
# the activity port. Docstrings may name them.
EXACT = {
    contract.STATE_DIR_ENV,
    contract.CLUSTER_DIR_ENV,
    contract.IDLE_SETTINGS_ENV,
    contract.SA_DIR_ENV,
    contract.SECRETS_DIR_ENV,
    contract.SECRETS_ENV,
    contract.STARTUP_DIR_ENV,
    contract.CHECKPOINT_GRACE_ENV,
    contract.CHECKPOINT_SIGNAL_ENV,
    contract.SETTINGS_KEY,
    contract.RANK_ENV_FILE,
    contract.IDLE_STOP_FILE,
    contract.IDLE_STATUS_FILE,
    contract.HOME_ADDR,
    contract.SSH_SESSIONS_DIR,
    contract.RUN_ENV,
    contract.FABRIC_LATEST,
    contract.STACK_LABEL,
    contract.CLUSTER_LABEL,
    contract.USAGE_LABEL,
    contract.PART_OF_LABEL,
}
PATHS = {
    contract.STARTUP_MOUNT,
    contract.CLUSTER_MOUNT,
    contract.SETTINGS_MOUNT,
    contract.SA_DIR,
    contract.STATE_DIR,
    contract.SECRETS_MOUNT,
}
CHECKED = ("inpod", "components", "core", "stacks", "tools", "policy")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string statements (module, class, function and attribute docstrings)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if isinstance(body, list):
                found |= {
                    id(s.value)
                    for s in body
                    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                }
    return found


def spelled_again(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docs:
            continue
        value = node.value
        if isinstance(value, str) and (value in EXACT or any(p in value for p in PATHS)):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {value[:80]!r}")
        elif type(value) is int and value == contract.ACTIVITY_PORT:
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {value}")
    return hits


def test_the_detector_sees_a_copy(tmp_path: Path) -> None:
    probe = ROOT / "tests" / "__probe_contract_copy.py"
    probe.write_text(f'"""{contract.STATE_DIR} in a docstring is fine."""\nX = "{contract.SA_DIR}/token"\nY = {contract.ACTIVITY_PORT}\n')
    try:
        assert [h.split(": ", 1)[0] for h in spelled_again(probe)] == [
            "tests/__probe_contract_copy.py:2",
            "tests/__probe_contract_copy.py:3",
        ]
    finally:
        probe.unlink()


def test_no_python_spells_the_contract_again() -> None:
    found = [
        hit
        for top in CHECKED
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != ROOT / "inpod" / "contract.py" and "__pycache__" not in path.parts
        for hit in spelled_again(path)
    ]
    assert not found, "take these from inpod/contract.py:\n" + "\n".join(found)


# `${NAME:-default}`, and the same in the Python that startup.sh writes for the kernels: `environ.get("NAME", "default")`
DEFAULTED = re.compile(r"\$\{([A-Z_]+):-([^}$]*)\}|environ\.get\(\"([A-Z_]+)\", \"([^\"]*)\"\)")


def test_the_shell_copies_equal_the_contract() -> None:
    """A shell file cannot import the contract: each `${NAME:-default}` of a contract name holds its value, and no
    contract path appears in a shell file otherwise (outside comments); checkpoint_stop.sh's fallback is the grace."""
    seen: set[str] = set()
    for s in inpod.SHIPPED:
        if not s.source.startswith("sh/"):
            continue
        for number, line in enumerate(inpod.text(s.key).splitlines(), 1):
            code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
            for found in DEFAULTED.finditer(code):
                name, value = found.group(1) or found.group(3), found.group(2) if found.group(1) else found.group(4)
                if name in contract.SHELL_DEFAULTS:
                    seen.add(name)
                    assert value == contract.SHELL_DEFAULTS[name], f"{s.source}:{number}: {name} defaults to {value!r}"
            rest = DEFAULTED.sub("", code)
            assert not [p for p in PATHS if p in rest], f"{s.source}:{number}: a contract path outside ${{NAME:-…}}: {line.strip()}"
            fallback = re.search(r"\bGRACE=(\d+)", rest)
            assert not fallback or int(fallback.group(1)) == contract.GRACE_DEFAULT, f"{s.source}:{number}: {line.strip()}"
    assert seen == set(contract.SHELL_DEFAULTS), f"never checked: {set(contract.SHELL_DEFAULTS) - seen}"


def test_the_whole_container_env(result: RunResult) -> None:
    """In order: identity and paths, the stack's NCCL/UCX env, the servers and network mode, the servers' credentials
    (token auth), the stop facts; nothing else."""
    sts = next(r for r in result.resources if r.kind == "StatefulSet")
    main = next(c for c in sts.inputs["spec"]["template"]["spec"]["containers"] if c["name"] == "ml-dev")
    names = [e["name"] for e in main["env"]]
    head, tail = len(contract.CONTAINER_ENV), len(contract.STOP_ENV)
    assert names[:head] == list(contract.CONTAINER_ENV) and names[-tail:] == list(contract.STOP_ENV)
    middle = names[head:-tail]
    nccl = [n for n in middle if re.match(r"(NCCL|UCX)_", n)]
    assert middle[: len(nccl)] == nccl, "the NCCL env is one block after the paths"
    rest = middle[len(nccl) :]
    assert rest[: len(contract.SERVER_ENV)] == list(contract.SERVER_ENV)
    assert set(rest[len(contract.SERVER_ENV) :]) <= {s.credential_env for s in DEV_SERVERS if s.credential_env}
    values = {e["name"]: e.get("value") for e in main["env"]}
    assert values[contract.STATE_DIR_ENV] == contract.STATE_DIR and values[contract.CLUSTER_DIR_ENV] == contract.CLUSTER_MOUNT


def test_idle_json_has_the_contract_shape_and_defaults() -> None:
    """The schema's defaults are the contract's table; idle.json carries exactly the typed shape's keys."""
    objects = stack_objects("barcelona")
    objects.setdefault("lifecycle", {}).pop("idleStop", None)
    config = StackConfig.model_validate(objects)
    settings = lifecycle.agent_settings(config)
    assert set(settings) == set(contract.IdleSettings.__annotations__)
    defaults = {k: v for k, v in settings.items() if k in contract.IDLE_DEFAULTS and k != "servers"}
    assert defaults == {k: v for k, v in contract.IDLE_DEFAULTS.items() if k != "servers"}
    assert config.lifecycle.checkpoint_grace_seconds == contract.GRACE_DEFAULT
    assert config.lifecycle.checkpoint_signal == contract.SIGNAL_DEFAULT


def test_the_launcher_takes_every_rank_key_from_the_pod_only() -> None:
    """No rank.env key travels from the launching shell (its copy is stale after a count change)."""
    assert ml_dev_common.FROM_RANK_FILE[: len(contract.RANK_ENV)] == contract.RANK_ENV
    assert {"NCCL_IB_HCA", "RANK", "LOCAL_RANK"} <= set(ml_dev_common.FROM_RANK_FILE)
