"""The build contexts streamed to the engine's BuildKit: each build gets only what its Dockerfile reads,
with fixed owners and times, and the package files only in the packages image's context."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from envbuild.engine.transfer import ContextStream
from envbuild.image.assemble import BuildContext, assemble_context
from envbuild.image.plan import plan_context
from envbuild.image.render import PACKAGES_EPOCH, render_buildkit_image_dockerfile, render_dockerfile
from envbuild.image.stream import buildkit_context, packages_context, tools_context
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
        "meta/manifest.json",
        "meta/inimage_probe.py",
        "meta/treehash.py",
        "meta/requirements.txt",
    } <= set(names)
    by_name = {m.name: m for m in found}
    assert by_name["src/core/link"].issym()
    assert by_name["tools/clamp-mtimes"].mode == 0o755
    for member in found:
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
        # the tools are the same for every epoch: their times must not follow it
        expected = PACKAGES_EPOCH if member.name.startswith("tools") else EPOCH
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
