"""The docs spell configuration keys as the program reads them: a key written with other capitals (`gpuMemoryFloorMiB`
for `gpuMemoryFloorMib`) is refused by the loader, so a reader who copies it gets an unknown-key error."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from stacks.config import StackConfig

ROOT = Path(__file__).resolve().parents[2]


def keys(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[str]:
    """Every key (alias) of the configuration, nested models included."""
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        yield field.alias or name
        args = typing.get_args(field.annotation)
        for candidate in [field.annotation, *args, *(a for arg in args for a in typing.get_args(arg))]:
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                yield from keys(candidate, seen)


def misspelled(text: str, known: dict[str, str]) -> Iterator[tuple[str, str]]:
    for code in re.findall(r"`([^`]+)`", text):
        for word in re.split(r"[^A-Za-z0-9]+", code):
            right = known.get(word.lower())
            if right and word != right and re.match(r"^[a-z][a-z0-9]*[A-Z]", word):  # camelCase: a key, not prose
                yield word, right


def test_docs_spell_every_key_as_the_program_reads_it() -> None:
    known = {key.lower(): key for key in keys(StackConfig, set())}
    assert known["gpumemoryfloormib"] == "gpuMemoryFloorMib"
    assert list(misspelled("`gpuMemoryFloorMiB` and `oc get storageclass`", known)) == [("gpuMemoryFloorMiB", "gpuMemoryFloorMib")]
    found = [
        f"{path.relative_to(ROOT)}: {word} (the key is {right})"
        for path in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
        for word, right in misspelled(path.read_text(), known)
    ]
    assert not found, found
