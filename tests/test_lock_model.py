"""The lock model: strict reading with every problem located, canonical writing, schema agreement."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from envbuild.errors import LockfileError
from envbuild.lock import dump_lock, parse_lock, read_lock, write_lock
from envbuild.lock.model import LOCK_VERSIONS
from envbuild.lock.schema import SCHEMA_PATHS, lock_schema, schema_text
from tests.lib.tinylock import MINIMAL_LOCK as MINIMAL
from tests.lib.tinylock import MINIMAL_SHA as SHA

REPO = Path(__file__).resolve().parents[1]
REAL_LOCK = REPO / "lockfiles" / "glm5_2-ascend.lock.yaml"


def problems(text: str) -> list[str]:
    with pytest.raises(LockfileError) as info:
        parse_lock(text, "t.lock.yaml")
    return [str(p) for p in info.value.problems]


def test_minimal_lock_is_valid() -> None:
    lock = parse_lock(MINIMAL, "t.lock.yaml")
    assert lock.name == "tiny"
    assert lock.sources[0].commit == SHA
    assert lock.packages == () and lock.base_image is None


def test_real_lock_loads_and_is_canonical() -> None:
    lock = read_lock(REAL_LOCK).lock
    assert len(lock.sources) == 9
    megatron = lock.source("megatron-lm")
    assert (megatron.ref, megatron.ref_type, megatron.commit) == ("core_v0.18.0", "tag", SHA)
    assert megatron.tree == "ca75dcd22650c9e91a79e20467d14303d636d9c4"
    assert lock.source("megatron-bridge").tree == "eeab5d9b763ff5c764c8e093d6e5c00b4386a038"
    assert lock.platform is not None and (lock.platform.arch, lock.platform.python) == ("aarch64", "3.12")
    assert REAL_LOCK.read_text() == dump_lock(lock), "the committed lock is not in canonical form"


def test_writing_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    lock = read_lock(REAL_LOCK).lock
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    write_lock(first, lock)
    write_lock(second, read_lock(first).lock)
    assert first.read_bytes() == second.read_bytes()
    assert read_lock(second).lock == lock


def test_every_problem_is_reported_at_once_with_line_and_field() -> None:
    text = textwrap.dedent("""\
        version: 1
        name: Bad Name
        colour: blue
        sources:
          - name: ../escape
            repo: ext::sh -c touch% /tmp/pwned
            ref: -main
            ref_type: branchy
            commit: ba7b5eb
          - name: ok
            repo: "--upload-pack=evil"
            ref: main
            ref_type: branch
            commit: 1234567890123456789012345678901234567890
            tree: ZZ
        """)
    found = problems(text)
    expected = [
        ("t.lock.yaml:2: name:", "path component"),
        ("t.lock.yaml:3: colour:", "unknown key"),
        ("t.lock.yaml:5: sources[0].name:", "safe name"),
        ("t.lock.yaml:6: sources[0].repo:", "remote helper"),
        ("t.lock.yaml:7: sources[0].ref:", "branch or tag"),
        ("t.lock.yaml:8: sources[0].ref_type:", "branch | tag"),
        ("t.lock.yaml:9: sources[0].commit:", "40 lowercase hex"),
        ("t.lock.yaml:11: sources[1].repo:", "option"),
        ("t.lock.yaml:14: sources[1].commit:", "quote it"),
        ("t.lock.yaml:15: sources[1].tree:", "40 lowercase hex"),
    ]
    assert len(found) == len(expected), found
    for line, (prefix, words) in zip(found, expected):
        assert line.startswith(prefix) and words in line, line


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://example.org/x.git", "scheme"),
        ("-oProxyCommand=evil", "option"),
        ("ext::ssh evil", "remote helper"),
        ("fd::3", "remote helper"),
        ("https://user:secret@example.org/x.git", "credentials"),
        ("https:///nohost.git", "no host"),
        ("/srv/git/local.git", "scheme"),
        ("https://example.org/a b.git", "whitespace"),
    ],
)
def test_hostile_repository_urls_are_refused(url: str, words: str) -> None:
    found = problems(MINIMAL.replace("https://example.org/lib.git", json.dumps(url)))
    assert len(found) == 1 and "sources[0].repo" in found[0] and words in found[0], found


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/NVIDIA/Megatron-LM.git",
        "ssh://git@example.org/x.git",
        "git@example.org:org/x.git",
        "git://127.0.0.1:9418/x.git",
        "file:///srv/git/x.git",
    ],
)
def test_allowed_repository_urls(url: str) -> None:
    assert parse_lock(MINIMAL.replace("https://example.org/lib.git", url)).sources[0].repo == url


def test_duplicates_and_mismatched_package_files() -> None:
    text = MINIMAL + textwrap.dedent(f"""\
          - name: lib
            repo: https://example.org/other.git
            ref: v1
            ref_type: tag
            commit: {SHA}
        packages:
          - name: Six
            version: "1.16.0"
            files:
              - {{filename: six-1.16.0-py2.py3-none-any.whl, sha256: "{"a" * 64}"}}
              - {{filename: six-1.16.0-py2.py3-none-any.whl, sha256: "{"a" * 64}"}}
              - {{filename: numpy-1.0-py3-none-any.whl, sha256: "{"b" * 64}"}}
          - name: six
            version: "1.16.0"
        """)
    found = problems(text)
    assert any("sources[1].name" in p and "duplicate source name 'lib'" in p for p in found), found
    assert any("packages[0].files[1].filename" in p and "duplicate file" in p for p in found), found
    assert any("packages[0].files[2].filename" in p and "not a file of Six 1.16.0" in p for p in found), found
    assert any("packages[1].name" in p and "duplicate package" in p for p in found), found


def test_two_installed_sources_of_one_distribution_are_refused() -> None:
    """The second would replace the first in the image, and verify would check one's requirements only."""
    fork = textwrap.dedent(f"""\
          - name: lib-fork
            repo: https://example.org/fork.git
            ref: main
            ref_type: branch
            commit: {SHA}
            provides: {{name: Lib}}
          - name: lib-docs
            repo: https://example.org/docs.git
            ref: main
            ref_type: branch
            commit: {SHA}
            provides: {{name: lib}}
            install: {{mode: none}}
          - name: lib-wheel
            repo: https://example.org/lib2.git
            ref: main
            ref_type: branch
            commit: {SHA}
            provides: {{name: LIB}}
            install: {{mode: wheel}}
        """)
    found = problems(MINIMAL + textwrap.indent(fork, "  "))
    assert found == [
        "t.lock.yaml:14: sources[1].provides.name: 'Lib' is installed by source 'lib' too (sources[0]): "
        "one distribution, one source",
        "t.lock.yaml:27: sources[3].provides.name: 'LIB' is installed by source 'lib' too (sources[0]): "
        "one distribution, one source",
    ], found  # a copied-only source (install: none) installs nothing; the names compare normalised


