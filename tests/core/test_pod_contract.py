"""The pod contract (inpod/contract.py) holds from both sides: what the render gives the pods, and what
the shipped programs read and write."""

from __future__ import annotations

import ast
import re
import subprocess
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

# Facts of inpod/contract.py that Python elsewhere must take from it, never spell again: every string fact (env
# names, file names of the state directory, labels; a path also inside longer strings: `<SA_DIR>/service-ca.crt`) and
# the activity port. Docstrings may name them. COMMON: the facts that are also ordinary words of other meaning.
COMMON = {
    contract.PART_OF: "the product's name: the Pulumi project, the config namespace, log prefixes",
    contract.RUN_STATE_DIR: "`runs`: also a JSON key of the launcher's report and a component's output",
    contract.HEARTBEAT_DIR: "`heartbeat`: also code-server's own heartbeat file",
    contract.SIGNAL_DEFAULT: "`SIGTERM`: a signal's name, in the config's Literal and torchrun's signal list",
    contract.ENV_NAME_FIRST: "a character class, not a name",
    contract.ENV_NAME_REST: "a character class, not a name",
    contract.RUN_LOG_DIR: "`logs`: also `oc logs`, in the commands the outputs print",
    contract.RUN_LOG_PREFIX: "`rank`: also a JSON key of every report, a heartbeat's kind and a column's title",
    contract.RUN_LOG_SUFFIX: "`.log`: every log file's extension",
    contract.GATE_RECORD_PREFIX: "`gate-`: also the fabric gate's result files (`gate-<time>.json`)",
    contract.ENV_RECORDS_DIR: "`env`: also a dict key, a parameter's name and the policy pack's container field",
}
FACTS = {name: value for name, value in vars(contract).items() if name.isupper() and isinstance(value, str)}
PATHS = {value for value in FACTS.values() if value.startswith("/")}
EXACT = set(FACTS.values()) - PATHS - set(COMMON)
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


PACK_COPIES = {f"policy/rules/proxies_on_loopback.py:{n}: {contract.PROXY_PORTS_ENV!r}" for n in range(1, 60)}
"""The policy pack is served on its own (`python policy/`: it imports nothing of the program), so it restates the
facts it reads; tests/policy holds each copy equal to the contract's (test_the_rule_reads_the_contracts_env_name)."""


def test_no_python_spells_the_contract_again() -> None:
    found = [
        hit
        for top in CHECKED
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != ROOT / "inpod" / "contract.py" and "__pycache__" not in path.parts
        for hit in spelled_again(path)
        if hit not in PACK_COPIES
    ]
    assert not found, "take these from inpod/contract.py:\n" + "\n".join(found)


# `${NAME:-default}`, and the same in the Python that startup.sh writes for the kernels: `environ.get("NAME", "default")`
DEFAULTED = re.compile(r"\$\{([A-Z_]+):-([^}]*)\}|environ\.get\(\"([A-Z_]+)\", \"([^\"]*)\"\)")
# a fact of contract.env: `$CONTRACT_X` / `${CONTRACT_X}` in the shell, `@CONTRACT_X@` in a template startup.sh fills in
READ = re.compile(r"\$\{?CONTRACT_([A-Z_]+)\}?|@CONTRACT_([A-Z_]+)@")


def shell_code() -> list[tuple[str, int, str]]:
    """(file, line, code) of every shipped shell file, comments left out."""
    return [
        (s.source, number, line.split(" #", 1)[0] if not line.lstrip().startswith("#") else "")
        for s in inpod.SHIPPED
        if s.source.endswith(".sh")
        for number, line in enumerate(inpod.text(s.key).splitlines(), 1)
    ]


def test_contract_env_is_generated_from_the_contract_and_ships() -> None:
    """inpod/sh/contract.env is `shell_env()`'s text (`python -m tools.contract_env --write` after a change), shipped at
    the mount root beside the shell files, in the group every stack ships."""
    assert inpod.text(contract.CONTRACT_ENV_FILE) == contract.shell_env(), "stale: run `python -m tools.contract_env --write`"
    row = next(s for s in inpod.SHIPPED if s.key == contract.CONTRACT_ENV_FILE)
    assert row.path == contract.CONTRACT_ENV_FILE and row.group == "package"
    defined = dict(re.findall(r"^CONTRACT_([A-Z_]+)='([^']*)'$", contract.shell_env(), re.M))
    assert defined["STATE_DIR"] == contract.STATE_DIR and defined["GRACE_DEFAULT"] == str(contract.GRACE_DEFAULT)
    assert defined["CLUSTER_ENV"] == " ".join(contract.CLUSTER_ENV)
    scalar = {n for n, v in vars(contract).items() if n.isupper() and type(v) in (str, int)}
    assert scalar <= set(defined), f"facts the shell cannot read: {scalar - set(defined)}"


# A POSIX sh fragment other files source (no BASH_SOURCE to find its own folder): each sourcer sources contract.env
# before it. (sourcer, the contract.env line, the fragment's line)
SOURCED_AFTER_CONTRACT = {
    "user-secrets.sh": (
        ("ssh-session.sh", '. "$(dirname "${BASH_SOURCE[0]}")/contract.env"', '. "$HERE/user-secrets.sh"'),
        ("startup.sh", '. "${ML_DEV_DIR:-%s}/contract.env"', '. "${ML_DEV_DIR:-%s}/user-secrets.sh"'),
    ),
}


