"""The hash-locked requirement sets (`make lock`) cover their direct pins and agree with each other.

Offline checks only; `tools/lock.sh --check` (pre-commit) re-resolves against the index.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.presets import base_lock_pythons

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {
    "requirements.in": "requirements.txt",
    "requirements-dev.in": "requirements-dev.txt",
    "policy/requirements.in": "policy/requirements.txt",
    "steps/requirements.in": "steps/requirements.txt",  # the tools image (images/tools.Containerfile)
}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\#]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct_pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            pins |= direct_pins(path.parent / line[3:].strip())
        elif m := PIN.match(line):
            pins[_norm(m[1])] = m[2]
    return pins


def locked(path: Path) -> dict[str, str]:
    """name → version of a uv lock; every requirement must carry at least one sha256 hash."""
    text = path.read_text()
    out: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.strip()):
        m = PIN.match(block)
        assert m, f"{path.name}: unexpected line {block.splitlines()[0]!r}"
        assert "--hash=sha256:" in block, f"{path.name}: {m[1]} has no hash"
        out[_norm(m[1])] = m[2]
    return out


@pytest.mark.parametrize("source", sorted(LOCKS))
def test_every_direct_pin_is_locked_at_its_version(source: str) -> None:
    lock = locked(ROOT / LOCKS[source])
    for name, version in direct_pins(ROOT / source).items():
        assert lock.get(name) == version, f"{LOCKS[source]}: {name} locked at {lock.get(name)}, {source} pins {version}: run make lock"


def test_runtime_policy_and_tools_locks_agree_with_the_dev_lock() -> None:
    dev = locked(ROOT / "requirements-dev.txt")
    for lock in ("requirements.txt", "policy/requirements.txt", "steps/requirements.txt"):
        for name, version in locked(ROOT / lock).items():
            assert dev.get(name) == version, f"{lock}: {name}=={version} but requirements-dev.txt has {dev.get(name)}"


# The base image's locks (images/base-requirements-py<python>.txt), one per Python of a preset's base image.
BASE_IN = ROOT / "images" / "base-requirements.in"
BASE_OWNED = {"torch", "torchvision", "torchaudio", "triton", "flash-attn", "numpy"}  # images/base-overrides.txt


@pytest.mark.parametrize("python", base_lock_pythons())
def test_the_base_lock_of_each_python_pins_the_dev_tools_and_leaves_the_base_owned_packages_out(python: str) -> None:
    lock = locked(ROOT / "images" / f"base-requirements-py{python}.txt")
    pins = direct_pins(BASE_IN)
    for name in ("jupyterlab", "tensorboard", "deepspeed", "transformers", "accelerate", "ipykernel", "debugpy", "ninja"):
        assert name in pins, f"{name} is not pinned in {BASE_IN.name}"
    for name, version in pins.items():
        assert lock.get(name) == version, (
            f"Python {python}: {name} locked at {lock.get(name)}, {BASE_IN.name} pins {version}: run make lock"
        )
    assert not BASE_OWNED & set(lock), f"base-owned packages in the lock: {sorted(BASE_OWNED & set(lock))}"
    assert not [n for n in lock if n.startswith("nvidia-")], "the torch family's CUDA wheels are the base image's"
