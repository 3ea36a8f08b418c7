"""With :mod:`.http` (how each request is made) and :mod:`.local` (a ``file://`` index), the only code that
talks to a package index (PEP 503/691 Simple API), over HTTP(S) or file://.

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

import contextlib
import gc
import hashlib
import io
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO
from urllib.parse import urlsplit

import requests
from packaging.utils import canonicalize_name

from envbuild.deadline import GRACE, Deadline, current, deadline_from_env, min_rate_from_env
from envbuild.errors import InputError, RemoteError
from envbuild.fileio import open_regular
from envbuild.index.http import RETRIES, RangeFile, bounded, decode_text, reason, retrying
from envbuild.index.local import copy_local, inside, read_file_index
from envbuild.index.pages import IndexFile, ProjectPage, parse_html, parse_json, scheme_of, show_url
from envbuild.index.wheelmeta import MAX_METADATA

__all__ = ["IndexClient", "IndexFile", "ProjectPage", "max_download_from_env", "project_url"]

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# PEP 691's recommended negotiation: JSON preferred, HTML accepted from indexes that lack JSON.
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
TIMEOUT = (10.0, 60.0)  # connect, read: a large project page (torch) takes a while to send
MAX_DOWNLOAD_ENV = "ENVBUILD_MAX_DOWNLOAD"
# Generous: the GLM-5.2 stack has wheels of about 1 GB. Raise it with $ENVBUILD_MAX_DOWNLOAD.
MAX_DOWNLOAD = 4 << 30
# PyPI's largest project pages (thousands of nightly files) are tens of MB; hundreds of MB is hostile.
MAX_PAGE = 64 << 20
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

# A metadata read fetches the zip's tail, its central directory (torch's is about 2 MB) and one member.
MAX_RANGE_BYTES = 32 << 20


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection while a page is parsed: a page's JSON is a dict per file, and each full
    collection walks every file of every page parsed before (201,000 for the real lock; the cycles are
    none). Measured on the real lock's `lock verify`: 0.9 s of its 4 s. The collector is left as it was
    found by the first of several threads parsing at once."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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
        self.max_page = max_page
        self.max_download = max_download_from_env() if max_download is None else max_download
        self._lock = threading.Lock()
        # A future per key, so two threads asking for one page wait for one request instead of making two.
        self._pages: dict[tuple[str, str], Future[ProjectPage]] = {}
        # An index found out of reach is not asked again this run: one wait per index, not per package.
        self._down: dict[str, str] = {}
        self._listed: dict[str, tuple[str, IndexFile]] = {}  # url -> (index, file)
        # Pages read by :meth:`prefetch` and not parsed yet: each the page's parse, or the error its read met.
        self._read: dict[tuple[str, str], Callable[[], ProjectPage]] = {}
        self.requests_made = 0

    def prefetch(self, projects: Iterable[tuple[str, str]], jobs: int) -> None:
        """Read the pages of ``projects`` ((index, name) pairs), ``jobs`` at a time, and parse none: each is
        parsed when :meth:`project` first asks for it, as if it had been fetched then, a failure included.
        Reading while other threads parse costs both: the real lock's 233 pages (88 MB, 201,000 files)
        took 3.1 s read and parsed by eight threads, 0.8 s read by eight and then 1.5 s parsed in one."""
        keys = list(dict.fromkeys((index.rstrip("/"), canonicalize_name(name)) for index, name in projects))
        with self._lock:
            keys = [key for key in keys if key not in self._pages and key not in self._read]

        def read(key: tuple[str, str]) -> None:
            try:
                parse = self._answer(*key)
            except RemoteError as exc:
                failure = exc.with_traceback(None)

                def parse() -> ProjectPage:
                    raise failure

            with self._lock:
                self._read[key] = parse

        if keys:
            with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(keys)))) as pool:
                list(pool.map(read, keys))

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
                with self._lock:
                    parse = self._read.pop(key, None)
                parse = parse if parse is not None else self._answer(*key)
                with _no_collection():
                    page = parse()
                with self._lock:
                    for listed in page.files:
                        self._listed.setdefault(listed.url, (page.index, listed))
                future.set_result(page)
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()

    def _answer(self, index: str, name: str) -> Callable[[], ProjectPage]:
        """The page of ``name`` read (a failure to reach or read it raised now), to be parsed: what the call
        returns (a malformed page raised then)."""
        url = project_url(index, name)
        if urlsplit(index).scheme == "file":
            page = read_file_index(index, name, url, self.max_page)
            return lambda: page
        with (
            Deadline(f"index {index}: the page for {name}", seconds=self.deadline),
            self._get(index, name, url) as response,
        ):
            if response.status_code == 404:
                return lambda: ProjectPage(index, name, (), found=False)
            if response.status_code != 200:
                raise RemoteError(f"index {index} answered HTTP {response.status_code} for {name} ({url})")
            content_type = response.headers.get("Content-Type", "")
            ctype = content_type.split(";")[0].strip().lower()
            is_json = ctype == JSON_TYPE or ctype.endswith("+json") or ctype == "application/json"
            if not is_json and ctype not in ("text/html", "application/vnd.pypi.simple.v1+html"):
                raise RemoteError(
                    f"index {index} answered {name} with unexpected content type {ctype[:80] or 'none'!r} "
                    f"({url}); is it a PEP 503/691 simple index?"
                )
            try:
                what = f"index {index}: the page for {name}"
                body = b"".join(bounded(response, self.max_page, what, "the page size limit"))
            except requests.RequestException as exc:
                raise RemoteError(f"index {index}: reading the page for {name} failed: {reason(exc)}") from None
            base = response.url or url
        if is_json:
            return lambda: parse_json(index, name, body, base)
        return lambda: parse_html(index, name, decode_text(body, content_type), base)

    def download(self, url: str, out: BinaryIO, timeout: tuple[float, float] = (10, 300)) -> None:
        """Stream one distribution file, as a project page listed it, into ``out``. The caller checks
        the sha256: this only moves bytes, and never more than the index stated (or the limit)."""
        index, listed = self._listed.get(url, (None, None))
        stated = listed.size if listed is not None else None
        shown = show_url(url)
        if stated is not None and stated > self.max_download:
            raise RemoteError(
                f"{shown}: refusing to download: the index states {stated} bytes, more than the limit of "
                f"{self.max_download} (raise ${MAX_DOWNLOAD_ENV} if that is right)"
            )
        if stated is not None:
            limit, bound = stated, "the size the index states"
        else:
            limit, bound = self.max_download, f"the download limit (${MAX_DOWNLOAD_ENV})"
        scheme = scheme_of(url)
        if scheme == "file" and index is not None and urlsplit(index).scheme == "file":
            copy_local(index, url, out, limit, bound)
            return
        if scheme not in ("http", "https"):
            raise RemoteError(f"{shown}: refusing to download: only http(s) URLs are fetched from an index")
        try:
            # identity: the sha256 is of the file's bytes, and nothing to decompress means nothing to inflate;
            # a host that labels the file gzip-encoded anyway has its bytes taken as sent (bounded's decode).
            headers = {"Accept-Encoding": "identity"}
            with (
                Deadline(f"{shown}: download", seconds=None, min_rate=self.min_rate, grace=self.grace) as deadline,
                self.session.get(url, stream=True, timeout=timeout, headers=headers) as response,
            ):
                if response.status_code != 200:
                    raise RemoteError(f"{shown}: HTTP {response.status_code}")
                for chunk in bounded(response, limit, shown, bound, decode=False):
                    deadline.received(len(chunk))
                    out.write(chunk)
        except requests.RequestException as exc:
            raise RemoteError(f"{shown}: download failed: {reason(exc)}") from None

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
            why = reason(exc)
            if (deadline := current()) is None or not deadline.expired:  # a slow page is that page's fault
                self._down[index] = why
            raise RemoteError(f"index {index} out of reach: {why} (while fetching {name})") from None
        except requests.RequestException as exc:
            raise RemoteError(f"index {index} out of reach for {name}: {reason(exc)}") from None
        if response.status_code >= 500:  # still, after every retry
            response.close()
            raise RemoteError(f"index {index} out of reach: HTTP {response.status_code} (while fetching {name})")
        return response

    # -- core metadata (PEP 658; else the wheel's own METADATA, by HTTP range requests) ------------

    def core_metadata(self, file: IndexFile, max_size: int = MAX_METADATA) -> bytes:
        """The file's core metadata as the index serves it beside the file (PEP 658), checked against the
        sha256 the page announced for it."""
        if file.core_metadata is None:
            raise RemoteError(f"{show_url(file.url)}: the index announces no core metadata for it")
        url = f"{file.url}.metadata"
        data = self._get_bounded(url, max_size)
        if file.core_metadata and hashlib.sha256(data).hexdigest() != file.core_metadata:
            raise RemoteError(f"{show_url(url)}: sha256 does not match the {file.core_metadata} its index announced")
        return data

    def open_ranges(self, url: str, *, index: str | None = None, max_bytes: int = MAX_RANGE_BYTES) -> BinaryIO:
        """A read-only, seekable file over HTTP range requests, reading no more than ``max_bytes`` in all:
        enough to read one member of a zip from its central directory without downloading the archive.
        A ``file://`` URL is opened directly, only when ``index`` is a ``file://`` index holding it."""
        scheme, shown = scheme_of(url), show_url(url)
        if scheme == "file":
            path = inside(index, url) if index and urlsplit(index).scheme == "file" else None
            if path is None:
                raise RemoteError(f"{shown}: a file URL is read only from the file:// index that lists it")
            try:
                # A FIFO inside the index is refused, not waited on for a writer; the handle outlives the check.
                with open_regular(path) as checked:
                    return os.fdopen(os.dup(checked.fileno()), "rb")
            except OSError as exc:
                raise RemoteError(f"{shown}: cannot read: {exc.strerror or exc}") from None
        if scheme not in ("http", "https"):
            raise RemoteError(f"{shown}: only http(s) URLs are read from an index")
        return io.BufferedReader(RangeFile(self.session, url, self.timeout, max_bytes, self.deadline))

    def _get_bounded(self, url: str, limit: int) -> bytes:
        shown = show_url(url)
        if scheme_of(url) not in ("http", "https"):
            raise RemoteError(f"{shown}: only http(s) URLs are read from an index")
        data = bytearray()
        try:
            with (
                Deadline(shown, seconds=self.deadline),
                self.session.get(url, stream=True, timeout=self.timeout) as response,
            ):
                if response.status_code != 200:
                    raise RemoteError(f"{shown}: HTTP {response.status_code}")
                for chunk in response.iter_content(1 << 16):
                    data += chunk
                    if len(data) > limit:
                        raise RemoteError(f"{shown}: more than {limit} bytes; refused")
        except requests.RequestException as exc:
            raise RemoteError(f"{shown}: {reason(exc)}") from None
        return bytes(data)
