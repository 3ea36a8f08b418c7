#!/usr/bin/env python3
"""The in-image check: what is really installed, printed as JSON. Standard library only.

Shipped into the image as ``/opt/envbuild/meta/inimage_probe.py``, with the tree hashing it uses
(:mod:`envbuild.git.treehash`) beside it as ``treehash.py``, and run with the image's ``python3`` against
``/opt/envbuild/meta/manifest.json``. It reports facts only; judging them against
the lock is :func:`envbuild.image.inimage_verdict.compare_inimage`, on the host.

Each source is checked by content, not by trusting a marker: the git tree SHA of the files the
manifest lists is recomputed from the installed directory, so a source is "its pinned commit" when
that SHA equals the commit's tree. Files the build added (``*.egg-info``, ``build/``) are not listed
and so do not count; a listed file that is missing or changed does.

The environment is checked whole, after every install: every installed distribution's ``Requires-Dist``
and the marker environment are reported, for the host to judge with ``pip check``'s semantics (every
requirement whose marker holds, without extras, met by an installed distribution at a version its
specifier allows, pre-releases included), and every installed source's top-level packages imported, each in its own interpreter (a crash or a hang
is one failed import, not a lost report), up to IMPORTS_AT_ONCE side by side. Each distribution's
metadata is read once. A build host has no NPU driver: imports run with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (torch >= 2.5 would load torch_npu, and with it the driver, at
``import torch``), and the modules the manifest names as skipped are not imported at all. Waivers are
the host's business (:mod:`envbuild.image.inimage_verdict`): this script reports every problem.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

if __package__:  # imported on the host, as envbuild.image.inimage_probe
    from envbuild.git.treehash import git_trees
else:  # run as a script in the image, where envbuild is not installed: its copy ships beside this file
    import importlib.util

    def _beside(name: str) -> Any:
        """The module ``name`` shipped in this script's directory, loaded by path: ``python3 -I`` (how
        the check runs) keeps that directory off ``sys.path``, and nothing else may be imported from it."""
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    git_trees = _beside("treehash").git_trees

# 3: each source reports its submodules' trees; 4: every copy of a distribution, where it is; 5: the
# requirements as read, judged on the host; 6: the stat of the paths asked for
REPORT_VERSION = 6
IMPORT_TIMEOUT = 600
IMPORTS_AT_ONCE = 4
# A Requires-Dist line that applies only to an extra: its marker is exactly `extra == "name"`.
EXTRA_ONLY = re.compile(r"""^[^;]*;\s*extra\s*==\s*(?:"[^"]*"|'[^']*')\s*$""")
# Directories at a source's root that hold no importable part of it, when its metadata names none.
NOT_PACKAGES = {"test", "tests", "doc", "docs", "example", "examples", "benchmark", "benchmarks", "tools", "scripts"}
DEFAULT_MANIFEST = "/opt/envbuild/meta/manifest.json"
# A line as the email package ends it (not str.splitlines: a form feed in a license is no line end), read
# one at a time: the headers are a few dozen lines before a body that can be a README of thousands (torch's:
# splitting every METADATA whole was 0.02 s of the check at 226 distributions). And what it reads as a
# header line: a name of printable characters but ":", then ":".
LINE = re.compile(r"([^\r\n]*)(?:\r\n|\r|\n|\Z)")
HEADER_LINE = re.compile(r"[\x21-\x39\x3b-\x7e]*:")
# --encoded: the report as a build's log passes it on (:func:`write_encoded`)
ENCODED_FLAG = "--encoded"
STAT_FLAG = "--stat"
ENCODED_PREFIX = "envbuild-report:"
ENCODED_END = "envbuild-report-end:"
ENCODED_LINE = 4000
ENCODED_RATE = 128 << 10
ENCODED_LIMIT = 256 << 20  # bytes of a report the host reads: the real lock's is ~150 kB
COMMIT_MARKER = ".envbuild-commit"


class Installed:
    """One installed distribution, its metadata's headers parsed once, by :func:`headers` (``importlib
    .metadata`` parses METADATA again, body and all, with the email package on every ``.version``,
    ``.metadata`` and ``.requires``: most of the check's time, where it is asked hundreds of times)."""

    def __init__(self, dist) -> None:
        self.dist = dist
        self.path = str(getattr(dist, "_path", ""))
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
        found = headers(text)
        self.name = (found.get("name") or [""])[0]
        self.version = (found.get("version") or [""])[0]
        # An egg-info's requirements are in its requires.txt, which importlib.metadata reads.
        self._requires: list | None = found.get("requires-dist", [] if self.path.endswith(".dist-info") else None)

    @property
    def requires(self) -> list:
        if self._requires is None:
            self._requires = list(self.dist.requires or [])
        return self._requires

    def read_text(self, name: str):
        return self.dist.read_text(name)

    @property
    def files(self):
        return self.dist.files


