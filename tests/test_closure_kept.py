"""The closure's verdict kept for the lock it judged (:mod:`envbuild.verify.closure_kept`), through
``verify_requirements`` as a build calls it: real wheels on a local index, the real caches."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import envbuild.verify.closure_kept as kept
import envbuild.verify.pins as pins
from envbuild.config import SourceOptions
from envbuild.lock import Lock
from envbuild.lock.model import Provides, Waiver
from envbuild.verify.pins import VerifyOptions, verify_requirements
from envbuild.verify.results import PinResult
from tests.lib.pyindex import PyIndex
from tests.test_closure import closure_lock, dists, in_file_cache, locked, src  # noqa: F401  (dists: a fixture)


def judged(results: list[PinResult]) -> list[tuple[object, ...]]:
    return [(r.kind, r.name, r.status, r.detail, r.facts) for r in results]


class Reads:
    """Counts the metadata reads of ``verify_requirements`` (each is a full closure check)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = pins.read_metadata

        def counted(*args: object, **kwargs: object) -> object:
            self.count += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(pins, "read_metadata", counted)


@dataclasses.dataclass
class Cached:
    """A lock of real wheels served by a local index, every file in the cache; the reads counted."""

    index: PyIndex
    lock: Lock
    cache: Path
    options: VerifyOptions
    reads: Reads


@pytest.fixture()
def cached(dists: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cached]:  # noqa: F811
    cache = tmp_path / "cache"
    with PyIndex(dists) as index:
        lock = closure_lock(index, src("beta", provides=Provides("beta", "0.1"), requires=("dep>=1",)))
        for package in lock.packages:
            in_file_cache(cache, dists / package.files[0].filename, package.files[0].sha256)
        yield Cached(index, lock, cache, VerifyOptions(SourceOptions(cache)), Reads(monkeypatch))


def test_a_moved_source_reads_the_kept_verdict_and_any_other_change_checks_again(cached: Cached) -> None:
    index, lock, cache, options, reads = cached.index, cached.lock, cached.cache, cached.options, cached.reads
    first = verify_requirements(lock, options)
    assert reads.count == 1 and (cache / "verify" / "closure" / "whole.json").is_file()
    assert index.requests == []  # every file in the cache: nothing asked of the index
    # one source moved (its commit and tree): the same verdict, read, not checked again
    moved = dataclasses.replace(lock, sources=(dataclasses.replace(lock.sources[0], commit="9" * 40, tree="8" * 40),))
    assert judged(verify_requirements(moved, options)) == judged(first) and reads.count == 1
    # what the check reads changed: checked again, each time
    beta = lock.sources[0]
    changes = {
        "a source's requirements": dataclasses.replace(
            lock, sources=(dataclasses.replace(beta, requires=("dep>=2",)),)
        ),
        "a waiver": dataclasses.replace(
            lock, sources=(dataclasses.replace(beta, waive=(Waiver("dep", "the test's reason"),)),)
        ),
        "a root": dataclasses.replace(lock, requirements=("app==1.0", "dep")),
        "a package's version": dataclasses.replace(
            lock, packages=(*lock.packages[:1], locked(index, "dep", "1.5", pin=False), *lock.packages[2:])
        ),
        # app's "old; python_version < '3.9'" applies
        "the platform": dataclasses.replace(lock, platform=dataclasses.replace(lock.platform, python="3.8")),  # type: ignore[arg-type]
    }
    for what, changed in changes.items():
        before = reads.count
        again = verify_requirements(changed, options)
        assert reads.count == before + 1, what
        assert judged(again) != judged(first) or what == "a package's version", what
    # the last verdict kept is the platform's; the first lock is checked again, then read
    verify_requirements(lock, options)
    assert reads.count == len(changes) + 2
    assert judged(verify_requirements(moved, options)) == judged(first) and reads.count == len(changes) + 2


def test_a_verdict_from_metadata_the_caches_do_not_hold_is_never_kept(
    dists: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Metadata an index served (here by PEP 658 or a range request, pinned or not) is checked each time:
    the verdict is kept only when every package's metadata was in the caches before the check."""
    reads = Reads(monkeypatch)
    cache = tmp_path / "cache"
    options = VerifyOptions(SourceOptions(cache))
    with PyIndex(dists) as index:
        lock = dataclasses.replace(
            closure_lock(index),
            packages=tuple(locked(index, p.name, p.version, pin=False) for p in closure_lock(index).packages),
        )
        verify_requirements(lock, options)
        verify_requirements(lock, options)
        assert reads.count == 2 and not (cache / "verify" / "closure").exists()
        offline = VerifyOptions(SourceOptions(cache, offline=True))  # offline, nothing cached: unknown each time
        results = verify_requirements(lock, offline)
        assert [r.status for r in results if r.name != "whole"] == ["unknown"] * 4 and reads.count == 3
        assert not (cache / "verify" / "closure").exists()


@pytest.mark.parametrize(
    "entry",
    [
        b'{"key": "',  # cut short
        b"[]",
        b'{"key": "KEY", "results": [["app", "fine", "d", null, false]]}',  # a status no check gives
        b'{"key": "KEY", "results": [["app", "ok", "d", null, 0]]}',  # build: not a boolean
        b'{"key": "KEY", "results": [["app", "ok", "d"]]}',
        b'{"key": "KEY", "results": "ok"}',
        b"\xff\xfe",
        None,  # a directory where the entry goes
        "fifo",
    ],
)
def test_an_entry_that_is_not_a_verdict_is_a_miss_and_replaced(cached: Cached, entry: bytes | str | None) -> None:
    lock, cache, options, reads = cached.lock, cached.cache, cached.options, cached.reads
    first = verify_requirements(lock, options)
    path = cache / "verify" / "closure" / "whole.json"
    key = json.loads(path.read_text())["key"]
    path.unlink()
    if entry is None:
        path.mkdir()
    elif entry == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(entry.replace(b"KEY", key.encode()))  # type: ignore[union-attr]
    assert judged(verify_requirements(lock, options)) == judged(first) and reads.count == 2
    if entry is not None and entry != "fifo":  # replaced by the verdict: read the next time
        assert json.loads(path.read_text())["key"] == key
        assert judged(verify_requirements(lock, options)) == judged(first) and reads.count == 2


def test_a_change_in_the_judging_code_checks_again(cached: Cached, monkeypatch: pytest.MonkeyPatch) -> None:
    verify_requirements(cached.lock, cached.options)
    monkeypatch.setattr(kept, "_code_digest", lambda: "another check")
    verify_requirements(cached.lock, cached.options)
    verify_requirements(cached.lock, cached.options)
    assert cached.reads.count == 2
