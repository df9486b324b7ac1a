"""Fixtures for tests/images: the Containerfiles parsed with a real Dockerfile parser, the
architecture presets, and an offline build rig for real `buildah bud` runs:

* ``image_rig``: buildah with its own vfs storage under a tmp dir (chroot isolation, no host
  storage or registry configuration involved) plus Debian's ``docker-registry`` on
  127.0.0.1:<random port>;
* ``standin_base``: a small stand-in base image pushed to that registry. There is no network
  access to container registries here, so it is assembled from this machine's own files: the
  running Python interpreter with its standard library, pip, dash and a few coreutils, plus a
  fake ``torch`` distribution (version ``2.9.0a0+standin``, a pre-release with a local label
  like NGC's torch) that the runtime stage must not replace;
* ``package_index``: two PEP 503 package indexes served over HTTP on 127.0.0.1 with wheels
  built by the test (pip inside the build reaches them through the host network).

Those three are module-scoped: test_container_builds.py is their only user, and the storage
(a few hundred MB of vfs layers) and the registry process go away as soon as it is done.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import get_key_val_dictionary

from tests.fixtures import programs
from tests.fixtures.net import start_on_free_port

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
BASE_CONTAINERFILE = IMAGES / "base.Containerfile"
RUNTIME_CONTAINERFILE = IMAGES / "runtime.Containerfile"
PRESETS_FILE = IMAGES / "presets.yaml"

STANDIN_TORCH_VERSION = "2.9.0a0+standin"
REQUIRED_TOOLS = ("buildah", "docker-registry", "ldd")


def missing_tools() -> str | None:
    """Why the image rig cannot build here for want of a program (its reason names the Debian packages)."""
    return programs.missing(*REQUIRED_TOOLS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "image_build: runs real buildah builds against a local registry (needs root, buildah, "
        "docker-registry); deselect with -m 'not image_build'",
    )


# --------------------------------------------------------------------------- parsing helpers

RESERVED_WORDS = {"if", "then", "elif", "else", "fi", "while", "until", "do", "done", "!"}
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "()", ";;", "{", "}"}
PIP_OPTIONS_WITH_VALUE = {
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-t",
    "--target",
    "--prefix",
    "--root",
    "--trusted-host",
}


def shell_commands(script: str) -> list[list[str]]:
    """Split a shell script into simple commands (token lists) with shlex, the standard
    library's shell lexer: words are unquoted, operators separate commands."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS:
            if commands[-1]:
                commands.append([])
        else:
            commands[-1].append(token)
    # a compound command's reserved word is not part of the simple command it introduces
    for command in commands:
        while command and command[0] in RESERVED_WORDS:
            del command[0]
    return [c for c in commands if c]


def _after(tokens: list[str], *words: str) -> list[str] | None:
    """Tokens after the subsequence ``words`` (in order, not necessarily adjacent)."""
    pos = 0
    for word in words:
        try:
            pos = tokens.index(word, pos) + 1
        except ValueError:
            return None
    return tokens[pos:]


def apt_packages(script: str) -> set[str]:
    packages: set[str] = set()
    for command in shell_commands(script):
        rest = _after(command, "apt-get", "install")
        if rest is not None:
            packages.update(t for t in rest if not t.startswith("-"))
    return packages


def pip_install_args(script: str) -> list[list[str]]:
    """Positional arguments of every ``pip install`` in the script (option values dropped)."""
    found = []
    for command in shell_commands(script):
        rest = _after(command, "pip", "install")
        if rest is None:
            continue
        positional, skip = [], False
        for token in rest:
            if skip:
                skip = False
            elif token in PIP_OPTIONS_WITH_VALUE:
                skip = True
            elif not token.startswith("-"):
                positional.append(token)
        found.append(positional)
    return found


