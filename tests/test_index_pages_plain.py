"""A JSON page's plain absolute links, and an HTML page's plain links (absolute, or relative as a mirror
writes them), are taken without the general resolution (``urljoin`` and the URL checks, most of a verify of
the real lock), and a page reads the same either way: the same files, or the same one-line refusal. Every
link below is read with the plain path and with it switched off, and so are a few thousand made of the
pieces that tell URL parsers apart; both against the page's own URL, and for HTML against page URLs of
several shapes."""

from __future__ import annotations

import json
import random
import re

import pytest

from envbuild.errors import RemoteError
from envbuild.index import pages
from envbuild.index.pages import ProjectPage, parse_html, parse_json

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


# ---- HTML pages: links relative to the page, as mirrors write them -------------------------------------

PAGES = [
    BASE,
    "https://pypi.org/simple/alpha",
    "https://nexus.internal:8081/repository/pypi-proxy/simple/alpha/",
    "http://127.0.0.1:3141/root/pypi/+simple/alpha/",
    "https://mirror.example",
    "https://mirror.example/",
    "https://mirror.example/simple/alpha/?format=html",
    "https://mirror.example/simple/./alpha/",
    "https://mirror.example/simple/../alpha/",
    "https://mirror.example:99999/simple/alpha/",
    "https://Mirror.Example:0443/simple/alpha/",
    "https://user@mirror.example/simple/alpha/",
    "HTTPS://mirror.example/simple/alpha/",
]
RELATIVE = [
    "../../packages/ab/cd/" + "ef" * 30 + "/alpha-1.0-py3-none-any.whl#sha256=" + SHA,
    "../../../../../../../packages/alpha-1.0.tar.gz",
    "alpha-1.0-py3-none-any.whl#md5=0123",
    "alpha-1.0+local-py3-none-any.whl",
    "alpha-1.0%2Blocal-py3-none-any.whl",
    "/packages/alpha-1.0.tar.gz",
    "./alpha-1.0.tar.gz",
    "../",
    "..",
    "../../packages/../alpha.whl",
    "packages//alpha.whl",
    "packages/alpha.whl/",
    "a:b/alpha.whl",
    "user@host/alpha.whl",
    "alpha.whl?x=1",
    "alpha.whl#",
    "alpha.whl#sha256=" + SHA + "&x",
    "https://files.pythonhosted.org/packages/ab/alpha-1.0-py3-none-any.whl#sha256=" + SHA,
    "http/alpha.whl",
    "httpalpha.whl",
    "httpx-0.28.1-py3-none-any.whl",
    ".alpha.whl",
]
STEPS = ["../", "./", "/", "", "", ""]
SEGMENTS = PIECES + ["ab/", "cd/", "alpha-1.0.whl", "alpha%2B1.tar.gz"] * 24  # a plain link, now and then


def html(href: str) -> str:
    from html import escape

    return f'<html><body><a href="{escape(href)}" data-requires-python="&gt;=3.9">file</a><br/></body></html>'


def read_html(body: str, base: str) -> ProjectPage | str:
    try:
        return parse_html(INDEX, "alpha", body, base)
    except RemoteError as exc:
        return str(exc)


def html_both_ways(
    href: str, base: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[ProjectPage | str, ProjectPage | str]:
    plain = read_html(html(href), base)
    with monkeypatch.context() as switched:
        switched.setattr(pages, "plain_page", lambda base: None)
        general = read_html(html(href), base)
    return plain, general


@pytest.mark.parametrize("base", PAGES)
def test_an_html_link_reads_the_same_on_the_plain_and_the_general_path(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for href in RELATIVE + LINKS:
        plain, general = html_both_ways(href, base, monkeypatch)
        assert plain == general, (base, href)


def test_made_up_html_links_read_the_same_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(503)
    links = [
        "".join(rng.choices(STEPS, k=rng.randint(0, 4))) + "".join(rng.choices(SEGMENTS, k=rng.randint(1, 6)))
        for _ in range(3000)
    ] + made_links(1000)
    taken = 0
    for href in links:
        base = rng.choice(PAGES)
        page_parts = pages.plain_page(base)
        taken += page_parts is not None and pages.plain_link(page_parts, href) is not None
        plain, general = html_both_ways(href, base, monkeypatch)
        assert plain == general, (base, href)
    assert 200 < taken < 3000  # both paths are met


def test_a_mirror_s_relative_links_resolve_as_urljoin_resolves_them() -> None:
    base = "https://nexus.internal:8081/repository/pypi-proxy/simple/alpha/"
    href = "../../packages/ab/cd/alpha-1.0-py3-none-any.whl#sha256=" + SHA
    page = pages.plain_page(base)
    assert page is not None
    assert pages.plain_link(page, href) == (
        "https://nexus.internal:8081/repository/pypi-proxy/packages/ab/cd/alpha-1.0-py3-none-any.whl",
        "sha256=" + SHA,
    )
    (listed,) = parse_html(INDEX, "alpha", html(href), base).files
    assert listed.url.endswith("/pypi-proxy/packages/ab/cd/alpha-1.0-py3-none-any.whl") and listed.sha256 == SHA
    said = read_html(html("../../packages/..%2F"), base)
    assert isinstance(said, str) and "is not a plain file name" in said


@pytest.mark.parametrize("declared", PAGES + ["../mirror/simple/alpha/", "/other/", "//files.example/x/"])
def test_links_under_a_base_href_read_the_same_on_both_paths(declared: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's ``<base href>`` (PAGES as declared bases, and relative ones) replaces its URL on both paths."""
    from html import escape

    page_url = "https://mirror.internal/simple/alpha/"
    for href in RELATIVE + LINKS:
        body = f'<base href="{escape(declared)}">' + html(href)
        plain = read_html(body, page_url)
        with monkeypatch.context() as switched:
            switched.setattr(pages, "plain_page", lambda base: None)
            general = read_html(body, page_url)
        assert plain == general, (declared, href)
        if isinstance(plain, ProjectPage) and plain.files and not href.startswith(("http:", "https:", "//")):
            assert not plain.files[0].url.startswith("https://mirror.internal/simple/alpha/"), (declared, href)


@pytest.mark.parametrize(
    ("head", "tail", "directory"),
    [
        ('<base target="_self"><base href="/x/">', "", "https://mirror.internal/x/"),
        ('<base href=""><base href="/x/">', "", "https://mirror.internal/simple/alpha/"),
        ("", '<base href="/y/">', "https://mirror.internal/y/"),
    ],
    ids=["the-first-with-an-href", "an-empty-href-keeps-the-page", "after-the-links"],
)
def test_the_base_href_taken_is_the_one_pip_takes(head: str, tail: str, directory: str) -> None:
    body = head + html("alpha-1.0-py3-none-any.whl") + tail
    (listed,) = parse_html(INDEX, "alpha", body, "https://mirror.internal/simple/alpha/").files
    assert listed.url == directory + "alpha-1.0-py3-none-any.whl"