def test_versions_missing_and_unsupported_have_their_own_errors() -> None:
    assert problems("name: x\nsources: []\n") == ["t.lock.yaml:1: version: required key is missing (add `version: 2`)"]
    (found,) = problems(MINIMAL.replace("version: 1", "version: 3"))
    assert "unsupported lockfile version 3; this envbuild reads versions 1 and 2 (upgrade envbuild)" in found
    assert parse_lock(MINIMAL).version == 1 and parse_lock(MINIMAL.replace("version: 1", "version: 2")).version == 2


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty file"),
        ("version: 1\nname: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
        ("version: 1\nversion: 1\nname: x\nsources: []\n", "duplicate key"),
        ("version: 1\nname: x\n", "sources: required key is missing"),
        ("version: 1\nname: x\nsources: {}\n", "expected a list"),
        ("version: 1\nname: x\nsources: []\nplatform: {os: linux, arch: aarch64, python: 3.12}\n", "quote it"),
    ],
)
def test_malformed_documents(text: str, words: str) -> None:
    found = problems(text)
    assert any(words in p for p in found), found


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(LockfileError) as info:
        read_lock(tmp_path / "absent.lock.yaml")
    assert "absent.lock.yaml" in str(info.value) and "cannot read" in str(info.value)


@pytest.mark.parametrize("version", LOCK_VERSIONS)
def test_committed_schema_matches_the_model(version: int) -> None:
    assert SCHEMA_PATHS[version].read_text() == schema_text(version), "regenerate with: python -m envbuild.lock.schema"


def test_the_version_1_schema_is_the_model_without_what_version_2_added() -> None:
    one, two = lock_schema(1), lock_schema(2)
    assert "Submodule" not in one["$defs"] and "Submodule" in two["$defs"]
    assert set(two["$defs"]["Source"]["properties"]) - set(one["$defs"]["Source"]["properties"]) == {
        "submodules",
        "submodules_unknown",
    }
    sample = yaml.safe_load(SUBMODULES)
    assert not list(jsonschema.Draft202012Validator(two).iter_errors(sample))
    assert list(jsonschema.Draft202012Validator(one).iter_errors({**sample, "version": 1}))