def headers(text: str) -> dict:
    """{lower-case name: [values]} of a core metadata file's headers, as the email package reads them
    (:func:`header_lines`); its lines are read one at a time, so the body, a long description, is never
    split."""
    return header_lines(match[1] for match in LINE.finditer(text))


def header_lines(lines) -> dict:
    """The headers of a core metadata file's ``lines`` (without their line ends): the lines before the first
    empty one (nothing but its line ending) or the first that is no header, a line starting with white
    space continuing the header before it, even with nothing else on it (a License field's blank lines,
    as setuptools writes them)."""
    found: dict = {}
    last: list = []
    for line in lines:
        if not line:
            break
        if line[0] in " \t":
            if last:
                last[-1] += "\n" + line
            continue
        if not HEADER_LINE.match(line):
            break
        name, _, value = line.partition(":")
        last = found.setdefault(name.strip().lower(), [])
        last.append(value.strip())
    return found


def scan() -> list:
    """Every installed distribution with a name, in ``sys.path`` order (the first of a name is imported)."""
    from importlib import metadata

    return [found for found in map(Installed, metadata.distributions()) if found.name]


def distributions(scanned: list) -> tuple[dict[str, list[str]], dict[str, str], dict[str, list[list[str]]]]:
    """Installed distributions by normalised name: every version found, where the first lives, and
    every copy as [version, metadata directory] in ``sys.path`` order (the first is the one imported)."""
    found: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    copies: dict[str, list[list[str]]] = {}
    for dist in scanned:
        key = _normalize(dist.name)
        found.setdefault(key, []).append(dist.version)
        where.setdefault(key, dist.path)
        copies.setdefault(key, []).append([dist.version, dist.path])
    return {k: sorted(v) for k, v in sorted(found.items())}, dict(sorted(where.items())), dict(sorted(copies.items()))


def source_report(entry: dict) -> dict:
    """The source's tree and each written submodule's, recomputed from the files the manifest lists."""
    path = entry["path"]
    report: dict = {"path": path, "exists": os.path.isdir(path), "commit_marker": None, "tree": None, "unreadable": []}
    report["submodules"] = {}
    if not report["exists"]:
        return report
    try:
        with open(os.path.join(path, COMMIT_MARKER), encoding="utf-8") as handle:
            report["commit_marker"] = handle.read().strip()
    except OSError:
        pass
    subs = entry.get("submodules", [])
    gitlinks = {s["path"]: s["commit"] for s in subs if s.get("commit")}
    written = {s["path"] for s in subs if not s.get("skip")}
    trees, report["unreadable"] = git_trees(path, entry["files"], gitlinks, written)
    report["tree"] = trees[""]
    report["submodules"] = {p: trees.get(p) for p in sorted(written)}
    return report


def _normalize(name: str) -> str:
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def installed_distributions(scanned: list) -> dict:
    """{normalised name: distribution}, the first on sys.path winning, as pip sees them."""
    found: dict = {}
    for dist in scanned:
        found.setdefault(_normalize(dist.name), dist)
    return found


