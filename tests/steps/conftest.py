"""Fixtures for the step-program tests: the deployed script texts and real local services.

Every step runs as it deploys: the steps of the tools image as `python3 <tree>/steps/<name>.py` from the
tree `steps.embed.write_tree` lays out from the image's files (`shipped()`), an embedded step as the exact
text `steps.embed.step_script(name)` returns, written to a file; both with this interpreter.
Services (docker-registry with token or htpasswd auth, moto S3,
HTTP proxies, the model-registry stand-in, a fake Hugging Face Hub) listen on 127.0.0.1 ports
and are torn down after use; tests skip only when a required binary is absent.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import random
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from steps.embed import EMBEDDED, STEPS, step_script, write_tree
from tests.fixtures import programs
from tests.fixtures.images import push_base, skopeo_available, skopeo_missing
from tests.fixtures.model_registry import ModelRegistryStandIn, run_model_registry
from tests.fixtures.proxy import HttpProxy, run_proxy
from tests.fixtures.registry import Registry, registry_available, registry_missing, run_registry
from tests.fixtures.s3 import S3Server, run_s3

REGISTRY_MISSING = registry_missing() or ""
needs_registry = pytest.mark.skipif(not registry_available(), reason=REGISTRY_MISSING)
needs_skopeo = pytest.mark.skipif(not skopeo_available(), reason=skopeo_missing() or "")


@dataclass
class StepRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error(self) -> str:
        """The step's one-line error message (last stderr line)."""
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


StepRunner = Callable[..., StepRun]


@pytest.fixture(scope="session")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each step's program as it deploys: the tools image's file, or the script embedded into the Task."""
    root = tmp_path_factory.mktemp("scripts")
    steps_dir = write_tree(root / "image")
    paths = {}
    for name in STEPS:
        paths[name] = steps_dir / f"{name}.py"
        if name in EMBEDDED:
            paths[name] = root / f"{name}.py"
            paths[name].write_text(step_script(name))
    return paths


@pytest.fixture(scope="session")
def run_step(scripts: dict[str, Path]) -> StepRunner:
    """run_step(name, *args, env=None, timeout=120) runs the deployed script and returns its outcome."""

    def run(name: str, *args: object, env: dict[str, str] | None = None, timeout: float = 120) -> StepRun:
        proc = subprocess.run(
            [sys.executable, str(scripts[name]), *map(str, args)],
            capture_output=True,
            text=True,
            env=env if env is not None else dict(os.environ),
            timeout=timeout,
        )
        return StepRun(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture(scope="session")
def deployed(scripts: dict[str, Path]) -> Callable[[str], types.ModuleType]:
    """The deployed text of a step loaded as a module (for unit checks of its pure helpers); `lib.<module>` names one
    of the image's lib modules."""

    def load(name: str) -> types.ModuleType:
        if name in EMBEDDED:
            module_name = f"deployed_step_{name}"
            if module_name not in sys.modules:
                module = types.ModuleType(module_name)
                sys.modules[module_name] = module  # dataclasses resolve annotations through sys.modules
                exec(compile(step_script(name), f"<step_script({name!r})>", "exec"), module.__dict__)
            return sys.modules[module_name]
        # The image's package (as its launcher `python3 <file>` finds it), under a name of its own: `steps` is this
        # repository's package here. Inside it every import is relative, so the name is free.
        package = scripts["package"].parent / "steps"
        if DEPLOYED not in sys.modules:
            spec = importlib.util.spec_from_file_location(DEPLOYED, package / "__init__.py", submodule_search_locations=[str(package)])
            assert spec is not None and spec.loader is not None
            sys.modules[DEPLOYED] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[DEPLOYED])
        assert Path(sys.modules[DEPLOYED].__file__ or "").parent == package, "one image tree per session"
        return importlib.import_module(f"{DEPLOYED}.{name}")

    return load


DEPLOYED = "deployed_steps"


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def quay(services_dir: Path) -> Iterator[Registry]:
    """Stands in for Quay: bearer-token challenge, token service with user/password."""
    missing = registry_missing()
    if missing:
        pytest.skip(missing)
    with run_registry(services_dir, "quay", auth="token") as registry:
        yield registry


@pytest.fixture(scope="session")
def internal(services_dir: Path) -> Iterator[Registry]:
    """Stands in for the OpenShift internal registry: Basic auth, user `serviceaccount`, password = token."""
    missing = registry_missing()
    if missing:
        pytest.skip(missing)
    with run_registry(services_dir, "internal", auth="htpasswd", username="serviceaccount", password="sa-token-1") as registry:
        yield registry


@pytest.fixture(scope="session")
def base_image(quay: Registry, services_dir: Path) -> str:
    """A runnable base (shell, ln, sleep, ...) pushed to `quay` as a multi-arch index."""
    missing = skopeo_missing()
    if missing:
        pytest.skip(missing)
    return push_base(services_dir, quay, "base/shell:1")


@pytest.fixture
def quay_proxy(quay: Registry) -> Iterator[HttpProxy]:
    """A counting, fault-injecting proxy in front of `quay` (fresh per test)."""
    with run_proxy(quay.port) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    with run_s3() as server:
        yield server


@pytest.fixture
def model_registry() -> Iterator[ModelRegistryStandIn]:
    with run_model_registry() as registry:
        yield registry


@pytest.fixture
def repo_name(request: pytest.FixtureRequest) -> str:
    """A repository name unique to the test, so tests never share blobs or tags."""
    return "models/" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:60].strip("-")


def write_model(directory: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, bytes]:
    """Create model files of the given sizes (random, incompressible) and return their contents."""
    rng = random.Random(seed)
    files = {}
    for rel, size in sizes.items():
        data = rng.randbytes(size)
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[rel] = data
    return files


SMALL_MODEL = {
    "config.json": 700,
    "generation_config.json": 120,
    "model-00001-of-00002.safetensors": 3 * 1024 * 1024 + 17,
    "model-00002-of-00002.safetensors": 2 * 1024 * 1024 + 5,
    "model.safetensors.index.json": 900,
    "tokenizer/tokenizer.json": 4096,
}


@pytest.fixture
def model_dir(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A small synthetic model under <tmp>/ws/models (the workspace layout of the pipeline)."""
    directory = tmp_path / "ws" / "models"
    return directory, write_model(directory, SMALL_MODEL)


@pytest.fixture(scope="session")
def has_chroot() -> bool:
    return os.geteuid() == 0 and chroot_missing() is None


def chroot_missing() -> str | None:
    """Why the end-to-end pipeline cannot run its steps in a chroot here for want of a program."""
    return programs.missing("chroot")
