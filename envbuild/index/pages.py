"""One Simple API project page (PEP 691 JSON, PEP 503 HTML) read into typed values: pure, no I/O.

A page is what an index says, and an index is trusted no further than the sha256s the lock pins, so a
page is refused whole (one :class:`RemoteError` naming the index, the project and the field) when a
file it lists is not a plain file name at an http(s) URL once resolved against the page (or, as pip
reads a page, against its first ``<base href>``, itself resolved against the page; a ``file://`` index
may also list files inside its own directory), or when its size, sha256 or yanked field has the wrong
shape. Text from the page that reaches a message is escaped: no control character reaches a terminal.
Directory links of a served listing (the parent, sort links) are not files, and are skipped.

A link is parsed, not judged by its text: one that does not parse (``http://[::1/…``, a port that is no
number) refuses the page, as a link to ``ftp://`` does. A link with a user part
(``https://user:pass@host/…``) refuses the page too: pip would send those credentials to that host, but
a URL taken from a page flows into verify's table and JSON, the check's reports, fetch errors and
``lock export``, so envbuild takes none and hides a user part wherever it quotes one (:func:`show`);
the file host's credentials belong in ``~/.netrc``, which is read for that host only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any, NamedTuple
from urllib.parse import SplitResult, unquote, urldefrag, urljoin, urlsplit
from urllib.request import url2pathname

from envbuild.data.urls import redact_url, redact_urls
from envbuild.errors import RemoteError
from envbuild.escape import for_terminal

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
# An absolute http(s) URL of the plain shape an index's JSON page lists (a lower-case scheme, a host of
# letters, digits, dots and dashes, a path of URL characters; no port, user part, ';', query or fragment).
# Such a link resolves to itself against any page URL that parses, and passes every check
# :func:`_file_problem` makes of a URL, so it is taken as it is: the general path (two parses in
# ``urljoin``, two more in the checks) cost 20 us a file, most of a verify of the real lock's 200,000.
_PLAIN_URL = re.compile(r"https?://[A-Za-z0-9.-]+/[A-Za-z0-9._~!$&'()*+,=:@/%-]*")
# The same for an HTML page's links, which a mirror (bandersnatch, Nexus, Artifactory) writes relative to the
# page: "../../packages/ab/cd/…/name.whl#sha256=…". A page URL of a plain shape (http(s), a host, a port
# below 65536, a path of segments that are not dot segments, no query) and a link of leading "../" steps, then
# such segments, then a fragment of letters, digits and "=", resolve as urljoin resolves them: the page's
# directories less one a step (a step above the root is dropped, RFC 3986), then the link's segments. The
# URL made so passes every check _file_problem makes. On the real lock's pages a link cost 48 us the general
# way, 18 us so (benchmarks/bench_pages.py), most of it now html.parser's.
_SEGMENT = r"[A-Za-z0-9_~%+-][A-Za-z0-9._~%+-]*"  # no ".", "..", ":" (a scheme) or "@" (a user part)
_PLAIN_PAGE = re.compile(rf"(https?://[A-Za-z0-9.-]+(?::[0-9]{{1,5}})?)((?:/{_SEGMENT})*/?)")
_PLAIN_LINK = re.compile(rf"((?:\.\./)*)((?:{_SEGMENT}/)*{_SEGMENT})(?:#([A-Za-z0-9=]*))?")
_PLAIN_ABSOLUTE = re.compile(rf"({_PLAIN_URL.pattern})(?:#([A-Za-z0-9=]*))?")


class IndexFile(NamedTuple):
    """One file an index lists for a project. A named tuple, not a frozen dataclass: a verify of the real
    lock makes 201,000 of them (every file of its 233 pages), and a frozen dataclass's ``__init__`` (a
    ``object.__setattr__`` per field) took twice a tuple's time, 0.4 s of the whole."""

    filename: str
    url: str
    sha256: str | None
    yanked: bool
    yanked_reason: str | None = None
    size: int | None = None  # PEP 700: the size in bytes the index states, when it does
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


def show(text: str, limit: int = 200) -> str:
    """Text an index sent, safe for one line of a terminal: the user part of every URL in it hidden
    (before the cap, which could otherwise cut the '@' that marks it), control characters escaped,
    length capped."""
    text = redact_urls(text)
    return for_terminal(text[:limit]) + ("…" if len(text) > limit else "")


