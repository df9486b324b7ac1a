"""The dev servers: one row per server, every fact about it in that row.

Config (`access.<name>` toggles, the token-mode rules), the pod (ports, credential env, OAuth proxy
sidecars), the cluster objects (pod-0 Service ports, Routes, OAuth redirect annotations), the stack
secrets and the route-host length check all read this table; adding a server is one row here plus its
start command in `inpod/sh/startup.sh` (a `case` branch per server; tests/core/test_servers.py checks
that every row has one that listens on the row's port). CONTRIBUTING.md walks through it.

`routed` leaves room for processes that are not reached through a Route (an sshd, a fabric gate, the idle
agent): such rows get no Service port, Route or proxy. None exists yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class DevServer:
    name: str
    """Config key under `access`, container/Service port name, Route suffix (`<app>-<name>`)."""
    title: str
    """What users call it (in descriptions and messages)."""
    port: int
    """Where it listens in the main container (127.0.0.1 behind the OAuth proxy, the pod IP in token mode)."""
    proxy_port: int
    """Where its OAuth proxy sidecar listens (auth `oauth-proxy`)."""
    credential_env: str | None = None
    """Env var it reads its password/token from in token mode; None: it has no authentication of its own."""
    secret_key: str | None = None
    """`ml-dev-env:<key>` stack secret that holds the credential (token mode)."""
    credential: str = ""
    """What the secret is ("password", "token")."""
    routed: bool = True
    """Reached through the pod-0 Service and an https Route (with an OAuth proxy in front)."""
    on_under_token_auth: bool = True
    """False: off under `access.auth: token` unless its key is set explicitly (then the config is refused,
    as for any server without its own authentication); for a server every stack gets by default."""
    program: str = ""
    """The executable its start command runs, which the pods' image must carry; "" for a program of ours that
    ships into the pods (listed for a stack that runs an image it did not build: tools/prerequisites.py)."""

    @property
    def has_own_auth(self) -> bool:
        return self.credential_env is not None

    def router_port(self, auth: str) -> int:
        """The pod port the router dials: the OAuth proxy's (auth `oauth-proxy`), or the server's own (auth `token`)."""
        return self.proxy_port if auth == "oauth-proxy" else self.port

    @property
    def secret_help(self) -> str:
        return f"{self.title} {self.credential} (access.auth: token)"


HOME_PAGE = "home"
"""The home page's row: it links to the other routed servers (`page_links`)."""

DEV_SERVERS: tuple[DevServer, ...] = (
    # code-server: src/node/routes/health.ts answers /healthz with {"status": "alive"|"expired", "lastHeartbeat": …}.
    DevServer(
        "vscode",
        "VS Code",
        8080,
        18080,
        credential_env="PASSWORD",
        secret_key="vscodePassword",
        credential="password",
        program="code-server",
    ),
    # jupyter_server: services/api/handlers.py, APIStatusHandler answers /api/status with "last_activity".
    DevServer(
        "jupyter",
        "Jupyter",
        8888,
        18888,
        credential_env="JUPYTER_TOKEN",
        secret_key="jupyterToken",
        credential="token",
        program="jupyter",
    ),
    DevServer("tensorboard", "TensorBoard", 6006, 16006, program="tensorboard"),
    # inpod/home/page.py: the environment's home page (idle state, pods and GPUs, runs, fabric curve). Its own
    # Route + OAuth proxy rather than a path on another server's proxy: it works whichever IDEs are enabled,
    # and code-server/Jupyter own their whole URL space (a path prefix would have to be stripped for them).
    DevServer(HOME_PAGE, "home page", 8090, 18090, on_under_token_auth=False),
)


def routed_servers() -> tuple[DevServer, ...]:
    return tuple(s for s in DEV_SERVERS if s.routed)


def page_links(servers: Iterable[DevServer]) -> list[tuple[str, str]]:
    """(name, title) of the servers the home page links to: the routed ones of `servers` (the stack's enabled ones)
    but the page itself, in table order. The page reads them from the startup ConfigMap (inpod/contract.py
    HOME_LINKS_FILE): this table stays the one place a title is written."""
    return [(s.name, s.title) for s in servers if s.routed and s.name != HOME_PAGE]


def longest_routed_name() -> str:
    """The server name that makes the longest route host `<app>-<server>-<namespace>`."""
    return max((s.name for s in routed_servers()), key=len)


def router_ports(servers: Iterable[DevServer], auth: str) -> tuple[int, ...]:
    """The only pod ports the stack's NetworkPolicy opens to the router's namespace (components/devloop.py)."""
    return tuple(sorted({s.router_port(auth) for s in servers if s.routed}))