def marker_environment() -> dict:
    """The values PEP 508 markers are evaluated against, as this interpreter has them (what
    ``packaging.markers.default_environment`` computes, in the image rather than on the host)."""
    import platform

    def version(info) -> str:
        text = f"{info.major}.{info.minor}.{info.micro}"
        return text if info.releaselevel == "final" else text + info.releaselevel[0] + str(info.serial)

    return {
        "implementation_name": sys.implementation.name,
        "implementation_version": version(sys.implementation.version),
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def requirements(dists: dict) -> dict:
    """What ``pip check`` would judge, as facts: each installed distribution's version and its
    ``Requires-Dist`` lines, and the marker environment; the host parses and judges them
    (:func:`envbuild.image.inimage_verdict.consistency_problems`), with the packaging library ``lock
    verify`` uses — parsing them here, with the pyparsing-based parser pip ships, was most of the check's
    time (0.2 s of 0.28 s on the scale image).

    A requirement whose whole marker is ``extra == "…"`` cannot hold with no extra asked for, so it is not
    reported (ray alone declares some 400); ``lock verify``'s closure check names one that does not
    parse ("not a PEP 508 requirement")."""
    return {
        "markers": marker_environment(),
        "distributions": {
            key: {"version": dist.version, "requires": [r for r in dist.requires or [] if not EXTRA_ONLY.match(r)]}
            for key, dist in sorted(dists.items())
        },
    }


def _origin(dist) -> str:
    try:
        data = json.loads(dist.read_text("direct_url.json") or "{}")
    except (ValueError, OSError):
        return ""
    return str(data.get("url", "")) if isinstance(data, dict) else ""


def source_distribution(entry: dict, dists: dict):
    """The distribution the build installed from this source: by where it came from (pip records the
    source's directory for an editable install and for a wheel it built from it), else by name."""
    directory = "file://" + entry["path"]
    for dist in dists.values():
        if _origin(dist).rstrip("/") == directory:
            return dist
    return dists.get(_normalize(entry.get("distribution") or entry["name"]))


def top_level_names(dist, path: str) -> list:
    """What a distribution installs at the top level: top_level.txt, else its RECORD, else the source
    directory's packages."""
    text = dist.read_text("top_level.txt") if dist is not None else None
    names = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not names and dist is not None:
        for file in dist.files or []:
            parts = str(file).split("/")
            if len(parts) == 1 and parts[0].endswith(".py"):
                name = parts[0][:-3]
            elif len(parts) > 1 and not parts[0].endswith((".dist-info", ".data", ".egg-info")):
                name = parts[0]
            else:
                continue
            if name.isidentifier() and name != "__pycache__" and not name.startswith("__editable__"):
                names.append(name)
    if not names:
        for base in (path, os.path.join(path, "src")):
            if os.path.isdir(base):
                names += [
                    name
                    for name in sorted(os.listdir(base))
                    if name.isidentifier()
                    and name not in NOT_PACKAGES
                    and os.path.isfile(os.path.join(base, name, "__init__.py"))
                ]
    return sorted(set(names))


# An interpreter for one import, started before its module is known (its start, ~20 ms, then overlaps the
# metadata scan): it reads the module's name from stdin, then imports it; an empty name imports nothing.
IMPORT_CODE = "import importlib, sys; name = sys.stdin.readline().strip(); name and importlib.import_module(name)"


def _interpreter():
    """A fresh interpreter for :data:`IMPORT_CODE`, with the site as users have it (not ``-I``)."""
    import subprocess

    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    return subprocess.Popen(
        [sys.executable, "-c", IMPORT_CODE],
        cwd="/",
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def import_module(name: str, process=None) -> dict:
    """Import one module in a fresh interpreter (``process``: one :func:`_interpreter` started before);
    its last error line if it fails."""
    import subprocess

    process = process or _interpreter()
    try:
        _, stderr = process.communicate(name + "\n", timeout=IMPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"module": name, "ok": False, "error": f"did not finish in {IMPORT_TIMEOUT} s"}
    if process.returncode == 0:
        return {"module": name, "ok": True, "error": None}
    lines = [line for line in stderr.splitlines() if line.strip()]
    error = lines[-1][:500] if lines else f"exit status {process.returncode}"
    return {"module": name, "ok": False, "error": error}


class Importers:
    """Up to IMPORTS_AT_ONCE interpreters started at once (``expected``: how many imports there may be),
    each waiting for its module (:meth:`run`); the ones not needed are told to import nothing."""

    def __init__(self, expected: int) -> None:
        self.slots = max(1, min(expected, os.cpu_count() or 1, IMPORTS_AT_ONCE))
        self.ready = [_interpreter() for _ in range(min(expected, self.slots))]

    def run(self, names: list) -> dict:
        """Each module imported in its own interpreter, ``slots`` side by side (an import of torch's stack
        is seconds of one core, and memory); {module: result} in the order given."""
        import queue
        import threading

        unique = list(dict.fromkeys(names))
        todo: queue.Queue = queue.Queue()
        for name in unique:
            todo.put(name)
        results: dict = {}
        ready, lock = list(self.ready), threading.Lock()
        self.ready = []

        def work() -> None:
            while True:
                try:
                    name = todo.get_nowait()
                except queue.Empty:
                    return
                with lock:
                    process = ready.pop() if ready else None
                results[name] = import_module(name, process)

        workers = [threading.Thread(target=work) for _ in range(min(self.slots, len(unique)))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for process in ready:  # started for imports that turned out not to be there
            process.communicate("\n")
        return {name: results[name] for name in unique}


def import_all(names: list) -> dict:
    """Each module imported in its own interpreter, a few side by side."""
    return Importers(len(set(names))).run(names)


def top_levels(entry: dict, dists: dict) -> tuple:
    """The source's distribution, the top-level modules the check imports, and those the manifest skips
    (by name); none for a source installed as files only."""
    if entry.get("mode", "editable") == "none":
        return None, [], []
    dist = source_distribution(entry, dists)
    skip = {s["name"] for s in entry.get("skip_imports", [])}
    names = top_level_names(dist, entry["path"])
    return dist, [n for n in names if n not in skip], [n for n in names if n in skip]


def import_report(levels: tuple, imported: dict) -> dict:
    """A source's distribution and its imports (``levels``: :func:`top_levels`), each result looked up in
    ``imported`` (module → result)."""
    dist, names, skipped = levels
    return {
        "distribution": _normalize(dist.name) if dist is not None else None,
        "version": dist.version if dist is not None else None,
        "imports": [imported[name] for name in names],
        "skipped": skipped,
    }


def report(manifest_path: str) -> dict:
    """What is installed, as the host judges it (:func:`envbuild.image.inimage_verdict.compare_inimage`)."""
    import threading

    with open(manifest_path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    sources = manifest.get("sources", [])
    # The interpreters for the imports start while the metadata is scanned; they import while the trees
    # are hashed here.
    importers = Importers(sum(s.get("mode", "editable") != "none" for s in sources))
    scanned = scan()
    found, where, copies = distributions(scanned)
    dists = installed_distributions(scanned)
    levels = [top_levels(s, dists) for s in sources]
    imported: dict = {}
    importing = threading.Thread(
        target=lambda: imported.update(importers.run([name for _, names, _ in levels for name in names]))
    )
    importing.start()
    trees = [source_report(s) for s in sources]
    importing.join()
    return {
        "report_version": REPORT_VERSION,
        "manifest": manifest_path,
        "lock_sha256": manifest.get("lock_sha256"),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "distributions": found,
        "locations": where,
        "copies": copies,
        "sources": {
            s["name"]: {**tree, **import_report(level, imported)} for s, tree, level in zip(sources, trees, levels)
        },
        "requires": requirements(dists),
    }


def write_encoded(text: str, out, rate: int = ENCODED_RATE) -> None:
    """``text`` as lines a build's log passes on whole: compressed, base64 in lines of
    :data:`ENCODED_LINE` characters after :data:`ENCODED_PREFIX`, then :data:`ENCODED_END` with its
    sha256 and length (so that a clipped log is found out). BuildKit clips a step's output beyond a rate
    (200 KiB/s on docker 20.10): at most ``rate`` bytes are written each second."""
    import base64
    import hashlib
    import time
    import zlib

    data = text.encode("utf-8")
    encoded = base64.b64encode(zlib.compress(data, 6)).decode("ascii")
    start, written = time.monotonic(), 0
    for at in range(0, len(encoded), ENCODED_LINE):
        line = f"{ENCODED_PREFIX}{encoded[at : at + ENCODED_LINE]}\n"
        while written + len(line) > rate * (1 + int(time.monotonic() - start)):
            out.flush()
            time.sleep(0.1)
        out.write(line)
        written += len(line)
    out.write(f"{ENCODED_END}{hashlib.sha256(data).hexdigest()}:{len(data)}\n")
    out.flush()


def read_encoded(output: str, limit: int = ENCODED_LIMIT) -> str:
    """The text :func:`write_encoded` wrote into ``output`` (other lines are left out); a ValueError
    when it did not come whole, or says it is longer than ``limit`` bytes (it is decompressed no further:
    a few kB that would inflate to GBs are refused, not read)."""
    import base64
    import binascii
    import hashlib
    import zlib

    lines = output.splitlines()
    ends = [line for line in lines if line.startswith(ENCODED_END)]
    if len(ends) != 1:
        raise ValueError("no end line" if not ends else "several end lines")
    sha256, _, length = ends[0][len(ENCODED_END) :].partition(":")
    if not length.isdigit() or int(length) > limit:
        raise ValueError(f"it says it is {length[:20]!r} bytes long, at most {limit} are read")
    encoded = "".join(line[len(ENCODED_PREFIX) :] for line in lines if line.startswith(ENCODED_PREFIX))
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(base64.b64decode(encoded, validate=True), int(length) + 1)
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"it does not decode: {exc}") from None
    if str(len(data)) != length or hashlib.sha256(data).hexdigest() != sha256 or inflate.unconsumed_tail:
        raise ValueError(f"{len(data)} bytes arrived, not the {length} bytes of sha256 {sha256[:12]}")
    return data.decode("utf-8")


def stat_of(path: str) -> list | None:
    """[mode, uid, gid, mtime] of ``path`` (not followed), as a layer's tar header says them; None if absent."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return [info.st_mode & 0o7777, info.st_uid, info.st_gid, int(info.st_mtime)]


def main(argv: list[str]) -> int:
    """``inimage_probe.py [--encoded] [--stat PATH]... [MANIFEST]``: the report, with the mode, owner and
    mtime of each ``--stat`` path (the directories a layer envbuild writes keeps as the image has them)."""
    args, encoded, stat = argv[1:], False, []
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == ENCODED_FLAG:
            encoded = True
        elif flag == STAT_FLAG and args:
            stat.append(args.pop(0))
        else:
            raise SystemExit(f"inimage_probe.py: unknown option {flag}")
    facts = report(args[0] if args else DEFAULT_MANIFEST)
    facts["stat"] = {path: stat_of(path) for path in stat}
    text = json.dumps(facts, indent=1, sort_keys=True) + "\n"
    if encoded:
        write_encoded(text, sys.stdout)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
