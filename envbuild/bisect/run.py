"""`envbuild bisect GOOD BAD`: the loop. Each step is a candidate lock (:func:`.steps.candidate`) written to a
file and built by the library as `envbuild image` builds (:func:`~envbuild.image.build.build_image`: verify,
BuildKit with the engine's cached layers, the in-image check), then ``run`` if given, and judged:

- **good**: built, checked and (``run``) exit 0;
- **bad**: the in-image check fails (an import that breaks, a tree or version not the lock's), or ``run``
  exits 1–127 but 125 — the failing check's one line is the reason;
- **skip**: the candidate cannot be built at all (verify refuses what it pins, its build requirements are
  unmet, a Dockerfile step fails — pip cannot build a source's tree —, its tree or submodules are not what
  it records, the base is another platform's), or ``run`` exits 125: git bisect's "cannot test";
- anything else (the engine, the network, the cache — a pin verify could not check, offline and not in the
  cache or out of reach, says nothing of the candidate —, ``run`` exiting 128 or more) stops the search,
  and what is known is reported.

BAD is built first (it must fail, or there is nothing to bisect), then GOOD unless ``assume_good`` (a
rebuild of a lock built and checked before is answered from its record: nothing is built), then the
search. A build is not started once the deadline has passed. Ctrl-C or SIGTERM (a CI job cancelled) stops
the search as an error does: ``run``'s process group is stopped, the scratch removed, and what is known
reported.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.bisect.command import run_command
from envbuild.bisect.history import with_history
from envbuild.bisect.result import BisectResult, Culprit, Outcome, Step
from envbuild.bisect.steps import (
    Fields,
    Search,
    State,
    Unit,
    Verdict,
    candidate,
    forward_lock,
    plan_states,
    plan_units,
    search_builds,
)
from envbuild.engine.buildkit import StepFailed
from envbuild.engine.claim import lock_claims
from envbuild.engine.client import Engine
from envbuild.errors import EnvbuildError, InputError
from envbuild.git.cache import GitCache
from envbuild.image.assemble import ContextError
from envbuild.image.base import PlatformError
from envbuild.image.build import BuildRefused, ImageOptions, PinsUnreachable, build_image
from envbuild.image.checked import InImageMismatch
from envbuild.interrupts import sigterm_interrupts
from envbuild.lock.io import LockFile, read_lock, write_lock
from envbuild.lock.model import Lock, Source
from envbuild.lock.moves import LoggedCommit
from envbuild.progress import Progress, silent
from envbuild.update.read_submodules import SubmodulesRefused, read_source_submodules
from envbuild.verify.buildcheck import UnmetBuildRequirements
from envbuild.verify.pins import VerifyOptions

# What makes a candidate one that cannot be built, as opposed to one that fails or a bisect that cannot go on
# (:func:`unbuildable`: not when the machine is at fault).
UNBUILDABLE = (BuildRefused, UnmetBuildRequirements, ContextError, StepFailed, SubmodulesRefused, PlatformError)
RUN_SKIP = 125  # git bisect run's "cannot test this one"
REASON_CHARS = 400
STEP_CHARS = 72  # of a failed step's instruction in a reason: "[stage-2 2/3] RUN --mount=…,source=src/beta,…"


@dataclass(frozen=True)
class BisectOptions:
    verify: VerifyOptions
    assume_good: bool = False  # GOOD passed (the nightly says so): not built again
    first_parent: bool = True  # a source's first-parent line; off: every commit of the range
    run: str | None = None  # a shell command run after each build, as `git bisect run` runs one
    deadline: float | None = None  # seconds from the start: no build starts after it


class _Stop(Exception):
    """The search cannot go on; ``outcome`` and the reason say why."""

    def __init__(self, outcome: Outcome, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


def run_bisect(
    good: LockFile,
    bad: LockFile,
    options: BisectOptions,
    *,
    progress: Progress = silent,
    engine: Engine | None = None,
) -> BisectResult:
    """Find the change from ``good`` to ``bad`` that breaks the build's checks; see the module docstring."""
    with sigterm_interrupts():  # SIGTERM unwinds as Ctrl-C: scratch removed, ``run`` stopped, the claim freed last
        return _run_bisect(good, bad, options, progress, engine)


