"""Where a model comes from: one small interface, one class per scheme, chosen once by the scheme of its URI.

A `ModelSource` lists its files (`files`: relative path -> `SourceFile`, with the size and checksum the source
states), opens a reader at an offset (`reader`: the modelcar layer's bytes of one file, streamed with ranged GETs),
says what identifies a file's bytes (`tag`, recorded with a layer and compared on re-runs) and verifies bytes read
against the source's own checksum (`hasher`: a `SourceHasher`). The download step also asks it to `fetch` files
into a directory. `SCHEMES` is the one table of schemes; `split_uri` the one place a URI's scheme is read, and
`open_source` the one place a class is chosen. A new source (GCS, a PVC, an OCI artifact) is one class and a row.
"""

from __future__ import annotations

import glob
import http.client
import os
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .checksum import SourceHasher
from .model import DEFAULT_INCLUDE, Expected, LayerLayout, path_rule, s3_expected, select
from .registry import STREAM_READ, TransientError
from .runtime import DISK_ERRORS, EXIT_AUTH, EXIT_INTEGRITY, EXIT_NOT_FOUND, EXIT_REMOTE, MiB, Progress, StepError, env_secret, log, writing
from .s3 import bucket_and_prefix, s3_error, s3_exceptions


class Continued:
    """Ranged reads of one source object served by one open GET, from the first read's offset to the object's end,
    for as long as each read starts where the last one stopped: the chunks of one upload cost one request, not one
    per chunk (no first-byte wait between chunks; moto, which reads the whole object for every ranged GET
    (moto/s3/responses.py `_handle_range_header` slices `key.value`), reads it once). A read that starts elsewhere (a
    resume) opens a new GET from there. A GET that breaks (or ends early) after giving bytes is replaced by one from
    the byte it stopped at, inside the same read: the registry's request in flight never sees it, so a source hiccup
    costs no re-sent chunk (on distribution, a half-sent chunk costs the whole session). The bytes are the same
    object's (If-Match: the listed ETag). `close()` ends the open GET."""

    def __init__(self, open_from: Callable[[int], Iterator[memoryview]], size: int, what: str) -> None:
        self.open_from, self.size, self.what = open_from, size, what
        self.pieces: Iterator[memoryview] | None = None
        self.pos = 0  # the offset the open GET's next byte has
        self.rest: memoryview | None = None  # bytes of the last piece beyond the last read (valid until the next piece)
        self.requests = 0

    def __call__(self, start: int, stop: int) -> Iterator[memoryview]:
        fresh = -1  # the offset of a GET opened by this read that has not yet given a byte
        if self.pieces is None or self.pos != start:
            self._open(start)
            fresh = start
        try:
            while self.pos < stop:
                piece = self.rest
                self.rest = None
                if piece is None:
                    try:
                        piece = next(self.pieces, None)  # type: ignore[arg-type]
                        if piece is None:
                            raise TransientError(f"the source ended at byte {self.pos}, before byte {stop}")
                    except TransientError as exc:
                        if fresh == self.pos:  # a GET opened here broke before its first byte: the upload's retries decide
                            raise TransientError(f"{self.what}: {exc}") from exc
                        log(f"{self.what}: the source's GET broke at byte {self.pos} ({exc}); reading on with a new GET from there")
                        self._open(self.pos)
                        fresh = self.pos
                        continue
                take = min(len(piece), stop - self.pos)
                if take < len(piece):
                    self.rest = piece[take:]
                self.pos += take
                yield piece[:take]
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):  # a consumer that stops early leaves the GET where it is
                self.close()
            raise
        finally:
            if self.pos >= self.size:  # the object's last byte is read: its GET is done
                self.close()

    def _open(self, start: int) -> None:
        self.close()
        self.pieces, self.pos, self.rest = self.open_from(start), start, None
        self.requests += 1

    def close(self) -> None:
        pieces, self.pieces, self.rest = self.pieces, None, None
        if pieces is not None:
            getattr(pieces, "close", lambda: None)()


