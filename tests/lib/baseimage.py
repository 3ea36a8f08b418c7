"""The base image the service-backed tests build on: Debian bookworm with Python and a CANN-like tree.

No public registry is reachable from the test machines, so the image is made here, once, and cached:

1. ``debootstrap --variant=minbase --include=python3,python3-pip,python3-setuptools,python3-venv``
   bookworm into a scratch directory (the .debs are kept in a package cache for the next build);
2. a CANN-like toolkit tree is added (see ``cann_files``);
3. machine-local state (logs, apt lists, caches) and documentation are removed, the Python modules
   are compiled again for the epoch's mtime (see ``_recompile``), and the root filesystem is tarred
   deterministically (entries sorted by name, every mtime set to the recipe's epoch, numeric owners,
   no atime/ctime) into one image layer;
4. that layer, an image config with fixed timestamps and a manifest are written as a ``docker save``
   archive, which ``docker load`` turns into ``envbuild-test/base:bookworm-cann9.1.0``.

Loading a saved archive rather than ``docker import``-ing the rootfs tarball is deliberate: import stamps
the config with the current time, so every import gives a new image ID, while the config written here
is fixed, so the same cached archive always loads as the same image ID.

The archive is cached under ``/var/cache/envbuild-test/`` under a key that is a hash of the recipe,
so a second run on the same machine (even with an emptied engine) skips debootstrap; when the engine
already has the tag, nothing is done at all. The package versions come from the Debian mirror at build
time, so the image is stable on one machine, not identical across machines.

CANN layout (the ``ascend-toolkit`` layout that AscendHub's CANN images use, see upstream-facts §5)::

    /usr/local/Ascend/ascend-toolkit/set_env.sh
    /usr/local/Ascend/ascend-toolkit/latest -> 9.1.0
    /usr/local/Ascend/ascend-toolkit/9.1.0/version.cfg          toolkit_running_version=[...:9.1.0], ...
    /usr/local/Ascend/ascend-toolkit/9.1.0/<arch>-linux/ascend_toolkit_install.info   version=9.1.0

Tools read the version from either file (``latest/version.cfg`` is what most scripts ``cat``;
``latest/<arch>-linux/ascend_toolkit_install.info`` is what Ascend's install guides check). CANN 8.5+
installs by hand also use ``/usr/local/Ascend/cann-<version>``; images do not, so it is left out.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from envbuild.engine.transfer import TarSink
from envbuild.lock.platform import OCI_ARCH

BASE_IMAGE_TAG = "envbuild-test/base:bookworm-cann9.1.0"
CANN_VERSION = "9.1.0"
CANN_HOME = "/usr/local/Ascend/ascend-toolkit"
CACHE_DIR = Path(os.environ.get("ENVBUILD_TEST_CACHE_DIR", "/var/cache/envbuild-test"))
# The mirror is where the packages come from, not what goes in, so it is not part of the cache key.
DEBIAN_MIRROR = os.environ.get("ENVBUILD_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")

SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = ("python3", "python3-pip", "python3-setuptools", "python3-venv")
# The distro-managed Python distributions that brings (python3-wheel comes with python3-pip), in
# /usr/lib/python3/dist-packages as .egg-info directories whose files only dpkg lists: the Debian and
# Ubuntu case a lock that pins setuptools and wheel must handle (tests/test_image_engine_state.py).
DISTRO_PYTHON = {"setuptools": "66.1.1", "wheel": "0.38.4"}
# Every timestamp in the image: files, config and history (2025-05-20, the bookworm snapshot here).
EPOCH = 1747699200
EPOCH_ISO = "2025-05-20T00:00:00Z"
# Bump when anything below changes in a way the other recipe fields do not show.
RECIPE_REVISION = 3  # 3: bytecode that matches the epoch's mtimes (_recompile)

# Machine-local state debootstrap leaves behind; none of it belongs in an image.
_SCRUB = (
    "var/cache/apt/archives",
    "var/cache/apt/pkgcache.bin",
    "var/cache/apt/srcpkgcache.bin",
    "var/cache/ldconfig/aux-cache",
    "var/lib/apt/lists",
    "var/log",
    "debootstrap",
)
_EMPTY = ("etc/machine-id", "etc/hostname", "etc/resolv.conf")
# Documentation and translations: a quarter of the image, and every registry test pushes the image.
_SLIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale")
_SLIM_KEEP = ("copyright", "locale.alias")


@dataclass(frozen=True)
class BaseImage:
    """The test base image as the engine has it."""

    tag: str
    image_id: str  # "sha256:<64 hex>", the config digest
    cann_version: str
    cann_home: str
    archive: Path  # the cached `docker save` archive it was loaded from


def _docker_arch() -> str:
    machine = platform.machine()
    return OCI_ARCH.get(machine, machine)


def cann_files(arch: str | None = None) -> dict[str, str]:
    """The CANN-like files, path inside the image -> content (``latest`` is a symlink, made apart)."""
    arch = arch or platform.machine()
    version_dir = f"{CANN_HOME}/{CANN_VERSION}"
    inner = f"7.9.0.1.100:{CANN_VERSION}"  # "<inner version>:<release>", as real version.cfg files have
    components = ("runtime", "compiler", "hccl", "opp", "toolkit", "aoe", "ncs", "opp_kernel")
    version_cfg = "".join(f"{name}_running_version=[{inner}]\n" for name in components)
    version_cfg += "".join(f"{name}_upgrade_version=[{inner}]\n" for name in components)
    install_info = (
        "package_name=Ascend-cann-toolkit\n"
        f"version={CANN_VERSION}\n"
        "innerversion=V100R001C91SPC001B100\n"
        f"arch={arch}\n"
        "os=linux\n"
        f"path={version_dir}/{arch}-linux\n"
    )
    set_env = f"""\
