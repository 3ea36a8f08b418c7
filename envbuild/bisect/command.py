"""`envbuild bisect --run CMD`: the command run after each build, as `git bisect run` runs one."""

from __future__ import annotations

import os
import signal
import subprocess

from envbuild.interrupts import deferred_interrupts
from envbuild.progress import Progress

RUN_GRACE = 5.0  # seconds an interrupted command has between SIGTERM and SIGKILL


def run_command(command: str, image: str, image_id: str, say: Progress) -> tuple[int, str]:
    """Run ``command`` with the shell, the image in ``$ENVBUILD_IMAGE`` (its tag) and ``$ENVBUILD_IMAGE_ID``;
    its output (both streams) goes to ``say`` line by line; its exit status (a signal's death as 128 + the
    signal, as a shell says it) and its last line that is not blank. It runs in a process group of its own,
    stopped whole (SIGTERM, then SIGKILL after :data:`RUN_GRACE`) when the bisect is interrupted: nothing it
    started outlives the bisect, or runs on after the bisect has let the lock's tag go."""
    env = {**os.environ, "ENVBUILD_IMAGE": image, "ENVBUILD_IMAGE_ID": image_id}
    tail = ""
    with subprocess.Popen(
        command,
        shell=True,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    ) as process:
        try:
            assert process.stdout is not None
            for line in process.stdout:
                line = line.rstrip("\n")
                say(f"run: {line}")
                if line.strip():
                    tail = line.strip()
            code = process.wait()
        except BaseException:
            with deferred_interrupts():  # a second Ctrl-C must not cut the stop short
                stop_group(process)
            raise
    return (128 - code if code < 0 else code), tail


def stop_group(process: subprocess.Popen[str], grace: float = RUN_GRACE) -> None:
    """Stop ``process``'s group (it leads one): SIGTERM, and SIGKILL to what is left after ``grace``
    seconds. The group's ID stays taken while any member lives, so the SIGKILL reaches no one else."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # members that outlived their leader or ignored SIGTERM
    except ProcessLookupError:
        pass
    process.wait()
