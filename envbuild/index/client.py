"""The only module that talks to a package index (PEP 503/691 Simple API), over HTTP(S) or file://.

JSON (PEP 691) is asked for first; an index that only speaks HTML (PEP 503, as many mirrors do) is
read too, so a per-package index such as Ascend's is not refused for its format. Every failure to
reach or understand an index becomes a :class:`RemoteError` naming the index and the package.

An index is trusted no further than the sha256s the lock pins, so what it sends is bounded before it
is used: a page is refused the moment it passes ``max_page`` bytes (it is never read whole first), and
read by :mod:`envbuild.index.pages`, which refuses files that are not http(s) URLs and fields in a wrong
shape; a download is refused the moment it passes the size the index states for it (PEP 700 ``size``)
or, when none is stated, ``max_download`` (``$ENVBUILD_MAX_DOWNLOAD``, default 4 GiB; a stated size
above it is refused before any byte moves); a ``file://`` index serves only regular files inside it.
Every http(s) request runs under a :class:`~envbuild.deadline.Deadline`: a total deadline for a
page, a metadata file or a range read, a minimum rate for a download.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import os
import re
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO
from urllib.parse import urlsplit
from urllib.request import url2pathname

import requests
from packaging.utils import canonicalize_name
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import MaxRetryError, NameResolutionError
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

from envbuild.deadline import GRACE, Deadline, current, deadline_adapter, deadline_from_env, min_rate_from_env
from envbuild.errors import InputError, RemoteError
from envbuild.index.pages import IndexFile, ProjectPage, parse_html, parse_json, show
from envbuild.index.wheelmeta import MAX_METADATA

__all__ = ["IndexClient", "IndexFile", "ProjectPage", "max_download_from_env", "project_url"]

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# PEP 691's recommended negotiation: JSON preferred, HTML accepted from indexes that lack JSON.
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
TIMEOUT = (10.0, 60.0)  # connect, read: a large project page (torch) takes a while to send
RETRIES = 3
BACKOFF = 0.5
MAX_DOWNLOAD_ENV = "ENVBUILD_MAX_DOWNLOAD"
# Generous: the GLM-5.2 stack has wheels of about 1 GB. Raise it with $ENVBUILD_MAX_DOWNLOAD.
MAX_DOWNLOAD = 4 << 30
# PyPI's largest project pages (thousands of nightly files) are tens of MB; hundreds of MB is hostile.
MAX_PAGE = 64 << 20
CHUNK = 1 << 16
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

# A metadata read fetches the zip's tail, its central directory (torch's is about 2 MB) and one member.
MAX_RANGE_BYTES = 32 << 20


def project_url(index: str, name: str) -> str:
    return f"{index.rstrip('/')}/{canonicalize_name(name)}/"


def max_download_from_env() -> int:
    """``$ENVBUILD_MAX_DOWNLOAD`` (bytes, or with a K/M/G/T suffix), else :data:`MAX_DOWNLOAD`."""
    text = os.environ.get(MAX_DOWNLOAD_ENV, "").strip()
    if not text:
        return MAX_DOWNLOAD
    match = re.fullmatch(r"([0-9]+)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
    if match is None or int(match[1]) == 0:
        raise InputError(f"${MAX_DOWNLOAD_ENV}: expected a positive size such as 8G or 2147483648, got {text!r}")
    return int(match[1]) * _UNITS[match[2].upper()]


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


class IndexClient:
    """Fetches project pages, one request per (index, project) per run, safe to share between threads.

    The client remembers what each page said about each file URL, so :meth:`download` knows the size
    the index stated for it and which ``file://`` index (if any) listed it."""

    def __init__(
        self,
        session: requests.Session | None = None,
        *,
        timeout: tuple[float, float] = TIMEOUT,
        retries: int = RETRIES,
        max_page: int = MAX_PAGE,
        max_download: int | None = None,
        deadline: float | None = None,
        min_rate: float | None = None,
        grace: float = GRACE,
    ) -> None:
        self.session = retrying(session or requests.Session(), retries)
        self.timeout = timeout
        self.deadline = deadline_from_env() if deadline is None else deadline
        self.min_rate = min_rate_from_env() if min_rate is None else min_rate
        self.grace = grace
        self.retries = retries
        self.max_page = max_page
        self.max_download = max_download_from_env() if max_download is None else max_download
        self._lock = threading.Lock()
        # A future per key, so two threads asking for one page wait for one request instead of making two.
        self._pages: dict[tuple[str, str], Future[ProjectPage]] = {}
        # An index found out of reach is not asked again this run: one wait per index, not per package.
        self._down: dict[str, str] = {}
        self._listed: dict[str, tuple[str, IndexFile]] = {}  # url -> (index, file)
        self.requests_made = 0

    def project(self, index: str, name: str) -> ProjectPage:
        key = (index.rstrip("/"), canonicalize_name(name))
        with self._lock:
            future = self._pages.get(key)
            owner = future is None
            if owner:
                future = self._pages[key] = Future()
        assert future is not None
        if owner:
            try:
                page = self._fetch(*key)
                with self._lock:
                    for listed in page.files:
                        self._listed.setdefault(listed.url, (page.index, listed))
                future.set_result(page)
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()

    def _fetch(self, index: str, name: str) -> ProjectPage:
        url = project_url(index, name)
        if urlsplit(index).scheme == "file":
            return _read_file_index(index, name, url, self.max_page)
        with (
            Deadline(f"index {index}: the page for {name}", seconds=self.deadline),
            self._get(index, name, url) as response,
        ):
            if response.status_code == 404:
                return ProjectPage(index, name, (), found=False)
            if response.status_code != 200:
                raise RemoteError(f"index {index} answered HTTP {response.status_code} for {name} ({url})")
            ctype = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
            is_json = ctype == JSON_TYPE or ctype.endswith("+json") or ctype == "application/json"
            if not is_json and ctype not in ("text/html", "application/vnd.pypi.simple.v1+html"):
                raise RemoteError(
                    f"index {index} answered {name} with unexpected content type {ctype[:80] or 'none'!r} "
                    f"({url}); is it a PEP 503/691 simple index?"
                )
            try:
                what = f"index {index}: the page for {name}"
                body = b"".join(_bounded(response, self.max_page, what, "the page size limit"))
            except requests.RequestException as exc:
                raise RemoteError(f"index {index}: reading the page for {name} failed: {_reason(exc)}") from None
            base = response.url or url
            if is_json:
                return parse_json(index, name, body, base)
            return parse_html(index, name, body.decode(_encoding(response), "replace"), base)

    def download(self, url: str, out: BinaryIO, timeout: tuple[float, float] = (10, 300)) -> None:
        """Stream one distribution file, as a project page listed it, into ``out``. The caller checks
        the sha256: this only moves bytes, and never more than the index stated (or the limit)."""
        index, listed = self._listed.get(url, (None, None))
        stated = listed.size if listed is not None else None
        if stated is not None and stated > self.max_download:
            raise RemoteError(
                f"{url}: refusing to download: the index states {stated} bytes, more than the limit of "
                f"{self.max_download} (raise ${MAX_DOWNLOAD_ENV} if that is right)"
            )
        if stated is not None:
            limit, bound = stated, "the size the index states"
        else:
            limit, bound = self.max_download, f"the download limit (${MAX_DOWNLOAD_ENV})"
        scheme = urlsplit(url).scheme.lower()
        if scheme == "file" and index is not None and urlsplit(index).scheme == "file":
            _copy_local(index, url, out, limit, bound)
            return
        if scheme not in ("http", "https"):
            raise RemoteError(f"{show(url)}: refusing to download: only http(s) URLs are fetched from an index")
        try:
            # identity: the sha256 is of the file's bytes, and nothing to decompress means nothing to inflate.
            headers = {"Accept-Encoding": "identity"}
            with (
                Deadline(f"{url}: download", seconds=None, min_rate=self.min_rate, grace=self.grace) as deadline,
                self.session.get(url, stream=True, timeout=timeout, headers=headers) as response,
            ):
                if response.status_code != 200:
                    raise RemoteError(f"{url}: HTTP {response.status_code}")
                for chunk in _bounded(response, limit, url, bound):
                    deadline.received(len(chunk))
                    out.write(chunk)
        except requests.RequestException as exc:
            raise RemoteError(f"{url}: download failed: {_reason(exc)}") from None

    def _get(self, index: str, name: str, url: str) -> requests.Response:
        """The response (headers read, body not yet) to a page request; the session retries 5xx answers
        and lost connections (:func:`retrying`). An index out of reach is remembered for the run."""
        if index in self._down:
            raise RemoteError(f"index {index} out of reach: {self._down[index]} (while fetching {name})")
        with self._lock:
            self.requests_made += 1
        try:
            response = self.session.get(url, headers={"Accept": ACCEPT}, timeout=self.timeout, stream=True)
        except (requests.ConnectionError, requests.Timeout) as exc:
            reason = _reason(exc)
            if (deadline := current()) is None or not deadline.expired:  # a slow page is that page's fault
                self._down[index] = reason
            raise RemoteError(f"index {index} out of reach: {reason} (while fetching {name})") from None
        except requests.RequestException as exc:
            raise RemoteError(f"index {index} out of reach for {name}: {_reason(exc)}") from None
        if response.status_code >= 500:  # still, after every retry
            response.close()
            raise RemoteError(f"index {index} out of reach: HTTP {response.status_code} (while fetching {name})")
        return response

    # -- core metadata (PEP 658; else the wheel's own METADATA, by HTTP range requests) ------------

    def core_metadata(self, file: IndexFile, max_size: int = MAX_METADATA) -> bytes:
        """The file's core metadata as the index serves it beside the file (PEP 658), checked against the
        sha256 the page announced for it."""
        if file.core_metadata is None:
            raise RemoteError(f"{file.url}: the index announces no core metadata for it")
        url = f"{file.url}.metadata"
        data = self._get_bounded(url, max_size)
        if file.core_metadata and hashlib.sha256(data).hexdigest() != file.core_metadata:
            raise RemoteError(f"{url}: sha256 does not match the {file.core_metadata} its index announced")
        return data

    def open_ranges(self, url: str, *, index: str | None = None, max_bytes: int = MAX_RANGE_BYTES) -> BinaryIO:
        """A read-only, seekable file over HTTP range requests, reading no more than ``max_bytes`` in all:
        enough to read one member of a zip from its central directory without downloading the archive.
        A ``file://`` URL is opened directly, only when ``index`` is a ``file://`` index holding it."""
        scheme = urlsplit(url).scheme.lower()
        if scheme == "file":
            root = url2pathname(urlsplit(index).path) if index and urlsplit(index).scheme == "file" else None
            path = url2pathname(urlsplit(url).path)
            if root is None or os.path.commonpath([os.path.realpath(root), os.path.realpath(path)]) != os.path.realpath(
                root
            ):
                raise RemoteError(f"{url}: a file URL is read only from the file:// index that lists it")
            try:
                return open(path, "rb")
            except OSError as exc:
                raise RemoteError(f"{url}: cannot read: {exc.strerror or exc}") from None
        if scheme not in ("http", "https"):
            raise RemoteError(f"{url}: only http(s) URLs are read from an index")
        return io.BufferedReader(RangeFile(self.session, url, self.timeout, max_bytes, self.deadline))

    def _get_bounded(self, url: str, limit: int) -> bytes:
        if urlsplit(url).scheme.lower() not in ("http", "https"):
            raise RemoteError(f"{url}: only http(s) URLs are read from an index")
        data = bytearray()
        try:
            with (
                Deadline(url, seconds=self.deadline),
                self.session.get(url, stream=True, timeout=self.timeout) as response,
            ):
                if response.status_code != 200:
                    raise RemoteError(f"{url}: HTTP {response.status_code}")
                for chunk in response.iter_content(1 << 16):
                    data += chunk
                    if len(data) > limit:
                        raise RemoteError(f"{url}: more than {limit} bytes; refused")
        except requests.RequestException as exc:
            raise RemoteError(f"{url}: {_reason(exc)}") from None
        return bytes(data)


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
            raise RemoteError(f"{self.url}: {_reason(exc)}") from None
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


