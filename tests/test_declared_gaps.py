"""What `lock update` reads from a source's tree where that tree is unusual: setup.cfg's ``file:`` and
``attr:`` forms and markers, a ``package-dir`` that maps one package, versions that stay unknown, and each
shape of declaration that cannot be read (said once as a warning and recorded as ``requires_unknown``).
Real repositories served by a real git daemon, read through the verify cache as `lock update` reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuild.git.cache import GitCache
from envbuild.lock import Source
from envbuild.lock.model import Install, Provides
from envbuild.update.read_requirements import read_source_requirements
from tests.lib.gitrepos import Served

pytestmark = pytest.mark.gitdaemon

DYNAMIC_VERSION = (
    "[project]\nname = 'gaps'\ndynamic = ['version']\n[tool.setuptools.dynamic]\nversion = {attr = 'gaps.V'}\n"
)

# Trees by case: {path: text, or bytes for a file that is not UTF-8}.
TREES: dict[str, dict[str, str | bytes]] = {
    "cfg-file-attr-marker": {
        "setup.py": "from setuptools import setup; setup()\n",
        "setup.cfg": (
            "[metadata]\nname = Cfg_Gaps\nversion = attr: cfg_gaps.__version__\n"
            "[options]\ninstall_requires =\n    six; python_version >= '3'\n    regex\n"
            "[options.extras_require]\ngpu = file: requirements/gpu.txt\n"
        ),
        "cfg_gaps/__init__.py": "__version__ = '2.4'\n",
        "requirements/gpu.txt": "torch>=2\n",
    },
    "cfg-install-file": {
        "setup.py": "from setuptools import setup; setup()\n",
        "setup.cfg": "[metadata]\nname = cfgfile\nversion = 1.0\n[options]\ninstall_requires = file: reqs.txt, more.txt\n",
        "reqs.txt": "six\n",
        "more.txt": "regex  # a comment\n",
    },
    "package-dir": {
        "pyproject.toml": (
            "[project]\nname = 'gaps'\ndynamic = ['version']\n[tool.setuptools]\npackage-dir = {gaps = 'lib/gaps'}\n"
            "[tool.setuptools.dynamic]\nversion = {attr = 'gaps.about.V'}\n"
        ),
        "lib/gaps/about.py": "V = '3.0'\n",
        "gaps/about.py": "V = '9.9'  # not the package setuptools would import\n",
    },
    # The version stays unknown, and nothing is guessed or run.
    "version-not-pep440": {"pyproject.toml": "[project]\nname = 'gaps'\nversion = 'the best one'\n"},
    "version-module-syntax-error": {"pyproject.toml": DYNAMIC_VERSION, "gaps.py": "V = (\n"},
    "version-module-without-it": {"pyproject.toml": DYNAMIC_VERSION, "gaps.py": "W = '1.0'\n"},
    "version-module-absent": {"pyproject.toml": DYNAMIC_VERSION, "README": "no gaps.py\n"},
    # What cannot be read.
    "requirements-not-utf8": {
        "pyproject.toml": (
            "[project]\nname = 'gaps'\nversion = '1'\ndynamic = ['dependencies']\n"
            "[tool.setuptools.dynamic]\ndependencies = {file = 'requirements.txt'}\n"
        ),
        "requirements.txt": b"caf\xe9>=1\n",
    },
    "build-requirement-not-pep508": {
        "pyproject.toml": "[build-system]\nrequires = ['setuptools>=', 'wheel']\n[project]\nname = 'gaps'\nversion = '1'\n",
    },
    "dependencies-not-a-list": {"pyproject.toml": "[project]\nname = 'gaps'\nversion = '1'\ndependencies = 'six'\n"},
    "dynamic-extra-without-file": {
        "pyproject.toml": (
            "[project]\nname = 'gaps'\nversion = '1'\ndynamic = ['optional-dependencies']\n"
            "[tool.setuptools.dynamic]\noptional-dependencies = {gpu = {attr = 'gaps.GPU'}}\n"
        ),
    },
    "cfg-not-ini-with-setup-py": {
        "setup.py": "from setuptools import setup; setup()\n",
        "setup.cfg": "[metadata]\nname = a\nname = b\n[options]\ninstall_requires = six\n",
    },
    "cfg-not-ini-alone": {"setup.cfg": "[metadata\nname = gaps\n"},
    "build-requires-not-a-list": {
        "pyproject.toml": "[build-system]\nrequires = 'setuptools'\n[project]\nname = 'gaps'\nversion = '1'\n",
    },
}


@pytest.fixture(scope="module")
def upstream(served: Served) -> dict[str, tuple[str, str]]:
    """{case: (url, commit)}: one served repository per tree of :data:`TREES`."""
    found = {}
    for case, files in TREES.items():
        repo = served.repo(f"declared-gaps-{case}")
        for path, data in files.items():
            if isinstance(data, bytes):  # Repo.commit writes text; `git add -A` takes this file too
                (repo.path / path).write_bytes(data)
        texts = {path: data for path, data in files.items() if isinstance(data, str)}
        found[case] = (served.url(f"declared-gaps-{case}", "daemon-filter"), repo.commit(files=texts))
    return found


def read(upstream: dict[str, tuple[str, str]], case: str, cache: Path) -> tuple[Source, list[str]]:
    url, commit = upstream[case]
    source = Source(name=case, repo=url, ref="main", ref_type="branch", commit=commit, install=Install())
    said: list[str] = []
    return read_source_requirements(source, GitCache(cache), progress=said.append), said


def test_setup_cfg_file_and_attr_forms_and_a_marker_are_read(
    upstream: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    source, _ = read(upstream, "cfg-file-attr-marker", tmp_path / "git")
    assert source.provides == Provides(name="cfg-gaps", version="2.4")
    assert source.requires == ('six; python_version >= "3"', "regex", 'torch>=2; extra == "gpu"')
    assert source.requires_unknown is None
    files, _ = read(upstream, "cfg-install-file", tmp_path / "git")
    assert files.requires == ("six", "regex") and files.requires_unknown is None


def test_a_package_dir_mapping_one_package_is_where_its_version_is_read(
    upstream: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    source, _ = read(upstream, "package-dir", tmp_path / "git")
    assert source.provides == Provides(name="gaps", version="3.0")


@pytest.mark.parametrize(
    "case",
    ["version-not-pep440", "version-module-syntax-error", "version-module-without-it", "version-module-absent"],
)
def test_a_version_that_cannot_be_read_statically_stays_unknown(
    upstream: dict[str, tuple[str, str]], tmp_path: Path, case: str
) -> None:
    source, said = read(upstream, case, tmp_path / "git")
    assert source.provides == Provides(name="gaps", version=None)
    assert source.requires == () and source.requires_unknown is None  # the rest is read as usual
    assert not any(line.startswith("warning:") for line in said), said


UNKNOWN = {
    "requirements-not-utf8": "requirements.txt: not UTF-8 text",
    "build-requirement-not-pep508": (
        "build requirements: [build-system].requires: not a PEP 508 requirement: "
        "Expected semicolon (after name with no version specifier) or end"
    ),
    "dependencies-not-a-list": "[project].dependencies is not a list of strings",
    "dynamic-extra-without-file": (
        "optional dependencies 'gpu' are dynamic, and the lock names no requirement files for it (`requires_files`)"
    ),
    "cfg-not-ini-with-setup-py": (
        "no [project] table: the metadata is computed by setup.py, and the lock names no requirement files "
        "for it (`requires_files`)"
    ),
    # It said "no pyproject.toml, setup.cfg or setup.py at the root of the tree", with a setup.cfg there.
    "cfg-not-ini-alone": (
        "no pyproject.toml or setup.py at the root of the tree, and its setup.cfg is not valid INI: "
        "not a Python project pip installs"
    ),
}


@pytest.mark.parametrize("case", list(UNKNOWN))
def test_what_cannot_be_read_is_unknown_with_why_and_said(
    upstream: dict[str, tuple[str, str]], tmp_path: Path, case: str
) -> None:
    source, said = read(upstream, case, tmp_path / "git")
    unknown = UNKNOWN[case]
    assert source.requires_unknown == unknown
    assert f"warning: {case}: {unknown}" in said
    if case == "build-requirement-not-pep508":
        assert (source.build_requires, source.requires) == (None, ())  # the runtime ones are still read
    elif case in ("cfg-not-ini-with-setup-py", "cfg-not-ini-alone"):
        assert source.provides is None and source.requires is None  # nothing taken from a setup.cfg not read
    else:
        assert source.requires is None


def test_build_requires_that_is_not_a_list_is_recorded_empty_with_a_note(
    upstream: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    source, said = read(upstream, "build-requires-not-a-list", tmp_path / "git")
    assert source.build_requires == () and source.requires == () and source.requires_unknown is None
    assert "build-requires-not-a-list: [build-system].requires is not a list of strings: pip would refuse it" in said