def show_url(url: str) -> str:
    """A URL for a message: its user part hidden (:func:`~envbuild.data.urls.redact_url`), escaped."""
    return show(redact_url(url), limit=500)


def split_url(url: str) -> SplitResult | None:
    """``url`` split, its port read, or None when it does not parse: urlsplit raises on a bracket without
    its pair (``http://[::1/``) or a host that NFKC-normalises to one holding '/', '?', '#', '@' or ':',
    and ``port`` on a port that is not a number below 65536."""
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return None
    return parts


def scheme_of(url: str) -> str:
    """The URL's scheme, lower case; "" when it does not parse (then nothing fetches it)."""
    parts = split_url(url)
    return parts.scheme.lower() if parts is not None else ""


def _resolve(base: str, href: str) -> str | None:
    """A link resolved against its page, or None when it does not parse (:func:`split_url`)."""
    try:
        url = urljoin(base, href)
    except ValueError:
        return None
    return url if split_url(url) is not None else None


_UNPARSED = "is not a valid URL (its host, port or IPv6 address is malformed)"


def _malformed(index: str, name: str, why: str) -> RemoteError:
    return RemoteError(f"index {index} answered a malformed page for {name}: {why}")


def _filename_problem(filename: object) -> str | None:
    if not isinstance(filename, str) or not filename or "/" in filename or not filename.isprintable():
        return f"filename {show(repr(filename))} is not a plain file name"
    return None


def _file_problem(index: str, filename: object, url: str) -> str | None:
    """Why a listed file cannot be taken as it is, or None: a plain file name and a URL to fetch."""
    if problem := _filename_problem(filename):
        return problem
    if not url.isprintable():
        return f"url {show(repr(redact_url(url)))} holds control characters"
    parts = split_url(url)
    if parts is None:
        return f"url {show_url(url)!r} {_UNPARSED}"
    if "@" in parts.netloc:
        return (
            f"url {show_url(url)!r} carries credentials in its user part; envbuild sends none it is handed "
            "by a page (give the file host's in ~/.netrc)"
        )
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        return None
    if scheme == "file" and urlsplit(index).scheme == "file":
        root = os.path.normpath(url2pathname(urlsplit(index).path))
        path = os.path.normpath(url2pathname(parts.path))
        if os.path.commonpath([root, path]) == root:
            return None
        return f"url {show_url(url)!r} is outside the file:// index"
    return f"url {show_url(url)!r} is not an http(s) URL"


def parse_json(index: str, name: str, body: bytes, base: str) -> ProjectPage:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _malformed(index, name, f"not JSON ({show(str(exc), 120)})") from None
    except RecursionError:
        raise _malformed(index, name, "not JSON (nested too deeply)") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise _malformed(index, name, "no 'files' list (PEP 691)")
    plain = split_url(base) is not None  # urljoin parses the page's URL first; one that does not fails it
    files = []
    for i, item in enumerate(data["files"]):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("filename"), str)
            or not isinstance(item.get("url"), str)
            or not isinstance(item.get("hashes", {}), dict)
        ):
            raise _malformed(index, name, f"files[{i}] lacks a filename, url or hashes mapping")
        url = item["url"]
        if plain and _PLAIN_URL.fullmatch(url):
            problem = _filename_problem(item["filename"])
        elif (url := _resolve(base, url)) is None:
            raise _malformed(index, name, f"files[{i}]: url {show_url(item['url'])!r} {_UNPARSED}")
        else:
            problem = _file_problem(index, item["filename"], url)
        if problem:
            raise _malformed(index, name, f"files[{i}]: {problem}")
        sha = item.get("hashes", {}).get("sha256")
        if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            raise _malformed(index, name, f"files[{i}]: hashes.sha256 {show(repr(sha), 80)} is not 64 hex digits")
        size = item.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise _malformed(index, name, f"files[{i}]: size {show(repr(size), 80)} is not a byte count")
        yanked = item.get("yanked", False)
        if not isinstance(yanked, (bool, str)):
            raise _malformed(index, name, f"files[{i}]: yanked {show(repr(yanked), 80)} is neither a bool nor a reason")
        announced = item.get("core-metadata", item.get("dist-info-metadata", False))
        files.append(
            IndexFile(
                filename=item["filename"],
                url=url,
                sha256=sha.lower() if sha else None,
                yanked=bool(yanked) if not isinstance(yanked, str) else True,
                yanked_reason=show(yanked) if isinstance(yanked, str) and yanked else None,
                size=size,
                core_metadata=_announced_metadata(False if announced is None else announced),
            )
        )
    return ProjectPage(index, name, tuple(files))


