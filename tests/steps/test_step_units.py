"""Pure helpers of the deployed step scripts: tar layout, references, authfiles, sizes."""

from __future__ import annotations

import base64
import io
import json
import sys
import tarfile
import threading
import types
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

Deployed = Callable[[str], types.ModuleType]
INTERNAL = "image-registry.openshift-image-registry.svc:5000"


@pytest.fixture(scope="module")
def package(deployed: Deployed) -> types.ModuleType:
    return deployed("package")


def tarfile_layer(rel: str, data: bytes) -> bytes:
    """The same layer written by Python's tarfile (GNU format): the reference for LayerLayout."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        parts = rel.split("/")
        for i in range(len(parts)):
            info = tarfile.TarInfo("/".join(["models", *parts[:i]]))
            info.type, info.mode, info.mtime, info.uname, info.gname = tarfile.DIRTYPE, 0o775, 0, "", ""
            tar.addfile(info)
        info = tarfile.TarInfo(f"models/{rel}")
        info.size, info.mode, info.mtime, info.uname, info.gname = len(data), 0o644, 0, "", ""
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize(
    "rel",
    ["config.json", "sub/dir/tokenizer.model", "a" * 150 + ".safetensors", "ünïcode/wéights.bin"],
    ids=["flat", "nested", "long-name", "unicode"],
)
@pytest.mark.parametrize("size", [0, 1, 511, 512, 10_000])
def test_layer_bytes_match_gnu_tarfile(package: types.ModuleType, tmp_path: Path, rel: str, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path = tmp_path / "f"
    path.write_bytes(data)
    layout = package.LayerLayout.for_file(rel, size)
    for offset in (0, 100, len(layout.head) + size // 2, layout.size - 1):
        produced = b"".join(bytes(c) for c in layout.read(path, offset, buf_size=4096))
        assert produced == tarfile_layer(rel, data)[offset:]
    assert layout.size == len(tarfile_layer(rel, data))


def test_file_windows_cover_the_file_and_name_each_slice_offset(
    package: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file part comes from mmap windows; every slice's window says its file offset (what sendfile() sends)."""
    # the window size lives in the module that defines LayerLayout (steps/lib/model.py, beside package.py in the image)
    monkeypatch.setattr(sys.modules[package.LayerLayout.__module__], "_WINDOW", 3 * 4096)  # several windows, unaligned reads
    data = bytes(range(256)) * 200 + b"end"
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    layout = package.LayerLayout.for_file("weights.bin", len(data))
    head = len(layout.head)
    for offset in (0, head, head + 5000, head + 3 * 4096, head + len(data) - 1):
        got = b""
        for piece in layout.read(path, offset, buf_size=5000):
            window = piece.obj
            if isinstance(window, sys.modules[package.LayerLayout.__module__].FileWindow):
                assert bytes(piece) == data[window.pos : window.pos + len(piece)]
            got += bytes(piece)
        assert got == tarfile_layer("weights.bin", data)[offset:]
    path.write_bytes(data[:100])  # shrank: refused before a page past the end is touched
    with pytest.raises(package.StepError, match=r"shrank|changed size"):
        b"".join(bytes(c) for c in layout.read(path, head))


def test_one_source_get_serves_successive_chunks(package: types.ModuleType, deployed: Deployed) -> None:
    """`Continued`, the streaming reader under every chunked upload, fed by a fake source: reads that follow each
    other share one GET, a read elsewhere (a resume) opens a new one, a GET that breaks after giving bytes is
    replaced from the byte it stopped at within the same read, and one that breaks before its first byte raises
    (the upload's retry budget decides, no loop)."""
    data = bytes(range(256)) * 40  # 10,240 bytes
    opened: list[int] = []
    breaks: dict[int, int] = {}  # GET number -> byte offset where that GET ends early

    def open_from(start: int) -> object:
        opened.append(start)
        end = breaks.get(len(opened), len(data))
        for pos in range(start, end, 4096):
            yield memoryview(data)[pos : min(pos + 4096, end)]

    def read(reader: object, start: int, stop: int) -> bytes:
        return b"".join(bytes(piece) for piece in deployed("lib.pusher").limit_bytes(reader(start, stop), stop - start))  # type: ignore[operator]

    cursor = deployed("lib.source").Continued(open_from, len(data), "f")
    assert read(cursor, 0, 3000) + read(cursor, 3000, 7000) + read(cursor, 7000, len(data)) == data
    assert opened == [0] and cursor.pieces is None, "one GET for three chunks, closed at the object's end"

    opened.clear()
    cursor = deployed("lib.source").Continued(open_from, len(data), "f")
    assert read(cursor, 0, 3000) == data[:3000]
    assert read(cursor, 1000, 5000) == data[1000:5000], "a resume at an earlier offset"
    assert opened == [0, 1000]

    opened.clear()
    breaks[1] = 5000  # the first GET ends in the middle of the second read
    cursor = deployed("lib.source").Continued(open_from, len(data), "f")
    assert read(cursor, 0, 3000) + read(cursor, 3000, len(data)) == data
    assert opened == [0, 5000], "the broken GET was replaced from byte 5000 inside the same read"

    opened.clear()
    breaks.clear()
    breaks[2] = 5000  # the replacement GET gives nothing
    breaks[1] = 5000
    cursor = deployed("lib.source").Continued(open_from, len(data), "f")
    with pytest.raises(package.TransientError, match="the source ended at byte 5000"):
        read(cursor, 0, len(data))
    assert opened == [0, 5000] and cursor.pieces is None


