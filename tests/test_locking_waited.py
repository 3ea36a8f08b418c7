"""held_lock says whether it waited for another holder: a lock taken free says nothing, one another holder
had first says it waited (a fetch under the lock asks the cache again only then)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from envbuild.locking import file_lock, held_lock


def test_a_free_lock_is_taken_without_waiting(tmp_path: Path) -> None:
    waited: list[bool] = []
    with held_lock(tmp_path / "x.lock", waiting=lambda: waited.append(True)) as fd:
        assert fd is not None
    assert waited == []


def test_a_held_lock_is_waited_for_and_says_so(tmp_path: Path) -> None:
    path, waited, order = tmp_path / "x.lock", [], []  # type: ignore[var-annotated]

    def take() -> None:
        with held_lock(path, waiting=lambda: waited.append(True)):
            order.append("second")

    with file_lock(path):  # another holder (flock is per open file: a second open of it waits)
        second = threading.Thread(target=take)
        second.start()
        time.sleep(0.2)
        order.append("first released")
    second.join(timeout=10)
    assert order == ["first released", "second"] and waited == [True]


def test_not_blocking_a_held_lock_gives_none_and_does_not_wait(tmp_path: Path) -> None:
    waited: list[bool] = []
    with (
        file_lock(tmp_path / "x.lock"),
        held_lock(tmp_path / "x.lock", blocking=False, waiting=lambda: waited.append(True)) as fd,
    ):
        assert fd is None
    assert waited == []
