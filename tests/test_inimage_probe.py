"""The in-image check's facts, computed by the probe itself against real distribution metadata on disk
(importlib.metadata's own reader), judged as the host judges them: no image needed. The image tests run
the same script in built images (tests/test_image_build.py, tests/test_closure_image.py)."""

from __future__ import annotations

import email
import json
import random
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

from envbuild.errors import EngineError
from envbuild.git import treehash
from envbuild.image import inimage_probe as probe
from envbuild.image.inimage_verdict import consistency_problems, reported_parents


def dist_info(site: Path, name: str, version: str, *requires: str) -> metadata.Distribution:
    where = site / f"{name}-{version}.dist-info"
    where.mkdir(parents=True)
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (where / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return metadata.PathDistribution(where)


def test_each_requirement_that_can_hold_is_judged_and_extra_only_ones_are_not_reported(tmp_path: Path) -> None:
    installed = [
        dist_info(
            tmp_path,
            "alpha",
            "1.0",
            "beta>=2",
            'gamma; extra == "x"',  # only with alpha[x]: cannot hold, not judged
            "delta ; extra=='y'",
            'epsilon; python_version < "3"',  # does not hold here
            'zeta; extra == "z" or python_version >= "3"',  # holds: more than an extra
            "not a requirement ((",
            'broken (( ; extra == "w"',  # only with alpha[w]: not parsed, so not reported (verify names it)
        ),
        dist_info(tmp_path, "beta", "1.5"),
    ]
    dists = probe.installed_distributions([probe.Installed(d) for d in installed])
    facts = json.loads(json.dumps(probe.requirements(dists)))  # as the report carries them to the host
    assert facts["distributions"]["alpha"]["requires"] == [
        "beta>=2",
        'epsilon; python_version < "3"',
        'zeta; extra == "z" or python_version >= "3"',
        "not a requirement ((",
    ]
    problems = {(p["requirement"], p["kind"], p["installed"]) for p in consistency_problems(facts)}
    assert problems == {
        ("beta>=2", "conflict", "1.5"),
        ('zeta; extra == "z" or python_version >= "3"', "missing", None),
        ("not a requirement ((", "invalid", None),
    }


def test_every_copy_of_a_distribution_is_reported_in_path_order(tmp_path: Path) -> None:
    first = dist_info(tmp_path / "one", "Same_Name", "2.0")
    second = dist_info(tmp_path / "two", "same-name", "1.0")
    found, where, copies = probe.distributions([probe.Installed(first), probe.Installed(second)])
    assert found == {"same-name": ["1.0", "2.0"]}
    assert where == {"same-name": str(first._path)}  # type: ignore[attr-defined]
    assert [version for version, _ in copies["same-name"]] == ["2.0", "1.0"]


def test_imports_run_side_by_side_each_in_its_own_interpreter_in_order() -> None:
    names = ["json", "envbuild_no_such_module", "email", "json"]
    results = probe.import_all(names)
    assert list(results) == ["json", "envbuild_no_such_module", "email"]
    assert results["json"] == {"module": "json", "ok": True, "error": None}
    failed = results["envbuild_no_such_module"]
    assert not failed["ok"] and "ModuleNotFoundError" in failed["error"]
    assert sys.modules.get("envbuild_no_such_module") is None


def test_markers_are_judged_against_the_image_s_environment_not_the_host_s(tmp_path: Path) -> None:
    installed = [dist_info(tmp_path, "alpha", "1.0", 'beta; sys_platform == "win32"', 'gamma; python_version < "3"')]
    facts = probe.requirements(probe.installed_distributions([probe.Installed(d) for d in installed]))
    assert facts["markers"]["python_version"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert consistency_problems(facts) == []  # neither holds on this interpreter
    facts["markers"] = {**facts["markers"], "sys_platform": "win32", "python_version": "2.7"}  # an image's
    assert {p["requirement"] for p in consistency_problems(facts)} == {
        'beta; sys_platform == "win32"',
        'gamma; python_version < "3"',
    }


def test_headers_read_as_the_email_package_reads_them_on_every_installed_distribution() -> None:
    """The probe's own header reader against importlib.metadata's (the email package) on every distribution
    of this environment: the same name, version and requirements, body and all skipped."""
    compared = 0
    for dist in metadata.distributions():
        fast = probe.Installed(dist)
        assert (fast.name, fast.version) == (dist.metadata["Name"] or "", dist.metadata["Version"] or "")
        assert fast.requires == list(dist.requires or [])
        compared += 1
    assert compared > 50  # the venv's own: pytest, docker, requests, mypy, …


def test_headers_stop_at_the_body_and_join_folded_lines() -> None:
    text = "Name: a\nVersion: 1\nRequires-Dist: b;\n  python_version>'3'\nRequires-Dist: c\n\nName: not-a-header\n"
    assert probe.headers(text) == {
        "name": ["a"],
        "version": ["1"],
        "requires-dist": ["b;\n  python_version>'3'", "c"],
    }


@pytest.mark.parametrize(
    "text",
    [
        # setuptools folds a License field's text, its blank lines as white space only: headers go on after it
        "Name: a\nVersion: 1\nLicense: MIT\n        \n        Permission is granted\n        \nRequires-Dist: b\n\nbody\n",
        "Name: a\r\nLicense: x\r\n\t\r\nRequires-Dist: b\r\n\r\nRequires-Dist: not-a-header\r\n",
        "Name: a\nLicense: page one\n  \x0c\n  page two\nRequires-Dist: b\n",  # a form feed ends no line
        "Name: a\nRequires-Dist: b\nno header here\nRequires-Dist: c\n",  # the email package's body begins
    ],
)
def test_headers_end_where_the_email_package_ends_them(text: str) -> None:
    message = email.message_from_string(text)
    assert probe.headers(text).get("requires-dist", []) == [v.strip() for v in message.get_all("Requires-Dist", [])]
    assert probe.headers(text)["name"] == ["a"]


def test_headers_read_line_by_line_as_when_split_whole() -> None:
    """4,000 texts of header-ish pieces and every line ending (a lone \\r, \\r\\n, a form feed, white
    space, a text ending without one): the lines read one at a time give the headers that splitting the
    whole text at the email package's line ends gave."""
    pieces = ["Name: a", "Requires-Dist: b", "x", ":", " ", "\t", "\r", "\n", "\r\n", "\x0c", "", "é: v", "no header"]
    chooser = random.Random(46)
    for _ in range(4000):
        text = "".join(chooser.choice(pieces) for _ in range(chooser.randrange(0, 12)))
        assert probe.headers(text) == probe.header_lines(re.split(r"\r\n|\r|\n", text)), repr(text)


def test_an_egg_info_s_requirements_come_from_its_requires_txt(tmp_path: Path) -> None:
    where = tmp_path / "old-1.0.egg-info"
    where.mkdir()
    (where / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: old\nVersion: 1.0\n", encoding="utf-8")
    (where / "requires.txt").write_text("six>=1\n\n[extra]\nnose\n", encoding="utf-8")
    installed = probe.Installed(metadata.PathDistribution(where))
    assert (installed.name, installed.version) == ("old", "1.0")
    assert installed.requires == ["six>=1", 'nose; extra == "extra"']


def test_the_encoded_report_round_trips_and_a_clipped_one_is_refused() -> None:
    import io

    text = json.dumps({"report_version": probe.REPORT_VERSION, "filler": "x" * 50_000}) + "\n"
    out = io.StringIO()
    probe.write_encoded(text, out)
    written = out.getvalue()
    lines = written.splitlines()
    assert lines[-1].startswith(probe.ENCODED_END) and all(len(line) < 4100 for line in lines)
    noise = "a warning on stdout\n"
    assert probe.read_encoded(noise + written + noise) == text  # other lines are left out
    for broken, why in (
        (written.replace(lines[0] + "\n", ""), "does not decode|bytes arrived"),  # a line lost
        ("\n".join(lines[:-1]), "no end line"),  # the end never came
        (written + lines[-1] + "\n", "several end lines"),
    ):
        with pytest.raises(ValueError, match=why):
            probe.read_encoded(broken)


def test_the_probe_reports_each_path_asked_for_as_a_layer_header_says_it(tmp_path: Path) -> None:
    """``--stat``: mode, owner and mtime of the meta layer's parents, read by the host into the headers the
    layer keeps; a path not reported is an error, not a guess."""
    import os
    import shutil
    import subprocess

    meta = tmp_path / "meta"  # as the image has it: the probe, the tree hashing beside it, the manifest
    meta.mkdir()
    shutil.copy(probe.__file__, meta / "inimage_probe.py")
    shutil.copy(treehash.__file__, meta / "treehash.py")
    (meta / "manifest.json").write_text(json.dumps({"lock_sha256": "0" * 64, "sources": [], "packages": []}))
    (tmp_path / "opt").mkdir(mode=0o750)
    os.utime(tmp_path / "opt", (1_500_000_000, 1_500_000_000))
    done = subprocess.run(
        [sys.executable, "-I", str(meta / "inimage_probe.py"), "--encoded", "--stat", str(tmp_path / "opt")]
        + ["--stat", "/nowhere", str(meta / "manifest.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(probe.read_encoded(done.stdout))
    assert report["stat"] == {str(tmp_path / "opt"): [0o750, os.getuid(), os.getgid(), 1_500_000_000], "/nowhere": None}
    headers = reported_parents({"stat": {"/opt": [0o755, 0, 0, 7], "/opt/envbuild": [0o700, 1, 2, 8]}})
    assert [(h.name, h.mode, h.uid, h.gid, h.mtime, h.isdir()) for h in headers.values()] == [
        ("opt", 0o755, 0, 0, 7, True),
        ("opt/envbuild", 0o700, 1, 2, 8, True),
    ]
    with pytest.raises(EngineError, match="did not report /opt/envbuild"):
        reported_parents({"stat": {"/opt": [0o755, 0, 0, 7], "/opt/envbuild": None}})


def test_a_report_that_would_inflate_past_its_word_or_the_limit_is_not_read() -> None:
    """The report comes from the image: a few kB of zeros that would inflate to GBs are refused, not read."""
    import base64
    import hashlib
    import zlib

    bomb = zlib.compress(b"\0" * 5_000_000, 9)  # 5 MB from ~5 kB
    lines = [probe.ENCODED_PREFIX + base64.b64encode(bomb).decode()]
    for length, why in ((5_000_000, "at most 1000"), (100, "100 bytes of sha256")):
        end = f"{probe.ENCODED_END}{hashlib.sha256(b'x').hexdigest()}:{length}"
        with pytest.raises(ValueError, match=why):
            probe.read_encoded("\n".join([*lines, end]), limit=1000)
    for bad in ([0o755, 0, 0, -1], [0o100755, 0, 0, 1], [0o755, 1 << 40, 0, 1], [0o755, 0, 0, True], "x"):
        with pytest.raises(EngineError, match="did not report /opt of the image"):
            reported_parents({"stat": {"/opt": bad, "/opt/envbuild": [0o755, 0, 0, 1]}})