@dataclass
class Containerfile:
    path: Path
    parser: DockerfileParser = field(init=False)

    def __post_init__(self) -> None:
        self.parser = self._parse()

    def _parse(self, build_args: dict[str, str] | None = None) -> DockerfileParser:
        # fileobj: the parser treats a `path` not named "Dockerfile" as a directory.
        return DockerfileParser(fileobj=io.BytesIO(self.path.read_bytes()), build_args=build_args or {})

    @property
    def structure(self) -> list[dict]:
        """Instructions in order, comments left out."""
        return [i for i in self.parser.structure if i["instruction"] != "COMMENT"]

    def instructions(self, name: str) -> list[dict]:
        return [i for i in self.structure if i["instruction"] == name]

    def runs(self) -> list[str]:
        return [i["value"] for i in self.instructions("RUN")]

    def run_with(self, needle: str) -> str:
        matches = [r for r in self.runs() if needle in r]
        assert len(matches) == 1, f"expected one RUN containing {needle!r} in {self.path.name}"
        return matches[0]

    def _first_from(self) -> int:
        return next(n for n, i in enumerate(self.structure) if i["instruction"] == "FROM")

    @staticmethod
    def _arg(value: str) -> tuple[str, str | None]:
        name, sep, default = value.partition("=")
        return name.strip(), (default.strip().strip('"') if sep else None)

    def global_args(self) -> dict[str, str | None]:
        return dict(self._arg(i["value"]) for i in self.structure[: self._first_from()] if i["instruction"] == "ARG")

    def stage_args(self) -> dict[str, str | None]:
        """ARGs declared in the (single) stage, with Docker's defaulting: a stage ARG without
        a value inherits the default of the global ARG of the same name."""
        glob = self.global_args()
        result: dict[str, str | None] = {}
        for i in self.structure[self._first_from() :]:
            if i["instruction"] == "ARG":
                name, default = self._arg(i["value"])
                result[name] = default if default is not None else glob.get(name)
        return result

    def build_env(self, build_args: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a RUN of this stage sees for the given build args."""
        build_args = build_args or {}
        env = {}
        for name, default in self.stage_args().items():
            if name in build_args:
                env[name] = build_args[name]
            elif default is not None:
                env[name] = default
        return env

    def parent_images(self, build_args: dict[str, str] | None = None) -> list[str]:
        return self._parse(build_args).parent_images

    def env_keys(self) -> list[str]:
        keys = []
        for i in self.instructions("ENV"):
            keys.extend(get_key_val_dictionary(i["value"]))
        return keys

    def pins_keep_set(self) -> set[str]:
        """The package set frozen by the `pins()` shell function (its Python source parsed
        with ast, not matched with a regex)."""
        import ast

        for run in self.runs():
            for command in shell_commands(run):
                if command[:2] == ["python3", "-c"] and "keep" in command[2]:
                    tree = ast.parse(command[2])
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "keep":
                            return set(ast.literal_eval(node.value))
        raise AssertionError(f"no pins() keep set in {self.path.name}")


@pytest.fixture(scope="session")
def base_cf() -> Containerfile:
    return Containerfile(BASE_CONTAINERFILE)


@pytest.fixture(scope="session")
def runtime_cf() -> Containerfile:
    return Containerfile(RUNTIME_CONTAINERFILE)


@pytest.fixture(scope="session")
def presets() -> dict:
    return yaml.safe_load(PRESETS_FILE.read_text())


@pytest.fixture(scope="session")
def shell_helpers():
    """The parsing helpers, for tests that need them directly."""
    return {"commands": shell_commands, "apt": apt_packages, "pip": pip_install_args}


# --------------------------------------------------------------------------- build rig


def _wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


class BuildFailed(AssertionError):
    pass


# buildah's child for a RUN (and for `buildah run`) re-executes itself from a sealed memfd copy of
# /proc/self/exe before the command starts (containers/storage pkg/unshare/unshare.c, copy_self_proc_exe:
# F_ADD_SEALS with F_SEAL_WRITE). The kernel refuses the seal with EBUSY when a page of the copy still holds
# an extra reference after its short wait (mm/memfd.c, memfd_wait_for_pins), which a busy 2-CPU machine
# hits now and then. The failing step's command has not run, and a build's earlier steps are redone from
# scratch, so running the same buildah command again is safe (a failed build's working container may stay
# in the rig's storage until the module's teardown removes it all); any other failure is not retried.
# (`bud --force-rm` would clean up at once, but buildah 1.28 allows it only with --layers or --no-cache.)
REEXEC_EBUSY = "sealing memfd copy: Device or resource busy"
REEXEC_ATTEMPTS = 3


@dataclass
class ImageRig:
    """buildah on private vfs storage + a local registry."""

    workdir: Path
    registry: str = ""
    env: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    @property
    def global_flags(self) -> list[str]:
        return ["--root", str(self.workdir / "storage"), "--runroot", str(self.workdir / "run"), "--storage-driver", "vfs"]

    def buildah(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess:
        cmd = ["buildah", *self.global_flags, *args]
        for attempt in range(1, REEXEC_ATTEMPTS + 1):
            started = time.monotonic()
            proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
            self.log.append(f"{time.monotonic() - started:6.1f}s buildah {' '.join(args[:2])}")
            if proc.returncode == 0 or REEXEC_EBUSY not in proc.stderr or attempt == REEXEC_ATTEMPTS:
                break
            self.log.append(f"       buildah re-exec hit memfd EBUSY; attempt {attempt + 1}/{REEXEC_ATTEMPTS}")
        if check and proc.returncode != 0:
            raise BuildFailed(f"buildah {' '.join(args)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
        return proc

    def bud(
        self, containerfile: Path, context: Path, tag: str, build_args: dict[str, str], check: bool = True
    ) -> subprocess.CompletedProcess:
        args = [
            "bud",
            "--isolation",
            "chroot",
            "--tls-verify=false",
            "--signature-policy",
            str(self.workdir / "policy.json"),
            "-f",
            str(containerfile),
            "-t",
            tag,
        ]
        for key, value in build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        return self.buildah(*args, str(context), check=check)

    def inspect(self, image: str) -> dict:
        out = self.buildah("inspect", "--type", "image", image).stdout
        return json.loads(out)["OCIv1"]["config"]

    def run_in(self, image: str, *command: str, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        ctr = self.buildah("from", "--pull-never", image).stdout.strip().splitlines()[-1]
        try:
            args = ["run", "--isolation", "chroot"]
            if user:
                args += ["--user", user]
            return self.buildah(*args, ctr, "--", *command, check=check)
        finally:
            self.buildah("rm", ctr, check=False)


@pytest.fixture(scope="module")
def image_rig(tmp_path_factory: pytest.TempPathFactory):
    missing = missing_tools()
    if missing:
        message = f"image build tests: {missing}"
        if os.environ.get("CI"):  # in CI a missing tool is a broken setup, not a reason to skip
            pytest.fail(message)
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("buildah with chroot isolation on vfs storage needs root (CI runs as root)")

    workdir = tmp_path_factory.mktemp("image-rig")
    (workdir / "auth.json").write_text('{"auths": {}}')
    (workdir / "policy.json").write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))

    def registry_command(port: int) -> list[str]:
        (workdir / "registry.yml").write_text(
            textwrap.dedent(f"""\
            version: 0.1
            log:
              level: info
              accesslog:
                disabled: true
            storage:
              filesystem:
                rootdirectory: {workdir / "registry-data"}
            http:
              addr: 127.0.0.1:{port}
            """)
        )
        return ["docker-registry", "serve", str(workdir / "registry.yml")]

    # distribution logs "listening on <addr>" once its listener is bound: a port another process took first is
    # retried elsewhere, never mistaken for ours (tests/fixtures/net.py)
    try:
        port, proc = start_on_free_port(registry_command, workdir / "registry.log", lambda port: f"listening on 127.0.0.1:{port}")
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"docker-registry did not start: {exc}")
    registry = f"127.0.0.1:{port}"
    (workdir / "registries.conf").write_text(
        textwrap.dedent(f"""\
        unqualified-search-registries = []
        [[registry]]
        location = "{registry}"
        insecure = true
        """)
    )
    (workdir / "storage.conf").write_text(
        textwrap.dedent(f"""\
        [storage]
        driver = "vfs"
        graphroot = "{workdir / "storage"}"
        runroot = "{workdir / "run"}"
        """)
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "BUILDAH_ISOLATION": "chroot",
        "CONTAINERS_REGISTRIES_CONF": str(workdir / "registries.conf"),
        "CONTAINERS_STORAGE_CONF": str(workdir / "storage.conf"),
        "REGISTRY_AUTH_FILE": str(workdir / "auth.json"),
    }
    rig = ImageRig(workdir=workdir, registry=registry, env=env)
    try:
        yield rig
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["buildah", *rig.global_flags, "rm", "--all"], env=env, capture_output=True, check=False)
        shutil.rmtree(workdir / "storage", ignore_errors=True)
        shutil.rmtree(workdir / "registry-data", ignore_errors=True)


# --------------------------------------------------------------------------- stand-in base

STANDIN_TOOLS = ("dash", "cat", "mkdir", "rm", "ls", "chmod", "chgrp", "id", "grep", "sort", "comm", "mv", "ln")
STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "pydoc_data",
}


class _RootfsBuilder:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.libs: set[str] = set()

    def copy(self, src: str) -> None:
        dst = Path(str(self.root) + src)
        if dst.exists() or dst.is_symlink():
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)  # follows symlinks: the library lands under its SONAME path

    def needs(self, binary: str) -> None:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        for line in out.splitlines():
            self.libs.update(word for word in line.split() if word.startswith("/"))

    def binary(self, path: str) -> None:
        self.copy(path)
        self.needs(path)

    def link(self, path: str, target: str) -> None:
        dst = Path(str(self.root) + path)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.is_symlink() and not dst.exists():
            dst.symlink_to(target)

    def finish(self) -> None:
        for lib in sorted(self.libs):
            self.copy(lib)


def _dist_info(site: Path, name: str, version: str, files: dict[str, str]) -> None:
    """Install a distribution by writing it into site-packages (what a wheel install does)."""
    for rel, content in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(content)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("ml-dev-env-tests\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def build_standin_rootfs(root: Path) -> str:
    """Assemble a minimal rootfs from this machine's files; returns its python3 path."""
    builder = _RootfsBuilder(root)
    base_python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    builder.binary(base_python)
    builder.link("/usr/local/bin/python3", base_python)
    stdlib = Path(os.__file__).parent
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = [d for d in dirnames if d not in STDLIB_SKIP and not d.startswith("config-")]
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            if filename == "EXTERNALLY-MANAGED" or not os.path.exists(path):
                continue  # Debian's PEP 668 marker; dangling links (e.g. sitecustomize)
            builder.copy(path)
            if filename.endswith(".so"):
                builder.needs(path)
    for tool in STANDIN_TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} not found on this machine"
        builder.binary(os.path.realpath(found))
        builder.link(f"/usr/bin/{tool}", os.path.realpath(found))
    dash = shutil.which("dash")
    assert dash, "dash not found on this machine"
    builder.link("/usr/bin/sh", os.path.realpath(dash))
    builder.link("/bin", "usr/bin")
    builder.finish()

    site = Path(
        str(root)
        + subprocess.run(
            [base_python, "-I", "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    site.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.find_spec("pip")
    assert spec and spec.origin, "pip is not importable in the test environment"
    shutil.copytree(Path(spec.origin).parent, site / "pip", ignore=shutil.ignore_patterns("__pycache__"))
    pip_dist = importlib.metadata.distribution("pip")
    pip_info = Path(str(pip_dist.locate_file(f"pip-{pip_dist.version}.dist-info")))
    shutil.copytree(pip_info, site / pip_info.name)
    _dist_info(site, "torch", STANDIN_TORCH_VERSION, {"torch/__init__.py": f'__version__ = "{STANDIN_TORCH_VERSION}"\n'})

    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "root").mkdir(exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    return base_python


@pytest.fixture(scope="module")
def standin_base(image_rig: ImageRig) -> str:
    """Reference of the stand-in base image in the local registry."""
    rootfs = image_rig.workdir / "standin-rootfs"
    build_standin_rootfs(rootfs)
    ctr = image_rig.buildah("from", "scratch").stdout.strip().splitlines()[-1]
    image_rig.buildah("copy", ctr, f"{rootfs}/", "/")
    image_rig.buildah("config", "--env", "PATH=/usr/local/bin:/usr/bin:/bin", "--cmd", "/bin/sh", ctr)
    image_rig.buildah("commit", "-q", "--signature-policy", str(image_rig.workdir / "policy.json"), ctr, "localhost/standin-build")
    image_rig.buildah("rm", ctr)
    ref = f"{image_rig.registry}/ml-dev-env/standin-base:py{sys.version_info.major}{sys.version_info.minor}"
    image_rig.buildah(
        "push",
        "--tls-verify=false",
        "--signature-policy",
        str(image_rig.workdir / "policy.json"),
        "localhost/standin-build",
        f"docker://{ref}",
    )
    # Builds must pull the stand-in from the registry, as an on-cluster build pulls its base.
    image_rig.buildah("rmi", "localhost/standin-build")
    shutil.rmtree(rootfs)
    return ref


# --------------------------------------------------------------------------- package index


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def make_wheel(dest: Path, name: str, version: str, requires: tuple[str, ...] = (), modules: dict[str, str] | None = None) -> Path:
    """Write a pure-Python wheel (PEP 427) without any build backend."""
    modules = modules or {f"{name}/__init__.py": f'VERSION = "{version}"\n'}
    info = f"{name}-{version}.dist-info"
    metadata = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", *(f"Requires-Dist: {r}\n" for r in requires)])
    files = {
        **modules,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ml-dev-env-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(body.encode())},{len(body.encode())}\n" for path, body in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, body in files.items():
            zf.writestr(path, body)
    return wheel


def write_simple_index(index_root: Path, wheels: list[Path]) -> None:
    """PEP 503 layout: <index_root>/simple/<project>/index.html -> ../../files/<wheel>."""
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(project, []).append(wheel)
    for project, project_wheels in projects.items():
        page = index_root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n' for w in project_wheels
        )
        page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture(scope="module")
def package_index(tmp_path_factory: pytest.TempPathFactory):
    """Two local indexes: ``primary`` (mlapp, torchgreedy and a newer torch that would
    replace the base's) and ``extra`` (mlextra, reachable only via PIP_EXTRA_INDEX_URL)."""
    root = tmp_path_factory.mktemp("pypi")
    primary = [
        make_wheel(root / "primary/files", "mlapp", "0.1.0", requires=("torch",)),
        make_wheel(root / "primary/files", "mlapp", "0.2.0", requires=("torch>=2.0",)),
        make_wheel(root / "primary/files", "torchgreedy", "1.0.0", requires=("torch>=2.10",)),
        make_wheel(root / "primary/files", "torch", "2.10.0", modules={"torch/__init__.py": '__version__ = "2.10.0"\n'}),
    ]
    extra = [make_wheel(root / "extra/files", "mlextra", "1.0.0")]
    write_simple_index(root / "primary", primary)
    write_simple_index(root / "extra", extra)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _wait_http(f"{base}/primary/simple/mlapp/", 5)
        yield {"primary": f"{base}/primary/simple", "extra": f"{base}/extra/simple"}
    finally:
        server.shutdown()
        server.server_close()