def test_header_for_files_over_8_gib_is_gnu(package: types.ModuleType) -> None:
    size = 9 * 1024**3 + 3
    header = package.LayerLayout.for_file("model-00001-of-00002.safetensors", size).head[-512:]
    assert header[257:265] == b"ustar  \0"
    assert header[124] & 0x80, "size in GNU base-256, not a zero ustar field"
    assert tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape").size == size


def test_source_crc32_runs_apart_from_the_hashing_thread(deployed: Deployed, monkeypatch: pytest.MonkeyPatch) -> None:
    """ISA-L's CRC leaves the vector registers' upper state dirty, which slows SHA-256 in that thread: it runs in a
    thread of its own; the composite (per-part) CRC32 still equals zlib's over the same parts."""
    checksum = deployed("lib.checksum")  # where the CRC runs (steps/lib/checksum.py)
    if not checksum._ISAL:
        pytest.skip("isal is not installed (steps/requirements.txt has it): zlib's CRC runs inline")
    threads: list[str] = []
    real = checksum.crc32

    def spy(data: memoryview, value: int) -> int:
        threads.append(threading.current_thread().name)
        return real(data, value)

    monkeypatch.setattr(checksum, "crc32", spy)
    data = bytes(range(256)) * 40  # 10240 bytes in parts of 4096
    parts = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    combined = zlib.crc32(b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts))
    value = f"{base64.b64encode(combined.to_bytes(4, 'big')).decode()}-{len(parts)}"
    hasher = checksum.SourceHasher(512, checksum.Expected(len(data), "crc32-multipart", value, 4096))
    for start in range(0, 512 + len(data), 3000):  # pieces across the header and the part boundaries
        hasher.update(memoryview(bytes(512) + data)[start : start + 3000])
    hasher.verify("model.bin")
    assert threads and all(name.startswith("crc32") for name in threads), threads
    assert threading.current_thread().name not in threads


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("quay.io/org/model:v1", ("quay.io", "org/model", "v1", None)),
        ("localhost:5000/m@sha256:" + "a" * 64, ("localhost:5000", "m", None, "sha256:" + "a" * 64)),
        ("ubuntu:22.04", ("docker.io", "library/ubuntu", "22.04", None)),
        ("image-registry.openshift-image-registry.svc:5000/ns/is:t", (INTERNAL, "ns/is", "t", None)),
    ],
)
def test_image_ref_parse(package: types.ModuleType, text: str, expected: tuple[str, str, str | None, str | None]) -> None:
    ref = package.ImageRef.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == expected
    assert str(ref) == text or text.startswith("ubuntu")


@pytest.mark.parametrize("text", ["quay.io/Org/model:v1", "quay.io/org/model@sha256:abc", "quay.io/org/model:bad tag"])
def test_image_ref_rejects(package: types.ModuleType, text: str) -> None:
    with pytest.raises(package.StepError):
        package.ImageRef.parse(text)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_registry_credentials_lookup(package: types.ModuleType, tmp_path: Path) -> None:
    authfile = tmp_path / "config.json"
    authfile.write_text(json.dumps({"auths": {
        "https://quay.io": {"auth": b64("robot+org:tok")},
        "quay.io/special": {"auth": b64("special:pw:with:colons")},
        "https://index.docker.io/v1/": {"username": "hub", "password": "pw"},
        "registry.example:5000": {"identitytoken": "x"},
    }}))  # fmt: skip
    creds = package.registry_credentials
    assert creds(str(authfile), "quay.io", "org/model") == ("robot+org", "tok")
    assert creds(str(authfile), "quay.io", "special/model") == ("special", "pw:with:colons")
    assert creds(str(authfile), "docker.io", "library/ubuntu") == ("hub", "pw")
    assert creds(str(authfile), "other.io", "x") is None
    assert creds(None, "quay.io", "x") is None
    with pytest.raises(package.StepError, match="no 'auth'"):
        creds(str(authfile), "registry.example:5000", "x")


@pytest.mark.parametrize(("text", "value"), [("20GB", 20 * 10**9), ("2GiB", 2 * 1024**3), ("512MiB", 512 * 1024**2), ("1000", 1000)])
def test_parse_size(package: types.ModuleType, text: str, value: int) -> None:
    assert package.parse_size(text) == value


