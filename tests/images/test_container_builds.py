"""Real builds with ``buildah bud`` (vfs storage, chroot isolation) against a stand-in base
image pulled from a local ``docker-registry``, with pip reaching only local package indexes.

* images/runtime.Containerfile is built as OpenShift builds it: inline-Dockerfile mode (the
  context holds nothing but the Dockerfile) and Git mode (a context with requirements.txt);
* the offline part of images/base.Containerfile (everything except the apt / pip / download
  steps) is built on the stand-in, and the result is checked as an arbitrary OpenShift UID.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[2] / "images"
BASE_CONTAINERFILE = IMAGES / "base.Containerfile"
RUNTIME_CONTAINERFILE = IMAGES / "runtime.Containerfile"
STANDIN_TORCH_VERSION = "2.9.0a0+standin"  # tests/images/conftest.py builds it so

pytestmark = pytest.mark.image_build

LOCK_DIR = "ml-dev-env-lock"  # components/image_build.py BASE_LOCK_DIR
ARBITRARY_UID = "1000770000:0"  # what restricted-v2 assigns: some high UID, group 0
# RUN steps the stand-in cannot run: downloads, and the smoke test of what they installed
NETWORK_COMMANDS = {"apt-get", "curl", "pip", "jupyter"}

PROBE = (
    "import importlib.metadata as md, json, mlapp, torch; "
    "print(json.dumps({'mlapp': mlapp.VERSION, 'torch': torch.__version__, "
    "'torch_dist': md.version('torch'), "
    "'extra': [d.metadata['Name'] for d in md.distributions() if d.metadata['Name'] == 'mlextra'],"
    "'reqs': open('/opt/ml-dev-env/app/requirements.txt').read(), "
    "'constraints': open('/opt/ml-dev-env/app/constraints.txt').read()}))"
)


def probe(rig, image: str) -> dict:
    return json.loads(rig.run_in(image, "python3", "-c", PROBE).stdout.strip().splitlines()[-1])


def inline_context(tmp_path: Path) -> Path:
    """What OpenShift builds for `source.dockerfile`: a directory with just `Dockerfile`."""
    context = tmp_path / "inline"
    context.mkdir()
    shutil.copy(RUNTIME_CONTAINERFILE, context / "Dockerfile")
    return context


def test_runtime_inline_mode_installs_app_requirements(image_rig, standin_base, package_index, tmp_path):
    tag = "localhost/ml-dev-env-runtime:inline"
    context = inline_context(tmp_path)
    image_rig.bud(
        context / "Dockerfile",
        context,
        tag,
        {
            "BASE_IMAGE": standin_base,
            "APP_REQUIREMENTS": "mlapp==0.1.0",
            "PIP_INDEX_URL": package_index["primary"],
            "SOURCE_REF": "0123abc",
        },
    )
    config = image_rig.inspect(tag)
    assert config["Labels"]["ml-dev-env.source-ref"] == "0123abc"
    assert config["Labels"]["org.opencontainers.image.revision"] == "0123abc"
    assert config["Labels"]["org.opencontainers.image.base.name"] == standin_base
    assert not [e for e in config.get("Env", []) if e.startswith("NCCL_")]
    result = probe(image_rig, tag)
    assert result["mlapp"] == "0.1.0"
    # the base's torch (a pre-release with a local label, like NGC's) is untouched and frozen
    assert result["torch"] == result["torch_dist"] == STANDIN_TORCH_VERSION
    assert result["constraints"].split() == [f"torch=={STANDIN_TORCH_VERSION}"]
    assert "mlapp==0.1.0" in result["reqs"].splitlines()


def test_runtime_git_mode_uses_the_context_requirements_file(image_rig, standin_base, package_index, tmp_path):
    context = tmp_path / "app"
    context.mkdir()
    (context / "requirements.txt").write_text("# app pins\nmlapp==0.2.0\n")
    # OpenShift writes the (inline or dockerfilePath) Dockerfile into the Git context.
    shutil.copy(RUNTIME_CONTAINERFILE, context / "Dockerfile")
    tag = "localhost/ml-dev-env-runtime:git"
    image_rig.bud(
        context / "Dockerfile",
        context,
        tag,
        {
            "BASE_IMAGE": standin_base,
            "APP_REQUIREMENTS": "mlextra==1.0.0",
            "PIP_INDEX_URL": package_index["primary"],
            "PIP_EXTRA_INDEX_URL": package_index["extra"],
        },
    )
    result = probe(image_rig, tag)
    assert result["mlapp"] == "0.2.0"
    assert result["extra"] == ["mlextra"], "PIP_EXTRA_INDEX_URL did not reach pip"
    lines = [line for line in result["reqs"].splitlines() if not line.startswith("#")]
    assert [line for line in lines if line] == ["mlapp==0.2.0", "mlextra==1.0.0"]
    assert result["torch"] == STANDIN_TORCH_VERSION
    labels = image_rig.inspect(tag)["Labels"]
    assert labels["ml-dev-env.source-ref"] == "unknown"


def test_runtime_refuses_to_replace_the_base_torch(image_rig, standin_base, package_index, tmp_path):
    # Control: without the runtime stage's constraints pip WOULD swap torch for the index's
    # 2.10.0 to satisfy torchgreedy's `torch>=2.10`.
    dry = image_rig.run_in(
        standin_base, "python3", "-m", "pip", "install", "--dry-run", "--index-url", package_index["primary"], "torchgreedy==1.0.0"
    )
    assert "torch-2.10.0" in dry.stdout
    context = inline_context(tmp_path)
    proc = image_rig.bud(
        context / "Dockerfile",
        context,
        "localhost/ml-dev-env-runtime:greedy",
        {"BASE_IMAGE": standin_base, "APP_REQUIREMENTS": "torchgreedy==1.0.0", "PIP_INDEX_URL": package_index["primary"]},
        check=False,
    )
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "torchgreedy 1.0.0 depends on torch>=2.10" in output
    assert f"The user requested (constraint) torch=={STANDIN_TORCH_VERSION}" in output
    assert image_rig.buildah("inspect", "--type", "image", "localhost/ml-dev-env-runtime:greedy", check=False).returncode != 0, (
        "no image may be tagged"
    )


def test_runtime_rejects_a_missing_explicit_requirements_file(image_rig, standin_base, tmp_path):
    context = inline_context(tmp_path)
    proc = image_rig.bud(
        context / "Dockerfile",
        context,
        "localhost/ml-dev-env-runtime:missing",
        {"BASE_IMAGE": standin_base, "REQUIREMENTS_FILE": "runtime-requirements.txt"},
        check=False,
    )
    assert proc.returncode != 0
    assert "REQUIREMENTS_FILE=runtime-requirements.txt is not at the root" in proc.stderr


def test_runtime_without_requirements_builds_and_installs_nothing(image_rig, standin_base, package_index, tmp_path):
    """REQUIREMENTS_FILE="" ignores the context's requirements.txt (this repository's root
    has one: the Pulumi program's) and, with no APP_REQUIREMENTS, installs nothing."""
    tag = "localhost/ml-dev-env-runtime:empty"
    context = inline_context(tmp_path)
    (context / "requirements.txt").write_text("mlapp==0.1.0\n")
    proc = image_rig.bud(
        context / "Dockerfile",
        context,
        tag,
        {"BASE_IMAGE": standin_base, "REQUIREMENTS_FILE": "", "PIP_INDEX_URL": package_index["primary"]},
    )
    assert "No application requirements" in proc.stdout
    check = image_rig.run_in(tag, "python3", "-c", "import importlib.util as u; print(u.find_spec('mlapp') is None)")
    assert check.stdout.strip() == "True"


