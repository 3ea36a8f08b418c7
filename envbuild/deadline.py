"""A total deadline (and, for downloads, a minimum rate) on one HTTP request: to an index, to a registry.

A socket read timeout bounds each read, not a request: a server sending one byte every few seconds keeps
every read under it forever, in the headers as in the body. So each request runs inside a
:class:`Deadline`: a watchdog thread that, once the request is past its deadline (or, after a grace
period, slower than its minimum rate), shuts down every socket the request's thread took from the
connection pool, which ends the blocked read at once. What the request then raises, or a body that ends
early, is reported as the deadline passing, never as a short answer: :meth:`Deadline.__exit__` turns the
request's outcome into one :class:`RemoteError`, whatever form the cut took.

The sockets are known through :func:`deadline_adapter`, whose connection pools hand each connection
they give out to the deadline of the thread asking (a thread-local), so nothing else in the client needs
to see a socket. The bounds come from the client; ``$ENVBUILD_INDEX_DEADLINE`` (seconds per request)
and ``$ENVBUILD_MIN_RATE`` (bytes per second for a download) override the defaults.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from types import TracebackType
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.poolmanager import ProxyManager
from urllib3.util.retry import Retry

from envbuild.errors import InputError, RemoteError

__all__ = ["DEADLINE", "MIN_RATE", "Deadline", "deadline_adapter", "deadline_from_env", "min_rate_from_env"]

DEADLINE_ENV = "ENVBUILD_INDEX_DEADLINE"
MIN_RATE_ENV = "ENVBUILD_MIN_RATE"
# A page, a metadata file or a range read: torch's project page is a few MB, so minutes is plenty.
DEADLINE = 300.0
# A download may take long (wheels of 1 GB), but not at a trickle: after GRACE seconds its average rate
# must stay above MIN_RATE bytes per second.
MIN_RATE = 32 << 10
GRACE = 30.0
POLL = 0.1

_current = threading.local()


def _positive(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise InputError(f"${name}: expected a positive number, got {text!r}")
    return value


def deadline_from_env() -> float:
    """Seconds one request to an index may take in all: ``$ENVBUILD_INDEX_DEADLINE``, else :data:`DEADLINE`."""
    return _positive(DEADLINE_ENV, DEADLINE)


def min_rate_from_env() -> float:
    """Bytes per second a download must average after its grace period: ``$ENVBUILD_MIN_RATE``, else
    :data:`MIN_RATE`."""
    return _positive(MIN_RATE_ENV, MIN_RATE)


class Deadline:
    """``with Deadline(what, seconds=…):`` around one request and the reading of its body.

    ``seconds`` bounds the whole request (None: no total bound); ``min_rate`` (bytes per second, with
    :meth:`received` called for each chunk) bounds how slowly a body may arrive once ``grace`` seconds
    have passed. On exit, a request that the deadline cut raises ``RemoteError("<what>: …")``."""

    def __init__(
        self, what: str, *, seconds: float | None, min_rate: float | None = None, grace: float = GRACE
    ) -> None:
        self.what, self.seconds, self.min_rate, self.grace = what, seconds, min_rate, grace
        self.reason: str | None = None
        self._bytes = 0
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._start = 0.0
        self._outer: Deadline | None = None

    def received(self, count: int) -> None:
        self._bytes += count

    @property
    def expired(self) -> bool:
        return self.reason is not None

    def __enter__(self) -> Deadline:
        self._start = time.monotonic()
        self._outer = getattr(_current, "deadline", None)
        _current.deadline = self
        threading.Thread(target=self._watch, name="envbuild-deadline", daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        _current.deadline = self._outer
        self._done.set()
        cut = exc is None or isinstance(exc, (requests.RequestException, Urllib3Error, OSError, RemoteError))
        if self.reason is not None and cut:
            raise RemoteError(f"{self.what}: {self.reason}") from None

    def adopt(self, sock: socket.socket | None) -> None:
        """A socket the request's thread connected or took from the pool: cut it when the deadline passes.
        Sockets, not connections: http.client drops a connection's socket once a response that ends at
        close is under way, while the response goes on reading from it."""
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
        if self.expired:
            self._cut()

    def _watch(self) -> None:
        while not self._done.wait(POLL):
            elapsed = time.monotonic() - self._start
            if self.seconds is not None and elapsed > self.seconds:
                self.reason = f"no complete answer within the deadline of {self.seconds:g} s (${DEADLINE_ENV})"
            elif self.min_rate is not None and elapsed > self.grace and self._bytes < self.min_rate * elapsed:
                rate = self._bytes / elapsed
                self.reason = (
                    f"arriving at {rate:.0f} bytes/s after {elapsed:.0f} s, slower than the minimum of "
                    f"{self.min_rate:g} bytes/s (${MIN_RATE_ENV})"
                )
            if self.reason is not None:
                self._cut()

    def _cut(self) -> None:
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: nothing left to cut


def current() -> Deadline | None:
    return getattr(_current, "deadline", None)


class _AdoptingConnection:
    """Mixed into urllib3's connections: a socket connected is adopted by the connecting thread's deadline."""

    sock: socket.socket | None

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]  # the connection class this is mixed into
        if (deadline := current()) is not None:
            deadline.adopt(self.sock)


class _HTTPConnection(_AdoptingConnection, HTTPConnection):
    pass


class _HTTPSConnection(_AdoptingConnection, HTTPSConnection):
    pass


class _AdoptingPool:
    """Mixed into urllib3's pools: a kept-alive connection handed out is adopted by the asking thread's
    deadline (a new one is adopted when it connects)."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]  # the pool class this is mixed into
        if (deadline := current()) is not None:
            deadline.adopt(getattr(conn, "sock", None))
        return conn


class _HTTPPool(_AdoptingPool, HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(_AdoptingPool, HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _DeadlineAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """An HTTP(S) proxy ($HTTPS_PROXY …) reaches the index through a manager of its own, made here:
        its pools adopt their sockets too, so a request through a proxy is cut like a direct one. A SOCKS
        proxy's pools are urllib3's own (and PySocks is not a dependency): requests refuses the scheme."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):
            manager.pool_classes_by_scheme = POOLS
        return manager


def deadline_adapter(retry: Retry) -> HTTPAdapter:
    """requests' adapter with ``retry``, whose connections every :class:`Deadline` of this thread can cut."""
    return _DeadlineAdapter(max_retries=retry)