class FramedReader:
    """The layer's bytes [offset, end) of a streamed file: tar header, the file bytes the chunk needs from the source
    (`Continued`: one GET goes on from chunk to chunk), padding. `close()` ends the source's open GET."""

    def __init__(self, layout: LayerLayout, body: Continued) -> None:
        self.layout, self.body = layout, body

    def __call__(self, offset: int, end: int) -> Iterator[memoryview]:
        layout = self.layout
        head_len, size = len(layout.head), layout.file_size
        start, stop = max(offset - head_len, 0), min(max(end - head_len, 0), size)
        # The source answers before the first piece is yielded: a 404 or refusal fails before a PATCH is sent
        # (a half-sent chunk leaves distribution a session it can neither resume nor cancel).
        pieces = self.body(start, stop) if start < stop else None
        first = next(pieces, None) if pieces is not None else None
        if offset < head_len:
            yield memoryview(layout.head)[offset:]
            offset = head_len
        if pieces is not None:
            if first is not None:
                yield first
            yield from pieces
            offset = head_len + size
        yield memoryview(layout.tail)[offset - head_len - size :]

    def close(self) -> None:
        self.body.close()


@dataclass
class SourceFile:
    """One file of a source: where the source keeps it, what it states about its bytes, its version (ETag, hash)."""

    key: str
    expected: Expected
    etag: str


@dataclass(frozen=True)
class Wanted:
    """What a step asks of a source: which files (globs; none given: the source's default for the step) and for which
    step (`download` to a directory, or `package`: streamed into the upload, where S3's CRC32 is the cheapest check)."""

    include: Sequence[str]
    exclude: Sequence[str]
    step: str


@dataclass(frozen=True)
class SourceSettings:
    """The flags each scheme reads; a source takes what its scheme needs."""

    s3_client: Callable[[], tuple[Any, Any]] = lambda: (None, None)
    """() -> (S3 client, the botocore session that signs its ranged GETs, or None): built only for an S3 source."""
    s3_ca_file: str | None = None
    hf_endpoint: str | None = None
    hf_revision: str = "main"


class ModelSource:
    """The interface every scheme's class fills in (see the module's docstring)."""

    def __init__(self, location: str, wanted: Wanted, settings: SourceSettings) -> None:
        """List the files `wanted` names at `location` (the URI without its `<scheme>://`)."""

    scheme: ClassVar[str]
    where: str
    files: dict[str, SourceFile]
    revision = ""  # the source's own version of the whole model (a Hugging Face commit), when it has one
    license = ""

    def reader(self, rel: str, layout: LayerLayout) -> FramedReader:
        raise NotImplementedError

    def tag(self, rel: str) -> str:
        """What identifies the source bytes of `rel` (recorded as a layer annotation, compared on re-runs)."""
        raise NotImplementedError

    def hasher(self, rel: str, layout: LayerLayout) -> SourceHasher:
        """The state that hashes a layer of `rel` and checks the file's bytes against the source's checksum."""
        return SourceHasher(len(layout.head), self.files[rel].expected)

    def fetch(self, rels: Sequence[str], dest: Path, workers: int, progress: Progress) -> Iterator[tuple[str, Path]]:
        """Download `rels` under `dest`; yields (rel, the file written), which the caller verifies and puts in place."""
        raise NotImplementedError

    def annotations(self) -> dict[str, str]:
        """The image annotations the source itself can tell (its revision and license)."""
        found = (("org.opencontainers.image.revision", self.revision), ("org.opencontainers.image.licenses", self.license))
        return {k: v for k, v in found if v}

    DOWNLOAD_INCLUDE: ClassVar[Sequence[str]] = DEFAULT_INCLUDE
    """What the download step takes when no include is given (the package step: always `DEFAULT_INCLUDE`)."""

    def _chosen(self, listed: Sequence[str], wanted: Wanted) -> list[str]:
        default = self.DOWNLOAD_INCLUDE if wanted.step == "download" else DEFAULT_INCLUDE
        return select([p for p in listed if path_rule(p) != "hidden"], wanted.include or list(default), wanted.exclude)


