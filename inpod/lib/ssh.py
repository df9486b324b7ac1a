"""The one ssh command builder of the SSH fabric (sshd.sh runs the server on every pod).

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import os
import shlex


def base() -> list[str]:
    """The ssh client: $ML_DEV_SSH (tests, an `ssh -F <client.conf>`), else batch-mode ssh."""
    return shlex.split(os.environ.get("ML_DEV_SSH", "ssh -o BatchMode=yes"))


def command(host: str, args: list[str], client: list[str] | None = None) -> list[str]:
    """Command line running `args` on `host` (one shell-quoted word: sshd hands it to the login shell)."""
    return [*(client if client is not None else base()), host, shlex.join(args)]
