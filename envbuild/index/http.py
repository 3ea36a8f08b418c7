"""How every HTTP request to a package index is made: tried again on what a second try can mend (a
connection refused, reset or lost before the answer, a timeout, a 5xx; never a name that does not
resolve, never once a body is being read), every body bounded as it comes, a plain reason for each
failure, and :class:`RangeFile`, a remote file read by ``Range`` requests (a wheel's metadata without
the wheel)."""

from __future__ import annotations

import codecs
import io
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import requests
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import MaxRetryError, NameResolutionError
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

from envbuild.deadline import Deadline, current, deadline_adapter, deadline_from_env
from envbuild.errors import RemoteError
from envbuild.index.pages import show

RETRIES = 3
BACKOFF = 0.5
CHUNK = 1 << 16


class _Retry(Retry):
    """urllib3's retries, but a host name that does not resolve is not asked again: it will not resolve
    a second later, and the user would only wait."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> _Retry:
        deadline = current()
        if isinstance(error, NameResolutionError) or (deadline is not None and deadline.expired):
            raise MaxRetryError(_pool, url, error)  # type: ignore[arg-type]  # urllib3 passes None itself
        return super().increment(method, url, response, error, _pool, _stacktrace)


def retrying(session: requests.Session, retries: int = RETRIES) -> requests.Session:
    """``session`` with every http(s) request tried up to ``retries`` times in all (GET only: every
    request this client makes): a connection refused, reset or lost before the answer's first byte
    (``RemoteDisconnected``), a timeout, or a 5xx answer is tried again after a backoff; the last 5xx
    answer is returned, for the caller to report. Nothing is retried once a body is being read."""
    retry = _Retry(
        total=max(0, retries - 1),
        status_forcelist=range(500, 600),
        allowed_methods=frozenset({"GET"}),
        backoff_factor=BACKOFF,
        raise_on_status=False,
        respect_retry_after_header=False,  # a hostile index must not make us sleep for hours
    )
    adapter = deadline_adapter(retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def bounded(response: requests.Response, limit: int, what: str, bound: str) -> Iterator[bytes]:
    """The body in chunks, refused as soon as it passes ``limit`` bytes (the declared length first)."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RemoteError(f"{what} is {declared} bytes, more than {bound} ({limit} bytes); refused")
    received = 0
    for chunk in response.iter_content(CHUNK):
        received += len(chunk)
        if received > limit:
            raise RemoteError(f"{what} passed {bound} ({limit} bytes); refused")
        yield chunk


def encoding(response: requests.Response) -> str:
    try:
        return codecs.lookup(response.encoding or "utf-8").name
    except LookupError:  # a charset nobody knows: read it as UTF-8, replacing what does not decode
        return "utf-8"


def reason(exc: BaseException) -> str:
    """A plain reason ("connection refused") instead of urllib3's nested repr."""
    text = repr(exc)
    for needle, said in (
        ("Connection refused", "connection refused"),
        ("NameResolutionError", "host name does not resolve"),
        ("Name or service not known", "host name does not resolve"),
        ("No route to host", "no route to host"),
        ("Network is unreachable", "network is unreachable"),
        ("CERTIFICATE_VERIFY_FAILED", "TLS certificate verification failed"),
        ("Connection reset", "connection reset by peer"),
    ):
        if needle in text:
            return said
    if isinstance(exc, requests.Timeout):
        return "timed out"
    if isinstance(exc, requests.exceptions.InvalidSchema):  # requests follows redirects only to http(s)
        return f"redirected to a URL that is not http(s): {show(str(exc).rsplit(' for ', 1)[-1])}"
    if isinstance(exc, RemoteError):
        return str(exc)
    return show(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__


class RangeFile(io.RawIOBase):
    """Bytes of a remote file fetched on demand with ``Range`` requests, in blocks, each block once.

    The first request asks for the file's tail (where a zip keeps its directory) and learns the size from
    ``Content-Range``. A server that ignores ranges (200) is read whole only if the file is small
    (``max_bytes``); every byte fetched counts against ``max_bytes``, so a hostile answer cannot make a
    metadata read into a download."""

    BLOCK = 1 << 16

    def __init__(
        self,
        session: requests.Session,
        url: str,
        timeout: tuple[float, float],
        max_bytes: int,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.session, self.url, self.timeout, self.max_bytes = session, url, timeout, max_bytes
        self.deadline = deadline_from_env() if deadline is None else deadline
        self.fetched = 0
        self.requests = 0
        self._blocks: dict[int, bytes] = {}  # offset -> bytes, from range answers
        self._pos = 0
        self.size = self._fetch_tail()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._pos + len(view), self.size)
        if end <= self._pos:
            return 0
        data = self._read(self._pos, end)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def _read(self, start: int, end: int) -> bytes:
        for offset, block in self._blocks.items():
            if offset <= start and end <= offset + len(block):
                return block[start - offset : end - offset]
        first = max(0, min(start, self.size - self.BLOCK)) if end - start < self.BLOCK else start
        last = min(self.size, max(end, first + self.BLOCK))
        block = self._request(f"bytes={first}-{last - 1}", expect=last - first)[1]
        self._blocks[first] = block
        return block[start - first : end - first]

    def _fetch_tail(self) -> int:
        total, block = self._request(f"bytes=-{self.BLOCK}")
        self._blocks[total - len(block)] = block
        return total

    def _request(self, ranges: str, expect: int | None = None) -> tuple[int, bytes]:
        self.requests += 1
        headers = {"Range": ranges, "Accept-Encoding": "identity"}
        try:
            with (
                Deadline(f"{self.url}: a range request", seconds=self.deadline),
                self.session.get(self.url, headers=headers, stream=True, timeout=self.timeout) as response,
            ):
                if response.status_code not in (200, 206):
                    raise RemoteError(f"{self.url}: HTTP {response.status_code} to a range request")
                whole = response.status_code == 200
                data = bytearray()
                for chunk in response.iter_content(1 << 16):
                    data += chunk
                    if self.fetched + len(data) > self.max_bytes:
                        why = "does not serve byte ranges and is" if whole else "needs"
                        raise RemoteError(f"{self.url} {why} more than {self.max_bytes} bytes to read its metadata")
                content_range = response.headers.get("Content-Range", "")
        except requests.RequestException as exc:
            raise RemoteError(f"{self.url}: {reason(exc)}") from None
        self.fetched += len(data)
        if whole:  # the server ignored the range: what came is the whole file
            self._blocks = {0: bytes(data)}
            return len(data), bytes(data[-self.BLOCK :]) if expect is None else bytes(data)
        total = content_range.rpartition("/")[2]
        if not total.isdigit() or (expect is not None and len(data) != expect):
            raise RemoteError(
                f"{self.url}: a malformed answer to a range request ({content_range or 'no Content-Range'})"
            )
        return int(total), bytes(data)
