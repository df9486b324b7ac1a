"""No silent mistakes: each one-edit mistake of a stack file is refused by `make render` (tools/render.py,
what `make render` runs) with one line naming the key and the fix, and the text-level ones also by the
program itself re-reading `Pulumi.<stack>.yaml` (what it does at preview, where it sees values only)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from stacks import stackfile
from tests.conftest import ROOT, run_objects, stack_objects

STACK = "barcelona"


def render(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "Pulumi.mistake.yaml").write_text(text)
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "mistake", "--config-dir", str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def edited(objects_edit: Callable[[dict], None]) -> str:
    objects = stack_objects(STACK)
    objects_edit(objects)
    return yaml.safe_dump({"config": {f"ml-dev-env:{k}": v for k, v in objects.items()}}, sort_keys=False)


ORIGINAL = (ROOT / f"Pulumi.{STACK}.yaml").read_text()
COUNT_LINE = ORIGINAL.splitlines().index("    count: 2") + 1  # 1-based line of `count:` in the committed file


def with_text(old: str, new: str) -> str:
    assert old in ORIGINAL
    return ORIGINAL.replace(old, new, 1)


def set_model(key: str, value: object) -> Callable[[dict], None]:
    def edit(o: dict) -> None:
        o["models"][0][key] = value

    return edit


def s3_source(o: dict) -> None:
    o["models"][0]["source"] = {"s3": {"endpoint": "minio.model-storage.svc:9000", "bucket": "weights"}}


SILENT: list[tuple[str, Callable[[], str], str]] = [
    (
        "duplicate key",
        lambda: with_text("    count: 2\n", "    count: 4\n    count: 2\n"),
        f"Pulumi.mistake.yaml:{COUNT_LINE + 1}:5: duplicate key 'ml-dev-env:nodes.count' (first at line {COUNT_LINE}); YAML keeps "
        "the last one silently: remove one of them",
    ),
    (
        "gpusPerPod above the node's GPUs",
        lambda: edited(lambda o: o["nodes"].update(gpusPerPod=9, gpusPerNode=8)),
        "ml-dev-env:nodes.gpusPerPod: got 9; at most nodes.gpusPerNode (8): a pod asking for more GPUs than a node has stays Pending",
    ),
    (
        "shmSize above the memory limit",
        lambda: edited(lambda o: o["nodes"].update(shmSize="300Gi")),
        "ml-dev-env:nodes.shmSize: got '300Gi'; at most resources.limits.memory (256Gi): /dev/shm is memory",
    ),
    (
        "S3 endpoint without scheme",
        lambda: edited(s3_source),
        "ml-dev-env:models[0].source.s3.endpoint: got 'minio.model-storage.svc:9000'; an endpoint URL with its scheme: did you mean "
        "'https://minio.model-storage.svc:9000' (or 'http://minio.model-storage.svc:9000')?",
    ),
    (
        "Quay repository without registry host",
        lambda: edited(set_model("quayRepository", "nerc-ml-dev-env/mistral")),
        "ml-dev-env:models[0].quayRepository: got 'nerc-ml-dev-env/mistral'; a repository with its registry host: did you mean "
        "'quay.io/nerc-ml-dev-env/mistral'?",
    ),
    (
        "malformed secure value",
        lambda: ORIGINAL.rstrip("\n") + "\n  ml-dev-env:hfToken:\n    secure: hf_plaintext-token\n",
        ": ml-dev-env:hfToken: `secure:` holds 'hf_plaintext-token', not a value Pulumi encrypted (v1:<nonce>:<ciphertext> or base64): "
        "set it again with `pulumi config set --secret <key> …`",
    ),
    (
        "a base64 plaintext under the passphrase provider",
        lambda: (
            "encryptionsalt: v1:c2FsdHNhbHQ=:v1:abc:def\n"
            + ORIGINAL.rstrip("\n")
            + "\n  ml-dev-env:hfToken:\n    secure: aGZfcGxhaW50ZXh0dG9rZW4=\n"
        ),
        ": ml-dev-env:hfToken: `secure:` holds 'aGZfcGxhaW50ZXh0dG9rZW4=', not a value the passphrase provider (this file's "
        "encryptionsalt) encrypted (v1:<nonce>:<ciphertext>)",
    ),
    (
        "two models pushing one image",
        lambda: edited(lambda o: o["models"][1].update(tag=o["models"][0]["tag"])),
        "ml-dev-env:models[1].tag: got 'w4a16-2501'; models[0] (mistral-small-24b-w4a16) pushes "
        "quay.io/nerc-ml-dev-env/mistral-small-24b-instruct:w4a16-2501 too",
    ),
    (
        "a node selector value with a space",
        lambda: edited(lambda o: o["nodes"].update(nodeSelector={"nvidia.com/gpu.present": "true yes"})),
        "ml-dev-env:nodes.nodeSelector: got an object; label value 'true yes': at most 63 letters",
    ),
    (
        "a build node selector key with a space",
        lambda: edited(lambda o: o["buildNodes"].update(nodeSelector={"bad key!": "x"})),
        "ml-dev-env:buildNodes.nodeSelector: got an object; label key 'bad key!': a name of at most 63 letters",
    ),
    (
        "a Hugging Face repository with spaces",
        lambda: edited(lambda o: o["models"][0]["source"]["huggingFace"].update(repo="RedHatAI/Mistral Small 24B")),
        "ml-dev-env:models[0].source.huggingFace.repo: got 'RedHatAI/Mistral Small 24B'; a Hugging Face repository '<owner>/<name>'",
    ),
    (
        "an endpoint with a space",
        lambda: edited(lambda o: o["models"][0].update(source={"s3": {"endpoint": "https://minio example:9000", "bucket": "weights"}})),
        "ml-dev-env:models[0].source.s3.endpoint: got 'https://minio example:9000'; an endpoint URL 'http(s)://<host>[:<port>]'",
    ),
    (
        "a bucket with a space",
        lambda: edited(lambda o: o["models"][0].update(source={"s3": {"endpoint": "https://minio.example:9000", "bucket": "my bucket"}})),
        "ml-dev-env:models[0].source.s3.bucket: got 'my bucket'; a bucket name: 3 to 63 lower-case letters, digits, '.' and '-', "
        "no spaces: did you mean 'my-bucket'?",
    ),
]


@pytest.mark.parametrize(("label", "text", "line"), SILENT, ids=[c[0] for c in SILENT])
def test_a_silent_mistake_is_refused_by_make_render(tmp_path: Path, label: str, text: Callable[[], str], line: str) -> None:
    proc = render(tmp_path, text())
    assert proc.returncode == 2, f"{label}: accepted\n{proc.stdout[-2000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout
    assert line in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "mistake").exists()


def test_the_program_rereads_the_stack_file_for_what_values_cannot_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At preview the CLI hands the program values only: the last `count` and a decrypted secret. The program
    reads the stack file itself (its working directory is the project's) and refuses both."""
    text = with_text("    count: 2\n", "    count: 4\n    count: 2\n").rstrip("\n") + "\n  ml-dev-env:hfToken:\n    secure: not-encrypted\n"
    (tmp_path / f"Pulumi.{STACK}.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    result = run_objects(STACK, stack_objects(STACK))
    assert result.error is not None
    lines = [x.removeprefix("  - ") for x in result.error.splitlines() if x.startswith("  - ")]
    assert lines[0].startswith(f"Pulumi.{STACK}.yaml:{COUNT_LINE + 1}:5: duplicate key 'ml-dev-env:nodes.count'"), lines
    assert "`secure:` holds 'not-encrypted'" in lines[1], lines


def test_real_secure_values_pass() -> None:
    assert stackfile.secure_problem("v1:E3ePl4Hf5iEEGSch:7sAaZ3mAGeVZpgTXQ/9sKHzF1gUoLC+eh+pn") is None
    assert stackfile.secure_problem("AAABAGvLO6Yc2Kj4lEwYZzr4jQ9yU4MfJ0G4kQ==") is None
    assert stackfile.secure_problem({"nested": 1}) is not None and stackfile.secure_problem("") is not None


def test_a_settings_wrapper_names_config(tmp_path: Path) -> None:
    proc = render(tmp_path, ORIGINAL.replace("config:\n", "settings:\n", 1))
    assert proc.returncode == 2
    want = "the ml-dev-env:* keys are under `settings:`; Pulumi reads a stack's settings only under `config:`"
    assert f"{want} (rename `settings:` to `config:`)" in proc.stderr


WEAK: list[tuple[str, Callable[[dict], None], str]] = [
    (
        "idleTimeout without unit",
        lambda o: o.setdefault("lifecycle", {}).update(idleStop={"enabled": True, "idleTimeout": 2}),
        "ml-dev-env:lifecycle.idleStop.idleTimeout: got 2; a duration needs a unit (a quoted string such as '90s', '45m', '2h'): "
        "did you mean '2h'?",
    ),
    (
        "idleTimeout 0",
        lambda o: o.setdefault("lifecycle", {}).update(idleStop={"enabled": True, "idleTimeout": 0}),
        "ml-dev-env:lifecycle.idleStop.idleTimeout: got 0; a duration needs a unit (a quoted string such as '90s', '45m', '2h'): "
        "between 15m and 24h here, e.g. '1h'",
    ),
    (
        "a tag with a colon",
        lambda o: o["models"][0].update(tag="w4a16:2501"),
        "(':' separates a repository from its tag: the repository goes in quayRepository): did you mean 'w4a16-2501'?",
    ),
    (
        "a space in quayRepository",
        lambda o: o["models"][0].update(quayRepository="quay.io/nerc/mistral small"),
        "ml-dev-env:models[0].quayRepository: got 'quay.io/nerc/mistral small'; a repository without spaces",
    ),
    (
        "appsDomain as a URL",
        lambda o: o["cluster"].update(appsDomain="https://apps.example.com"),
        "did you mean 'apps.example.com'?",
    ),
    ("memory suffix case", lambda o: o["nodes"]["resources"]["limits"].update(memory="900gi"), "did you mean '900Gi'?"),
    ("count 0", lambda o: o["nodes"].update(count=0), "set lifecycle.suspended: true instead"),
    (
        "top-level gpusPerPod",
        lambda o: o.update(gpusPerPod=8),
        "ml-dev-env:gpusPerPod: unknown key; gpusPerPod belongs in nodes: did you mean 'ml-dev-env:nodes.gpusPerPod'?",
    ),
    (
        "objects wrapped in a settings key",
        lambda o: o.update(settings={"cluster": o.pop("cluster")}),
        "ml-dev-env:settings: unknown key wrapping cluster; each object is a key of its own under `config:`: ml-dev-env:cluster",
    ),
    (
        "unknown node in nodeRacks",
        lambda o: o.setdefault("fabricCheck", {}).update(nodeRacks={**dict.fromkeys(o["nodes"]["gpuNodes"], "r1"), "moc-typo": "r2"}),
        "ml-dev-env:fabricCheck.nodeRacks: got ['moc-typo']; not in nodes.gpuNodes",
    ),
]


@pytest.mark.parametrize(("label", "edit", "line"), WEAK, ids=[c[0] for c in WEAK])
def test_a_weak_message_names_the_fix(tmp_path: Path, label: str, edit: Callable[[dict], None], line: str) -> None:
    proc = render(tmp_path, edited(edit))
    assert proc.returncode == 2, f"{label}: accepted"
    assert line in proc.stderr, proc.stderr


def test_ipv6_literal_registries_pass(tmp_path: Path) -> None:
    """distribution/reference, file regexp.go: a host may be a bracketed IPv6 literal, with a port."""

    def edit(o: dict) -> None:
        o["models"][0]["quayRepository"] = "[fd00::1]:5000/nerc/mistral"
        o["modelPipeline"]["modelcarBaseImage"] = "[fd00::1]:5000/ubi9/ubi-micro:9.6"

    proc = render(tmp_path, edited(edit))
    assert proc.returncode == 0, proc.stderr


def test_a_gpu_product_unlike_the_operators_labels_is_a_warning(tmp_path: Path) -> None:
    proc = render(tmp_path, edited(lambda o: o["nodes"].update(gpuProduct="H100")))
    assert proc.returncode == 0, proc.stderr
    assert "warning: nodes.gpuProduct 'H100' does not look like a value of the node label nvidia.com/gpu.product" in proc.stdout
    assert "does not look like" not in render(tmp_path, ORIGINAL).stdout


def test_gpus_per_node_undeclared_is_a_warning(tmp_path: Path) -> None:
    assert stack_objects(STACK)["nodes"]["gpusPerNode"] == 4  # declared from the cluster's record
    proc = render(tmp_path, edited(lambda o: o["nodes"].pop("gpusPerNode")))
    assert proc.returncode == 0, proc.stderr
    assert "warning: nodes.gpusPerNode is not declared" in proc.stdout
    declared = render(tmp_path, edited(lambda o: o["nodes"].update(gpusPerNode=8)))
    assert declared.returncode == 0 and "gpusPerNode is not declared" not in declared.stdout
