"""stage_packages.py, the script the packages container runs around `pip install` on the base's python3:
run here with a site directory under tmp_path on its sys.path, and pip's work done by hand."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from envbuild.image.render import load_template


def write(path: Path, text: str = "x\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def run(script: Path, *args: str, path: list[Path]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_what_the_lock_replaces_is_named_as_pip_would_uninstall_it(tmp_path: Path) -> None:
    live = tmp_path / "live"
    site, debian = live / "lib" / "site", live / "debian"
    # the base: tinyone 0.9 where pip installs, with bytecode and a script; tinyone 0.8 in another
    # directory of sys.path (a distro's own, which pip leaves: envbuild removes it whole, or Python would
    # find two); another package
    old = site / "tinyone-0.9.dist-info"
    write(old / "METADATA", "Metadata-Version: 2.1\nName: TinyOne\nVersion: 0.9\n\nName: not this\n")
    write(
        old / "RECORD",
        "tinyone/__init__.py,sha256=x,2\ntinyone/old_only.py,,\ntinyone/__pycache__/__init__.cpython-311.pyc,,\n"
        "../../bin/tinyone,,\ntinyone-0.9.dist-info/METADATA,,\ntinyone-0.9.dist-info/RECORD,,\n",
    )
    write(site / "tinyone" / "__init__.py", "VERSION = '0.9'\n")
    write(site / "tinyone" / "old_only.py")
    write(site / "tinyone" / "__pycache__" / "__init__.cpython-311.pyc")
    write(site / "tinyone" / "__pycache__" / "old_only.cpython-311.pyc")  # not in RECORD: goes with its .py
    write(live / "bin" / "tinyone")
    write(debian / "tinyone-0.8.dist-info" / "METADATA", "Name: tinyone\nVersion: 0.8\n")
    write(debian / "tinyone-0.8.dist-info" / "RECORD", "tinyone/__init__.py,,\n")
    write(debian / "tinyone" / "__init__.py")
    write(site / "other-1.0.dist-info" / "METADATA", "Name: other\nVersion: 1.0\n")
    write(site / "other" / "__init__.py")
    requirements = write(tmp_path / "requirements.txt", f"# envbuild\ntinyone==1.0 --hash=sha256:{'a' * 64}\n")
    script = write(tmp_path / "stage_packages.py", load_template("stage_packages.py.in"))

    before = write(tmp_path / "before.json", run(script, "before", str(requirements), path=[site, debian]))
    assert sorted((d["info"], d["version"]) for d in json.loads(before.read_text())) == [
        (str(debian / "tinyone-0.8.dist-info"), "0.8"),
        (str(old), "0.9"),
    ]
    # what pip install --ignore-installed tinyone 1.0 writes: over the old files of the same names
    new = site / "tinyone-1.0.dist-info"
    write(new / "METADATA", "Metadata-Version: 2.1\nName: tinyone\nVersion: 1.0\n")
    write(new / "RECORD", "tinyone/__init__.py,,\n../../bin/tinyone,,\ntinyone-1.0.dist-info/METADATA,,\n")
    write(site / "tinyone" / "__init__.py", "VERSION = '1.0'\n")
    write(live / "bin" / "tinyone", "#!/usr/bin/python3\n")
    (live / "bin").chmod(0o2775)

    report = json.loads(run(script, "after", str(requirements), str(before), path=[site, debian]))
    assert report["targets"] == [str(site)]
    assert report["replaced"] == ["tinyone 0.9", "tinyone 0.8"]
    # pip's uninstall, less what the new version wrote again; __pycache__ lost every entry: whole; and
    # the other directory's copy whole (its package directory emptied: whole; the directory itself stays)
    assert report["remove"] == sorted(
        [
            str(old),
            str(site / "tinyone" / "__pycache__"),
            str(site / "tinyone" / "old_only.py"),
            str(debian / "tinyone"),
            str(debian / "tinyone-0.8.dist-info"),
        ]
    )
    assert report["distro"] == [
        {"name": "tinyone", "version": "0.8", "path": str(debian / "tinyone-0.8.dist-info"), "owner": None}
    ]
    assert report["kept"] == []
    for path in report["remove"]:
        parent = Path(path).parent
        while str(parent) != "/":
            info = parent.lstat()
            assert report["directories"][str(parent)] == [stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid]
            parent = parent.parent
    assert (site / "tinyone" / "old_only.py").exists()  # it only names them; a layer removes them


def test_nothing_to_replace_is_an_empty_report(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write(site / "unrelated-1.0.dist-info" / "METADATA", "Name: unrelated\nVersion: 1.0\n")
    requirements = write(tmp_path / "requirements.txt", "tinyone==1.0\n")
    script = write(tmp_path / "stage_packages.py", load_template("stage_packages.py.in"))
    before = write(tmp_path / "before.json", run(script, "before", str(requirements), path=[site]))
    assert json.loads(before.read_text()) == []
    write(site / "tinyone-1.0.dist-info" / "METADATA", "Name: tinyone\nVersion: 1.0\n")
    report = json.loads(run(script, "after", str(requirements), str(before), path=[site]))
    assert report == {
        "directories": {},
        "distro": [],
        "kept": [],
        "remove": [],
        "replaced": [],
        "targets": [str(site)],
    }


def test_unstamp_removes_uv_s_clock_file_and_its_record_row_only(tmp_path: Path) -> None:
    """What a source's step runs after uv installed the source (``-I -S -B``, as the step runs it), here on a
    virtual environment's Python, whose site is under tmp_path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = tmp_path / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    rows = (
        "beta/__init__.py,sha256=abc,14\r\n"
        "beta-0.1.dist-info/direct_url.json,sha256=def,37\r\n"
        "beta-0.1.dist-info/uv_cache.json,sha256=ghi,137\r\n"
        "beta-0.1.dist-info/RECORD,,\r\n"
    )
    record = write(site / "beta-0.1.dist-info" / "RECORD", "")
    record.write_bytes(rows.encode())  # csv's line ends, as an installer writes them: kept as they are
    write(site / "beta-0.1.dist-info" / "uv_cache.json", '{"timestamp":{"secs_since_epoch":1796465907}}')
    untouched = write(site / "other-1.0.dist-info" / "RECORD", "other-1.0.dist-info/uv_cache.json,,\n")
    script = tmp_path / "stage_packages.py"
    script.write_text(load_template("stage_packages.py.in"))
    done = subprocess.run([str(python), "-I", "-S", "-B", str(script), "unstamp"], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (site / "beta-0.1.dist-info" / "uv_cache.json").exists()
    assert record.read_bytes() == rows.replace("beta-0.1.dist-info/uv_cache.json,sha256=ghi,137\r\n", "").encode()
    assert untouched.read_text() == "other-1.0.dist-info/uv_cache.json,,\n"  # a RECORD without the file: left
    assert not list(tmp_path.rglob("__pycache__"))  # -B: no bytecode written


BACKEND_SOURCE = '''"""A build backend's module."""
KINDS = {"sdist", "wheel", "editable", "metadata", "requires", "prepare", "build", "config", "backend"}


def supported(kind):
    return kind in {"sdist", "wheel", "editable", "metadata", "requires", "prepare", "build", "config"}
'''


def _backend_site(root: Path, crlf: bool) -> tuple[Path, Path]:
    """A site under ``root`` with the lock's backend 1.0 (a RECORD in ``crlf`` line ends and a file no Python
    compiles), the base's backend 0.9 in another directory of sys.path, and a package no source builds with."""
    site, other = root / "site", root / "distro"
    write(site / "backend" / "__init__.py", BACKEND_SOURCE)
    write(site / "backend" / "template.py", "def broken(:\n")  # a template, not Python: left as it is
    write(site / "backend-1.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: Backend\nVersion: 1.0\n")
    end = "\r\n" if crlf else "\n"
    rows = ["backend/__init__.py,sha256=x,1", "backend/template.py,,", "backend-1.0.dist-info/RECORD,,"]
    write(site / "backend-1.0.dist-info" / "RECORD", "").write_bytes(end.join(rows).encode() + end.encode())
    write(site / "plain" / "__init__.py", "X = {'a', 'b'}\n")
    write(site / "plain-2.0.dist-info" / "METADATA", "Name: plain\nVersion: 2.0\n")
    write(site / "plain-2.0.dist-info" / "RECORD", "plain/__init__.py,,\n")
    write(other / "backend" / "__init__.py", "OLD = 1\n")
    write(other / "backend-0.9.dist-info" / "METADATA", "Name: backend\nVersion: 0.9\n")
    write(other / "backend-0.9.dist-info" / "RECORD", "backend/__init__.py,,\n")
    write(site / "norecord-1.0.dist-info" / "METADATA", "Name: norecord\nVersion: 1.0\n")  # no RECORD: skipped
    write(site / "norecord" / "__init__.py", "X = 1\n")
    return site, other


def test_compile_writes_the_lock_s_backends_bytecode_checked_by_hash_the_same_on_every_run(tmp_path: Path) -> None:
    """``compile`` as the packages step runs it (``PYTHONHASHSEED=0``): bytecode beside each ``.py`` the
    named distribution's RECORD lists, for the version the lock installs only, checked by hash (flags 0b11,
    the source's hash: Python never compares its mtime, which every layer sets to an epoch), a RECORD row
    each in the file's own line ends; the same bytes on every run, a constant set included (Python 3.11
    marshals one in a fixed order; before it, in the hash seed's, which the step fixes); a file that does not compile left as it is; another distribution, and the
    base's other version of the name, untouched."""
    import base64
    import hashlib
    import importlib.util
    import shutil

    made = {}
    for run, (crlf, seed) in enumerate(((True, "0"), (False, "0"), (False, "1"), (True, "2"))):
        root = tmp_path / "run"  # one path: the bytecode names its source
        shutil.rmtree(root, ignore_errors=True)
        site, other = _backend_site(root, crlf)
        requirements = write(root / "requirements.txt", "backend==1.0 --hash=sha256:aa\nplain==2.0\nnorecord==1.0\n")
        script = write(root / "stage_packages.py", load_template("stage_packages.py.in"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(other)]), "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, str(script), "compile", str(requirements), "Backend", "absent", "norecord"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        source = site / "backend" / "__init__.py"
        pyc = Path(importlib.util.cache_from_source(str(source)))
        data = pyc.read_bytes()
        assert data[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(data[4:8], "little") == 0b11
        assert data[8:16] == importlib.util.source_hash(source.read_bytes())
        made[run] = data
        assert not (site / "backend" / "__pycache__" / f"template.{sys.implementation.cache_tag}.pyc").exists()
        assert not list((site / "plain").rglob("*.pyc")) and not list(other.rglob("*.pyc"))
        assert not list((site / "norecord").rglob("*.pyc"))
        end = "\r\n" if crlf else "\n"
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (site / "backend-1.0.dist-info" / "RECORD").read_bytes().decode().split(end) == [
            "backend/__init__.py,sha256=x,1",
            "backend/template.py,,",
            "backend-1.0.dist-info/RECORD,,",
            f"{pyc.relative_to(site)},sha256={digest},{len(data)}",
            "",
        ]
    assert made[0] == made[1] == made[2] == made[3]
