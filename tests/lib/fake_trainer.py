"""A stand-in for ``python3 -m verl.trainer.main_ppo``: checks it got the plan's arguments and environment.

``FAKE_TRAINER_EXPECT`` names a JSON file ``{"args": [...], "env": {...}}``: the arguments after the
program and the environment entries it must see. Exit 0 when both match, 1 (with the difference)
otherwise. ``FAKE_TRAINER_EXPORT=FROM=TO`` copies a checkpoint directory as a run's HF export.
``FAKE_TRAINER_SLEEP`` seconds: wait after the check (for Ctrl-C tests; on a Ray cluster too); SIGINT exits 130.
``FAKE_TRAINER_CHILD=1``: start a child process that sleeps (as a trainer starts Ray) and print its PID.
``FAKE_TRAINER_RAY_NODES=N`` (on a Ray cluster, as verl's driver is): run one task pinned to each alive
node, which reports its node and the environment it sees; exit 1 unless there are N nodes and every
task saw ``FAKE_TRAINER_RAY_ENV`` (``NAME=VALUE``, the recipe's runtime env reaching the workers), and, with
``FAKE_TRAINER_RAY_READ=PATH=TEXT``, read ``TEXT`` from ``PATH`` (a cluster volume) on every node.
Runnable as ``python tests/lib/fake_trainer.py``, ``python -m tests.lib.fake_trainer`` or, inside an
image that does not hold this file, ``python3 -c "$(cat fake_trainer.py)" ARGS``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time


def on_every_node(count: int, env: str, read: str = "") -> list[str]:
    """One task per alive Ray node; the problems seen (none when all ``count`` nodes ran it and saw ``env``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    path, _, text = read.partition("=")

    @ray.remote(num_cpus=0)
    def where(name: str) -> tuple[str, str | None]:
        node = ray.get_runtime_context().get_node_id()
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() != text:
                        return node, f"{path} holds something else"
            except OSError as exc:
                return node, f"{path}: {exc}"
        return node, os.environ.get(name)

    ray.init()
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    name, _, value = env.partition("=")
    pinned = [NodeAffinitySchedulingStrategy(node, soft=False) for node in nodes]
    answers = ray.get([where.options(scheduling_strategy=s).remote(name) for s in pinned])
    print(f"fake trainer: ran a task on nodes {sorted(a[0] for a in answers)}", flush=True)
    problems = [f"{len(nodes)} alive nodes, expected {count}"] if len(nodes) != count else []
    problems += [f"node {node}: env {name}={seen!r}, expected {value!r}" for node, seen in answers if seen != value]
    problems += [f"a task pinned to {n} ran on {a[0]}" for n, a in zip(nodes, answers) if a[0] != n]
    return problems


def main(args: list[str]) -> int:
    expect_file = os.environ.get("FAKE_TRAINER_EXPECT")
    if not expect_file and os.environ.get("FAKE_TRAINER_RAY_NODES"):
        problems = on_every_node(
            int(os.environ["FAKE_TRAINER_RAY_NODES"]),
            os.environ.get("FAKE_TRAINER_RAY_ENV", ""),
            os.environ.get("FAKE_TRAINER_RAY_READ", ""),
        )
        for problem in problems:
            print(f"fake trainer: {problem}", flush=True)
        print("fake trainer: ok, on every node" if not problems else "fake trainer: FAILED", flush=True)
        if not problems and (seconds := float(os.environ.get("FAKE_TRAINER_SLEEP", "0"))):
            print("fake trainer: sleeping", flush=True)
            time.sleep(seconds)
        return 1 if problems else 0
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
        shutil.copytree(source, target, dirs_exist_ok=True)
    print(f"fake trainer: ok, {len(args)} arguments and {len(expect.get('env', {}))} env entries match", flush=True)
    if os.environ.get("FAKE_TRAINER_CHILD"):
        import subprocess

        child = subprocess.Popen(["sleep", "300"])
        print(f"fake trainer: started child {child.pid}", flush=True)
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
