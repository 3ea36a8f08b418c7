"""A JSON page's plain absolute links are taken without the general resolution (``urljoin`` and the URL
checks, most of a verify of the real lock), and a page reads the same either way: the same files, or the
same one-line refusal. Every link below is read with the plain path and with it switched off, and so are a
few thousand made of the pieces that tell URL parsers apart; both against the page's own URL."""

from __future__ import annotations

import json
import random
import re

import pytest

from envbuild.errors import RemoteError
from envbuild.index import pages
from envbuild.index.pages import ProjectPage, parse_json

INDEX = "https://pypi.org/simple"
BASE = "https://pypi.org/simple/alpha/"
SHA = "ab" * 32

LINKS = [
    "https://files.pythonhosted.org/packages/ab/cd/alpha-1.0-py3-none-any.whl",
    "http://127.0.0.1/files/alpha-1.0-py3-none-any.whl",
    "HTTPS://files.example/alpha.whl",
    "Https://files.example/alpha.whl",
    "https://files.example:8443/alpha.whl",
    "https://files.example:99999/alpha.whl",
    "https://files.example:/alpha.whl",
    "https://user:pass@files.example/alpha.whl",
    "https://files.example/p/user@host/alpha.whl",
    "https://files.example/alpha.whl;params",
    "https://files.example/alpha.whl?",
    "https://files.example/alpha.whl?x=1",
    "https://files.example/alpha.whl#",
    "https://files.example/alpha.whl#sha256=" + SHA,
    "https://files.example//alpha.whl",
    "https://files.example/a/../alpha.whl",
    "https://files.example/./alpha.whl",
    "https://files.example/%2e%2e/alpha%2Ewhl",
    "https://files.example/",
    "https://files.example",
    "https:files.example/alpha.whl",
    "https:///alpha.whl",
    " https://files.example/alpha.whl",
    "https://files.example/alpha.whl ",
    "https://files.example/al\tpha.whl",
    "https://files.example/al\npha.whl",
    "https://files.example/a\x1b[2Jb.whl",
    "https://files.\u212aexample/alpha.whl",
    "https://bad\uff0fhost/alpha.whl",
    "https://[::1]/alpha.whl",
    "https://[::1/alpha.whl",
    "https://files.example]/alpha.whl",
    "ftp://files.example/alpha.whl",
    "file:///dev/zero",
    "javascript:alert(1)",
    "/packages/alpha.whl",
    "../../packages/alpha.whl",
    "alpha.whl",
    "//files.example/alpha.whl",
    "",
]
SCHEMES = ["https://", "http://", "HTTP://", "https:", "ftp://", "//", ""]
PIECES = ["files.example", "127.0.0.1", ":443", ":x", "@", "/", "//", "a", "%2F", "..", ".", ";", "?", "#", "=",
          " ", "\t", "\x7f", "é", "[", "]", "~", "+", "'"]  # fmt: skip


def page(url: str, filename: str = "alpha-1.0-py3-none-any.whl") -> bytes:
    file = {"filename": filename, "url": url, "hashes": {"sha256": SHA}, "core-metadata": {"sha256": SHA}}
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "alpha", "files": [file]}).encode()


def read(body: bytes, base: str = BASE) -> ProjectPage | str:
    try:
        return parse_json(INDEX, "alpha", body, base)
    except RemoteError as exc:
        return str(exc)


def both_ways(url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[ProjectPage | str, ProjectPage | str]:
    plain = read(page(url))
    with monkeypatch.context() as switched:
        switched.setattr(pages, "_PLAIN_URL", re.compile(r"(?!)"))  # matches nothing
        general = read(page(url))
    return plain, general


def made_links(count: int) -> list[str]:
    rng = random.Random(691)
    return [
        rng.choice(SCHEMES) + rng.choice(PIECES[:2]) + "/" + "".join(rng.choices(PIECES, k=rng.randint(0, 6)))
        for _ in range(count)
    ]


@pytest.mark.parametrize("url", LINKS)
def test_a_link_reads_the_same_on_the_plain_and_the_general_path(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, general = both_ways(url, monkeypatch)
    assert plain == general


def test_made_up_links_read_the_same_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    links = made_links(4000)
    taken = [link for link in links if pages._PLAIN_URL.fullmatch(link)]
    assert 300 < len(taken) < 3000  # both paths are met
    differ = [link for link in links if (ways := both_ways(link, monkeypatch))[0] != ways[1]]
    assert not differ, differ[:5]


def test_a_page_url_that_urljoin_refuses_refuses_a_plain_link_too(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "https://files.pythonhosted.org/packages/ab/cd/alpha-1.0-py3-none-any.whl"
    said = read(page(url), base="https://[::1/simple/alpha/")
    assert said == f"index {INDEX} answered a malformed page for alpha: files[0]: url {url!r} is not a valid URL " + (
        "(its host, port or IPv6 address is malformed)"
    )


def test_a_plain_link_keeps_the_file_name_check() -> None:
    url = "https://files.pythonhosted.org/packages/ab/cd/alpha-1.0-py3-none-any.whl"
    said = read(page(url, filename="../alpha.whl"))
    assert said == (
        f"index {INDEX} answered a malformed page for alpha: files[0]: filename '../alpha.whl' is not a plain file name"
    )
    taken = read(page(url))
    assert isinstance(taken, ProjectPage) and taken.files[0].url == url and taken.files[0].core_metadata == SHA
