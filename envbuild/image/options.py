"""What ``envbuild image``'s options and lock must be before anything begins: each refusal here is one a
build would otherwise meet only at its end (a tag docker refuses, a push of the default name, a record
directory that cannot be one) or after every input is fetched (a lock with no base image). The command
line asks before :mod:`.early` begins anything, the build again at its start."""

from __future__ import annotations

import os
from pathlib import Path

from envbuild.config import SourceOptions
from envbuild.data.reference import check_name_and_tag
from envbuild.errors import InputError
from envbuild.lock.io import LockFile


def check_tags(tags: tuple[str, ...]) -> None:
    """Every ``--tag`` is ``[registry[:port]/]path[:tag]`` in docker's grammar, checked before anything is
    built (a bad one would otherwise fail only at tagging, leaving an untagged image)."""
    problems = [f"--tag: {problem}" for tag in tags if (problem := check_name_and_tag(tag)) is not None]
    if problems:
        raise InputError("\n".join(problems))


def check_image_options(
    read: LockFile, *, tags: tuple[str, ...], push: bool, record_dir: Path | None, source: SourceOptions
) -> None:
    """What would make a build fail only at its end, after the tag or the push (a bad ``--tag``, ``--push``
    with the default name, which is Docker Hub's, a ``--record-dir`` that cannot be one), or after
    everything is fetched (a lock with no base image): refused before anything begins, exit 2."""
    check_tags(tags)
    if push and not tags:
        raise InputError(
            "--push needs --tag REGISTRY/REPOSITORY:TAG: the default name, envbuild/<lock name>:…, is Docker Hub's"
        )
    if read.lock.base_image is None:
        command = source.lock_command("update", read.path, "--base-image", "IMAGE[:TAG]")
        raise InputError(f"{read.path}: base_image: the lock has none to build on; `{command}` sets and pins one")
    record = record_dir if record_dir is not None else read.path.parent / "build"
    existing = next((p for p in (record, *record.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        shown = "it" if existing == record else str(existing)
        raise InputError(f"--record-dir {record}: {shown} exists and is not a directory")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        flag = "--record-dir" if record_dir is not None else "the build record's directory"
        raise InputError(f"{flag} {record}: {existing} cannot be written (give --record-dir DIR)")
