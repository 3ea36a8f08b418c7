"""The content-addressed file cache: verified once, atomic, safe with two processes and after a kill."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from envbuild.errors import EnvbuildError
from envbuild.index.filecache import FileCache, FileHashError

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = b"wheel bytes " * 1000
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def file_download(url: str, out: BinaryIO) -> None:
    with urllib.request.urlopen(url) as response:
        shutil.copyfileobj(response, out)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving tmp_path/www."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "pkg-1.0-py3-none-any.whl").write_bytes(PAYLOAD)
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_over_http_once_then_from_cache(tmp_path: Path, served: str) -> None:
    cache = FileCache(tmp_path / "cache")
    calls: list[str] = []

    def counting(url: str, out: BinaryIO) -> None:
        calls.append(url)
        file_download(url, out)

    url = f"{served}/pkg-1.0-py3-none-any.whl"
    first = cache.fetch(url, SHA, "pkg-1.0-py3-none-any.whl", counting)
    second = cache.fetch(url, SHA, "pkg-1.0-py3-none-any.whl", counting)
    assert first == second == tmp_path / "cache" / "files" / "sha256" / SHA
    assert first.read_bytes() == PAYLOAD
    assert calls == [url]
    assert not os.access(first, os.W_OK) or os.geteuid() == 0
    assert first.stat().st_mode & 0o777 == 0o444
    assert cache.get(SHA, size=len(PAYLOAD), verify=True) == first


def test_wrong_hash_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    source = tmp_path / "bad.whl"
    source.write_bytes(b"not the bytes the lock pins")
    cache = FileCache(tmp_path / "cache")
    with pytest.raises(FileHashError) as info:
        cache.fetch(source.as_uri(), SHA, "pkg-1.0-py3-none-any.whl", file_download)
    assert isinstance(info.value, EnvbuildError)
    message = str(info.value)
    assert "pkg-1.0-py3-none-any.whl" in message and SHA in message
    assert hashlib.sha256(source.read_bytes()).hexdigest() in message
    assert cache.get(SHA) is None
    assert [p.name for p in cache.dir.iterdir() if not p.name.startswith(".lock-")] == []


def test_get_detects_corruption_by_size_and_by_hash(tmp_path: Path) -> None:
    source = tmp_path / "ok.whl"
    source.write_bytes(PAYLOAD)
    cache = FileCache(tmp_path / "cache")
    path = cache.fetch(source.as_uri(), SHA, "ok.whl", file_download)
    os.chmod(path, 0o644)
    path.write_bytes(PAYLOAD[:-1] + b"X")  # same size, other bytes
    assert cache.get(SHA, size=len(PAYLOAD)) == path  # the cheap check cannot see it...
    assert cache.get(SHA, verify=True) is None  # ...the full one does, and drops the file
    assert not path.exists()
    again = cache.fetch(source.as_uri(), SHA, "ok.whl", file_download)
    assert again.read_bytes() == PAYLOAD
    assert cache.get(SHA, size=len(PAYLOAD) + 1) is None


def test_bad_sha_argument_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        FileCache(tmp_path).path_for("../../etc/passwd")


_CHILD = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from envbuild.index.filecache import FileCache
    root, sha, log, mode = sys.argv[1:5]
    def download(url, out):
        with open(log, "a") as handle:
            handle.write("download\\n")
        out.write(b"wheel bytes " * 500)
        out.flush()
        if mode == "hang":
            print("started", flush=True)
            time.sleep(60)
        time.sleep(0.5)
        out.write(b"wheel bytes " * 500)
    print(FileCache(root).fetch("x://", sha, "pkg.whl", download), flush=True)
    """)


def _child(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "cache"), SHA, str(tmp_path / "log"), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def test_two_processes_fetch_one_file_once(tmp_path: Path) -> None:
    first, second = _child(tmp_path, "slow"), _child(tmp_path, "slow")
    outputs = [p.communicate(timeout=60)[0].strip() for p in (first, second)]
    assert first.returncode == second.returncode == 0
    assert outputs[0] == outputs[1] == str(tmp_path / "cache" / "files" / "sha256" / SHA)
    assert (tmp_path / "log").read_text() == "download\n"
    assert Path(outputs[0]).read_bytes() == PAYLOAD


def test_a_killed_download_leaves_the_cache_usable(tmp_path: Path) -> None:
    child = _child(tmp_path, "hang")
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        cache = FileCache(tmp_path / "cache")
        temps = cache.temporary_files()
        assert len(temps) == 1 and temps[0].stat().st_size > 0
        assert cache.get(SHA) is None
        assert cache.clean_temporary() == 0  # the running download holds its lock
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        if child.stdout:
            child.stdout.close()
    assert cache.get(SHA) is None
    source = tmp_path / "good.whl"
    source.write_bytes(PAYLOAD)
    started = time.monotonic()
    path = cache.fetch(source.as_uri(), SHA, "pkg.whl", file_download)
    assert time.monotonic() - started < 30  # the dead process's lock was released by the kernel
    assert path.read_bytes() == PAYLOAD
    assert cache.temporary_files() == []


def test_clean_temporary_removes_orphans(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache")
    cache.dir.mkdir(parents=True)
    (cache.dir / f".tmp-{SHA}-abc").write_bytes(b"half")  # the naming of earlier versions
    (cache.dir / f".{SHA}.x1y2z3.tmp").write_bytes(b"half")  # atomic_output's
    assert cache.clean_temporary() == 2
    assert cache.temporary_files() == [] and list(cache.dir.glob("*.tmp")) == []
