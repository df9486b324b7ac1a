"""Nothing written by anyone else changes what gets tagged (streaming mode, real docker-registry and moto S3).

The resume record (`<tag>.resume`) and the destination tag are written by whoever may push. Each test writes
one with the push credentials and the step's own classes (as anyone with push rights could), then packages:
every pulled layer must hold the source's bytes, `io.ml-dev-env.source` must name the real source, a record
the step cannot use costs one WARNING line, and a host the registry did not name receives nothing.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.images import pull
from tests.fixtures.proxy import HttpProxy, run_proxy
from tests.fixtures.registry import Registry
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import StepRun, StepRunner, needs_registry, needs_skopeo
from tests.steps.test_package import assert_image_holds, via
from tests.steps.test_package_faults import hostile  # noqa: F401  (a fixture)
from tests.steps.test_package_stream import upload

pytestmark = [needs_registry, needs_skopeo]
MiB = 1 << 20
Deployed = Callable[[str], types.ModuleType]
SIZE = 2 * MiB + 3
REL = "model.safetensors"


class Setup:
    """A bucket with the model, a first image `:v0` packaged from it, and the step's own client and classes."""

    def __init__(
        self, tmp_path: Path, run_step: StepRunner, package: types.ModuleType, s3: S3Server, quay: Registry, proxy: HttpProxy, base: str
    ) -> None:
        self.tmp, self.run_step, self.package, self.s3, self.quay, self.proxy = tmp_path, run_step, package, s3, quay, proxy
        self.base_image = via(proxy, quay, base)
        self.resume: types.ModuleType = package  # set by the fixture: the step's steps/lib/resume.py
        self.files = {REL: os.urandom(SIZE), "config.json": b'{"architectures": ["X"]}'}
        self.bucket = f"trust-{os.getpid()}-{tmp_path.name[-12:].lower().replace('_', '-')}".strip("-")
        upload(s3, self.bucket, {f"m/{k}": v for k, v in self.files.items()})
        etag = str(s3.client().head_object(Bucket=self.bucket, Key=f"m/{REL}")["ETag"]).strip('"')
        self.tag = f"s3:{etag}:{SIZE}"
        self.repo = "trust/" + tmp_path.name.lower().replace("_", "-")[-40:].strip("-")
        self.layout = package.LayerLayout.for_file(REL, SIZE)
        self.client = package.RegistryClient(
            quay.host,
            (quay.username, quay.password),
            [f"repository:{self.repo}:pull,push", "repository:base/shell:pull"],
            plain_http=True,
            tls_context=ssl.create_default_context(),
            timeout=30,
            retry_delay=0.05,
        )
        first = self.package_tag("v0")
        assert first.returncode == 0, first.stderr

    def args(self, tag: str, *extra: object) -> list[object]:
        return [
            "--source", f"s3://{self.bucket}/m", "--s3-endpoint-url", self.s3.endpoint, "--image", f"{self.proxy.host}/{self.repo}:{tag}",
            "--base-image", self.base_image, "--authfile", self.quay.authfile(self.tmp / "auth.json", host=self.proxy.host),
            "--plain-http", "--retry-delay", "0.05", "--jobs", 1, *extra,
        ]  # fmt: skip

    def package_tag(self, tag: str, *extra: object) -> StepRun:
        return self.run_step("package", *self.args(tag, *extra), env=self.s3.env())

    def forged_layer(self) -> str:
        """A blob of the same layer layout (same path, same size) holding other bytes."""
        return str(self.client.put_blob(self.repo, self.layout.head + os.urandom(SIZE) + self.layout.tail))

    def record(self, tag: str) -> Any:
        dest = self.package.ImageRef.parse(f"{self.quay.host}/{self.repo}:{tag}")
        base = self.package.ImageRef.parse(self.base_image.replace(self.proxy.host, self.quay.host))
        manifest, digest = self.package.resolve_base(self.client, base, "linux/amd64")
        config = json.loads(self.client.get_blob(base.repository, manifest["config"]["digest"]))
        return self.package.ResumeRecord(self.client, dest, manifest, config, digest, str(base))

    def write_raw_record(self, record: Any, uploads_text: str) -> None:
        """A record whose uploads annotation is `uploads_text` as is (the step itself only writes JSON)."""
        package = self.package
        config = package.build_config(record.base_config, [])
        self.client.put_blob(self.repo, config)
        resume = self.resume  # steps/lib/resume.py
        notes = {resume.RECORD_ANNOTATION: record.dest.tag, resume.UPLOADS_ANNOTATION: uploads_text}
        manifest = package.build_manifest(config, record.base_manifest["layers"], [], record.base, record.base_digest, notes, {})
        self.client.put_manifest(self.repo, record.tag, manifest, package.OCI_MANIFEST)

    def open_session(self, forged: int) -> str:
        """An upload session of the repository holding `forged` bytes that are not the source's; its URL."""
        reply = self.client.request("POST", f"/v2/{self.repo}/blobs/uploads/", body=b"")
        location = self.client.upload_location(reply, "", trust=True)
        body = (self.layout.head + os.urandom(SIZE))[:forged]
        headers = {"Content-Type": "application/octet-stream", "Content-Range": f"0-{forged - 1}"}
        reply = self.client.request("PATCH", location, headers, body)
        assert reply.status == 202, reply
        return str(self.client.absolute(reply.header("Location"))).replace(self.quay.host, self.proxy.host)  # as the step sees it

    def assert_source_image(self, tag: str) -> None:
        image = f"{self.quay.host}/{self.repo}:{tag}"
        assert_image_holds(self.quay, image, self.files, self.tmp / f"pulled-{tag}")
        manifest = pull(self.quay, image, self.tmp / f"again-{tag}").manifest
        notes = {layer["annotations"]["org.opencontainers.image.title"]: layer["annotations"] for layer in manifest["layers"][1:]}
        assert notes[REL]["io.ml-dev-env.source"] == self.tag