# --------------------------------------------------------------------------- base, offline part


def offline_base_containerfile(base_cf, shell_commands) -> str:
    """base.Containerfile minus the RUN steps that need apt, pip or downloads: the parsed
    instructions re-emitted verbatim, in order."""
    kept = []
    for instruction in base_cf.structure:
        if instruction["instruction"] == "RUN":
            words = {w for c in shell_commands(instruction["value"]) for w in c}
            if words & NETWORK_COMMANDS:
                continue
        kept.append(instruction["content"])
    return "".join(kept)


@pytest.fixture(scope="module")
def offline_base(image_rig, standin_base, base_cf, shell_helpers, tmp_path_factory):
    context = tmp_path_factory.mktemp("base-offline")
    containerfile = context / "Containerfile"
    containerfile.write_text(offline_base_containerfile(base_cf, shell_helpers["commands"]))
    # what the BuildConfig's lock ConfigMap puts into the context (the COPY is part of the offline build)
    (context / LOCK_DIR).mkdir()
    shutil.copy(IMAGES / "base-requirements-py3.12.txt", context / LOCK_DIR / "base-requirements.txt")
    assert "memlock" in containerfile.read_text(), "the layout step must be part of the build"
    tag = "localhost/ml-dev-env-base:offline"
    image_rig.bud(containerfile, context, tag, {"BASE_IMAGE": standin_base})
    return tag


