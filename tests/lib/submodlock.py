"""Upstream repositories with submodules, shaped like the real pinned trees, served by a real ``git daemon``:

- ``parent`` (vllm-ascend's shape): ``csrc/third_party/catlass``, a gitlink with a *relative* URL
  (``../catlass``) in ``.gitmodules``;
- ``catlass``: ``include/catlass/catlass.hpp`` and ``3rdparty/googletest``, a gitlink whose URL is an
  absolute one on a host nobody serves (``https://gitcode.example/…``), reached through a mirror rule;
- ``googletest``: the leaf, with a symlink in its tree (``include/gtest/latest -> ../../googletest``);
- ``megatron``: ten commits, tag ``core_v1`` at the last; ``bridge`` (Megatron-Bridge's shape) has
  ``3rdparty/Megatron-LM``, a gitlink to megatron's second commit (eight behind the tag) with megatron's
  own URL, which the lock skips because the ``megatron`` source provides it.

``SubmoduleUpstreams.lock_text()`` is the lock ``lock update`` completes: sources with no submodules
recorded but bridge's skip, exactly what a user writes before the first update.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from tests.lib.gitrepos import Repo, Served

CATLASS_PATH = "csrc/third_party/catlass"
GTEST_PATH = "3rdparty/googletest"
MEGATRON_PATH = "3rdparty/Megatron-LM"
GTEST_UPSTREAM = "https://gitcode.example/GitHub_Trending/go/googletest.git"
SKIP_REASON = "the megatron source provides Megatron-LM"


@dataclass
class SubmoduleUpstreams:
    served: Served
    under: str
    repos: dict[str, Repo]
    commits: dict[str, str] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return self.served.url(f"{self.under}/{name}", "daemon-filter")

    def mirrors(self) -> list[str]:
        """The --mirror rules that reach googletest, whose URL in catlass's .gitmodules nobody serves."""
        return [f"{GTEST_UPSTREAM}={self.url('googletest')}"]

    def mirror_args(self) -> list[str]:
        return [arg for rule in self.mirrors() for arg in ("--mirror", rule)]

    def tree(self, name: str, commit: str | None = None) -> str:
        return self.repos[name].tree(commit or self.commits[name])

    def lock_text(self, name: str = "submodtest", parent_ref: str = "main", **extra: str) -> str:
        """A version 2 lock of parent (at the head of ``parent_ref``), bridge (skipping its Megatron-LM) and
        megatron, copied only (``install: none``); ``extra`` adds top-level keys (``base_image``,
        ``source_date_epoch``)."""
        more = "".join(f"{key}: {value}\n" for key, value in extra.items())
        return f"version: 2\nname: {name}\n{more}" + textwrap.dedent(f"""\
            sources:
              - name: parent
                repo: {self.url("parent")}
                ref: {parent_ref}
                ref_type: branch
                commit: {self.repos["parent"].rev(parent_ref)}
                install: {{mode: none}}
              - name: bridge
                repo: {self.url("bridge")}
                ref: v0.5.0
                ref_type: tag
                commit: {self.commits["bridge"]}
                install: {{mode: none}}
                submodules:
                  - {{path: {MEGATRON_PATH}, skip: {SKIP_REASON}}}
              - name: megatron
                repo: {self.url("megatron")}
                ref: core_v1
                ref_type: tag
                commit: {self.commits["megatron"]}
                install: {{mode: none}}
            """)

    def write_lock(self, path: Path, name: str = "submodtest", parent_ref: str = "main", **extra: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.lock_text(name, parent_ref, **extra))
        return path


def make_upstreams(served: Served, under: str) -> SubmoduleUpstreams:
    """The five repositories under ``<served.base>/<under>/``, served by the session's daemons."""
    repos = {name: served.repo(f"{under}/{name}") for name in ("googletest", "catlass", "parent", "megatron", "bridge")}
    up = SubmoduleUpstreams(served, under, repos)
    gtest = repos["googletest"]
    gtest.commit(
        "googletest", files={"googletest/include/gtest/gtest.h": "// gtest\n", "CMakeLists.txt": "project(gtest)\n"}
    )
    (gtest.path / "include/gtest").mkdir(parents=True)
    (gtest.path / "include/gtest/latest").symlink_to("../../googletest")
    up.commits["googletest"] = gtest.commit("a symlink", files={})
    gtest.tag("v1.14.0", "HEAD")

    catlass = repos["catlass"]
    catlass.commit("catlass", files={"include/catlass/catlass.hpp": "#pragma once\n", "README.md": "catlass\n"})
    up.commits["catlass"] = catlass.commit_gitlinks(
        "googletest as a submodule",
        {GTEST_PATH: up.commits["googletest"]},
        {"googletest": (GTEST_PATH, GTEST_UPSTREAM)},
    )

    parent = repos["parent"]
    parent.commit("parent", files={"csrc/build_aclnn.sh": "#!/bin/sh\nls csrc/third_party/catlass/include\n"})
    up.commits["parent"] = parent.commit_gitlinks(
        "catlass as a submodule", {CATLASS_PATH: up.commits["catlass"]}, {"catlass": (CATLASS_PATH, "../catlass")}
    )

    megatron = repos["megatron"]
    history = [
        megatron.commit(f"megatron {n}", files={"megatron/core/__init__.py": f"VERSION = {n}\n"}) for n in range(10)
    ]
    megatron.tag("core_v1", history[-1])
    up.commits["megatron"] = history[-1]
    up.commits["megatron-gitlink"] = history[1]  # eight commits behind the tag
    megatron.checkout("side", create_at=history[0])  # not on the gitlink's line
    up.commits["megatron-side"] = megatron.commit("off the line", files={"side.txt": "side\n"})
    megatron.checkout("main")

    bridge = repos["bridge"]
    bridge.commit("bridge", files={"src/megatron/bridge/__init__.py": "", "pyproject.toml": "[project]\nname='b'\n"})
    up.commits["bridge"] = bridge.commit_gitlinks(
        "Megatron-LM as a submodule",
        {MEGATRON_PATH: history[1]},
        {"Megatron-LM": (MEGATRON_PATH, up.url("megatron"))},
    )
    bridge.tag("v0.5.0", "HEAD")
    return up