def _run_bisect(
    good: LockFile, bad: LockFile, options: BisectOptions, progress: Progress, engine: Engine | None
) -> BisectResult:
    started = time.monotonic()
    source = options.verify.source
    units = plan_units(good.lock, bad.lock)
    if not units:
        raise InputError(f"{good.path} and {bad.path} pin the same things: nothing to bisect")
    cache = GitCache(source.cache_dir / "git")
    units = [
        with_history(
            u,
            cache,
            mirrors=source.mirrors,
            offline=source.offline,
            first_parent=options.first_parent,
            progress=progress,
        )
        for u in units
    ]
    for unit in units:
        counted = f": {len(unit.commits)} commits" if unit.commits else ""
        progress(f"change: {unit.label}{counted}{f' ({unit.note})' if unit.note else ''}")
    states = plan_states(units)
    last = len(states) - 1
    good_is_good = all(u.rewrite is None or u.rewrite.merge_base is None for u in units)
    test_good = not (options.assume_good and good_is_good)
    planned = 1 + test_good + search_builds(last)
    progress(
        f"{last} states from GOOD to BAD; at most {planned} builds: BAD, {'GOOD, ' if test_good else ''}"
        f"then {search_builds(last)} to halve them (each commit that cannot be built adds one)"
    )
    bisect = _Bisect(good, bad, units, states, options, progress, cache, started)
    with nullcontext(engine) if engine is not None else Engine.connect() as connected:
        # ``--run`` is handed each candidate by the lock's tag (envbuild/<lock name>:bisect), which another
        # bisect of the lock on the engine would move: one at a time.
        names = (good.lock.name, bad.lock.name)
        with lock_claims(connected.address, "bisect", names, progress, "`envbuild bisect`"):
            return bisect.run(connected, planned, test_good)


