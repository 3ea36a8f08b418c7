"""Secrets in URLs: refused wherever a URL enters (lock repo, lock index, package index, --mirror, the
config file's mirrors), with exit 2, one line naming the file and field, and the secret nowhere in the
output. Also the URL rules themselves and the one redaction every refusal goes through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.data.urls import check_index_url, check_repo_url, redact_url, redact_urls
from envbuild.errors import InputError
from envbuild.git.mirrors import Mirrors
from envbuild.git.upstream import check_inputs
from envbuild.lock.model import Source
from tests.lib.tinylock import MINIMAL_LOCK as LOCK
from tests.lib.tinylock import MINIMAL_SHA as SHA

SECRET = "ghp_S3cretT0kenValue"
# Where a token hides in a URL: GitHub's token-as-user form, a password, an encoded ':', a '/' that ends
# the authority early (the rest of the password would follow it), and ssh's user part.
HTTPS_SECRETS = [
    f"https://{SECRET}@github.com/org/x.git",
    f"https://user:{SECRET}@github.com/org/x.git",
    f"https://user%3A{SECRET}@github.com/org/x.git",
    f"https://user:{SECRET}/more@github.com/org/x.git",
]
SSH_SECRETS = [
    f"ssh://git:{SECRET}@github.com/org/x.git",
    f"ssh://git%3A{SECRET}@github.com/org/x.git",
    f"git%3A{SECRET}@github.com:org/x.git",
    f"git:{SECRET}@github.com:org/x.git",
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out + err


def one_refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, output = run(capsys, *argv)
    assert code == 2, output
    assert SECRET not in output and SECRET[4:12] not in output, output
    lines = output.splitlines()
    assert len(lines) == 1 and "***@" in lines[0], output
    return lines[0]


@pytest.mark.parametrize("url", HTTPS_SECRETS + SSH_SECRETS)
def test_a_secret_in_a_lock_repo_is_refused_unechoed(url: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "l.yaml"
    lock.write_text(LOCK.replace("https://example.org/lib.git", json.dumps(url)))
    line = one_refusal(capsys, "lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "c"))
    assert line.startswith(f"envbuild: error: {lock}:5: sources[0].repo: "), line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("url", HTTPS_SECRETS + [f"file://u:{SECRET}@/srv/simple"])
def test_a_secret_in_an_index_is_refused_unechoed(url: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "l.yaml"
    lock.write_text(LOCK + f"index: {json.dumps(url)}\n")
    line = one_refusal(capsys, "lock", "export", str(lock), "--format", "repos")
    assert line.startswith(f"envbuild: error: {lock}:9: index: ") and "~/.netrc" in line, line

    lock.write_text(LOCK + f"packages:\n  - name: six\n    version: '1.16.0'\n    index: {json.dumps(url)}\n")
    line = one_refusal(capsys, "lock", "export", str(lock), "--format", "repos")
    assert line.startswith(f"envbuild: error: {lock}:12: packages[0].index: "), line


def test_a_requirement_with_a_url_is_refused_unechoed(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "l.yaml"
    lock.write_text(LOCK + f"requirements: ['six @ https://{SECRET}@example.org/six.whl']\n")
    code, output = run(capsys, "lock", "export", str(lock), "--format", "repos")
    assert code == 2 and SECRET not in output and "requirements[0]: six: a direct URL reference" in output
    lock.write_text(LOCK + f"requirements: ['six @ https://{SECRET}@example.org/six.whl ; ;']\n")
    code, output = run(capsys, "lock", "export", str(lock), "--format", "repos")
    assert code == 2 and SECRET not in output and "not a PEP 508 requirement" in output
    assert len(output.splitlines()) == 1, output  # packaging's own message is three lines


@pytest.mark.parametrize(
    "mirror",
    [
        f"https://example.org/=https://{SECRET}@mirror.example/",
        f"https://example.org/=https://user:{SECRET}@mirror.example/",
        f"https://user:{SECRET}@example.org/=https://mirror.example/",
        f"https://example.org/=ssh://git:{SECRET}@mirror.example/",
        f"https://user:{SECRET}@example.org/",  # not FROM=TO at all: still not echoed
    ],
)
def test_a_secret_in_a_command_line_mirror_is_refused_unechoed(mirror: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "l.yaml"
    lock.write_text(LOCK)
    line = one_refusal(
        capsys, "lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "c"), "--mirror", mirror
    )
    assert line.startswith("envbuild: error: --mirror: "), line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("target", [f"https://{SECRET}@mirror.example/", f"git%3A{SECRET}@mirror.example:"])
def test_a_secret_in_a_config_mirror_is_refused_unechoed(target: str, tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    lock = tmp_path / "l.yaml"
    lock.write_text(LOCK)
    config = tmp_path / "config.yaml"
    config.write_text(f"cache_dir: {tmp_path / 'c'}\nmirrors:\n  'https://example.org/': '{target}'\n")
    monkeypatch.setenv("ENVBUILD_CONFIG", str(config))
    line = one_refusal(capsys, "lock", "verify", str(lock), "--offline")
    assert line.startswith(f"envbuild: error: {config}:3: mirrors: "), line
    assert not (tmp_path / "c").exists()


def test_a_secret_in_a_config_mirror_key_is_not_echoed_by_any_message(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "l.yaml"
    lock.write_text(LOCK)
    config = tmp_path / "config.yaml"
    key = f"https://u:{SECRET}@example.org/"
    config.write_text(f"mirrors:\n  '{key}': https://m.example/\n  '{key}': https://m.example/\n")
    code, output = run(capsys, "lock", "verify", str(lock), "--offline", "--config", str(config))
    assert code == 2 and SECRET not in output and "duplicate key" in output, output


def test_a_mirror_that_assembles_a_user_part_is_refused_after_rewriting() -> None:
    # Each side of the rule is clean; the rewritten URL is not: check_inputs checks it in full.
    source = Source(name="lib", repo=f"https://example.org/{SECRET}@evil.example/x.git", ref="main",
                    ref_type="branch", commit=SHA)  # fmt: skip
    mirrors = Mirrors.parse(["https://example.org/=https://"])
    with pytest.raises(InputError) as info:
        check_inputs([source], mirrors)
    assert "source lib: repo 'https://***@evil.example/x.git' carries credentials" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/NVIDIA/Megatron-LM.git",
        "ssh://git@example.org/x.git",
        "ssh://git@example.org:2222/x.git",
        "git@example.org:org/x.git",
        "git://127.0.0.1:9418/x.git",
        "file:///srv/git/x.git",
        "https://example.org/x@y.git",  # an '@' in the path is not a user part
    ],
)
def test_urls_without_secrets_are_allowed(url: str) -> None:
    assert check_repo_url(url) is None


@pytest.mark.parametrize(
    "url, words",
    [
        ("git://user@example.org/x.git", "credentials"),
        ("file://user@/srv/x.git", "credentials"),
        ("https://example.org:99999/x.git", "port"),
        ("https://[::1/x.git", "IPv6"),
        ("https://example.org/x\x7f.git", "control characters"),
        ("https://example.org/x\u0085.git", "whitespace"),
        ("git+ssh://git@example.org/x.git", "scheme"),
    ],
)
def test_repo_url_rules(url: str, words: str) -> None:
    problem = check_repo_url(url)
    assert problem is not None and words in problem, problem


def test_index_url_rules() -> None:
    assert check_index_url("https://pypi.org/simple") is None
    assert check_index_url("http://127.0.0.1:8080/simple") is None
    for url, words in (("https://tok@pypi.org/simple", "~/.netrc"), ("ftp://x/simple", "https, http or file")):
        problem = check_index_url(url)
        assert problem is not None and words in problem and "tok" not in problem, problem


@pytest.mark.parametrize(
    "url, shown",
    [
        (f"https://{SECRET}@github.com/x", "https://***@github.com/x"),
        (f"https://u:{SECRET}/x@github.com/x", "https://***@github.com/x"),
        (f"git:{SECRET}@host:path", "***@host:path"),
        ("https://github.com/x", "https://github.com/x"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_urls_in_text() -> None:
    text = f"x @ https://a:{SECRET}@h/x.whl, git://{SECRET}@h/y and https://plain/z"
    assert redact_urls(text) == "x @ https://***@h/x.whl, git://***@h/y and https://plain/z"
