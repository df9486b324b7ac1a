"""Capture what a real Jupyter server answers to the idle agent's probe, verbatim, as test fixtures.

    .venv/bin/python -m tools.capture_jupyter_status [OUT_DIR]     (default tests/data/tool_output/jupyter)

Starts JupyterLab (the venv's jupyterlab / jupyter_server, what the presets' images run) on 127.0.0.1 with
token auth, in a temporary root/config/data/runtime directory, and records the exact bytes of each endpoint
`inpod/idle/probes.py` `probe_jupyter` reads (`/api/status`, `/api/kernels?no_track_activity=1`,
`/api/terminals?no_track_activity=1`; `/api/sessions?no_track_activity=1` too, what a notebook tab opens)
in four states:

  1-fresh            the server just started: no kernel, no terminal
  2-kernel-starting  a notebook session started (POST /api/sessions) and no client has talked to its kernel
                     yet: execution_state stays `starting` until the first status message on IOPub
                     (jupyter_server services/kernels/kernelmanager.py start_watching_activity)
  3-kernel-idle      a notebook tab's connection: the kernel's websocket (/api/kernels/<id>/channels) open
                     and its kernel_info request answered: execution_state idle, connections 1
  4-kernel-busy      that kernel running `time.sleep(...)`: execution_state busy
  5-terminal-open    the code has finished and a terminal is open (POST /api/terminals)

The server takes port 0 and the agent reads the port it bound from its runtime file (jpserver-<pid>.json):
no port can be lost to another process between choosing and binding it. Every file is the response body
as the server sent it; `versions.json` beside them names the packages and Python that answered. Kernel ids,
timestamps and the terminal name differ on every capture; the tests read them from the files.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "capture-token-0c7d"
# the query strings the probe sends (inpod/idle/probes.py probe_jupyter): its polling is not activity
ENDPOINTS = {
    "status": "/api/status",
    "kernels": "/api/kernels?no_track_activity=1",
    "sessions": "/api/sessions?no_track_activity=1",
    "terminals": "/api/terminals?no_track_activity=1",
}
PACKAGES = ["jupyter_server", "jupyterlab", "jupyter_client", "ipykernel", "terminado", "tornado"]


class Server:
    """A real JupyterLab on 127.0.0.1 (port 0, read back from its runtime file) under `root`, with token auth
    (`token`); the tests' `jupyter` fixture (tests/inpod/idle/conftest.py) runs the same server."""

    token = TOKEN

    def __init__(self, root: Path, extra: list[str] | None = None) -> None:
        """`extra`: more `jupyter lab` options (e.g. the culling flags inpod/sh/startup.sh passes)."""
        self.runtime = root / "runtime"
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(self.runtime),
            "JUPYTER_CONFIG_DIR": str(root / "config"),
            "JUPYTER_DATA_DIR": str(root / "data"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "HOME": str(root),
        }
        work = root / "work"
        work.mkdir()
        self.command = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            "--port=0",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={work}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *(extra or []),
        ]
        self.log_path = root / "jupyter.log"
        self.log = open(self.log_path, "w")  # closed in close()
        self.proc = subprocess.Popen(self.command, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=work)
        self.url = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.url:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            for info in self.runtime.glob("jpserver-*.json"):
                try:
                    port = json.loads(info.read_text()).get("port")
                except ValueError:  # still being written
                    continue
                if port:
                    self.url = f"http://127.0.0.1:{port}"
            time.sleep(0.2)
        if not self.url:
            self.close()
            raise TimeoutError(f"jupyter did not start within 120 s: {self.log_path.read_text()[-2000:]}")

    def raw(self, method: str, path: str, body: Any = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    def json(self, method: str, path: str, body: Any = None) -> Any:
        return json.loads(self.raw(method, path, body) or b"null")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def capture(server: Server, out: Path, state: str) -> None:
    for name, path in ENDPOINTS.items():
        (out / f"{state}-{name}.json").write_bytes(server.raw("GET", path))


def wait_for(server: Server, kernel_id: str, state: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.json("GET", f"/api/kernels/{kernel_id}?no_track_activity=1").get("execution_state") == state:
            return
        time.sleep(0.1)
    raise TimeoutError(f"kernel {kernel_id} not {state} within {timeout} s")


def message(session: str, msg_type: str, content: dict[str, Any]) -> str:
    """A Jupyter messaging protocol 5.3 message on the shell channel, as JupyterLab sends it over the websocket
    (jupyter_server's default JSON websocket protocol when no subprotocol is asked for)."""
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": session, "username": "capture", "version": "5.3"}
    return json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"})


async def notebook_tab(server: Server, kernel_id: str, out: Path) -> None:
    """States 3-5 while a notebook tab's websocket to the kernel is open."""
    from tornado.httpclient import HTTPRequest  # jupyter_server's own web framework: only this tool needs it
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    url = server.url.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels?session_id={session}"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {TOKEN}"}, connect_timeout=30))
    try:

        async def reply_to(msg_type: str) -> None:
            content = {"code": "import time; time.sleep(8)", "silent": False} if msg_type == "execute_request" else {}
            text = message(session, msg_type, content)
            await ws.write_message(text)
            sent = json.loads(text)["header"]["msg_id"]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = await asyncio.wait_for(ws.read_message(), timeout=60)
                if got is None:
                    raise RuntimeError("kernel websocket closed")
                msg = json.loads(got)
                if msg.get("parent_header", {}).get("msg_id") == sent and msg.get("channel") == "shell":
                    return
            raise TimeoutError(f"no reply to {msg_type}")

        await reply_to("kernel_info_request")
        wait_for(server, kernel_id, "idle")
        capture(server, out, "3-kernel-idle")
        pending = asyncio.ensure_future(reply_to("execute_request"))
        await asyncio.sleep(0)  # the request is written before the server is asked
        await asyncio.to_thread(wait_for, server, kernel_id, "busy")
        await asyncio.to_thread(capture, server, out, "4-kernel-busy")
        await pending
        await asyncio.to_thread(wait_for, server, kernel_id, "idle")
        server.json("POST", "/api/terminals")
        capture(server, out, "5-terminal-open")
    finally:
        ws.close()


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "tests" / "data" / "tool_output" / "jupyter"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="jupyter-capture-") as tmp:
        server = Server(Path(tmp))
        try:
            capture(server, out, "1-fresh")
            notebook = {"path": "capture.ipynb", "name": "capture.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
            session = server.json("POST", "/api/sessions", notebook)
            kernel_id = session["kernel"]["id"]
            capture(server, out, "2-kernel-starting")
            asyncio.run(notebook_tab(server, kernel_id, out))
        finally:
            server.close()
    versions = {name: metadata.version(name) for name in PACKAGES}
    versions["python"] = platform.python_version()
    (out / "versions.json").write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")
    print(f"captured {len(ENDPOINTS) * 5} responses into {out} with {versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
