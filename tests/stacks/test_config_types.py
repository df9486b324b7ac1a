"""Config keys the API server would refuse at `pulumi up`, refused at load with one line naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stacks.loader import SECRET_KEYS, check
from stacks.stackfile import file_problems, stack_name_problem
from tests.conftest import ROOT, stack_objects
from tools.mock_engine import flatten


def lines(objects: dict[str, Any], extra: dict[str, Any] | None = None) -> list[str]:
    flat, _ = flatten({**{f"ml-dev-env:{k}": v for k, v in objects.items()}, **(extra or {})})
    return check(flat, set(SECRET_KEYS), ROOT)[1]


@pytest.mark.parametrize("value", ["NFS_Client", "nfs_csi", "NFS-CSI", "nfs csi"])
def test_a_storage_class_is_a_dns_subdomain(value: str) -> None:
    objects = stack_objects("barcelona")
    objects["storage"]["volumes"][2]["storageClass"] = value
    [line] = lines(objects)
    assert line.startswith(f"ml-dev-env:storage.volumes[2].storageClass: got {value!r}; ")


def test_app_name_starts_with_a_letter_for_its_services() -> None:
    objects = stack_objects("barcelona")
    objects["cluster"]["appName"] = "1ml-dev"
    assert lines(objects) == [
        "ml-dev-env:cluster.appName: got '1ml-dev'; must start with a letter: the Services named after it are DNS-1035 labels"
    ]


def test_a_dotted_key_gets_the_nested_form() -> None:
    found = lines(stack_objects("barcelona-alice"), {"ml-dev-env:nodes.count": 2, "ml-dev-env:network.rdma.mtu": 9000})
    assert "ml-dev-env:nodes.count: a dotted key is a path, not a key: write `count: 2` under `ml-dev-env:nodes:`" in found[0]
    assert "write `rdma: {mtu: 9000}` under `ml-dev-env:network:`" in found[1]
    assert len(found) == 2 and all("\n" not in line for line in found)


def test_a_stack_name_the_stack_label_cannot_carry(tmp_path: Path) -> None:
    assert stack_name_problem(Path("Pulumi.barcelona-alice.yaml")) is None
    for name in ("a" * 64, "-x", "x_"):
        path = tmp_path / f"Pulumi.{name}.yaml"
        path.write_text("config: {}\n")
        [line] = file_problems(path)
        assert line.startswith(f"Pulumi.{name}.yaml: the stack name {name!r}") and "ml-dev-env/stack label" in line