def test_base_image_config(image_rig, offline_base):
    config = image_rig.inspect(offline_base)
    env = dict(e.split("=", 1) for e in config["Env"])
    assert not [k for k in env if k.startswith("NCCL_")]
    assert env["HOME"] == "/home/ml-dev"
    assert env["PIP_CONSTRAINT"] == "/etc/ml-dev-env/constraints.txt"
    assert env["PATH"].startswith("/home/ml-dev/.local/bin:")
    assert config["WorkingDir"] == "/workspace"
    assert set(config["ExposedPorts"]) == {"8080/tcp", "8888/tcp", "6006/tcp"}
    assert config["Cmd"] == ["sleep", "infinity"]
    assert config["Labels"]["ml-dev-env.preset"] == "nvidia-pytorch"
    assert config["Labels"]["ml-dev-env.base-tag"] == "nvidia-cu130-torch2.9.0a0-fa2.7.4.post1"


def test_base_layout_is_writable_by_an_arbitrary_uid(image_rig, offline_base):
    script = (
        "import json, os, stat; "
        "open('/workspace/probe', 'w').write('x'); "
        "os.makedirs(os.path.join(os.environ['HOME'], '.cache', 'pip')); "
        "st = os.stat('/workspace'); "
        "print(json.dumps({'uid': os.getuid(), 'gid': st.st_gid, "
        "'g_rwx': stat.S_IMODE(st.st_mode) & 0o070 == 0o070, 'cwd': os.getcwd()}))"
    )
    result = json.loads(image_rig.run_in(offline_base, "python3", "-c", script, user=ARBITRARY_UID).stdout.strip().splitlines()[-1])
    assert result == {"uid": 1000770000, "gid": 0, "g_rwx": True, "cwd": "/workspace"}


def test_base_memlock_limits_file(image_rig, offline_base):
    out = image_rig.run_in(offline_base, "cat", "/etc/security/limits.d/99-ml-dev-env-memlock.conf").stdout
    assert out.splitlines() == ["* soft memlock unlimited", "* hard memlock unlimited"]


def test_profile_hook_picks_up_the_pod_env_file(image_rig, offline_base):
    script = (
        "mkdir -p /tmp/ml-dev-env && "
        "printf 'export NCCL_IB_HCA=mlx5_6,mlx5_7,mlx5_8,mlx5_9\\n' > /tmp/ml-dev-env/env.sh && "
        '. /etc/profile.d/ml-dev-env.sh && echo "HCA=$NCCL_IB_HCA"'
    )
    out = image_rig.run_in(offline_base, "sh", "-c", script, user=ARBITRARY_UID).stdout
    assert "HCA=mlx5_6,mlx5_7,mlx5_8,mlx5_9" in out
    # Without the file (workers before the startup script ran, `oc exec` shells) sourcing is a
    # harmless no-op, even under `set -e`.
    out = image_rig.run_in(
        offline_base, "sh", "-c", 'set -eu; . /etc/profile.d/ml-dev-env.sh; echo "ok ${NCCL_IB_HCA:-unset}"', user=ARBITRARY_UID
    ).stdout
    assert "ok unset" in out
    bashrc = image_rig.run_in(offline_base, "cat", "/etc/bash.bashrc").stdout
    assert "if [ -r /etc/profile.d/ml-dev-env.sh ]; then . /etc/profile.d/ml-dev-env.sh; fi" in bashrc


def test_offline_subset_really_excludes_only_network_steps(base_cf, shell_helpers):
    text = offline_base_containerfile(base_cf, shell_helpers["commands"])
    assert text.count("\nRUN ") == 1 and "chmod -R g=u" in text
    for marker in ("apt-get", "pip install", "curl "):
        assert marker not in text
    assert BASE_CONTAINERFILE.read_text().count("\nRUN ") == 7  # + the nccl-tests build (fabric check), the smoke test


