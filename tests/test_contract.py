"""The pod contract (core/pod_contract.py) holds from both sides: what the render gives the pods, and what
the shipped programs read and write."""

from __future__ import annotations

import re

import pytest

import inpod
from core import pod_contract as contract
from inpod import ml_dev
from tests.conftest import run_objects, stack_objects
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
    ml_dev = "".join(text for key, text in inpod.group("devloop").items() if key == "ml-dev" or key.startswith("ml_dev_"))
    assert all(f"{k}" in ml_dev for k in ("ML_DEV_SHARED_PATHS", "ML_DEV_PER_POD_PATHS", contract.STARTUP_DIR_ENV))


@pytest.mark.parametrize("key", ["ml_dev_lib.py", "fabric_util.py"])
def test_programs_hand_other_pods_the_mount_path(key: str) -> None:
    """The kubelet's ..<timestamp> directory behind the mount differs per pod: never resolve() our own path.
    (The fabric check's modules hand the path on through fabric_util.PROGRAM, ml-dev's through ml_dev_lib.HERE.)"""
    text = inpod.text(key)
    assert contract.STARTUP_DIR_ENV in text
    python = [k for g in ("fabric", "devloop") for k in inpod.group(g) if k.endswith(".py") or k == "ml-dev"]
    for other in [key, *python]:
        assert not re.search(r"Path\(__file__\)\.resolve\(\)", inpod.text(other)), other


def test_the_launcher_carries_the_contract_per_pod_set() -> None:
    assert ml_dev.PER_POD_ENV == contract.PER_POD_ENV


def test_the_launcher_takes_every_rank_key_from_the_pod_only() -> None:
    """No rank.env key travels from the launching shell (its copy is stale after a count change)."""
    assert ml_dev.FROM_RANK_FILE[: len(contract.RANK_ENV)] == contract.RANK_ENV
    assert {"NCCL_IB_HCA", "RANK", "LOCAL_RANK"} <= set(ml_dev.FROM_RANK_FILE)
