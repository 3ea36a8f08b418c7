"""The test environments' installer (tests/lib/pyenvs.py): uv is told the sources pip's configuration names,
read from what the real pip prints, and pip installs wherever that configuration says more than this reads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.lib.pyenvs import UvSources, Venv, pip_config, uv_sources

# The shape `pip config list` prints (this machine's, in essence): environment variables first, then files.
MACHINE = [
    ":env:.cert='/etc/ssl/certs/ca-certificates.crt'",
    ":env:.default-timeout='180'",
    ":env:.disable-pip-version-check='1'",
    ":env:.find-links='/opt/wheels'",
    "global.cert='/etc/ssl/certs/other.crt'",
    "global.constraint='/etc/xdg/pip/constraints.txt'",
    "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
    "global.find-links='/opt/elsewhere'",
]


def test_the_sources_pip_s_configuration_names_are_uv_s_flags_the_environment_first() -> None:
    assert uv_sources(MACHINE) == UvSources(
        flags=(
            "--index-strategy",
            "unsafe-best-match",
            "--constraint",
            "/etc/xdg/pip/constraints.txt",
            "--extra-index-url",
            "file:///opt/pypi/simple",
            "--extra-index-url",
            "file:///opt/pypi-more/simple",
            "--find-links",
            "/opt/wheels",
        ),
        env={"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"},
    )


def test_the_install_section_outranks_global_and_other_commands_sections_are_not_read() -> None:
    lines = ["global.index-url='https://a.example/simple'", "install.index-url='https://b.example/simple'"]
    lines += ["download.only-binary=':all:'", "wheel.no-binary=':all:'"]
    sources = uv_sources(lines)
    assert sources is not None and sources.flags[-2:] == ("--index-url", "https://b.example/simple")


@pytest.mark.parametrize(
    "line",
    ["global.only-binary=':all:'", "install.pre='true'", ":env:.no-index='1'", "global.index-url=unquoted"],
)
def test_a_setting_not_translated_leaves_the_install_to_pip(line: str) -> None:
    assert uv_sources([*MACHINE, line]) is None


def test_what_the_real_pip_prints_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configuration file: only what is set here
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path / 'a'} {tmp_path / 'b'}")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    venv = Venv(Path(sys.prefix), ())
    lines = pip_config(venv)
    assert uv_sources(lines) == UvSources(
        flags=(
            "--index-strategy",
            "unsafe-best-match",
            "--find-links",
            str(tmp_path / "a"),
            "--find-links",
            str(tmp_path / "b"),
            "--index-url",
            "http://127.0.0.1:9/simple",
        ),
        env={},
    )
    monkeypatch.setenv("PIP_ONLY_BINARY", ":all:")
    assert uv_sources(pip_config(venv)) is None
