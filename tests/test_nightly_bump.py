"""The nightly workflow's bump job, its run: steps executed literally in a fresh clone as the runner runs them
(`bash -e` per step, `if:` conditions evaluated, `$GITHUB_OUTPUT` read back), the forge calls aside, against
real upstreams on loopback, a real index, engine and registry: a bump that breaks an import is checked,
fails, and is bisected to the source and the commit, with the issue's body written; a bump that passes
writes the pull request's body (the change report and the reproducibility report)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from envbuild.lock.io import read_lock
from envbuild.lock.model import Waiver
from tests.lib.gitrepos import GitDaemon
from tests.lib.imagelock import ImageLockEnv, lock_env
from tests.lib.services import PushedImage, remove_lock_images
from tests.test_nightly_workflow import REPO, workflow

pytestmark = [pytest.mark.network, pytest.mark.docker, pytest.mark.registry, pytest.mark.gitdaemon, pytest.mark.slow]

LOCK_NAME = "nightly-bump"
# The steps that talk to the forge (a branch pushed, a pull request or an issue opened): their bodies are
# files earlier steps wrote, which the test reads instead; and the runner's disk clean-up (destructive here).
LOGS: dict[str, str] = {}  # the last run's output per step, for the assertions' messages
ASIDE = {"Make room for the image", "Open the pull request", "Open an issue naming the commit"}


def condition(
    expression: str, outcomes: dict[str, str], outputs: dict[str, dict[str, str]], env: dict[str, str]
) -> bool:
    """A step's `if:` as GitHub evaluates the few forms the bump job uses: `failure()`, `always()`,
    `steps.ID.outcome`, `steps.ID.outputs.NAME`, `env.NAME`, `==`, `!=`, `&&`, `||` and parentheses."""
    failed = "failure" in outcomes.values()

    def step_field(match: re.Match[str]) -> str:
        step, rest = match.group(1), match.group(2)
        value = (
            outputs.get(step, {}).get(rest.removeprefix("outputs."), "")
            if rest.startswith("outputs.")
            else (outcomes.get(step, "skipped"))
        )
        return repr(value)

    python = re.sub(r"steps\.([\w-]+)\.(outcome|outputs\.\w+)", step_field, expression)
    python = re.sub(r"env\.(\w+)", lambda m: repr(env.get(m.group(1), "")), python)
    python = python.replace("&&", " and ").replace("||", " or ")
    python = (
        python.replace("failure()", repr(failed)).replace("always()", "True").replace("success()", repr(not failed))
    )
    if not re.search(r"\b(failure|always|success|cancelled)\(\)", expression):
        python = f"{not failed} and ({python})"  # GitHub's implicit success() && …
    return bool(eval(python, {"__builtins__": {}}))  # noqa: S307 (the workflow's own expressions, rewritten above)


def run_job(clone: Path, env: dict[str, str]) -> tuple[dict[str, str], dict[str, int]]:
    """The bump job's run: steps in order; (outcome per step id or name, exit status per step name)."""
    job = workflow()["jobs"]["bump"]
    outcomes: dict[str, str] = {}
    outputs: dict[str, dict[str, str]] = {}
    codes: dict[str, int] = {}
    step_env = {**env, **{k: str(v) for k, v in job.get("env", {}).items() if k not in env}}
    for step in job["steps"]:
        if "run" not in step or step["name"] in ASIDE or step["name"] == "Install envbuild":
            continue
        key = step.get("id", step["name"])
        own = {k: v for k, v in step.get("env", {}).items() if "${{" not in str(v)}
        if not condition(step.get("if", "success()"), outcomes, outputs, {**step_env, **own}):
            outcomes[key] = "skipped"
            continue
        output = clone / f".github-output-{len(codes)}"
        output.write_text("")
        done = subprocess.run(
            ["bash", "-e", "-c", step["run"]],
            cwd=clone,
            env={**step_env, **own, "GITHUB_OUTPUT": str(output)},
            capture_output=True,
            text=True,
            timeout=1500,
        )
        assert "Traceback" not in done.stderr, (step["name"], done.stderr[-3000:])
        codes[step["name"]] = done.returncode
        LOGS[step["name"]] = done.stdout[-3000:] + done.stderr[-3000:]
        outcomes[key] = "success" if done.returncode == 0 else "failure"
        outputs[key] = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return outcomes, codes


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, pushed_base_image: PushedImage) -> Iterator[ImageLockEnv]:
    base = tmp_path_factory.mktemp("bump-upstream")
    daemon = GitDaemon(base, allow_filter=True).start()
    wheels = tmp_path_factory.mktemp("bump-wheels")
    name = f"{pushed_base_image.repository}:{pushed_base_image.tag}"
    try:
        with lock_env(base, daemon.url, wheels, "test_nightly_bump", name, pushed_base_image.digest) as env:
            yield env
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh clone (actions/checkout) and a fresh venv with the job's "Install envbuild" step run in it."""
    work = tmp_path_factory.mktemp("bump-runner")
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    venv = work / "python"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "ENVBUILD_"))}
    env = {**keep, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "CI": "true", "ENVBUILD_CACHE": str(work / "cache")}
    [install] = [s for s in workflow()["jobs"]["bump"]["steps"] if s.get("name") == "Install envbuild"]
    done = subprocess.run(["bash", "-e", "-c", install["run"]], cwd=clone, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return clone, env


@pytest.fixture
def engine_images(docker_client: docker.DockerClient) -> Iterator[None]:
    yield
    remove_lock_images(docker_client, LOCK_NAME, all_images=True)


def test_a_bump_that_breaks_an_import_is_bisected_to_its_commit_and_one_that_passes_gets_its_body(
    upstream: ImageLockEnv, runner: tuple[Path, dict[str, str]], engine_images: None
) -> None:
    clone, env = runner
    lock = clone / "lockfiles" / "bump-test.lock.yaml"
    # The sources build with the test base image's python3-setuptools, which the tiny index does not serve:
    # waived by name, with that reason, as a lock author would (the bump reads their build requirements).
    waiver = Waiver("setuptools", "the test base image's python3-setuptools builds it; the tiny index has none")
    tiny = upstream.lock(name=LOCK_NAME)
    tiny = dataclasses.replace(tiny, sources=tuple(dataclasses.replace(s, waive=(waiver,)) for s in tiny.sources))
    upstream.write(lock, tiny)
    good = lock.read_bytes()
    env = {**env, "LOCK": str(lock.relative_to(clone)), "PROBE_RECIPE": "", "BISECT_DEADLINE": "900"}
    beta = upstream.repos["beta"]
    subjects = [f"beta work {i}" for i in range(1, 6)]
    commits = []
    for i, subject in enumerate(subjects, start=1):  # from the third on, `import beta` fails
        broken = "raise ImportError('beta broke its import')\n" if i >= 3 else ""
        commits.append(beta.commit(subject, files={"beta/__init__.py": f"VERSION = '0.1.{i}'\n{broken}"}))
    broken_commit = commits[2]

    outcomes, codes = run_job(clone, env)
    assert codes["Move the pins"] == 0 and outcomes["update"] == "success", LOGS["Move the pins"]
    assert codes["Check the moved lock"] == 1  # the in-image check: `import beta` fails
    assert outcomes.get("probe") == "skipped" and "The pull request's body" not in codes
    assert codes["Bisect the failing bump"] == 0, (clone / "bump" / "bisect.md").read_text()[-2000:]
    body = (clone / "bump" / "bisect.md").read_text()
    title = f"# envbuild bisect: source beta commit {broken_commit[:12]} 'beta work 3' breaks it"
    assert body.splitlines()[0] == title and broken_commit in body, body[:2000]
    forward = read_lock(clone / "bump" / "forward.lock.yaml").lock
    assert forward.source("beta").commit == commits[1]  # beta at its last good commit, the rest moved
    changes = (clone / "bump" / "changes.md").read_text()
    assert "beta" in changes and "beta work 1" in changes and "beta work 5" in changes

    # The next night: beta repaired upstream; the job starts again from the committed (last good) lock.
    beta.commit("beta work 6: the import again", files={"beta/__init__.py": "VERSION = '0.1.6'\n"})
    lock.write_bytes(good)
    subprocess.run(["rm", "-rf", str(clone / "bump")], check=True)
    outcomes, codes = run_job(clone, env)
    assert codes == {"Move the pins": 0, "Check the moved lock": 0, "The pull request's body": 0}, codes
    body = (clone / "bump" / "pr-body.md").read_text()
    assert "beta work 6: the import again" in body and "reproduc" in body.lower()
    assert read_lock(lock).lock.source("beta").commit == beta.rev("main")  # the lock the branch would carry
