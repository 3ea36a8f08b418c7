"""Hostile index servers, third round (issue 42, rows 4–7), each against a real index on 127.0.0.1: a file
URL carrying credentials, numbers in headers that are not ASCII digits, links that do not parse as URLs,
and charsets that are not text encodings. Each ends in one line (or a page read as it should be), never a
traceback, and no credential an index hands out is printed or recorded."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.errors import RemoteError
from envbuild.index.client import IndexClient
from envbuild.index.filecache import FileCache
from tests.lib.pyindex import JSON_TYPE, PyIndex, Route, endless, make_wheel, one_line, wheels_at

WHEEL = "alpha-1.0-py3-none-any.whl"
SECRET = "s3cret"


@pytest.fixture()
def dists(tmp_path: Path) -> Path:
    return wheels_at(tmp_path / "dists", "alpha")


def write_lock(path: Path, index: PyIndex, requirements: str = "[alpha]") -> Path:
    path.write_text(
        textwrap.dedent(f"""\
            version: 1
            name: hostile
            index: {index.url}
            sources: []
            requirements: {requirements}
            packages:
              - {{name: alpha, version: "1.0", files: [{{filename: {WHEEL}, sha256: "{index.sha256(WHEEL)}"}}]}}
            """)
    )
    return path


def verify(lock: Path, cache: Path, *extra: str) -> list[str]:
    return ["lock", "verify", str(lock), "--cache-dir", str(cache), *extra]


# --- row 4: a file URL with user:password@ ------------------------------------------------------


def credential_urls(port: int) -> list[str]:
    host = f"127.0.0.1:{port}"
    return [
        f"http://user:{SECRET}@{host}/gone/{WHEEL}",
        f"https://{SECRET}@files.example/x/{WHEEL}",  # a token as the user
        f"https://user%3A{SECRET}@files.example/x/{WHEEL}",  # its ':' encoded
        f"https://user:{SECRET}/more@files.example/x/{WHEEL}",  # a '/' in the password ends the authority
    ]


@pytest.mark.parametrize("html_only", [False, True], ids=["json", "html"])
@pytest.mark.parametrize("which", range(4))
def test_a_page_listing_a_file_url_with_credentials_is_refused_naming_the_index(
    dists: Path, html_only: bool, which: int
) -> None:
    with PyIndex(dists, html_only=html_only) as index:
        url = credential_urls(int(index.url.split(":")[2].split("/")[0]))[which]
        index.relink(WHEEL, url)
        with pytest.raises(RemoteError) as info:
            IndexClient().project(index.url, "alpha")
    message = one_line(info)
    where = "link 0" if html_only else "files[0]"
    assert message.startswith(f"index {index.url} answered a malformed page for alpha: {where}: url '")
    assert SECRET not in message and "***@" in message, message


def test_credentials_from_a_page_reach_no_table_json_or_check_report(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the range read of the listed file failed (404), and its URL, password and all, was the
    requirement's detail in the table, the JSON, check.json and check.md."""
    with PyIndex(dists) as index:
        index.relink(WHEEL, f"http://user:{SECRET}@{index.url.split('/')[2]}/gone/{WHEEL}")
        lock = write_lock(tmp_path / "creds.lock.yaml", index)
        cache = tmp_path / "cache"
        table = main(verify(lock, cache))
        shown = capsys.readouterr()
        as_json = main(verify(lock, cache, "--json", "-q"))
        recorded = capsys.readouterr()
        report = tmp_path / "report"
        check = main(["check", str(lock), "--strict", "--report", str(report), "--cache-dir", str(cache), "-q"])
        checked = capsys.readouterr()
    written = (report / "check.json").read_text() + (report / "check.md").read_text()
    for text in (*shown, *recorded, *checked, written):
        assert SECRET not in text and "Traceback" not in text, text
    assert (table, as_json, check) == (1, 1, 1)
    [package] = [r for r in json.loads(recorded.out)["results"] if r["kind"] == "package"]
    assert package["status"] == "unreachable"
    assert package["detail"] == (
        f"index {index.url} answered a malformed page for alpha: files[0]: url "
        f"'http://***@{index.url.split('/')[2]}/gone/{WHEEL}' carries credentials in its user part; "
        "envbuild sends none it is handed by a page (give the file host's in ~/.netrc)"
    )


