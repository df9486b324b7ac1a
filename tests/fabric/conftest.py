"""Fixtures: a simulated cluster of pods and a runner for the real fabric_check.py program."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components import fabric
from stacks.config import StackConfig
from tests.conftest import stack_objects
from tests.fabric.sim import Cluster

PROGRAM = fabric.PROGRAM


def barcelona_settings(**fabric_check: Any) -> dict:
    objects = stack_objects("barcelona")
    objects["fabricCheck"] = {**objects.get("fabricCheck", {}), **fabric_check}
    return fabric.pod_settings(StackConfig.model_validate(objects))


class Sim:
    def __init__(self, tmp: Path, n: int) -> None:
        self.tmp = tmp
        self.cluster = Cluster(tmp, n)
        self.settings = barcelona_settings()

    def env(self, host: int = 0) -> dict[str, str]:
        self.cluster.build()
        env = self.cluster.env_for(self.cluster.names[host], self.tmp / "bin", self.tmp / "scenario.json")
        config = self.tmp / "fabric.json"
        config.write_text(json.dumps(self.settings))
        env["ML_DEV_FABRIC_CONFIG"] = str(config)
        return env

    def run(self, *args: str, host: int = 0, timeout: float = 120) -> subprocess.CompletedProcess:
        env = self.env(host)
        return subprocess.run([sys.executable, str(PROGRAM), *args], env=env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, host: int = 0) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(PROGRAM), *args], env=self.env(host), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def calls(self, tool: str) -> list[dict]:
        path = self.tmp / "calls.log"
        if not path.exists():
            return []
        return [c for c in map(json.loads, path.read_text().splitlines()) if c["tool"] == tool]

    def result(self, host: int = 0, where: str = "workspace") -> dict:
        h = self.cluster.host(host)
        base = Path(h["workspace"]) / ".ml-dev-env" / "fabric" if where == "workspace" else Path(h["state"]) / "fabric"
        return json.loads((base / "latest.json").read_text())


@pytest.fixture
def sim(tmp_path: Path) -> Callable[[int], Sim]:
    return lambda n=2: Sim(tmp_path, n)
