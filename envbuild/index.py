"""The only module that talks to a package index (PEP 503/691 Simple API), over HTTP(S) or file://.

JSON (PEP 691) is asked for first; an index that only speaks HTML (PEP 503, as many mirrors do) is
read too, so a per-package index such as Ascend's is not refused for its format. Every failure to
reach or understand an index becomes a :class:`RemoteError` naming the index and the package.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urldefrag, urljoin, urlsplit
from urllib.request import url2pathname

import requests
from packaging.utils import canonicalize_name

from envbuild.errors import RemoteError

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# PEP 691's recommended negotiation: JSON preferred, HTML accepted from indexes that lack JSON.
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
TIMEOUT = (10.0, 60.0)  # connect, read: a large project page (torch) takes a while to send
RETRIES = 3
BACKOFF = 0.5
MAX_METADATA = 4 << 20  # a wheel's METADATA is kilobytes; a description may make it larger, not this
# A metadata read fetches the zip's tail, its central directory (torch's is about 2 MB) and one member.
MAX_RANGE_BYTES = 32 << 20


@dataclass(frozen=True)
class IndexFile:
    """One file an index lists for a project."""

    filename: str
    url: str
    sha256: str | None
    yanked: bool
    yanked_reason: str | None = None
    requires_python: str | None = None
    # PEP 658/714: the index serves the file's core metadata at ``<url>.metadata``. None: not announced;
    # "": announced without a hash; else its sha256.
    core_metadata: str | None = None


@dataclass(frozen=True)
class ProjectPage:
    """What an index lists for one project; ``found`` is False when the index does not know it (404)."""

    index: str
    name: str
    files: tuple[IndexFile, ...]
    found: bool = True

    def file(self, filename: str) -> IndexFile | None:
        return next((f for f in self.files if f.filename == filename), None)


def project_url(index: str, name: str) -> str:
    return f"{index.rstrip('/')}/{canonicalize_name(name)}/"


class IndexClient:
    """Fetches project pages, one request per (index, project) per run, safe to share between threads."""

    def __init__(
        self, session: requests.Session | None = None, *, timeout: tuple[float, float] = TIMEOUT, retries: int = RETRIES
    ) -> None:
        self.session = session or requests.Session()
        self.timeout = timeout
        self.retries = retries
        self._lock = threading.Lock()
        # A future per key, so two threads asking for one page wait for one request instead of making two.
        self._pages: dict[tuple[str, str], Future[ProjectPage]] = {}
        # An index found out of reach is not asked again this run: one wait per index, not per package.
        self._down: dict[str, str] = {}
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
                future.set_result(self._fetch(*key))
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()

    def _fetch(self, index: str, name: str) -> ProjectPage:
        url = project_url(index, name)
        if urlsplit(index).scheme == "file":
            return _read_file_index(index, name, url)
        response = self._get(index, name, url)
        if response.status_code == 404:
            return ProjectPage(index, name, (), found=False)
        if response.status_code != 200:
            raise RemoteError(f"index {index} answered HTTP {response.status_code} for {name} ({url})")
        ctype = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype == JSON_TYPE or ctype.endswith("+json") or ctype == "application/json":
            return _parse_json(index, name, response.content, response.url or url)
        if ctype in ("text/html", "application/vnd.pypi.simple.v1+html"):
            return _parse_html(index, name, response.text, response.url or url)
        raise RemoteError(
            f"index {index} answered {name} with unexpected content type {ctype or 'none'!r} "
            f"({url}); is it a PEP 503/691 simple index?"
        )

    def download(self, url: str, out: BinaryIO, timeout: tuple[float, float] = (10, 300)) -> None:
        """Stream one distribution file (as a project page listed it) into ``out``; file:// too.
        The caller checks the sha256: this only moves bytes."""
        if urlsplit(url).scheme == "file":
            try:
                with open(url2pathname(urlsplit(url).path), "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 20)
            except OSError as exc:
                raise RemoteError(f"{url}: cannot read: {exc.strerror or exc}") from None
            return
        try:
            with self.session.get(url, stream=True, timeout=timeout) as response:
                if response.status_code != 200:
                    raise RemoteError(f"{url}: HTTP {response.status_code}")
                for chunk in response.iter_content(1 << 20):
                    out.write(chunk)
        except requests.RequestException as exc:
            raise RemoteError(f"{url}: download failed: {_reason(exc)}") from None

    def _get(self, index: str, name: str, url: str) -> requests.Response:
        if index in self._down:
            raise RemoteError(f"index {index} out of reach: {self._down[index]} (while fetching {name})")
        last: Exception | None = None
        for attempt in range(self.retries):
            if attempt:
                time.sleep(BACKOFF * 2 ** (attempt - 1))
            with self._lock:
                self.requests_made += 1
            try:
                response = self.session.get(url, headers={"Accept": ACCEPT}, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as exc:
                last = exc
                if _is_name_error(exc):
                    break  # an unknown host will not resolve a second later; do not make the user wait
                continue
            except requests.RequestException as exc:
                raise RemoteError(f"index {index} out of reach for {name}: {_reason(exc)}") from None
            if response.status_code >= 500:
                last = RemoteError(f"HTTP {response.status_code}")
                continue
            return response
        assert last is not None
        reason = _reason(last)
        if not isinstance(last, RemoteError):
            self._down[index] = reason
        raise RemoteError(f"index {index} out of reach: {reason} (while fetching {name})") from None

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
        return io.BufferedReader(RangeFile(self.session, url, self.timeout, max_bytes))

    def _get_bounded(self, url: str, limit: int) -> bytes:
        if urlsplit(url).scheme.lower() not in ("http", "https"):
            raise RemoteError(f"{url}: only http(s) URLs are read from an index")
        data = bytearray()
        try:
            with self.session.get(url, stream=True, timeout=self.timeout) as response:
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

    def __init__(self, session: requests.Session, url: str, timeout: tuple[float, float], max_bytes: int) -> None:
        super().__init__()
        self.session, self.url, self.timeout, self.max_bytes = session, url, timeout, max_bytes
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
            with self.session.get(self.url, headers=headers, stream=True, timeout=self.timeout) as response:
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


def _json_announcement(item: dict[str, Any]) -> Any:
    value = item.get("core-metadata", item.get("dist-info-metadata", False))
    return False if value is None else value


def _announced_metadata(value: Any) -> str | None:
    """PEP 658/714's announcement as None (not announced), "" (served, without a hash) or the sha256 of
    the metadata file. JSON says ``false``, ``true`` or ``{"sha256": …}``; HTML ``data-core-metadata``
    is absent (False here), bare (None), ``true`` or ``sha256=…``."""
    if value is False or value == "false":
        return None
    sha: Any = None
    if isinstance(value, dict):
        sha = value.get("sha256")
    elif isinstance(value, str) and value.startswith("sha256="):
        sha = value[len("sha256=") :]
    if isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdefABCDEF" for c in sha):
        return sha.lower()
    return ""


def _is_name_error(exc: BaseException) -> bool:
    return "NameResolutionError" in repr(exc) or "Name or service not known" in str(exc)


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
    if isinstance(exc, RemoteError):
        return str(exc)
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _read_file_index(index: str, name: str, url: str) -> ProjectPage:
    """A file:// index is a directory per project holding ``index.json`` (PEP 691) or ``index.html``."""
    directory = Path(url2pathname(urlsplit(url).path))
    for leaf, parse in (("index.json", _parse_json), ("index.html", _parse_html)):
        path = directory / leaf
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RemoteError(f"index {index}: cannot read {path}: {exc.strerror or exc}") from None
        body: Any = data if leaf.endswith(".json") else data.decode("utf-8", "replace")
        return parse(index, name, body, path.as_uri())
    if not Path(url2pathname(urlsplit(index).path)).is_dir():
        raise RemoteError(f"index {index} out of reach: no such directory")
    return ProjectPage(index, name, (), found=False)