def test_schema_agrees_with_the_validator_on_samples() -> None:
    real = yaml.safe_load(REAL_LOCK.read_text())
    schema = lock_schema(real["version"])  # each lock against its own version's schema
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(real))
    for bad in (
        {**real, "colour": 1},
        {**real, "sources": [{**real["sources"][0], "commit": "ba7b5eb"}]},
        {**real, "sources": [{**real["sources"][0], "ref_type": "sha"}]},
        {**real, "name": "a-"},  # not a docker path component
        {**real, "name": "a" * 243},  # envbuild-raw/<name> would pass docker's 255
        {**real, "source_date_epoch": 8**11},  # past what a tar header holds
        {**real, "base_image": {**real["base_image"], "name": "x-:1"}},
    ):
        assert list(validator.iter_errors(bad)), bad
        with pytest.raises(LockfileError):
            parse_lock(yaml.safe_dump(bad))


REQUIREMENTS = MINIMAL + (
    "    provides: {name: megatron-bridge, version: 0.5.0}\n"
    "    requires_files: [requirements/common.txt]\n"
    '    build_requires: ["setuptools<80.0.0", wheel]\n'
    """    requires: ["transformers<5.9.0,>=5.8.1", 'pytest; extra == "dev"']\n"""
    "    waive:\n"
    """      - {name: transformers, reason: "verl's guide pins 5.10.4"}\n"""
    "    skip_imports:\n"
    "      - {name: vllm_ascend, reason: needs the NPU driver}\n"
    "  - name: unread\n"
    "    repo: https://example.org/unread.git\n"
    "    ref: main\n"
    "    ref_type: branch\n"
    f"    commit: {SHA}\n"
    '    requires_unknown: "the pinned tree cannot be read: unreachable"\n'
)


def test_requirements_waivers_and_skipped_imports_are_part_of_a_source() -> None:
    lock = parse_lock(REQUIREMENTS, "t.lock.yaml")
    lib, unread = lock.sources
    assert lib.distribution == "megatron-bridge" and unread.distribution == "unread"
    assert lib.build_requires == ("setuptools<80.0.0", "wheel")
    assert lib.waiver("Transformers") is not None and lib.waiver("wheel") is None
    assert (unread.requires, unread.build_requires) == (None, None)  # not read: absent, not empty
    assert parse_lock(dump_lock(lock), "again") == lock
    empty = parse_lock(MINIMAL + "    requires: []\n", "t.lock.yaml").sources[0]
    assert empty.requires == () and "requires: []" in dump_lock(parse_lock(MINIMAL + "    requires: []\n"))


PACKAGE_WAIVERS = MINIMAL + (
    "packages:\n"
    "  - name: torch\n"
    "    version: 2.9.1\n"
    "    waive:\n"
    "      - {name: triton, reason: 'CUDA-only: the lock targets Ascend'}\n"
    "      - {name: nvidia-nccl-cu12, reason: 'CUDA-only: the lock targets Ascend'}\n"
)


def test_a_package_carries_its_waivers_by_name_and_reason() -> None:
    (torch,) = parse_lock(PACKAGE_WAIVERS, "t.lock.yaml").packages
    assert torch.waiver("Triton") is not None and torch.waiver("numpy") is None
    text = dump_lock(parse_lock(PACKAGE_WAIVERS))
    assert "- {name: triton, reason: 'CUDA-only: the lock targets Ascend'}" in text
    assert parse_lock(text) == parse_lock(PACKAGE_WAIVERS)
    duplicate = PACKAGE_WAIVERS + "      - {name: Triton, reason: again}\n"
    assert problems(duplicate) == ["t.lock.yaml:15: packages[0].waive[2].name: duplicate 'Triton' (first at waive[0])"]
    assert any("a reason is required" in p for p in problems(PACKAGE_WAIVERS + "      - {name: x, reason: ''}\n"))


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("    requires: ['pkg @ https://user:token@example.org/p.whl']\n", "a direct URL reference"),
        ("    requires: ['not a requirement!!']\n", "is not a PEP 508 requirement"),
        ("    requires_files: [../outside.txt]\n", "not a relative path inside the source's tree"),
        ("    requires_files: [/etc/passwd]\n", "not a relative path inside the source's tree"),
        ("    waive: [{name: x, reason: ''}]\n", "a reason is required"),
        ("    waive: [{name: x}]\n", "reason: required key is missing"),
        ("    waive: [{name: x, reason: a}, {name: X, reason: b}]\n", "duplicate 'X' (first at waive[0])"),
        ("    skip_imports: [{name: not-a-module, reason: r}]\n", "a top-level Python module name"),
        ("    provides: {name: x, version: not.a version}\n", "is not a valid PEP 440 version"),
    ],
)
def test_bad_requirement_fields_are_named(extra: str, words: str) -> None:
    found = problems(MINIMAL + extra)
    assert any(words in p for p in found), found
    assert all("token" not in p for p in found)


