"""A small OCI distribution client on http.client: auth challenges, streaming bodies, retries.

Why one module: the OCI distribution client (auth challenges, token renewal, retries, streaming bodies) is one
object's behaviour: every request goes through the same auth and retry path.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .runtime import EXIT_AUTH, EXIT_INTEGRITY, EXIT_NOT_FOUND, EXIT_REMOTE, StepError, backoff, human, log

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
STREAM_READ = 1 << 20
RETRY_STATUSES = (429, 500, 502, 503, 504)


# --- the distribution API client ------------------------------------------------------------


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class TransientError(Exception):
    """A dropped connection, timeout or 5xx: the operation may be retried or resumed."""


class AuthExpired(TransientError):
    """The registry refused the token (401) during an upload; a new one has been fetched."""


class ChunkRefused(Exception):
    """HTTP 413: the registry (or a proxy in front of it) refused a request body of this size."""


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    cut: Exception | None = None  # a chunked body ended early because its source failed (`RegistryClient.stream`)

    def header(self, name: str) -> str:
        return self.headers.get(name) or ""

    def error_text(self) -> str:
        try:
            errors = json.loads(self.body)["errors"]
            return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
        except (ValueError, KeyError, TypeError):
            return self.body[:200].decode("utf-8", "replace").strip() or f"HTTP {self.status}"


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


class RegistryClient:
    """Minimal OCI distribution client on http.client: auth challenges, streaming bodies, retries."""

    def __init__(
        self,
        registry: str,
        credentials: tuple[str, str] | None,
        scopes: Sequence[str],
        *,
        plain_http: bool,
        tls_context: ssl.SSLContext,
        timeout: float,
        retries: int = 5,
        retry_delay: float = 2.0,
        initial_auth: str | None = None,
    ) -> None:
        """`initial_auth`: an Authorization value to try first (OpenShift's registry takes a service-account
        token as a Bearer token as is); a 401 to it falls back to the challenge like any expired credential."""
        host = "registry-1.docker.io" if registry == "docker.io" else registry
        self.registry = registry
        self.base = f"{'http' if plain_http else 'https'}://{host}"
        self.credentials, self.scopes = credentials, list(scopes)
        self.tls_context, self.timeout = tls_context, timeout
        self.retries, self.retry_delay = retries, retry_delay
        self._local = threading.local()
        self._auth_lock = threading.Lock()
        self._auth: str | None = initial_auth
        # Where credentials may go. The registry's own origin gets the Authorization we hold (Basic or
        # Bearer). Hosts of upload URLs the registry hands out in answers to POST/PATCH (Quay builds them
        # from SERVER_HOSTNAME, which may differ from the name pushed to) get a Bearer token only, and
        # never over http when the registry is https. The token realm (which may be another host, as
        # auth.docker.io is for Docker Hub) comes only from a challenge the registry's own origin
        # answered, and is then reused: a 401 from any other host never chooses where Basic credentials
        # go. Never the targets of GET redirects (signed storage URLs).
        self._origin_self = self._origin(self.base)
        self._locations: set[str] = set()
        self._realm: dict[str, str] | None = None  # realm and service of the registry's Bearer challenge

    # -- connections --------------------------------------------------------------------------
    def _open(self, url: str) -> tuple[http.client.HTTPConnection, str]:
        parts = urllib.parse.urlsplit(url if "://" in url else self.base + url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        pool: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        key = f"{parts.scheme}://{parts.netloc}"
        conn = pool.get(key)
        if conn is None:
            conn = self._new_connection(parts.scheme, parts.netloc)
            pool[key] = conn
        return conn, path

    def _new_connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(netloc, timeout=self.timeout, context=self.tls_context)
        return http.client.HTTPConnection(netloc, timeout=self.timeout)

    def _discard(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        pool = self._local.__dict__.get("pool", {})
        for key, value in list(pool.items()):
            if value is conn:
                del pool[key]

    @staticmethod
    def _origin(url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}".lower()

    def absolute(self, url: str) -> str:
        return urllib.parse.urljoin(self.base + "/", url)

    def upload_location(self, reply: Reply, current: str, trust: bool = False) -> str:
        """The upload URL from an answer of the registry. Only the answer that opens a session (a POST to the
        registry's own origin, `trust=True`) may name a new upload host, which may then get the Bearer token;
        in every other answer (PATCH, status GET) a URL on a host not yet named that way keeps only its path and
        query, on the session's host: an answer cannot hand another host the token or the model's bytes."""
        location = reply.header("Location")
        if not location:
            return current
        url = self.absolute(location)
        origin = self._origin(url)
        if trust:
            if origin != self._origin_self:
                self._locations.add(origin)
            return url
        if origin != self._origin_self and origin not in self._locations:
            # Its path and query (distribution signs the session's offset into `_state` there) on the host the
            # session is on: the host named nowhere else gets nothing, the session goes on.
            parts = urllib.parse.urlsplit(url)
            return (
                urllib.parse.urljoin(self.absolute(current), parts.path + (f"?{parts.query}" if parts.query else ""))
                if current
                else current
            )
        return url

    def session_url(self, location: str, repo: str) -> str | None:
        """`location` (a recorded upload URL) as an absolute URL when it is an upload session of `repo` on the
        registry or on an upload host the registry named in this run; None otherwise (it then gets nothing)."""
        url = self.absolute(location)
        parts = urllib.parse.urlsplit(url)
        origin = self._origin(url)
        if origin != self._origin_self and origin not in self._locations:
            return None
        if not parts.path.startswith(f"/v2/{repo}/blobs/uploads/") or parts.path.rstrip("/") == f"/v2/{repo}/blobs/uploads":
            return None
        return url

    def cancel_upload(self, location: str, what: str) -> None:
        """DELETE an upload session nobody will resume (OCI distribution spec, "Deleting an upload"; distribution's
        CancelBlobUpload, Quay's cancel_upload), by the rules of any upload URL (credentials as `_may_send` allows).
        Best effort: a failure is logged, never fatal (the registry purges the session later)."""
        try:
            status = self.request("DELETE", location).status
        except (TransientError, StepError) as exc:
            log(f"{what}: could not cancel the upload session ({exc}); the registry purges it later")
            return
        if status not in (202, 204, 404):
            log(f"{what}: cancelling the upload session answered HTTP {status}; the registry purges it later")

    def _may_send(self, url: str, auth: str | None) -> bool:
        """Whether `auth` may go to `url` (see __init__: the registry gets it; a named upload host gets a
        Bearer token only, never downgraded to http)."""
        if not auth:
            return False
        origin = self._origin_self if url.startswith("/") else self._origin(url)
        if origin == self._origin_self:
            return True
        downgrade = self._origin_self.startswith("https:") and not origin.startswith("https:")
        return origin in self._locations and auth.startswith("Bearer ") and not downgrade

    def _headers(self, url: str, extra: dict[str, str] | None) -> dict[str, str]:
        headers = dict(extra or {})
        if self._auth and self._may_send(url, self._auth):
            headers["Authorization"] = self._auth
        return headers

    # -- requests -----------------------------------------------------------------------------
    def request(
        self, method: str, url: str, headers: dict[str, str] | None = None, body: bytes = b"", timeout: float | None = None
    ) -> Reply:
        """Send a small request: answer auth challenges, retry dropped connections and 429/5xx answers
        (`retries` times, backoff with jitter). A stale keep-alive connection is retried at once.
        `timeout` replaces the socket timeout for this request (a slow answer is expected)."""
        renewed, failures = False, 0
        while True:
            conn, path = self._open(url)
            sent_auth = self._auth
            try:
                if timeout is not None:
                    conn.timeout = timeout
                    if conn.sock is not None:
                        conn.sock.settimeout(timeout)
                conn.request(method, path, body=body, headers=self._headers(url, headers))
                resp = conn.getresponse()
                reply = Reply(resp.status, resp.headers, resp.read())
                if timeout is not None and conn.sock is not None:
                    conn.timeout = self.timeout
                    conn.sock.settimeout(self.timeout)
            except (OSError, http.client.HTTPException) as exc:
                self._discard(conn)
                failures += 1
                if failures > self.retries + 1:
                    raise TransientError(f"{method} {self.registry}: {exc or type(exc).__name__}") from exc
                if failures > 1:  # the first one may be a keep-alive connection the server closed
                    time.sleep(backoff(failures - 1, self.retry_delay))
                continue
            if reply.status in RETRY_STATUSES and failures < self.retries:
                failures += 1
                delay = backoff(failures, self.retry_delay)
                log(f"{method} {self.registry}: HTTP {reply.status}; retry {failures}/{self.retries} in {delay:.1f}s")
                time.sleep(delay)
                continue
            if reply.status != 401:
                return reply
            if renewed:
                raise StepError(f"{self.registry}: credentials rejected or not allowed (HTTP 401: {reply.error_text()})", EXIT_AUTH)
            self.authenticate(reply.header("WWW-Authenticate"), sent_auth, url)  # no-op if another thread did
            renewed = True

    def stream(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        length: int,
        chunks: Iterable[memoryview],
        on_sent: Callable[[memoryview], None],
        chunked: bool = False,
    ) -> Reply:
        """Send a request whose body of `length` bytes comes from `chunks`; connection errors are transient.

        `chunked`: the body goes out in chunked transfer encoding, so a source that fails part-way (a TransientError
        or StepError from `chunks`) ends the body cleanly where it stopped instead of leaving a half-sent request: the
        registry stores what arrived and answers as for any PATCH (the answer carries the source's error in `cut`).
        distribution reads a PATCH body to its end whatever Content-Range says (v2.8.2 registry/handlers/blobupload.go
        PatchBlobData; v3 compares the range only when Content-Length is given), Quay reads a chunked body from
        wsgi.input (endpoints/v2/__init__.py get_input_stream) and counts the bytes it stored (blobuploader.py
        upload_chunk); docker's own push streams its PATCH bodies chunked."""
        conn, path = self._open(url)
        sent, sent_auth, cut = 0, self._auth, None
        framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(length)}
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for key, value in {**self._headers(url, headers), **framing}.items():
                conn.putheader(key, value)
            conn.endheaders()
            pieces = iter(chunks)
            while True:
                try:
                    chunk = next(pieces)
                except StopIteration:
                    break
                except (TransientError, StepError) as exc:
                    if not chunked:
                        raise
                    cut = exc
                    break
                if chunked:
                    conn.send(b"%x\r\n" % len(chunk))
                    conn.send(chunk)
                    conn.send(b"\r\n")
                else:
                    # A slice of a FileWindow (lib/model.py) goes out by sendfile() on a plain socket: no copy here.
                    win: Any = chunk.obj
                    if isinstance(getattr(win, "pos", None), int) and conn.sock and not isinstance(conn.sock, ssl.SSLSocket):
                        conn.sock.sendfile(win.file, win.pos, len(chunk))
                    else:
                        conn.send(chunk)
                sent += len(chunk)
                on_sent(chunk)
            if chunked:
                conn.send(b"0\r\n\r\n")
            resp = conn.getresponse()
            reply = Reply(resp.status, resp.headers, resp.read(), cut)
        except (OSError, http.client.HTTPException) as exc:
            # Registries authenticate (and check sizes) before reading the body, so an expired token
            # or a too-large request is answered early and the connection then closed while we send.
            early = self._early_reply(conn) if sent < length else None
            self._discard(conn)
            if early is None or early.status >= 500:
                raise TransientError(f"connection to {self.registry} lost after {human(sent)}: {exc}") from exc
            reply = early
        except BaseException:
            # The body's source failed (a StepError from the reader): the request is half sent. Close the
            # connection, so the registry ends that request before anything else (a DELETE) is sent.
            self._discard(conn)
            raise
        if reply.status >= 500:
            raise TransientError(f"{method} {self.registry}: HTTP {reply.status} {reply.error_text()}")
        if reply.status == 401:
            # Token expired mid-upload (Quay's last one hour): fetch a new one, then resume.
            self.authenticate(reply.header("WWW-Authenticate"), sent_auth, url)
            raise AuthExpired(f"{method} {self.registry}: credentials expired (HTTP 401)")
        if reply.status == 413:
            raise ChunkRefused(f"{method} {self.registry}: HTTP 413 for a {human(length)} request")
        return reply

    @staticmethod
    def _early_reply(conn: http.client.HTTPConnection) -> Reply | None:
        """A registry that refuses a body (e.g. 413) answers before it has read it; fetch that answer."""
        try:
            resp = conn.getresponse()
            return Reply(resp.status, resp.headers, resp.read())
        except (OSError, http.client.HTTPException):
            return None

    def open_stream(self, url: str, offset: int) -> Iterator[memoryview]:
        """Yield the body of a GET (following redirects) from byte `offset`, on its own connection."""
        wanted = {"Range": f"bytes={offset}-"} if offset else None
        headers, renewed = self._headers(url, wanted), False
        for _ in range(5):
            parts = urllib.parse.urlsplit(url if "://" in url else self.base + url)
            conn = self._new_connection(parts.scheme, parts.netloc)
            try:
                conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
                resp = conn.getresponse()
                if resp.status == 401 and not renewed:  # token expired during a long upload
                    resp.read()
                    self.authenticate(resp.getheader("WWW-Authenticate", ""), headers.get("Authorization"), url)
                    headers, renewed = self._headers(url, wanted), True
                    continue
                if resp.status in (301, 302, 303, 307, 308):
                    url = urllib.parse.urljoin(url if "://" in url else self.base + url, resp.getheader("Location", ""))
                    resp.read()
                    headers = {k: v for k, v in headers.items() if k != "Authorization"}
                    continue
                if resp.status not in (200, 206):
                    raise StepError(f"GET {url}: HTTP {resp.status}", EXIT_REMOTE)
                skip = offset if resp.status == 200 else 0
                buf = bytearray(STREAM_READ)
                view = memoryview(buf)
                while got := resp.readinto(buf):
                    if skip >= got:
                        skip -= got
                        continue
                    yield view[skip:got]
                    skip = 0
                return
            except (OSError, http.client.HTTPException) as exc:
                raise TransientError(f"download from {parts.netloc} failed: {exc}") from exc
            finally:
                conn.close()
        raise StepError(f"GET {url}: too many redirects", EXIT_REMOTE)

    # -- authentication -----------------------------------------------------------------------
    def authenticate(self, challenge: str, rejected: str | None, url: str = "/") -> None:
        """Answer a 401 challenge from `url`: Basic credentials, or a Bearer token fetched from the realm.

        Only a challenge of the registry's own origin is read; a 401 from an upload host the registry
        named renews the token at the realm the registry named before (never one that host names)."""
        with self._auth_lock:
            if self._auth != rejected:
                return  # another thread already renewed it
            own = url.startswith("/") or self._origin(url) == self._origin_self
            scheme, params = _parse_challenge(challenge) if own else ("", {})
            if not own and self._realm is None:
                host = urllib.parse.urlsplit(url).netloc
                raise StepError(
                    f"{self.registry}: the upload host {host} it named asks for credentials, and the registry has given "
                    "no token realm to renew them at (credentials are sent only to the registry and its own realm)",
                    EXIT_AUTH,
                )
            if not own:
                self._auth = "Bearer " + self._fetch_token(self._realm or {})
            elif scheme == "basic":
                if not self.credentials:
                    raise StepError(f"{self.registry}: authentication required, no credentials in the authfile", EXIT_AUTH)
                self._auth = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
            elif scheme == "bearer" and params.get("realm"):
                self._realm = {"realm": params["realm"], "service": params.get("service", "")}
                self._widen(params.get("scope", ""))
                self._auth = "Bearer " + self._fetch_token(self._realm)
            else:
                raise StepError(f"{self.registry}: unsupported authentication challenge {challenge!r}", EXIT_AUTH)

    def _widen(self, wanted: str) -> None:
        """Add the actions the registry's challenge names for a repository we already hold a scope for
        (distribution names `repository:<name>:delete` for a DELETE: registry/auth/token/accesscontroller.go,
        authChallenge.SetHeaders); never a repository we did not ask for."""
        for scope in wanted.split():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            for i, held in enumerate(self.scopes):
                h_kind, _, h_rest = held.partition(":")
                h_name, _, h_actions = h_rest.rpartition(":")
                if (h_kind, h_name) == (kind, name) and name:
                    merged = list(dict.fromkeys(h_actions.split(",") + actions.split(",")))
                    self.scopes[i] = f"{kind}:{name}:{','.join(a for a in merged if a)}"

    def _fetch_token(self, params: dict[str, str]) -> str:
        if self._origin_self.startswith("https:") and not params["realm"].lower().startswith("https:") and self.credentials:
            raise StepError(f"{self.registry}: token realm {params['realm']} is not https; no credentials in clear text", EXIT_AUTH)
        query = [("service", params.get("service", ""))] + [("scope", s) for s in self.scopes]
        url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
        headers = {}
        if self.credentials:
            headers["Authorization"] = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        parts = urllib.parse.urlsplit(url)
        for attempt in range(self.retries + 1):
            conn = self._new_connection(parts.scheme, parts.netloc)
            try:
                conn.request("GET", f"{parts.path}?{parts.query}", headers=headers)
                resp = conn.getresponse()
                status, body, problem = resp.status, resp.read(), ""
            except (OSError, http.client.HTTPException) as exc:
                status, body, problem = 0, b"", f"unreachable: {exc or type(exc).__name__}"
            finally:
                conn.close()
            if status and status not in RETRY_STATUSES:
                break
            problem = problem or f"HTTP {status}"
            if attempt == self.retries:
                # A token service that is down is not a credentials problem (exit 6, not 4).
                raise StepError(f"token service {parts.netloc} {problem} after {self.retries} retries", EXIT_REMOTE)
            delay = backoff(attempt + 1, self.retry_delay)
            log(f"token service {parts.netloc}: {problem}; retry {attempt + 1}/{self.retries} in {delay:.1f}s")
            time.sleep(delay)
        if status in (401, 403):
            raise StepError(f"{self.registry}: credentials rejected by token service (HTTP {status})", EXIT_AUTH)
        try:
            data = json.loads(body)
            return str(data.get("token") or data["access_token"])
        except (ValueError, KeyError, TypeError) as exc:
            raise StepError(f"token service {parts.netloc}: unexpected answer (HTTP {status})", EXIT_AUTH) from exc

    # -- distribution API ---------------------------------------------------------------------
    def check(self, reply: Reply, what: str, ok: Iterable[int]) -> Reply:
        if reply.status in ok:
            return reply
        if reply.status >= 500:
            raise TransientError(f"{what}: HTTP {reply.status} {reply.error_text()}")
        code = {401: EXIT_AUTH, 403: EXIT_AUTH, 404: EXIT_NOT_FOUND}.get(reply.status, EXIT_REMOTE)
        raise StepError(f"{what}: HTTP {reply.status} {reply.error_text()}", code)

    def blob_exists(self, repo: str, digest: str) -> bool:
        reply = self.check(self.request("HEAD", f"/v2/{repo}/blobs/{digest}"), f"HEAD blob {digest}", (200, 404))
        return reply.status == 200

    def get_manifest(self, repo: str, reference: str) -> tuple[bytes, str]:
        reply = self.request("GET", f"/v2/{repo}/manifests/{reference}", {"Accept": MANIFEST_ACCEPT})
        self.check(reply, f"manifest {self.registry}/{repo}:{reference}", (200,))
        media_type = reply.header("Content-Type").split(";")[0].strip()
        return reply.body, json.loads(reply.body).get("mediaType") or media_type

    def get_blob(self, repo: str, digest: str) -> bytes:
        data = b"".join(bytes(c) for c in self.open_stream(f"/v2/{repo}/blobs/{digest}", 0))
        if sha256_digest(data) != digest:
            raise StepError(f"blob {digest} from {self.registry}/{repo} failed verification", EXIT_INTEGRITY)
        return data

    def mount_blob(self, repo: str, digest: str, from_repo: str) -> bool:
        query = urllib.parse.urlencode({"mount": digest, "from": from_repo})
        reply = self.request("POST", f"/v2/{repo}/blobs/uploads/?{query}", body=b"")
        self.check(reply, f"mount {digest}", (201, 202))
        if reply.status == 202 and reply.header("Location"):
            # Mount refused: the registry opened an upload session instead (a POST answer, like any other), so
            # its URL follows the rules of any upload URL; dropping it is best effort.
            self.cancel_upload(self.upload_location(reply, "", trust=True), f"mount of {digest[:19]}")
        return reply.status == 201

    def put_blob(self, repo: str, data: bytes) -> str:
        """Upload a small blob unless the registry has it (POST, then one PUT with the body)."""
        digest = sha256_digest(data)
        if not self.blob_exists(repo, digest):
            reply = self.check(self.request("POST", f"/v2/{repo}/blobs/uploads/", body=b""), f"start upload to {repo}", (202,))
            location = self.upload_location(reply, "", trust=True)
            sep = "&" if "?" in location else "?"
            put = self.request("PUT", f"{location}{sep}digest={digest}", {"Content-Type": "application/octet-stream"}, data)
            self.check(put, f"upload {digest}", (201, 204))
        return digest

    def delete_manifest(self, repo: str, digest: str) -> int:
        """DELETE a manifest by digest (every tag naming it goes with it); returns the HTTP status."""
        return self.request("DELETE", f"/v2/{repo}/manifests/{digest}").status

    def put_manifest(self, repo: str, reference: str, manifest: bytes, media_type: str) -> str:
        reply = self.request("PUT", f"/v2/{repo}/manifests/{reference}", {"Content-Type": media_type}, manifest)
        self.check(reply, f"PUT manifest {repo}:{reference}", (200, 201))
        digest = sha256_digest(manifest)
        if reply.header("Docker-Content-Digest") not in ("", digest):
            raise StepError(f"registry stored manifest as {reply.header('Docker-Content-Digest')}, expected {digest}")
        return digest
