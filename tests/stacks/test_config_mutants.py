"""Every config key is a type: every string and number value of every committed stack, mutated the ways users get
values wrong (upper case, underscore, leading digit, space, 64 and 254 characters, empty; negative, 1e309), is either
refused at load, one line per mistake naming its key, or renders objects the API server accepts (the project's schema
check and upstream's rules, policy/rules/kube_api.py). Never a traceback.

Accepted mutants are rendered in batches of mutants of different keys (one render each, in this process); a batch the
loader refuses (two edits that clash) or whose objects fail is halved until the mutant that made them is named.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import pytest

from policy.rules import kube_api
from stacks.loader import SECRET_KEYS, check
from tests.conftest import ROOT, STACKS, run_objects, stack_objects
from tools.mock_engine import flatten
from tools.render import manifest

BATCH = 40


def string_mutants(value: str) -> list[str]:
    return [
        value.upper() if value.upper() != value else value + "X",
        value.replace("-", "_") if "-" in value else value + "_x",
        "1" + value,
        value + " x",
        "a" * 64,
        "a" * 254,
        "",
    ]


def number_mutants(value: float) -> list[Any]:
    return [-1 if value >= 0 else -value - 1, "1e309", float("inf")]  # `1e309` as YAML reads it (a string), and as a float


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, (*path, i))
    else:
        yield path, value


def with_edits(objects: dict[str, Any], edits: list[tuple[tuple[Any, ...], Any]]) -> dict[str, Any]:
    out = copy.deepcopy(objects)
    for path, value in edits:
        node = out
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return out


def label(path: tuple[Any, ...], value: Any) -> str:
    shown = repr(value) if len(repr(value)) <= 24 else repr(value)[:21] + "..."
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") + f" = {shown}"


def clash(a: tuple[tuple[Any, ...], Any], b: tuple[tuple[Any, ...], Any]) -> bool:
    """Two edits a batch cannot hold: of one key, or one value given to siblings (two gpuNodes, two models' tags made
    equal: a duplicate the loader refuses)."""

    def field(path: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(p for p in path if not isinstance(p, int))

    return a[0] == b[0] or (field(a[0]) == field(b[0]) and a[1] == b[1])


def lines_of(objects: dict[str, Any]) -> list[str]:
    flat, _ = flatten({f"ml-dev-env:{k}": v for k, v in objects.items()})
    return check(flat, set(SECRET_KEYS), ROOT)[1]


@functools.cache
def verdicts(stack: str) -> tuple[tuple[tuple[Any, ...], Any, tuple[str, ...]], ...]:
    objects = stack_objects(stack)
    out = []
    for path, value in leaves(objects):
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        for bad in string_mutants(value) if isinstance(value, str) else number_mutants(value):
            if bad != value:
                out.append((path, bad, tuple(lines_of(with_edits(objects, [(path, bad)])))))
    return tuple(out)


def refused_objects(stack: str, objects: dict[str, Any]) -> list[str]:
    """The render's verdict: its error (one line, no traceback) or what the API server would refuse in its objects."""
    result = run_objects(stack, objects)
    if result.error is not None:
        assert "Traceback" not in result.error, result.error
        return []  # a run-time refusal of the program: one message, checked by the loader's lines above
    found = []
    for resource in result.resources:
        obj = manifest(resource)
        if obj is not None:
            found += [
                f"{obj['kind']}/{obj['metadata'].get('name')}: {p.text}"
                for p in kube_api.problems(obj, patch=resource.typ.endswith("Patch"))
            ]
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_every_mutant_is_refused_by_key_or_renders_valid_objects(stack: str) -> None:
    cases = verdicts(stack)
    assert len(cases) > 20
    for path, bad, lines in cases:
        for line in lines:
            assert "\n" not in line and "Traceback" not in line, (label(path, bad), line)
            assert line.startswith(("ml-dev-env:", "Pulumi.")), (label(path, bad), line)
        if lines:
            assert any(f"ml-dev-env:{path[0]}" in line for line in lines), (label(path, bad), lines)
    accepted = [(path, bad) for path, bad, lines in cases if not lines]
    objects = stack_objects(stack)
    batches: list[list[tuple[tuple[Any, ...], Any]]] = []
    for edit in accepted:
        room = next((b for b in batches if len(b) < BATCH and not any(clash(other, edit) for other in b)), None)
        if room is None:
            batches.append(room := [])
        room.append(edit)
    failures: list[str] = []

    def judge(batch: list[tuple[tuple[Any, ...], Any]]) -> None:
        """Render the batch once; when the loader refuses it (two edits that clash) or an object fails, halve it."""
        together = with_edits(objects, batch)
        clash = bool(lines_of(together)) if len(batch) > 1 else False
        found = [] if clash else refused_objects(stack, together)
        if not clash and not found:
            return
        if len(batch) == 1:
            failures.append(f"{label(*batch[0])}: {found[0]}")
            return
        judge(batch[: len(batch) // 2])
        judge(batch[len(batch) // 2 :])

    for batch in batches:
        judge(batch)
    assert not failures, "\n".join(failures)
