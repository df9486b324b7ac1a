"""Every model-pipeline value the stack accepts runs; every knob a step's message names exists.

Each accepted `modelPipeline` size (defaults and bounds) is rendered, and each rendered Task's step arguments go
through that step's own argparse parser (the deployed text, Tekton's `$(…)` references filled in as a
PipelineRun would). What a step would refuse, the render refuses, naming the key.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.quantity import parse_quantity
from stacks.config import ModelPipelineConfig
from tests.components.test_model_pipeline import SECRETS, pvc_objects, tasks
from tests.conftest import run_objects, stack_objects

Deployed = Callable[[str], types.ModuleType]
ROOT = Path(__file__).resolve().parents[2]
STEP_PROGRAM = re.compile(r"/steps/(\w+)\.py$")


def _filled(args: list[str]) -> list[str]:
    """Tekton's references as a PipelineRun fills them: a source URI where one is expected, a path or word elsewhere."""
    out: list[str] = []
    s3_dest = "--endpoint-url" in args
    for prev, arg in zip(["", *args], args, strict=False):
        if arg == "$(params.source-uri)":
            out.append("s3://models/mistral")
        elif arg == "$(params.destination)":  # the S3 upload's destination and the mirror's image
            out.append("s3://models/mistral/v1" if prev == "--dest" and s3_dest else "image-registry.svc:5000/ns/m:1")
        elif arg == "$(params.include[*])":
            out.append("*.safetensors")
        else:
            out.append(re.sub(r"\$\([^)]*\)", "x", arg))
    return out


def _parse_every_step(deployed: Deployed, rendered: Any) -> dict[str, Any]:
    """Run each rendered Task's step program's parser on the Task's arguments; the parsed package arguments by task."""
    parsed = {}
    for task, spec in tasks(rendered).items():
        for step in spec["steps"]:
            match = STEP_PROGRAM.search((step.get("command") or [""])[-1])
            if not match:  # an embedded script (wait-tools): its arguments are checked by its own tests
                continue
            module = deployed(match[1])
            try:
                parsed[task] = module.parse_args(_filled(step["args"]))
            except SystemExit as exc:  # argparse's refusal
                raise AssertionError(f"{task}: {match[1]}.py refuses the rendered arguments {step['args']}") from exc
    return parsed


ACCEPTED = [
    {},  # the defaults
    {"chunkSize": "1Mi"},  # the smallest chunk (issue 46: the package step's own floor, 1 MiB)
    {"chunkSize": "2G", "chunkThreshold": "2G"},  # a chunk as large as the threshold
    {"chunkSize": "1Mi", "chunkThreshold": "1Mi"},  # every blob above 1 MiB chunked, 1 MiB at a time
    {"chunkSize": "256Mi", "chunkThreshold": "512Mi"},  # the values the messages suggest
    {"chunkSize": "1.5Mi", "chunkThreshold": "1Ti", "maxLayerSize": "1"},  # fractions of a unit; the smallest layer limit
    {"chunkSize": "64Gi", "chunkThreshold": "64Gi", "maxLayerSize": "1Pi"},
]


@pytest.mark.parametrize("values", ACCEPTED, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "defaults")
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "pvc"])
def test_every_accepted_value_renders_and_the_steps_parse_it(deployed: Deployed, values: dict[str, str], stream: bool) -> None:
    objects = stack_objects("barcelona") if stream else pvc_objects()
    objects.setdefault("modelPipeline", {}).update(values)
    rendered = run_objects("barcelona", objects, SECRETS)
    assert rendered.error is None, rendered.error
    parsed = _parse_every_step(deployed, rendered)
    cfg = ModelPipelineConfig.model_validate(objects["modelPipeline"])
    package = parsed["modelcar-package-stream" if stream else "modelcar-package"]
    assert package.chunk_size == int(parse_quantity(cfg.chunk_size))
    assert package.chunk_threshold == int(parse_quantity(cfg.chunk_threshold))
    assert package.max_layer_size == int(parse_quantity(cfg.max_layer_size))


