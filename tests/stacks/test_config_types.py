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


def barcelona_with(edit: Any) -> list[str]:
    objects = stack_objects("barcelona")
    edit(objects)
    return lines(objects)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("model-registry.svc:8080", "with its scheme: did you mean 'https://model-registry.svc:8080'"),
        ("http://model registry:8080", "without spaces"),
        ("http://model-registry:70000", "port is 1 to 65535, not 70000"),
        ("", "with its scheme (http:// or https://)"),
    ],
)
def test_a_registry_url_is_one_the_register_step_can_open(value: str, says: str) -> None:
    [line] = barcelona_with(lambda o: o["modelPipeline"].update(registryUrl=value))
    assert line.startswith(f"ml-dev-env:modelPipeline.registryUrl: got {value!r}; ") and says in line


@pytest.mark.parametrize("value", ["main branch", "main~1", "", "a..b", "v1.lock", "HEAD^", "refs/heads/"])
def test_a_hub_revision_is_a_git_ref(value: str) -> None:
    [line] = barcelona_with(lambda o: o["models"][0]["source"]["huggingFace"].update(revision=value))
    assert line.startswith(f"ml-dev-env:models[0].source.huggingFace.revision: got {value!r}; a branch, tag or commit as git names them")


def test_hub_revisions_git_accepts_stay_accepted() -> None:
    for value in ("main", "v1.0", "refs/pr/1", "release/2.0", "0" * 40):
        assert barcelona_with(lambda o, v=value: o["models"][0]["source"]["huggingFace"].update(revision=v)) == [], value


def test_a_chunk_size_below_the_floor_says_why() -> None:
    [line] = barcelona_with(lambda o: o["modelPipeline"].update(chunkSize="256"))
    assert line.startswith("ml-dev-env:modelPipeline.chunkSize: got '256'; at least 1Mi (each chunk is one PATCH")
    assert barcelona_with(lambda o: o["modelPipeline"].update(chunkSize="1Mi")) == []


@pytest.mark.parametrize("key", ["chunkThreshold", "maxLayerSize"])
def test_a_size_beyond_int64_is_refused(key: str) -> None:
    [line] = barcelona_with(lambda o: o["modelPipeline"].update({key: "1e309"}))
    assert line.startswith(f"ml-dev-env:modelPipeline.{key}: got '1e309'; ") and "beyond 2^63-1" in line


def test_the_default_https_port_names_the_same_registry() -> None:
    """quay.io:443/org/m is quay.io/org/m: two models pushing one tag there would overwrite each other."""

    def same_image(o: dict[str, Any]) -> None:
        o["models"][1].update(
            quayRepository=o["models"][0]["quayRepository"].replace("quay.io/", "quay.io:443/"), tag=o["models"][0]["tag"]
        )

    [line] = barcelona_with(same_image)
    assert line.startswith("ml-dev-env:models[1].tag: got ") and "pushes quay.io/" in line and "too" in line
