"""The delivery table `inpod.SHIPPED` against what the program renders: the startup ConfigMap of every
committed stack carries each shipped program byte for byte from the package, and no program that the table
does not list. Besides the programs it holds only the two settings files the components render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import inpod
from components import fabric
from core import naming
from tests.conftest import STACKS, run_objects, stack_objects

CONFIGMAP = "kubernetes:core/v1:ConfigMap"
# Rendered from the stack's config (data, not programs): the launcher's facts and the fabric check's settings.
SETTINGS = {"devloop.env", fabric.CONFIG_KEY}
# Files of the package that are not programs.
NOT_SHIPPED = {"__init__.py"}


def startup_data(stack: str) -> dict[str, str]:
    result = run_objects(stack, stack_objects(stack))
    assert result.error is None, result.error
    # The StatefulSet's name is the app name (an environment stack's is `<cluster appName>-<environment>`).
    app = result.one("kubernetes:apps/v1:StatefulSet").inputs["metadata"]["name"]
    found = [r for r in result.of_type(CONFIGMAP) if r.inputs["metadata"]["name"] == naming.startup_configmap(app)]
    assert len(found) == 1, [r.inputs["metadata"]["name"] for r in result.of_type(CONFIGMAP)]
    return dict(found[0].inputs["data"])


@pytest.fixture(scope="module", params=STACKS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    return request.param, startup_data(request.param)


def test_every_stack_ships_exactly_the_table(rendered: tuple[str, dict[str, str]]) -> None:
    stack, data = rendered
    shipped = {s.key for s in inpod.SHIPPED}
    assert set(data) - SETTINGS == shipped, f"{stack}: shipped keys differ from inpod.SHIPPED"
    for key in shipped:
        assert data[key] == (inpod.HERE / next(s.source for s in inpod.SHIPPED if s.key == key)).read_text(), (
            f"{stack}: {key} is not the package's file byte for byte"
        )


def test_settings_files_are_data_not_programs(rendered: tuple[str, dict[str, str]]) -> None:
    stack, data = rendered
    assert SETTINGS <= set(data), f"{stack}: {sorted(SETTINGS - set(data))} missing"
    json.loads(data[fabric.CONFIG_KEY])
    for line in data["devloop.env"].splitlines():
        assert line.startswith("#") or ("=" in line and line.split("=", 1)[0].isidentifier()), f"{stack}: devloop.env line {line!r}"
    texts = {s.key: inpod.text(s.key) for s in inpod.SHIPPED}
    for key in SETTINGS:
        assert not data[key].startswith("#!") and data[key] not in texts.values(), f"{stack}: {key} is a program"


def test_the_table_covers_the_package() -> None:
    """Every file of the package ships (one row each), every row names a file of the package, keys are unique."""
    keys = [s.key for s in inpod.SHIPPED]
    sources = [s.source for s in inpod.SHIPPED]
    assert len(set(keys)) == len(keys) and len(set(sources)) == len(sources)
    files = {p.name for p in inpod.HERE.iterdir() if p.is_file()} - NOT_SHIPPED
    assert set(sources) == files, f"not shipped: {sorted(files - set(sources))}; missing: {sorted(set(sources) - files)}"
    assert {s.group for s in inpod.SHIPPED} == {"startup", "devloop", "lifecycle", "fabric", "usage", "home"}
    for s in inpod.SHIPPED:
        assert inpod.path(s.key) == inpod.HERE / s.source and inpod.text(s.key) == Path(inpod.HERE / s.source).read_text()
    with pytest.raises(KeyError, match="not shipped"):
        inpod.path("nope.sh")
