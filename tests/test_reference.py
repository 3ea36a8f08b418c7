"""Docker's reference grammar (envbuild.data.reference) and the places that use it: the lock's name and base
image, and `--tag`. The cases follow distribution/reference's own rules and docker's behaviour."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.data.reference import NAME_AND_TAG, NAME_TOTAL_MAX, check_name_and_tag, split_reference, split_tag
from envbuild.errors import InputError, LockfileError
from envbuild.image.build import RAW_REPOSITORY, check_tags
from envbuild.lock import parse_lock
from envbuild.lock.model import LOCK_NAME_MAX

SHA = "ba7b5ebce12af60627a80985792a1449ce45f46c"
LOCK = textwrap.dedent(f"""\
    version: 1
    name: tiny
    sources:
      - {{name: lib, repo: "https://example.org/lib.git", ref: main, ref_type: branch, commit: {SHA}}}
    """)

VALID = [
    "x",
    "envbuild/tiny:0123456789ab",
    "127.0.0.1:5000/envbuild-test/base:bookworm-cann9.1.0",
    "localhost/x",
    "localhost:5000/a/b/c:v1.2-rc_3",
    "registry.example.com:443/org/app:latest",
    "Registry.Example.com/org/app",  # a registry host may have capitals; a path may not
    "a__b/c---d/e.f_g:TAG_.-",
    "x:" + "t" * 128,
    "a" * NAME_TOTAL_MAX,
    "x:_underscore-first",
]
INVALID = [
    ("", "empty"),
    ("x-:1", "path component 'x-'"),
    ("-x", "path component '-x'"),
    ("a..b", "path component 'a..b'"),
    ("a___b", "path component 'a___b'"),
    ("a.-b", "path component 'a.-b'"),
    ("a_", "path component 'a_'"),
    ("Upper", "uppercase"),
    ("org/Upper:1", "uppercase"),
    # docker 20.10 (the oldest engine supported) reads no uppercase first component as a registry, and no
    # [IPv6] host: both pass a newer grammar, then fail at tagging after the whole build.
    ("Foo/bar:1", "path component 'Foo' must be"),
    ("[::1]:5000/x:1", "docker 20.10 takes no [IPv6] address"),
    ("x/", "path component ''"),
    ("x//y", "path component ''"),
    ("/x", "path component ''"),
    ("x:", "tag ''"),
    ("x:-1", "tag '-1'"),
    ("x:.1", "tag '.1'"),
    ("x:" + "t" * 129, "tag"),
    ("x:1:2", "path component 'x:1'"),
    ("a" * (NAME_TOTAL_MAX + 1), "at most 255"),
    ("r.io/" + "a" * NAME_TOTAL_MAX + ":1", "at most 255"),
    ("x" * 1000, "1000 characters"),
    ("x@sha256:" + "a" * 64, "'***@sha256:"),
    ("user:pw@registry.io/x:1", "docker login"),
    ("bad_host.io:5000/x", "registry 'bad_host.io:5000'"),
    ("host.io:port/x", "registry 'host.io:port'"),
    ("[::1/x", "registry '[::1'"),
    ("a" * 64, "image ID"),
    ("x y", "whitespace"),
    ("caf\u00e9", "path component"),
    ("x:t\u00e9", "tag"),  # Python's \w would take the é; docker's does not
]


@pytest.mark.parametrize("reference", VALID)
def test_references_docker_accepts(reference: str) -> None:
    assert check_name_and_tag(reference) is None
    assert re.fullmatch(NAME_AND_TAG, reference)  # the pattern the JSON schema carries agrees


@pytest.mark.parametrize("reference, words", INVALID)
def test_references_docker_refuses_and_why(reference: str, words: str) -> None:
    problem = check_name_and_tag(reference)
    assert problem is not None and words in problem, problem
    assert "pw@" not in problem and len(problem) < 400


def test_strings_built_against_a_backtracking_engine_are_refused() -> None:
    # Nested quantifiers meet Python's backtracking re: the length guard runs first, and within it the
    # patterns fail fast on these shapes.
    for reference in ("a" * 5000 + "!", "a-" * 190 + "!", "a." * 190 + "/!", "[" + ":" * 380 + "/x"):
        assert check_name_and_tag(reference) is not None


@pytest.mark.parametrize("name", ["a-", "a..b", "-a", "A", "a_", "a" * (LOCK_NAME_MAX + 1)])
def test_lock_names_docker_cannot_use_are_refused(name: str) -> None:
    with pytest.raises(LockfileError) as info:
        parse_lock(LOCK.replace("name: tiny", f"name: {name}"), "t.yaml")
    (problem,) = info.value.problems
    assert (problem.line, problem.field) == (2, "name")


def test_the_longest_lock_name_makes_valid_image_tags() -> None:
    name = "a" * LOCK_NAME_MAX
    assert parse_lock(LOCK.replace("name: tiny", f"name: {name}")).name == name
    for repository in ("envbuild", RAW_REPOSITORY):  # envbuild/<name>:<sha12> and envbuild-raw/<name>:<sha12>
        assert check_name_and_tag(f"{repository}/{name}:0123456789ab") is None
    assert check_name_and_tag(f"{RAW_REPOSITORY}/{name}a:0123456789ab") is not None


def test_base_image_name_and_digest_are_checked() -> None:
    ok = LOCK + f"base_image: {{name: '127.0.0.1:5000/base:cann9.1.0', digest: 'sha256:{'a' * 64}'}}\n"
    assert parse_lock(ok).base_image is not None
    for base, field in (
        ("{name: 'x-:1'}", "base_image.name"),
        ("{name: 'x@sha256:" + "a" * 64 + "'}", "base_image.name"),
        ("{name: x, digest: 'sha512:" + "a" * 128 + "'}", "base_image.digest"),
        ("{name: x, digest: 'sha256:" + "A" * 64 + "'}", "base_image.digest"),
    ):
        with pytest.raises(LockfileError) as info:
            parse_lock(LOCK + f"base_image: {base}\n", "t.yaml")
        assert [p.field for p in info.value.problems] == [field], info.value


def test_check_tags_refuses_every_bad_tag_at_once() -> None:
    check_tags(("envbuild/tiny:abc", "127.0.0.1:5000/x/y:1", "z"))
    with pytest.raises(InputError) as info:
        check_tags(("ok:1", "x-:1", "Up:1", "u:secret@reg.io/x"))
    lines = str(info.value).splitlines()
    assert len(lines) == 3 and all(line.startswith("--tag: ") for line in lines)
    assert "secret" not in str(info.value)


def test_image_refuses_a_bad_tag_before_reading_anything_else(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "l.yaml"
    lock.write_text(LOCK)
    code = main(["image", str(lock), "--dry-run", "--cache-dir", str(tmp_path / "c"), "--tag", "x-:1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith("envbuild: error: --tag: 'x-:1': path component 'x-'")
    assert len(err.splitlines()) == 1


def test_split_tag() -> None:
    assert split_tag("127.0.0.1:5000/a/b:t1") == ("127.0.0.1:5000/a/b", "t1")
    assert split_tag("127.0.0.1:5000/a/b") == ("127.0.0.1:5000/a/b", "latest")
    assert split_tag("envbuild/x:0123") == ("envbuild/x", "0123")


@pytest.mark.parametrize(
    ("reference", "parts"),
    [
        ("busybox", ("busybox", None, None)),
        ("library/busybox:1.36", ("library/busybox", "1.36", None)),
        ("localhost:5000/busybox", ("localhost:5000/busybox", None, None)),  # a port, not a tag
        ("localhost:5000/a/b:t1", ("localhost:5000/a/b", "t1", None)),
        ("[::1]:5000/busybox:t", ("[::1]:5000/busybox", "t", None)),
        ("[::1]:5000/busybox", ("[::1]:5000/busybox", None, None)),
        (f"reg:5000/cann@sha256:{'a' * 64}", ("reg:5000/cann", None, f"sha256:{'a' * 64}")),
        (f"reg:5000/cann:9.1@sha256:{'a' * 64}", ("reg:5000/cann", "9.1", f"sha256:{'a' * 64}")),
    ],
)
def test_a_reference_splits_as_dockers_grammar_reads_it(
    reference: str, parts: tuple[str, str | None, str | None]
) -> None:
    """reference := name [":" tag] ["@" digest]: the digest is split off first, so the ':' inside
    ``sha256:…`` is never taken for a tag, and a ':' followed by a '/' is a registry's port."""
    assert split_reference(reference) == parts
    name, tag, _ = parts
    assert split_tag(reference) == (name, tag or "latest")  # what docker tags and pushes


def test_an_empty_tag_is_refused_not_read_as_latest() -> None:
    assert split_tag("envbuild/x:") == ("envbuild/x", "")
    problem = check_name_and_tag("envbuild/x:")
    assert problem is not None and "tag ''" in problem
