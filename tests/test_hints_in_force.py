"""Hints that read what the user did: the mirror hint when mirrors are already in force, a TLS certificate
the network re-signs (an index served over TLS by a CA of the test's own, as an intercepting proxy does),
and a registry out of reach said in plain words. Each advice is followed, and shown to work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envbuild.cli import main
from envbuild.lock import Lock, write_lock
from envbuild.registry.client import RegistryError, served_manifest
from envbuild.verify.render import render_verify
from envbuild.verify.results import PinResult, VerifyReport
from tests.lib.gitrepos import free_port
from tests.lib.imagelock import served_packages
from tests.lib.pyindex import PyIndex, make_wheel
from tests.lib.tlscert import make_ca


def test_with_mirrors_in_force_the_hint_does_not_offer_mirrors_again() -> None:
    row = PinResult("source", "megatron-lm", "unreachable", "Could not resolve host: git.internal.example")
    plain = render_verify(VerifyReport("l.yaml", (row,)))
    assert "verify against internal mirrors with --mirror FROM=TO" in plain
    mirrored = render_verify(
        VerifyReport("l.yaml", (row,), mirrors=("https://github.com/=https://git.internal.example/github/",))
    )
    assert "--mirror FROM=TO" not in mirrored
    assert (
        "hint: the git hosts are out of reach through the mirrors in force "
        "(https://github.com/=https://git.internal.example/github/)" in " ".join(mirrored.split())
    )


def test_an_index_behind_an_untrusted_certificate_gets_the_tls_advice_and_the_advice_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = make_ca(tmp_path / "ca")
    dists = tmp_path / "dists"
    dists.mkdir()
    make_wheel(dists, "alpha", "1.0")
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    with PyIndex(dists, tls=ca.server_context()) as index:
        lock = tmp_path / "tls.lock.yaml"
        write_lock(lock, Lock(version=2, name="tls", sources=(), index=index.url, packages=served_packages(index)))
        argv = ["lock", "verify", str(lock), "--cache-dir", str(tmp_path / "cache")]
        assert main(argv) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert re.search(r"package alpha unreachable .*TLS certificate verification failed", out), out
        assert "hint: a TLS certificate was not trusted" in out and "REQUESTS_CA_BUNDLE=FILE" in out
        assert "--mirror FROM=TO" not in out  # the host answered: no mirror would help

        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca.ca_file))  # the advice, followed
        assert main(argv) == 0, capsys.readouterr().out


def test_a_registry_out_of_reach_is_said_in_plain_words() -> None:
    with pytest.raises(RegistryError) as raised:
        served_manifest(f"127.0.0.1:{free_port()}/ascend/cann:8.3")
    (line,) = str(raised.value).splitlines()
    assert line.endswith(": connection refused"), line
    assert "HTTPConnectionPool" not in line and "Max retries" not in line


def test_git_refusing_a_certificate_gets_the_tls_advice_not_the_mirror_one() -> None:
    detail = "unable to access 'https://github.com/NVIDIA/Megatron-LM.git/': SSL certificate problem: self-signed certificate in certificate chain"
    text = " ".join(
        render_verify(VerifyReport("l.yaml", (PinResult("source", "megatron-lm", "unreachable", detail),))).split()
    )
    assert "hint: a TLS certificate was not trusted" in text and "GIT_SSL_CAINFO=FILE" in text
    assert "--mirror" not in text
