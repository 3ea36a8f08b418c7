"""Acceptance check of submodules against the real pinned trees (not in CI: GitHub is out of its reach).

    . /run/envbuild-test/env
    .venv/bin/python scripts/accept_submodules.py \
        --vllm-ascend SNAPSHOT --catlass SNAPSHOT --googletest SNAPSHOT \
        --megatron-lm SNAPSHOT --megatron-bridge SNAPSHOT [--base NAME@sha256:DIGEST] [--work DIR]

Each SNAPSHOT is a (bare) git repository of the public upstream: vllm-project/vllm-ascend, hicann/catlass
(GitHub's mirror of gitcode's cann/catlass), google/googletest, NVIDIA/Megatron-LM, NVIDIA-NeMo/Megatron-Bridge.
They are served read-only by ``git daemon`` on 127.0.0.1 (partial clone allowed: snapshots may lack large
blobs) under the paths of their real hosts, and reached through ``--mirror`` rules, as on an air-gapped
cluster: ``https://github.com/`` and ``https://gitcode.com/`` (catlass and googletest are submodules on
gitcode). Then, from empty caches, with the real envbuild commands:

1. ``lock update`` of a lock of megatron-lm (core_v0.18.0), megatron-bridge (v0.5.0, its 3rdparty/Megatron-LM
   skipped by path) and vllm-ascend (releases/v0.23.0, at the snapshot's head): every level recorded;
2. ``lock verify`` of it: each submodule checked, and how Bridge's Megatron-LM pairs with megatron-lm;
3. ``lock verify`` of the project's real lock through the same mirrors (where its pins are in the snapshots);
4. ``envbuild image`` of vllm-ascend alone (install mode ``none``: no CANN here), whose source directory then
   holds catlass's ``include/`` and googletest, each tree checked inside the image.

The base image is ``--base`` or, by default, the test suite's base image pushed to the local registry
(``$ENVBUILD_TEST_REGISTRY``); the engine is ``$DOCKER_HOST``. Everything it starts is stopped by PID; the
image it builds is removed at the end. Prints what each command printed; exit 0 only when every step did
what it should.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the project and its test helpers (the base image, the git daemon)

from envbuild.lock import read_lock, write_lock  # noqa: E402
from envbuild.lock.model import BaseImage  # noqa: E402
from tests.lib.gitrepos import GitDaemon  # noqa: E402

SNAPSHOTS = {  # option: where the snapshot is served, as its upstream URL names it
    "vllm_ascend": "github/vllm-project/vllm-ascend.git",
    "megatron_lm": "github/NVIDIA/Megatron-LM.git",
    "megatron_bridge": "github/NVIDIA-NeMo/Megatron-Bridge.git",
    "catlass": "gitcode/cann/catlass.git",
    "googletest": "gitcode/GitHub_Trending/go/googletest.git",
}
LOCK_NAME = "accept-submodules"
SKIP = "the megatron-lm source provides Megatron-LM; pip installs Bridge from src/"


def envbuild(*args: str) -> tuple[int, str]:
    """One envbuild command, as a user runs it; its output shown and returned."""
    command = [str(REPO / ".venv" / "bin" / "envbuild"), *args]
    print(f"\n$ envbuild {' '.join(args)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    print(done.stdout + done.stderr, end="", flush=True)
    print(f"(exit {done.returncode}, {time.perf_counter() - start:.1f} s)", flush=True)
    return done.returncode, done.stdout


def head_of(snapshot: Path, ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(snapshot), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def base_image(given: str | None) -> tuple[str, str]:
    if given:
        name, _, digest = given.partition("@")
        return name, digest
    import docker

    from tests.lib.baseimage import ensure_base_image
    from tests.lib.services import push_as

    registry = os.environ.get("ENVBUILD_TEST_REGISTRY")
    if not registry or not os.environ.get("DOCKER_HOST"):
        raise SystemExit("no --base, and no test services: `. /run/envbuild-test/env` after `scripts/services start`")
    client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"], version="auto", timeout=600)
    try:
        base = ensure_base_image(client)
        repository, tag = f"{registry}/envbuild-accept/base", base.tag.rsplit(":", 1)[1]
        return f"{repository}:{tag}", push_as(client, base.tag, repository, tag)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for option in SNAPSHOTS:
        parser.add_argument(f"--{option.replace('_', '-')}", type=Path, required=True, metavar="SNAPSHOT")
    parser.add_argument("--base", help="the base image as NAME@sha256:DIGEST (default: the test base, pushed)")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="accept-submodules-") as tmp:
        return accept(args, args.work or Path(tmp))


def accept(args: argparse.Namespace, work: Path) -> int:
    served = work / "served"
    for option, where in SNAPSHOTS.items():
        link = served / where
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(Path(getattr(args, option)).resolve())
    daemon = GitDaemon(served, allow_filter=True).start()
    failures: list[str] = []
    try:
        root = f"git://127.0.0.1:{daemon.port}"
        mirrors = [
            "--mirror",
            f"https://github.com/={root}/github/",
            "--mirror",
            f"https://gitcode.com/={root}/gitcode/",
        ]
        print(
            f"serving {len(SNAPSHOTS)} snapshots read-only on {root}/ (git daemon pid {daemon.proc.pid if daemon.proc else '?'})"
        )
        ascend = head_of(args.vllm_ascend, "refs/heads/releases/v0.23.0")
        lock = work / "accept.lock.yaml"
        lock.write_text(
            textwrap.dedent(f"""\
                version: 2
                name: {LOCK_NAME}
                sources:
                  - name: megatron-lm
                    repo: https://github.com/NVIDIA/Megatron-LM.git
                    ref: core_v0.18.0
                    ref_type: tag
                    commit: ba7b5ebce12af60627a80985792a1449ce45f46c
                    install: {{mode: none}}
                  - name: megatron-bridge
                    repo: https://github.com/NVIDIA-NeMo/Megatron-Bridge.git
                    ref: v0.5.0
                    ref_type: tag
                    commit: fcbb6031103d0ca845c1a54d4fee55ecfcca17b6
                    install: {{mode: none}}
                    submodules:
                      - {{path: 3rdparty/Megatron-LM, skip: "{SKIP}"}}
                  - name: vllm-ascend
                    repo: https://github.com/vllm-project/vllm-ascend.git
                    ref: releases/v0.23.0
                    ref_type: branch
                    commit: {ascend}
                    install: {{mode: none}}
                """)
        )
        cache = work / "cache"
        code, _ = envbuild("lock", "update", str(lock), "--cache-dir", str(cache), *mirrors)
        if code != 0:
            failures.append("lock update")
        print("\n" + lock.read_text())
        code, out = envbuild("lock", "verify", str(lock), "--cache-dir", str(cache), *mirrors)
        if code != 0 or "contained in source megatron-lm's pin, 8 commits ahead" not in out:
            failures.append("lock verify")
        envbuild(
            "lock", "verify", str(REPO / "lockfiles" / "glm5_2-ascend.lock.yaml"), "--cache-dir", str(cache), *mirrors
        )

        name, digest = base_image(args.base)
        updated = read_lock(lock).lock
        image_lock = work / "vllm-ascend.lock.yaml"
        write_lock(
            image_lock,
            dataclasses.replace(
                updated,
                name=f"{LOCK_NAME}-image",
                base_image=BaseImage(name=name, digest=digest),
                source_date_epoch=1767225600,
                sources=(updated.source("vllm-ascend"),),
            ),
        )
        code, out = envbuild("image", str(image_lock), "--cache-dir", str(work / "image-cache"), *mirrors, "--json")
        if code != 0:
            failures.append("envbuild image")
        else:
            failures += check_image(out)
    finally:
        daemon.stop()
    print(f"\n{'FAILED: ' + ', '.join(failures) if failures else 'OK: every step did what it should'}")
    return 1 if failures else 0


def check_image(output: str) -> list[str]:
    """What the image's vllm-ascend directory holds of its submodules (the in-image check already compared
    every level's tree with its commit's)."""
    import docker

    image = json.loads(output)["image_id"]
    catlass = "/opt/envbuild/src/vllm-ascend/csrc/third_party/catlass"
    gtest = f"{catlass}/3rdparty/googletest/googletest/include/gtest/gtest.h"
    script = (
        f"ls {catlass}/include; find {catlass}/include -type f | wc -l; ls {catlass}/3rdparty/googletest;"
        f" test -f {gtest} && echo 'googletest: {gtest}'; du -sh {catlass}"
    )
    client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"], version="auto", timeout=600)
    try:
        print(f"\n$ docker run --network none {image[:19]} sh -c '{script}'")
        out = client.containers.run(image, ["sh", "-c", script], network_mode="none", remove=True).decode()
        print(out, end="")
        for image_ in client.images.list(filters={"label": f"io.envbuild.lock.name={LOCK_NAME}-image"}):
            client.images.remove(image_.id, force=True)
    finally:
        client.close()
    holds = out.startswith("catlass\ntla\n") and f"googletest: {gtest}" in out
    return [] if holds else ["the image lacks catlass's include/ or googletest"]


if __name__ == "__main__":
    sys.exit(main())
