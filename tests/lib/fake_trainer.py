"""A stand-in for ``python3 -m verl.trainer.main_ppo``: checks it got the plan's arguments and environment.

``FAKE_TRAINER_EXPECT`` names a JSON file ``{"args": [...], "env": {...}}``: the arguments after the
program and the environment entries it must see. Exit 0 when both match, 1 (with the difference)
otherwise. ``FAKE_TRAINER_EXPORT=FROM=TO`` copies a checkpoint directory as a run's HF export.
``FAKE_TRAINER_SLEEP`` seconds: wait after the check (for Ctrl-C tests); SIGINT exits 130.
Runnable as ``python tests/lib/fake_trainer.py`` or ``python -m tests.lib.fake_trainer``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time


def main(args: list[str]) -> int:
    expect_file = os.environ.get("FAKE_TRAINER_EXPECT")
    if not expect_file:
        print("fake trainer: FAKE_TRAINER_EXPECT is not set", flush=True)
        return 1
    with open(expect_file, encoding="utf-8") as f:
        expect = json.load(f)
    problems = []
    if args != expect["args"]:
        for i, (got, want) in enumerate(zip(args, expect["args"])):
            if got != want:
                problems.append(f"argument {i}: got {got!r}, expected {want!r}")
        if len(args) != len(expect["args"]):
            problems.append(f"got {len(args)} arguments, expected {len(expect['args'])}")
    for name, value in expect.get("env", {}).items():
        if os.environ.get(name) != value:
            problems.append(f"env {name}: got {os.environ.get(name)!r}, expected {value!r}")
    for problem in problems:
        print(f"fake trainer: {problem}", flush=True)
    if problems:
        return 1
    if export := os.environ.get("FAKE_TRAINER_EXPORT"):  # "FROM=TO": save HF weights as the trainer would
        source, _, target = export.partition("=")
        shutil.copytree(source, target)
    print(f"fake trainer: ok, {len(args)} arguments and {len(expect.get('env', {}))} env entries match", flush=True)
    seconds = float(os.environ.get("FAKE_TRAINER_SLEEP", "0"))
    if seconds:
        try:
            print("fake trainer: sleeping", flush=True)
            time.sleep(seconds)
        except KeyboardInterrupt:
            print("fake trainer: interrupted", flush=True)
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
