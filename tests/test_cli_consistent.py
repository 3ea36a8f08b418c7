"""The two commands behave alike, as a user tries them: `--version`, errors said once, a top-level `-q`
that holds, a description on every help page, the environment over the config file, `--config` in both,
and the recipe's lock found by an installed envrun."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild import __version__
from envbuild.cli import build_parser as envbuild_parser
from envbuild.cli import main as envbuild
from envbuild.cli.common import ArgumentParser, run
from envbuild.config import load_config
from envrun.cli.main import build_parser as envrun_parser
from envrun.cli.main import main as envrun
from envrun.prepare import resolve_lock
from envrun.recipe import load_recipe, recipe_path
from tests.lib.readergone import run_reader_gone
from tests.lib.tinyrun import Tiny

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("main", "prog"), [(envbuild, "envbuild"), (envrun, "envrun")])
def test_version_is_an_answer_not_an_error(main, prog: str, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main(["--version"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{prog} {__version__}\n" and err == ""


@pytest.mark.parametrize(
    ("main", "argv", "said"),
    [
        (envbuild, ["--no-such-option"], "envbuild: error: unrecognized arguments: --no-such-option\n"),
        (
            envbuild,
            ["lock", "verify"],
            "envbuild: error: lock verify: the following arguments are required: lockfile\n",
        ),
        (envrun, ["--no-such-option"], "envrun: error: unrecognized arguments: --no-such-option\n"),
        (envrun, ["cluster", "status"], "envrun: error: cluster status: the following arguments are required: NAME\n"),
    ],
)
def test_a_usage_error_names_the_program_once_and_the_subcommand(  # type: ignore[no-untyped-def]
    main, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == said


def test_a_top_level_quiet_holds_through_the_run_command(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in tiny.args("--dry-run") if a != "-q"]
    assert envrun(args) == 0
    assert capsys.readouterr().err != ""  # progress, when not asked to be quiet
    assert envrun(["-q", *args]) == 0
    assert capsys.readouterr().err == ""


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(" ".join((*path, name)), sub), *leaves(sub, (*path, name))]
    return found


@pytest.mark.parametrize(("main", "parser"), [(envbuild, envbuild_parser), (envrun, envrun_parser)])
def test_every_help_page_says_what_its_command_does(  # type: ignore[no-untyped-def]
    main, parser, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = leaves(parser())
    assert len(commands) > 5
    for command, _ in commands:
        assert main([*command.split(), "--help"]) == 0
        out = capsys.readouterr().out
        description = out.split("\n\n")[1].strip()  # usage, then the description, then the options
        assert description and not description.startswith(("positional", "options")), (command, out)


def test_the_environment_wins_over_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"cache_dir: {tmp_path / 'from-file'}\n", encoding="utf-8")
    monkeypatch.delenv("ENVBUILD_CACHE", raising=False)
    assert load_config(config).cache_dir == tmp_path / "from-file"
    monkeypatch.setenv("ENVBUILD_CACHE", str(tmp_path / "from-env"))
    assert load_config(config).cache_dir == tmp_path / "from-env"


def test_envrun_takes_a_config_file_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENVBUILD_CACHE", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text(f"cache_dir: {tmp_path / 'from-file'}\n", encoding="utf-8")
    assert envrun(["cluster", "status", "c1", "--config", str(config)]) == 2
    assert f"no {tmp_path / 'from-file' / 'clusters'}" in capsys.readouterr().err
    assert envrun(["cluster", "status", "c1", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_the_recipes_lock_is_found_wherever_envrun_runs_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From any directory, the shipped recipe's lock is the one shipped with envrun (in a wheel, its
    `recipes/lockfiles/`; in a checkout, a link to `lockfiles/`), and the same bytes as the project's."""
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(recipe_path("grpo-glm5"))
    found = resolve_lock(recipe, None)
    assert found.read_bytes() == (REPO / "lockfiles" / "glm5_2-ascend.lock.yaml").read_bytes()
    (tmp_path / "lockfiles").mkdir()
    (tmp_path / "lockfiles" / "glm5_2-ascend.lock.yaml").write_text("here", encoding="utf-8")
    assert resolve_lock(recipe, None) == tmp_path / "lockfiles" / "glm5_2-ascend.lock.yaml"  # the user's own first


# Programs that run elsewhere (inside an image, on a node, in a scheduler's job) read their own environment,
# which envrun sets for them: not a user's setting.
ELSEWHERE = (
    "envrun/injob/",
    "envrun/cluster/onnode.py",
    "envrun/probe/job_script.py",
    "envbuild/image/inimage_probe.py",
)


