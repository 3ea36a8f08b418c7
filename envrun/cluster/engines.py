"""Every host's engine connected at once: 32 hosts behind ssh are 32 handshakes, and one host that accepts
and then hangs must cost the connect deadline once, not once per host after it.

:func:`connected` is for commands that need every host (``up``, the engine's view before a job): the first
failure, in the cluster file's order, is raised once every attempt has ended, and the engines that did
answer are closed. :func:`each_connected` is for commands that carry on past a lost host (``status``,
``down``): each host's engine, or why it could not be reached.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from envbuild.engine.calls import CONNECT_TIMEOUT
from envbuild.engine.client import Engine
from envbuild.errors import EnvbuildError

MAX_PARALLEL = 32  # ssh masters started at once; more hosts wait for a free slot


def _attempt(url: str, connect_timeout: float) -> Engine | EnvbuildError:
    try:
        return Engine.connect(url, connect_timeout=connect_timeout)
    except EnvbuildError as exc:
        return exc


@contextmanager
def each_connected(
    urls: Iterable[str], connect_timeout: float = CONNECT_TIMEOUT
) -> Iterator[dict[str, Engine | EnvbuildError]]:
    """Each host's engine (or the error that kept it out of reach), all closed on exit."""
    unique = list(dict.fromkeys(urls))
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(unique)))) as pool:
        futures = {url: pool.submit(_attempt, url, connect_timeout) for url in unique}
    answers = {url: future.result() for url, future in futures.items()}
    try:
        yield answers
    finally:
        for answer in answers.values():
            if isinstance(answer, Engine):
                answer.close()


@contextmanager
def connected(urls: Iterable[str], connect_timeout: float = CONNECT_TIMEOUT) -> Iterator[dict[str, Engine]]:
    """Every host's engine; the first host (in order) that could not be reached raises, after all tried."""
    with each_connected(urls, connect_timeout) as answers:
        yield {url: reached(answer) for url, answer in answers.items()}


def reached(answer: Engine | EnvbuildError) -> Engine:
    """The host's engine, or the error that kept it out of reach, raised."""
    if isinstance(answer, EnvbuildError):
        raise answer
    return answer
