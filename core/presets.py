"""The image presets (`images/presets.yaml`): GPU architecture → CUDA, PyTorch and build settings.

Read by config validation (`image.build.preset` must name one) and by the image build.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

PRESETS_FILE = Path(__file__).resolve().parent.parent / "images" / "presets.yaml"


@functools.cache
def presets_file() -> dict[str, Any]:
    return yaml.safe_load(PRESETS_FILE.read_text())


def preset(name: str | None) -> dict[str, Any]:
    data = presets_file()
    return data["presets"][name or data["default"]]


def base_lock(name: str | None) -> Path:
    """The hash lock the base stage installs for this preset's Python (`make lock` writes it)."""
    return PRESETS_FILE.parent / f"base-requirements-py{preset(name)['python']}.txt"


def base_lock_pythons() -> list[str]:
    """Every Python version a preset's base image runs: one lock each."""
    return sorted({str(p["python"]) for p in presets_file()["presets"].values()})