def test_digest_cache_entries_follow_the_file(package: types.ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    cache_file = tmp_path / "cache.json"
    cache = package.DigestCache(cache_file)
    cache.put("w.bin", path, layer_digest="sha256:1")
    cache.put("w.bin", path, source="s3:etag")
    st = path.stat()
    assert package.DigestCache(cache_file).get("w.bin", path) == {
        "layer_digest": "sha256:1", "source": "s3:etag", "size": 3, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
    }  # fmt: skip
    path.write_bytes(b"abcd")
    assert package.DigestCache(cache_file).get("w.bin", path) is None


def test_download_selection_drops_consolidated_only_when_sharded(deployed: Deployed) -> None:
    select = deployed("lib.model").select
    sharded = ["consolidated.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"]
    assert select(sharded, ["*"], []) == sorted(sharded[1:])
    assert select(["consolidated.safetensors", "params.json"], ["*"], []) == ["consolidated.safetensors", "params.json"]
    with pytest.raises(deployed("download").StepError, match="select none of the weight files"):
        select(sharded, ["*.json"], [])  # an include list without weights would package an incomplete model
    with pytest.raises(deployed("download").StepError, match="unsafe path"):
        select(["../etc/passwd"], ["*"], [])


def test_upload_range_forms(deployed: Deployed) -> None:
    parse = deployed("lib.pusher").parse_range
    assert parse("0-1048575") == (1048576, 1048575)  # distribution: last byte index
    assert parse("bytes=0-1048576") == (1048577, 1048576)  # Quay's status: the byte count
    assert parse("0-0") == (1, 0)  # a fresh session (or one byte)
    assert parse("5-10") is None and parse("") is None


# ------------------------------------------------------------------------------------------ mirror


@pytest.fixture(scope="module")
def mirror(deployed: Deployed) -> types.ModuleType:
    return deployed("mirror")


@pytest.mark.parametrize(
    ("message", "code", "transient"),
    [  # skopeo 1.9's last stderr lines (containers/image wording)
        (
            "initializing source docker://q/m@sha256:1: Requesting bearer token: invalid status code from registry 503",
            6,
            True,
        ),
        ("writing blob: initiating layer upload to /v2/m/blobs/uploads/ in q: received unexpected HTTP status: 502 Bad Gateway", 6, True),
        ("reading manifest sha256:1 in q/m: toomanyrequests: rate limit exceeded", 6, True),
        ('Get "https://q/v2/": net/http: request canceled (Client.Timeout exceeded while awaiting headers)', 6, True),
        (
            'writing blob: Patch "https://q/v2/m/blobs/uploads/1": read tcp 10.0.0.1:40000->10.0.0.2:443: read: connection reset by peer',
            6,
            True,
        ),
        (
            'pinging container registry 127.0.0.1:59500: Get "http://127.0.0.1:59500/v2/": dial tcp: connect: connection refused',
            6,
            False,
        ),
        ("initializing source docker://q/m@sha256:1: reading manifest sha256:1 in q/m: manifest unknown", 5, False),
        ("trying to reuse blob at destination: unauthorized: authentication required", 4, False),
        ("Requesting bearer token: invalid status code from registry 401 (Unauthorized)", 4, False),
    ],
    ids=["token-503", "upload-502", "429", "client-timeout", "reset", "refused-port-59500", "unknown", "auth", "token-401"],
)
def test_mirror_runs_skopeo_again_only_after_a_transient_failure(
    mirror: types.ModuleType, monkeypatch: pytest.MonkeyPatch, message: str, code: int, transient: bool
) -> None:
    runs: list[float] = []

    def fake_skopeo(seconds: float) -> bytes:
        runs.append(seconds)
        if len(runs) == 1:
            raise mirror.SkopeoFailed(f"skopeo copy failed: {message}", code, transient=bool(mirror.TRANSIENT.search(message.lower())))
        return b"ok"

    monkeypatch.setattr(mirror.time, "sleep", lambda _: None)
    proc = types.SimpleNamespace(returncode=1, stderr=f"time=x level=fatal msg={message}\n{message}\n".encode(), stdout=b"")
    monkeypatch.setattr(mirror.subprocess, "run", lambda *a, **k: proc)
    with pytest.raises(mirror.SkopeoFailed) as failed:  # the real classification of skopeo's last line
        mirror.skopeo(["copy"], "skopeo copy", {}, 10)
    assert (failed.value.code, failed.value.transient) == (code, transient)
    if transient:
        assert mirror.with_retries(fake_skopeo, "skopeo copy", 3, 0.01, 60) == b"ok" and len(runs) == 2
    else:
        with pytest.raises(mirror.SkopeoFailed):
            mirror.with_retries(fake_skopeo, "skopeo copy", 3, 0.01, 60)
        assert len(runs) == 1


def test_mirror_retries_stay_within_one_timeout(mirror: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(mirror.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(mirror.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    given: list[float] = []

    def always_503(seconds: float) -> bytes:
        given.append(seconds)
        clock[0] += 40  # each run takes 40 s before it fails
        raise mirror.SkopeoFailed("skopeo copy failed: invalid status code from registry 503", 6, transient=True)

    with pytest.raises(mirror.SkopeoFailed):
        mirror.with_retries(always_503, "skopeo copy", 10, 2.0, 100)
    assert given[0] == 100 and all(later < 100 - 40 for later in given[1:]), given  # each run gets what is left
    assert 2 <= len(given) <= 3, "no retry starts after the deadline"
