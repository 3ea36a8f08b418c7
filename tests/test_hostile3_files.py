"""Issue 42, rows 11-13: files that are not what a reader expects.

- Row 11: every file a user names (the lock, ``--config``, ``$ENVBUILD_CONFIG``, a recipe, a cluster
  file, a check history) is opened so that a FIFO or a device cannot block, and anything but a regular
  file is refused in one line, ``FILE: not a regular file (a FIFO)``, exit 2.
- Row 12: ``envrun run --data FIFO``: the data check (the preflight's, and the one each Ray node runs)
  refuses it at once instead of waiting for a writer.
- Row 13: a line of ``envbuild check``'s history with the right keys and wrong types is reported with
  ``FILE:LINE`` on stderr and skipped; the check still writes check.html and appends its line.

Every command runs as a real process under a timeout: a reader that blocks on a FIFO fails its test
instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.check.history import read_history
from tests.lib.historylines import GOOD, line
from tests.lib.tinylock import MINIMAL_LOCK
from tests.lib.tinyrun import tiny_setup

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 30  # seconds; each command answers in a few, a blocked one never does
ENVBUILD = "import sys; from envbuild.cli import main; sys.exit(main(sys.argv[1:]))"
ENVRUN = "import sys; from envrun.cli.main import main; sys.exit(main(sys.argv[1:]))"


def run(script: str, args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` with ``args`` in a fresh process, as a new user runs it (no config of theirs)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ENVBUILD_", "XDG_"))}
    environ.update(PYTHONPATH=str(REPO), HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "xdg"), **env)
    try:
        return subprocess.run(
            [sys.executable, "-c", script, *args],
            cwd=tmp,
            env=environ,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {TIMEOUT} s: {args} (blocked opening or reading a FIFO?)")


def one_error_line(proc: subprocess.CompletedProcess[str], status: int = 2) -> str:
    assert proc.returncode == status, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "named.fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    path = tmp_path / "m.lock.yaml"
    path.write_text(MINIMAL_LOCK)
    return path


# --- row 11: every file a user names ----------------------------------------------------------------


def test_a_fifo_as_the_lockfile_is_refused_at_once(tmp_path: Path, fifo: Path) -> None:
    for args in (
        ["lock", "export", str(fifo), "--format", "repos"],
        ["lock", "verify", str(fifo), "--offline", "--cache-dir", str(tmp_path / "cache")],
        ["lock", "diff", str(fifo), str(fifo)],
        ["check", str(fifo), "--offline", "--cache-dir", str(tmp_path / "cache")],
    ):
        line = one_error_line(run(ENVBUILD, args, tmp_path))
        assert line == f"envbuild: error: {fifo}: not a regular file (a FIFO)", args


def test_a_fifo_as_the_config_file_is_refused_at_once(tmp_path: Path, fifo: Path, lock: Path) -> None:
    verify = ["lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "cache")]
    by_option = one_error_line(run(ENVBUILD, [*verify, "--config", str(fifo)], tmp_path))
    by_environment = one_error_line(run(ENVBUILD, verify, tmp_path, ENVBUILD_CONFIG=str(fifo)))
    assert by_option == f"envbuild: error: {fifo}: not a regular file (a FIFO)"
    assert by_environment == f"{by_option} (the file $ENVBUILD_CONFIG names)"  # set long ago, in a profile


@pytest.mark.parametrize(
    "path, kind", [("/dev/zero", "a character device"), (".", "a directory")], ids=["device", "directory"]
)
def test_a_device_or_a_directory_is_refused_unread(tmp_path: Path, lock: Path, path: str, kind: str) -> None:
    named = str(tmp_path) if path == "." else path
    line = one_error_line(run(ENVBUILD, ["lock", "export", named, "--format", "repos"], tmp_path))
    assert line == f"envbuild: error: {named}: not a regular file ({kind})"
    verify = ["lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "cache")]
    line = one_error_line(run(ENVBUILD, verify, tmp_path, ENVBUILD_CONFIG=named))
    assert line == f"envbuild: error: {named}: not a regular file ({kind}) (the file $ENVBUILD_CONFIG names)"


def test_a_config_file_the_environment_names_that_is_not_there_says_where_its_name_came_from(
    tmp_path: Path, lock: Path
) -> None:
    """A typo, or a file gone since a profile set the variable: the line names the variable as well as the file."""
    verify = ["lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "cache")]
    missing = str(tmp_path / "gone" / "config.yaml")
    line = one_error_line(run(ENVBUILD, verify, tmp_path, ENVBUILD_CONFIG=missing))
    assert (
        line == f"envbuild: error: {missing}: cannot read: No such file or directory (the file $ENVBUILD_CONFIG names)"
    )


def test_the_null_device_is_still_an_empty_config(tmp_path: Path, lock: Path) -> None:
    """``ENVBUILD_CONFIG=/dev/null``, as pip's ``PIP_CONFIG_FILE=/dev/null``: no settings, not an error."""
    proc = run(ENVBUILD, ["lock", "verify", str(lock), "--offline", "--cache-dir", str(tmp_path / "c")], tmp_path,
               ENVBUILD_CONFIG=os.devnull)  # fmt: skip
    assert proc.returncode == 1 and "not a regular file" not in proc.stderr, proc.stderr  # the pin is not cached
    assert "Traceback" not in proc.stderr


