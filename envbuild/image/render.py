"""The Dockerfile of a lock's image: a pure function of the :class:`ContextPlan`.

The text comes from templates under ``images/`` (``Dockerfile.in``, ``platform_check.sh.in``) with
``{{name}}`` placeholders; every value put in is either validated by the lock model (names, SHAs,
digests, versions) or shell-quoted (the ``install.env`` values).
"""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path

from envbuild.errors import InputError
from envbuild.image.plan import (
    IMAGE_META,
    IMAGE_WHEELS,
    LOCK_LABEL,
    LOCK_NAME_LABEL,
    ContextPlan,
    SourcePlan,
    source_commit_label,
)

# `templates` is a link to the repository's images/ (where the templates live, per the design card), so
# that they also ship inside the wheel as package data; a non-editable install finds them here too.
TEMPLATE_DIR = Path(__file__).parent / "templates"
PIP = "python3 -m pip"
# Only what this build itself may leave behind; base-image paths are never touched (a deletion would
# add a whiteout, i.e. modify the base). __pycache__ outside /opt/envbuild is dropped by normalize.
CLEANUP = (
    "rm -rf /tmp/envbuild-* /root/.cache/pip && find /opt/envbuild -depth -name __pycache__ -type d -exec rm -rf {} +"
)
_PLACEHOLDER = re.compile(r"\{\{([a-z0-9_]+)\}\}")


@lru_cache(maxsize=None)
def load_template(name: str) -> str:
    path = TEMPLATE_DIR / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the image template: {exc.strerror}") from None


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every ``{{name}}``; a placeholder without a value is a bug, not an empty string."""
    missing = sorted(set(_PLACEHOLDER.findall(template)) - values.keys())
    if missing:
        raise KeyError(f"template placeholders without a value: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def base_reference(plan: ContextPlan) -> str:
    if plan.base_digest:
        return f"{plan.base_name.rsplit(':', 1)[0] if _has_tag(plan.base_name) else plan.base_name}@{plan.base_digest}"
    if not plan.allow_unpinned:
        raise InputError(
            f"base_image {plan.base_name} is not pinned by digest: add base_image.digest "
            "(an unpinned base is allowed only for tests)"
        )
    return plan.base_name


def _has_tag(name: str) -> bool:
    """True when *name* ends in ``:tag`` (a ``:port`` belongs to the registry, before any '/')."""
    return ":" in name.rsplit("/", 1)[-1]


def render_platform_check(plan: ContextPlan) -> str:
    if not plan.cann and not plan.python:
        return "# no platform.cann or platform.python in the lock: nothing to check in the base image"
    return fill(
        load_template("platform_check.sh.in"),
        {"cann": shlex.quote(plan.cann or ""), "python": shlex.quote(plan.python or "")},
    ).rstrip("\n")


def render_packages(plan: ContextPlan) -> str:
    if not plan.files:
        return "# no packages in the lock"
    return "\n".join(
        [
            f"COPY wheels/ {IMAGE_WHEELS}/",
            f"COPY envbuild/requirements.txt {IMAGE_META}/requirements.txt",
            f"RUN {PIP} install --no-index --require-hashes --no-deps --no-compile \\",
            f"      --find-links {IMAGE_WHEELS} -r {IMAGE_META}/requirements.txt \\",
            f" && {CLEANUP}",
        ]
    )


def _env_prefix(source: SourcePlan) -> str:
    return "".join(f"{key}={shlex.quote(value)} " for key, value in source.env)


def render_source(source: SourcePlan) -> str:
    lines = [
        f"# {source.name}: {source.ref_type} {source.ref} at {source.commit} ({source.mode})",
        f"COPY {source.context_path}/ {source.image_path}/",
    ]
    env = _env_prefix(source)
    if source.mode == "editable":
        lines += [
            f"RUN {env}{PIP} install --no-build-isolation --no-deps --no-index --no-compile \\",
            f"      -e {source.image_path} \\",
            f" && {CLEANUP}",
        ]
    elif source.mode == "wheel":
        out = f"/tmp/envbuild-wheel-{source.name}"
        lines += [
            f"RUN {env}{PIP} wheel --no-build-isolation --no-deps --no-index -w {out} {source.image_path} \\",
            f" && {PIP} install --no-index --no-deps --no-compile {out}/*.whl \\",
            f" && {CLEANUP}",
        ]
    elif source.mode != "none":
        raise ValueError(f"unknown install mode {source.mode!r}")
    return "\n".join(lines)


def render_labels(plan: ContextPlan) -> str:
    labels = [(LOCK_NAME_LABEL, plan.lock_name), (LOCK_LABEL, plan.lock_sha256)]
    labels += [(source_commit_label(s.name), s.commit) for s in plan.sources]
    return " \\\n      ".join(f'"{key}"="{value}"' for key, value in labels)


def render_dockerfile(plan: ContextPlan) -> str:
    """The whole Dockerfile; ``envbuild image --dry-run`` prints exactly this."""
    return fill(
        load_template("Dockerfile.in"),
        {
            "lock_name": plan.lock_name,
            "lock_sha256": plan.lock_sha256,
            "base": base_reference(plan),
            "platform_check": render_platform_check(plan),
            "packages": render_packages(plan),
            "epoch": str(plan.epoch),
            "sources": "\n".join(render_source(s) for s in plan.sources) or "# no sources in the lock",
            "labels": render_labels(plan),
        },
    )