GITLINK = "d0b3b775498a8ae6870075f1a5fc32bc260aa1b3"
SUBMODULES = MINIMAL.replace("version: 1", "version: 2") + textwrap.indent(
    textwrap.dedent(f"""\
        submodules:
          - path: csrc/third_party/catlass
            repo: https://gitcode.com/cann/catlass.git
            commit: {GITLINK}
            tree: {SHA}
            submodules:
              - path: 3rdparty/googletest
                repo: https://gitcode.com/GitHub_Trending/go/googletest.git
                commit: {SHA}
          - path: 3rdparty/Megatron-LM
            skip: the megatron-lm source provides Megatron-LM
            repo: https://github.com/NVIDIA/Megatron-LM.git
            commit: {GITLINK}
          - {{path: docs/theme, skip: "no gitlink: a stale .gitmodules entry"}}
        """),
    "    ",
)


def test_submodules_nest_and_round_trip() -> None:
    lock = parse_lock(SUBMODULES, "t.lock.yaml")
    catlass, megatron, theme = lock.sources[0].submodules
    assert (catlass.skipped, catlass.commit, catlass.submodules[0].path) == (False, GITLINK, "3rdparty/googletest")
    assert megatron.skipped and megatron.skip == "the megatron-lm source provides Megatron-LM"
    assert (theme.repo, theme.commit) == (None, None)
    text = dump_lock(lock)
    assert (
        text.startswith(HEADER_LINE + "version: 2\n")
        and parse_lock(text) == lock
        and dump_lock(parse_lock(text)) == text
    )


HEADER_LINE = "# envbuild lockfile: written by `envbuild lock`; every pin is checked by `envbuild lock verify`.\n"


def test_a_version_1_lock_cannot_record_submodules() -> None:
    v1 = SUBMODULES.replace("version: 2", "version: 1")
    assert problems(v1) == [
        "t.lock.yaml:9: sources[0].submodules: needs version 2 of the format (`version: 2`); this file says `version: 1`"
    ]
    with pytest.raises(ValueError, match="a version 1 lock cannot record submodules"):
        dump_lock(dataclasses.replace(parse_lock(SUBMODULES), version=1))


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("{path: x, skip: ''}", "skip: a reason is required"),
        ("{path: x, skip: '   '}", "skip: a reason is required"),
        ("{path: x, skip: null}", "repo: required for a submodule the image gets"),
        ("{path: x, repo: 'https://h/x.git'}", "commit: required for a submodule the image gets"),
        (f"{{path: x, skip: r, commit: {SHA}, tree: {SHA}}}", "tree: a skipped submodule is not written"),
        ("{path: x, skip: r, submodules: [{path: y, skip: r}]}", "a skipped submodule is not written, so it has"),
        ("{path: ../x, skip: r}", "not a relative path inside"),
        ("{path: a/.GIT/hooks, skip: r}", "has a .git component"),
        ("{path: -x, skip: r}", "starts with '-'"),
        (f"{{path: x, repo: 'ext::sh -c evil', commit: {SHA}}}", "names a git remote helper"),
        (f"{{path: x, repo: 'https://ghp_secret@github.com/x.git', commit: {SHA}}}", "carries credentials"),
        ("{path: x, skip: r}, {path: x, skip: s}", "duplicate 'x' (first at submodules[0])"),
        ("{path: x, skip: r}, {path: x/y, skip: s}", "'x/y' and 'x' (submodules[0]) are one inside the other"),
    ],
)
def test_bad_submodule_records_are_named(entry: str, words: str) -> None:
    found = problems(MINIMAL.replace("version: 1", "version: 2") + f"    submodules: [{entry}]\n")
    assert any(words in p and "sources[0].submodules[" in p for p in found), found
    assert all("ghp_secret" not in p for p in found)


def test_the_real_lock_records_its_submodule_decisions() -> None:
    """Megatron-Bridge's Megatron-LM is skipped by path (the megatron-lm source provides it); vllm-ascend's
    pinned tree could not be read, so its catlass submodule is not recorded as if read from another commit:
    the reason says so, and what was decided for it."""
    lock = read_lock(REAL_LOCK).lock
    assert lock.version == 2
    (megatron,) = lock.source("megatron-bridge").submodules
    assert (megatron.path, megatron.commit, megatron.repo) == (
        "3rdparty/Megatron-LM",
        "d0b3b775498a8ae6870075f1a5fc32bc260aa1b3",
        "https://github.com/NVIDIA/Megatron-LM.git",
    )
    assert megatron.skip is not None and megatron.skip.startswith("the megatron-lm source provides Megatron-LM")
    ascend = lock.source("vllm-ascend")
    assert ascend.submodules == () and ascend.submodules_unknown is not None
    assert "csrc/third_party/catlass" in ascend.submodules_unknown and "not skipped" in ascend.submodules_unknown
    assert lock.source("megatron-lm").submodules == () and lock.source("megatron-lm").submodules_unknown is None
