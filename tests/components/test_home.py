"""What the stack renders for the home page: the program and svgplot in the startup ConfigMap (exactly the
files here), its own Route to an OAuth proxy in front of 127.0.0.1:8090, its URL output, and a pod-template
hash so a new page rolls the pods."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import inpod
from core.servers import DEV_SERVERS, HOME_PAGE
from inpod import contract
from inpod.home import page
from tools.mock_engine import RunResult


def test_barcelona_renders_the_home_page(run: Callable[..., RunResult]) -> None:
    result = run("barcelona")
    assert result.error is None, result.error
    data = result.one("kubernetes:core/v1:ConfigMap", "startup").inputs["data"]
    for key in ("home_page.py", "inpod.home.page.py", "inpod.lib.svgplot.py"):
        assert data[key] == inpod.path(key).read_text(), f"{key} ships verbatim"
    route = result.one("kubernetes:route.openshift.io/v1:Route", "home").inputs
    assert route["metadata"]["name"] == "ml-dev-env-home" and route["spec"]["tls"]["termination"] in ("edge", "reencrypt")
    assert result.outputs["home_url"] == f"https://{route['spec']['host']}"
    template: dict[str, Any] = result.one("kubernetes:apps/v1:StatefulSet").inputs["spec"]["template"]
    proxy = next(c for c in template["spec"]["containers"] if c["name"] == "home-proxy")
    assert "--upstream=http://127.0.0.1:8090" in proxy["args"] and "--provider=openshift" in proxy["args"]
    assert "ml-dev-env/home-page-sha256" in template["metadata"]["annotations"]
    main = template["spec"]["containers"][0]
    servers = next(e["value"] for e in main["env"] if e["name"] == "ML_DEV_SERVERS")
    assert servers.split() == ["vscode", "jupyter", "tensorboard", "home"]


def test_home_page_can_be_switched_off(run: Callable[..., RunResult]) -> None:
    result = run("barcelona", lambda o: o["access"].update(home=False))
    assert result.error is None, result.error
    assert not [r for r in result.of_type("kubernetes:route.openshift.io/v1:Route") if r.name.endswith("home")]
    assert result.outputs["home_url"] == ""


@pytest.mark.parametrize("off", [None, "jupyter"])
def test_page_links_the_enabled_servers_by_their_titles(
    run: Callable[..., RunResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, off: str | None
) -> None:
    # the page reads its links from the render (the startup ConfigMap's file beside it), the titles core/servers.py's
    result = run("barcelona", lambda o: o["access"].update({off: False}) if off else None)
    assert result.error is None, result.error
    data = result.one("kubernetes:core/v1:ConfigMap", "startup").inputs["data"]
    (tmp_path / contract.HOME_LINKS_FILE).write_text(data[contract.HOME_LINKS_FILE])
    monkeypatch.setenv(contract.STARTUP_DIR_ENV, str(tmp_path))
    shown = re.findall(r'<a class="ide" data-server="([^"]+)" href="#">([^<]+)</a>', page.links_html())
    enabled = [s for s in DEV_SERVERS if s.name not in (off, HOME_PAGE)]
    assert shown == [(s.name, html.escape(s.title)) for s in enabled], shown
    assert "tensorboard" in dict(shown) and (off is None) == ("jupyter" in dict(shown))
