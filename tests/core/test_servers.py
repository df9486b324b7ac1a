"""The dev-server table (core/servers.py) is the one place a server's facts live.

`test_a_new_row_reaches_every_object` is the proof behind CONTRIBUTING.md's "add a dev server": one row,
and the config key, the proxy sidecar, the pod-0 Service port, the Route, the OAuth redirect annotation
and the URL output all follow. The row is added in a fresh interpreter before anything reads the table,
exactly as an edit of core/servers.py would be.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from core import servers
from core.servers import DEV_SERVERS, DevServer
from policy.rules.routes_authenticated import SERVICE_PORT_AUTH, SERVICE_PORT_NUMBERS

ROOT = Path(__file__).resolve().parents[2]
STARTUP = ROOT / "inpod" / "sh" / "startup.sh"

PROGRAM = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from core import servers
    servers.DEV_SERVERS = (*servers.DEV_SERVERS, servers.DevServer("mlflow", "MLflow", 5000, 15000))

    from tests.conftest import MODEL_SECRETS
    from tools.mock_engine import run_program, stack_config

    out = {}
    for enabled in (True, False):
        config = stack_config(Path("Pulumi.barcelona.yaml"))
        config["ml-dev-env:access"] = {**config["ml-dev-env:access"], "mlflow": enabled}
        result = run_program("barcelona", config, MODEL_SECRETS)
        assert result.error is None, result.error
        def one(typ, suffix=""):
            return result.one(typ, suffix).inputs
        pod = one("kubernetes:apps/v1:StatefulSet")["spec"]["template"]["spec"]
        out[str(enabled)] = {
            "service_ports": one("kubernetes:core/v1:Service", "gpu-dev")["spec"]["ports"],
            "routes": [r.inputs for r in result.of_type("kubernetes:route.openshift.io/v1:Route")],
            "proxies": [c for c in pod["containers"] if c["name"].endswith("-proxy")],
            "redirects": one("kubernetes:core/v1:ServiceAccount", "gpu-sa")["metadata"].get("annotations", {}),
            "outputs": {k: v for k, v in result.outputs.items() if k.endswith("_url")},
        }
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def with_mlflow() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_row_reaches_every_object(with_mlflow: dict[str, Any]) -> None:
    on = with_mlflow["True"]
    assert {"name": "mlflow", "port": 5000, "targetPort": "p-mlflow"} in on["service_ports"]
    route = next(r for r in on["routes"] if r["metadata"]["name"] == "ml-dev-env-mlflow")
    assert route["spec"]["port"] == {"targetPort": "mlflow"}
    assert route["spec"]["host"].startswith("ml-dev-env-mlflow-")
    proxy = next(c for c in on["proxies"] if c["name"] == "mlflow-proxy")
    assert "--upstream=http://127.0.0.1:5000" in proxy["args"] and "--http-address=127.0.0.1:15000" in proxy["args"]
    assert proxy["ports"] == [{"containerPort": 15000, "name": "p-mlflow"}]
    assert "serviceaccounts.openshift.io/oauth-redirectreference.mlflow" in on["redirects"]
    assert on["outputs"]["mlflow_url"] == f"https://{route['spec']['host']}"


def test_the_config_key_of_a_row_switches_it_off(with_mlflow: dict[str, Any]) -> None:
    on, off = with_mlflow["True"], with_mlflow["False"]
    assert [p["name"] for p in off["service_ports"]] == [p["name"] for p in on["service_ports"] if p["name"] != "mlflow"]
    assert len(off["routes"]) == len(on["routes"]) - 1 and len(off["proxies"]) == len(on["proxies"]) - 1
    assert off["outputs"]["mlflow_url"] == ""


def test_route_host_length_uses_the_longest_routed_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from stacks.config import ClusterConfig

    cluster = {"name": "c", "namespace": "n" * 20, "appsDomain": "apps.example.com", "appName": "a" * 30}
    ClusterConfig.model_validate(cluster)  # fits with today's longest name ("tensorboard")
    monkeypatch.setattr(servers, "DEV_SERVERS", (*DEV_SERVERS, DevServer("experiment-tracker", "Tracker", 5000, 15000)))
    with pytest.raises(ValueError, match=r"'a{30}-experiment-tracker-n{20}' has 70"):
        ClusterConfig.model_validate(cluster)


def startup_branches() -> dict[str, str]:
    """`case "$server" in` branches of the startup script: server name -> branch body."""
    text = STARTUP.read_text()
    block = text[text.index('case "$server" in') :]
    block = block[: block.index("\n    esac")]
    return dict(re.findall(r"^      ([a-z0-9-]+)\)\n(.*?)\n        ;;", block, re.M | re.S))


def test_every_row_has_a_start_command_on_its_port() -> None:
    branches = startup_branches()
    for server in DEV_SERVERS:
        assert server.name in branches, f"inpod/sh/startup.sh starts no {server.name}"
        assert re.search(rf"(:|--port[= ]){server.port}\b", branches[server.name]), (server.name, server.port)
        if server.credential_env:
            assert f"${{{server.credential_env}" in branches[server.name], f"{server.name} ignores {server.credential_env}"
        # what the image must carry (tools/prerequisites.py lists it for images the stack did not build)
        started = re.findall(rf"start {server.name} ([\w.-]+)", branches[server.name])
        if server.program:
            assert started and set(started) == {server.program}, (server.name, started, server.program)
        else:
            assert all(p in ("python3", "bash") for p in started), (server.name, started)


def test_policy_guard_knows_every_credential() -> None:
    """The policy pack runs standalone (no core import): its port table must agree with the server table."""
    for server in DEV_SERVERS:
        if server.credential_env:
            assert server.credential_env in SERVICE_PORT_AUTH[server.name][1]
            assert SERVICE_PORT_NUMBERS[server.port] == server.name


def test_home_page_is_on_behind_the_oauth_proxy_and_off_by_default_under_token_auth() -> None:
    from stacks.config import AccessConfig

    assert "home" in AccessConfig().servers
    token = AccessConfig.model_validate({"auth": "token", "tensorboard": False})
    assert token.servers == ["vscode", "jupyter"], "a server without its own login never runs under token auth"
