"""The home page started as pod 0 starts it, on the pod simulation's reading of the render (tests/podsim):
the rendered container env as the kubelet expands it, the startup ConfigMap in the kubelet's atomic-writer
layout. The agents, the gate and the state are the simulated pods' of tests/home/conftest.py; what the
page takes from the pod (its env, its files) is the render's.

The simulation has no network namespaces yet, so the page still reaches the agents on 127.0.0.1
(ML_DEV_HOME_AGENTS) and uses the simulated pod's state directory."""

from __future__ import annotations

import time
from typing import Any

import inpod
from core import naming
from tests.conftest import run_objects, stack_objects
from tests.home.conftest import Environment
from tests.podsim.layout import AtomicVolume
from tests.podsim.render import PodFacts, container_env, main_container


def rendered_pod0() -> tuple[dict[str, str], dict[str, str]]:
    """Pod 0's main-container env and its startup ConfigMap data, from the barcelona render."""
    res = run_objects("barcelona", stack_objects("barcelona"))
    assert res.error is None, res.error
    sts: dict[str, Any] = next(r for r in res.resources if r.kind == "StatefulSet").inputs
    app, ns = sts["metadata"]["name"], sts["metadata"]["namespace"]
    pod = PodFacts(f"{app}-0", ns, "10.128.0.10", "gpu-node-0")
    secrets = {
        r.inputs["metadata"]["name"]: dict.fromkeys(r.inputs.get("stringData") or {}, "test") for r in res.resources if r.kind == "Secret"
    }
    env = container_env(main_container(sts, naming.MAIN_CONTAINER), pod, secrets)
    data = next(r for r in res.resources if r.kind == "ConfigMap" and r.inputs["metadata"]["name"] == naming.startup_configmap(app))
    return env, dict(data.inputs["data"])


def test_home_page_from_the_rendered_pod(environment: Environment) -> None:
    env, data = rendered_pod0()
    mount = environment.root / "opt-ml-dev-env"
    volume = AtomicVolume(mount, mode=0o555)
    first = volume.write(data)
    keep = {k: env[k] for k in ("POD_NAME", "POD_NAMESPACE", "ML_DEV_SERVERS", "NODE_NAME")}
    keep["PYTHONDONTWRITEBYTECODE"] = "1"  # the kubelet mounts the volume read-only: no __pycache__ beside the files
    assert "APP_NAME" not in env, "the render does not give the app name; the page derives it from POD_NAME"
    environment.start(program=mount / "home_page.py", pod_env=keep)
    page = environment.get()
    assert 'data-app="ml-dev-env" data-namespace="nccl-test"' in page and "<title>ml-dev-env home</title>" in page
    assert [s for s in ("vscode", "jupyter", "tensorboard") if f'data-server="{s}"' in page] == env["ML_DEV_SERVERS"].split()[:3]
    # a ConfigMap update swaps ..data and removes the directory the page started from: it keeps drawing
    second = volume.write({**data, "home_page.py": data["home_page.py"] + "\n# updated\n"})
    assert second != first and not first.exists()
    deadline = time.monotonic() + 30
    while environment.get("fragment").count("<svg") < 2:
        assert time.monotonic() < deadline, environment.log.read_text()
        time.sleep(0.2)
    assert environment.get("healthz") == "ok\n" and inpod.text("svgplot.py") == (mount / "svgplot.py").read_text()
