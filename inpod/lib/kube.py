"""The one in-cluster Kubernetes API client of the programs: the pod's service-account token (re-read on every call:
the kubelet rotates it) and CA (contract.SA_DIR), or $ML_DEV_KUBE_API for tests.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .. import contract

WRITES = ("POST", "PUT", "PATCH", "DELETE")


class Client:
    """`Client(field_manager).call(method, path, body)`: JSON in, JSON out. The caller names its field manager: it is
    the User-Agent of every request and the `fieldManager` of every write (server-side field ownership)."""

    def __init__(self, field_manager: str, base: str | None = None, sa_dir: Path | None = None) -> None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        self.base = (base or os.environ.get("ML_DEV_KUBE_API") or f"https://{host}:{port}").rstrip("/")
        sa = sa_dir or Path(os.environ.get(contract.SA_DIR_ENV) or contract.SA_DIR)
        self.field_manager = field_manager
        self.token = sa / "token"
        self.namespace_file = sa / "namespace"
        self.context = ssl.create_default_context(cafile=str(sa / "ca.crt")) if self.base.startswith("https:") else None

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json", timeout: float = 30) -> Any:
        if method in WRITES:
            path += ("&" if "?" in path else "?") + urllib.parse.urlencode({"fieldManager": self.field_manager})
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token.read_text().strip()}")
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", self.field_manager)
        if data is not None:
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, timeout=timeout, context=self.context) as reply:
            return json.loads(reply.read())
