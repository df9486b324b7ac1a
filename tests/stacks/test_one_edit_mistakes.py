"""A generator of one-edit mistakes, per key family, over the committed cluster stacks and carol (an own-namespace RDMA
environment): every edit is accepted, or refused with one line per mistake that names the key (and, through an
environment, the cluster's file), never a traceback. Accepted edits render, and a sample of them passes the schema check
`make render` runs.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.loader import SECRET_KEYS, check
from tests.conftest import ROOT, run_objects, stack_objects
from tests.fixtures import schema_check
from tools.mock_engine import flatten
from tools.render import write

CLUSTERS = ["barcelona", "nerc-production"]
CAROL = {"environment": {"cluster": "barcelona", "name": "carol", "namespace": "carol-dev"}, "nodes": {"count": 1, "gpusPerPod": 4}}

# One-edit mistakes by the family of the value they replace: names, quantities, durations, image references, URLs,
# selectors (maps), node lists, secrets (strings), bounded numbers, switches.
STRING_EDITS = ["", " ", "a b", "UPPER", "x" * 300, "ünï", "a:b", "-x", "a/b/c", "latest"]
NUMBER_EDITS: list[Any] = [-1, 0, 10**9, 1.5, "7", None]
BOOL_EDITS: list[Any] = ["yes", 2]
LIST_EDITS: list[Any] = [[], ["x"] * 70, "not-a-list", [None]]
MAP_EDITS: list[Any] = [{}, {"bad key!": "v"}, {"k": "a b"}, "not-a-map"]


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, (*path, i))


def edits_of(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return BOOL_EDITS
    if isinstance(value, int | float):
        return NUMBER_EDITS
    if isinstance(value, str):
        return STRING_EDITS
    if isinstance(value, list):
        return LIST_EDITS
    if isinstance(value, dict):
        return MAP_EDITS
    return []


def with_edit(objects: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(objects)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def mistakes(stack: str) -> list[tuple[str, dict[str, Any]]]:
    objects = stack_objects(stack)
    out = []
    for path, value in leaves(objects):
        if len(path) < 2:
            continue  # a whole object: its own family (tests/stacks/test_errors.py)
        for bad in edits_of(value):
            if bad != value:
                out.append((".".join(str(p) for p in path) + f" = {bad!r}"[:60], with_edit(objects, path, bad)))
    return out


def lines_of(objects: dict[str, Any], config_dir: Path) -> list[str]:
    flat, _ = flatten({f"ml-dev-env:{k}": v for k, v in objects.items()})
    return check(flat, set(SECRET_KEYS), config_dir)[1]


@functools.cache
def verdicts(stack: str) -> tuple[tuple[str, dict[str, Any], tuple[str, ...]], ...]:
    """Each one-edit mistake of a stack with the loader's lines for it, checked once per process for the three tests
    below (the edited objects are only read)."""
    return tuple((label, objects, tuple(lines_of(objects, ROOT))) for label, objects in mistakes(stack))


def one_line_each(problems: list[str], prefix: str, label: str) -> None:
    for line in problems:
        assert "\n" not in line and "Traceback" not in line, (label, line)
        assert line.startswith(prefix), (label, line)


@pytest.mark.parametrize("stack", CLUSTERS)
def test_every_one_edit_mistake_of_a_cluster_stack_is_accepted_or_named(stack: str) -> None:
    cases = verdicts(stack)
    assert len(cases) > 300
    refused = 0
    for label, _, problems in cases:
        one_line_each(list(problems), "ml-dev-env:", label)
        refused += bool(problems)
    assert refused > len(cases) // 2  # most edits are mistakes the loader names


def test_through_carol_a_cluster_file_mistake_names_the_cluster_file(tmp_path: Path) -> None:
    """carol (own namespace, RDMA) on a barcelona file with one edit: the lines start with Pulumi.barcelona.yaml."""
    cases = verdicts("barcelona")[::7]  # every seventh edit: each family is represented (the full set runs above)
    assert len(cases) > 50
    for label, objects, direct in cases:
        (tmp_path / "Pulumi.barcelona.yaml").write_text(
            yaml.safe_dump({"config": {f"ml-dev-env:{k}": v for k, v in objects.items()}}, sort_keys=False)
        )
        problems = lines_of(CAROL, tmp_path)
        if direct:
            assert problems, label
            one_line_each(problems, "Pulumi.barcelona.yaml: ml-dev-env:", label)
        else:
            one_line_each(problems, "ml-dev-env:", label)  # accepted as a cluster; carol's own rules may still speak


def test_accepted_edits_render_objects_the_schemas_accept(tmp_path: Path) -> None:
    accepted = [(label, objects) for label, objects, problems in verdicts("barcelona") if not problems]
    assert len(accepted) > 100
    outputs: dict[str, str] = {}  # the folder of each render -> its edit
    for i, (label, objects) in enumerate(accepted[:: len(accepted) // 8]):
        result = run_objects("barcelona", objects)
        assert result.error is None, (label, result.error)
        out = tmp_path / str(i)
        write(result, out)
        assert any(out.iterdir()), (label, "nothing written")
        outputs[str(out)] = label
    # one schema check for every render (tests/fixtures/schema_check.py); each problem line names its file
    proc = schema_check.check("-q", *outputs)
    refused = [label for out, label in outputs.items() if out + "/" in proc.stdout]
    assert proc.returncode == 0, (refused, proc.stdout[-1500:])
