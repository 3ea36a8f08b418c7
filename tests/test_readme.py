"""The README and docs/ held to the code: their commands run or parse, their links resolve.

- The README's quick start and test command are followed literally in a fresh clone of the committed
  HEAD, as a new user (and CI) gets it; the quick start must print what the README says a machine
  without GitHub sees.
- Every `envbuild` / `envrun` command line in a shell block of README.md or docs/*.md is parsed by the
  real command-line parser, in-process (nothing runs: the handler is replaced), and every ``usage:``
  block in docs/ is the parser's own usage text, so the reference cannot drift from the CLI.
- Every relative link (and anchor) resolves, the README stays a page a newcomer reads (≤ 200 lines), the
  docs index lists every page, the repository paths and Python names the docs mention exist, and the
  status tables of `lock verify` are the statuses the code reports.

The commands and texts are read out of the Markdown (not copied here), so the documents cannot drift
from what works.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import shlex
import shutil
import subprocess
import typing
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.lib.gitrepos import git

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 200
CLIS = ("envbuild", "envrun")
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}


# ---- reading Markdown ----------------------------------------------------------------------------------


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def shown(path: Path) -> str:
    return str(path.relative_to(REPO))


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    language: str
    body: str


def blocks(path: Path) -> list[Block]:
    """Every fenced code block of a Markdown file."""
    found, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(```+)\s*(\S*)", lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1))), None)
        assert end is not None, f"{shown(path)}:{i + 1}: a code block is never closed"
        found.append(Block(path, i + 1, fence.group(2), "\n".join(lines[i + 1 : end])))
        i = end + 1
    return found


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^(```+).*?^\1[^\n]*$", "", text, flags=re.M | re.S)


def inline_code(text: str) -> list[str]:
    return [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", prose(text))]


def without_inline_code(text: str) -> str:
    return re.sub(r"(`+)(.+?)\1", "code", prose(text))


def section(path: Path, heading: str) -> str:
    """The text under a heading (any level), up to the next heading of that level or higher."""
    level, taken, in_block = 0, [], False
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("```"):
            in_block = not in_block
        elif not in_block and (match := re.match(r"^(#+) (.*)$", line)):
            if level and len(match.group(1)) <= level:
                break
            if not level and re.match(rf"{re.escape(heading)}\b", match.group(2)):
                level = len(match.group(1))
                continue
        if level:
            taken.append(line)
    assert level, f"{shown(path)} has no heading '{heading}'"
    return "".join(taken)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, … as on GitHub."""
    found, counts = set(), {}
    for match in re.finditer(r"^#{1,6} (.+)$", prose(path.read_text(encoding="utf-8")), re.M):
        base = slug(match.group(1))
        count = counts.get(base, 0)
        counts[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = without_inline_code(path.read_text(encoding="utf-8"))
    return re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


def code_block(section_name: str, language: str = "sh") -> str:
    """The first block of ``language`` under the README heading ``## <section>``."""
    text = section(README, section_name)
    match = re.search(rf"^```{language}\n(.*?)^```", text, re.M | re.S)
    assert match is not None, f"README.md has no {language} block under '## {section_name}'"
    return match.group(1).strip()


def tracked() -> set[str]:
    """Files git keeps or would keep (ignored ones are not: a link to them breaks on a fresh clone)."""
    out = git("ls-files", "--cached", "--others", "--exclude-standard", cwd=REPO)
    return set(out.splitlines())


# ---- the command lines the documents show --------------------------------------------------------------


@dataclass(frozen=True)
class CommandLine:
    where: str  # FILE:LINE
    prog: str
    argv: list[str]

    def __str__(self) -> str:
        return f"{self.where}: {self.prog} {shlex.join(self.argv)}"


def command_lines(block: Block) -> Iterator[CommandLine]:
    """The `envbuild` / `envrun` invocations of a shell block: continuations joined, comments, prompts and
    leading NAME=VALUE assignments dropped, and `&&`, `||`, `;`, `|` separating commands."""
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for offset, raw in enumerate(block.body.splitlines(), start=1):
        line = raw.removeprefix("$ ") if block.language == "console" else raw
        if not pending:
            start = offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
    for offset, line in logical:
        lexer = shlex.shlex(without_comment(line), posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, ""
        command: list[str] = []
        for token in [*lexer, ";"]:
            if token not in {"&&", "||", ";", "|", "&"}:
                command.append(token)
                continue
            while command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[0]):
                command.pop(0)
            if command and Path(command[0]).name in CLIS:
                yield CommandLine(f"{shown(block.path)}:{block.line + offset}", Path(command[0]).name, command[1:])
            command = []


def without_comment(line: str) -> str:
    """The line up to a shell comment: a `#` that starts a word, outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def all_command_lines() -> list[CommandLine]:
    return [
        line
        for path in documents()
        for block in blocks(path)
        if block.language in SHELL_LANGUAGES
        for line in command_lines(block)
    ]


def cli_module(prog: str) -> ModuleType:
    """The module behind a console script, as pyproject.toml's [project.scripts] names it."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, function = scripts[prog].partition(":")
    assert function == "main", f"pyproject.toml: the {prog} script is {scripts[prog]}, expected MODULE:main"
    return importlib.import_module(module)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    children = subcommands(parser)
    if not children:
        yield path
    for name, child in children.items():
        yield from leaf_commands(child, (*path, name))


def command_path(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[str, ...] | None:
    """The subcommands ``argv`` names down to a leaf command; None when it stops at a command group."""
    path: list[str] = []
    words = iter(argv)
    while children := subcommands(parser):
        word = next((w for w in words if not w.startswith("-")), None)  # global flags take no value
        if word not in children:
            return None
        path.append(word)
        parser = children[word]
    return tuple(path)


def main_output(prog: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with monkeypatch.context() as patch:
        patch.setenv("COLUMNS", "100")  # the width the docs' usage blocks were printed at
        with redirect_stdout(out), redirect_stderr(err):
            status = cli_module(prog).main(argv)
    return status, out.getvalue(), err.getvalue()


def parse_only(prog: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """Run the CLI's own ``main`` on ``argv`` with its parser, but with every handler replaced: the
    whole argv is parsed exactly as the command parses it (its types, choices, required options, the
    global options it accepts after a subcommand), and nothing runs. The status and stderr."""
    module = cli_module(prog)
    build = module.build_parser

    def parse_without_running() -> argparse.ArgumentParser:
        parser = build()
        parse_known_args = parser.parse_known_args  # what parse_args and the CLI's own parsing both call

        def parse(
            args: list[str] | None = None, namespace: argparse.Namespace | None = None
        ) -> tuple[argparse.Namespace, list[str]]:
            parsed, extra = parse_known_args(args, namespace)
            parsed.handler = lambda _args: 0
            return parsed, extra

        parser.parse_known_args = parse  # type: ignore[method-assign, assignment]
        return parser

    with monkeypatch.context() as patch:
        patch.setattr(module, "build_parser", parse_without_running)
        status, _, err = main_output(prog, argv, monkeypatch)
    return status, err


# ---- the quick start and the test command, in a fresh clone --------------------------------------------


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("readme") / "envbuild"
    git("clone", "-q", "--no-hardlinks", str(REPO), str(path))
    return path


def sh(command: str, cwd: Path, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**clean, **env}
    )


def verify_table(stdout: str) -> list[tuple[str, str, str, str]]:
    """The rows (kind, name, status, detail) of `lock verify`'s table, cut at the header's columns."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("KIND "))
    header = lines[head]
    cuts = [header.index(column) for column in ("NAME", "STATUS", "DETAIL")]
    rows = []
    for line in lines[head + 1 :]:
        if not line.strip():
            break
        kind, name, status = (line[a:b].strip() for a, b in zip([0, *cuts], cuts))
        rows.append((kind, name, status, line[cuts[2] :].strip()))
    return rows


def submodule_names(source: str, submodules: list[dict], prefix: str = "") -> list[str]:
    names = []
    for sub in submodules:
        name = f"{prefix or source}/{sub['path']}"
        names += [name, *submodule_names(source, sub.get("submodules", []), name)]
    return names


@dataclass(frozen=True)
class QuickStart:
    done: subprocess.CompletedProcess[str]
    env: dict[str, str]  # what the quick start ran with: an empty HOME, an empty cache (filled now)


@pytest.fixture(scope="module")
def quick_start(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> QuickStart:
    """The README's quick start, run literally in the fresh clone, as a new user on this machine runs it."""
    command = code_block("Quick start")
    assert "envbuild lock verify lockfiles/glm5_2-ascend.lock.yaml" in command
    home = tmp_path_factory.mktemp("home")
    env = {"HOME": str(home), "ENVBUILD_CACHE": str(home / "cache")}  # an empty cache too
    return QuickStart(sh(command, clone, 900, **env), env)


@pytest.mark.network
@pytest.mark.slow
def test_the_quick_start_from_a_fresh_clone_shows_what_the_readme_says(quick_start: QuickStart) -> None:
    done = quick_start.done
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # The README states what a machine without GitHub sees (this project's machines and CI reach PyPI
    # and nothing else): exit 1, and the lines it quotes, verbatim.
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    stated = code_block("Quick start", "text").splitlines()
    assert stated and all(line in done.stdout.splitlines() for line in stated), (stated, done.stdout[-3000:])

    lock = yaml.safe_load((REPO / "lockfiles" / "glm5_2-ascend.lock.yaml").read_text())
    rows = verify_table(done.stdout)
    by_kind: dict[str, dict[str, str]] = {}
    for kind, name, status, detail in rows:
        by_kind.setdefault(kind, {})[name] = status
        if kind == "source":
            assert "github.com" in detail, (name, detail)  # git's reason, not a guess
    sources = [s["name"] for s in lock["sources"]]
    assert by_kind["source"] == dict.fromkeys(sources, "unreachable"), "is GitHub reachable here?"
    expected_submodules = {s["name"]: "unknown" for s in lock["sources"] if s.get("submodules_unknown")}
    for source in lock["sources"]:
        expected_submodules |= dict.fromkeys(
            submodule_names(source["name"], source.get("submodules", [])), "unreachable"
        )
    assert by_kind["submodule"] == expected_submodules
    others = len(lock["packages"]) - 1 + ("installer" in lock)  # the installer is verified as a package
    assert by_kind["package"] == {"triton-ascend": "unreachable", f"({others} more)": "ok"}  # Ascend's own index
    requirement_statuses = {status for kind, _, status, _ in rows if kind == "requirement"}
    assert requirement_statuses == {"unknown", "waived", "ok"}  # nothing unmet, nothing in conflict
    assert by_kind["base-image"] == {lock["base_image"]["name"]: "unpinned"}


# Command lines the documents show that are not run here, each with the reason. Every other one runs.
NOT_RUN = {
    "envbuild lock fetch": "downloads every package file of the real lock (several GB) from PyPI",
    "envbuild lock update lockfiles/glm5_2-ascend.lock.yaml --package": "resolves the real closure against PyPI",
}
# What argparse says when a command line is not one the parser takes: the document is wrong, not the input.
PARSE_ERROR = re.compile(r"error: (?:[\w -]+: )?(?:unrecognized arguments|argument |the following arguments are "
                         r"required|invalid choice)")  # fmt: skip


def shell_state(command: str) -> str:
    """What of a command list stays with the shell that ran it (`.`/`source`, `cd`, `export`): the state the
    README leaves a user's shell in; the files it made stay in the clone."""
    kept = [part.strip() for part in command.split("&&") if part.split()[0] in (".", "source", "cd", "export")]
    return " && ".join(kept) or "true"


def run_as_printed(lines: list[CommandLine], clone: Path, env: dict[str, str]) -> list[str]:
    """Each line run in the clone in a shell in the state the quick start leaves (its venv activated, if the
    README activates it), one document's lines in their order (an `init` before its `add`); the problems:
    not found, a traceback, a parse error, a status that is no envbuild status."""
    problems = []
    state = shell_state(code_block("Quick start"))
    for line in lines:
        command = shlex.join([line.prog, *line.argv])
        done = sh(f"{state} && {command}", clone, 300, **env)
        said = done.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
        if done.returncode not in (0, 1, 2) or "Traceback" in done.stderr or PARSE_ERROR.search(done.stderr):
            problems.append(f"{line}: exit {done.returncode}: {said[0]}")
    return problems


def in_order(lines: list[CommandLine]) -> list[list[CommandLine]]:
    """The lines in groups that may run side by side: a document's lines that name one file they make (an
    `init` of ``mine.lock.yaml`` and its `add` and `update`; a file the repository holds is only read)
    keep their order in one group, every other line is a group of its own."""
    groups: dict[tuple[str, str], list[CommandLine]] = {}
    for number, line in enumerate(lines):
        made = next((arg for arg in line.argv if arg.endswith(".yaml") and not (REPO / arg).exists()), None)
        key = (line.where.split(":")[0], made) if made else ("", str(number))
        groups.setdefault(key, []).append(line)
    return list(groups.values())


@pytest.mark.network
@pytest.mark.slow
def test_every_command_shown_runs_as_printed_after_the_quick_start(clone: Path, quick_start: QuickStart) -> None:
    """From the state the quick start leaves (its venv, activated as the README says), every `envbuild` and
    `envrun` line of the README and docs/ runs: found, its arguments taken, ending with one of the tool's
    statuses (here, without GitHub or a cluster, most end 1 or 2 for what they cannot reach or find). The
    quick start's own command has just run; its other appearances are not run again."""
    assert quick_start.done.returncode == 1, quick_start.done.stderr[-2000:]
    started = code_block("Quick start").split("&&")[-1].strip()
    lines = [
        line
        for line in all_command_lines()
        if not any(str(line).split(": ", 1)[1].startswith(p) for p in NOT_RUN)
        and shlex.join([line.prog, *line.argv]) != started
    ]
    assert len(lines) >= 25 and len(all_command_lines()) - len(lines) <= len(NOT_RUN) + 2
    groups = in_order(lines)
    assert ["docs/lock.md:41", "docs/lock.md:42", "docs/lock.md:43", "docs/lock.md:44"] in [
        [line.where for line in group] for group in groups
    ]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        found = pool.map(lambda group: run_as_printed(group, clone, quick_start.env), groups)
        problems = [problem for group in found for problem in group]
    assert not problems, "\n".join(problems)


@pytest.mark.network
@pytest.mark.docker
@pytest.mark.slow
def test_the_test_command_from_a_fresh_clone(clone: Path, tmp_path: Path) -> None:
    command = code_block("Tests")
    assert command == "scripts/test"
    # mypy's cache, like pip's, is the machine's, not the clone's: a copy of the one this run's mypy used
    # (scripts/test's, warm when it ran mypy first) keeps a cold check of the whole tree (~14 s) out of the
    # test, and mypy still checks the clone's files (it trusts a cached module only when its hash matches).
    mypy_cache = tmp_path / "mypy_cache"
    warm = Path(os.environ.get("MYPY_CACHE_DIR") or REPO / ".mypy_cache")
    if warm.is_dir():
        shutil.copytree(warm, mypy_cache)
    # "Extra arguments go to pytest": one fast module, so the suite does not run itself whole.
    done = sh(f"{command} tests/test_lock_model.py -q -p no:cacheprovider", clone, 1500, MYPY_CACHE_DIR=str(mypy_cache))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-2000:]


# ---- the documents against the repository and the code (fast: no process, no network) ------------------


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the reference belongs in docs/"


@pytest.mark.parametrize("path", documents(), ids=shown)
def test_every_relative_link_resolves(path: Path) -> None:
    files = tracked()
    directories = {str(parent) for name in files for parent in Path(name).parents}
    problems = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: … are not this repository's
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        name = str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else None
        if name is None or (name not in files and name not in directories):
            problems.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: {name} has no heading with the anchor #{anchor}")
    assert not problems, f"{shown(path)}:\n" + "\n".join(problems)


def test_the_docs_index_links_every_page() -> None:
    index = DOCS / "README.md"
    linked = {(DOCS / target.partition("#")[0]).resolve() for target in links(index) if not target.startswith("#")}
    missing = [shown(page) for page in sorted(DOCS.glob("*.md")) if page != index and page.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"
    assert "docs/README.md" in links(README)


def test_the_paths_and_python_names_the_docs_mention_exist() -> None:
    top = {Path(name).parts[0] for name in tracked() if len(Path(name).parts) > 1}
    problems = []
    for path in documents():
        for code in inline_code(path.read_text(encoding="utf-8")):
            word = code.split()[0] if code.split() else ""
            if (
                "/" in word
                and word.split("/")[0] in top
                and not re.search(r"[<>*{}…$]", word)
                and not (REPO / word).exists()
            ):
                problems.append(f"{shown(path)}: `{code}`: {word} does not exist")
            dotted = re.match(r"^(envbuild|envrun)(\.[A-Za-z_]\w*)+", code)
            if dotted and not resolves(dotted.group(0)):
                problems.append(f"{shown(path)}: `{code}`: {dotted.group(0)} does not import")
    assert not problems, "\n".join(problems)


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


COMMAND_LINES = all_command_lines()


def test_the_documents_show_command_lines() -> None:
    progs = {line.prog for line in COMMAND_LINES}
    assert progs == set(CLIS), progs  # the reading above found both commands' examples


@pytest.mark.parametrize("line", COMMAND_LINES, ids=lambda line: line.where)
def test_every_command_line_shown_parses_as_the_cli_reads_it(
    line: CommandLine, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = cli_module(line.prog).build_parser()
    assert command_path(parser, line.argv) is not None, f"{line}: names no complete command"
    status, err = parse_only(line.prog, line.argv, monkeypatch)
    assert status == 0, f"{line}: {err.strip()}"


def usage_blocks() -> list[tuple[Block, str, tuple[str, ...]]]:
    """Every ``usage:`` block of docs/ with its command: (block, prog, subcommand path)."""
    found = []
    for path in documents():
        for block in blocks(path):
            words = block.body.split()
            if block.language == "text" and words[:1] == ["usage:"] and words[1] in CLIS:
                found.append((block, words[1], tuple(words[2 : words.index("[-h]")])))
    return found


USAGE_BLOCKS = usage_blocks()


@pytest.mark.parametrize(
    "block, prog, path", USAGE_BLOCKS, ids=[f"{shown(block.path)}:{block.line}" for block, _, _ in USAGE_BLOCKS]
)
def test_every_usage_block_is_the_parsers_own(
    block: Block, prog: str, path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, out, _ = main_output(prog, [*path, "--help"], monkeypatch)
    assert status == 0
    usage = out.split("\n\n", 1)[0]
    assert " ".join(block.body.split()) == " ".join(usage.split()), f"{shown(block.path)}:{block.line}: now\n{usage}"


def test_every_command_has_its_usage_in_the_docs() -> None:
    documented = {(prog, path) for _, prog, path in USAGE_BLOCKS}
    commands = {(prog, path) for prog in CLIS for path in leaf_commands(cli_module(prog).build_parser())}
    assert commands - documented == set(), "commands without a usage block in docs/"
    assert documented - commands == set(), "usage blocks of commands that do not exist"


def status_table(text: str) -> dict[str, str]:
    """A Markdown table's rows whose first cell is one `status`: status -> the 'passes' cell."""
    rows = re.findall(r"^\| `([a-z-]+)` \|[^|]*\| ([^|]+) \|$", text, re.M)
    return {status: passes.strip() for status, passes in rows}


def test_the_verify_statuses_in_the_docs_are_the_codes() -> None:
    from envbuild.verify.results import (
        PASSING_STATUSES,
        WARNING_STATUSES,
        BaseImageStatus,
        PackageStatus,
        RequirementStatus,
        SourceStatus,
        SubmoduleStatus,
    )

    page = DOCS / "lock.md"

    def passes(status: str) -> str:
        if status in PASSING_STATUSES:
            return "yes"
        return "yes, unless `--strict`" if status in WARNING_STATUSES else "no"

    for heading, kind in (
        ("Source statuses", SourceStatus),
        ("Submodule statuses", SubmoduleStatus),
        ("The environment whole: requirement statuses", RequirementStatus),
    ):
        table = status_table(section(page, heading))
        assert table == {status: passes(status) for status in typing.get_args(kind)}, heading
    packages, _, base = section(page, "Package and base image statuses").partition("Base image:")
    named = [re.findall(r"`([a-z][a-z-]*)`", text) for text in (packages, base)]
    assert set(named[0]) == set(typing.get_args(PackageStatus))
    assert set(named[1]) == set(typing.get_args(BaseImageStatus))
