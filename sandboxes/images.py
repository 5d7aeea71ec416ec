"""Offline sandbox images: a Debian rootfs from debootstrap, imported into Docker, tagged by content hash.

The rootfs is cached under `$ENVHUB_CACHE/rootfs/<hash>` and serves the bubblewrap backend as is;
`docker import` turns it into `envhub/base:<hash>`. Nothing is ever pulled from a registry.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from envhub.errors import SandboxError

BASE_REPOSITORY = "envhub/base"
RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "include": ["python3", "python3-pytest", "git", "procps"],
    "mirror": "http://deb.debian.org/debian",
    "user": "sandbox:1000:1000:/workspace",
    "recipe_version": 1,
}
_PASSWD_LINE = "sandbox:x:1000:1000:envhub sandbox:/workspace:/bin/bash\n"
_GROUP_LINE = "sandbox:x:1000:\n"


@dataclass(frozen=True)
class BuildReport:
    """What `build_base_image` did and how long each step took."""

    tag: str
    rootfs: Path
    rootfs_seconds: float
    import_seconds: float
    size_bytes: int
    cached: bool


def cache_dir() -> Path:
    """envhub's cache directory ($ENVHUB_CACHE, default ~/.cache/envhub)."""
    return Path(os.environ.get("ENVHUB_CACHE") or Path.home() / ".cache" / "envhub")


def recipe_hash() -> str:
    """A short content hash of the base image recipe; it names both the rootfs and the image tag."""
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]


def base_image_tag() -> str:
    """The Docker tag of the base image for the current recipe."""
    return f"{BASE_REPOSITORY}:{recipe_hash()}"


def rootfs_path() -> Path:
    """Where the base rootfs lives (it may not be built yet)."""
    return cache_dir() / "rootfs" / recipe_hash()


