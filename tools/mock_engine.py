"""Run the real Pulumi program offline through the SDK's mock engine and record every resource.

Used by `make render` and by the tests: each run gets a fresh event loop, fresh config and a fresh
root stack, so runs never leak into each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import logging
import runpy
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import rpc, settings
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func

from components import preflight
from stacks import stackfile

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "ml-dev-env"
ORGANIZATION = "organization"
STACK_REFERENCE = "pulumi:pulumi:StackReference"
REDACTED = "REDACTED"  # also valid base64, so redacted Secret.data stays schema-valid


@dataclass
class Recorded:
    typ: str
    name: str
    inputs: dict[str, Any]
    custom: bool
    options: dict[str, Any] = field(default_factory=dict)
    """Resource options the engine saw: retain_on_delete, delete_before_replace, protect, parent."""

    @property
    def kind(self) -> str:
        return self.typ.rsplit(":", 1)[-1]


MOCK_SSH_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMockMockMockMockMockMockMockMockMockMockMock"


class RecordingMocks(pulumi.runtime.Mocks):
    """Echo mocks that remember every registered resource with its (secret-redacted) inputs."""

    def __init__(self, stack_outputs: dict[str, dict[str, Any]] | None = None) -> None:
        self.resources: list[Recorded] = []
        self.pending_options: dict[tuple[str, str], dict[str, Any]] = {}
        self.stack_outputs = stack_outputs or {}
        """Outputs of the stacks a StackReference may read, by full name (`<org>/<project>/<stack>`)."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        options = self.pending_options.pop((args.typ, args.name), {})
        if args.typ == STACK_REFERENCE:
            # A read of another stack (pulumi/pulumi sdk/python/lib/pulumi/stack_reference.py: a resource read by id
            # = the stack name, whose state holds `outputs`); a stack never rendered has no outputs.
            ref = str(args.inputs.get("name") or args.resource_id or "")
            self.resources.append(Recorded(args.typ, args.name, redact(args.inputs), bool(args.custom), options))
            return ref, {"name": ref, "outputs": self.stack_outputs.get(ref, {}), "secretOutputNames": []}
        self.resources.append(Recorded(args.typ, args.name, redact(args.inputs), bool(args.custom), options))
        state = dict(args.inputs)
        if args.typ == "random:index/randomPassword:RandomPassword":
            state["result"] = rpc.wrap_rpc_secret("mock-random-password-0123456789ab")
        if args.typ == "tls:index/privateKey:PrivateKey":  # components/devloop.py: a fixed stand-in key
            state["public_key_openssh"] = MOCK_SSH_PUBLIC_KEY + "\n"
            state["private_key_openssh"] = rpc.wrap_rpc_secret("mock-openssh-private-key")
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.typ == typ]


class RecordingMonitor(MockMonitor):
    """Mock monitor that also hands each registration's resource options to the mocks."""

    def __init__(self, mocks: RecordingMocks) -> None:
        super().__init__(mocks)
        self.recording = mocks

    def RegisterResource(self, request: Any) -> Any:
        self.recording.pending_options[(request.type, request.name)] = {
            "retain_on_delete": bool(request.retainOnDelete),
            "delete_before_replace": bool(request.deleteBeforeReplace),
            "protect": bool(request.protect),
            "parent": request.parent,
            "dependencies": list(request.dependencies),
        }
        return super().RegisterResource(request)


def _is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


