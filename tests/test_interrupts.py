"""envbuild.interrupts with real signals sent to this process: a deferred Ctrl-C arrives when the block
ends, never inside it; SIGTERM unwinds a build like Ctrl-C; handlers are restored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.interrupts import deferred_interrupts, sigterm_interrupts, while_stopping
from tests.lib.signals import default_sigint


@pytest.fixture(autouse=True)
def sigint_as_under_a_terminal() -> Iterator[None]:
    """Python's own SIGINT handler, whatever this process inherited (tests/lib/signals.py)."""
    with default_sigint():
        yield


def test_ctrl_c_inside_the_block_is_raised_when_it_ends() -> None:
    finished = False
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bytecode boundaries, where Python runs its handlers
            pass
        finished = True  # the block was not cut short
    assert finished
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_is_delivered_to_the_handler_that_was_in_place() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            assert seen == []
        assert seen == [signal.SIGTERM]  # once, however often it came
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_nested_blocks_deliver_at_the_outermost_end_even_when_the_block_fails() -> None:
    order: list[str] = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            order.append("inner")
        order.append("outer")  # the inner end hands it to the outer block, which keeps it
    assert order == ["inner", "outer"]

    # the block's own error gives way to the interrupt
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        raise ValueError("the call failed")


def test_while_stopping_each_signal_calls_the_answer_and_none_raises() -> None:
    again: list[str] = []
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with while_stopping(lambda: again.append("again")):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecode boundaries, where Python runs its handlers
            pass
    assert again == ["again", "again"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    with pytest.raises(KeyboardInterrupt):  # after the block, Ctrl-C is Ctrl-C again
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass


def test_nothing_happens_without_a_signal_and_nothing_in_other_threads() -> None:
    with deferred_interrupts():
        pass
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with deferred_interrupts(), sigterm_interrupts():
                pass
        except BaseException as exc:  # signal.signal outside the main thread would raise ValueError
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert errors == []


def test_sigterm_unwinds_like_ctrl_c_inside_sigterm_interrupts() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_these_tests_pass_when_sigint_was_ignored_on_entry() -> None:
    """As when the suite runs as a background job of a script: SIGINT ignored from the start."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "not ignored_on_entry"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# A command whose interrupt passes through code run from a string (as a dataclass or namedtuple is made while
# Ray is first imported), run as `python -m` runs envrun's and envbuild's commands.
EXEC_INTERRUPTED = """\
import sys
from envbuild.cli.common import ArgumentParser, run
parser = ArgumentParser(prog="demo")
parser.set_defaults(handler=lambda args: exec("raise KeyboardInterrupt"))
sys.exit(run("demo", parser, None))
"""


def test_an_interrupt_caught_after_passing_through_exec_ends_with_130_not_by_sigint(tmp_path: Path) -> None:
    """CPython marks such an interrupt unhandled, caught or not, and ``python -m`` then killed the process
    by SIGINT at exit: `envrun cluster up` stopped by SIGTERM while it first imported Ray removed its
    nodes, said "interrupted", and died by SIGINT instead of exiting 130."""
    (tmp_path / "execdemo.py").write_text(EXEC_INTERRUPTED)
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "execdemo"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (130, "demo: interrupted\n")