def test_a_url_in_a_requirement_from_metadata_is_shown_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wheel's METADATA is the index's word too: a ``Requires-Dist`` with a direct URL carrying a password
    is shown (table, JSON) with its user part hidden."""
    dists = tmp_path / "dists"
    dists.mkdir()
    make_wheel(dists, "alpha", "1.0", requires=[f"beta @ https://user:{SECRET}@files.example/beta.whl"])
    with PyIndex(dists) as index:
        lock = write_lock(tmp_path / "req.lock.yaml", index)
        table = main(verify(lock, tmp_path / "cache"))
        as_json = main(verify(lock, tmp_path / "cache", "--json", "-q"))
    out, err = capsys.readouterr()
    assert (table, as_json) == (1, 1)
    assert SECRET not in out + err, out + err
    assert "requires beta @ https://***@files.example/beta.whl: no package or source in the lock provides beta" in out


# --- row 5: numbers in headers are ASCII digits --------------------------------------------------


def json_page(url: str = f"/files/{WHEEL}", sha256: str = "a" * 64) -> bytes:
    entry = {"filename": WHEEL, "url": url, "hashes": {"sha256": sha256}}
    return json.dumps({"meta": {"api-version": "1.0"}, "name": "alpha", "files": [entry]}).encode()


@pytest.mark.parametrize("length", ["²", "³", "¹", "9" * 5000], ids=["sup2", "sup3", "sup1", "5000-digits"])
def test_a_page_whose_content_length_is_not_ascii_digits_is_read_by_what_arrives(dists: Path, length: str) -> None:
    """``'²'.isdigit()`` is True and ``int('²')`` raises, as ``int()`` does past 4,300 digits: the declared
    length is a number only when it is a few ASCII digits; otherwise the page is bounded by the bytes that
    arrive, as always."""
    with PyIndex(dists) as index:
        index.route("/simple/alpha/", Route(200, {"Content-Type": JSON_TYPE, "Content-Length": length}, json_page()))
        page = IndexClient().project(index.url, "alpha")
        assert [f.filename for f in page.files] == [WHEEL]
        index.route("/simple/beta/", Route(200, {"Content-Type": JSON_TYPE, "Content-Length": length}, endless()))
        with pytest.raises(RemoteError) as info:
            IndexClient(max_page=1 << 20).project(index.url, "beta")
    assert (
        one_line(info) == f"index {index.url}: the page for beta passed the page size limit ({1 << 20} bytes); refused"
    )


def test_a_download_whose_content_length_is_not_ascii_digits_is_bounded_by_what_arrives(
    dists: Path, tmp_path: Path
) -> None:
    with PyIndex(dists) as index:
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        index.route(f"/files/{WHEEL}", Route(200, {"Content-Length": "²"}, (dists / WHEEL).read_bytes()))
        path = FileCache(tmp_path / "cache").fetch(listed.url, index.sha256(WHEEL), WHEEL, client.download)
        assert path.read_bytes() == (dists / WHEEL).read_bytes()
        index.route(f"/files/{WHEEL}", Route(200, {"Content-Length": "²"}, endless()))
        out = io.BytesIO()
        with pytest.raises(RemoteError) as info:
            client.download(listed.url, out)
    assert one_line(info) == f"{listed.url} passed the size the index states ({listed.size} bytes); refused"


@pytest.mark.parametrize(
    "content_range",
    [
        "bytes 0-9/²",
        "bytes 0-9/¹²",
        "bytes ²-9/100",
        "bytes 0-²/100",
        "bytes 0-9/",
        "bytes 0-9/1_000",
        "bytes 5-14/100",
    ],
)
def test_a_range_answer_whose_numbers_are_not_ascii_digits_is_refused_in_one_line(
    dists: Path, content_range: str
) -> None:
    """``bytes 5-14/100`` to a request for the tail: the numbers parse, and say the bytes are not the ones
    asked for."""
    with PyIndex(dists) as index:
        client = IndexClient()
        listed = client.project(index.url, "alpha").file(WHEEL)
        assert listed is not None
        index.route(f"/files/{WHEEL}", Route(206, {"Content-Range": content_range}, b"x" * 10))
        with pytest.raises(RemoteError) as info:
            client.open_ranges(listed.url)
    assert one_line(info) == f"{listed.url}: a malformed answer to a range request ({content_range})"


def test_lock_verify_reports_a_range_answer_with_a_superscript_as_one_line(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PyIndex(dists) as index:
        index.route(f"/files/{WHEEL}", Route(206, {"Content-Range": "bytes 0-9/²"}, b"x" * 10))
        code = main(verify(write_lock(tmp_path / "range.lock.yaml", index), tmp_path / "cache", "--json", "-q"))
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err  # an unknown requirement fails only --strict
    [unknown] = [r for r in json.loads(out)["results"] if r["status"] == "unknown"]
    assert unknown["detail"].endswith(": a malformed answer to a range request (bytes 0-9/²)")


# --- row 6: a link that does not parse as a URL --------------------------------------------------

UNPARSED = [
    f"http://[::1/{WHEEL}",  # urlsplit: Invalid IPv6 URL
    f"http://::1]/{WHEEL}",
    f"http://ex\uff03ample/{WHEEL}",  # a netloc that NFKC-normalises to one holding '#'
    f"http://127.0.0.1:99999/{WHEEL}",  # a port out of range
    f"http://127.0.0.1:8o/{WHEEL}",  # a port that is not a number
]


@pytest.mark.parametrize("html_only", [False, True], ids=["json", "html"])
@pytest.mark.parametrize("url", UNPARSED)
def test_a_page_listing_a_url_that_does_not_parse_is_refused_naming_the_page(
    dists: Path, html_only: bool, url: str
) -> None:
    with PyIndex(dists, html_only=html_only) as index:
        index.relink(WHEEL, url)
        with pytest.raises(RemoteError) as info:
            IndexClient().project(index.url, "alpha")
    # an HTML page's link is quoted as it stands, its sha256 fragment and all
    where, link = ("link 0", f"{url}#sha256={index.sha256(WHEEL)}") if html_only else ("files[0]", url)
    assert one_line(info) == (
        f"index {index.url} answered a malformed page for alpha: {where}: url {link!r} is not a valid URL "
        "(its host, port or IPv6 address is malformed)"
    )


def test_lock_verify_reports_an_unparsable_link_as_one_line(
    dists: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PyIndex(dists) as index:
        index.relink(WHEEL, f"http://[::1/{WHEEL}")
        code = main(verify(write_lock(tmp_path / "ipv6.lock.yaml", index), tmp_path / "cache", "--json", "-q"))
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err, err
    [package] = [r for r in json.loads(out)["results"] if r["kind"] == "package"]
    assert package["status"] == "unreachable"
    assert package["detail"].endswith(f"files[0]: url 'http://[::1/{WHEEL}' is not a valid URL "
                                      "(its host, port or IPv6 address is malformed)")  # fmt: skip


# --- row 7: a charset that is not a text encoding ------------------------------------------------


@pytest.mark.parametrize("charset", ["base64", "rot13", "zlib", "hex", "uu", "idna", "undefined", "x-no-such-charset"])
def test_an_html_page_with_a_charset_that_is_no_text_encoding_is_read_as_utf8(dists: Path, charset: str) -> None:
    """Bytes-to-bytes codecs (``base64``) raise LookupError on ``bytes.decode``; ``idna`` and ``undefined``
    raise UnicodeError whatever the error handler. A page is read as UTF-8 (replacing what does not
    decode) unless its charset is a text encoding that decodes it: the links are ASCII, and a page is
    trusted no further than the sha256s the lock pins."""
    with PyIndex(dists) as index:
        sha = index.sha256(WHEEL)
        body = f'<html><body><a href="/files/{WHEEL}#sha256={sha}">{WHEEL}</a> \xe9\xff</body></html>'
        index.answer("alpha", body.encode("latin-1"), content_type=f"text/html; charset={charset}")
        page = IndexClient().project(index.url, "alpha")
    assert [(f.filename, f.sha256) for f in page.files] == [(WHEEL, sha)]


def test_an_html_page_without_a_charset_is_read_as_utf8(dists: Path) -> None:
    """requests gives a ``text/html`` answer without a charset ISO-8859-1; a page's text is UTF-8, as pip
    reads it (and as a ``file://`` index's page is read)."""
    with PyIndex(dists) as index:
        sha = index.sha256(WHEEL)
        body = f'<a href="/files/{WHEEL}#sha256={sha}" data-yanked="naïve build">{WHEEL}</a>'
        index.answer("alpha", body.encode(), content_type="text/html")
        page = IndexClient().project(index.url, "alpha")
    assert [(f.filename, f.yanked_reason) for f in page.files] == [(WHEEL, "naïve build")]
