"""The layout docs/architecture.md draws, held against the code's own imports.

The floor table is read from the page itself (its ``floors`` block), so the page and the code cannot
drift apart: every module of envbuild and envrun sits in a home of the table; an import runs only to its
own home or down a floor, never up and never sideways to another home of the same floor; and no modules
import each other round a circle. Every import counts, inside a function or for type checking only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
PACKAGES = ("envbuild", "envrun")


def floors() -> dict[str, int]:
    """{home: floor}; a home is a folder (``envbuild/git/``) or a module (``envbuild/fetch.py``)."""
    match = re.search(r"```floors\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    assert match is not None, f"{PAGE} has no ```floors block"
    table: dict[str, int] = {}
    for line in match.group(1).splitlines():
        number, *homes = line.split()
        for home in homes:
            assert home not in table, f"{home} is on two floors"
            table[home] = int(number)
    return table


def modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the two packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules ``name`` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module; `from pkg import name`, the package's face.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES and (module := resolve(target)) is not None:
                found.add(module)
    found.discard(name)
    return found


def home_of(name: str, path: Path, table: dict[str, int]) -> str | None:
    relative = path.relative_to(REPO).as_posix()
    if relative in table:
        return relative
    folders = [home for home in table if home.endswith("/") and relative.startswith(home)]
    return max(folders, key=len) if folders else None


def graph() -> tuple[dict[str, set[str]], dict[str, str]]:
    table = floors()
    known = modules()
    homes: dict[str, str] = {}
    unplaced = []
    for name, path in known.items():
        home = home_of(name, path, table)
        if home is None:
            unplaced.append(path.relative_to(REPO).as_posix())
        else:
            homes[name] = home
    assert not unplaced, f"modules in no home of {PAGE.name}'s floor table: {', '.join(unplaced)}"
    return {name: imports(name, path, known) for name, path in known.items()}, homes


def test_every_arrow_runs_down_a_floor_or_stays_home() -> None:
    table = floors()
    arrows, homes = graph()
    problems = []
    for name, targets in sorted(arrows.items()):
        for target in sorted(targets):
            here, there = homes[name], homes[target]
            if here == there:
                continue
            if table[there] > table[here]:
                problems.append(
                    f"{name} ({here}, floor {table[here]}) imports {target} ({there}, floor {table[there]}): up"
                )
            elif table[there] == table[here]:
                problems.append(f"{name} ({here}) imports {target} ({there}): sideways on floor {table[here]}")
    assert not problems, "\n".join(problems)


def test_no_modules_import_each_other_round_a_circle() -> None:
    arrows, _ = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(name: str) -> None:  # Tarjan's strongly connected components
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(arrows[name]):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == name:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(arrows):
        if name not in index:
            visit(name)
    assert not circles, "circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_every_home_of_the_table_exists() -> None:
    missing = [home for home in floors() if not (REPO / home).exists()]
    assert not missing, f"{PAGE.name} names homes that are not in the tree: {', '.join(missing)}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from envbuild.verify.pins import VerifyOptions\n", {"envbuild.verify.pins"}),
        ("def f():\n    from envbuild.image import build\n", {"envbuild.image.build"}),
        ("from . import build\n", {"envbuild.image.build"}),
        ("import envbuild.errors\n", {"envbuild.errors"}),
    ],
)
def test_the_import_reader_sees_every_kind_of_import(tmp_path: Path, source: str, expected: set[str]) -> None:
    """The check can fail: a lazy import and a relative one are arrows too."""
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    known = {
        "envbuild.errors": path,
        "envbuild.image": path,
        "envbuild.image.build": path,
        "envbuild.verify.pins": path,
    }
    assert imports("envbuild.image.probe", path, known) == expected


# ---- programs run by another interpreter ------------------------------------------------------------------


def elsewhere_table() -> dict[str, set[str]]:
    """{program path: what it may import beyond the standard library}, from the page's table."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Programs run by another interpreter", 1)[1].split("\n## ", 1)[0]
    table = {}
    for row in re.findall(r"^\| `([^`]+\.py(?:\.in)?)` \|[^|]*\| (.*) \|$", section, re.M):
        path, allowed = row
        table[path] = set(re.findall(r"`([\w.]+)`", allowed))
    return table


def test_each_program_run_elsewhere_imports_only_what_its_row_allows() -> None:
    import sys

    table = elsewhere_table()
    assert len(table) >= 10, table
    problems = []
    for path, allowed in table.items():
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue  # relative imports: none of these programs use them (a package may not be there)
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "__future__":
                    continue
                if not any(name == a or name.startswith(a + ".") for a in allowed):
                    problems.append(f"{path}: imports {name}, which its row of docs/architecture.md does not allow")
    assert not problems, "\n".join(problems)


def test_the_lint_group_of_programs_run_elsewhere_is_the_pages() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    group = pyproject.split("# Programs run by another interpreter", 1)[1].split("\n#", 1)[0]
    # A template (`X.py.in`) is linted under its rendered name (scripts/test): the same file.
    linted = {path if (REPO / path).is_file() else f"{path}.in" for path in re.findall(r'^"([^"]+\.py)"', group, re.M)}
    for path in linted:
        assert (REPO / path).is_file(), f"pyproject.toml ignores lint for {path}, which does not exist"
    assert linted <= set(elsewhere_table()), linted - set(elsewhere_table())
