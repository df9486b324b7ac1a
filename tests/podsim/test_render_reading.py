"""The simulation's reading of the render (no root needed): env as the kubelet makes it, the atomic-writer layout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import inpod
from tests.conftest import run_objects, stack_objects
from tests.podsim.layout import DATA, AtomicVolume
from tests.podsim.render import KUBERNETES_ADDED, PodFacts, container_env, expand, main_container, service_links


def test_expansion_follows_the_kubelet() -> None:
    defined = {"A": "x"}
    assert expand("$(A)/$(B)/$$(A)/$$", defined) == "x/$(B)/$(A)/$"


@pytest.mark.parametrize("stack", ["barcelona", "nerc-production"])
def test_env_of_a_rendered_pod(stack: str) -> None:
    res = run_objects(stack, stack_objects(stack), {"vscodePassword": "x", "jupyterToken": "y"})
    assert res.error is None, res.error
    sts = next(r for r in res.resources if r.kind == "StatefulSet").inputs
    main = main_container(sts, "ml-dev")
    pod = PodFacts(f"{sts['metadata']['name']}-1", sts["metadata"]["namespace"], "10.128.0.11", "node-b")
    secrets = {
        r.inputs["metadata"]["name"]: dict.fromkeys(r.inputs.get("stringData") or {}, "test") for r in res.resources if r.kind == "Secret"
    }
    links = service_links(res.resources, sts["spec"]["template"]["spec"])
    env = container_env(main, pod, secrets, links)
    rendered = [e["name"] for e in main["env"]]
    assert set(env) - set(rendered) == {"HOSTNAME", *KUBERNETES_ADDED, *links}
    # the dev Service (ClusterIP) links in, the headless one (clusterIP None) does not
    prefix = sts["metadata"]["name"].upper().replace("-", "_")
    assert f"{prefix}_SERVICE_HOST" in env and not [k for k in env if k.startswith(f"{prefix}_HEADLESS_")]
    assert env["POD_NAME"] == env["HOSTNAME"] == pod.name and env["POD_IP"] == pod.ip
    assert env["HOME"] == env["ML_DEV_HOME"] and env["HOME"].endswith(f"/.home/{pod.name}")
    assert "$(" not in "".join(env.values())
    # the render never gives the pods what the programs read from files (cluster.env, devloop.env)
    assert not {"APP_NAME", "HEADLESS_SERVICE", "ML_DEV_SSH_PORT"} & set(env)


class _Resource:
    def __init__(self, kind: str, inputs: dict[str, Any]) -> None:
        self.kind, self.inputs = kind, inputs


def test_service_links_follow_the_kubelet() -> None:
    """pkg/kubelet/envvars/envvars.go FromServices: first port, named ports, protocols; headless Services skipped;
    `enableServiceLinks: false` adds none (the `kubernetes` Service's variables come regardless)."""
    web = {"metadata": {"name": "my-app"}, "spec": {"ports": [{"port": 80, "name": "http"}, {"port": 53, "protocol": "UDP"}]}}
    headless = {"metadata": {"name": "my-app-headless"}, "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}}
    links = service_links([_Resource("Service", headless), _Resource("Service", web)], {})
    ip = links["MY_APP_SERVICE_HOST"]
    assert links == {
        "MY_APP_SERVICE_HOST": ip,
        "MY_APP_SERVICE_PORT": "80",
        "MY_APP_SERVICE_PORT_HTTP": "80",
        "MY_APP_PORT": f"tcp://{ip}:80",
        "MY_APP_PORT_80_TCP": f"tcp://{ip}:80",
        "MY_APP_PORT_80_TCP_PROTO": "tcp",
        "MY_APP_PORT_80_TCP_PORT": "80",
        "MY_APP_PORT_80_TCP_ADDR": ip,
        "MY_APP_PORT_53_UDP": f"udp://{ip}:53",
        "MY_APP_PORT_53_UDP_PROTO": "udp",
        "MY_APP_PORT_53_UDP_PORT": "53",
        "MY_APP_PORT_53_UDP_ADDR": ip,
    }
    assert service_links([_Resource("Service", web)], {"enableServiceLinks": False}) == {}
    pod = PodFacts("p-0", "ns", "10.128.0.10", "node-a")
    container = {"env": [{"name": "MY_APP_SERVICE_PORT", "value": "own"}, {"name": "U", "value": "$(MY_APP_SERVICE_HOST)"}]}
    env = container_env(container, pod, {}, links)
    assert env["MY_APP_SERVICE_PORT"] == "own" and env["U"] == ip  # a rendered name wins; $(VAR) may name a link


def test_programs_see_the_mount_path_through_the_kubelet_layout(tmp_path: Path) -> None:
    mount = tmp_path / "opt-ml-dev-env"
    vol = AtomicVolume(mount, mode=0o555)
    shipped = {**inpod.group("devloop"), **inpod.group("fabric")}  # ml-dev, fabric_check.py and their modules
    first = vol.write(shipped)
    assert os.readlink(mount / "ml-dev") == f"{DATA}/ml-dev" and os.readlink(mount / DATA) == first.name
    # as `python3 <script>` does: __main__.__file__ is the script as called, and its directory (symlinks resolved,
    # docs: sys.path) is first on sys.path for its sibling modules; ml-dev keeps HERE in its library module
    probe = (
        "import os, runpy, sys; sys.modules['__main__'].__file__ = sys.argv[1]; "
        "sys.path.insert(0, os.path.dirname(os.path.realpath(sys.argv[1]))); "
        "g = runpy.run_path(sys.argv[1], run_name='probe'); "
        "lib = sys.modules.get('ml_dev_lib'); print(lib.HERE if lib else g['PROGRAM'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "ML_DEV_DIR"}
    for key, want in (("ml-dev", mount), ("fabric_check.py", mount / "fabric_check.py")):
        out = subprocess.run([sys.executable, "-c", probe, str(mount / key)], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(want), f"{key} would hand other pods {out.stdout.strip()}"
    # an update swaps ..data: the old timestamped directory is gone, the mount path still works
    second = vol.write(shipped)
    assert second != first and not first.exists()
    out = subprocess.run([sys.executable, str(mount / "ml-dev"), "run", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--per-pod" in out.stdout
