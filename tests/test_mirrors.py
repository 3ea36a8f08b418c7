"""Mirror rules (--mirror and the config file's mirrors:) and the config file reader."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.config import ConfigError, load_config, parse_config
from envbuild.errors import InputError
from envbuild.git.mirrors import Mirrors
from envrun.cli.main import main as envrun_main
from tests.lib.gitrepos import Served, git
from tests.lib.tinylock import branch_lock


def test_longest_prefix_wins_and_a_url_is_rewritten_once() -> None:
    mirrors = Mirrors.parse(["https://github.com/=https://m.example/gh/", "https://github.com/NVIDIA/=git://m/nv/"])
    assert mirrors.rewrite("https://github.com/NVIDIA/Megatron-LM.git") == "git://m/nv/Megatron-LM.git"
    assert mirrors.rewrite("https://github.com/volcengine/verl") == "https://m.example/gh/volcengine/verl"
    assert mirrors.rewrite("https://gitlab.com/x") == "https://gitlab.com/x"
    loop = Mirrors.parse(["https://a/=https://b/", "https://b/=https://a/"])
    assert loop.rewrite("https://a/x") == "https://b/x"


def test_the_command_line_takes_precedence_over_the_config() -> None:
    config = Mirrors((("https://github.com/", "https://from-config/"),))
    merged = config.merged(Mirrors.parse(["https://github.com/=https://from-cli/"]))
    assert merged.rewrite("https://github.com/x") == "https://from-cli/x"


def test_ssh_rules_may_name_a_plain_user() -> None:
    mirrors = Mirrors.parse(["git@github.com:=ssh://git@mirror.example/github/"])
    assert mirrors.rewrite("git@github.com:org/x.git") == "ssh://git@mirror.example/github/org/x.git"


def test_every_bad_rule_is_reported_at_once() -> None:
    specs = ["no-equals", "=https://m/", "https://a/=", "https://a/=https://m /", "https://a/=https://tok@m/", "a=b"]
    with pytest.raises(InputError) as info:
        Mirrors.parse(specs)
    lines = str(info.value).splitlines()
    assert len(lines) == 5 and all(line.startswith("--mirror: ") for line in lines), lines
    assert "whitespace" in lines[3] and "'https://***@m/' carries credentials" in lines[4]
    assert "tok" not in str(info.value)


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "config.yaml"
    path.write_bytes(text if isinstance(text, bytes) else textwrap.dedent(text).encode())
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [str(p) for p in info.value.problems]


def test_a_valid_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        cache_dir: ~/cache
        mirrors:
          https://github.com/: https://git.internal.example/github/
        """,
    )
    config = load_config(path)
    assert config.cache_dir == Path("~/cache").expanduser()
    assert config.mirrors.rewrite("https://github.com/x") == "https://git.internal.example/github/x"
    assert load_config(write(tmp_path, "")).mirrors == Mirrors()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cache_dir: 7\n", ":1: cache_dir: expected a string"),
        ("cache_dir: ''\n", ":1: cache_dir: '' is empty"),
        ('cache_dir: "/tmp/a\\0b"\n', ":1: cache_dir: "),
        ("colour: blue\n", ":1: colour: unknown key"),
        ("mirrors: [a, b]\n", ":1: mirrors: expected a mapping"),
        ("mirrors:\n  https://a/: 1\n", ":2: mirrors.https://a/: expected a string"),
        ("mirrors:\n  https://a/: ''\n", ":2: mirrors: expected FROM=TO with neither side empty"),
        ("mirrors:\n  https://a/: https://u:pw@m/\n", ":2: mirrors: 'https://***@m/' carries credentials"),
        ("- a list\n", ":1: expected a mapping"),
        ("base: &b {x: 1}\nmirrors: *b\n", ":1: base: YAML anchors and aliases"),
        ("mirrors: {a: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}\n", "levels deep"),
        ("mirrors: {\n", "not valid YAML"),
    ],
)
def test_config_problems_name_file_line_and_field(text: str, expected: str, tmp_path: Path) -> None:
    path = write(tmp_path, text)
    found = problems(path)
    assert len(found) == 1 and found[0].startswith(str(path)) and expected in found[0], found
    assert "pw" not in found[0]