@dataclass
class _Bisect:
    good: LockFile
    bad: LockFile
    units: list[Unit]
    states: list[State]
    options: BisectOptions
    say: Progress
    cache: GitCache
    started: float
    steps: list[Step] = field(default_factory=list)
    # (source, commit) → its record, submodules read
    sources: dict[tuple[str, str], Source] = field(default_factory=dict)
    interrupted: bool = False

    def run(self, engine: Engine, planned: int, test_good: bool) -> BisectResult:
        last = len(self.states) - 1
        search = Search(last)
        outcome: Outcome = "found"
        stopped = ""
        with tempfile.TemporaryDirectory(prefix="envbuild-bisect-") as work:
            build = self._builder(engine, Path(work), planned)
            try:
                if (bad := build(last)).verdict == "good":
                    raise _Stop("bad-passes", "BAD passes its checks: nothing to bisect")
                if bad.verdict != "bad":
                    cannot = f"BAD cannot be built ({bad.reason}): a bisect looks for a check that fails"
                    raise _Stop("bad-unbuildable", cannot)
                if test_good and build(0).verdict != "good":
                    raise _Stop("good-fails", f"GOOD does not pass ({self.steps[-1].reason}): nothing to bisect from")
                while (index := search.next()) is not None:
                    search.mark(index, build(index).verdict)
            except _Stop as stop:
                outcome, stopped = stop.outcome, stop.reason
                if outcome in ("deadline", "stopped") and self.steps and self.steps[0].verdict == "bad":
                    low, high = (self.states[i] for i in search.bounds)
                    stopped += (
                        f"; what is known: the first bad state is after {self._words(low)} and at or before "
                        f"{self._words(high)} ({high.index - low.index - 1} states between)"
                    )
                self.say(stopped)
        seconds = time.monotonic() - self.started
        found = search.first_bad() if outcome == "found" else ()
        if len(found) > 1:
            outcome = "ambiguous"
            stopped = "only states that cannot be built are left: the first bad is one of them or the bad one"
        result = BisectResult(
            good=str(self.good.path),
            bad=str(self.bad.path),
            units=tuple(self.units),
            states=last,
            planned=planned,
            first_parent=self.options.first_parent,
            steps=tuple(self._logged(self.steps)),
            outcome=outcome,
            seconds=seconds,
            stopped=stopped,
            interrupted=self.interrupted,
        )
        return self._concluded(result, search, found) if found else result

    def _builder(self, engine: Engine, work: Path, planned: int) -> Callable[[int], Step]:
        def build(index: int) -> Step:
            deadline = self.options.deadline
            if deadline is not None and time.monotonic() - self.started >= deadline:
                raise _Stop("deadline", f"the deadline ({deadline:g} s) passed before build {len(self.steps) + 1}")
            state = self.states[index]
            number = len(self.steps) + 1
            what = self._words(state)
            self.say(f"build {number} (of at most {planned}): {what}")
            try:
                step = self._test(engine, state, number, what, work)
            except KeyboardInterrupt:
                self.interrupted = True
                raise _Stop("stopped", f"build {number} ({what}) was interrupted (Ctrl-C or SIGTERM)") from None
            self.steps.append(step)
            if step.verdict == "stopped":  # built, and counted; the stop says why, once
                raise _Stop("stopped", f"build {number} ({what}): {step.reason}")
            self.say(f"build {number}: {step.verdict}{f': {step.reason}' if step.reason else ''}")
            return step

        return build

    def _lockfile(self, state: State, work: Path) -> LockFile:
        """The file of a state: GOOD's and BAD's own (a lock built before is answered from its record), any
        other written canonically; a commit state's submodules read again when BAD's record has any."""
        if state.index == len(self.states) - 1:
            return self.bad
        lock = self._candidate(state)
        version = max(self.good.lock.version, self.bad.lock.version)  # a candidate carries the higher of the two
        if state.index == 0 and lock == dataclasses.replace(self.good.lock, version=version):
            return self.good
        path = work / f"state-{state.index}.lock.yaml"
        write_lock(path, lock)
        return read_lock(path)

    def _candidate(self, state: State) -> Lock:
        record = None
        if state.unit is not None and state.commit is not None:
            record = self._source(self.units[state.unit], state)
        lock = candidate(self.good.lock, self.bad.lock, self.units, state, record)
        # a rewritten branch's merge base, standing for GOOD's pin, reads its submodules too
        for number, unit in enumerate(self.units):
            if (
                unit.rewrite is not None
                and isinstance(unit.before, Source)
                and (state.unit is None or number > state.unit)
            ):
                base = self._with_submodules(unit, unit.before)
                lock = dataclasses.replace(
                    lock, sources=tuple(base if s.name == unit.name else s for s in lock.sources)
                )
        return lock

    def _source(self, unit: Unit, state: State) -> Source:
        assert state.commit is not None
        return self._with_submodules(unit, unit.source_at(state.commit))

    def _with_submodules(self, unit: Unit, source: Source) -> Source:
        """``source`` (BAD's record at another commit) with that commit's submodules, when BAD records any:
        read once a commit."""
        after = unit.after
        if not isinstance(after, Source) or source.commit == after.commit:
            return source
        if not (after.submodules or after.submodules_unknown):
            return source
        key = (unit.name, source.commit)
        if key not in self.sources:
            mirrors = self.options.verify.source.mirrors
            self.sources[key] = read_source_submodules(
                source, self.cache, mirrors=mirrors, previous=after, progress=self.say
            )
        return self.sources[key]

    def _test(self, engine: Engine, state: State, number: int, what: str, work: Path) -> Step:
        start = time.monotonic()
        read: LockFile | None = None

        def step(verdict: Verdict, reason: str = "", image_id: str | None = None, answered: bool = False) -> Step:
            seconds = time.monotonic() - start
            sha256 = read.sha256 if read is not None else ""
            return Step(number, state.index, what, verdict, one_line(reason), seconds, sha256, image_id, answered)

        indent: Progress = lambda message: self.say(f"  {message}")  # noqa: E731
        try:
            read = self._lockfile(state, work)
            tags = (f"envbuild/{read.lock.name}:bisect",)
            built = build_image(
                read,
                ImageOptions(self.options.verify, tags=tags, record_dir=work / "record"),
                progress=indent,
                engine=engine,
            )
        except InImageMismatch as exc:
            return step("bad", "; ".join(exc.problems) or str(exc))
        except StepFailed as exc:  # its instruction is long: where it starts, and the step's last words
            said = exc.log[-1].strip() if exc.log else str(exc)
            return step("skip", f"build step failed ({one_line(exc.step)[:STEP_CHARS]}…): {said}")
        except EnvbuildError as exc:
            if unbuildable(exc):
                return step("skip", str(exc))
            raise _Stop("stopped", f"build {number} ({what}) stopped the bisect: {one_line(str(exc))}") from None
        if self.options.run is None:
            return step("good", image_id=built.image_id, answered=built.noop)
        code, tail = run_command(self.options.run, built.tags[0], built.image_id, indent)
        said = f"--run exited {code}{f': {tail}' if tail else ''}"
        if code == 0:
            return step("good", image_id=built.image_id, answered=built.noop)
        if code == RUN_SKIP:
            return step("skip", said, built.image_id, built.noop)
        if 0 < code < 128:
            return step("bad", said, built.image_id, built.noop)
        return step("stopped", f"{said}; an exit status of 128 or more stops the bisect", built.image_id, built.noop)

    def _words(self, state: State, *, change: bool = False) -> str:
        """The state in words: GOOD, BAD, or (``change``: BAD too) the change it makes."""
        if state.index == len(self.states) - 1 and not change:
            return "BAD"
        if state.unit is None:
            rewritten = [u for u in self.units if u.rewrite is not None and isinstance(u.before, Source)]
            return "GOOD" + "".join(
                f", source {u.name} at the merge base {u.before.commit}"  # type: ignore[union-attr]
                for u in rewritten
            )
        unit = self.units[state.unit]
        if state.commit is not None:
            return f"{unit.label} at {state.commit} ({state.position} of {state.of})"
        return f"{unit.label} as BAD has it"

    def _logged(self, steps: list[Step]) -> list[Step]:
        """Each step of a commit with the commit's subject and author date, from the cache."""
        last = len(self.states) - 1  # BAD is BAD, whichever commit its last change ends on
        states = [self.states[step.state] for step in steps]
        logged = self._log([(self.units[s.unit], s.commit) for s in states if s.unit is not None and s.commit])
        return [
            dataclasses.replace(step, commit=logged.get(s.commit or "")) if s.index != last else step
            for step, s in zip(steps, states)
        ]

    def _log(self, commits: list[tuple[Unit, str]]) -> dict[str, LoggedCommit]:
        found: dict[str, LoggedCommit] = {}
        by_repo: dict[str, list[str]] = {}
        for unit, commit in commits:
            assert isinstance(unit.after, Source)
            by_repo.setdefault(self.options.verify.source.mirrors.rewrite(unit.after.repo), []).append(commit)
        for url, shas in by_repo.items():
            try:
                logged = self.cache.git.logged_commits(self.cache.repo(url).path, shas)
            except EnvbuildError:
                continue  # the subjects are for reading; the commits stand without them
            found.update(
                {
                    sha: LoggedCommit(commit=sha, subject=subject, author_date=date)
                    for sha, (date, subject) in logged.items()
                }
            )
        return found

    def _concluded(self, result: BisectResult, search: Search, found: tuple[int, ...]) -> BisectResult:
        """The culprit and the lock that goes forward, from the first bad state (or, ambiguous, from the
        states it may be, when they are all one unit's)."""
        states = [self.states[i] for i in found]
        if len({s.unit for s in states}) > 1:
            return dataclasses.replace(result, candidates=tuple(self._words(s, change=True) for s in states))
        first = states[0] if len(states) == 1 else None
        unit_number = states[0].unit
        assert unit_number is not None
        unit = self.units[unit_number]
        good_index, bad_index = search.bounds
        last_good_state = self.states[good_index]
        last_good: Source | Fields | None = unit.before
        if last_good_state.unit == unit_number and last_good_state.commit is not None:
            last_good = self._source(unit, last_good_state)
        forward = forward_lock(self.bad.lock, unit, last_good)
        bad_step = next((s for s in result.steps if s.state == bad_index), None)
        commit = None
        if first is not None and first.commit is not None:
            commit = self._log([(unit, first.commit)]).get(first.commit) or LoggedCommit(
                commit=first.commit, subject="", author_date=""
            )
        culprit = Culprit(
            unit,
            bad_step.reason if bad_step else "",
            commit,
            first.position if first is not None else 0,
            last_good.commit if isinstance(last_good, Source) and unit.commits else None,
        )
        # The forward lock is the last good state's, when no unit comes after the culprit's.
        tested = unit_number == len(self.units) - 1
        forward_step = next((s.number for s in result.steps if s.state == good_index), None) if tested else None
        return dataclasses.replace(
            result,
            culprit=culprit,
            candidates=tuple(self._words(s, change=True) for s in states) if first is None else (),
            forward=forward,
            forward_step=forward_step,
        )


def unbuildable(exc: EnvbuildError) -> bool:
    """Whether ``exc`` says the candidate cannot be built, for what it is: not a pin that could not be
    checked (the network, offline and not in the cache) nor a cached file that cannot be read."""
    if isinstance(exc, PinsUnreachable) or (isinstance(exc, ContextError) and exc.fault):
        return False
    return isinstance(exc, UNBUILDABLE)


def one_line(text: str) -> str:
    """A reason as one line: the first line of a message (a build's log tail follows on the next ones)."""
    line = " ".join((text.strip().splitlines() or [""])[0].split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"
