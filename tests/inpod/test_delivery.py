"""The delivery table `inpod.SHIPPED` against what the program renders: the startup ConfigMap of every
committed stack carries each shipped program byte for byte from the package, and no program that the table
does not list. Besides the programs it holds only the two settings files the components render. The volume puts every
key at its path in the pod (`items`), and every file of the package ships (a module the table misses would be absent
in the pod: its import fails there)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import inpod
from components import fabric
from core import naming
from inpod import contract
from tests.conftest import STACKS, run_objects, stack_objects

CONFIGMAP = "kubernetes:core/v1:ConfigMap"
# Rendered from the stack's config (data, not programs): the launcher's facts and the fabric check's settings.
SETTINGS = {"devloop.env", fabric.CONFIG_KEY, contract.HOME_LINKS_FILE}
# k8s.io/apimachinery pkg/util/validation/validation.go IsConfigMapKey (configMapKeyFmt), never "." / ".." or "..*"
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def startup_data(stack: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The startup ConfigMap's data and the `items` of the StatefulSet's volume that mounts it."""
    result = run_objects(stack, stack_objects(stack))
    assert result.error is None, result.error
    # The StatefulSet's name is the app name (an environment stack's is `<cluster appName>-<environment>`).
    sts = result.one("kubernetes:apps/v1:StatefulSet").inputs
    app = sts["metadata"]["name"]
    found = [r for r in result.of_type(CONFIGMAP) if r.inputs["metadata"]["name"] == naming.startup_configmap(app)]
    assert len(found) == 1, [r.inputs["metadata"]["name"] for r in result.of_type(CONFIGMAP)]
    volumes = [
        v for v in sts["spec"]["template"]["spec"]["volumes"] if (v.get("configMap") or {}).get("name") == naming.startup_configmap(app)
    ]
    assert len(volumes) == 1, volumes
    return dict(found[0].inputs["data"]), list(volumes[0]["configMap"]["items"])


@pytest.fixture(scope="module", params=STACKS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    data, _ = startup_data(request.param)
    return request.param, data


@pytest.mark.parametrize("stack", STACKS)
def test_the_volume_puts_every_key_at_its_path(stack: str) -> None:
    """A volume with `items` holds the listed keys only (k8s.io/api core/v1/types.go ConfigMapVolumeSource.Items):
    every key of the ConfigMap is listed, a shipped key at the table's path, a settings file at its own name; paths
    are relative without `..` (KeyToPath.Path) and keys flat (IsConfigMapKey)."""
    data, items = startup_data(stack)
    assert sorted(i["key"] for i in items) == sorted(data), f"{stack}: keys not in items: {sorted(set(data) - {i['key'] for i in items})}"
    paths = {s.key: s.path for s in inpod.SHIPPED}
    for item in items:
        assert CONFIGMAP_KEY.fullmatch(item["key"]) and not item["key"].startswith(".."), item
        assert not item["path"].startswith("/") and ".." not in item["path"].split("/"), item
        assert item["path"] == paths.get(item["key"], item["key"]), item
    assert len({i["path"] for i in items}) == len(items)


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
    json.loads(data[contract.HOME_LINKS_FILE])
    for line in data["devloop.env"].splitlines():
        assert line.startswith("#") or ("=" in line and line.split("=", 1)[0].isidentifier()), f"{stack}: devloop.env line {line!r}"
    texts = {s.key: inpod.text(s.key) for s in inpod.SHIPPED}
    for key in SETTINGS:
        assert not data[key].startswith("#!") and data[key] not in texts.values(), f"{stack}: {key} is a program"


def package_files() -> set[str]:
    return {str(p.relative_to(inpod.HERE)) for p in inpod.HERE.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def unshipped(files: set[str]) -> set[str]:
    """Files of the package that no row ships."""
    return files - {s.source for s in inpod.SHIPPED}


def test_the_table_covers_the_package() -> None:
    """Every file of the package ships (one row each), every row names a file of the package, keys and paths are
    unique; the package ships under inpod/ at its own layout, the rest at the mount root."""
    keys = [s.key for s in inpod.SHIPPED]
    sources = [s.source for s in inpod.SHIPPED]
    assert len(set(keys)) == len(keys) and len(set(sources)) == len(sources) and len({s.path for s in inpod.SHIPPED}) == len(keys)
    files = package_files()
    assert not unshipped(files), f"not shipped: {sorted(unshipped(files))}"
    assert set(sources) <= files, f"missing: {sorted(set(sources) - files)}"
    assert {s.group for s in inpod.SHIPPED} == {"package", "startup", "devloop", "lifecycle", "fabric", "usage", "home", "servers"}
    for s in inpod.SHIPPED:
        assert inpod.path(s.key) == inpod.HERE / s.source and inpod.text(s.key) == Path(inpod.HERE / s.source).read_text()
        assert CONFIGMAP_KEY.fullmatch(s.key), s
        if s.source.endswith(".py") and not s.source.startswith("bin/"):
            assert s.path == f"inpod/{s.source}", f"{s.source}: a module ships at its place in the package"
        else:
            assert "/" not in s.path, f"{s.source}: launchers and shell files ship at the mount root"
    with pytest.raises(KeyError, match="not shipped"):
        inpod.path("nope.sh")


def test_an_unshipped_module_fails() -> None:
    """The check above, on a package with one module more than the table: it names the module."""
    assert not (inpod.HERE / "fabric" / "zz_unshipped_probe.py").exists()
    assert unshipped(package_files() | {"fabric/zz_unshipped_probe.py"}) == {"fabric/zz_unshipped_probe.py"}


def test_every_launcher_is_three_lines_importing_its_package() -> None:
    """bin/: `#!/usr/bin/env python3`, one absolute import of the package's `main`, `raise SystemExit(main())`;
    no sys.path edit (Python puts the launcher's real directory, which holds inpod/, first on sys.path)."""
    launchers = [s for s in inpod.SHIPPED if s.source.startswith("bin/")]
    paths = {"ml-dev", "ml-dev-why", "fabric_check.py", "idle_agent.py", "home_page.py", "usage.py", "forward.py"}
    assert {s.path for s in launchers} == paths
    for s in launchers:
        lines = inpod.text(s.key).splitlines()
        assert len(lines) == 3 and lines[0] == "#!/usr/bin/env python3" and lines[2] == "raise SystemExit(main())", s
        (node,) = ast.parse(lines[1]).body
        assert isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("inpod."), s
        assert (inpod.HERE / s.source).stat().st_mode & 0o111, f"{s.source} is executable"