def ensure_rootfs(*, build: bool = True) -> Path:
    """The base rootfs directory, built with debootstrap first when missing (about a minute)."""
    path = rootfs_path()
    if (path / ".envhub-complete").exists():
        return path
    if not build:
        raise SandboxError("base rootfs missing", hint="run `envhub sandbox build`")
    if os.geteuid() != 0:
        raise SandboxError(
            "building the base rootfs needs root (debootstrap)",
            hint="run `sudo envhub sandbox build` or `make install`",
        )
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed", hint="run `make install` (apt-get install debootstrap)")
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(debootstrap_command(partial), capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise SandboxError("debootstrap failed: " + " | ".join(tail), hint="check that a Debian mirror is reachable")
    _add_sandbox_user(partial)
    shutil.rmtree(partial / "var" / "cache" / "apt" / "archives", ignore_errors=True)
    (partial / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    os.sync()  # the fsyncs eatmydata skipped, once for the whole tree, before the marker says it is complete
    (partial / ".envhub-complete").write_text(json.dumps(RECIPE, sort_keys=True))
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)
    return path


def debootstrap_command(target: Path) -> list[str]:
    """The debootstrap command line that builds the recipe's rootfs into `target`.

    Under `eatmydata` where it is installed (`make install` brings it): dpkg fsyncs every file it unpacks, and
    skipping those (one `sync` follows the build) cut the build from 115-119 s to 78-81 s on a 2-core EPYC, two runs
    each, another process busy; the files are the same.
    """
    command = [
        "debootstrap",
        f"--variant={RECIPE['variant']}",
        f"--include={','.join(RECIPE['include'])}",
        RECIPE["suite"],
        str(target),
        RECIPE["mirror"],
    ]
    eatmydata = shutil.which("eatmydata")
    return [eatmydata, *command] if eatmydata else command


def _add_sandbox_user(rootfs: Path) -> None:
    with open(rootfs / "etc" / "passwd", "a") as f:
        f.write(_PASSWD_LINE)
    with open(rootfs / "etc" / "group", "a") as f:
        f.write(_GROUP_LINE)
    workspace = rootfs / "workspace"
    workspace.mkdir(exist_ok=True)
    os.chown(workspace, 1000, 1000)


def docker_client():  # -> docker.DockerClient
    """A docker SDK client, or SandboxError naming the fix when no engine answers."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise SandboxError(
            f"Docker engine not reachable ({type(exc).__name__})",
            hint="run `make install` or `bash scripts/start-dockerd.sh` to start dockerd",
        ) from None
    return client


def image_exists(tag: str) -> bool:
    """True when the embedded engine has an image with this tag."""
    import docker.errors

    try:
        docker_client().images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_base_image(*, force: bool = False) -> BuildReport:
    """Build the rootfs and import it as `envhub/base:<hash>`; a no-op when both exist."""
    tag = base_image_tag()
    client = docker_client()
    cached = (rootfs_path() / ".envhub-complete").exists() and image_exists(tag)
    if cached and not force:
        return BuildReport(tag, rootfs_path(), 0.0, 0.0, client.images.get(tag).attrs["Size"], True)
    start = time.perf_counter()
    rootfs = ensure_rootfs()
    rootfs_seconds = time.perf_counter() - start
    start = time.perf_counter()
    tar = subprocess.Popen(
        ["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./.envhub-complete", "-c", "."], stdout=subprocess.PIPE
    )
    imported = subprocess.run(
        [
            "docker",
            "import",
            "--change",
            f"LABEL envhub.recipe={recipe_hash()}",
            "--change",
            "WORKDIR /workspace",
            "-",
            tag,
        ],
        stdin=tar.stdout,
        capture_output=True,
        text=True,
    )
    tar.wait()
    if imported.returncode != 0 or tar.returncode != 0:
        raise SandboxError(f"docker import failed: {imported.stderr.strip()}", hint="check `docker info`")
    import_seconds = time.perf_counter() - start
    return BuildReport(tag, rootfs, rootfs_seconds, import_seconds, client.images.get(tag).attrs["Size"], False)


def ensure_base_image() -> str:
    """The base image tag, building it first when missing (offline, from Debian packages)."""
    tag = base_image_tag()
    if not image_exists(tag):
        build_base_image()
    return tag


def require_base_image() -> str:
    """The base image tag; SandboxError with the fix when it has not been built."""
    tag = base_image_tag()
    if not image_exists(tag):
        raise SandboxError(f"base image {tag} missing", hint="run `envhub sandbox build`")
    return tag


def build_derived_image(files: dict[str, bytes], *, base: str | None = None, dest: str = "/workspace") -> str:
    """An image of `base` plus `files` (relative path -> bytes) under `dest`, tagged by content hash."""
    base = base or ensure_base_image()
    digest = hashlib.sha256(base.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    digest.update(dest.encode())
    tag = f"envhub/derived:{digest.hexdigest()[:16]}"
    if image_exists(tag):
        return tag
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        dockerfile = f"FROM {base}\nCOPY --chown=1000:1000 files/ {dest}/\n".encode()
        _add_bytes(tar, "Dockerfile", dockerfile)
        for name, data in files.items():
            _add_bytes(tar, f"files/{name}", data)
    context.seek(0)
    try:
        docker_client().images.build(
            fileobj=context, custom_context=True, tag=tag, pull=False, rm=True, labels={"envhub.derived-from": base}
        )
    except Exception as exc:
        raise SandboxError(
            f"building {tag} failed: {exc}", hint="check that the base image exists (`envhub sandbox build`)"
        ) from None
    return tag


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


IMAGE_LABEL = "envhub.image"  # set on every image envhub builds, so `envhub sandbox gc --images` can find them
PULL_TIMEOUT = 600.0


def missing_image_hint(tag: str) -> str:
    """How to get an image onto a machine that cannot pull it."""
    return (
        f"on a machine with network run `docker pull {tag} && docker save {tag} -o image.tar`, copy image.tar here "
        f"and run `docker load -i image.tar`; or build it locally (`envhub swe prepare --tasks FILE --build "
        f"--repos-dir DIR`)"
    )


def ensure_image(tag: str, *, pull: bool = True) -> bool:
    """Make sure the engine has `tag`: pulled from its registry when missing (True if it was pulled);
    SandboxError naming the image and how to build or `docker load` it when it cannot be had."""
    if image_exists(tag):
        return False
    if not pull:
        raise SandboxError(f"image {tag} is not on this machine (pulling disabled)", hint=missing_image_hint(tag))
    repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
    try:
        docker_client().images.pull(repository, tag=version or "latest")
    except Exception as exc:
        reason = str(getattr(exc, "explanation", None) or exc).strip().splitlines()[0][:200]
        raise SandboxError(
            f"image {tag} is not on this machine and cannot be pulled ({reason})", hint=missing_image_hint(tag)
        ) from None
    return True


def build_image(
    tag: str, files: dict[str, bytes], *, labels: dict[str, str] | None = None, key: str | None = None
) -> tuple[str, bool]:
    """Build `tag` from an in-memory context (`Dockerfile` + files) without network, cached by content hash
    (or by `key` when the context bytes are not reproducible); (tag, whether it was built now)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    content = key or digest.hexdigest()[:16]
    client = docker_client()
    try:
        if client.images.get(tag).labels.get("envhub.content-hash") == content:
            return tag, False
    except Exception:
        pass
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in sorted(files.items()):
            _add_bytes(tar, name, data)
    context.seek(0)
    try:
        client.images.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            pull=False,
            rm=True,
            forcerm=True,
            network_mode="none",
            labels={IMAGE_LABEL: "1", "envhub.content-hash": content, **(labels or {})},
        )
    except Exception as exc:
        raise SandboxError(
            f"building {tag} failed: {str(exc)[:500]}",
            hint="check the Dockerfile and that its FROM image exists locally",
        ) from None
    return tag, True


def remove_built_images(*, label: str | None = None) -> list[str]:
    """Remove the images envhub built (label `envhub.image`, and `label` when given) that no container uses."""
    client = docker_client()
    removed = []
    for image in client.images.list(filters={"label": [IMAGE_LABEL] + ([label] if label else [])}):
        for tag in image.tags or [image.id]:
            try:
                client.images.remove(tag, noprune=False)
                removed.append(tag)
            except Exception:
                pass  # still used by a container, or removed meanwhile
    return removed