def _bounded(response: requests.Response, limit: int, what: str, bound: str) -> Iterator[bytes]:
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


def _copy_local(index: str, url: str, out: BinaryIO, limit: int, bound: str) -> None:
    """A file a ``file://`` index lists: only a regular file inside the index's directory."""
    root = os.path.realpath(url2pathname(urlsplit(index).path))
    path = os.path.realpath(url2pathname(urlsplit(url).path))
    if os.path.commonpath([root, path]) != root:
        raise RemoteError(f"{url}: refusing to read it: not inside the file:// index {index}")
    try:
        with open(path, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise RemoteError(f"{url}: refusing to read it: not a regular file")
            copied = 0
            while chunk := handle.read(CHUNK):
                copied += len(chunk)
                if copied > limit:
                    raise RemoteError(f"{url} passed {bound} ({limit} bytes); refused")
                out.write(chunk)
    except OSError as exc:
        raise RemoteError(f"{url}: cannot read: {exc.strerror or exc}") from None


def _encoding(response: requests.Response) -> str:
    try:
        return codecs.lookup(response.encoding or "utf-8").name
    except LookupError:  # a charset nobody knows: read it as UTF-8, replacing what does not decode
        return "utf-8"


def _reason(exc: BaseException) -> str:
    """A plain reason ("connection refused") instead of urllib3's nested repr."""
    text = repr(exc)
    for needle, reason in (
        ("Connection refused", "connection refused"),
        ("NameResolutionError", "host name does not resolve"),
        ("Name or service not known", "host name does not resolve"),
        ("No route to host", "no route to host"),
        ("Network is unreachable", "network is unreachable"),
        ("CERTIFICATE_VERIFY_FAILED", "TLS certificate verification failed"),
        ("Connection reset", "connection reset by peer"),
    ):
        if needle in text:
            return reason
    if isinstance(exc, requests.Timeout):
        return "timed out"
    if isinstance(exc, requests.exceptions.InvalidSchema):  # requests follows redirects only to http(s)
        return f"redirected to a URL that is not http(s): {show(str(exc).rsplit(' for ', 1)[-1])}"
    if isinstance(exc, RemoteError):
        return str(exc)
    return show(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__


def _read_file_index(index: str, name: str, url: str, limit: int) -> ProjectPage:
    """A file:// index is a directory per project holding ``index.json`` (PEP 691) or ``index.html``."""
    directory = Path(url2pathname(urlsplit(url).path))
    for leaf in ("index.json", "index.html"):
        path = directory / leaf
        try:
            with open(path, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise RemoteError(f"index {index}: {path} is not a regular file")
                data = handle.read(limit + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RemoteError(f"index {index}: cannot read {path}: {exc.strerror or exc}") from None
        if len(data) > limit:
            raise RemoteError(f"index {index}: the page for {name} ({path}) is larger than {limit} bytes; refused")
        if leaf == "index.json":
            return parse_json(index, name, data, path.as_uri())
        return parse_html(index, name, data.decode("utf-8", "replace"), path.as_uri())
    if not Path(url2pathname(urlsplit(index).path)).is_dir():
        raise RemoteError(f"index {index} out of reach: no such directory")
    return ProjectPage(index, name, (), found=False)
