"""Hostile lockfiles through the CLI: each refused with exit 2 and one `FILE:LINE: FIELD: message` line,
never a traceback, and before anything is built from the document.

The alias bomb runs in a subprocess under a memory limit and a timeout: a regression fails the test
instead of hanging the suite or taking the machine's memory (a guard, not a timing assertion).
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.data.yamlfile import MAX_BYTES, MAX_DEPTH
from envbuild.errors import LockfileError
from envbuild.lock.io import read_lock
from envbuild.lock.model import MAX_EPOCH
from tests.lib.tinylock import MINIMAL_LOCK as LOCK

REPO = Path(__file__).resolve().parents[1]
WHEEL = '{filename: x-1.0-py3-none-any.whl, sha256: "' + "a" * 64 + '"}'


def refused(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> str:
    """Run `envbuild lock export` (reads the lock, no network) and return its one error line."""
    code = main(["lock", "export", str(path), "--format", "repos", *extra])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def alias_bomb(width: int) -> str:
    """Packages that are aliases of one package whose files are aliases of one file: ``width`` squared
    file entries for a decoder that follows aliases, from a file of about 11 * width bytes."""
    files = ", ".join(["&f " + WHEEL] + ["*f"] * (width - 1))
    packages = "\n".join(["  - &p {name: x, version: '1.0', files: [" + files + "]}"] + ["  - *p"] * (width - 1))
    return f"version: 1\nname: bomb\nsources: []\npackages:\n{packages}\n"


def limit_memory() -> None:
    limit = 1 << 30  # 1 GiB of address space: the interpreter needs a fraction, a followed bomb far more
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_an_alias_bomb_is_refused_at_its_first_anchor(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.lock.yaml"
    bomb.write_text(alias_bomb(2000))
    assert bomb.stat().st_size < 40_000  # 4 million file entries, if aliases were followed
    script = "import sys; from envbuild.cli import main; sys.exit(main(sys.argv[1:]))"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, "lock", "export", str(bomb), "--format", "repos"],
            cwd=REPO,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=limit_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb was not refused: envbuild was still expanding it after 120 s")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"envbuild: error: {bomb}:5: packages[0]: ") and "anchors and aliases" in line


@pytest.mark.parametrize(
    "text, where, words",
    [
        (LOCK + "requirements: [1]\n", ":9: requirements[0]: ", "expected a string"),
        (LOCK + "requirements: ['x @ https://example.org/x.whl']\n", ":9: requirements[0]: ", "direct URL"),
        (LOCK + "requirements: ['x >= 1 ; ;']\n", ":9: requirements[0]: ", "not a PEP 508 requirement"),
        (LOCK.replace("version: 1", "version: 0x1"), ":1: version: ", "plain decimal"),
        (LOCK.replace("version: 1", "version: 1.0"), ":1: version: ", "expected one of 1"),
        (LOCK.replace("version: 1", "version: !!int x1"), ":1: version: ", "expected one of 1"),
        (LOCK.replace("version: 1", "version: " + "9" * 5000), ":1: version: ", "expected one of 1"),
        (LOCK + f"source_date_epoch: {MAX_EPOCH + 1}\n", ":9: source_date_epoch: ", f"from 0 to {MAX_EPOCH}"),
        (LOCK + "source_date_epoch: -1\n", ":9: source_date_epoch: ", "out of range"),
        (LOCK + "source_date_epoch: " + "9" * 5000 + "\n", ":9: source_date_epoch: ", "out of range"),
        (LOCK + "source_date_epoch: 0x10\n", ":9: source_date_epoch: ", "plain decimal"),
        (LOCK + "source_date_epoch: 0100\n", ":9: source_date_epoch: ", "plain decimal"),  # octal in YAML 1.1
        (LOCK + "source_date_epoch: !!int abc\n", ":9: source_date_epoch: ", "plain decimal"),
        (LOCK.replace("ref_type: branch", "ref_type: !custom branch"), ":7: sources[0].ref_type: ", "tagged"),
        (LOCK.replace("name: tiny", "name: a-"), ":2: name: ", "path component"),
        (LOCK.replace("name: tiny", "name: a..b"), ":2: name: ", "path component"),
        (LOCK.replace("name: tiny", "name: " + "a" * 243), ":2: name: ", "at most 242"),
        (LOCK + "base_image: {name: 'x-:1'}\n", ":9: base_image.name: ", "path component 'x-'"),
        (LOCK + "base_image: {name: 'Reg.io/A/b'}\n", ":9: base_image.name: ", "uppercase"),
        (LOCK + "base_image: {name: 'x:-1'}\n", ":9: base_image.name: ", "tag '-1'"),
        (LOCK + f"base_image: {{name: '{'a' * 256}'}}\n", ":9: base_image.name: ", "at most 255"),
        (LOCK + "base_image: {name: x, digest: 'sha256:ABC'}\n", ":9: base_image.digest: ", "sha256:<64"),
        (LOCK.replace("ref: main", "ref: '" + "a/" * 100_000 + "b'"), ":6: sources[0].ref: ", "at most 255"),
        (LOCK.replace("name: lib", "name: " + "l" * 256), ":4: sources[0].name: ", "at most 255"),
        (LOCK + "packages: [{name: x, version: '" + "9" * 100_000 + "x'}]\n", ":9: packages[0].version: ", "… (100001"),
        (LOCK.replace("commit: ", "commit: !!python/object:os.system "), ":8: sources[0].commit: ", "tagged"),
        (LOCK + "platform: {os: linux, arch: x86_64, python: '3.12', cann: [1]}\n", ":9: platform.cann", "string"),
        (LOCK + "? [complex, key]\n: 1\n", ":9: (top level): ", "keys must be strings"),
        (LOCK + "---\nversion: 1\n", ":9: ", "not valid YAML"),
        (LOCK + "packages: [{name: x, version: '1.0\\x00'}]\n", ":9: packages[0].version: ", "PEP 440"),
    ],
)
def test_hostile_fields_get_one_line_and_exit_2(text: str, where: str, words: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "h.lock.yaml"
    lock.write_text(text)
    line = refused(capsys, lock)
    assert line.startswith(f"envbuild: error: {lock}{where}") and words in line, line
    assert len(line) < 600, line  # a huge value is quoted cut short


def test_a_non_utf8_lock_names_the_line_and_field(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "latin1.lock.yaml"
    lock.write_bytes(LOCK.replace("example.org/lib", "example.org/caf\xe9").encode("latin-1"))
    line = refused(capsys, lock)
    assert line == f"envbuild: error: {lock}:5: sources[0].repo: not UTF-8 (byte 0xe9); save the file as UTF-8"
    utf16 = tmp_path / "utf16.lock.yaml"
    utf16.write_bytes(LOCK.encode("utf-16"))
    assert refused(capsys, utf16).startswith(f"envbuild: error: {utf16}:1: not UTF-8 (byte 0xff)")


def test_size_and_nesting_are_capped(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    big = tmp_path / "big.lock.yaml"
    big.write_text(LOCK + "#" * MAX_BYTES + "\n")
    assert (
        refused(capsys, big) == f"envbuild: error: {big}: larger than 1 MiB, the limit for a YAML file envbuild reads"
    )
    # A device that never ends is not read at all.
    assert refused(capsys, Path("/dev/zero")) == "envbuild: error: /dev/zero: not a regular file (a character device)"
    deep = tmp_path / "deep.lock.yaml"
    deep.write_text(LOCK + "requirements: " + "[" * 40 + "]" * 40 + "\n")
    line = refused(capsys, deep)
    assert line.startswith(f"envbuild: error: {deep}:9: requirements") and f"more than {MAX_DEPTH} levels" in line
    deep.write_text(LOCK + "requirements: " + "[" * 100_000 + "]" * 100_000 + "\n")  # past libyaml's own limit
    assert refused(capsys, deep).startswith(f"envbuild: error: {deep}:9: ")


def test_a_refused_lock_changes_nothing(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lock = tmp_path / "bad.lock.yaml"
    lock.write_text(LOCK + "source_date_epoch: 0x10\n")
    before = lock.read_bytes()
    cache = tmp_path / "cache"
    code = main(["lock", "update", str(lock), "--cache-dir", str(cache)])
    _, err = capsys.readouterr()
    assert code == 2 and "source_date_epoch" in err
    assert lock.read_bytes() == before and not cache.exists()


def test_the_epoch_bound_is_what_a_tar_header_and_datetime_hold() -> None:
    import tarfile
    from datetime import datetime, timezone

    info = tarfile.TarInfo("x")
    info.mtime = MAX_EPOCH
    assert len(info.tobuf(format=tarfile.USTAR_FORMAT)) == tarfile.BLOCKSIZE
    info.mtime = MAX_EPOCH + 1
    with pytest.raises(ValueError):
        info.tobuf(format=tarfile.USTAR_FORMAT)
    assert datetime.fromtimestamp(MAX_EPOCH, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") == "2242-03-16T12:56:31Z"


def test_recipes_are_read_by_the_same_reader(tmp_path: Path) -> None:
    from envrun.recipe import RecipeError, load_recipe

    recipe = tmp_path / "r.yaml"
    for text, expected in (
        (b"recipe: 1\nname: &n x\nconfig_name: *n\n", f"{recipe}:2: name: YAML anchors and aliases"),
        (b"recipe: 1\nname: caf\xe9\n", f"{recipe}:2: name: not UTF-8 (byte 0xe9)"),
        (b"#" * (MAX_BYTES + 1), f"{recipe}: larger than 1 MiB"),
    ):
        recipe.write_bytes(text)
        with pytest.raises(RecipeError) as info:
            load_recipe(recipe)
        (problem,) = info.value.problems
        assert str(problem).startswith(expected), problem


def test_a_lock_with_thousands_of_problems_prints_a_readable_error(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """Every problem is kept for callers; the terminal gets the first hundred and a count of the rest."""
    bad = "".join(f"  - {{name: 'bad name {i}', version: '1.0'}}\n" for i in range(3000))
    path = tmp_path / "many.lock.yaml"
    path.write_text(LOCK + "packages:\n" + bad)
    with pytest.raises(LockfileError) as info:
        read_lock(path)
    assert len(info.value.problems) == 3000
    assert main(["lock", "verify", str(path), "--offline"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 101 and all(line.startswith("envbuild: error: ") for line in err)
    assert err[-1] == "envbuild: error: … and 2900 more problems (fix these first)"
