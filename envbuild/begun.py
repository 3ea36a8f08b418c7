"""Work begun before it is asked for: each call started now in a thread pool that outlives the call, and its
answer (or its error) taken once, by the first ask of its key; a later ask does the work again. What a build
begins while Python loads the rest of it (the upstreams' listings, the whole fetches of pinned commits)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Begun(Generic[K, V]):
    """Answers begun by key, each taken once (thread-safe)."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._futures: dict[K, Future[V]] = {}
        self._lock = threading.Lock()

    def begin(self, work: Mapping[K, Callable[[], V]], jobs: int) -> None:
        """Each call of ``work`` whose key has no answer begun and not yet taken, started now, ``jobs`` at a
        time. The threads end with their calls (the process waits for them at exit, so none is cut off in
        the middle of writing a cache)."""
        with self._lock:
            wanted = {key: call for key, call in work.items() if key not in self._futures}
            if not wanted:
                return
            workers = max(1, min(jobs, len(wanted)))
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=self._thread_name)
            for key, call in wanted.items():
                self._futures[key] = pool.submit(call)
            pool.shutdown(wait=False)

    def take(self, key: K) -> Future[V] | None:
        """The answer begun for ``key``, taken (the next ask finds none), or None."""
        with self._lock:
            return self._futures.pop(key, None)
