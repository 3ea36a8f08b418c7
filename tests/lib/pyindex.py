"""A real PEP 691/503 index on 127.0.0.1, serving real (tiny, hand-built) wheels and sdists.

Tests build distributions with :func:`make_wheel` / :func:`make_sdist`, put them in a directory and
serve it with :class:`PyIndex`; the index can then be made to misbehave (yank, re-hash, drop a file,
answer garbage, list another URL or size, redirect, stream without end) to reach every verification
status and every hostile case. pip and uv can install from it too.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import socket
import ssl
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import (
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

if TYPE_CHECKING:  # pytest only for the annotation: benchmarks import this module too
    import pytest

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    tag: str = "py3-none-any",
    requires: Iterable[str] = (),
    summary: str = "",
) -> Path:
    """A valid, installable wheel with one module, built with zipfile (no build backend, no network);
    ``summary`` (METADATA's Summary) changes its bytes and nothing else."""
    dist = canonicalize_name(name).replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += f"Summary: {summary}\n" if summary else ""
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{dist}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: pyindex\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = directory / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, data in files.items():
            zf.writestr(zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


def wheels_at(directory: Path, *names: str, version: str = "1.0") -> Path:
    """``directory``, made, holding a wheel of each of ``names`` at ``version`` (a page per name)."""
    directory.mkdir(parents=True)
    for name in names:
        make_wheel(directory, name, version)
    return directory


def make_sdist(
    directory: Path,
    name: str,
    version: str,
    *,
    metadata_version: str = "2.1",
    requires: Iterable[str] = (),
    egg_info_requires: str | None = None,
) -> Path:
    """A minimal sdist (PKG-INFO and pyproject.toml) with fixed mtimes, so its sha256 is stable.
    ``requires`` go into PKG-INFO as Requires-Dist; ``egg_info_requires`` is the text of a setuptools
    ``<name>.egg-info/requires.txt`` (an egg-info directory is written only when it is given)."""
    dist = canonicalize_name(name).replace("-", "_")
    root = f"{dist}-{version}"
    pkg_info = f"Metadata-Version: {metadata_version}\nName: {name}\nVersion: {version}\n"
    pkg_info += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {
        f"{root}/PKG-INFO": pkg_info.encode(),
        f"{root}/pyproject.toml": f'[project]\nname = "{name}"\nversion = "{version}"\n'.encode(),
    }
    if egg_info_requires is not None:
        members[f"{root}/{dist}.egg-info/PKG-INFO"] = pkg_info.encode()
        members[f"{root}/{dist}.egg-info/requires.txt"] = egg_info_requires.encode()
    path = directory / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for arcname, data in members.items():
            ti = tarfile.TarInfo(arcname)
            ti.size, ti.mtime = len(data), 1577836800
            tar.addfile(ti, io.BytesIO(data))
    return path


def endless(chunk: bytes = b"\0" * 65536) -> Callable[[], Iterator[bytes]]:
    """A body that never ends (like ``/dev/zero`` behind a URL), for :meth:`PyIndex.route`."""

    def body() -> Iterator[bytes]:
        while True:
            yield chunk

    return body


@dataclass
class Route:
    """A canned answer for one path: any status, headers, and a body given whole or as a stream."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | Callable[[], Iterable[bytes]] = b""
    sent: int = 0  # body bytes written so far


def _project_of(filename: str) -> str:
    if filename.endswith(".whl"):
        return parse_wheel_filename(filename)[0]
    return parse_sdist_filename(filename)[0]


def wheel_metadata(path: Path) -> bytes:
    """The ``*.dist-info/METADATA`` of a wheel, as an index serving PEP 658 metadata serves it."""
    with zipfile.ZipFile(path) as wheel:
        [name] = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        return wheel.read(name)


class PyIndex:
    """Serves ``root``'s distributions at ``<url>/<project>/`` (JSON or HTML) and ``/files/<name>``.

    Files are served with HTTP range requests (``ranges``, as a real file host does: ``ranges`` records
    each one asked) and, with ``metadata``, each wheel's core metadata at ``/files/<name>.metadata``,
    announced on the project page (PEP 658/714). Use as a context manager; ``url`` is the index URL to
    put in a lock.
    """

    def __init__(
        self,
        root: Path,
        *,
        html_only: bool = False,
        ranges: bool = True,
        metadata: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.root = root
        self.tls = tls  # serve https with this server context (tests/lib/tlscert.py)
        self.html_only = html_only
        self.serve_ranges = ranges
        self.serve_metadata = metadata
        self.ranges: list[tuple[str, str]] = []  # (file name, Range header) of every range request
        self.yanked: dict[str, str | bool] = {}
        self.hashes: dict[str, str] = {}
        self.hidden: set[str] = set()
        self.raw: dict[str, tuple[int, str, bytes]] = {}  # project -> (status, content type, body)
        self.urls: dict[str, str] = {}  # filename -> the URL its page lists instead of /files/<name>
        self.sizes: dict[str, object] = {}  # filename -> the PEP 700 size its JSON page states instead
        self.routes: dict[str, Route] = {}  # path -> canned answer, before anything else
        self.drops: dict[str, int] = {}  # path -> how many more requests are dropped without an answer
        self.forged: dict[str, bytes] = {}  # wheel filename -> the PEP 658 metadata served (and announced)
        self.requests: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    # --- misbehaviour -------------------------------------------------------------------------
    def drop(self, path: str, times: int = 1) -> None:
        """Close the connection of the next ``times`` requests for ``path`` before any byte of an
        answer: the client sees ``RemoteDisconnected``, as from a server that lost the connection."""
        self.drops[path] = times

    def yank(self, filename: str, reason: str | bool = True) -> None:
        self.yanked[filename] = reason

    def rehash(self, filename: str, sha256: str) -> None:
        self.hashes[filename] = sha256

    def hide(self, filename: str) -> None:
        self.hidden.add(filename)

    def answer(self, project: str, body: bytes, status: int = 200, content_type: str = JSON_TYPE) -> None:
        self.raw[canonicalize_name(project)] = (status, content_type, body)

    def relink(self, filename: str, url: str) -> None:
        """List ``filename`` at ``url`` (absolute or relative to the page)."""
        self.urls[filename] = url

    def state_size(self, filename: str, size: object) -> None:
        """State ``size`` (any JSON value) as the file's PEP 700 size."""
        self.sizes[filename] = size

    def forge_metadata(self, filename: str, data: bytes) -> None:
        """Serve ``data`` as the wheel's PEP 658 metadata, announced with its own sha256 (the wheel itself
        is untouched): an index that lies about a wheel's dependencies consistently."""
        self.forged[filename] = data

    def route(self, path: str, route: Route) -> Route:
        """Answer ``path`` (e.g. ``/files/x.whl``) with ``route``; returns it, to read ``sent`` later."""
        self.routes[path] = route
        return route

    # --- content ------------------------------------------------------------------------------
    def sha256(self, filename: str) -> str:
        return hashlib.sha256((self.root / filename).read_bytes()).hexdigest()

    def files_of(self, project: str) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.root.iterdir()):
            if path.name in self.hidden or not path.name.endswith((".whl", ".tar.gz")):
                continue
            if _project_of(path.name) != canonicalize_name(project):
                continue
            entry: dict[str, Any] = {
                "filename": path.name,
                "url": self.urls.get(path.name, f"/files/{path.name}"),
                "hashes": {"sha256": self.hashes.get(path.name, self.sha256(path.name))},
                "yanked": self.yanked.get(path.name, False),
                "size": self.sizes.get(path.name, path.stat().st_size),
            }
            if self.serve_metadata and path.name.endswith(".whl"):
                served = self.forged.get(path.name) or wheel_metadata(path)
                entry["core-metadata"] = {"sha256": hashlib.sha256(served).hexdigest()}
            out.append(entry)
        return out

    def page(self, project: str, as_json: bool) -> tuple[int, str, bytes]:
        if (key := canonicalize_name(project)) in self.raw:
            return self.raw[key]
        files = self.files_of(project)
        if not files and not any(_project_of(p.name) == key for p in self.root.iterdir()):
            return 404, "text/plain", b"not found"
        if as_json:
            body = {"meta": {"api-version": "1.1"}, "name": key, "files": files}  # 1.1: sizes (PEP 700)
            return 200, JSON_TYPE, json.dumps(body).encode()
        links = []
        for f in files:
            del f["size"]  # HTML pages state no sizes
            yanked = f["yanked"]
            attr = "" if yanked is False else f' data-yanked="{"" if yanked is True else yanked}"'
            if "core-metadata" in f:
                attr += f' data-core-metadata="sha256={f["core-metadata"]["sha256"]}"'
            links.append(f'<a href="{f["url"]}#sha256={f["hashes"]["sha256"]}"{attr}>{f["filename"]}</a><br/>')
        html = "<!DOCTYPE html><html><body>" + "\n".join(links) + "</body></html>"
        return 200, "text/html", html.encode()

    # --- serving ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "start the index first (use it as a context manager)"
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._server.server_address[1]}/simple"

    def __enter__(self) -> PyIndex:
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802 (uv asks HEAD before fetching a wheel's metadata)
                self._head_only = True
                self.do_GET()

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if not getattr(self, "_head_only", False):
                    index.requests.append(self.path)
                if index.drops.get(self.path, 0) > 0:
                    index.drops[self.path] -= 1
                    self.close_connection = True
                    return
                if (route := index.routes.get(self.path.split("?")[0])) is not None:
                    self._send_route(route)
                    return
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if (
                    index.serve_metadata
                    and len(parts) == 2
                    and parts[0] == "files"
                    and parts[1].endswith(".whl.metadata")
                    and (index.root / parts[1][: -len(".metadata")]).is_file()
                ):
                    wheel = parts[1][: -len(".metadata")]
                    served = index.forged.get(wheel) or wheel_metadata(index.root / wheel)
                    self._send(200, "application/octet-stream", served)
                elif len(parts) == 2 and parts[0] == "files" and (index.root / parts[1]).is_file():
                    data = (index.root / parts[1]).read_bytes()
                    wanted = self.headers.get("Range")
                    if index.serve_ranges and wanted and (span := _span(wanted, len(data))) is not None:
                        index.ranges.append((parts[1], wanted))
                        start, end = span
                        extra = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
                        self._send(206, "application/octet-stream", data[start:end], extra)
                    else:
                        self._send(200, "application/octet-stream", data)
                elif len(parts) == 2 and parts[0] == "simple":
                    as_json = JSON_TYPE in self.headers.get("Accept", "") and not index.html_only
                    self._send(*index.page(parts[1], as_json))
                else:
                    self._send(404, "text/plain", b"not found")

            def _send(self, status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                if index.serve_ranges:
                    self.send_header("Accept-Ranges", "bytes")
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if not getattr(self, "_head_only", False):
                    self.wfile.write(body)

            def _send_route(self, route: Route) -> None:
                self.send_response(route.status)
                for name, value in route.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                chunks = [route.body] if isinstance(route.body, bytes) else route.body()
                try:
                    for chunk in chunks:
                        self.wfile.write(chunk)
                        route.sent += len(chunk)
                except OSError:
                    pass  # the client stopped reading: what the test wants

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def _span(header: str, size: int) -> tuple[int, int] | None:
    """[start, end) of a single ``bytes=a-b`` or ``bytes=-n`` range, or None (then the whole file is sent)."""
    if not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].partition("-")
    if not first:
        return (max(0, size - int(last)), size) if last.isdigit() else None
    if not first.isdigit() or (last and not last.isdigit()) or int(first) >= size:
        return None
    return int(first), min(size, int(last) + 1 if last else size)


def write_file_index(root: Path, dists: Path) -> str:
    """A file:// PEP 691 index of ``dists``: ``root/<project>/index.json`` linking to copies of the
    files in ``root/files/`` (relative URLs, inside the index, as a file:// index must); returns its URL."""
    projects: dict[str, list[dict[str, Any]]] = {}
    (root / "files").mkdir(parents=True, exist_ok=True)
    for path in sorted(dists.iterdir()):
        if path.name.endswith((".whl", ".tar.gz")):
            shutil.copyfile(path, root / "files" / path.name)
            projects.setdefault(_project_of(path.name), []).append(
                {
                    "filename": path.name,
                    "url": f"../files/{path.name}",
                    "hashes": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
                }
            )
    for project, files in projects.items():
        (root / project).mkdir(parents=True, exist_ok=True)
        (root / project / "index.json").write_text(
            json.dumps({"meta": {"api-version": "1.0"}, "name": project, "files": files})
        )
    return root.as_uri()


def dead_port_url() -> str:
    """An index URL on a loopback port with nothing listening: connection refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


class Trickle:
    """A TCP server answering every connection with ``data`` one byte every ``interval`` seconds (a
    whole answer, headers included, at a crawl: each socket read stays under any read timeout). Use as
    a context manager; ``url`` points at it; ``served`` counts the bytes sent."""

    def __init__(self, data: bytes, interval: float = 0.05) -> None:
        self.data, self.interval = data, interval
        self.served = 0
        self._stop = threading.Event()
        self._sock = socket.socket()

    def __enter__(self) -> Trickle:
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._sock.listen(8)
        self._sock.settimeout(0.1)
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                for i in range(len(self.data)):
                    if self._stop.wait(self.interval):
                        return
                    conn.sendall(self.data[i : i + 1])
                    self.served += 1
            except OSError:
                pass  # the client hung up: what the test wants

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()


def trickled(chunk: bytes = b" ", interval: float = 0.05, count: int = 1 << 30) -> Callable[[], Iterator[bytes]]:
    """A body of ``count`` copies of ``chunk``, one every ``interval`` seconds, for :meth:`PyIndex.route`."""

    def body() -> Iterator[bytes]:
        for _ in range(count):
            time.sleep(interval)
            yield chunk

    return body


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    """What a hostile index answer is refused with: one line, no terminal escapes."""
    message = str(exc.value)
    assert "\n" not in message and "\x1b" not in message, message
    return message