# CANN-like environment for envbuild's tests: the paths of a real toolkit, without its binaries.
export ASCEND_TOOLKIT_HOME={CANN_HOME}/latest
export ASCEND_HOME_PATH="$ASCEND_TOOLKIT_HOME"
export ASCEND_OPP_PATH="$ASCEND_TOOLKIT_HOME/opp"
export ASCEND_AICPU_PATH="$ASCEND_TOOLKIT_HOME"
export TOOLCHAIN_HOME="$ASCEND_TOOLKIT_HOME/toolkit"
export LD_LIBRARY_PATH="$ASCEND_TOOLKIT_HOME/lib64${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
export PYTHONPATH="$ASCEND_TOOLKIT_HOME/python/site-packages${{PYTHONPATH:+:$PYTHONPATH}}"
export PATH="$ASCEND_TOOLKIT_HOME/bin:$PATH"
"""
    return {
        f"{CANN_HOME}/set_env.sh": set_env,
        f"{version_dir}/version.cfg": version_cfg,
        f"{version_dir}/{arch}-linux/ascend_toolkit_install.info": install_info,
        f"{version_dir}/lib64/.keep": "",
        f"{version_dir}/bin/.keep": "",
        f"{version_dir}/python/site-packages/.keep": "",
    }


def image_config(diff_id: str, recipe_key: str) -> dict[str, Any]:
    """The image config, fixed but for the layer's digest: the same layer gives the same image ID."""
    return {
        "architecture": _docker_arch(),
        "os": "linux",
        "created": EPOCH_ISO,
        "config": {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
            ],
            "Cmd": ["/bin/bash"],
            "Labels": {
                "io.envbuild.test.recipe": recipe_key,
                "io.envbuild.test.cann": CANN_VERSION,
            },
        },
        "history": [
            {
                "created": EPOCH_ISO,
                "created_by": (
                    f"debootstrap --variant={VARIANT} --include={','.join(INCLUDE)} {SUITE}"
                    f" + CANN-like {CANN_HOME} {CANN_VERSION} (tests/lib/baseimage.py)"
                ),
            }
        ],
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }


def recipe_key() -> str:
    """Hash of everything that decides the image's content (the cache key)."""
    recipe = {
        "revision": RECIPE_REVISION,
        "suite": SUITE,
        "variant": VARIANT,
        "include": list(INCLUDE),
        "arch": _docker_arch(),
        "epoch": EPOCH,
        "cann": cann_files(),
        "scrub": list(_SCRUB),
        "empty": list(_EMPTY),
        "slim": [list(_SLIM), list(_SLIM_KEEP)],
        "config": image_config("sha256:" + "0" * 64, ""),
        "tag": BASE_IMAGE_TAG,
    }
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def ensure_base_image(client: docker.DockerClient) -> BaseImage:
    """Return the base image, loading the cached archive or building it first when needed."""
    key = recipe_key()
    archive = CACHE_DIR / f"base-{key}.docker.tar"
    found = _image_with_recipe(client, key)
    if found is not None:
        return BaseImage(BASE_IMAGE_TAG, found, CANN_VERSION, CANN_HOME, archive)
    previous = _tagged_image_id(client)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # One builder per machine: parallel sessions wait here instead of debootstrapping twice.
    with _locked(CACHE_DIR / f"base-{key}.lock"):
        if not archive.exists():
            build_archive(archive, key)
            _prune_other_archives(key)
        with archive.open("rb") as stream:
            client.images.load(stream)
    found = _image_with_recipe(client, key)
    if previous is not None and previous != found:
        # The image of an older recipe lost its tag; drop it unless a container still uses it.
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(previous)
    if found is None:
        raise RuntimeError(f"loaded {archive} but the engine has no {BASE_IMAGE_TAG} from recipe {key}")
    return BaseImage(BASE_IMAGE_TAG, found, CANN_VERSION, CANN_HOME, archive)


def _image_with_recipe(client: docker.DockerClient, key: str) -> str | None:
    try:
        image = client.images.get(BASE_IMAGE_TAG)
    except docker.errors.ImageNotFound:
        return None
    labels = image.attrs.get("Config", {}).get("Labels") or {}
    return image.id if labels.get("io.envbuild.test.recipe") == key else None


def _tagged_image_id(client: docker.DockerClient) -> str | None:
    try:
        return client.images.get(BASE_IMAGE_TAG).id
    except docker.errors.ImageNotFound:
        return None


def _prune_other_archives(key: str) -> None:
    """Archives of older recipes are never used again; each is about 150 MB."""
    for path in CACHE_DIR.glob("base-*.docker.tar"):
        if path.name != f"base-{key}.docker.tar":
            path.unlink(missing_ok=True)
            path.with_name(path.name.replace(".docker.tar", ".lock")).unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_archive(archive: Path, key: str) -> None:
    """Debootstrap, add CANN, tar deterministically and write a ``docker save`` archive to *archive*."""
    work = Path(tempfile.mkdtemp(prefix=f"base-{key}.", dir=CACHE_DIR))
    rootfs = work / "rootfs"
    try:
        _debootstrap(rootfs)
        _add_cann(rootfs)
        _scrub(rootfs)
        _recompile(rootfs)
        layer = work / "layer.tar"
        _tar_rootfs(rootfs, layer)
        partial = work / "image.docker.tar"
        _write_saved_image(layer, partial, key)
        os.replace(partial, archive)  # atomic: a killed build never leaves a half archive behind
    finally:
        _remove_tree(work)


def _debootstrap(rootfs: Path) -> None:
    debs = CACHE_DIR / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    command = [
        "debootstrap",
        f"--variant={VARIANT}",
        f"--include={','.join(INCLUDE)}",
        f"--cache-dir={debs}",
        SUITE,
        str(rootfs),
        DEBIAN_MIRROR,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        log = rootfs / "debootstrap" / "debootstrap.log"
        if log.exists():
            tail += "\n--- debootstrap.log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"{' '.join(command)} failed with status {result.returncode}:\n{tail}")


def _add_cann(rootfs: Path) -> None:
    for inside, content in cann_files().items():
        target = rootfs / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(0o755 if inside.endswith(".sh") else 0o644)
    (rootfs / CANN_HOME.lstrip("/") / "latest").symlink_to(CANN_VERSION)


def _scrub(rootfs: Path) -> None:
    for relative in _SCRUB:
        path = rootfs / relative
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            if relative == "debootstrap":
                path.rmdir()
        elif path.exists() or path.is_symlink():
            path.unlink()
    for relative in _SLIM:
        top = rootfs / relative
        if not top.is_dir():
            continue
        for path in sorted(top.rglob("*"), reverse=True):  # children before their directories
            if path.name in _SLIM_KEEP and not path.is_dir():
                continue
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            else:
                path.unlink()
    for relative in _EMPTY:
        path = rootfs / relative
        if path.is_symlink():
            path.unlink()
        path.write_text("")
    # apt expects these to exist even when empty.
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "var/log/apt").mkdir(parents=True, exist_ok=True)