@pytest.fixture
def setup(
    tmp_path: Path, run_step: StepRunner, deployed: Deployed, s3: S3Server, quay: Registry, quay_proxy: HttpProxy, base_image: str
) -> Iterator[Setup]:
    setup = Setup(tmp_path, run_step, deployed("package"), s3, quay, quay_proxy, base_image)
    setup.resume = deployed("lib.resume")
    yield setup


def warnings(step: StepRun) -> list[str]:
    return [line for line in step.stdout.splitlines() if "WARNING" in line]


def test_a_forged_resume_record_costs_a_read_never_the_content(setup: Setup) -> None:
    record = setup.record("v1")
    forged = setup.forged_layer()
    record.layers[REL] = (forged, setup.layout.size, setup.tag)
    assert record._write()
    setup.proxy.reset()
    step = setup.package_tag("v1")
    assert step.returncode == 0, step.stderr
    assert f"the resume record names {forged[:19]}" in step.stdout, step.stdout
    assert "source bytes read to check the layers a record or the tag named" in step.stdout
    setup.assert_source_image("v1")


def test_a_forged_tag_with_the_source_annotation_is_not_reused(setup: Setup) -> None:
    package, client = setup.package, setup.client
    record = setup.record("v1")  # for the base manifest and config only
    forged = setup.forged_layer()
    config = package.build_config(record.base_config, [(REL, forged)])
    client.put_blob(setup.repo, config)
    notes = {REL: {package.SOURCE_ANNOTATION: setup.tag}}
    manifest = package.build_manifest(
        config, record.base_manifest["layers"], [(REL, forged, setup.layout.size)], record.base, record.base_digest, {}, notes
    )
    client.put_manifest(setup.repo, "v1", manifest, package.OCI_MANIFEST)
    step = setup.package_tag("v1")
    assert step.returncode == 0, step.stderr
    assert f"the tag names {forged[:19]}" in step.stdout, step.stdout
    setup.assert_source_image("v1")


