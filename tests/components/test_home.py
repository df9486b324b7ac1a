"""What the stack renders for the home page: the program and svgplot in the startup ConfigMap (exactly the
files here), its own Route to an OAuth proxy in front of 127.0.0.1:8090, its URL output, and a pod-template
hash so a new page rolls the pods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import inpod
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
