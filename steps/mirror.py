"""Mirror an image by digest to another registry with `skopeo copy --preserve-digests` and verify it.

The destination credentials can be a service-account token file: the authfile
(`serviceaccount:<token>`) is built right before each skopeo call, because tokens read at task
start expire during long copies. After the copy the destination tag's manifest is read back and
its digest must equal the source digest.

skopeo's own `--retry-times` does not cover everything a busy registry does: a 5xx from the token
service ends it at once (containers/image docker/docker_client.go `getBearerToken` wraps the status in
a plain error, which containers/common pkg/retry `isRetryable` does not retry). So a skopeo call that
fails with a 5xx or 429, a dropped connection or a timeout runs again, up to `--retry-times` more times
with exponential backoff (`--retry-delay`), every run within `--timeout`; both calls are idempotent (a copy
by digest re-sends no blob the destination has). Authentication and unknown-manifest failures are not retried.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .lib.images import ImageRef
from .lib.runtime import EXIT_AUTH, EXIT_INTEGRITY, EXIT_NOT_FOUND, EXIT_REMOTE, StepError, backoff, log, write_result, writing

# Words of skopeo's auth failures; status codes as whole numbers only (a port such as :59403 is no 403).
AUTH_HINTS = re.compile(r"unauthorized|authentication required|denied|\b40[13]\b")
# What a later attempt may not meet (lower-cased skopeo message): a 5xx (containers/image: "invalid status code
# from registry 503", "unexpected http status: 502", "StatusCode: 500"), a dropped connection, a timeout.
TRANSIENT = re.compile(
    r"(invalid status code from registry|unexpected http status:?|statuscode:) (5\d\d|429)\b|toomanyrequests"
    r"|: eof\b|unexpected eof|connection reset by peer|broken pipe"
    r"|i/o timeout|tls handshake timeout|client\.timeout exceeded|timeout awaiting response headers|context deadline exceeded"
)


class SkopeoFailed(StepError):
    def __init__(self, message: str, code: int, transient: bool) -> None:
        super().__init__(message, code)
        self.transient = transient


def token_authfile(directory: Path, registry: str, username: str, token_file: Path) -> Path:
    """Write a private authfile for `registry` from the token file's current content."""
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise StepError(f"cannot read token file {token_file}: {exc}", EXIT_AUTH) from exc
    if not token:
        raise StepError(f"token file {token_file} is empty", EXIT_AUTH)
    path = directory / "dest-auth.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"auths": {registry: {"auth": base64.b64encode(f"{username}:{token}".encode()).decode()}}}, fh)
    return path


def skopeo(args: list[str], what: str, env: dict[str, str], timeout: float) -> bytes:
    try:
        proc = subprocess.run(["skopeo", *args], capture_output=True, env=env, timeout=timeout)
    except FileNotFoundError as exc:
        raise StepError("skopeo is not installed in this image", EXIT_REMOTE) from exc
    except subprocess.TimeoutExpired as exc:
        raise StepError(f"{what}: skopeo did not finish within {timeout:.0f}s", EXIT_REMOTE) from exc
    for line in proc.stderr.decode("utf-8", "replace").splitlines():
        log(f"skopeo: {line}")
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        message = lines[-1] if lines else f"exit code {proc.returncode}"
        lower = message.lower()
        code = EXIT_AUTH if AUTH_HINTS.search(lower) else EXIT_NOT_FOUND if "manifest unknown" in lower else EXIT_REMOTE
        raise SkopeoFailed(f"{what} failed: {message}", code, transient=code == EXIT_REMOTE and bool(TRANSIENT.search(lower)))
    return proc.stdout


