"""Turn pydantic validation errors into one clear line per mistake.

Each line names the key path (`ml-dev-env:network.rdma.hcas`), what was given and what is allowed.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from stacks.base import ConfigProblem, ConfigProblems

PREFIX = "ml-dev-env:"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model class inside an annotation (`X`, `X | None`, `list[X]`, `dict[str, X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model_in(typing.get_args(annotation)[0])
    if origin in (list, dict, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _aliases(model: type[BaseModel]) -> dict[str, Any]:
    return {(field.alias or name): field.annotation for name, field in model.model_fields.items()}


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the last element of `loc`."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        annotation = _aliases(model).get(part)
        if annotation is None:
            # a dict key (e.g. ncclEnv.NCCL_X): stay on the value type
            continue
        model = _model_in(annotation)
    return model


def _path(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif str(part).startswith(("function-", "literal[")) or str(part) in ("int", "str", "bool"):
            continue
        else:
            text += f".{part}" if text else str(part)
    return text


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop pydantic's union/validator branch markers from a location."""
    return tuple(
        p for p in loc if isinstance(p, int) or not (str(p).startswith(("function-", "literal[")) or str(p) in ("int", "str", "bool"))
    )


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    return repr(value)


def _problem_line(loc: tuple[Any, ...], problem: ConfigProblem) -> str:
    full = _path(loc + tuple(problem.field.split("."))) if loc else problem.field
    return f"{PREFIX}{full}: got {_describe(problem.value)}; {problem.allowed}"


def format_errors(error: dict[str, Any], root: type[BaseModel]) -> list[str]:
    """The lines of one pydantic error: one, or one per problem a model's rules found together."""
    problems = (error.get("ctx") or {}).get("error")
    if isinstance(problems, ConfigProblems):
        loc = _clean_loc(tuple(error.get("loc", ())))
        return [_problem_line(loc, problem) for problem in problems.problems]
    return [format_error(error, root)]


def format_error(error: dict[str, Any], root: type[BaseModel]) -> str:
    loc = _clean_loc(tuple(error.get("loc", ())))
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    path = PREFIX + _path(loc)

    problem = ctx.get("error")
    if isinstance(problem, ConfigProblem):
        return _problem_line(loc, problem)

    if kind == "extra_forbidden":
        owner = _model_at(root, loc)
        allowed = sorted(_aliases(owner)) if owner else []
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
        return f"{path}: unknown key{suggestion}; allowed keys: {', '.join(allowed)}"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind == "literal_error":
        return f"{path}: got {_describe(error.get('input'))}; allowed: {ctx.get('expected')}"
    message = str(error.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return f"{path}: got {_describe(error.get('input'))}; {message[0].lower() + message[1:] if message else ''}"


def problem_lines(exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per mistake, in the order pydantic found them, without repeats."""
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        for line in format_errors(dict(error), root):
            if line not in lines:
                lines.append(line)
    return lines


def format_problems(lines: list[str], source: str) -> str:
    """The one message a run reports: a head naming the stack file, then one `  - ` line per mistake."""
    head = (
        f"invalid stack configuration in {source}"
        if len(lines) == 1
        else (f"invalid stack configuration in {source} ({len(lines)} problems)")
    )
    return head + ":\n" + "\n".join(f"  - {line}" for line in lines)


def format_validation_error(exc: ValidationError, root: type[BaseModel], source: str) -> str:
    return format_problems(problem_lines(exc, root), source)