def test_config_encoding_size_and_existence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert problems(write(tmp_path, b"cache_dir: /tmp/caf\xe9\n")) == [
        f"{tmp_path / 'config.yaml'}:1: cache_dir: not UTF-8 (byte 0xe9); save the file as UTF-8"
    ]
    (found,) = problems(write(tmp_path, b"#" * (2 << 20)))
    assert "larger than 1 MiB" in found
    # A config named on the command line or by $ENVBUILD_CONFIG must exist; the default one may not.
    assert "cannot read" in problems(tmp_path / "typo.yaml")[0]
    monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp_path / "typo.yaml"))
    with pytest.raises(ConfigError):
        load_config()
    monkeypatch.delenv("ENVBUILD_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nothing-here"))
    assert load_config().mirrors == Mirrors()


@pytest.mark.parametrize("target", ["/nonexistent/share/config.yaml", "config.yaml"])
def test_a_default_config_that_is_a_dangling_symlink_or_a_loop_is_said(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """~/.config/envbuild/config.yaml linked to a share not mounted (or to itself) was taken as absent: its
    mirrors dropped without a word, and the verify went to github.com. Now it is refused, naming the file."""
    (tmp_path / "envbuild").mkdir()
    config = tmp_path / "envbuild" / "config.yaml"
    config.symlink_to(target)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("ENVBUILD_CONFIG", raising=False)
    lock = tmp_path / "l.yaml"
    lock.write_text("version: 2\nname: x\nsources: []\n")
    code = main(["lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "cache"), "--json"])
    out, err = capsys.readouterr()
    reason = "No such file or directory" if target.startswith("/") else "Too many levels of symbolic links"
    assert (code, out, err) == (2, "", f"envbuild: error: {config}: cannot read: {reason}\n")


def test_parse_config_reports_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("cache_dir: 1\ncolour: 2\nmirrors:\n  'https://a/': 'https://t@b/'\n", "c.yaml")
    assert [(p.line, p.field) for p in info.value.problems] == [(1, "cache_dir"), (2, "colour"), (4, "mirrors")]


def test_a_bad_config_stops_the_cli_with_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    config = write(tmp_path, "mirrors: &m {}\n")
    lock = tmp_path / "l.yaml"
    lock.write_text(
        "version: 1\nname: x\nsources:\n  - {name: a, repo: 'https://e.org/a.git', ref: main, ref_type: branch, "
        f"commit: {'a' * 40}}}\n"
    )
    code = main(["lock", "verify", str(lock), "--config", str(config), "--offline"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert (
        err
        == f"envbuild: error: {config}:1: mirrors: YAML anchors and aliases (&m, *m) are not allowed: write each value out in full\n"
    )


@pytest.mark.parametrize("command", [["lock", "verify"], ["lock", "fetch"], ["image"], ["check"]])
def test_a_cache_dir_that_is_a_file_is_bad_input(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "l.yaml"
    lock.write_text(
        "version: 1\nname: x\nsources:\n  - {name: a, repo: 'https://e.org/a.git', ref: main, ref_type: branch, "
        f"commit: {'a' * 40}}}\n"
    )
    (tmp_path / "afile").write_text("not a cache\n")
    offline = [] if command == ["lock", "fetch"] else ["--offline"]  # fetch is what fills the cache
    code = main([*command, str(lock), "--cache-dir", str(tmp_path / "afile"), *offline])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"envbuild: error: --cache-dir: {tmp_path / 'afile'} is not a directory\n"
    assert (tmp_path / "afile").read_text() == "not a cache\n"


def test_an_empty_cache_dir_is_bad_input_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--cache-dir "$CACHE"` with CACHE unset: the working directory took the cache's folders (`lock add` left
    git/ there, exit 0). Refused as the config file's `cache_dir: ""` is, by every command taking it."""
    upstream = tmp_path / "upstream"
    git("init", "-q", "-b", "main", str(upstream))
    git("commit", "-q", "--allow-empty", "-m", "one", cwd=upstream)
    git("tag", "v1", cwd=upstream)
    lock = tmp_path / "l.yaml"
    lock.write_text("version: 2\nname: x\nsources: []\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    said = "argument --cache-dir: '' is empty or contains control characters; give a directory path\n"
    commands = [
        (
            main,
            "envbuild: error: lock add: ",
            ["lock", "add", str(lock), "r", str(upstream), "v1", "--install", "none"],
        ),
        (main, "envbuild: error: lock verify: ", ["lock", "verify", str(lock), "--offline"]),
        (main, "envbuild: error: lock export: ", ["lock", "export", str(lock), "--format", "pylock", "--offline"]),
        (envrun_main, "envrun: error: cluster status: ", ["cluster", "status", "c1"]),
    ]
    for command, prefix, argv in commands:
        code = command([*argv, "--cache-dir", ""])
        out, err = capsys.readouterr()
        assert (code, out, err) == (2, "", prefix + said), argv
    assert list(work.iterdir()) == []
    assert lock.read_text() == "version: 2\nname: x\nsources: []\n"


def test_a_cache_dir_that_is_a_file_is_bad_input_to_export_and_envrun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lock export --format pylock` and `envrun cluster` read the cache too: a file there said
    'afile/files/sha256/…: Not a directory', exit 1; now as every other command, exit 2."""
    lock = tmp_path / "l.yaml"
    lock.write_text("version: 2\nname: x\nsources: []\n")
    afile = tmp_path / "afile"
    afile.write_text("not a cache\n")
    for command, prefix, argv in [
        (main, "envbuild", ["lock", "export", str(lock), "--format", "pylock", "--offline"]),
        (envrun_main, "envrun", ["cluster", "status", "c1"]),
    ]:
        code = command([*argv, "--cache-dir", str(afile)])
        out, err = capsys.readouterr()
        assert (code, out, err) == (2, "", f"{prefix}: error: --cache-dir: {afile} is not a directory\n"), argv
    assert afile.read_text() == "not a cache\n"


@pytest.mark.gitdaemon
def test_a_verdict_from_a_mirror_not_yet_synced_names_the_mirror(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock was updated from upstream; the internal mirror syncs nightly and lacks today's commit and tag.
    verify through it once said ``the pinned commit is on no upstream branch or tag`` and ``upstream has no
    tag named v2``, and the user looked for a force-push upstream; the detail now names the mirror asked."""
    upstream = served.repo("synced-up")
    upstream.commit()
    mirror_dir = served.base / "mirror"
    mirror_dir.mkdir()
    git("clone", "-q", "--bare", str(upstream.path), str(mirror_dir / "synced-up"))
    new = upstream.commit()
    git("tag", "v2", cwd=upstream.path)
    lock = tmp_path / "m.lock.yaml"
    text = branch_lock("m", "https://github.example/org/synced-up", new)
    lock.write_text(
        text
        + text.split("sources:\n")[1]
        .replace("- name: m", "- name: t")
        .replace("ref: main", "ref: v2")
        .replace("ref_type: branch", "ref_type: tag")
    )
    rule = f"https://github.example/org/={served.url('mirror/', 'daemon-filter')}"
    code = main(["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--mirror", rule, "--json"])
    results = {row["name"]: row for row in json.loads(capsys.readouterr().out)["results"]}
    assert code == 1
    note = (
        f" (asked the mirror {served.url('mirror/synced-up', 'daemon-filter')}; a mirror not yet synced with "
        "https://github.example/org/synced-up lacks what is new)"
    )
    assert results["m"]["status"] == "missing-commit"
    assert results["m"]["detail"] == "the pinned commit is on no upstream branch or tag" + note
    assert (results["t"]["status"], results["t"]["detail"]) == ("missing-ref", "upstream has no tag named v2" + note)
    # Asked without the mirror, upstream itself answers, with no note.
    rule = f"https://github.example/org/={served.url('', 'daemon-filter')}"
    assert main(["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache"), "--mirror", rule, "-q"]) == 0
