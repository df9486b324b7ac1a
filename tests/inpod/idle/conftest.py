"""Real signal sources and a validating stand-in API server for the idle-agent tests.

* `FakeApiServer`: a Kubernetes API stand-in on 127.0.0.1 (port 0) that checks the bearer token,
  authorizes every request against the Role the stack renders (the real program's output), serves the
  StatefulSet's `scale` subresource with resourceVersion checks, applies merge patches to the record
  ConfigMap and stores Events; every body it accepts is kept for the schema validator.
* `AgentInputs`: what the agent's functions read when called in this process (state directory, rank.env, the
  node's nvidia-smi of tests/podsim/nodetools.py); the agents as processes run on simulated pods (tests/podsim).
* `jupyter`: a real JupyterLab server on 127.0.0.1 (OS-assigned port) with a token.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from inpod import contract as pod_contract
from tests.conftest import run_objects, stack_objects
from tests.podsim.nodetools import HostNode
from tools.capture_jupyter_status import Server as Jupyter  # one real JupyterLab launcher for the capture tool and the tests

APP, NS = "ml-dev-env", "nccl-test"
TOKEN = "sa-token-for-tests"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"


AGENT_MODULES = {"idle_probes": "inpod.idle.probes", "idle_decider": "inpod.idle.decider", "idle_agent": "inpod.idle.agent"}
"""The idle agent is the inpod.idle package behind the idle_agent.py launcher (inpod.SHIPPED, group lifecycle)."""


def agent_module(name: str) -> ModuleType:
    """One of the agent's modules, where its functions look each other up (the place to monkeypatch)."""
    assert name in AGENT_MODULES, name
    return importlib.import_module(AGENT_MODULES[name])


def load_agent() -> SimpleNamespace:
    """Every public name of the agent's modules in one namespace (read-only view: patch with agent_module)."""
    names: dict[str, Any] = {}
    for name in AGENT_MODULES:
        names.update({k: v for k, v in vars(agent_module(name)).items() if not k.startswith("__")})
    return SimpleNamespace(**names)


@pytest.fixture(scope="session")
def agent_rules() -> list[dict[str, Any]]:
    """The agent's RBAC exactly as the program renders it for barcelona with the idle stop on."""
    objects = stack_objects("barcelona")
    objects["lifecycle"] = {"idleStop": {"enabled": True}}
    result = run_objects("barcelona", objects)
    assert result.error is None, result.error
    return result.one(ROLE, "gpu-idle-agent").inputs["rules"]


# ------------------------------------------------------------------------------- API stand-in


def authorize(rules: list[dict[str, Any]], verb: str, group: str, resource: str, name: str | None) -> bool:
    """Kubernetes RBAC semantics for the rule shapes used here (create cannot be limited by name)."""
    for rule in rules:
        if group not in rule.get("apiGroups", []) or resource not in rule.get("resources", []):
            continue
        if verb not in rule.get("verbs", []):
            continue
        names = rule.get("resourceNames")
        if names and (name is None or name not in names):
            continue
        return True
    return False


class FakeApiServer:
    def __init__(self, rules: list[dict[str, Any]], replicas: int = 2) -> None:
        self.rules = rules
        self.replicas = replicas
        self.resource_version = 100
        self.configmap: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{APP}-idle-stop", "namespace": NS, "resourceVersion": "7"},
            "data": {},
        }
        self.usage: dict[str, str] | None = None  # the `<app>-usage` record's data (None: no such ConfigMap)
        self.events: list[dict[str, Any]] = []
        self.scales: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.denied: list[str] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with server.lock:
                    code, reply = server.serve(self.command, self.path, self.headers, body)
                self.reply(code, reply)

            do_GET = do_PUT = do_PATCH = do_POST = handle_any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def scale(self) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": APP,
                "namespace": NS,
                "uid": "0d7a9c1e-5f0b-4c55-9d3e-2b1f4e6a8c01",
                "resourceVersion": str(self.resource_version),
            },
            "spec": {"replicas": self.replicas},
            "status": {"replicas": self.replicas},
        }

    def serve(self, method: str, raw_path: str, headers: Any, body: Any) -> tuple[int, dict[str, Any]]:
        url = urlsplit(raw_path)
        path, query = url.path, parse_qs(url.query)
        self.requests.append((method, raw_path))
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, {"kind": "Status", "code": 401, "reason": "Unauthorized"}
        parts = path.strip("/").split("/")
        # /apis/<group>/<v>/namespaces/<ns>/<resource>[/<name>[/<sub>]] or /api/v1/namespaces/<ns>/<resource>[/<name>]
        group, rest = (parts[1], parts[3:]) if parts[0] == "apis" else ("", parts[2:])
        if rest[:2] != ["namespaces", NS]:
            return 404, {"kind": "Status", "code": 404}
        resource, name, sub = rest[2], (rest[3] if len(rest) > 3 else None), (rest[4] if len(rest) > 4 else None)
        verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "POST": "create"}[method]
        if method == "GET" and name is None:
            # a collection: `list`, and a field selector on one name is authorized as that name (kubernetes
            # staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go NewRequestInfo)
            verb = "list"
            selected = dict(f.split("=", 1) for f in (query.get("fieldSelector") or [""])[0].split(",") if "=" in f)
            name = selected.get("metadata.name")
        full = f"{resource}/{sub}" if sub else resource
        if not authorize(self.rules, verb, group, full, name):
            self.denied.append(f"{verb} {group}/{full}/{name}")
            return 403, {"kind": "Status", "code": 403, "reason": "Forbidden"}
        if method != "GET" and query.get("fieldManager") != ["ml-dev-env-idle-agent"] and method != "POST":
            return 400, {"kind": "Status", "code": 400, "message": "fieldManager expected"}
        if (group, full, name) == ("apps", "statefulsets/scale", APP):
            if method == "GET":
                return 200, self.scale()
            if body.get("metadata", {}).get("resourceVersion") != str(self.resource_version):
                return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
            self.scales.append(body)
            self.replicas = body["spec"]["replicas"]
            self.resource_version += 1
            return 200, self.scale()
        if (group, resource, name) == ("", "configmaps", f"{APP}-idle-stop"):
            if method == "PATCH":
                assert headers.get("Content-Type") == "application/merge-patch+json"
                self.configmap["data"] = {**self.configmap["data"], **body.get("data", {})}
            return 200, self.configmap
        if (group, resource, verb) == ("", "configmaps", "list"):  # the usage record only
            usage = {"metadata": {"name": f"{APP}-usage", "namespace": NS}, "data": self.usage}
            items = [usage] if self.usage is not None and name in (None, f"{APP}-usage") else []
            return 200, {"kind": "ConfigMapList", "apiVersion": "v1", "items": items}
        if (group, resource, method) == ("", "events", "POST"):
            self.events.append(body)
            return 201, body
        return 404, {"kind": "Status", "code": 404}

    def stopped(self) -> bool:
        """The agent's stop is whole: its three writes, in their order (inpod/idle/decider.py `stop`): the scale to 0,
        the record on the ConfigMap, then the IdleStop Event. A wait for the first alone raced the others (seen in CI:
        the record without idleSeconds; under load: no IdleStop Event yet)."""
        return self.replicas == 0 and "idleSeconds" in self.configmap["data"] and any(e.get("reason") == "IdleStop" for e in self.events)

    def write_bodies(self, directory: Path) -> int:
        """Every Scale the agent sent and the resulting ConfigMap, as files for tools/schema_check.py."""
        directory.mkdir(parents=True, exist_ok=True)
        objects = [*self.scales, self.configmap]
        for i, obj in enumerate(objects):
            (directory / f"{i}-{obj['kind']}.json").write_text(json.dumps(obj))
        return len(objects)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api(agent_rules: list[dict[str, Any]], tmp_path: Path) -> Iterator[FakeApiServer]:
    server = FakeApiServer(agent_rules)
    yield server
    server.close()