class S3Source(ModelSource):
    """Model files in S3 (`s3://bucket[/prefix]`): listing, expected checksums, signed ranged GETs, downloads."""

    scheme = "s3"
    DOWNLOAD_INCLUDE = ("*",)  # the download step takes everything under the prefix unless told otherwise

    def __init__(self, location: str, wanted: Wanted, settings: SourceSettings) -> None:
        self.bucket, self.prefix = bucket_and_prefix(location)
        self.client, self.session = settings.s3_client()
        self.ca_file = settings.s3_ca_file or None
        self._tls: ssl.SSLContext | None = None  # built for the first https GET (it costs a CA bundle load)
        self.where = where = f"s3://{self.bucket}/{self.prefix}"
        try:
            keys = {}
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(self.prefix) :]
                    if rel and not rel.endswith("/"):
                        keys[rel] = obj["Key"]
        except s3_exceptions() as exc:
            raise s3_error(exc, f"listing {where}") from exc
        chosen = self._chosen(list(keys), wanted)
        if not chosen:
            raise StepError(f"no objects to {wanted.step} under {where} (include={list(wanted.include) or ['*']})", EXIT_NOT_FOUND)
        self.files: dict[str, SourceFile] = {}
        try:
            for rel in chosen:
                head = self.client.head_object(Bucket=self.bucket, Key=keys[rel], ChecksumMode="ENABLED")
                expected = s3_expected(self.client, self.bucket, keys[rel], head, crc=wanted.step == "package")
                self.files[rel] = SourceFile(keys[rel], expected, str(head.get("ETag", "")).strip('"'))
        except s3_exceptions() as exc:
            raise s3_error(exc, f"reading object metadata under {where}") from exc

    def reader(self, rel: str, layout: LayerLayout) -> FramedReader:
        """Signed (botocore/auth.py S3SigV4Auth.add_auth) ranged GETs into one buffer; If-Match the listed ETag."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        obj, where = self.files[rel], f"GET s3://{self.bucket}/{self.files[rel].key}"

        def body(start: int) -> Iterator[memoryview]:
            headers = {"Range": f"bytes={start}-{obj.expected.size - 1}", "If-Match": f'"{obj.etag}"'}
            req = AWSRequest("GET", f"{self.client.meta.endpoint_url}/{self.bucket}/{urllib.parse.quote(obj.key)}", headers)
            S3SigV4Auth(self.session.get_credentials().get_frozen_credentials(), "s3", self.client.meta.region_name).add_auth(req)
            url = urllib.parse.urlsplit(req.url)
            conn = http.client.HTTPConnection(url.netloc, timeout=60)
            if url.scheme == "https":
                self._tls = self._tls or ssl.create_default_context(cafile=self.ca_file)
                conn = http.client.HTTPSConnection(url.netloc, timeout=60, context=self._tls)
            try:
                conn.request("GET", url.path, headers=dict(req.headers.items()))
                resp = conn.getresponse()
                if resp.status != 206:
                    detail = " ".join(resp.read(300).decode("utf-8", "replace").split())  # one line
                    text = f"{where}: HTTP {resp.status} " + ("(no longer exists)" if resp.status == 404 else detail)
                    code = {403: EXIT_AUTH, 404: EXIT_NOT_FOUND, 412: EXIT_INTEGRITY}.get(resp.status)
                    raise StepError(text, code) if code else TransientError(text)
                buf = memoryview(bytearray(8 * STREAM_READ))
                while got := resp.readinto(buf):
                    yield buf[:got]
            except (OSError, http.client.HTTPException) as exc:
                raise TransientError(f"{where}: {type(exc).__name__}: {exc}") from exc
            finally:
                conn.close()

        return FramedReader(layout, Continued(body, obj.expected.size, rel))

    def tag(self, rel: str) -> str:
        obj = self.files[rel]
        return f"s3:{obj.etag}:{obj.expected.size}"

    def fetch(self, rels: Sequence[str], dest: Path, workers: int, progress: Progress) -> Iterator[tuple[str, Path]]:
        """boto3's transfer manager, one file at a time (parallel parts), into a hidden `.<name>.partial`."""
        from boto3.s3.transfer import TransferConfig

        transfer = TransferConfig(max_concurrency=workers, multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB)
        for rel in rels:
            final = dest / rel
            partial = final.with_name(f".{final.name}.partial")
            try:
                with writing(final, "download destination"):
                    final.parent.mkdir(parents=True, exist_ok=True)
                    self.client.download_file(self.bucket, self.files[rel].key, str(partial), Callback=progress.advance, Config=transfer)
            except StepError:
                partial.unlink(missing_ok=True)
                raise
            except s3_exceptions() as exc:
                partial.unlink(missing_ok=True)
                raise s3_error(exc, f"downloading s3://{self.bucket}/{self.files[rel].key}") from exc
            yield rel, partial


