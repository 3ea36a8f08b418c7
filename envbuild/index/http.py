"""How every HTTP request to a package index is made: tried again on what a second try can mend (a
connection refused, reset or lost before the answer, a timeout, a 5xx; never a name that does not
resolve, never once a body is being read), every body bounded as it comes, a plain reason for each
failure, and :class:`RangeFile`, a remote file read by ``Range`` requests (a wheel's metadata without
the wheel).

What a server says is read strictly: a number in a header is ASCII digits or not a number
(:func:`header_number`), a ``Content-Range`` must describe the bytes that came, a charset that is no
text encoding reads as UTF-8 (:func:`decode_text`), and every URL a message quotes has its user part
hidden."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import requests
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import MaxRetryError, NameResolutionError, ProtocolError, ReadTimeoutError, SSLError
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

from envbuild.deadline import Deadline, current, deadline_adapter, deadline_from_env
from envbuild.errors import RemoteError
from envbuild.httpreason import reason  # noqa: F401 (the index's callers take it from here)
from envbuild.index.pages import show, show_url

RETRIES = 3
BACKOFF = 0.5
CHUNK = 1 << 16
# A number as HTTP writes one: ASCII digits only ('²'.isdigit() is True and int('²') raises; int() takes
# '١٢', ' 12', '+12' and '1_2'), at most 20 of them (past any real size; int() refuses 4,301).
_NUMBER = r"[0-9]{1,20}"
_CONTENT_RANGE = re.compile(rf"bytes ({_NUMBER})-({_NUMBER})/({_NUMBER})")


def header_number(value: str | None) -> int | None:
    """A header's value as a byte count, or None when it is not ASCII digits."""
    return int(value) if value is not None and re.fullmatch(_NUMBER, value) else None


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


def as_sent(response: requests.Response) -> Iterator[bytes]:
    """The body in chunks as the server sent it, a ``Content-Encoding`` not undone: a file's sha256 is of
    its bytes, and a host that labels a ``.tar.gz`` ``Content-Encoding: gzip`` (S3 objects uploaded so, a
    web server's ``AddEncoding x-gzip .gz``) serves the file itself, as pip and uv read it. urllib3's
    errors become requests', as :meth:`requests.Response.iter_content` makes them."""
    try:
        yield from response.raw.stream(CHUNK, decode_content=False)
    except ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from None
    except ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc) from None
    except SSLError as exc:
        raise requests.exceptions.SSLError(exc) from None


def bounded(response: requests.Response, limit: int, what: str, bound: str, *, decode: bool = True) -> Iterator[bytes]:
    """The body in chunks, refused as soon as it passes ``limit`` bytes (the declared length first, when it
    is a number: one that is not, as urllib3 does, is no length, and the bytes that arrive are counted).
    ``decode=False``: the bytes as sent (:func:`as_sent`), for a file whose sha256 is checked."""
    declared = header_number(response.headers.get("Content-Length"))
    if declared is not None and declared > limit:
        raise RemoteError(f"{what} is {declared} bytes, more than {bound} ({limit} bytes); refused")
    received = 0
    for chunk in response.iter_content(CHUNK) if decode else as_sent(response):
        received += len(chunk)
        if received > limit:
            raise RemoteError(f"{what} passed {bound} ({limit} bytes); refused")
        yield chunk


def charset(content_type: str) -> str | None:
    """The ``charset`` parameter of a Content-Type header, or None. Not ``response.encoding``: requests
    gives every ``text/*`` answer without one ISO-8859-1, and a page's links are UTF-8 (as pip reads them)."""
    for parameter in content_type.split(";")[1:]:
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip("\"'") or None
    return None


def decode_text(body: bytes, content_type: str) -> str:
    """A server's text, by the charset its Content-Type names, else UTF-8; what does not decode is
    replaced. A charset Python does not know, one that is no text encoding (``base64``, ``zlib``: bytes to
    bytes, a LookupError) or one that fails whatever the error handler (``idna``, ``undefined``) reads as
    UTF-8: a page is trusted no further than the sha256s a lock pins, and its links are ASCII."""
    try:
        return body.decode(charset(content_type) or "utf-8", "replace")
    except (LookupError, UnicodeError):
        return body.decode("utf-8", "replace")


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
        self._blocks: dict[int, bytes] = {}  # offset -> bytes, from range answers
        self._pos = 0
        self.size, tail = self._request(f"bytes=-{self.BLOCK}")
        self._blocks[self.size - len(tail)] = tail

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
        block = self._request(f"bytes={first}-{last - 1}", start=first, expect=last - first)[1]
        self._blocks[first] = block
        return block[start - first : end - first]

    def _request(self, ranges: str, start: int | None = None, expect: int | None = None) -> tuple[int, bytes]:
        """(the file's size, the bytes) of one range request: ``start`` and ``expect`` bytes from there, or
        (both None) the file's tail."""
        headers = {"Range": ranges, "Accept-Encoding": "identity"}
        shown = show_url(self.url)
        try:
            with (
                Deadline(f"{shown}: a range request", seconds=self.deadline),
                self.session.get(self.url, headers=headers, stream=True, timeout=self.timeout) as response,
            ):
                if response.status_code not in (200, 206):
                    raise RemoteError(f"{shown}: HTTP {response.status_code} to a range request")
                whole = response.status_code == 200
                data = bytearray()
                for chunk in response.iter_content(1 << 16):
                    data += chunk
                    if self.fetched + len(data) > self.max_bytes:
                        why = "does not serve byte ranges and is" if whole else "needs"
                        raise RemoteError(f"{shown} {why} more than {self.max_bytes} bytes to read its metadata")
                content_range = response.headers.get("Content-Range", "")
        except requests.RequestException as exc:
            raise RemoteError(f"{shown}: {reason(exc)}") from None
        self.fetched += len(data)
        if whole:  # the server ignored the range: what came is the whole file
            if start is not None and len(data) != self.size:
                raise RemoteError(
                    f"{shown}: a range request answered with a file of {len(data)} bytes, not {self.size}"
                )
            self._blocks = {0: bytes(data)}
            if start is None:
                return len(data), bytes(data[-self.BLOCK :])
            # a later answer whole (a host behind a balancer whose backends differ): the part asked, not its start
            return self.size, bytes(data[start : start + (expect or 0)])
        total = _answers(content_range, len(data), start, expect)
        if total is None:
            said = show(content_range, 120) or "no Content-Range"
            raise RemoteError(f"{shown}: a malformed answer to a range request ({said})")
        return total, bytes(data)


def _answers(content_range: str, received: int, start: int | None, expect: int | None) -> int | None:
    """The file's size a ``Content-Range`` states, when it is ``bytes FIRST-LAST/SIZE`` in ASCII digits and
    describes the ``received`` bytes as the ones asked for (from ``start``, ``expect`` of them; the file's
    tail when ``start`` is None), else None: bytes placed at another offset than they came from would be
    read as another part of the zip."""
    match = _CONTENT_RANGE.fullmatch(content_range)
    if match is None:
        return None
    first, last, total = (int(group) for group in match.groups())
    if last - first + 1 != received or last >= total:
        return None
    if (start is None and last != total - 1) or (start is not None and first != start):
        return None
    return total if expect is None or received == expect else None
