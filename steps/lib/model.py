"""Model files: selection, source checksums, modelcar layer layout and the digest cache on the workspace."""

from __future__ import annotations

import errno
import fnmatch
import json
import mmap
import os
import stat
import tarfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runtime import EXIT_INTEGRITY, EXIT_NOT_FOUND, READ_SIZE, StepError, human, log, writing

# --- model files and their modelcar layers ---------------------------------------------------

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
LAYER_FORMAT = "gnu-tar/v1"  # bump when the bytes of a layer change, so cached digests are not reused
MODEL_ROOT = "models"
FILE_MODE = 0o644
DIR_MODE = 0o775
_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_WINDOW = 64 << 20  # bytes of a model file mapped at a time


def path_rule(rel: str) -> str:
    """The one path rule of every source (model directory, S3 keys, Hugging Face tree): "unsafe" for a path
    that is absolute or has an empty (`//`), `.` or `..` component (refused by name when selected),
    "hidden" for one with a component starting with `.` (`.cache/x.json`, `.git/…`: skipped), else "ok"."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "unsafe"
    return "hidden" if any(part.startswith(".") for part in parts) else "ok"


def model_files(model_dir: Path, include: Sequence[str] = ()) -> list[tuple[str, Path]]:
    """Files under `model_dir` as sorted `(relative posix path, path)`; hidden entries skipped.

    An entry that is neither a regular file, a directory nor a symbolic link (a FIFO, socket or device)
    is refused by name when it matches `include` (default: DEFAULT_INCLUDE; reading a FIFO named like a
    shard would block or package whatever a writer sends), and skipped with a log line otherwise.

    Symbolic links: one whose target lies outside the model directory is refused (it could carry a
    mounted secret, e.g. a service-account token, into a public image); a dangling one is reported;
    one to a file or directory inside is listed once, as the link itself (`LayerLayout.for_link`
    packages it as a symlink entry, so the target's bytes are stored once).
    """
    if not model_dir.is_dir():
        raise StepError(f"model directory {model_dir} does not exist", EXIT_NOT_FOUND)
    root_real = Path(os.path.realpath(model_dir))
    found: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        links = [d for d in dirs if (Path(root) / d).is_symlink()]
        dirs[:] = [d for d in dirs if d not in links]
        for name in [*files, *links]:
            path = Path(root) / name
            rel = path.relative_to(model_dir).as_posix()
            if path_rule(rel) != "ok":
                continue
            if path.is_symlink():
                target = os.readlink(path)
                real = Path(os.path.realpath(path))
                if real != root_real and root_real not in real.parents:
                    raise StepError(
                        f"{rel} is a symbolic link to {target}, outside the model directory; refusing to package it "
                        "(copy the file in if it belongs to the model)"
                    )
                if not real.exists():
                    raise StepError(f"{rel} is a dangling symbolic link (to {target})", EXIT_NOT_FOUND)
                found.append((rel, path))
            elif stat.S_ISREG(path.lstat().st_mode):
                found.append((rel, path))
            elif matches(rel, include or DEFAULT_INCLUDE):
                raise StepError(f"{rel} is not a regular file (a FIFO, socket or device); refusing to package it")
            else:
                log(f"skipping {rel}: not a regular file")
    return sorted(found)


# What a model needs by default: weights (safetensors, else PyTorch .bin), configs, tokenizer files and
# the Python modules of models that need trust_remote_code (config.json `auto_map`). The stack's
# `models[].include` default is this same list (stacks/config.py imports it).
DEFAULT_INCLUDE = ("*.safetensors", "*.bin", "*.json", "*.txt", "*.model", "*.py", "tokenizer*", "config*", "generation*")


def matches(relpath: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(relpath, p) or fnmatch.fnmatchcase(Path(relpath).name, p) for p in patterns)


# --- model file selection and source checksums (download, and package streaming from S3) ------

CONSOLIDATED = ("consolidated*.safetensors", "consolidated*.pth")
SHARDED = ("*-of-*.safetensors", "*.safetensors.index.json", "*-of-*.bin", "*.bin.index.json")
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
PYTORCH_WEIGHTS = ("pytorch_model*.bin", "pytorch_model*.bin.index.json")  # duplicates of safetensors weights


@dataclass(frozen=True)
class Expected:
    """What a downloaded file must match: its size and a checksum.

    kind: sha256 (hex, HF LFS), sha256-base64 (S3 ChecksumSHA256), md5 (single-part ETag),
    md5-multipart (ETag `<md5 of part md5s>-<parts>`), crc32 / crc32-multipart (S3 ChecksumCRC32, base64,
    full-object / `<crc32 of part crc32s>-<parts>`), git-sha1 (HF blob id), None (size only).
    """

    size: int
    kind: str | None = None
    value: str = ""
    part_size: int = 0

    def describe(self) -> str:
        return f"{self.kind} {self.value}" if self.kind else "size only"


def select(relpaths: Sequence[str], include: Sequence[str], exclude: Sequence[str]) -> list[str]:
    chosen = [r for r in relpaths if matches(r, include) and not matches(r, exclude)]
    weights = [r for r in relpaths if matches(r, WEIGHTS)]
    if weights and not any(matches(r, WEIGHTS) for r in chosen):
        raise StepError(
            f"the include patterns {list(include)} select none of the weight files ({', '.join(sorted(weights)[:4])}"
            f"{', …' if len(weights) > 4 else ''}); the model would be incomplete"
        )
    if any(matches(r, SHARDED) for r in chosen):
        dropped = [r for r in chosen if matches(r, CONSOLIDATED)]
        if dropped:
            log(f"sharded weights present; skipping {', '.join(dropped)}")
        chosen = [r for r in chosen if r not in dropped]
    if any(r.endswith(".safetensors") for r in chosen):
        dropped = [r for r in chosen if matches(r, PYTORCH_WEIGHTS)]
        if dropped:
            log(f"safetensors weights present; skipping the PyTorch copies {', '.join(dropped)}")
        chosen = [r for r in chosen if r not in dropped]
    for rel in chosen:
        if path_rule(rel) == "unsafe":
            raise StepError(f"refusing unsafe path {rel!r} in the source (absolute, empty, '.' or '..' component)")
    return sorted(chosen)


def s3_expected(client: Any, bucket: str, key: str, head: dict[str, Any], crc: bool = False) -> Expected:
    """The check for an S3 object; `crc`: its CRC32 first (the cheapest), full-object or COMPOSITE."""
    size, etag = int(head["ContentLength"]), str(head.get("ETag", "")).strip('"')
    sha, multipart, count = head.get("ChecksumSHA256"), "-" in etag, etag.partition("-")[2]
    # A multipart object's checksum is a checksum of part checksums unless S3 says FULL_OBJECT
    # (some S3-compatible stores omit the `-<parts>` suffix that marks it as composite).
    whole = head.get("ChecksumType", "COMPOSITE" if multipart else "FULL_OBJECT") == "FULL_OBJECT"
    part = int(client.head_object(Bucket=bucket, Key=key, PartNumber=1)["ContentLength"]) if count.isdigit() else 0
    part = part if part and -(-size // part) == int(count) else 0
    value = str(head.get("ChecksumCRC32") or "").partition("-")[0]
    if crc and value and (whole or part):
        return Expected(size, "crc32", value) if whole else Expected(size, "crc32-multipart", f"{value}-{count}", part)
    if sha and "-" not in sha and whole:
        return Expected(size, "sha256-base64", sha)
    if head.get("ServerSideEncryption") == "aws:kms" or head.get("SSECustomerAlgorithm"):
        log(f"WARNING: {key}: encrypted object, ETag is not an MD5; checking size only")
        return Expected(size)
    if len(etag) == 32 and not multipart:
        return Expected(size, "md5", etag)
    if part:
        return Expected(size, "md5-multipart", etag, part)
    log(f"WARNING: {key}: ETag {etag!r} cannot be verified; checking size only")
    return Expected(size)


def _tar_header(name: str, size: int, is_dir: bool) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = DIR_MODE if is_dir else FILE_MODE
    info.size = 0 if is_dir else size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


@dataclass(frozen=True)
class LayerLayout:
    """Byte layout of the single-file modelcar layer for one model file.

    The layer is an uncompressed GNU tar: directory entries for `models/` and every parent of
    the file, the file's header, its bytes, padding, and the end-of-archive blocks padded to a
    full record exactly as Python's `tarfile` writes them. mtime 0, uid/gid 0 and fixed modes
    make it a pure function of (relative path, content).
    """

    relpath: str
    file_size: int
    head: bytes
    tail: bytes

    @classmethod
    def for_file(cls, relpath: str, file_size: int) -> LayerLayout:
        parts = relpath.split("/")
        dirs = ["/".join([MODEL_ROOT, *parts[:i]]) for i in range(len(parts))]
        head = b"".join(_tar_header(d, 0, True) for d in dirs)
        head += _tar_header(f"{MODEL_ROOT}/{relpath}", file_size, False)
        end = len(head) + file_size
        pad = -end % _BLOCK
        end += pad + 2 * _BLOCK
        return cls(relpath, file_size, head, bytes(pad + 2 * _BLOCK + (-end % _RECORD)))

    @classmethod
    def for_link(cls, relpath: str, target: str) -> LayerLayout:
        """Layer holding a symbolic link `models/<relpath>` → `target` (relative, inside the model)."""
        parts = relpath.split("/")
        dirs = ["/".join([MODEL_ROOT, *parts[:i]]) for i in range(len(parts))]
        info = tarfile.TarInfo(f"{MODEL_ROOT}/{relpath}")
        info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        head = b"".join(_tar_header(d, 0, True) for d in dirs) + info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
        end = len(head) + 2 * _BLOCK
        return cls(relpath, 0, head, bytes(2 * _BLOCK + (-end % _RECORD)))

    @classmethod
    def for_path(cls, relpath: str, path: Path) -> LayerLayout:
        """The layer for a model file from `model_files`: a symlink entry for a link, else the file."""
        if path.is_symlink():  # relative, so it resolves inside the image too
            return cls.for_link(relpath, os.path.relpath(os.path.realpath(path), os.path.realpath(path.parent)))
        return cls.for_file(relpath, path.stat().st_size)

    @property
    def size(self) -> int:
        return len(self.head) + self.file_size + len(self.tail)

    def open(self, path: Path, listed: os.stat_result | None = None) -> Any:
        """Open the model file without following a symbolic link (O_NOFOLLOW) and check it is the regular
        file that was listed (device, inode, size): a shard swapped for a link or another file during a
        long upload is refused, never packaged."""
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StepError(f"{path} became a symbolic link after it was listed; refusing to follow it", EXIT_INTEGRITY) from exc
            if exc.errno == errno.ENOENT:
                raise StepError(f"{path} no longer exists (removed after it was listed)", EXIT_NOT_FOUND) from exc
            raise
        st = os.fstat(fd)
        same = listed is None or (st.st_dev, st.st_ino) == (listed.st_dev, listed.st_ino)
        if not stat.S_ISREG(st.st_mode) or not same or st.st_size != self.file_size:
            os.close(fd)
            raise StepError(f"{path} was replaced or changed size after it was listed; refusing to package it", EXIT_INTEGRITY)
        return os.fdopen(fd, "rb", buffering=0)

    def read(self, path: Path, offset: int = 0, buf_size: int = READ_SIZE, listed: os.stat_result | None = None) -> Iterator[memoryview]:
        """Yield the layer bytes from `offset` on; the file's from mmap windows (no read() copy). The file is
        opened (and checked) before the first piece is yielded, so a refused file fails before a request is sent."""
        head_len = len(self.head)
        file_end = head_len + self.file_size
        fh = self.open(path, listed) if offset < file_end else None
        if offset < head_len:
            yield memoryview(self.head)[offset:]
            offset = head_len
        if offset < file_end and fh is not None:
            with fh:
                while offset < file_end:
                    if os.fstat(fh.fileno()).st_size < self.file_size:  # (a mapped page past the end would be SIGBUS)
                        raise StepError(f"{path} shrank while being read", EXIT_INTEGRITY)
                    start = (offset - head_len) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
                    size = min(_WINDOW, self.file_size - start)
                    win = FileWindow(
                        fh.fileno(), size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ, offset=start
                    )
                    win.file, view = fh, memoryview(win)
                    for pos in range(offset - head_len - start, size, buf_size):
                        win.pos = start + pos
                        yield view[pos : pos + buf_size]
                    offset = head_len + start + size
        yield memoryview(self.tail)[offset - file_end :]


def check_listed(path: Path, listed: os.stat_result) -> None:
    """Refuse a model file that is no longer the entry that was listed: gone (exit 5), or swapped for a symbolic link or
    another file (exit 3). Checked before a file's first byte is read and again before its blob is committed, so a swap
    at any point ends the run at once, naming the file (reads themselves open with O_NOFOLLOW: `LayerLayout.open`)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        raise StepError(f"{path} no longer exists (removed after it was listed)", EXIT_NOT_FOUND) from None
    if stat.S_ISLNK(now.st_mode) and not stat.S_ISLNK(listed.st_mode):
        raise StepError(f"{path} became a symbolic link after it was listed; refusing to follow it", EXIT_INTEGRITY)
    if (now.st_dev, now.st_ino, stat.S_IFMT(now.st_mode)) != (listed.st_dev, listed.st_ino, stat.S_IFMT(listed.st_mode)):
        raise StepError(f"{path} was replaced after it was listed; refusing to package it", EXIT_INTEGRITY)


class FileWindow(mmap.mmap):
    """Part of a file, mapped; `pos`: the file offset of the slice handed out now."""

    file: Any
    pos: int


def check_layer_sizes(sizes: dict[str, int], limit: int | None) -> None:
    """Refuse, before anything is transferred, a model file whose modelcar layer exceeds the registry's
    maximum layer size. Quay checks its MAXIMUM_LAYER_SIZE (default 20G) against the whole blob, also
    when it arrives in chunks (quay/quay data/registry_model/blobuploader.py: `upload_chunk` compares
    start offset + length with it), so chunking does not get past it."""
    if not limit:
        return
    for rel, size in sorted(sizes.items()):
        layer = LayerLayout.for_file(rel, size).size
        if layer > limit:
            raise StepError(
                f"{rel}: {human(size)} ({size} bytes) makes a {layer}-byte layer, above the registry's maximum layer size "
                f"{limit} bytes (--max-layer-size, modelPipeline.maxLayerSize); split the file into shards or raise the "
                "registry's limit (Quay: MAXIMUM_LAYER_SIZE) and maxLayerSize together"
            )


# --- digest cache on the workspace -----------------------------------------------------------


def default_digest_cache(model_dir: Path) -> Path:
    """Where download and package keep the digest cache unless told otherwise: next to the model dir."""
    return model_dir.parent / f".{model_dir.name}.digests.json"


class DigestCache:
    """Small JSON file on the PVC mapping model files to their layer digests.

    Entries are keyed by relative path and valid only while (size, mtime_ns, ctime_ns, inode) match, so a second
    package run can HEAD-check blobs without reading the weights again. Written atomically after
    every change, so a crash never leaves a truncated cache.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.entries: dict[str, dict[str, Any]] = {}
        if path and path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                self.entries = data.get("files", {}) if data.get("format") == LAYER_FORMAT else {}
            except (OSError, ValueError):
                log(f"WARNING: ignoring unreadable digest cache {path}")

    @staticmethod
    def _stamp(path: Path) -> dict[str, int]:
        # ctime and inode too: a file rewritten with the same size and mtime (`touch -r`, a restore)
        # still gets a new ctime (which nothing can set back) or a new inode, so stale digests are not reused.
        st = path.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}

    def get(self, relpath: str, path: Path) -> dict[str, Any] | None:
        entry = self.entries.get(relpath)
        try:
            if entry and all(entry.get(k) == v for k, v in self._stamp(path).items()):
                return entry
        except FileNotFoundError:  # gone: the caller's own check names it
            pass
        return None

    def put(self, relpath: str, path: Path, **values: Any) -> None:
        """Record `values` for the file, keeping earlier values while the file is unchanged."""
        with self._lock:
            try:
                stamp = self._stamp(path)
            except FileNotFoundError:  # gone since: nothing to remember about it
                return
            self.entries[relpath] = {**(self.get(relpath, path) or {}), **stamp, **values}
            if self.path:
                tmp = self.path.with_name(f".{self.path.name}.tmp")
                with writing(self.path, "digest cache"):
                    tmp.write_text(json.dumps({"format": LAYER_FORMAT, "files": self.entries}, indent=1, sort_keys=True))
                    os.replace(tmp, self.path)
