"""The engine's claim (envbuild.engine.claim): builds share it, a prune of BuildKit's cache takes it alone or
not at all, across processes (real flocks, held by a child process as another build would hold them)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from envbuild.engine.claim import EngineClaim, claims_dir
from envbuild.errors import EnvbuildError

HOLD = """
import sys
from pathlib import Path
from envbuild.engine.claim import EngineClaim
how = sys.argv[3]
if how.startswith("check:"):  # a check of the lock named after the colon
    claim = EngineClaim(sys.argv[1], Path(sys.argv[2]), of=("check", how[len("check:") :]))
    held = claim.waited(lambda line: print(line, file=sys.stderr), "the holder")
else:
    claim = EngineClaim(sys.argv[1], Path(sys.argv[2]))
    held = claim.shared() if how == "shared" else claim.alone()
with held as held:
    print("held" if held is not False else "not held", flush=True)
    sys.stdin.read()
"""


class Holder:
    """Another process holding the claim on ``address`` (shared, or alone) until closed."""

    def __init__(self, address: str, directory: Path, how: str) -> None:
        root = str(Path(__file__).resolve().parent.parent)
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLD, address, str(directory), how],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": root},
        )
        assert self.process.stdout is not None
        self.said = self.process.stdout.readline().strip()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


def test_builds_share_the_claim_and_a_prune_waits_for_none_of_them(tmp_path: Path) -> None:
    other = Holder("unix:///run/one.sock", tmp_path, "shared")
    try:
        assert other.said == "held"
        claim = EngineClaim("unix:///run/one.sock", tmp_path)
        with claim.shared():  # a second build beside the first
            pass
        with claim.alone() as alone:
            assert alone is False  # not waited for: the prune is left to the build that ends last
        with EngineClaim("unix:///run/another.sock", tmp_path).alone() as alone:
            assert alone is True  # another engine's claim is another file
    finally:
        other.close()
    with EngineClaim("unix:///run/one.sock", tmp_path).alone() as alone:
        assert alone is True  # the other build ended: its lock went with its process


def test_a_pruning_build_keeps_others_out_until_it_ends(tmp_path: Path) -> None:
    claim = EngineClaim("unix:///run/one.sock", tmp_path)
    with claim.alone() as alone:
        assert alone is True
        late = Holder("unix:///run/one.sock", tmp_path, "alone")
        try:
            assert late.said == "not held"
        finally:
            late.close()


def test_a_check_of_a_lock_waits_for_the_check_of_it_running_and_for_nothing_else(tmp_path: Path) -> None:
    running = Holder("unix:///run/one.sock", tmp_path, "check:glm5")
    try:
        assert running.said == "held"
        for other in (
            EngineClaim("unix:///run/one.sock", tmp_path, of=("check", "other")),  # another lock's check
            EngineClaim("unix:///run/two.sock", tmp_path, of=("check", "glm5")),  # the lock's check on another engine
            EngineClaim(
                "unix:///run/one.sock", tmp_path, of=("build", "glm5")
            ),  # a build of the lock (the check's own)
        ):
            said: list[str] = []
            with other.waited(said.append, "another check"):
                assert said == []  # held at once: nothing waited for
        with EngineClaim("unix:///run/one.sock", tmp_path).alone() as alone:
            assert alone is True  # a running check holds no build's claim: its builds take that one themselves
        claim = EngineClaim("unix:///run/one.sock", tmp_path, of=("check", "glm5"))
        said = []
        entered = threading.Event()

        def second() -> None:
            with claim.waited(said.append, "another check of glm5"):
                entered.set()

        waiting = threading.Thread(target=second)
        waiting.start()
        assert not entered.wait(1.0), "the second check went on beside the first"
        assert said == [f"waiting: another check of glm5 holds {claim.path}"]
    finally:
        running.close()
    waiting.join(timeout=30)
    assert entered.is_set()  # the first check ended: the second goes on


def test_the_claims_directory_is_private_or_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = claims_dir()
    assert made == tmp_path / f"envbuild-{os.getuid()}" and made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o777)
    with pytest.raises(EnvbuildError, match=f"{made}: not a private directory of this user's"):
        claims_dir()
    made.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    made.symlink_to(elsewhere)
    with pytest.raises(EnvbuildError, match="not a private directory"):
        claims_dir()


def test_a_claim_file_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    claim = EngineClaim("unix:///run/one.sock", tmp_path)
    target = tmp_path / "target"
    target.write_text("kept\n")
    claim.path.symlink_to(target)
    with (
        pytest.raises(EnvbuildError, match=f"{claim.path}: cannot open the claim on unix:///run/one.sock"),
        claim.shared(),
    ):
        pass
    assert target.read_text() == "kept\n"