def _blank(value: Any) -> Any:
    """A secret's shape with every leaf replaced (keys of a secret map stay readable)."""
    if isinstance(value, dict):
        return {k: _blank(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return REDACTED


def redact(value: Any) -> Any:
    """Replace every secret value with REDACTED and turn integral floats back into ints."""
    if _is_secret(value):
        return _blank(value["value"])
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class RunResult:
    stack: str
    resources: list[Recorded]
    outputs: dict[str, Any]
    secret_outputs: set[str]
    warnings: list[str]
    error: str | None = None
    mocks: RecordingMocks = field(repr=False, default_factory=RecordingMocks)

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str, name_suffix: str = "") -> Recorded:
        found = [r for r in self.of_type(typ) if r.name.endswith(name_suffix)]
        if len(found) != 1:
            raise AssertionError(f"expected one {typ} ending in {name_suffix!r}, found {[r.name for r in found]}")
        return found[0]


class StackFileError(ValueError):
    """A stack file that is no YAML mapping with a `config:` mapping; the message is one line, `file:line:col: …`."""


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


_stack_files: dict[str, dict[str, Any]] = {}
"""The `config:` block of each stack file text read so far that had no mistake (`stack_config` hands out deep copies)."""


def stack_config(stack_file: Path) -> dict[str, Any]:
    """The `config:` block of a stack file as Pulumi hands it to a program (objects as JSON text).

    Raises `StackFileError` (one line with file:line:col) when the file is not valid YAML.
    """
    text = stack_file.read_text()
    if text in _stack_files:  # the same text reads the same (the suite reads the committed files hundreds of times)
        return copy.deepcopy(_stack_files[text])
    config = _stack_config(stack_file, text)
    _stack_files[text] = copy.deepcopy(config)
    return config


def _stack_config(stack_file: Path, text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{_shown(stack_file)}:{mark.line + 1}:{mark.column + 1}" if mark else _shown(stack_file)
        what = exc.problem or "not YAML"
        if exc.context:
            started = exc.context_mark
            at = f" at line {started.line + 1}" if started and mark and started.line != mark.line else ""
            what += f" ({exc.context}{at})"
        raise StackFileError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise StackFileError(f"{_shown(stack_file)}: invalid YAML: {' '.join(str(exc).split())}") from None
    text_problems = stackfile.problems(text, _shown(stack_file))
    if text_problems:
        # one line per mistake (duplicate keys, malformed `secure:` values, a wrapper other than `config:`)
        raise StackFileError("\n".join(text_problems))
    if not isinstance(data, dict) or not isinstance(data.get("config") or {}, dict):
        raise StackFileError(f"{_shown(stack_file)}:1:1: must be a mapping with a `config:` mapping of `ml-dev-env:<key>` entries")
    return dict(data.get("config") or {})


def flatten(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Pulumi's wire format: every value is a string; `secure:` values become secret placeholders."""
    flat: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            flat[key] = f"render-placeholder-{key.split(':', 1)[-1]}"
            secret_keys.append(key)
        elif isinstance(value, dict | list):
            flat[key] = json.dumps(value)
        elif isinstance(value, bool):
            flat[key] = "true" if value else "false"
        else:
            flat[key] = str(value)
    return flat, secret_keys


_renders: dict[str, RunResult] = {}
"""Renders of this process by their inputs (stack, config, secrets, the cluster stack's outputs)."""
_cache: dict[str, RunResult] | None = None
"""`_renders` while the cache is on (`cache_renders`), else None: off by default (`make render`, tools)."""


def cache_renders(on: bool) -> None:
    """Reuse a render of the same inputs (the program is deterministic in them; the test suite turns this on): each
    caller gets a deep copy. Renders made so far are kept while it is off. The suite turns it off for a test that
    patches the program's modules (monkeypatch); `uncached()` for a test of determinism itself."""
    global _cache
    _cache = _renders if on else None


@contextlib.contextmanager
def uncached() -> Iterator[None]:
    """Every render inside runs the program (a test that the program itself is deterministic)."""
    global _cache
    saved = _cache
    _cache = None
    try:
        yield
    finally:
        _cache = saved


def _cache_key(stack: str, config: dict[str, Any], secrets: dict[str, str] | None, outputs: Any, main: Path) -> str | None:
    if _cache is None or main != ROOT / "__main__.py":
        return None
    return json.dumps([stack, config, secrets or {}, outputs], sort_keys=True, default=repr)


def run_program(
    stack: str,
    config: dict[str, Any],
    secrets: dict[str, str] | None = None,
    main: Path = ROOT / "__main__.py",
    stack_outputs: dict[str, dict[str, Any]] | None = None,
) -> RunResult:
    """Run `main` for `stack` with `config` (stack-file shape) and plain-text `secrets` (marked secret).

    An environment stack (it sets `ml-dev-env:environment`) reads its cluster stack's outputs: unless
    `stack_outputs` gives them, the cluster stack's file next to `main` is run first (with the same secrets)
    and its outputs are what the StackReference reads, as after a `pulumi up` of the cluster stack.
    """
    key = _cache_key(stack, config, secrets, stack_outputs, main)
    if key is not None and _cache is not None:
        if key not in _cache:
            _cache[key] = _run_program(stack, config, secrets, main, stack_outputs)
        return copy.deepcopy(_cache[key])
    return _run_program(stack, config, secrets, main, stack_outputs)


def _run_program(
    stack: str, config: dict[str, Any], secrets: dict[str, str] | None, main: Path, stack_outputs: dict[str, dict[str, Any]] | None
) -> RunResult:
    if stack_outputs is None:
        stack_outputs = cluster_outputs(config, secrets, main)
    preflight.UNANSWERED.clear()  # each program run is a process of its own (what the API left unanswered is per run)
    flat, secret_keys = flatten(config)
    for key, value in (secrets or {}).items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        flat[full] = value
        secret_keys.append(full)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    capture = _Capture()
    logger = logging.getLogger(f"ml-dev-env.render.{stack}")
    logger.propagate = False
    logger.handlers[:] = [capture]
    mocks = RecordingMocks(stack_outputs)
    error: str | None = None
    outputs: dict[str, Any] = {}
    secret_outputs: set[str] = set()
    try:
        pulumi.runtime.set_all_config(flat, secret_keys)
        settings.ROOT.set(None)
        pulumi.runtime.set_mocks(
            mocks, project=PROJECT, stack=stack, preview=False, logger=logger, monitor=RecordingMonitor(mocks), organization=ORGANIZATION
        )
        root = settings.get_root_resource()
        try:

            def program() -> None:
                runpy.run_path(str(main), run_name="__main__")

            loop.run_until_complete(run_pulumi_func(program))
        except pulumi.RunError as exc:
            error = str(exc)
        if error is None and root is not None:
            for key, value in getattr(root, "outputs", {}).items():
                output = pulumi.Output.from_input(value)
                if loop.run_until_complete(output.is_secret()):
                    secret_outputs.add(key)
                outputs[key] = redact(loop.run_until_complete(output.future()))
    finally:
        settings.ROOT.set(None)
        pulumi.runtime.set_all_config({}, [])
        # A run that failed in an apply (an environment's facts check) leaves its output tasks and RPCs in the
        # SDK's global settings (pulumi/runtime/stack.py wait_for_rpcs reads SETTINGS.outputs and the RPC manager):
        # drop them, or the next run waits on tasks of this closed loop.
        with settings.SETTINGS.lock:
            settings.SETTINGS.outputs.clear()
        settings._get_rpc_manager().clear()
        if error is not None:
            # Its futures hold the error nobody retrieves: retrieve it now. Otherwise asyncio logs "Future exception was
            # never retrieved" from the future's finalizer, at whatever point the garbage collector frees it (seen: in
            # the next run's compile of __main__.py, where CPython 3.11 then fails with "AST constructor recursion
            # depth mismatch").
            for obj in gc.get_objects():
                if isinstance(obj, asyncio.Future) and obj.done() and not obj.cancelled():
                    obj.exception()
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
        asyncio.set_event_loop(None)
    warnings = [r.getMessage() for r in capture.records if r.levelno >= logging.WARNING]
    return RunResult(stack, mocks.resources, outputs, secret_outputs, warnings, error, mocks)


def environment_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The `ml-dev-env:environment` object of a stack-file config (an environment stack), else None."""
    value = config.get(f"{PROJECT}:environment")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def cluster_outputs(config: dict[str, Any], secrets: dict[str, str] | None, main: Path) -> dict[str, dict[str, Any]]:
    """For an environment stack: the outputs of its cluster stack (rendered from its file), keyed as a StackReference names it."""
    env = environment_of(config)
    if env is None or not isinstance(env.get("cluster"), str):
        return {}
    cluster = env["cluster"]
    path = main.parent / f"Pulumi.{cluster}.yaml"
    if not path.exists():
        return {}  # the program reports the missing cluster stack file
    try:
        cluster_config = stack_config(path)
    except StackFileError:
        return {}  # the program names the cluster file's mistakes (stacks/loader.py cluster_stack_raw)
    result = run_program(cluster, cluster_config, secrets, main, stack_outputs={})
    name = env.get("stackReference") or f"{ORGANIZATION}/{PROJECT}/{cluster}"
    return {} if result.error else {name: result.outputs}


def run_stack(stack: str, overrides: dict[str, Any] | None = None, secrets: dict[str, str] | None = None) -> RunResult:
    """Run a committed stack file, optionally with some `ml-dev-env:<key>` objects replaced."""
    config = stack_config(ROOT / f"Pulumi.{stack}.yaml")
    for key, value in (overrides or {}).items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if value is None:
            config.pop(full, None)
        else:
            config[full] = value
    return run_program(stack, config, secrets)