def test_every_shell_file_reads_the_contract_it_names() -> None:
    """Each shell file sources contract.env from beside itself, and every CONTRACT_* fact it reads is defined there."""
    defined = set(re.findall(r"^CONTRACT_([A-Z_]+)=", contract.shell_env(), re.M))
    for s in inpod.SHIPPED:
        if s.source.endswith(".sh"):
            text = inpod.text(s.key)
            if s.key in SOURCED_AFTER_CONTRACT:
                for sourcer, before, after in SOURCED_AFTER_CONTRACT[s.key]:
                    code = inpod.text(sourcer)
                    assert before in code and after in code and code.index(before) < code.index(after), (s.key, sourcer)
            else:
                assert '. "$(dirname "${BASH_SOURCE[0]}")/contract.env"' in text, f"{s.source} does not source contract.env"
            used = {a or b for a, b in READ.findall(text)}
            assert used and used <= defined, f"{s.source}: {used - defined}"


def spelled_pattern(value: str, path_only: bool = True) -> re.Pattern[str]:
    """`value` used as a path (a path component: `/heartbeat`, `heartbeat/`) or, unless `path_only`, as a value (a whole
    word quoted or assigned: `"ready"`, `=2222`); in prose (`no rank.env, env.sh, …`, `this pod ready`) it is a word."""
    v = re.escape(value)
    path = rf"/{v}(?![\w.-])|(?<![\w.-]){v}/"
    return re.compile(path if path_only else rf"{path}|([\"']){v}\1|={v}(?=[\s;)]|$)|^{v}$")


def test_the_shell_spells_no_fact_of_the_contract() -> None:
    """A shell file spells no path, default or state-directory name of the contract: each `${NAME:-…}` of a contract
    name defaults to the fact SHELL_DEFAULTS names, read from contract.env, and no fact's value appears in the code
    otherwise (comments aside; used as a path or a value: `spelled_pattern`)."""
    seen: set[str] = set()
    facts = {v for v in FACTS.values() if v not in (contract.PART_OF, contract.CONTRACT_ENV_FILE)}  # the one name it spells
    for source, number, code in shell_code():
        for found in DEFAULTED.finditer(code):
            name, value = found.group(1) or found.group(3), found.group(2) if found.group(1) else found.group(4)
            if name in contract.SHELL_DEFAULTS and not re.fullmatch(r"\$\{?(?!CONTRACT_)[A-Za-z_]+\}?", value):
                seen.add(name)  # (a default that is another variable of the script, set from the contract before, is no copy)
                read = READ.fullmatch(value)
                assert read, f"{source}:{number}: {name} defaults to {value!r}, not a fact of contract.env"
                fact = getattr(contract, read.group(1) or read.group(2))
                assert str(fact) == contract.SHELL_DEFAULTS[name], f"{source}:{number}: {name} defaults to {fact!r}"
        rest = READ.sub("", DEFAULTED.sub("", code))
        said = re.sub(r"\b(?:log|warn)\s+\"[^\"]*\"", "", rest)  # a log line's words: `log "stopping"` is no marker
        spelled = [v for v in facts if spelled_pattern(v).search(rest) or spelled_pattern(v, path_only=False).search(said)]
        assert not spelled, f"{source}:{number}: spells {spelled}: {code.strip()}"
    assert seen == set(contract.SHELL_DEFAULTS), f"never checked: {set(contract.SHELL_DEFAULTS) - seen}"


def test_the_detector_sees_a_fact_spelled_in_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """Renaming HEARTBEAT_DIR in the contract while checkpoint_stop.sh keeps `heartbeat/` fails the gate."""
    text = inpod.text("checkpoint_stop.sh").replace('"$STATE_DIR/$CONTRACT_HEARTBEAT_DIR"', '"$STATE_DIR"/heartbeat')
    real = inpod.text
    monkeypatch.setattr(inpod, "text", lambda key: text if key == "checkpoint_stop.sh" else real(key))
    with pytest.raises(AssertionError, match=r"checkpoint_stop\.sh.*heartbeat"):
        test_the_shell_spells_no_fact_of_the_contract()


@pytest.mark.parametrize("name", ["A", "_x", "WANDB_API_KEY", "a1", "1A", "A-B", "A.B", "", "É", "A B", "x=y"])
def test_one_rule_for_env_names(name: str, tmp_path: Path) -> None:
    """contract.ENV_NAME_PATTERN serves the config (stacks/config.py), the pod library (inpod/lib/usersecrets.py) and
    user-secrets.sh (its two `case` lines, run here in bash with contract.env): each accepts exactly the same names."""
    from inpod.lib import usersecrets
    from stacks import config

    python = bool(re.fullmatch(contract.ENV_NAME_PATTERN, name))
    assert bool(config.ENV_NAME.match(name)) == python and bool(usersecrets.ENV_NAME.match(name)) == python
    lines = [line for line in inpod.text("user-secrets.sh").splitlines() if line.strip().startswith('case "$_mde_k" in')]
    assert len(lines) == 2, lines
    (tmp_path / "contract.env").write_text(contract.shell_env())
    script = f'. "{tmp_path}/contract.env"\n_mde_k="$1"\nfor _ in once; do\n' + "\n".join(lines) + "\necho yes\ndone\n"
    out = subprocess.run(["bash", "-c", script, "bash", name], capture_output=True, text=True, timeout=30, check=True).stdout
    assert (out.strip() == "yes") == python, (name, out)


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
    # then the token-mode credentials, or (auth oauth-proxy) the ports forward.py owns for the proxies; the mounted models
    credentials = {s.credential_env for s in DEV_SERVERS if s.credential_env}
    assert set(rest[len(contract.SERVER_ENV) :]) <= credentials | {contract.PROXY_PORTS_ENV, contract.MODELS_ENV}
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
