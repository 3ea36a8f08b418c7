"""What a source declares, read from its files without running any of them (pure: the tree is a dict here;
tests/test_update_read_requirements.py reads real trees through git)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from envbuild.data.tomldepth import toml_too_deep
from envbuild.git.files import TreeFile
from envbuild.lock.model import Provides
from envbuild.update.declared import read_declared
from envbuild.update.reqfile import RequirementFileError, parse_files


def tree(files: Mapping[str, str]):  # type: ignore[no-untyped-def]
    """A reader over ``files``, recording which paths were asked for."""
    asked: list[str] = []

    def read(paths: Sequence[str]) -> dict[str, TreeFile]:
        asked.extend(paths)
        return {p: TreeFile(p, files[p].encode()) if p in files else TreeFile(p, None, "absent") for p in paths}

    read.asked = asked  # type: ignore[attr-defined]
    return read


STATIC = """
[build-system]
requires = ["setuptools>=64", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "Static_Pkg"
version = "1.2"
dependencies = ["transformers>=5.8.1,<5.9.0", "numpy; python_version >= '3.10'"]

[project.optional-dependencies]
dev = ["pytest", "flashinfer-python==0.6.8.post1; sys_platform != 'darwin'"]
"""


def test_static_pyproject_with_extras_as_markers() -> None:
    declared = read_declared(tree({"pyproject.toml": STATIC}))
    assert declared.provides == Provides(name="static-pkg", version="1.2")
    assert declared.build_requires == ("setuptools>=64", "wheel")
    assert declared.requires == (
        "transformers<5.9.0,>=5.8.1",
        'numpy; python_version >= "3.10"',
        'pytest; extra == "dev"',
        'flashinfer-python==0.6.8.post1; sys_platform != "darwin" and extra == "dev"',
    )
    assert declared.unknown is None


DYNAMIC = """
[build-system]
requires = ["setuptools"]
[project]
name = "dyn"
dynamic = ["version", "dependencies", "optional-dependencies"]
[tool.setuptools]
package-dir = {"" = "src"}
[tool.setuptools.dynamic]
version = {attr = "dyn.about.__version__"}
dependencies = {file = ["requirements/base.txt"]}
optional-dependencies = {gpu = {file = "requirements/gpu.txt"}}
"""


def test_dynamic_dependencies_come_from_the_files_setuptools_reads() -> None:
    read = tree(
        {
            "pyproject.toml": DYNAMIC,
            "src/dyn/about.py": '__version__ = "3.1.4"\n',
            "requirements/base.txt": "# runtime\n-r common.txt\nmsgspec  # serialisation\nblake3 \\\n  >=1.0\n",
            "requirements/common.txt": "--extra-index-url https://example.org/simple\nopenai>=1.0 --hash=sha256:00\n",
            "requirements/gpu.txt": "flashinfer-python\n",
            "src/dyn/__init__.py": "raise SystemExit('never run')\n",
        }
    )
    declared = read_declared(read)
    assert declared.provides == Provides(name="dyn", version="3.1.4")
    assert declared.requires == ("openai>=1.0", "msgspec", "blake3>=1.0", 'flashinfer-python; extra == "gpu"')
    assert any("--extra-index-url left out" in note for note in declared.notes)
    assert "src/dyn/__init__.py" not in read.asked  # type: ignore[attr-defined]


def test_a_computed_version_stays_unknown_without_importing_anything() -> None:
    files = {
        "pyproject.toml": DYNAMIC,
        "src/dyn/about.py": "__version__ = '.'.join(map(str, (0, 18, 0)))\n",
        "requirements/base.txt": "",
        "requirements/gpu.txt": "",
    }
    declared = read_declared(tree(files))
    assert declared.provides == Provides(name="dyn", version=None)
    assert declared.requires == ()
    assert any("is computed in src/dyn/about.py" in note for note in declared.notes)


def test_setup_py_only_is_unknown_unless_the_lock_names_the_files() -> None:
    files = {"setup.py": "import os; os.system('rm -rf /')\n", "requirements.txt": "six\nregex\n"}
    declared = read_declared(tree(files))
    assert declared.requires is None and declared.provides is None
    assert declared.unknown is not None and "computed by setup.py" in declared.unknown
    assert "`requires_files`" in declared.unknown
    assert declared.build_requires == ("setuptools>=40.8.0",)  # what pip builds it with

    named = read_declared(tree(files), requires_files=["requirements.txt"])
    assert named.requires == ("six", "regex") and named.unknown is None


def test_setup_cfg_install_requires() -> None:
    cfg = "[metadata]\nname = Old_Style\nversion = 2.0\n[options]\ninstall_requires =\n    six>=1.16\n    regex\n"
    cfg += "[options.extras_require]\ntest = pytest\n"
    declared = read_declared(tree({"setup.cfg": cfg, "setup.py": "from setuptools import setup; setup()\n"}))
    assert declared.provides == Provides(name="old-style", version="2.0")
    assert declared.requires == ("six>=1.16", "regex", 'pytest; extra == "test"')


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"pyproject.toml": "[project\nname = 'x'"}, "pyproject.toml is not valid TOML"),
        (
            {"pyproject.toml": "[project]\nname = 'x'\ndependencies = " + "[" * 100_000 + "]" * 100_000 + "\n"},
            "pyproject.toml nests arrays or tables more than 64 levels deep; not read",
        ),
        (
            {"pyproject.toml": "[project]\nname = 'x'\nurls = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n"},
            "more than 64 levels deep",
        ),
        ({"README.md": "docs only"}, "not a Python project pip installs"),
        (
            {"pyproject.toml": "[project]\nname = 'x'\ndynamic = ['dependencies']\n"},
            "[project].dependencies are dynamic",
        ),
        (
            {"pyproject.toml": "[project]\nname = 'x'\ndependencies = ['not a requirement ***']\n"},
            "not a PEP 508 requirement",
        ),
    ],
)
def test_what_cannot_be_read_says_why(files: dict[str, str], words: str) -> None:
    declared = read_declared(tree(files))
    assert declared.requires is None
    assert declared.unknown is not None and words in declared.unknown


def test_requirement_files_refuse_what_cannot_be_pinned_by_name() -> None:
    def load(path: str) -> tuple[str | None, str]:
        texts = {
            "a.txt": "-e git+https://example.org/x.git#egg=x\n",
            "b.txt": "-r ../../etc/passwd\n",
            "c.txt": "x @ https://example.org/x-1.0.tar.gz\n",
        }
        return (texts[path], "") if path in texts else (None, "absent")

    with pytest.raises(RequirementFileError, match="a.txt:1: -e names no distribution"):
        parse_files(["a.txt"], load)
    with pytest.raises(RequirementFileError, match="outside the tree"):
        parse_files(["b.txt"], load)
    with pytest.raises(RequirementFileError, match="missing.txt: absent"):
        parse_files(["missing.txt"], load)
    parsed = parse_files(["c.txt"], load)
    assert parsed.requirements == ["x"] and "direct URL reference; recorded by name" in parsed.notes[0]


def test_includes_that_include_each_other_are_read_once() -> None:
    texts = {"a.txt": "-r b.txt\nsix\n", "b.txt": "-r a.txt\nregex\n"}
    parsed = parse_files(["a.txt"], lambda path: (texts[path], ""))
    assert parsed.requirements == ["regex", "six"] and parsed.read == ["a.txt", "b.txt"]


def test_brackets_in_strings_and_comments_do_not_count_as_nesting() -> None:
    q3, a3 = '"' * 3, "'" * 3
    text = "[project]\nname = 'x'  # " + "[" * 100 + "\n"
    text += 'description = "' + "[{" * 100 + '\\"[["\n'
    text += f"readme = {a3}" + "[" * 100 + f"{a3}\n"
    text += f"license = {q3}" + "{" * 100 + f'\\" {q3}\n'
    text += "dependencies = [[[['six']]]]\n"
    assert not toml_too_deep(text)
    assert toml_too_deep("x = " + "[" * 65 + "]" * 65)
    assert not toml_too_deep("x = " + "[" * 64 + "]" * 64)
