"""upload_s3.py against moto S3: multipart from disk, part checksums, skip on re-run."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.fixtures.proxy import run_proxy
from tests.fixtures.s3 import S3Server
from tests.steps.conftest import StepRunner, write_model

MiB = 1 << 20


def test_multipart_upload_and_rerun_skips(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    models = tmp_path / "ws" / "models"
    files = write_model(models, {"model.safetensors": 12 * MiB + 7, "config.json": 300, "sub/tok.json": 40})
    client = s3.client()
    client.create_bucket(Bucket="uploads")
    with run_proxy(int(s3.endpoint.rsplit(":", 1)[1])) as proxy:
        args = ["--src", models, "--dest", "s3://uploads/mistral/v1/", "--endpoint-url", f"http://{proxy.host}", "--part-size", "5MiB"]
        step = run_step("upload_s3", *args, "--result-uri", tmp_path / "uri", env=s3.env())
        assert step.returncode == 0, step.stderr
        assert (tmp_path / "uri").read_text() == "s3://uploads/mistral/v1/"
        assert proxy.count("PUT", "partNumber=") == 3, "12 MiB in 5 MiB parts"
        for rel, data in files.items():
            body = client.get_object(Bucket="uploads", Key=f"mistral/v1/{rel}")["Body"].read()
            assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest()

        # the package step records layer digests in the cache; with them a re-run skips unchanged files
        cache = models.parent / ".models.digests.json"
        assert not cache.exists()
        run_step("download", "--source", "s3://uploads/mistral/v1", "--dest", models, "--endpoint-url", s3.endpoint, env=s3.env())
        step = run_step("upload_s3", *args, env=s3.env())
        assert step.returncode == 0, step.stderr
        proxy.reset()
        step = run_step("upload_s3", *args, env=s3.env())
        assert step.returncode == 0, step.stderr
        assert step.stdout.count("skipped") == len(files)
        assert proxy.count("PUT") == 0


def test_upload_errors(tmp_path: Path, run_step: StepRunner, s3: S3Server) -> None:
    models = tmp_path / "models"
    write_model(models, {"a.bin": 100})
    args = ["--src", models, "--endpoint-url", s3.endpoint]
    step = run_step("upload_s3", *args, "--dest", "s3://missing-bucket/x/", env=s3.env())
    assert step.returncode == 5 and "NoSuchBucket" in step.error
    s3.client().create_bucket(Bucket="upload-creds")
    step = run_step("upload_s3", *args, "--dest", "s3://upload-creds/x/", env=s3.env(secret_key="nope"))
    assert step.returncode == 4 and "rejected the credentials" in step.error
    step = run_step("upload_s3", *args, "--dest", "s3://upload-creds/x/", "--part-size", "1MiB", env=s3.env())
    assert step.returncode == 2 and "--part-size" in step.stderr