def test_another_runs_record_and_a_session_written_by_someone_else(setup: Setup) -> None:
    """A record naming a layer of another source object (another ETag) and an upload session of this source that
    someone filled with other bytes: the layer is ignored, the session cannot commit (the registry computes another
    digest) and is replaced by a new one."""
    record = setup.record("v1")
    record.layers["config.json"] = (setup.forged_layer(), 1000, "s3:0123456789abcdef0123456789abcdef:1000")
    acked = MiB
    record.uploads[REL] = {"location": setup.open_session(acked), "acked": acked, "source": setup.tag}
    assert record._write()
    step = setup.package_tag("v1", "--chunk-threshold", "1MiB", "--chunk-size", "512KiB")
    assert step.returncode == 0, step.stderr
    assert f"{REL}: continuing the upload an earlier run left at byte {acked}" in step.stdout, step.stdout
    assert "registry computed a different digest" in step.stdout, step.stdout
    setup.assert_source_image("v1")


@pytest.mark.parametrize(
    "uploads",
    [
        '{"model.safetensors": {"location": "LOC", "acked": "abc", "source": "TAG"}}',
        '{"model.safetensors": {"location": "LOC", "acked": -5, "source": "TAG"}}',
        '{"model.safetensors": {"location": "LOC", "acked": BEYOND, "source": "TAG"}}',
        '{"model.safetensors": {"acked": 5, "source": "TAG"}}',
        '{"model.safetensors": {"location": "LOC", "acked": 5',
        '["LOC"]',
    ],
    ids=["not-a-number", "negative", "beyond-the-file", "field-missing", "not-json", "not-an-object"],
)
def test_a_record_it_cannot_use_is_one_warning(setup: Setup, uploads: str) -> None:
    record = setup.record("v1")
    location = f"http://{setup.proxy.host}/v2/{setup.repo}/blobs/uploads/0f0f?_state=x"
    text = uploads.replace("LOC", location).replace("TAG", setup.tag).replace("BEYOND", str(setup.layout.size + 10))
    setup.write_raw_record(record, text)
    step = setup.package_tag("v1", "--chunk-threshold", "1MiB", "--chunk-size", "512KiB")
    assert step.returncode == 0, step.stderr
    assert "Traceback" not in step.stderr
    assert len(warnings(step)) == 1, step.stdout
    setup.assert_source_image("v1")


def test_a_recorded_or_answered_upload_host_the_registry_did_not_name_receives_nothing(
    setup: Setup, request: pytest.FixtureRequest
) -> None:
    """A record naming a session on another host (answering like a registry would be enough to take bytes), and the
    registry's PATCH answer rewritten to name that host: neither is contacted; the run ends with the right image."""
    host, seen = request.getfixturevalue("hostile")
    record = setup.record("v1")
    record.uploads[REL] = {"location": f"http://{host}/v2/{setup.repo}/blobs/uploads/abc?_state=x", "acked": MiB, "source": setup.tag}
    assert record._write()
    step = setup.package_tag("v1", "--chunk-threshold", "1MiB", "--chunk-size", "512KiB")
    assert step.returncode == 0, step.stderr
    assert seen == [], seen
    assert len(warnings(step)) == 1 and host in warnings(step)[0], step.stdout
    setup.assert_source_image("v1")

    with run_proxy(setup.quay.port) as proxy:

        def elsewhere(method: str, path: str, status: int, head: bytes) -> bytes:
            if method == "PATCH" and status == 202:
                return head.replace(f"Location: http://{proxy.host}".encode(), f"Location: http://{host}".encode())
            return head

        proxy.rewrite_head = elsewhere
        setup.base_image = setup.base_image.replace(setup.proxy.host, proxy.host)
        setup.proxy = proxy
        step = setup.package_tag("v2", "--chunk-threshold", "1MiB", "--chunk-size", "512KiB")
    assert step.returncode == 0, step.stderr
    assert seen == [], seen
    setup.assert_source_image("v2")


