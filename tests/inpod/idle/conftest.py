"""Real signal sources and a validating stand-in API server for the idle-agent tests.

* `FakeApiServer`: a Kubernetes API stand-in on 127.0.0.1 (port 0) that checks the bearer token,
  authorizes every request against the Role the stack renders (the real program's output), serves the
  StatefulSet's `scale` subresource with resourceVersion checks, applies merge patches to the record
  ConfigMap and stores Events; every body it accepts is kept for the schema validator.
* `SimPod`: one simulated pod: its state directory (rank.env per the rank contract, activity records),
  a stub `nvidia-smi` printing the real `--query-gpu` CSV at a chosen utilisation, an empty pts dir.
* `jupyter`: a real JupyterLab server on 127.0.0.1 (OS-assigned port) with a token.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import run_objects, stack_objects
from tests.inpod import mount
from tools.capture_jupyter_status import Server as Jupyter  # one real JupyterLab launcher for the capture tool and the tests

AGENT_PATH = mount.shipped() / "idle_agent.py"
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

    def write_bodies(self, directory: Path) -> int:
        """Every Scale the agent sent and the resulting ConfigMap, as files for validate_manifests.py."""
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


# -------------------------------------------------------------------------------- simulated pods

NVIDIA_SMI = """#!/bin/bash
# stub nvidia-smi printing the real `--format=csv` layout (header with units; see tests/data/tool_output): four
# GPUs with utilisation from $DIR/gpu-util, memory used from $DIR/gpu-mem-used (MiB), compute processes
# from $DIR/gpu-apps (CSV rows without header)
dir="$(dirname "$0")"
if [ -f "$dir/gpu-fail" ]; then echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9; fi
util="$(cat "$dir/gpu-util" 2>/dev/null || echo 0)"
mem="$(cat "$dir/gpu-mem-util" 2>/dev/null || echo 0)"
used="$(cat "$dir/gpu-mem-used" 2>/dev/null || echo 1)"
case "$*" in
  *--query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used*--format=csv*)
    echo "index, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB]"
    for i in 0 1 2 3; do
      u="$util %"; m="$mem %"
      case "$util" in \\[*) u="$util" ;; esac
      case "$mem" in \\[*) m="$mem" ;; esac
      printf '%d, GPU-8f6c2d4e-3a1b-4c5d-9e7f-0a1b2c3d4e5%d, %s, %s, %s MiB\\n' "$i" "$i" "$u" "$m" "$used"
    done ;;
  *--query-compute-apps=gpu_uuid,pid,process_name,used_memory*--format=csv*)
    echo "gpu_uuid, pid, process_name, used_gpu_memory [MiB]"
    cat "$dir/gpu-apps" 2>/dev/null || true ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


class SimPod:
    def __init__(self, root: Path, index: int, pods: list[str]) -> None:
        self.name = f"{APP}-{index}"
        self.index = index
        self.dir = root / self.name
        self.state = self.dir / "state"
        self.bin = self.dir / "bin"
        self.pts = self.dir / "pts"
        for d in (self.state / "activity" / "ssh", self.bin, self.pts):
            d.mkdir(parents=True, exist_ok=True)
        smi = self.bin / "nvidia-smi"
        smi.write_text(NVIDIA_SMI)
        smi.chmod(0o755)
        self.gpu(0)
        hosts = " ".join(f"{p}.{APP}-headless.{NS}.svc.cluster.local" for p in pods)
        (self.state / "rank.env").write_text(
            f"export ML_DEV_POD={self.name} NODE_RANK={index} NNODES={len(pods)} GPUS_PER_NODE=4 WORLD_SIZE={4 * len(pods)}\n"
            f"export MASTER_ADDR={APP}-0.{APP}-headless.{NS}.svc.cluster.local MASTER_PORT=29500\n"
            f"export ML_DEV_HOSTS='{hosts}' ML_DEV_PODS='{' '.join(pods)}'\n"
        )
        self.proc: subprocess.Popen[str] | None = None

    def gpu(self, util: int, mem: int = 0, fail: bool = False) -> None:
        (self.bin / "gpu-util").write_text(str(util))
        (self.bin / "gpu-mem-util").write_text(str(mem))
        fail_flag = self.bin / "gpu-fail"
        if fail:
            fail_flag.write_text("1")
        elif fail_flag.exists():
            fail_flag.unlink()

    def env(self, settings: Path, api: FakeApiServer | None, **extra: str) -> dict[str, str]:
        sa = self.dir / "sa"
        sa.mkdir(exist_ok=True)
        (sa / "token").write_text(TOKEN + "\n")
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(self.dir),
            "POD_NAME": self.name,
            "ML_DEV_STATE_DIR": str(self.state),
            "ML_DEV_IDLE_SETTINGS": str(settings),
            "ML_DEV_NVIDIA_SMI": str(self.bin / "nvidia-smi"),
            "ML_DEV_PTS_DIR": str(self.pts),
            "ML_DEV_SSH_PROCESS_SCAN": "0",
            "ML_DEV_SA_DIR": str(sa),
            "ML_DEV_CODE_SERVER_HEARTBEAT": str(self.dir / "code-server" / "heartbeat"),
        }
        if api is not None:
            env["ML_DEV_KUBE_API"] = api.url
        env.update(extra)
        return env

    def start(self, env: dict[str, str], rounds: int | None = None) -> None:
        cmd = [sys.executable, str(AGENT_PATH), "run", "--listen", "127.0.0.1:0"]
        if rounds:
            cmd += ["--rounds", str(rounds)]
        self.log = open(self.dir / "agent.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def address(self, timeout: float = 30) -> str:
        addr = self.state / "activity.addr"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if addr.exists() and addr.read_text().strip():
                return addr.read_text().strip()
            assert self.proc is None or self.proc.poll() is None, (self.dir / "agent.log").read_text()
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: agent did not start: {(self.dir / 'agent.log').read_text()}")

    def stop(self) -> str:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
        return (self.dir / "agent.log").read_text() if (self.dir / "agent.log").exists() else ""


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