def _malformed(index: str, name: str, why: str) -> RemoteError:
    return RemoteError(f"index {index} answered a malformed page for {name}: {why}")


def _parse_json(index: str, name: str, body: bytes, base: str) -> ProjectPage:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _malformed(index, name, f"not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise _malformed(index, name, "no 'files' list (PEP 691)")
    files = []
    for i, item in enumerate(data["files"]):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("filename"), str)
            or not isinstance(item.get("url"), str)
            or not isinstance(item.get("hashes", {}), dict)
        ):
            raise _malformed(index, name, f"files[{i}] lacks a filename, url or hashes mapping")
        yanked = item.get("yanked", False)
        sha = item.get("hashes", {}).get("sha256")
        files.append(
            IndexFile(
                filename=item["filename"],
                url=urljoin(base, item["url"]),
                sha256=sha.lower() if isinstance(sha, str) else None,
                yanked=bool(yanked),
                yanked_reason=yanked if isinstance(yanked, str) and yanked else None,
                requires_python=item.get("requires-python") if isinstance(item.get("requires-python"), str) else None,
                core_metadata=_announced_metadata(_json_announcement(item)),
            )
        )
    return ProjectPage(index, name, tuple(files))


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def _parse_html(index: str, name: str, body: str, base: str) -> ProjectPage:
    parser = _Anchors()
    try:
        parser.feed(body)
    except Exception as exc:  # html.parser is lenient; this is only for pathological input
        raise _malformed(index, name, f"unreadable HTML ({exc})") from None
    files = []
    for anchor in parser.anchors:
        href = anchor.get("href")
        if not href:
            continue
        url, fragment = urldefrag(urljoin(base, href))
        algo, _, digest = fragment.partition("=")
        yanked = "data-yanked" in anchor
        files.append(
            IndexFile(
                filename=unquote(urlsplit(url).path.rsplit("/", 1)[-1]),
                url=url,
                sha256=digest.lower() if algo == "sha256" and digest else None,
                yanked=yanked,
                yanked_reason=(anchor.get("data-yanked") or None) if yanked else None,
                requires_python=anchor.get("data-requires-python"),
                core_metadata=_announced_metadata(
                    anchor.get("data-core-metadata", anchor.get("data-dist-info-metadata", False))
                ),
            )
        )
    return ProjectPage(index, name, tuple(files))
