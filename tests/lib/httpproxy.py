"""A real HTTP proxy on loopback for the tests: Debian's tinyproxy, run in the foreground with a config
of the test's own (one process per use, stopped by its PID). ``scripts/install-test-deps`` installs it;
where it is missing the test fails under CI and is skipped otherwise, as for the services."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.lib.services import in_ci

CONFIG = """\
Port {port}
Listen 127.0.0.1
Allow 127.0.0.1
Timeout 600
MaxClients 20
LogLevel Info
LogFile "{log}"
"""


class Tinyproxy:
    """``with Tinyproxy(directory) as proxy:``; ``proxy.url`` is ``http://127.0.0.1:PORT``; ``proxy.log()``
    what it logged (each request it relayed, with its URL)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Tinyproxy:
        binary = shutil.which("tinyproxy") or next(
            (str(p) for p in (Path("/usr/bin/tinyproxy"), Path("/usr/sbin/tinyproxy")) if p.exists()), None
        )
        if binary is None:
            message = "tinyproxy is not installed (scripts/install-test-deps installs it)"
            if in_ci():
                pytest.fail(message)
            pytest.skip(message)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / "tinyproxy.log"
        with socket.socket() as probe:  # a free port; tinyproxy cannot be told to pick one itself
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        config = self.directory / "tinyproxy.conf"
        config.write_text(CONFIG.format(port=port, log=self.log_path))
        self.process = subprocess.Popen([binary, "-d", "-c", str(config)], stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tinyproxy exited with {self.process.returncode}: {self.log()[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"tinyproxy did not listen on {self.url} within 10 s: {self.log()[-500:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