class HfSource(ModelSource):
    """Model files on the Hugging Face Hub (`hf://org/name`) at a resolved commit.

    Ranged GETs of `<endpoint>/<repo>/resolve/<commit>/<file>` with `HF_TOKEN` through huggingface_hub's
    httpx client, which drops the Authorization header when the Hub redirects to its CDN. LFS files are
    checked against their sha256, small files against their git blob id.
    """

    scheme = "hf"
    DOWNLOAD_INCLUDE = DEFAULT_INCLUDE  # the stack's `models[].include` default is the same list

    def __init__(self, location: str, wanted: Wanted, settings: SourceSettings) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
        from huggingface_hub.hf_api import RepoFile

        self.repo_id = location.strip("/")
        self.where = f"hf://{self.repo_id}"
        self.token = env_secret("HF_TOKEN")
        self.endpoint = (settings.hf_endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        api = HfApi(endpoint=self.endpoint, token=self.token)
        try:
            info = api.repo_info(self.repo_id, revision=settings.hf_revision or None)
            self.commit = str(info.sha or "")
            tree = {f.path: f for f in api.list_repo_tree(self.repo_id, revision=self.commit, recursive=True) if isinstance(f, RepoFile)}
        except (GatedRepoError, RepositoryNotFoundError) as exc:
            hint = "HF_TOKEN is set" if self.token else "HF_TOKEN is not set"
            raise StepError(f"hf://{self.repo_id}: repository not found or not accessible ({hint})", EXIT_AUTH) from exc
        except RevisionNotFoundError as exc:
            raise StepError(f"hf://{self.repo_id}: revision {settings.hf_revision!r} not found", EXIT_NOT_FOUND) from exc
        except Exception as exc:  # network failures surface as HTTP-library types
            raise StepError(f"hf://{self.repo_id}: {type(exc).__name__}: {exc}", EXIT_REMOTE) from exc
        card = getattr(info, "card_data", None) or getattr(info, "cardData", None) or {}
        license_id = card.get("license") if hasattr(card, "get") else getattr(card, "license", None)
        self.revision, self.license = self.commit, str(license_id or "")
        chosen = self._chosen(list(tree), wanted)
        if not chosen:
            raise StepError(f"hf://{self.repo_id}@{self.commit}: no files match the include patterns", EXIT_NOT_FOUND)
        self.files = {}
        for rel in chosen:
            entry = tree[rel]
            lfs = entry.lfs
            expected = Expected(entry.size, "sha256", lfs.sha256) if lfs else Expected(entry.size, "git-sha1", entry.blob_id)
            self.files[rel] = SourceFile(rel, expected, expected.value or "")

    def reader(self, rel: str, layout: LayerLayout) -> FramedReader:
        from huggingface_hub.utils import get_session

        url = f"{self.endpoint}/{self.repo_id}/resolve/{self.commit}/{urllib.parse.quote(rel)}"

        size = self.files[rel].expected.size

        def body(start: int) -> Iterator[memoryview]:
            headers = {"Range": f"bytes={start}-{size - 1}", "Accept-Encoding": "identity"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            try:
                # huggingface_hub's httpx client drops Authorization on a redirect to another origin (the CDN):
                # encode/httpx httpx/_client.py, BaseClient._redirect_headers
                with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as resp:
                    if resp.status_code in (401, 403):
                        raise StepError(f"hf://{self.repo_id}/{rel}: HTTP {resp.status_code} (HF_TOKEN)", EXIT_AUTH)
                    if resp.status_code == 404:  # gone since the listing: retrying cannot help
                        raise StepError(f"hf://{self.repo_id}/{rel}: no longer exists at {self.commit} (HTTP 404)", EXIT_NOT_FOUND)
                    if resp.status_code != 206:
                        raise TransientError(f"GET {rel} from {self.endpoint}: HTTP {resp.status_code}")
                    for piece in resp.iter_bytes(8 * STREAM_READ):
                        yield memoryview(piece)
            except (StepError, TransientError):
                raise
            except Exception as exc:  # httpx's transport errors (not pinned here: huggingface_hub's dependency)
                raise TransientError(f"reading hf://{self.repo_id}/{rel}: {type(exc).__name__}: {exc}") from exc

        return FramedReader(layout, Continued(body, size, rel))

    def tag(self, rel: str) -> str:
        return f"hf:{self.commit}:{self.files[rel].expected.value}"

    def fetch(self, rels: Sequence[str], dest: Path, workers: int, progress: Progress) -> Iterator[tuple[str, Path]]:
        """`snapshot_download` of exactly `rels` at the commit, into place (progress from the bytes on disk)."""
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from huggingface_hub import snapshot_download

        if not rels:
            return
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(dest, progress, stop), daemon=True)
        watcher.start()
        try:
            # one line per pair: the credential policy (policy/rules/no_plaintext_credentials.py) reads a line
            # `token=<8+ characters>` as a literal credential in the ConfigMap that ships this file
            snapshot_download(
                self.repo_id, revision=self.commit, local_dir=dest, allow_patterns=[glob.escape(r) for r in rels],
                token=self.token, max_workers=workers, endpoint=self.endpoint,
            )  # fmt: skip
        except Exception as exc:  # see above: network and HTTP failures surface as library-specific types
            if isinstance(exc, OSError) and exc.errno in DISK_ERRORS:
                raise StepError(f"cannot write download destination {exc.filename or dest}: {exc.strerror}") from exc
            raise StepError(f"hf://{self.repo_id}: download failed: {type(exc).__name__}: {exc}", EXIT_REMOTE) from exc
        finally:
            stop.set()
            watcher.join()
        progress.advance(progress.total - progress.done)
        for rel in rels:
            if not (dest / rel).is_file():
                raise StepError(f"{rel}: missing after download", EXIT_INTEGRITY)
            yield rel, dest / rel


def _bytes_under(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:  # renamed from .incomplete while we looked
            pass
    return total


def _watch(dest: Path, progress: Progress, stop: threading.Event) -> None:
    """Report download progress from the bytes arriving on disk (huggingface_hub has no byte callback)."""
    start = _bytes_under(dest)
    while not stop.wait(progress.interval):
        progress.advance(min(_bytes_under(dest) - start, progress.total) - progress.done)


SCHEMES: dict[str, type[ModelSource]] = {"s3": S3Source, "hf": HfSource}
"""The one table of model sources: URI scheme -> class."""
URI_FORMS = "s3://bucket[/prefix] or hf://org/name"


def split_uri(uri: str) -> tuple[str, str]:
    """(scheme, the rest) of `<scheme>://<rest>`; ValueError naming the forms allowed for anything else."""
    scheme, sep, rest = uri.partition("://")
    if not sep or not rest.strip("/"):
        raise ValueError(f"must be {URI_FORMS}")
    return scheme, rest


def uri_problem(uri: str) -> str | None:
    """What is wrong with a model source URI (for a step's argument check), or None."""
    try:
        scheme, _ = split_uri(uri)
    except ValueError as exc:
        return str(exc)
    return None if scheme in SCHEMES else f"must be {URI_FORMS}"


def open_source(uri: str, wanted: Wanted, settings: SourceSettings) -> ModelSource:
    """The source `uri` names, listed (the class is chosen here, by the scheme, and nowhere else)."""
    scheme, rest = split_uri(uri)
    return SCHEMES[scheme](rest, wanted, settings)