REFUSED = [
    ({"chunkSize": "0"}, "modelPipeline.chunkSize", "greater than zero"),
    ({"maxLayerSize": "500m"}, "modelPipeline.maxLayerSize", "at least 1 byte"),  # would render 0: no limit at all
    ({"chunkSize": "500m"}, "modelPipeline.chunkSize", "at least 1Mi"),  # half a byte
    ({"chunkSize": "256Mi", "chunkThreshold": "128Mi"}, "modelPipeline.chunkSize", "at most chunkThreshold"),
    ({"chunkThreshold": "512Mi"}, "modelPipeline.chunkSize", "at most chunkThreshold"),  # the default chunk, 1Gi
    ({"chunkSize": "-1Gi"}, "modelPipeline.chunkSize", ""),
]


@pytest.mark.parametrize("values, key, allowed", REFUSED, ids=lambda v: str(v))
def test_what_the_step_would_refuse_the_render_refuses_by_key(deployed: Deployed, values: dict[str, str], key: str, allowed: str) -> None:
    objects = stack_objects("barcelona")
    objects.setdefault("modelPipeline", {}).update(values)
    rendered = run_objects("barcelona", objects, SECRETS)
    assert rendered.error is not None and key in str(rendered.error) and allowed in str(rendered.error), rendered.error
    assert len([line for line in str(rendered.error).splitlines() if key in line]) == 1, rendered.error
    # … and the step itself refuses the same chunk values (the check in the stack is the step's, not a guess);
    # a maxLayerSize under 1 byte would reach it as 0, "no limit": refused for what it would mean.
    if "maxLayerSize" in values:
        return
    try:
        merged = {"chunkSize": "1Gi", "chunkThreshold": "2G", **values}
        chunk, threshold = (str(int(parse_quantity(merged[k]))) for k in ("chunkSize", "chunkThreshold"))
    except ValueError:
        return  # not a quantity at all: nothing could render it
    args = ["--source", "s3://b/m", "--image", "q/r:t", "--base-image", "b:1", "--chunk-size", chunk, "--chunk-threshold", threshold]
    with pytest.raises(SystemExit):
        deployed("package").parse_args(args)


FLAG_KEY = re.compile(r"(--[a-z][a-z-]*)(?: \(|, )(modelPipeline\.[A-Za-z]+)")
KEY = re.compile(r"modelPipeline\.([a-zA-Z]+)")
CONTINUED = re.compile(r"\"\s*\n\s*f?\"")  # adjacent string literals, as the message reads
MINIMAL = ["--source", "s3://b/m", "--image", "q/r:t", "--base-image", "b:1"]


def test_every_flag_and_key_a_step_or_page_names_exists(deployed: Deployed) -> None:
    """`--flag (modelPipeline.key)` in a step's messages: the step's parser takes the flag, the stack has the key;
    every `modelPipeline.<key>` a step or a models page names is a key of the stack."""
    keys = {field.alias or name for name, field in ModelPipelineConfig.model_fields.items()}
    sources = {p: CONTINUED.sub("", p.read_text()) for p in [*(ROOT / "steps").glob("*.py"), *(ROOT / "steps" / "lib").glob("*.py")]}
    pages = {p: p.read_text() for p in (ROOT / "docs" / "models").glob("*.md")}
    pairs = {(path, flag, key) for path, text in sources.items() for flag, key in FLAG_KEY.findall(text)}
    assert {flag for _, flag, _ in pairs} >= {"--chunk-size", "--max-layer-size"}, pairs
    for path, flag, key in sorted(pairs):
        assert key.split(".", 1)[1] in keys, f"{path.name} names {key}, which the stack does not have"
        program = path.stem if path.parent.name == "steps" else "package"  # steps/lib is package's (and download's)
        deployed(program).parse_args([*MINIMAL, flag, "1"])  # argparse exits on a flag it does not know
    for path, text in {**sources, **pages}.items():
        for key in KEY.findall(text):
            assert key in keys, f"{path.name} names modelPipeline.{key}, which the stack does not have"
