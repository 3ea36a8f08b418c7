"""A ``file://`` package index: a directory per project holding ``index.json`` (PEP 691) or
``index.html``, and the files it lists, each read only when it is a regular file inside the index."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit
from urllib.request import url2pathname

from envbuild.errors import RemoteError
from envbuild.fileio import NotRegularFileError, open_regular
from envbuild.index.http import CHUNK
from envbuild.index.pages import ProjectPage, parse_html, parse_json, show_url


def inside(index: str, url: str) -> str | None:
    """The path ``url`` names, links resolved, when it lies inside the ``file://`` index's directory."""
    root = os.path.realpath(url2pathname(urlsplit(index).path))
    path = os.path.realpath(url2pathname(urlsplit(url).path))
    return path if os.path.commonpath([root, path]) == root else None


def copy_local(index: str, url: str, out: BinaryIO, limit: int, bound: str) -> None:
    """A file a ``file://`` index lists: only a regular file inside the index's directory."""
    path = inside(index, url)
    url = show_url(url)  # from here on, only quoted
    if path is None:
        raise RemoteError(f"{url}: refusing to read it: not inside the file:// index {index}")
    try:
        with open_regular(path) as handle:  # never waits on a FIFO the index directory holds
            copied = 0
            while chunk := handle.read(CHUNK):
                copied += len(chunk)
                if copied > limit:
                    raise RemoteError(f"{url} passed {bound} ({limit} bytes); refused")
                out.write(chunk)
    except NotRegularFileError:
        raise RemoteError(f"{url}: refusing to read it: not a regular file") from None
    except OSError as exc:
        raise RemoteError(f"{url}: cannot read: {exc.strerror or exc}") from None


def read_file_index(index: str, name: str, url: str, limit: int) -> ProjectPage:
    """A file:// index is a directory per project holding ``index.json`` (PEP 691) or ``index.html``."""
    directory = Path(url2pathname(urlsplit(url).path))
    for leaf in ("index.json", "index.html"):
        path = directory / leaf
        try:
            with open_regular(path) as handle:
                data = handle.read(limit + 1)
        except FileNotFoundError:
            continue
        except NotRegularFileError:
            raise RemoteError(f"index {index}: {path} is not a regular file") from None
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
