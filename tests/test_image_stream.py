"""The build contexts streamed to the engine's BuildKit: each build gets only what its Dockerfile reads,
with fixed owners and times, and the package files only in the packages image's context."""

from __future__ import annotations

import hashlib
import io
import stat
import tarfile
from pathlib import Path

import docker
import pytest

from envbuild.engine.client import Engine
from envbuild.engine.transfer import ContextStream
from envbuild.image.assemble import BuildContext, assemble_context
from envbuild.image.plan import plan_context
from envbuild.image.render import PACKAGES_EPOCH, render_buildkit_image_dockerfile, render_dockerfile
from envbuild.image.stream import _data, buildkit_context, content_mtime_ns, packages_context, stream, tools_context
from envbuild.image.treestore import DIR_MTIME, TreeStore
from envbuild.lock import Package, PackageFile, Source
from tests.lib.baseimage import BaseImage
from tests.lib.pyindex import make_wheel
from tests.lib.tinylock import LOCK_SHA, tiny_lock

EPOCH = 1700000000  # the tiny lock's source_date_epoch


def assembled(tmp_path: Path) -> BuildContext:
    (tmp_path / "files").mkdir()
    wheel = make_wheel(tmp_path / "files", "tiny_pkg", "1.0")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = tiny_lock(packages=(Package("tiny_pkg", "1.0", (PackageFile(wheel.name, sha),)),))

    def export(source: Source, dest: Path) -> None:
        (dest / "pkg").mkdir()
        (dest / "pkg" / "__init__.py").write_text(f"NAME = {source.name!r}\n")
        (dest / "link").symlink_to("pkg/__init__.py")

    plan = plan_context(lock, lock_sha256=LOCK_SHA)
    store = TreeStore(tmp_path / "cache")
    return assemble_context(
        plan, render_dockerfile(plan), tmp_path / "context", export, lambda p, f: wheel, store=store
    )


def members(stream: ContextStream) -> list[tarfile.TarInfo]:
    data = b"".join(stream.chunks())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()


def test_the_image_context_holds_each_source_the_tools_and_metadata_and_no_package_file(tmp_path: Path) -> None:
    context = assembled(tmp_path)
    dockerfile = render_buildkit_image_dockerfile(context.plan)
    stream = buildkit_context(context, dockerfile)
    found = members(stream)
    names = [m.name for m in found]
    assert names == sorted(names, key=str.encode) and len(names) == len(set(names))
    assert not any(name.startswith(("wheels", "packages")) or name.endswith(".whl") for name in names)
    for source in ("core", "engine", "data", "kernels"):
        root = f"src/{source}"  # what its RUN bind-mounts (source=src/<name>)
        assert f"source={root}," in dockerfile
        assert {root, f"{root}/pkg/__init__.py", f"{root}/link", f"{root}/.envbuild-commit"} <= set(names)
    assert {
        "Dockerfile",
        "tools/tools.sh",
        "tools/clamp-mtimes",
    } <= set(names)
    assert not any(name.startswith("meta") for name in names)  # a layer envbuild writes at normalising
    by_name = {m.name: m for m in found}
    by_content = {
        f"src/{name}/{path.relative_to(root).as_posix()}": path.read_bytes()
        for name, root in context.source_dirs
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink()
    }
    assert by_name["src/core/link"].issym()
    assert by_name["tools/clamp-mtimes"].mode == 0o755
    for member in found:
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
        # the tools are the same for every epoch: their times must not follow it; a kept tree's
        # directories and links are at a fixed time, its files' times made from their content
        if member.name in by_content:
            expected = content_mtime_ns(hashlib.sha256(by_content[member.name]).digest()) // 10**9
        elif member.name.startswith("src"):
            expected = DIR_MTIME
        elif member.name.startswith("tools"):
            expected = PACKAGES_EPOCH
        else:
            expected = EPOCH
        assert member.mtime == expected, member.name
    assert stream.payload == sum(m.size for m in found if m.isfile())
    assert b"".join(stream.chunks()) == b"".join(buildkit_context(context, dockerfile).chunks())


def test_the_packages_context_holds_the_package_files_and_nothing_of_the_sources(tmp_path: Path) -> None:
    context = assembled(tmp_path)
    found = members(packages_context(context))
    assert [m.name for m in found] == [
        "Dockerfile",
        "packages",
        "packages/packages.sh",
        "packages/requirements.txt",
        "packages/stage_packages.py",
        "packages/wheels",
        "packages/wheels/tiny_pkg-1.0-py3-none-any.whl",
    ]
    assert all(m.mtime == PACKAGES_EPOCH for m in found)  # the packages image does not follow the epoch
    tools = members(tools_context(context.plan))
    assert [m.name for m in tools] == ["Dockerfile", "tools", "tools/clamp-mtimes", "tools/tools.sh"]
    assert all(m.mtime == PACKAGES_EPOCH for m in tools)


def test_the_written_directory_is_the_stream_and_every_mtime_follows_the_content(tmp_path: Path) -> None:
    """What the docker CLI's transport sends: the same members as the tar (modes, links), package files
    hard-linked from where they lie, and every other file's mtime made from its content."""
    context = assembled(tmp_path)
    stream = packages_context(context)
    assert stream.write_to is not None
    written = tmp_path / "written"
    written.mkdir()
    stream.write_to(written)
    tar = {m.name: m for m in members(stream)}
    on_disk = {p.relative_to(written).as_posix(): p for p in written.rglob("*")}
    assert set(on_disk) == set(tar)
    for name, member in tar.items():
        assert stat.S_IMODE(on_disk[name].lstat().st_mode) == member.mode, name
    wheel = next(p for n, p in on_disk.items() if n.startswith("packages/wheels/"))
    assert wheel.stat().st_ino == (context.path / "wheels" / wheel.name).stat().st_ino  # linked, not copied
    script = on_disk["packages/packages.sh"]
    assert script.stat().st_mtime_ns == content_mtime_ns(hashlib.sha256(script.read_bytes()).digest())
    assert content_mtime_ns(hashlib.sha256(b"a").digest()) != content_mtime_ns(hashlib.sha256(b"b").digest())


@pytest.mark.docker
def test_a_changed_file_of_the_same_size_is_sent_again_to_the_same_path(
    tmp_path: Path, docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    """The CLI re-sends only files whose size, mode or mtime changed since the last build from the same
    directory: a source whose pin moved keeps its sizes (and, in the tar, its epoch mtimes). Built twice
    from one path with one byte changed, the second image holds the new byte."""
    engine = Engine(docker_client)
    if engine.build_cli is None:
        pytest.fail("no docker CLI that builds with BuildKit: scripts/install-test-deps installs docker.io's")
    dockerfile = f"FROM {base_image.tag}\nRUN --mount=type=bind,source=src,target=/mnt cp /mnt/v /v\n".encode()
    path, images = tmp_path / "sync", []
    for content in (b"version 1\n", b"version 2\n"):
        entries = [_data("Dockerfile", dockerfile, 0o644, EPOCH), _data("src/v", content, 0o644, EPOCH)]
        built = engine.buildkit_build(stream(entries), context_dir=path)
        images.append(built.image_id)
        assert engine.read_file(built.image_id, "/v") == content
        assert not path.exists()  # removed after the build
    for image in images:
        engine.remove(image, force=True)
