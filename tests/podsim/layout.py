"""ConfigMap and Secret volumes in the kubelet's atomic-writer layout (see the package docstring)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

DATA = "..data"


class AtomicVolume:
    """`AtomicVolume(target, mode, gid).write({key: text})`; a later write swaps `..data` while readers run."""

    def __init__(self, target: Path, mode: int = 0o644, gid: int | None = None) -> None:
        self.target, self.mode, self.gid = target, mode, gid
        target.mkdir(parents=True, exist_ok=True)

    def write(self, files: Mapping[str, str | bytes]) -> Path:
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
        new = Path(tempfile.mkdtemp(prefix=stamp, dir=self.target))  # a name that differs on every pod
        new.chmod(0o755)
        for key, content in files.items():
            path = new / key
            path.write_bytes(content.encode() if isinstance(content, str) else content)
            path.chmod(self.mode)
            if self.gid is not None:
                os.chown(path, -1, self.gid)
        new.chmod(0o555)  # the kubelet mounts ConfigMap/Secret volumes read-only: nothing (e.g. __pycache__) is added
        old = os.readlink(self.target / DATA) if (self.target / DATA).is_symlink() else None
        tmp = self.target / "..data_tmp"
        os.symlink(new.name, tmp)
        os.rename(tmp, self.target / DATA)  # atomic: a reader sees the old or the new directory, never neither
        for key in files:
            link = self.target / key
            if not link.is_symlink():
                os.symlink(f"{DATA}/{key}", link)
        if old:
            for key in os.listdir(self.target / old):
                if key not in files:
                    (self.target / key).unlink(missing_ok=True)
            (self.target / old).chmod(0o755)
            shutil.rmtree(self.target / old)  # as root a program run from it may have left a __pycache__ in it
        return new