# ------------------------------------------------------------------- the agent's inputs, in process


class AgentInputs:
    """What the agent's functions read when a test calls them in this process (no pod, no agent process: pods are
    tests/podsim's): a state directory whose rank.env has startup.sh's keys (inpod/contract.py RANK_ENV), the
    node's nvidia-smi (tests/podsim/nodetools.py `HostNode`, the stub the simulated pods run), an empty terminal
    directory and a service-account token. `env` gives the agent's environment for them."""

    def __init__(self, root: Path, name: str = f"{APP}-0", gpus: int = 4) -> None:
        self.root, self.name = root, name
        self.state = root / "state"
        self.pts = root / "pts"
        for d in (self.state / "activity" / "ssh", self.pts):
            d.mkdir(parents=True, exist_ok=True)
        self.node = HostNode(root / "node", gpus=gpus)
        self.rank_env()

    def rank_env(self, peers: dict[str, str] | None = None) -> None:
        """rank.env of pod 0 of an environment of pod 0 and `peers` (pod name -> the host its agent answers on)."""
        pods = {self.name: f"{self.name}.{APP}-headless.{NS}.svc.cluster.local", **(peers or {})}
        hosts = " ".join(pods.values())
        (self.state / pod_contract.RANK_ENV_FILE).write_text(
            f"export ML_DEV_POD={self.name} NODE_RANK=0 NNODES={len(pods)} GPUS_PER_NODE=4 WORLD_SIZE={4 * len(pods)}\n"
            f"export MASTER_ADDR={pods[self.name]} MASTER_PORT=29500\n"
            f"export ML_DEV_HOSTS='{hosts}' ML_DEV_PODS='{' '.join(pods)}'\n"
        )

    def env(self, settings: Path, api: FakeApiServer | None, **extra: str) -> dict[str, str]:
        sa = self.root / "sa"
        sa.mkdir(exist_ok=True)
        (sa / "token").write_text(TOKEN + "\n")
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.root),
            "POD_NAME": self.name,
            "ML_DEV_STATE_DIR": str(self.state),
            "ML_DEV_IDLE_SETTINGS": str(settings),
            "ML_DEV_NVIDIA_SMI": str(self.node.nvidia_smi),
            "ML_DEV_PTS_DIR": str(self.pts),
            "ML_DEV_SSH_PROCESS_SCAN": "0",
            "ML_DEV_SA_DIR": str(sa),
            "ML_DEV_CODE_SERVER_HEARTBEAT": str(self.root / "code-server" / "heartbeat"),
        }
        if api is not None:
            env["ML_DEV_KUBE_API"] = api.url
        env.update(extra)
        return env


def write_settings(path: Path, **overrides: Any) -> Path:
    settings = {
        "enabled": True,
        "idleTimeoutSeconds": 6,
        "intervalSeconds": 1,
        "warningLeadSeconds": 3,
        "gpuUtilThreshold": 5,
        "gpuMemoryUtilThreshold": 5,
        "statefulset": APP,
        "namespace": NS,
        "recordConfigMap": f"{APP}-idle-stop",
        "activityPort": 9099,
        "servers": ["vscode", "jupyter"],
        **overrides,
    }
    path.write_text(json.dumps(settings))
    return path


# ---------------------------------------------------------------------------------------- Jupyter


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jupyter]:
    server = Jupyter(tmp_path_factory.mktemp("jupyter"))
    yield server
    server.close()
