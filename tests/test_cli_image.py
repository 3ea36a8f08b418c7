"""`envbuild image --dry-run` renders from the lock alone: no network, no verify, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import read_lock

REAL_LOCK = Path(__file__).resolve().parents[1] / "lockfiles" / "glm5_2-ascend.lock.yaml"


def test_dry_run_of_the_real_lock_renders_and_says_what_a_build_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # nothing may talk to an engine
    # it renders, but a build would refuse the lock (an unpinned base, a package without files): exit 1
    assert main(["image", str(REAL_LOCK), "--dry-run", "--offline", "--cache-dir", str(tmp_path / "c")]) == 1
    captured = capsys.readouterr()
    assert f"envbuild: dry run: a build refuses {REAL_LOCK}: 2 reason(s) above" in captured.err
    lock = read_lock(REAL_LOCK).lock
    # BuildKit: the tools image (the base, its tools stage), the packages image on it, then the image
    # (the start stage, then the sources on it: the real lock has no copy-only source, so no stage of one)
    assert (
        captured.out.count("\nFROM ") == 6
        and "\nFROM envbuild-start\n" in captured.out
        and f"FROM {lock.base_image.name} AS envbuild-from\n" in captured.out
    )
    assert f"\nFROM envbuild-raw/{lock.name}:packages-tools\n" in captured.out
    for source in lock.sources:
        assert f"--mount=type=bind,source=src/{source.name},target=/opt/envbuild/mnt " in captured.out
    assert "VLLM_TARGET_DEVICE=empty" in captured.out and "COMPILE_CUSTOM_KERNELS=1" in captured.out
    assert "triton-ascend 3.2.2 has no files" in captured.err and "not pinned by digest" in captured.err
    # tags before branches: the two release tags come first
    order = [
        line.split(",")[1] for line in captured.out.splitlines() if line.startswith("RUN --mount=type=bind,source=src/")
    ]
    assert order[:2] == ["source=src/megatron-lm", "source=src/megatron-bridge"]


def test_a_bad_tag_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["image", str(REAL_LOCK), "--dry-run", "--tag", "Bad Tag", "--cache-dir", str(tmp_path)])
    assert code == 2 and "--tag" in capsys.readouterr().err


def test_a_refused_lock_does_not_wait_for_an_engine_that_does_not_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine is asked whether it answers while the lock is verified; a lock refused meanwhile is said at
    once, not after the engine's ping gives up (a host that does not answer: 30 s). The stand-in ping gives
    up 10 s after it is asked, unless the test lets it go on once the refusal is said."""
    import threading

    from envbuild.engine.client import Engine
    from envbuild.errors import EngineError
    from envbuild.lock import Lock, Source, write_lock
    from envbuild.lock.model import BaseImage
    from tests.lib.gitrepos import free_port

    asked, answer, ended = threading.Event(), threading.Event(), threading.Event()

    def hung(*args: object) -> Engine:
        asked.set()
        answer.wait(10)
        ended.set()
        raise EngineError("no container engine answers (the stand-in's ping gave up)")

    monkeypatch.setattr(Engine, "connect", staticmethod(hung))
    source = Source(
        name="gone", repo=f"git://127.0.0.1:{free_port()}/gone", ref="main", ref_type="branch", commit="a" * 40
    )
    base = BaseImage(f"127.0.0.1:{free_port()}/gone/base:1", "sha256:" + "0" * 64)  # a build needs one to begin
    write_lock(tmp_path / "gone.lock.yaml", Lock(version=1, name="gone", sources=(source,), base_image=base))
    code = main(["image", str(tmp_path / "gone.lock.yaml"), "--cache-dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    refused_before_the_ping_ended = not ended.is_set()
    answer.set()
    assert asked.is_set() and refused_before_the_ping_ended
    assert code == 1 and "refusing to build, the lock fails verify: source gone: unreachable" in err
    # the advice names the cache the build used, so that it shows what the build saw
    assert f"run `envbuild lock verify {tmp_path / 'gone.lock.yaml'} --cache-dir {tmp_path / 'c'}` for details" in err
