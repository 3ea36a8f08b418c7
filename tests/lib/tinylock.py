"""A tiny lock with every install mode and ref type, for rendering and record tests (no network); and the text
of a lock of one source on a branch, copied only, for tests of its upstream (:func:`branch_lock`)."""

from __future__ import annotations

import dataclasses
import textwrap

from envbuild.lock import Lock, parse_lock

DIGEST = "sha256:" + "ab" * 32
LOCK_SHA = "cd" * 32
TAG_COMMIT, BRANCH_COMMIT, NONE_COMMIT, WHEEL_COMMIT = ("1" * 40, "2" * 40, "3" * 40, "4" * 40)
LOCK_TEXT = textwrap.dedent(f"""\
    version: 1
    name: tiny
    platform: {{os: linux, arch: x86_64, python: "3.11", cann: 9.1.0}}
    base_image: {{name: "127.0.0.1:5000/envbuild-test/base:bookworm-cann9.1.0", digest: "{DIGEST}"}}
    source_date_epoch: 1700000000
    sources:
      - {{name: engine, repo: "https://example.org/engine.git", ref: main, ref_type: branch, commit: "{BRANCH_COMMIT}",
          install: {{mode: editable, env: {{VLLM_TARGET_DEVICE: empty, NOTE: "two words; $HOME"}}}}}}
      - {{name: core, repo: "https://example.org/core.git", ref: v1.0, ref_type: tag, commit: "{TAG_COMMIT}"}}
      - {{name: data, repo: "https://example.org/data.git", ref: main, ref_type: branch, commit: "{NONE_COMMIT}",
          install: {{mode: none}}}}
      - {{name: kernels, repo: "https://example.org/kernels.git", ref: v2, ref_type: tag, commit: "{WHEEL_COMMIT}",
          install: {{mode: wheel, env: {{COMPILE_CUSTOM_KERNELS: "1"}}}}}}
    packages:
      - {{name: Tiny_Pkg, version: "1.0", files: [{{filename: tiny_pkg-1.0-py3-none-any.whl, sha256: "{"e" * 64}"}}]}}
      - {{name: another, version: "2.0", files: [{{filename: another-2.0-py3-none-any.whl, sha256: "{"f" * 64}"}},
                                               {{filename: another-2.0.tar.gz, sha256: "{"a" * 64}"}}]}}
    """)


def tiny_lock(**changes: object) -> Lock:
    return dataclasses.replace(parse_lock(LOCK_TEXT, "tiny.lock.yaml"), **changes)


# The smallest valid lock: one source, nothing else (for model and hostile-input tests to start from).
MINIMAL_SHA = "ba7b5ebce12af60627a80985792a1449ce45f46c"
MINIMAL_LOCK = textwrap.dedent(f"""\
    version: 1
    name: tiny
    sources:
      - name: lib
        repo: https://example.org/lib.git
        ref: main
        ref_type: branch
        commit: {MINIMAL_SHA}
    """)


def branch_lock(name: str, url: str, commit: str, ref: str = "main") -> str:
    """A version 2 lock ``name`` of one source ``name``: ``ref`` of ``url`` (a branch) at ``commit``, copied only
    (``install: none``)."""
    return textwrap.dedent(f"""\
        version: 2
        name: {name}
        sources:
          - name: {name}
            repo: {url}
            ref: {ref}
            ref_type: branch
            commit: "{commit}"
            install: {{mode: none}}
        """)