# --------------------------------------------------------------------------- base, the hash lock
# The base stage's lock steps — its COPY of the lock from the context (where the BuildConfig's ConfigMap
# puts it) and the RUN that installs it — built verbatim on the stand-in, pip reaching the local index.


def index_lock_line(index: str, project: str, version: str, digest: str | None = None) -> str:
    """`name==version --hash=sha256:…` with the digest the index publishes for that wheel."""
    with urllib.request.urlopen(f"{index}/{project}/") as page:
        links = re.findall(r'href="[^"]*/([^/"]+)#sha256=([0-9a-f]{64})"', page.read().decode())
    published = next(d for f, d in links if f.startswith(f"{project}-{version}-"))
    return f"{project}=={version} --hash=sha256:{digest or published}\n"


def build_lock_stage(rig, base_cf, standin: str, index: str, tmp_path: Path, lock: str, tag: str, before: str = ""):
    context = tmp_path / "lock-context"
    (context / LOCK_DIR).mkdir(parents=True)
    (context / LOCK_DIR / "base-requirements.txt").write_text(lock)
    copy = next(i for i in base_cf.instructions("COPY") if LOCK_DIR in i["value"])
    install = next(i for i in base_cf.instructions("RUN") if "--require-hashes" in i["value"] and "pip check" in i["value"])
    containerfile = context / "Containerfile"
    containerfile.write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nARG BASE_IMAGE\nARG PIP_INDEX_URL\n" + before + copy["content"] + install["content"]
    )
    return rig.bud(containerfile, context, tag, {"BASE_IMAGE": standin, "PIP_INDEX_URL": index}, check=False)


def test_base_installs_exactly_the_hash_lock(image_rig, standin_base, package_index, base_cf, tmp_path):
    lock = index_lock_line(package_index["primary"], "mlapp", "0.2.0")
    tag = "localhost/ml-dev-env-base:lock"
    proc = build_lock_stage(image_rig, base_cf, standin_base, package_index["primary"], tmp_path, lock, tag)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    script = (
        "import importlib.metadata as md, json; "
        "print(json.dumps({'mlapp': md.version('mlapp'), 'torch': md.version('torch'), "
        "'lock': open('/etc/ml-dev-env/base-requirements.txt').read(), "
        "'constraints': open('/etc/ml-dev-env/constraints.txt').read()}))"
    )
    result = json.loads(image_rig.run_in(tag, "python3", "-c", script).stdout.strip().splitlines()[-1])
    assert result == {"mlapp": "0.2.0", "torch": STANDIN_TORCH_VERSION, "lock": lock, "constraints": f"torch=={STANDIN_TORCH_VERSION}\n"}


def test_base_tolerates_a_conflict_the_base_image_already_had(image_rig, standin_base, package_index, base_cf, tmp_path):
    # the "base image" ships torchgreedy, whose torch>=2.10 its own torch does not meet
    before = "RUN python3 -m pip install --no-deps --index-url ${PIP_INDEX_URL} torchgreedy==1.0.0\n"
    lock = index_lock_line(package_index["primary"], "mlapp", "0.1.0")
    proc = build_lock_stage(image_rig, base_cf, standin_base, package_index["primary"], tmp_path, lock, "localhost/lock:old", before)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.mark.parametrize(
    "entry, message",
    [
        # a tampered or substituted download
        (lambda index: index_lock_line(index, "mlapp", "0.2.0", digest="0" * 64), "DO NOT MATCH THE HASHES"),
        # an entry without a hash
        (lambda index: "mlapp==0.2.0\n", "Hashes are required in --require-hashes mode"),
        # a lock whose package needs another torch than the base's: a conflict the lock introduced
        (lambda index: index_lock_line(index, "torchgreedy", "1.0.0"), "the base lock conflicts with a package of"),
        # a lock that would replace the base's torch
        (lambda index: index_lock_line(index, "torch", "2.10.0"), "The user requested (constraint) torch==2.9.0a0+standin"),
    ],
    ids=["wrong-hash", "no-hash", "new-conflict", "replaces-torch"],
)
def test_base_lock_install_fails(image_rig, standin_base, package_index, base_cf, tmp_path, entry, message):
    lock = entry(package_index["primary"])
    proc = build_lock_stage(image_rig, base_cf, standin_base, package_index["primary"], tmp_path, lock, "localhost/lock:bad")
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-4000:]