def environment_reads() -> dict[str, str]:
    """{variable: file} of every environment variable the two packages read by name: ``os.environ.get(NAME)``,
    ``os.getenv``, ``os.environ[NAME]``, ``NAME in os.environ``, NAME a literal or a module-level constant,
    and every module-level ``*_ENV`` constant handed to a call as its first argument (a helper reads it)."""
    import ast

    found: dict[str, str] = {}
    for package in ("envbuild", "envrun"):
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith(ELSEWHERE):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            constants = {
                target.id: node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                for target in node.targets
                if isinstance(target, ast.Name) and isinstance(node.value.value, str)
            }

            def name(node: ast.expr, constants: dict[str, str] = constants) -> str | None:
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    return node.value
                return constants.get(node.id) if isinstance(node, ast.Name) else None

            for node in ast.walk(tree):  # X_ENV = "VARIABLE", handed to a reader (`env.get(X_ENV)`, a helper)
                first = node.args[0] if isinstance(node, ast.Call) and node.args else None
                if isinstance(first, ast.Name) and first.id.endswith("_ENV") and first.id in constants:
                    found.setdefault(constants[first.id], relative)
            for node in ast.walk(tree):
                read = None
                if (
                    isinstance(node, ast.Call)
                    and node.args
                    and ast.unparse(node.func) in ("os.environ.get", "os.getenv")
                ):
                    read = name(node.args[0])
                elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                    read = name(node.slice)
                elif isinstance(node, ast.Compare) and [ast.unparse(c) for c in node.comparators] == ["os.environ"]:
                    read = name(node.left)
                if read:
                    found.setdefault(read, relative)
    return found


def test_every_environment_variable_the_tool_reads_is_in_the_configuration_page() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    reads = environment_reads()
    assert {"ENVBUILD_CACHE", "ENVBUILD_INDEX_DEADLINE", "RAY_AUTH_TOKEN"} <= set(reads)  # the walk finds them
    missing = {variable: where for variable, where in reads.items() if f"`{variable}`" not in page}
    assert not missing, f"docs/configuration.md does not list: {missing}"


def test_a_reader_gone_from_stdout_ends_the_command_quietly_as_a_shell_s_tools_end() -> None:
    """``envbuild lock schema | head -1`` once head has gone: exit 141 (128 + SIGPIPE), nothing said (it was
    ``envbuild: error: Broken pipe``, exit 1)."""
    script = "import sys; from envbuild.cli import main; sys.exit(main())"
    done = run_reader_gone([sys.executable, "-c", script, "lock", "schema"], timeout=60)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_broken_pipe_to_anything_but_a_gone_reader_of_stdout_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A child process envbuild writes to that died is a failure to report, not a reader that asked for no more."""

    def handler(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    parser = ArgumentParser(prog="envbuild")
    parser.set_defaults(handler=handler)
    assert run("envbuild", parser, []) == 1
    assert capsys.readouterr().err == "envbuild: error: Broken pipe\n"


@pytest.mark.parametrize(
    ("settings", "e_acute"), [({"LC_ALL": "C", "PYTHONUTF8": "0"}, "\\u00e9"), ({"PYTHONIOENCODING": "latin-1"}, "é")]
)
def test_a_stdout_that_cannot_hold_a_character_gets_it_escaped_and_json_stays_json(
    settings: dict[str, str], e_acute: str, tmp_path: Path
) -> None:
    """Where stdout's encoding is not UTF-8 (UTF-8 mode off in a C locale, a latin-1 locale), a value the lock
    holds (an env value; a commit subject in a report) ended `lock diff` in a UnicodeEncodeError traceback,
    with --json too. Now it is escaped as JSON's \\uXXXX: the JSON parses to the value, the text shows it."""
    value = "émpty—日本😀"
    old, new = tmp_path / "old.lock.yaml", tmp_path / "new.lock.yaml"
    for path, env in ((old, "empty"), (new, value)):
        path.write_text(
            "version: 2\nname: x\nsources:\n- {name: lib, repo: 'https://example.org/lib.git', ref: main, "
            f"ref_type: branch, commit: {'a' * 40}, install: {{mode: editable, env: {{NOTE: '{env}'}}}}}}\n",
            encoding="utf-8",
        )
    env = {k: v for k, v in os.environ.items() if k not in ("LANG", "LC_ALL", "LC_CTYPE", "PYTHONIOENCODING")}
    script = "import sys; from envbuild.cli import main; sys.exit(main())"
    argv = [sys.executable, "-c", script, "lock", "diff", str(old), str(new), "--cache-dir", str(tmp_path / "c")]
    for json_out in (True, False):
        done = subprocess.run(
            argv + ["--json"] * json_out, cwd=REPO, env={**env, **settings}, capture_output=True, timeout=60
        )
        assert (done.returncode, done.stderr) == (1, b"")
        if json_out:
            (change,) = json.loads(done.stdout.decode("latin-1"))["changes"]
            assert change["fields"][0]["new"] == f"editable NOTE={value}"
        else:
            shown = f"NOTE={e_acute}mpty\\u2014\\u65e5\\u672c\\ud83d\\ude00\n"
            assert done.stdout.decode("latin-1").endswith(shown)
