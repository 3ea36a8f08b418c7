"""The build contexts streamed to the engine: each build gets only what its Dockerfile reads, laid out
so that every COPY of the image creates nothing with the clock's time."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from envbuild.engine.transfer import ContextStream
from envbuild.image.assemble import BuildContext, assemble_context
from envbuild.image.plan import plan_context
from envbuild.image.render import PACKAGES_EPOCH, render_dockerfile, render_image_dockerfile
from envbuild.image.stream import image_context, packages_archive
from envbuild.lock import Package, PackageFile, Source
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
    return assemble_context(plan, render_dockerfile(plan), tmp_path / "context", export, lambda p, f: wheel)


def members(stream: ContextStream) -> list[tarfile.TarInfo]:
    data = b"".join(stream.chunks())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()


def test_the_image_context_holds_sources_from_slash_tools_and_metadata_and_no_package_file(tmp_path: Path) -> None:
    context = assembled(tmp_path)
    stream = image_context(context, render_image_dockerfile(context.plan))
    found = members(stream)
    names = [m.name for m in found]
    assert names == sorted(names, key=str.encode) and len(names) == len(set(names))
    assert not any(name.startswith("wheels") or name.endswith(".whl") for name in names)
    for source in ("core", "engine", "data", "kernels"):
        root = f"src/{source}/opt/envbuild/src/{source}"
        # every directory on the way from / is in the tar, so COPY src/<name>/ / creates none itself
        for directory in ("src", f"src/{source}", f"src/{source}/opt", f"src/{source}/opt/envbuild", root):
            assert directory in names
        assert {f"{root}/pkg/__init__.py", f"{root}/link", f"{root}/.envbuild-commit"} <= set(names)
    assert {
        "Dockerfile",
        "tools/opt/envbuild/bin/clamp-mtimes",
        "meta/opt/envbuild/meta/manifest.json",
        "meta/opt/envbuild/meta/inimage_probe.py",
        "meta/opt/envbuild/meta/requirements.txt",
    } <= set(names)
    by_name = {m.name: m for m in found}
    assert by_name["src/core/opt/envbuild/src/core/link"].issym()
    assert by_name["tools/opt/envbuild/bin/clamp-mtimes"].mode == 0o755
    for member in found:
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
        # the tools come before SOURCE_DATE_EPOCH in the Dockerfile: their mtimes must not follow it
        expected = PACKAGES_EPOCH if member.name.startswith("tools") else EPOCH
        assert member.mtime == expected, member.name
    assert stream.payload == sum(m.size for m in found)
    assert b"".join(stream.chunks()) == b"".join(image_context(context, render_image_dockerfile(context.plan)).chunks())


def test_the_packages_archive_holds_the_package_files_and_nothing_of_the_sources(tmp_path: Path) -> None:
    context = assembled(tmp_path)
    found = members(packages_archive(context))
    assert [m.name for m in found] == [
        "envbuild-packages",
        "envbuild-packages/clamp-mtimes",
        "envbuild-packages/requirements.txt",
        "envbuild-packages/stage_packages.py",
        "envbuild-packages/wheels",
        "envbuild-packages/wheels/tiny_pkg-1.0-py3-none-any.whl",
    ]
    assert {m.name: m.mode for m in found}["envbuild-packages/clamp-mtimes"] == 0o755