def test_a_fifo_as_the_recipe_or_the_lock_of_a_run_is_refused_at_once(tmp_path: Path, fifo: Path) -> None:
    tiny = tiny_setup(tmp_path)
    args = tiny.args("--dry-run", entry=False)
    as_recipe = [*args[:1], str(fifo), *args[2:]]
    line = one_error_line(run(ENVRUN, as_recipe, tmp_path))
    assert line == f"envrun: error: {fifo}: not a regular file (a FIFO)"
    as_lock = [*args[:3], str(fifo), *args[4:]]
    line = one_error_line(run(ENVRUN, as_lock, tmp_path))
    assert line == f"envrun: error: {fifo}: not a regular file (a FIFO)"


def test_a_fifo_as_the_cluster_file_is_refused_at_once(tmp_path: Path, fifo: Path) -> None:
    line = one_error_line(run(ENVRUN, ["cluster", "up", str(fifo), "--image", "envbuild/tiny:1"], tmp_path))
    assert line == f"envrun: error: {fifo}: not a regular file (a FIFO)"


HISTORY_CALLS = """\
import sys
from pathlib import Path
from envbuild.check.history import HistoryEntry, append_history, read_history
for call in (lambda: read_history(Path(sys.argv[1])), lambda: append_history(Path(sys.argv[1]), HistoryEntry(
        "2026-11-01T02:00:00Z", "m.lock.yaml", "a" * 64, False, None, None))):
    try:
        call()
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


def test_a_fifo_as_the_history_is_refused_by_its_reader_and_writer(tmp_path: Path, fifo: Path) -> None:
    """The command refuses a history that is not a regular file before it starts; its reader, which
    `envbuild check` calls twice, and its writer refuse one too (swapped in meanwhile), without waiting
    for a writer and before reading or writing a byte."""
    proc = run(HISTORY_CALLS, [str(fifo)], tmp_path)
    assert proc.stdout == f"InputError {fifo}: not a regular file (a FIFO)\n" * 2, proc.stderr


# --- row 12: --data ------------------------------------------------------------------------------


def test_a_fifo_as_data_fails_the_preflight_at_once(tmp_path: Path, fifo: Path) -> None:
    tiny = tiny_setup(tmp_path)
    for option in ("--data", "--val-data"):
        args = tiny.args("--dry-run", entry=False)
        if option == "--data":
            args[args.index("--data") + 1] = str(fifo)
        else:
            args += ["--val-data", str(fifo)]
        line = one_error_line(run(ENVRUN, args, tmp_path))
        assert line.startswith("envrun: error: preflight failed, nothing started"), line
        assert f"data: {fifo}: not a regular file (a FIFO)" in line, line


def test_a_fifo_as_data_is_refused_at_once_on_a_ray_node(tmp_path: Path, fifo: Path) -> None:
    """What each node of a Ray cluster runs for the data check (:func:`envrun.cluster.onnode.data`)."""
    script = "import json, sys; from envrun.cluster.onnode import data; print(json.dumps(data(sys.argv[1:])))"
    proc = run(script, [str(fifo), "/dev/zero", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        f"{fifo}: not a regular file (a FIFO)",
        "/dev/zero: not a regular file (a character device)",
        f"{tmp_path}: not a regular file (a directory)",
    ]


# --- row 13: a history line of the wrong types ---------------------------------------------------

WRONG = {
    "time": 20261102,
    "lock": ["m.lock.yaml"],
    "lock_sha256": None,
    "ok": "yes",
    "reproducible": 1,
    "image_id": {"id": "sha256:2"},
    "pins": ["source:lib"],
    "failed_stage": [],
}


@pytest.mark.parametrize("key", sorted(WRONG))
def test_a_history_line_of_wrong_types_is_skipped_and_the_report_written(tmp_path: Path, lock: Path, key: str) -> None:
    history = tmp_path / "history.jsonl"
    before = line() + line(**{key: WRONG[key]}) + line(time="2026-11-03T02:00:00Z")
    history.write_text(before)
    report = tmp_path / "report"
    args = ["check", lock.name, "--offline", "--cache-dir", str(tmp_path / "cache")]
    proc = run(ENVBUILD, [*args, "--report", str(report), "--history", str(history)], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr  # the pin is not cached: verify fails
    warnings = [w for w in proc.stderr.splitlines() if str(history) in w]
    assert len(warnings) == 1 and warnings[0].startswith(f"envbuild: {history}:2: {key}: expected "), proc.stderr
    page = (report / "check.html").read_text()
    assert "3 run(s)" in page  # the two good nights and this one
    after = history.read_text()
    assert after.startswith(before) and json.loads(after[len(before) :])["lock"] == lock.name


def test_every_kind_of_bad_line_is_reported_with_its_line_and_skipped(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    bad = [
        b"not json\n",
        b"[1, 2]\n",
        b'{"time": "2026-11-02T02:00:00Z"}\n',
        line(pins={"source:lib": 3}).encode(),
        line(ok=1).encode(),
        json.dumps({**GOOD, "image_id": "caf\xe9"}, ensure_ascii=False).encode("latin-1") + b"\n",
    ]
    history.write_bytes(line().encode() + b"".join(bad) + line(time="2026-11-09T02:00:00Z").encode())
    warnings: list[str] = []
    entries = read_history(history, warnings.append)
    assert [e.time for e in entries] == ["2026-11-01T02:00:00Z", "2026-11-09T02:00:00Z"]
    assert [w.split(": ", 1)[0] for w in warnings] == [f"{history}:{n}" for n in range(2, 8)]
    assert "pins: expected" in warnings[3] and "ok: expected" in warnings[4] and "not UTF-8" in warnings[5]
    assert all(w.endswith("; skipped") and "\n" not in w for w in warnings)


def test_a_file_with_no_history_line_is_left_as_it_is(tmp_path: Path, lock: Path) -> None:
    """Skipping bad lines must not make any file a history: one none of whose lines has an entry's keys
    (another file named by mistake) stops the history stage, and nothing is appended to it."""
    history = tmp_path / "notes.jsonl"
    before = '{"not": "an entry"}\n{"time": "x"}\n'
    history.write_text(before)
    report = tmp_path / "report"
    args = ["check", lock.name, "--json", "--offline", "--cache-dir", str(tmp_path / "cache")]
    proc = run(ENVBUILD, [*args, "--report", str(report), "--history", str(history)], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result["failed_stage"] == "history" and result["error"].startswith(f"{history}:1: not a history entry")
    assert history.read_text() == before
    assert sorted(p.name for p in report.iterdir()) == ["check.html", "check.json", "check.md"]
