"""The home page on simulated pods started from the barcelona render (tests/inpod/home/pods.py), without a browser:
started by startup.sh as the render starts it, it takes its app, namespace and IDE links from the rendered
pod env, reaches both agents through rank.env and the cluster DNS, and keeps drawing after a startup
ConfigMap update removes the `..<timestamp>` directory it started from (the kubelet's atomic writer)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

import inpod
from core import naming
from core.servers import DEV_SERVERS, HOME_PAGE
from tests.inpod.home.pods import HOME_PORT, STATE, HomePods
from tests.podsim.pods import leftovers, missing_requirements

REASON = missing_requirements()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"), pytest.mark.timeout(300)]
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"


@pytest.fixture
def pods() -> Iterator[HomePods]:
    sim = HomePods()
    try:
        yield sim.start()
    finally:
        sim.stop()
    assert not [x for x in leftovers() if sim.run_id in x], "the simulation left namespaces or directories behind"


def get(pods: HomePods, path: str = "") -> str:
    """GET on pod 0's loopback from inside the pod (where the OAuth proxy sidecar reaches the page)."""
    res = pods.exec(0, ["python3", "-c", FETCH, f"http://127.0.0.1:{HOME_PORT}/{path}"], timeout=30)
    assert res.returncode == 0, res.stderr + pods.log_of(0, "home")
    return res.stdout


def test_home_page_as_the_render_starts_it(pods: HomePods) -> None:
    # startup.sh's `home` dev server: the page's command line as the render's startup script runs it
    # (its bind address is startup.sh's: loopback, or the pod IP plus loopback; the OAuth proxy uses loopback)
    ps = pods.exec(0, "ps -o args= -e").stdout
    assert re.search(rf"^python3 /opt/ml-dev-env/home_page.py serve --listen \S*:{HOME_PORT}$", ps, re.M), ps
    assert f"127.0.0.1:{HOME_PORT}" in pods.wait_for(0, f"{STATE}/home.addr")
    assert "APP_NAME" not in pods.pods[0].env, "the render does not give the app name; the page derives it from POD_NAME"
    page = get(pods)
    assert (
        f'data-app="{pods.app}" data-namespace="{pods.namespace}"' in page
        and f"<title>{pods.app} in {pods.namespace} · home</title>" in page
    )
    # the links: the servers the pod runs (its env) but the page itself, by core/servers.py's titles
    servers = [s for s in pods.pods[0].env["ML_DEV_SERVERS"].split() if s != HOME_PAGE]
    titles = {s.name: s.title for s in DEV_SERVERS}
    links = re.findall(r'<a class="ide" data-server="([^"]+)" href="#">([^<]+)</a>', page)
    assert links == [(s, titles[s]) for s in servers], links
    # both agents through rank.env and the stub cluster DNS (no test override of the agents' addresses)
    assert "ML_DEV_HOME_AGENTS" not in pods.pods[0].env
    deadline = time.monotonic() + 30
    while not all(f'data-k="node:{pods.app}-{i}">node-{i}<' in (fragment := get(pods, "fragment")) for i in (0, 1)):
        assert time.monotonic() < deadline, fragment
        time.sleep(0.2)
    # a ConfigMap update swaps ..data and removes the directory the page started from: it keeps drawing
    startup = naming.startup_configmap(pods.app)
    volume = next(v for v in pods.pods[0].volumes.values() if (v.target / "home_page.py").exists())
    first = (volume.target / "..data").resolve()
    data = pods.configmaps[startup]
    pods.swap_configmap(startup, {**data, "inpod.home.page.py": data["inpod.home.page.py"] + "\n# updated\n"})
    assert first.is_dir() is False and (volume.target / "..data").resolve() != first
    deadline = time.monotonic() + 30
    while get(pods, "fragment").count("<svg") < 2:
        assert time.monotonic() < deadline, pods.log_of(0, "home")
        time.sleep(0.2)
    assert get(pods, "healthz") == "ok\n"
    assert inpod.text("inpod.lib.svgplot.py") == pods.pods[0].path("/opt/ml-dev-env/inpod/lib/svgplot.py").read_text()
