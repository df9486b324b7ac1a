"""The registry token goes to the registry, never to where a GET redirect points (signed storage URLs).

Two real HTTP servers on 127.0.0.1 (ports from the OS): a "registry" that answers a blob GET with a 307 to a
"storage" server, as registries backed by object storage do. The deployed package step's registry client
must send Authorization to the first and strip it before following the redirect.
"""

from __future__ import annotations

import http.server
import ssl
import threading
import types
from collections.abc import Callable, Iterator

import pytest

Deployed = Callable[[str], types.ModuleType]
BLOB = b"weights" * 1000


class _SeenServer(http.server.ThreadingHTTPServer):
    """An HTTP server that keeps the Authorization header of every request it answered."""

    seen: list[str | None]

    def __init__(self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.seen = []


class _Server:
    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.httpd = _SeenServer(("127.0.0.1", 0), handler)
        self.seen = self.httpd.seen
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def saw(self, authorization: str | None) -> None:
        """Records the request's Authorization header on the server."""
        assert isinstance(self.server, _SeenServer), f"served by a _SeenServer, not {self.server!r}"
        self.server.seen.append(authorization)


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    class Storage(_Quiet):
        def do_GET(self) -> None:
            self.saw(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", str(len(BLOB)))
            self.end_headers()
            self.wfile.write(BLOB)

    storage = _Server(Storage)

    class Registry(_Quiet):
        def do_GET(self) -> None:
            self.saw(self.headers.get("Authorization"))
            self.send_response(307)
            self.send_header("Location", f"{storage.url}/bucket/blob?X-Amz-Signature=signed")
            self.send_header("Content-Length", "0")
            self.end_headers()

    registry = _Server(Registry)
    yield registry, storage
    registry.close()
    storage.close()


def test_the_token_is_not_sent_to_a_get_redirect_target(deployed: Deployed, servers: tuple[_Server, _Server]) -> None:
    registry, storage = servers
    package = deployed("package")
    client = package.RegistryClient(
        registry.url.removeprefix("http://"),
        None,
        ["repository:m:pull"],
        plain_http=True,
        tls_context=ssl.create_default_context(),
        timeout=10,
    )
    client._auth = "Bearer registry-token"  # as after a token exchange
    body = b"".join(bytes(chunk) for chunk in client.open_stream("/v2/m/blobs/sha256:abc", 0))
    assert body == BLOB
    assert registry.seen == ["Bearer registry-token"]
    assert storage.seen == [None], "the registry token followed the redirect to the storage URL"
