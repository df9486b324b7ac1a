"""ConfigMap and Secret volumes in the kubelet's atomic-writer layout (see the package docstring)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

DATA = "..data"


def payload(source: Mapping[str, object], data: Mapping[str, str | bytes]) -> dict[str, tuple[str | bytes, int | None]]:
    """path in the volume -> (content, mode or None for the volume's defaultMode), as the kubelet makes the payload of a
    configMap or secret volume (kubernetes pkg/volume/configmap/configmap.go MakePayload): without `items` every key at
    its own name; with `items` only the listed keys, each at its `path` with its `mode`; a listed key the object lacks is
    an error unless the volume is `optional` (k8s.io/api core/v1/types.go ConfigMapVolumeSource.Items, KeyToPath)."""
    items = source.get("items")
    if not items:
        return {key: (data[key], None) for key in data}
    assert isinstance(items, list)
    out: dict[str, tuple[str | bytes, int | None]] = {}
    for item in items:
        key, path = item["key"], item["path"]
        assert not path.startswith("/") and ".." not in path.split("/"), f"KeyToPath.Path {path!r}: relative, no '..' (validation.go)"
        if key not in data:
            if source.get("optional"):
                continue
            raise KeyError(f"configmap references non-existent config key: {key}")  # MakePayload's error; the pod never starts
        out[path] = (data[key], int(item["mode"]) if item.get("mode") is not None else None)
    return out


class AtomicVolume:
    """`AtomicVolume(target, mode, gid).write({key: text})`; a later write swaps `..data` while readers run."""

    def __init__(self, target: Path, mode: int = 0o644, gid: int | None = None) -> None:
        self.target, self.mode, self.gid = target, mode, gid
        target.mkdir(parents=True, exist_ok=True)

    def write(self, files: Mapping[str, str | bytes], modes: Mapping[str, int | None] | None = None) -> Path:
        """Write a payload {path: content} (paths may be nested: KeyToPath.Path) as the kubelet's AtomicWriter.Write does:
        writePayloadToDir makes each file's directories (os.MkdirAll, 0755 under the kubelet's umask) and sets each
        file's mode (its item's, else the volume's); createUserVisibleFiles links only the first path component
        (`inpod -> ..data/inpod`); removeUserVisiblePaths drops the links of components no longer in the payload
        (kubernetes pkg/volume/util/atomic_writer.go)."""
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
        new = Path(tempfile.mkdtemp(prefix=stamp, dir=self.target))  # a name that differs on every pod
        new.chmod(0o755)
        made: list[Path] = []
        for key, content in files.items():
            path = new / key
            for parent in reversed(path.relative_to(new).parents[:-1]):
                if not (new / parent).is_dir():
                    (new / parent).mkdir(mode=0o755)
                    made.append(new / parent)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
            mode = (modes or {}).get(key)
            mode = self.mode if mode is None else mode
            if self.gid is not None:
                # SetVolumeOwnership (pkg/volume/volume_linux.go changeFilePermission): group fsGroup, and the volume
                # being read-only (configMap/secret GetAttributes().ReadOnly) its roMask 0440 ORed into the mode
                os.chown(path, -1, self.gid)
                mode |= 0o440
            path.chmod(mode)
        for d in made:
            d.chmod(0o555)  # read-only like the rest of the mount: nothing (e.g. __pycache__) is added
        new.chmod(0o555)  # the kubelet mounts ConfigMap/Secret volumes read-only: nothing (e.g. __pycache__) is added
        old = os.readlink(self.target / DATA) if (self.target / DATA).is_symlink() else None
        tmp = self.target / "..data_tmp"
        os.symlink(new.name, tmp)
        os.rename(tmp, self.target / DATA)  # atomic: a reader sees the old or the new directory, never neither
        visible = {key.split("/", 1)[0] for key in files}
        for name in visible:
            link = self.target / name
            if not link.is_symlink():
                os.symlink(f"{DATA}/{name}", link)
        if old:
            for name in os.listdir(self.target / old):
                if name not in visible:
                    (self.target / name).unlink(missing_ok=True)
            for d in [self.target / old, *(p for p in (self.target / old).rglob("*") if p.is_dir() and not p.is_symlink())]:
                d.chmod(0o755)
            shutil.rmtree(self.target / old)  # as root a program run from it may have left a __pycache__ in it
        return new

    def write_volume(self, source: Mapping[str, object], data: Mapping[str, str | bytes]) -> Path:
        """The payload of a configMap/secret volume source (its `items`, modes) written atomically."""
        found = payload(source, data)
        return self.write({p: c for p, (c, _) in found.items()}, {p: m for p, (_, m) in found.items()})