def _recompile(rootfs: Path) -> None:
    """Compile the image's Python modules again, for sources whose mtime is the epoch.

    A timestamp ``.pyc`` holds its source's mtime, and Python recompiles a module whose source says
    otherwise. dpkg's py3compile wrote this bytecode at install time, and the tar below sets every mtime
    to the epoch, so none of it would be valid any more: every Python process in the image (each build
    step's pip, the in-image check, a job) would compile pip, setuptools and the stdlib from source again
    (``pip list`` 2.0 s instead of 0.6 s here). A real base image's bytecode matches its sources; this
    one's must too."""
    tops = sorted(p for p in (rootfs / "usr/lib").glob("python3*") if p.is_dir() and not p.is_symlink())
    for top in tops:
        for source in top.rglob("*.py"):
            if source.is_symlink():  # its target is the module's source: within the rootfs, not here
                link = os.readlink(source)
                source = rootfs / link.lstrip("/") if link.startswith("/") else source.parent / link
            if source.is_file() and not source.is_symlink():
                os.utime(source, (EPOCH, EPOCH))
    inside = [f"/{top.relative_to(rootfs)}" for top in tops]
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    subprocess.run(
        [chroot, str(rootfs), "/usr/bin/python3", "-m", "compileall", "-q", "-f", *inside],
        check=True,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )


def _tar_rootfs(rootfs: Path, layer: Path) -> None:
    subprocess.run(
        [
            "tar",
            "--create",
            "--file",
            str(layer),
            "--directory",
            str(rootfs),
            "--format=gnu",
            "--sort=name",
            f"--mtime=@{EPOCH}",
            "--numeric-owner",
            "--one-file-system",
            ".",
        ],
        check=True,
        env={**os.environ, "LC_ALL": "C"},
    )


def _write_saved_image(layer: Path, out: Path, key: str) -> None:
    digest = hashlib.sha256()
    with layer.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    diff_id = "sha256:" + digest.hexdigest()
    config = json.dumps(image_config(diff_id, key), sort_keys=True, separators=(",", ":")).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = digest.hexdigest() + "/layer.tar"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [BASE_IMAGE_TAG], "Layers": [layer_name]}],
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as saved:
        _add_member(saved, config_name, io.BytesIO(config), len(config))
        _add_dir(saved, digest.hexdigest())
        with layer.open("rb") as stream:
            _add_member(saved, layer_name, stream, layer.stat().st_size)
        _add_member(saved, "manifest.json", io.BytesIO(manifest), len(manifest))