def with_retries(call: Callable[[float], bytes], what: str, retries: int, first_delay: float, timeout: float) -> bytes:
    """`call(seconds left)` (a skopeo run), again after a transient failure, at most `retries` more times, all of
    them within `timeout` seconds: a retry that could not start before the deadline is not made."""
    deadline = time.monotonic() + timeout
    for attempt in range(1, retries + 2):
        try:
            return call(max(deadline - time.monotonic(), 1.0))
        except SkopeoFailed as exc:
            delay = backoff(attempt, first_delay)
            if not exc.transient or attempt > retries or time.monotonic() + delay >= deadline:
                raise
            log(f"{what}: transient failure; retry {attempt}/{retries} in {delay:.1f}s")
            time.sleep(delay)
    raise AssertionError("unreachable")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", required=True, help="source image by digest: registry/repo@sha256:...")
    p.add_argument("--dest", required=True, help="destination with tag, e.g. image-registry.openshift-image-registry.svc:5000/ns/model:v1")
    p.add_argument("--src-authfile", help="authfile for the source registry (e.g. the Quay .dockerconfigjson)")
    dest_auth = p.add_mutually_exclusive_group()
    dest_auth.add_argument("--dest-authfile", help="authfile for the destination registry")
    dest_auth.add_argument("--dest-token-file", type=Path, help="token file read right before use (service-account token)")
    p.add_argument("--dest-username", default="serviceaccount", help="user name paired with --dest-token-file")
    p.add_argument("--src-tls-verify", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--dest-tls-verify", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--src-cert-dir", help="directory with *.crt CA files for the source")
    p.add_argument("--dest-cert-dir", help="directory with *.crt CA files for the destination (e.g. the service CA)")
    p.add_argument("--retry-times", type=int, default=3, help="skopeo retries per operation, and runs of skopeo after a transient failure")
    p.add_argument("--retry-delay", type=float, default=2.0, help="first delay before running skopeo again, in seconds (doubles)")
    p.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds before the copy (all its runs) is abandoned")
    p.add_argument("--tmpdir", help="TMPDIR for skopeo (point at the workspace PVC, never the node disk)")
    p.add_argument("--result-digest", help="file to write the destination digest to (Tekton result)")
    p.add_argument("--result-image", help="file to write <dest registry>/<repo>@<digest> to (Tekton result)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    src, dest = ImageRef.parse(args.src), ImageRef.parse(args.dest)
    if not src.digest:
        raise StepError(f"--src must name the image by digest (repo@sha256:...), got {args.src}")
    if not dest.tag or dest.digest:
        raise StepError(f"--dest needs a tag and no digest, got {args.dest}")
    env = dict(os.environ)
    if args.tmpdir:
        with writing(args.tmpdir, "mirror temp dir"):
            Path(args.tmpdir).mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = args.tmpdir
    src_opts = [f"--src-tls-verify={str(args.src_tls_verify).lower()}"]
    src_opts += ["--src-authfile", args.src_authfile] if args.src_authfile else []
    src_opts += ["--src-cert-dir", args.src_cert_dir] if args.src_cert_dir else []
    source, target = f"docker://{src.registry}/{src.repository}@{src.digest}", f"docker://{dest}"
    with tempfile.TemporaryDirectory(prefix="mirror-auth-", dir=args.tmpdir) as private:

        def dest_opts(prefix: str) -> list[str]:
            authfile = args.dest_authfile
            if args.dest_token_file:
                with writing(private, "mirror temp dir"):
                    authfile = str(token_authfile(Path(private), dest.registry, args.dest_username, args.dest_token_file))
            opts = [f"--{prefix}tls-verify={str(args.dest_tls_verify).lower()}"]
            opts += [f"--{prefix}authfile", authfile] if authfile else []
            return opts + ([f"--{prefix}cert-dir", args.dest_cert_dir] if args.dest_cert_dir else [])

        log(f"mirroring {source} to {target}")
        copy = ["copy", "--all", "--preserve-digests", f"--retry-times={args.retry_times}", *src_opts]
        inspect = ["inspect", "--raw", f"--retry-times={args.retry_times}"]
        retries, delay = max(args.retry_times, 0), args.retry_delay

        def run_copy(seconds: float) -> bytes:  # the token file is read again for every run
            return skopeo([*copy, *dest_opts("dest-"), source, target], "skopeo copy", env, seconds)

        def run_inspect(seconds: float) -> bytes:
            return skopeo([*inspect, *dest_opts(""), target], "skopeo inspect", env, seconds)

        with_retries(run_copy, "skopeo copy", retries, delay, args.timeout)
        raw = with_retries(run_inspect, "skopeo inspect", retries, delay, 600)
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    if digest != src.digest:
        raise StepError(f"{dest} has digest {digest}, source is {src.digest}: digests were not preserved", EXIT_INTEGRITY)
    log(f"{dest} verified: {digest}")
    write_result(args.result_digest, digest)
    write_result(args.result_image, f"{dest.registry}/{dest.repository}@{digest}")
