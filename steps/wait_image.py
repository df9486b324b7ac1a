"""Wait until an image exists in a registry, then exit 0.

The model pipeline's tools image is built by a BuildConfig created in the same `pulumi up` as the
PipelineRuns; this first step (running on the public Python base image, stdlib only) holds the run
until the build has pushed the tag, instead of letting every TaskRun fail on ImagePullBackOff.
The service-account token is re-read on every attempt (tokens rotate during long waits).
"""

from __future__ import annotations

import argparse
import ssl
import time
from collections.abc import Sequence
from pathlib import Path

from lib.images import ImageRef
from lib.registry import RegistryClient, TransientError
from lib.runtime import EXIT_AUTH, EXIT_NOT_FOUND, EXIT_REMOTE, StepError, log, run_step

ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


def manifest_exists(ref: ImageRef, user: str, secret: str, plain_http: bool, context: ssl.SSLContext) -> bool:
    """HEAD the manifest through the shared registry client (auth challenge: Bearer token flow or Basic).

    The service-account token is tried first as a Bearer token as is (what OpenShift's registry takes);
    a fresh client per check, because the token file is re-read on every attempt (tokens rotate).
    """
    client = RegistryClient(
        ref.registry,
        (user, secret),
        [f"repository:{ref.repository}:pull"],
        plain_http=plain_http,
        tls_context=context,
        timeout=30,
        retries=2,
        initial_auth=f"Bearer {secret}",
    )
    reply = client.request("HEAD", f"/v2/{ref.repository}/manifests/{ref.reference}", {"Accept": ACCEPT})
    if reply.status == 200:
        return True
    if reply.status == 404:
        return False
    if reply.status == 403:
        raise StepError(f"{ref}: access denied (HTTP 403); the service account needs pull rights", EXIT_AUTH)
    raise StepError(f"{ref}: unexpected HTTP {reply.status} from the registry", EXIT_REMOTE)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True, help="registry/repo:tag to wait for")
    p.add_argument("--token-file", required=True, type=Path, help="token (password) file, re-read on every attempt")
    p.add_argument("--username", default="serviceaccount")
    p.add_argument("--ca-file", help="CA bundle for the registry (e.g. the service CA)")
    p.add_argument("--plain-http", action="store_true", help="plain HTTP (local test registries)")
    p.add_argument("--tls-verify", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait before giving up")
    p.add_argument("--interval", type=float, default=15.0, help="seconds between checks")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    ref = ImageRef.parse(args.image)
    context = ssl.create_default_context(cafile=args.ca_file if args.ca_file and Path(args.ca_file).exists() else None)
    if not args.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    started = time.monotonic()
    while True:
        try:
            secret = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise StepError(f"cannot read token file {args.token_file}: {exc}", EXIT_AUTH) from exc
        try:
            if manifest_exists(ref, args.username, secret, args.plain_http, context):
                log(f"{ref} is available after {time.monotonic() - started:.0f} s")
                return
        except (OSError, TransientError) as exc:  # registry not reachable yet: keep waiting
            log(f"{ref.registry} not reachable ({exc}); retrying")
        waited = time.monotonic() - started
        if waited >= args.timeout:
            raise StepError(f"{ref} did not appear within {args.timeout:.0f} s (is its BuildConfig failing?)", EXIT_NOT_FOUND)
        log(f"waiting for {ref} ({waited:.0f} s of {args.timeout:.0f} s)")
        time.sleep(min(args.interval, max(args.timeout - waited, 0.1)))


if __name__ == "__main__":
    run_step(main)
