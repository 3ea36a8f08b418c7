"""What a build begins as soon as its lock is read, before Python loads the rest of the builder (the docker
SDK, the image's stages: a tenth of a second or more), so that git and the docker CLI work meanwhile:

- the ``git ls-remote`` of every upstream its verify lists (:meth:`.GitCache.begin_listings`);
- for a lock the cache has no record of, the fetch of each pinned commit whose tree its verify checks
  (:meth:`.TreeExporter.begin_whole`), and the docker CLI's ``docker version``, by which the build picks
  its transport (:func:`.begin_choose_transport`). A lock built before is answered from its record, which
  needs neither.

Each is what the build does anyway, begun earlier, answered where the build asks for it, and only after the
checks made before git starts: a lock that fails them begins nothing, and its build refuses it as before.
"""

from __future__ import annotations

from envbuild.config import SourceOptions
from envbuild.engine.cli_build import begin_choose_transport
from envbuild.errors import InputError
from envbuild.git.treeexport import TreeExporter, source_pin
from envbuild.git.upstream import check_inputs
from envbuild.image.cache.ledger import read_built
from envbuild.lock.io import LockFile
from envbuild.lock.model import Lock
from envbuild.progress import Progress
from envbuild.verify.submodules import check_submodule_urls, recorded_submodules


def begin_build(read: LockFile, source: SourceOptions, say: Progress, *, no_cache: bool) -> TreeExporter | None:
    """The build's exporter for ``source`` with its work begun; None offline (nothing is begun) or when the
    lock's URLs are ones a verify refuses."""
    if source.offline:
        return None
    try:
        check_inputs(read.lock.sources, source.mirrors)
        check_submodule_urls(read.lock, source.mirrors)
    except InputError:
        return None
    exporter = TreeExporter(source.cache_dir, mirrors=source.mirrors)
    exporter.verify_cache.begin_listings(upstream_urls(read.lock, source), source.jobs)
    if no_cache or read_built(source.cache_dir, read.sha256) is None:
        pins = [source_pin(s) for s in read.lock.sources if s.tree is not None]
        exporter.begin_whole(pins, say, source.jobs)
        begin_choose_transport()
    return exporter


def upstream_urls(lock: Lock, source: SourceOptions) -> list[str]:
    """Each URL a verify of ``lock`` lists (after mirrors), once: every source's, and every submodule's the
    image does not skip."""
    urls = [source.mirrors.rewrite(s.repo) for s in lock.sources]
    for pinned in lock.sources:
        for pin in recorded_submodules(pinned, source.mirrors):
            if pin.record.repo is not None and pin.record.commit is not None and not pin.record.skipped:
                urls.append(source.mirrors.rewrite(pin.record.repo))
    return list(dict.fromkeys(urls))
