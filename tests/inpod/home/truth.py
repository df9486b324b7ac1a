"""What the home page must show for what a test made on simulated pods (tests/inpod/home/pods.py HomePods): every
value the page marks (tests/inpod/home/numbers.py), from the test's ground truth: the people's connections and the
ranks it started, the GPU utilisations it set, the usage record it serves (FakeApiServer under the render's RBAC of
the pods' ServiceAccount), the gate's result, pod 0's agent's decisions."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import naming
from inpod import contract
from inpod.lib.pod import ago, clock
from tests.inpod.home.numbers import USAGE, check, idle_truth, shown, status_hours
from tests.inpod.home.pods import STATE, HomePods
from tests.inpod.idle.conftest import TOKEN, FakeApiServer
from tests.podsim.idlestop import serve_api
from tests.podsim.render import pod_rules

FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"


class PageTruth:
    def __init__(self, pods: HomePods, result: dict[str, Any]) -> None:
        self.pods, self.result = pods, result
        self.settings = json.loads(pods.configmaps[naming.lifecycle_configmap(pods.app)]["idle.json"])
        self.api: FakeApiServer | None = None
        self.server: Any = None
        self.now = time.time()
        """The time of the page being checked (its `data-now`): a run's age is the page's at that time."""

    def serve_usage(self, tmp: Path) -> FakeApiServer:
        """The API where the pods reach it (the `kubernetes` Service), authorizing as the render does for the pods'
        ServiceAccount, with a usage record; the pods' service-account volume gets its token and CA."""
        self.api = FakeApiServer(pod_rules(self.pods.result))
        self.api.usage = dict(USAGE)
        self.server, ca = serve_api(self.pods, self.api.httpd.RequestHandlerClass, tmp)
        for pod in self.pods.pods:
            pod.volumes["kube-api-access"].write({"token": TOKEN, "ca.crt": ca, "namespace": self.pods.namespace})
        return self.api

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.api is not None:
            self.api.close()

    def decision(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.settings['activityPort']}/decision"
        res = self.pods.exec(0, ["python3", "-c", FETCH, url], timeout=30)
        return dict(json.loads(res.stdout)) if res.returncode == 0 else {}

    def expected(self, ssh: dict[int, list[tuple[str, str]]], ranks: dict[int, int], utils: dict[int, int]) -> dict[str, Any]:
        """`ssh`: (user, client address) of each person's connection into each pod; `ranks`: the ranks on each;
        `utils`: GPU 0's utilisation on each (the others idle at 0 %)."""
        pods, result = self.pods, self.result
        out: dict[str, Any] = {
            "title": f"{pods.app} in {pods.namespace} · home",
            "usage-days": "7",
            "fabric-time": result["time"],
            "plateau": str(result["plateauBusbw"]),
            "pass": str(result["expectation"]["pass_busbw_gbs"]),
            "diagnosis": list(result["diagnosis"]),
            "conn-pod": [p.name for i, p in enumerate(pods.pods) for _ in ssh[i]],
        }
        if self.api is not None:
            out["gpu-hours-7d"] = status_hours(USAGE, pods.app, pods.namespace)
        for i, pod in enumerate(pods.pods):
            out.update({f"rank:{pod.name}": str(i), f"pod:{i}": pod.name, f"node:{pod.name}": f"node-{i}"})
            for g in range(pods.gpus):
                util = utils[i] if g == 0 else 0
                out[f"gpu:{pod.name}:{g}"] = f"GPU {g}: {util}% {'busy' if util >= self.settings['gpuUtilThreshold'] else 'idle'}"
            out.update({f"ssh:{pod.name}": str(len(ssh[i])), f"ranks:{pod.name}": str(ranks[i])})
            out[f"conn:{pod.name}"] = [f"{user} from {address}" for user, address in ssh[i]]
            # GPU 0 is the only one ever above 0 %: the busiest
            out.update({f"busiest:{pod.name}": "GPU 0", f"gpus:{pod.name}": str(pods.gpus), f"since:{pod.name}": self.since(pod.name)})
        gate = pods.records(0, f"{contract.ENV_GATE_DIR}/{contract.ENV_GATE_LAST}")
        if gate.exists():  # the runs' drift gate: the same pods, one environment
            record = json.loads(gate.read_text())
            out["environment"] = f"one environment ({record['at']}, {len(pods.pods)} ranks)"
        for n, beat in enumerate(sorted(pods.pods[0].path(f"{STATE}/heartbeat").glob("run-*.json"))):
            info = json.loads(beat.read_text())
            out.update(
                {
                    f"run:{n}:command": shlex.join(info["command"]),
                    f"run:{n}:cwd": info["cwd"],
                    f"run:{n}:on": pods.pods[0].name,
                    f"run:{n}:pods": str(len(info["pods"])),
                    f"run:{n}:age": lambda v, started=info["started"]: len(v) == 1 and v[0] in self.ages(started),
                }
            )
        return out

    def since(self, pod: str) -> Callable[[list[str]], bool]:
        """A plot's "since": the first sample of the history the page keeps (its file in pod 0's workspace)."""

        def ok(shown: list[str]) -> bool:
            # not yet (settle asks again): the page shows a pod's samples before its next write of the file holds them
            try:
                history = json.loads(self.pods.records(0, "home/history.json").read_text()).get("samples", {}).get(pod)
            except (OSError, ValueError):
                return False
            return bool(history) and shown == [clock(history[0][0])]

        return ok

    def problems(self, page: str, make: Callable[[], dict[str, Any]], seen: list[dict[str, Any]]) -> list[str]:
        """What differs between every number on `page` (HTML: the whole page or its live part) and the truth (`make()`;
        the idle card against one of pod 0's agent's decisions `seen`: the page shows the one it sampled)."""
        found = re.search(r'data-now="([0-9.]+)"', page)
        if not found:
            return ["no live part (data-now) on the page"]
        values, stray = shown(page)
        self.now = float(found.group(1))
        base = {**make(), "updated": clock(self.now)}
        if "<header" not in page:  # the live part only (`/fragment`): the title is the whole page's
            base.pop("title", None)
        options = [check(values, stray, {**base, **idle_truth(d, self.settings, self.now)}) for d in seen if d.get("lastActive")]
        return sorted(options, key=len)[0] if options else ["pod 0's agent has decided nothing yet"]

    def settle(self, read: Callable[[], str], make: Callable[[], dict[str, Any]], what: str, timeout: float = 60) -> str:
        """Until every number on the page (`read()`: its HTML) is the truth (`make()`, again each round), else the
        differences."""
        deadline = time.monotonic() + timeout
        problems, page = ["never read"], ""
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            seen = [*seen[-40:], self.decision()]  # ~20 s of them: the page shows one it sampled up to a refresh ago
            page = read()
            problems = self.problems(page, make, seen)
            if not problems:
                return page
            time.sleep(0.2)
        self.fail(what, problems, page)
        return page

    def fail(self, what: str, problems: list[str], page: str) -> None:
        why = "\n".join(problems)
        raise AssertionError(f"{what}: the page's numbers are not the test's:\n{why}\n{page}\n{self.pods.log_of(0, 'home')}")

    def ages(self, started: float) -> set[str]:
        """A run's age as the page showed it at its time (`data-now`, kept to the millisecond)."""
        return {ago(self.now - started + d) for d in (-0.001, 0, 0.001)}
