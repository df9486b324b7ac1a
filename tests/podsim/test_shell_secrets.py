"""env.secrets in every shell a user opens, on a simulated pod of barcelona whose JupyterLab is the real one
(this checkout's virtualenv standing in for the image's pip install, started by startup.sh as the render starts it;
barcelona's pods run as UID 0, which may read this machine's interpreter wherever it is installed):

* a kernel the JupyterLab server starts (`POST /api/kernels`, then code run in it over its connection file) has the
  key, read from the mount by the IPython start-up file; the server's own environment never holds it;
* terminals: `bash -i` (VS Code's), `bash -l` and `bash -li` (JupyterLab's, `oc exec ... bash -l`), `sh -i` (dash,
  `oc rsh`'s $ENV) have it;
* a rotated Secret reaches the next kernel and the next terminal without a pod restart;
* the shared leak scan (tests/podsim/leakscan.py) finds the values nowhere else meanwhile (argv of every process,
  the outputs, every file under the state dir's logs/, the container output): 0 hits.
Each shell prints a SHA-256 of what it got, never the value.
"""

from __future__ import annotations

import hashlib
import json
import secrets as pysecrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.podsim.leakscan import LeakScan
from tests.podsim.pods import PREFIX, REPO, PodSim, leftovers, missing_requirements, render_stack

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(600)]

SECRET, KEY = "notebook-canary", "NOTEBOOK_CANARY_TOKEN"
PYTHON = (REPO / ".venv").resolve() / "bin" / "python"
JUPYTER = f"#!/bin/sh\n# the image's JupyterLab (system pip): this checkout's\nexec {PYTHON} -m jupyter \"$@\"\n"
DIGEST = f"import hashlib, os; print('DIGEST', hashlib.sha256(os.environ.get({KEY!r}, '').encode()).hexdigest())"
KERNEL = f"""
import http.cookiejar, json, os, sys, time, urllib.request
from jupyter_client import BlockingKernelClient
base = "http://127.0.0.1:8888"
# as the browser does: the page sets the _xsrf cookie, every POST/DELETE echoes it (jupyter_server base/handlers.py
# JupyterHandler.check_xsrf_cookie)
jar = http.cookiejar.CookieJar()
opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
opener.open(base + "/lab", timeout=60).read()
xsrf = {{c.name: c.value for c in jar}}.get("_xsrf", "")
headers = {{"Content-Type": "application/json", "X-XSRFToken": xsrf}}
kernel = json.load(opener.open(urllib.request.Request(base + "/api/kernels", data=b"{{}}", method="POST", headers=headers), timeout=60))
path = os.path.join(os.environ.get("JUPYTER_RUNTIME_DIR", "/tmp/ml-dev-env/jupyter-runtime"), "kernel-%s.json" % kernel["id"])  # startup.sh
deadline = time.time() + 60
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.2)
client = BlockingKernelClient(connection_file=path)
client.load_connection_file()
client.start_channels()
client.wait_for_ready(timeout=60)
out = []
def hook(msg):
    if msg["msg_type"] == "stream":
        out.append(msg["content"].get("text", ""))
client.execute_interactive({DIGEST!r}, output_hook=hook, timeout=60)
client.stop_channels()
opener.open(urllib.request.Request(base + "/api/kernels/" + kernel["id"], method="DELETE", headers=headers), timeout=60)
sys.stdout.write("".join(out))
"""
SHELLS = {
    "bash -i (VS Code)": ["bash", "-ic"],
    "bash -l (oc exec)": ["bash", "-lc"],
    "bash -li (JupyterLab)": ["bash", "-lic"],
    "sh -i": ["sh", "-ic"],
}


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def jupyter_and_secret(objects: dict[str, Any]) -> None:
    objects["access"] = {**objects.get("access", {}), "jupyter": True}
    objects["env"] = {"secrets": [{"secret": SECRET, "keys": [KEY]}]}


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[PodSim, str]]:
    before = set(leftovers())
    value = pysecrets.token_urlsafe(24)[:32]
    s = PodSim(
        render_stack("barcelona", jupyter_and_secret),
        count=1,
        namespace_secrets={SECRET: {KEY: value}},
        image_programs={"/usr/local/bin/jupyter": JUPYTER},
        image_paths=[PYTHON.parent.parent],
    )
    try:
        s.start()
        deadline = time.monotonic() + 240
        while s.exec(
            0, ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8888/api', timeout=5)"]
        ).returncode:
            assert time.monotonic() < deadline, s.pods[0].log.read_text()
            time.sleep(1)
        yield s, value
    finally:
        s.stop()
    assert not [x for x in set(leftovers()) - before if f"{PREFIX}{s.run_id}-" in x]


def digests(text: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.startswith("DIGEST ")]


def kernel(s: PodSim, scan: LeakScan) -> str:
    res = s.exec(0, [str(PYTHON), "-c", KERNEL], timeout=180)
    scan.text("the kernel's output", res.stdout + res.stderr)
    assert res.returncode == 0, res.stdout + res.stderr
    [got] = digests(res.stdout)
    return got


def terminals(s: PodSim, scan: LeakScan) -> dict[str, str]:
    out = {}
    for name, argv in SHELLS.items():
        # `; true`: the shell stays the digest's parent (bash execs a lone last command in its own place)
        res = s.exec(0, [*argv, f"python3 -c {json.dumps(DIGEST)}; true"], timeout=60)
        scan.text(f"{name}'s output", res.stdout + res.stderr)
        assert res.returncode == 0, (name, res.stdout + res.stderr)
        [out[name]] = digests(res.stdout)
    return out


def server_environ(s: PodSim) -> bytes:
    for pid in s.pod_pids(0):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            if b"jupyter" in cmdline and b"lab" in cmdline and b"ipykernel" not in cmdline:
                return open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
    raise AssertionError("no JupyterLab server process on pod 0")


def test_kernels_and_terminals_have_the_key_and_a_rotation_reaches_the_next(sim: tuple[PodSim, str]) -> None:
    s, value = sim
    rotated = pysecrets.token_urlsafe(24)[:32]
    try:
        with LeakScan(s, [value, rotated], environ=True) as scan:  # only the shells and kernels hold them
            assert kernel(s, scan) == sha(value), "a JupyterLab kernel has the key (its start-up hook reads the mount)"
            assert terminals(s, scan) == dict.fromkeys(SHELLS, sha(value))
            assert KEY.encode() not in server_environ(s), "the server's env never holds it"
            s.swap_configmap(SECRET, {KEY: rotated})  # `oc edit secret`: the kubelet's atomic writer, no restart
            assert kernel(s, scan) == sha(rotated), "the next kernel has the rotated value"
            assert terminals(s, scan) == dict.fromkeys(SHELLS, sha(rotated))
            scan.pods_state()
            scan.container_logs()
        assert scan.hits == []
    finally:
        s.swap_configmap(SECRET, {KEY: value})