class _Anchors(HTMLParser):
    """A page's links, and the first ``<base>`` with an ``href`` wherever it stands, as pip takes it (an
    empty one leaves the page's own URL)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []
        self.base: str | None = None
        self.based = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))
        elif tag == "base" and not self.based and (href := dict(attrs).get("href")) is not None:
            self.based, self.base = True, href or None


def plain_page(base: str) -> tuple[str, list[str]] | None:
    """A page URL of the plain shape (:data:`_PLAIN_PAGE`) as its origin and its directories; else None."""
    matched = _PLAIN_PAGE.fullmatch(base)
    if matched is None or split_url(base) is None:  # a port of 65536 or more
        return None
    origin, path = matched.groups()
    return origin, path.split("/")[1:-1] if path else []


def plain_link(page: tuple[str, list[str]], href: str) -> tuple[str, str] | None:
    """``href`` resolved against a plain page (:func:`plain_page`) as ``(url, fragment)``, where the link has
    a plain shape (absolute or relative); None otherwise, for urljoin and the checks to judge."""
    if href.startswith(("https://", "http://")):
        if (absolute := _PLAIN_ABSOLUTE.fullmatch(href)) is None:
            return None
        return absolute[1], absolute[2] or ""
    if (relative := _PLAIN_LINK.fullmatch(href)) is None:
        return None
    steps, path, fragment = relative.groups()
    origin, directories = page
    kept = directories[: max(0, len(directories) - len(steps) // 3)]
    return "/".join((origin, *kept, path)), fragment or ""


def parse_html(index: str, name: str, body: str, base: str) -> ProjectPage:
    parser = _Anchors()
    try:
        parser.feed(body)
    except Exception as exc:  # html.parser is lenient; this is only for pathological input
        raise _malformed(index, name, f"unreadable HTML ({show(str(exc), 120)})") from None
    if parser.base is not None:  # the page's links are relative to its <base href>, itself relative to the page
        if (declared := _resolve(base, parser.base)) is None:
            raise _malformed(index, name, f"<base href> {show_url(parser.base)!r} {_UNPARSED}")
        base = declared
    page = plain_page(base)
    files = []
    for i, anchor in enumerate(parser.anchors):
        href = anchor.get("href")
        if not href:
            continue
        plain = plain_link(page, href) if page is not None else None
        if plain is not None:
            url, fragment = plain
            filename = unquote(url.rsplit("/", 1)[-1])
        else:
            resolved = _resolve(base, href)
            if resolved is None:
                raise _malformed(index, name, f"link {i}: url {show_url(href)!r} {_UNPARSED}")
            url, fragment = urldefrag(resolved)  # cannot raise: the same text just split
            filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        if not filename:
            continue  # a directory: the parent or a sort link of a served directory listing, not a file
        # A plain link's URL passes every check _file_problem makes of a URL: only its file name is left.
        if problem := _filename_problem(filename) if plain else _file_problem(index, filename, url):
            raise _malformed(index, name, f"link {i}: {problem}")
        algo, _, digest = fragment.partition("=")
        if algo == "sha256" and not _SHA256.fullmatch(digest):
            raise _malformed(index, name, f"link {i}: sha256 {show(repr(digest), 80)} is not 64 hex digits")
        yanked = "data-yanked" in anchor
        files.append(
            IndexFile(
                filename=filename,
                url=url,
                sha256=digest.lower() if algo == "sha256" else None,
                yanked=yanked,
                yanked_reason=(show(anchor.get("data-yanked") or "") or None) if yanked else None,
                core_metadata=_announced_metadata(
                    anchor.get("data-core-metadata", anchor.get("data-dist-info-metadata", False))
                ),
            )
        )
    return ProjectPage(index, name, tuple(files))


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
    if isinstance(sha, str) and _SHA256.fullmatch(sha):
        return sha.lower()
    return ""