def _add_dir(saved: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = EPOCH
    saved.addfile(info)


def _add_member(saved: tarfile.TarFile, name: str, stream: Any, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = EPOCH
    saved.addfile(info, stream)


def _remove_tree(path: Path) -> None:
    """Delete a scratch tree, first unmounting anything a failed debootstrap left mounted in it."""
    if not path.exists():
        return
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)
    with open("/proc/self/mounts") as mounts:
        if any(line.split()[1].startswith(prefix) for line in mounts):
            raise RuntimeError(f"{path} still has mounts inside; not deleting it")
    shutil.rmtree(path)


# --- a multi-GB base: the test base plus a filler layer ------------------------------------------
#
# The real base (a CANN image) is several GB in tens of thousands of files. The benchmark's large base is
# the test base plus one layer of generated files under /usr/local/Ascend/filler: 20,000 small "kernel"
# files (4-96 KiB) and as many 64 MiB "libraries" as the size asks for. Content comes from a seeded
# generator (each MiB a quarter random, the rest zeros: about as compressible as real binaries, so a push
# does not spend minutes compressing noise), so the same size always gives the same image ID. The layer is
# generated straight into `docker load` (the base's layers are named in the manifest, not carried: the
# engine has them), so nothing of its size is ever written outside the engine; the engine keeps it.

FILLER_ROOT = "usr/local/Ascend/filler"
FILLER_SMALL_FILES = 20_000
FILLER_LIBRARY = 64 << 20
FILLER_REVISION = 1


def filler_files(total_bytes: int) -> list[tuple[str, int, int]]:
    """(path in the layer, size, seed) of every generated file, in the layer's (sorted) order."""
    files: list[tuple[str, int, int]] = []
    small = 0
    for index in range(FILLER_SMALL_FILES):
        size = 4096 + (index * 7919) % (92 * 1024)
        files.append((f"{FILLER_ROOT}/ops/kernel_{index:05d}.o", size, index))
        small += size
    for index in range(max(0, (total_bytes - small) // FILLER_LIBRARY)):
        files.append((f"{FILLER_ROOT}/lib64/libfiller{index:04d}.so", FILLER_LIBRARY, 1_000_000 + index))
    return sorted(files)


def _file_data(size: int, seed: int) -> Iterator[bytes]:
    import random

    generator = random.Random(seed)
    for offset in range(0, size, 1 << 20):
        chunk = min(1 << 20, size - offset)
        noise = min(chunk, 1 << 18)
        yield generator.randbytes(noise) + bytes(chunk - noise)


class _Chunks(io.RawIOBase):
    """A file object over an iterator of byte chunks, for tarfile.addfile."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.rest:
            try:
                self.rest = next(self.chunks)
            except StopIteration:
                return 0
        count = min(len(buffer), len(self.rest))
        buffer[:count], self.rest = self.rest[:count], self.rest[count:]
        return count


def filler_layer(total_bytes: int) -> Iterator[bytes]:
    """The filler layer's tar stream (deterministic: the same size gives the same bytes)."""
    sink = TarSink()
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.GNU_FORMAT) as tar:  # type: ignore[call-overload]
        made: set[str] = set()
        for path, size, seed in filler_files(total_bytes):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in made:
                    made.add(directory)
                    _add_dir(tar, directory)
                    yield from sink.drain()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = size, 0o644, EPOCH
            tar.addfile(info, io.BufferedReader(_Chunks(_file_data(size, seed)), 1 << 20))
            yield from sink.drain()
    yield from sink.drain()


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, EPOCH
    return info.tobuf(tarfile.GNU_FORMAT)


def _tar_member(name: str, data: bytes) -> bytes:
    return _tar_header(name, len(data)) + data + bytes(-len(data) % tarfile.BLOCKSIZE)


def filler_tag(gigabytes: float) -> str:
    return f"{BASE_IMAGE_TAG}-filler{gigabytes:g}g"


def ensure_filler_base(client: docker.DockerClient, gigabytes: float) -> BaseImage:
    """The test base with ``gigabytes`` of filler on top, loaded once and kept by the engine."""
    base = ensure_base_image(client)
    tag = filler_tag(gigabytes)
    key = hashlib.sha256(f"{base.image_id} {gigabytes} {FILLER_REVISION}".encode()).hexdigest()[:20]
    try:
        image = client.images.get(tag)
        if (image.attrs.get("Config", {}).get("Labels") or {}).get("io.envbuild.test.filler") == key:
            return BaseImage(tag, image.id, base.cann_version, base.cann_home, base.archive)
    except docker.errors.ImageNotFound:
        pass
    total = int(gigabytes * (1 << 30))
    digest, size = hashlib.sha256(), 0
    for chunk in filler_layer(total):  # first pass: the layer's digest and size, for the config
        digest.update(chunk)
        size += len(chunk)
    base_diff = client.api.inspect_image(base.image_id)["RootFS"]["Layers"]
    config = image_config(base_diff[0], recipe_key())  # the base's own config, as _write_saved_image wrote it
    config["rootfs"]["diff_ids"] = [*base_diff, "sha256:" + digest.hexdigest()]
    config["config"]["Labels"]["io.envbuild.test.filler"] = key
    config["history"].append(
        {"created": EPOCH_ISO, "created_by": f"filler: {gigabytes:g} GB under /{FILLER_ROOT} (tests/lib/baseimage.py)"}
    )
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = digest.hexdigest() + "/layer.tar"
    manifest = json.dumps(
        [
            {
                "Config": config_name,
                "RepoTags": [tag],
                "Layers": [f"{d.split(':')[1]}/layer.tar" for d in base_diff] + [layer_name],
            }
        ]
    ).encode()

    def archive() -> Iterator[bytes]:
        # Written by hand around the layer (headers, data, padding): tarfile would hold it all in memory.
        yield _tar_member(config_name, config_bytes) + _tar_member("manifest.json", manifest)
        yield _tar_header(layer_name, size)
        written = 0
        for chunk in filler_layer(total):
            written += len(chunk)
            yield chunk
        assert written == size, (written, size)
        yield bytes(-size % tarfile.BLOCKSIZE) + bytes(2 * tarfile.BLOCKSIZE)

    for _ in client.api.load_image(archive()):
        pass
    image = client.images.get(tag)
    return BaseImage(tag, image.id, base.cann_version, base.cann_home, base.archive)
