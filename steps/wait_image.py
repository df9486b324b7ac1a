"""Wait until an image exists in a registry, then exit 0.

The model pipeline's tools image is built by a BuildConfig created in the same `pulumi up` as the
PipelineRuns; this first step (running on the public Python base image, stdlib only) holds the run
until the build has pushed the tag, instead of letting every TaskRun fail on ImagePullBackOff.
The service-account token is re-read on every attempt (tokens rotate during long waits).

With `--build-config` (the image wait Job of a stack that builds), every check also lists the Builds of those
BuildConfigs (the Job's Role: get/list/watch builds) and stops at once when the newest Build of one of them
ended `Failed`, `Error` or `Cancelled` (openshift/api build/v1/types.go, `BuildPhase`), with one line naming
the Build and its `oc logs` command, instead of sitting out the timeout. Builds carry the label
`openshift.io/build-config.name` and the annotation `openshift.io/build.number` (openshift/oc
pkg/helpers/build/constants.go `BuildConfigLabel`; openshift/api build/v1 `BuildNumberAnnotation`).
"""

from __future__ import annotations

import argparse
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .lib.images import ImageRef
from .lib.registry import RegistryClient, TransientError
from .lib.runtime import EXIT_AUTH, EXIT_FAILED, EXIT_NOT_FOUND, EXIT_REMOTE, StepError, log

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


FAILED_PHASES = ("Failed", "Error", "Cancelled")
BUILD_CONFIG_LABEL = "openshift.io/build-config.name"
BUILD_NUMBER = "openshift.io/build.number"


def failed_build(builds: list[dict[str, Any]], namespace: str) -> str | None:
    """One line when the newest Build of a BuildConfig ended Failed/Error/Cancelled, else None."""
    newest: dict[str, tuple[int, dict[str, Any]]] = {}
    for build in builds:
        meta = build.get("metadata") or {}
        config = (meta.get("labels") or {}).get(BUILD_CONFIG_LABEL, "")
        try:
            number = int((meta.get("annotations") or {}).get(BUILD_NUMBER, "0"))
        except ValueError:
            number = 0
        if config not in newest or number > newest[config][0]:
            newest[config] = (number, build)
    for config in sorted(newest):
        build = newest[config][1]
        status = build.get("status") or {}
        phase = status.get("phase")
        if phase in FAILED_PHASES:
            name = (build.get("metadata") or {}).get("name")
            why = status.get("reason") or status.get("message") or ""
            return f"build {name} {phase}{f' ({why})' if why else ''}: see `oc logs build/{name} -n {namespace}`"
    return None


def list_builds(api: str, namespace: str, configs: Sequence[str], token: str, context: ssl.SSLContext) -> list[dict[str, Any]]:
    """The Builds of `configs` (one GET with a label selector); raises OSError when the API cannot be read."""
    selector = f"{BUILD_CONFIG_LABEL} in ({','.join(configs)})"
    url = f"{api.rstrip('/')}/apis/build.openshift.io/v1/namespaces/{namespace}/builds?labelSelector={urllib.parse.quote(selector)}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context if url.startswith("https:") else None) as reply:
            items = json.loads(reply.read()).get("items") or []
    except urllib.error.HTTPError as exc:
        raise OSError(f"listing builds: HTTP {exc.code}") from None
    except ValueError as exc:
        raise OSError(f"listing builds: {exc}") from None
    return [item for item in items if isinstance(item, dict)]


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
    p.add_argument("--build-config", action="append", default=[], help="BuildConfig whose failed Build ends the wait (repeatable)")
    p.add_argument("--namespace", help="namespace of the BuildConfigs")
    p.add_argument("--api-server", default="https://kubernetes.default.svc", help="Kubernetes API for the Build list")
    p.add_argument("--api-ca-file", help="CA bundle of the API server (the service account's ca.crt)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    ref = ImageRef.parse(args.image)
    context = ssl.create_default_context(cafile=args.ca_file if args.ca_file and Path(args.ca_file).exists() else None)
    if not args.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    api_context = ssl.create_default_context(cafile=args.api_ca_file if args.api_ca_file and Path(args.api_ca_file).exists() else None)
    if args.build_config and not args.namespace:
        raise StepError("--build-config needs --namespace", EXIT_FAILED)
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
        if args.build_config:
            try:
                failed = failed_build(list_builds(args.api_server, args.namespace, args.build_config, secret, api_context), args.namespace)
            except OSError as exc:  # the API is not the truth, the registry is: keep waiting on it
                log(f"could not list the builds ({exc}); waiting on the registry only this time")
            else:
                if failed:
                    raise StepError(f"{ref} will not appear: {failed}", EXIT_FAILED)
        waited = time.monotonic() - started
        if waited >= args.timeout:
            raise StepError(f"{ref} did not appear within {args.timeout:.0f} s (is its BuildConfig failing?)", EXIT_NOT_FOUND)
        log(f"waiting for {ref} ({waited:.0f} s of {args.timeout:.0f} s)")
        time.sleep(min(args.interval, max(args.timeout - waited, 0.1)))