def test_a_forged_tag_of_a_hugging_face_model_is_not_reused(
    tmp_path: Path, run_step: StepRunner, deployed: Deployed, quay: Registry, quay_proxy: HttpProxy, base_image: str, repo_name: str
) -> None:
    """The other streaming source: the tag names, for `model.safetensors`, a layer of other bytes annotated with the
    Hub's own key (`hf:<commit>:<lfs sha256>`, public in every image). The re-run reads the file from the Hub, finds
    another digest and uploads the real bytes."""
    import hashlib

    from tests.fixtures.hf_hub import COMMIT, FakeHub, run_hub

    package = deployed("package")
    files = {REL: os.urandom(SIZE), "config.json": b'{"a": 1}'}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(tmp_path / "hf-home")
    with run_hub(FakeHub("org/trusted", files)) as hub:
        args = ["--source", "hf://org/trusted", "--hf-endpoint", hub.endpoint, "--image", f"{quay_proxy.host}/{repo_name}:v1",
                "--base-image", via(quay_proxy, quay, base_image), "--authfile", quay.authfile(tmp_path / "a.json", host=quay_proxy.host),
                "--plain-http", "--retry-delay", "0.05"]  # fmt: skip
        assert run_step("package", *args, env=env).returncode == 0
        client = package.RegistryClient(
            quay.host, (quay.username, quay.password), [f"repository:{repo_name}:pull,push"],
            plain_http=True, tls_context=ssl.create_default_context(), timeout=30,
        )  # fmt: skip
        body, _ = client.get_manifest(repo_name, "v1")
        manifest = json.loads(body)
        layout = package.LayerLayout.for_file(REL, SIZE)
        forged = client.put_blob(repo_name, layout.head + os.urandom(SIZE) + layout.tail)
        hf_tag = f"hf:{COMMIT}:{hashlib.sha256(files[REL]).hexdigest()}"
        for layer in manifest["layers"]:
            if (layer.get("annotations") or {}).get("org.opencontainers.image.title") == REL:
                assert layer["annotations"][package.SOURCE_ANNOTATION] == hf_tag
                layer["digest"] = forged
        client.put_manifest(repo_name, "v1", json.dumps(manifest).encode(), package.OCI_MANIFEST)
        step = run_step("package", *args, env=env)
    assert step.returncode == 0, step.stderr
    assert f"the tag names {forged[:19]}" in step.stdout, step.stdout
    assert_image_holds(quay, f"{quay.host}/{repo_name}:v1", files, tmp_path / "pulled")


def test_only_a_session_opening_answer_names_an_upload_host(deployed: Deployed) -> None:
    """RegistryClient's URL rules, unit by unit: a POST answer may name a new upload host; a PATCH or status answer
    naming a host not named that way keeps its path and query on the session's host; a recorded session URL is used
    only on the registry or a named host, and only as an upload session of the repository."""
    import http.client as hc

    package = deployed("package")
    client = package.RegistryClient(
        "registry.example", ("u", "p"), [], plain_http=False, tls_context=ssl.create_default_context(), timeout=5
    )

    def answer(location: str) -> Any:
        headers = hc.HTTPMessage()
        headers["Location"] = location
        return sys.modules[package.RegistryClient.__module__].Reply(202, headers, b"")  # lib/registry.py's

    current = "https://registry.example/v2/m/blobs/uploads/1?_state=a"
    moved = client.upload_location(answer("https://elsewhere.example/v2/m/blobs/uploads/1?_state=b"), current)
    assert moved == "https://registry.example/v2/m/blobs/uploads/1?_state=b"
    assert client.session_url("https://elsewhere.example/v2/m/blobs/uploads/1?_state=b", "m") is None
    opened = client.upload_location(answer("https://upload.example/v2/m/blobs/uploads/2?_state=c"), "", trust=True)
    assert opened == "https://upload.example/v2/m/blobs/uploads/2?_state=c"
    assert (
        client.session_url("https://upload.example/v2/m/blobs/uploads/9?_state=d", "m")
        == "https://upload.example/v2/m/blobs/uploads/9?_state=d"
    )
    assert client.session_url("/v2/m/blobs/uploads/3?_state=e", "m") == "https://registry.example/v2/m/blobs/uploads/3?_state=e"
    assert client.session_url("/v2/other/blobs/uploads/3", "m") is None  # another repository
    assert client.session_url("/v2/m/manifests/latest", "m") is None  # not an upload session
    assert client.session_url("/v2/m/blobs/uploads/", "m") is None  # the endpoint that opens one
