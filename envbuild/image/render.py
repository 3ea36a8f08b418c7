"""What a build runs, as text: pure functions of the :class:`ContextPlan`. The engine's BuildKit runs:

1. the packages image, ``envbuild-pkg/<lock name>:<packages key>``, in two builds: the tools image
   (``Dockerfile.tools.in``, ``tools-stage.in``, ``tools.sh.in``: the base and the tools layer), then on it the package
   files bind-mounted and installed (``Dockerfile.packages.in``, ``packages.buildkit.sh.in``,
   ``stage_packages.py.in``) — no package file in any layer; reused while its key holds (the key hashes
   everything the two builds read: the builder, the base by digest, the requirements with their hashes,
   the scripts);
2. the image (``Dockerfile.buildkit.in``) on it: one ``RUN`` per source (bind-mounted, copied, timed,
   installed, clamped), then the labels (the in-image check's files: a layer :mod:`.normalise` writes).

The text comes from templates under ``images/`` with ``{{name}}`` placeholders; every value put in is
either validated by the lock model (names, SHAs, digests, versions) or shell-quoted (the ``install.env``
values).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from functools import cache
from pathlib import Path

from envbuild.errors import InputError
from envbuild.image.plan import (
    IMAGE_META,
    IMAGE_ROOT,
    INSTALLER_DIR,
    INSTALLER_IN_STEP,
    LOCK_LABEL,
    LOCK_NAME_LABEL,
    MOUNT_POINT,
    ContextPlan,
    SourcePlan,
    source_commit_label,
)

# `templates` is a link to the repository's images/ (where the templates live, per the design card), so
# that they also ship inside the wheel as package data; a non-editable install finds them here too.
TEMPLATE_DIR = Path(__file__).parent / "templates"
PIP = "python3 -m pip"
PACKAGES_REPOSITORY = "envbuild-pkg"
RAW_REPOSITORY = "envbuild-raw"  # what BuildKit built, before envbuild composed its config
CLAMP = f"{IMAGE_ROOT}/bin/clamp-mtimes"
# No RUN writes bytecode (PYTHONDONTWRITEBYTECODE, as the image's ENV sets it): Python reads the image's own
# (the base's pip, say) and compiles the rest in memory, so no bytecode cache is mounted, none can be
# another build's, and none reaches a layer.
UV_STAGE = f"{IMAGE_ROOT}/stage"  # where the lock's uv installs before the files move into the site (none left)
PACKAGES_REPORT = f"{IMAGE_META}/packages-report.json"  # BuildKit: what the packages step says it replaced
# The mtime of every file the packages layer holds (1980-01-01, the earliest a wheel's zip can record).
# Fixed rather than the build's epoch: with the default epoch (the newest pinned commit's date), moving
# a source pin may move the epoch, and that must not reinstall every package.
PACKAGES_EPOCH = 315532800
_PLACEHOLDER = re.compile(r"\{\{([a-z0-9_]+)\}\}")


@cache
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
    """The RUN instruction that checks the base's CANN and Python against the lock's platform."""
    if not plan.cann and not plan.python:
        return "# no platform.cann or platform.python in the lock: nothing to check in the base image"
    return fill(
        load_template("platform_check.sh.in"),
        {"cann": shlex.quote(plan.cann or ""), "python": shlex.quote(plan.python or "")},
    ).rstrip("\n")


def platform_check_shell(plan: ContextPlan) -> str:
    """The same check as a shell command (the packages script runs it before installing anything)."""
    check = render_platform_check(plan)
    return check[len("RUN ") :] if check.startswith("RUN ") else ": nothing to check"


# --- 1.: the packages ----------------------------------------------------------------------------


def packages_key(plan: ContextPlan) -> str:
    """Everything the packages image is made of: the builder, the base by digest, the requirements (each
    file's sha256) and the scripts; equal keys give equal packages layers."""
    digest = hashlib.sha256()
    for part in (
        "buildkit",  # the builder (once one of two; kept so that packages images made before stay valid)
        base_reference(plan),
        render_buildkit_packages_script(plan),
        render_tools_dockerfile(plan),
        render_packages_dockerfile(plan),
        render_tools_script(),
        load_template("stage_packages.py.in"),
        load_template("clamp-mtimes.sh.in"),
        plan.requirements,
        *((plan.installer.sha256,) if plan.installer else ()),  # the uv that installs (its script says how)
    ):
        digest.update(hashlib.sha256(part.encode()).digest())
    return digest.hexdigest()


def packages_reference(plan: ContextPlan) -> str:
    return f"{PACKAGES_REPOSITORY}/{plan.lock_name}:{packages_key(plan)[:16]}"


def tools_reference(plan: ContextPlan) -> str:
    """The tag of the tools image (the base and the tools layer) while the packages step builds on it.
    Per lock name: builds of one lock take turns (``lock_name_held``), and another lock's build holds its
    own tag, never one this build may still be reading."""
    return f"{RAW_REPOSITORY}/{plan.lock_name}:packages-tools"


def raw_reference(plan: ContextPlan) -> str:
    """The tag of the image's raw BuildKit result (before normalising), kept for the next build's cache."""
    return f"{RAW_REPOSITORY}/{plan.lock_name}:{plan.lock_sha256[:12]}"


def raw_packages_reference(plan: ContextPlan) -> str:
    """The tag that holds the packages step's raw BuildKit image while its report and layers are read.
    Two locks whose packages are the same get one raw image ID from BuildKit's cache (the raw config
    carries no lock name), so each build holds and drops its own tag, never the ID another may be reading."""
    return f"{RAW_REPOSITORY}/{plan.lock_name}:packages"


# --- 2.: the image ------------------------------------------------------------------------------


def render_labels(plan: ContextPlan) -> str:
    labels = [(LOCK_NAME_LABEL, plan.lock_name), (LOCK_LABEL, plan.lock_sha256)]
    labels += [(source_commit_label(s.name), s.commit) for s in plan.sources]
    return " \\\n      ".join(f'"{key}"="{value}"' for key, value in labels)


def render_dockerfile(plan: ContextPlan) -> str:
    """What a build of the plan runs, in order; ``envbuild image --dry-run`` prints exactly this, and
    the build record hashes it: the tools image's Dockerfile, the packages image's and its script (in
    comments), then the image's."""
    if not plan.files:
        return render_buildkit_image_dockerfile(plan)
    script = render_buildkit_packages_script(plan)
    return "\n".join(
        [
            f"# ---- 1 of 3: the tools image, {tools_reference(plan)} ----",
            render_tools_dockerfile(plan).rstrip("\n"),
            f"# ---- 2 of 3: the packages image, {packages_reference(plan)} ----",
            render_packages_dockerfile(plan).rstrip("\n"),
            f"# {MOUNT_POINT}/packages.sh (the package files beside it: requirements.txt, wheels/"
            f"{', uv' if plan.installer else ''}):",
            "\n".join(f"#     {line}" if line else "#" for line in script.splitlines()),
            "# ---- 3 of 3: the image ----",
            render_buildkit_image_dockerfile(plan),
        ]
    )


# --- 2., on BuildKit ----------------------------------------------------------------------------


def render_tools_script() -> str:
    """The tools stage's script (``images/tools.sh.in``): the first layer of a BuildKit-built image."""
    values = {"mnt": MOUNT_POINT, "clamp": CLAMP, "packages_epoch": str(PACKAGES_EPOCH)}
    return fill(load_template("tools.sh.in"), values)


START_STAGE = "envbuild-start"  # the image before its sources: the packages image, or the base and tools


def _heading(source: SourcePlan, mode: str, tail: str = "") -> str:
    """The comment above a source's step: its ref, commit and install mode."""
    return f"# {source.name}: {source.ref_type} {source.ref} at {source.commit} ({mode}){tail}"


def copy_stage(source: SourcePlan) -> str:
    return f"envbuild-src-{source.name}"


def render_copy_stage(source: SourcePlan, epoch: int) -> str:
    """A copy-only source's (``mode: none``) files, made in a stage of their own on the image before any
    source: ``/out`` holds them at the source's path, every mtime the epoch, ``/opt`` as the image has it
    (its mode, owner, mtime) and the directories below it 0755 root at the epoch, as the source's own
    ``RUN`` would leave them. The image takes ``/out`` with one ``COPY`` (:func:`render_buildkit_source`):
    the stage depends on nothing but the source, so a moved pin before it reruns only that ``COPY``, and
    a full build makes the stage beside the other sources' steps."""
    dest = source.image_path
    return "\n".join(
        [
            _heading(source, "none", ": its files, in a stage"),
            f"FROM {START_STAGE} AS {copy_stage(source)}",
            f"RUN --mount=type=bind,source={source.context_path},target={MOUNT_POINT} \\",
            f"    mkdir -p /out{dest} && cp -R --preserve=mode {MOUNT_POINT}/. /out{dest}/ \\",
            f" && find /out -exec touch -h -d @{epoch} {{}} + \\",
            " && chmod --reference=/opt /out/opt && chown --reference=/opt /out/opt && touch -h -r /opt /out/opt",
        ]
    )


def render_buildkit_source(source: SourcePlan, epoch: int, uv: bool = False) -> str:
    """One source's one layer: bind-mounted from the context, copied, installed, its times clamped.
    ``uv``: installed by the lock's uv (:func:`source_install`), else by the image's pip.
    No bytecode is written (``PYTHONDONTWRITEBYTECODE``): pip runs on the image's own (a cache mount
    would have to be keyed by everything below the step, and so start cold for every step after a moved
    pin: 1.4 s of compiling pip each); a ``__pycache__`` a build backend writes in the source anyway is
    removed (the source's own tree is walked, not every source's).
    ``clamp-mtimes`` then sets everything the step changed to the epoch, so the layer is the same."""
    if source.mode == "none":
        return f"{_heading(source, 'none', ': copied')}\nCOPY --from={copy_stage(source)} /out/ /"
    if source.mode not in ("editable", "wheel"):
        raise ValueError(f"unknown install mode {source.mode!r}")
    dest = source.image_path
    mounts = f"--mount=type=bind,source={source.context_path},target={MOUNT_POINT} --mount=type=tmpfs,target=/tmp"
    if uv:  # mounted after /tmp, below it: its mount point is made in the tmpfs
        mounts += f" --mount=type=bind,source={INSTALLER_DIR},target={INSTALLER_IN_STEP}"
    lines = [
        _heading(source, source.mode, " by uv" if uv else ""),
        f"RUN {mounts} \\",
        "    since=$(($(date +%s) - 1)) \\",
        f" && mkdir -p {dest} && cp -R --preserve=mode {MOUNT_POINT}/. {dest}/ \\",
        f" && {source_install(source, uv)} \\",
    ]
    cache = "" if uv else "rm -rf /root/.cache/pip && "
    lines.append(f" && {cache}find {dest} -xdev -depth -name __pycache__ -type d -exec rm -rf {{}} + \\")
    lines.append(f' && {CLAMP} {epoch} "$since"')
    return "\n".join(lines)


# uv as a source's build frontend: no config, no downloads, no index, no resolution, no cache (a cache
# would be in the step's /tmp anyway); its installer metadata (INSTALLER, REQUESTED, direct_url.json, which
# the in-image check reads to find the source's distribution) written as pip writes it, but for the one
# file that holds the clock, which `stage_packages.py unstamp` removes (run -I -S -B: -I ignores
# PYTHONDONTWRITEBYTECODE, and the site's .pth files would import an editable source's finder).
UV_SOURCE_ENV = "UV_NO_CONFIG=1 UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1"
UV_SOURCE_FLAGS = (
    "--offline --no-index --no-deps --no-build-isolation --no-cache --link-mode copy --break-system-packages"
)


def source_install(source: SourcePlan, uv: bool) -> str:
    """The command that builds and installs a source (``wheel``: its wheel built and installed by one
    command, a second pip costs 0.5 s; ``editable``: PEP 660), with the source's own environment, by the
    lock's uv (its step 0.25 s against pip's 0.73 s, measured in the test base) or the image's pip; the
    build backend runs in the image, without isolation, both ways."""
    editable = "-e " if source.mode == "editable" else ""
    env = "".join(f"{key}={shlex.quote(value)} " for key, value in source.env)
    if uv:
        return (
            f'{env}{UV_SOURCE_ENV} {INSTALLER_IN_STEP}/uv pip install --python "$(command -v python3)" '
            f"{UV_SOURCE_FLAGS} {editable}{source.image_path} \\\n"
            f" && python3 -I -S -B {INSTALLER_IN_STEP}/stage_packages.py unstamp"
        )
    return f"{env}{PIP} install --no-build-isolation --no-deps --no-index --no-compile {editable}{source.image_path}"


def _tools_stage(start: str, platform_check: str) -> str:
    """The throwaway stage that makes the tools layer (``images/tools-stage.in``), on ``start``: both
    the tools image and, for a lock with no packages, the image's Dockerfile begin with it."""
    return fill(load_template("tools-stage.in"), {"from": start, "platform_check": platform_check}).rstrip("\n")


def render_buildkit_image_dockerfile(plan: ContextPlan) -> str:
    """The last Dockerfile on BuildKit (``images/Dockerfile.buildkit.in``)."""
    packages = bool(plan.files)
    start = packages_reference(plan) if packages else base_reference(plan)
    return fill(
        load_template("Dockerfile.buildkit.in"),
        {
            "lock_name": plan.lock_name,
            "lock_sha256": plan.lock_sha256,
            "from": start,
            # the packages image has the tools layer, and its script checked the platform
            "tools_stage": "# the tools layer: in the packages image"
            if packages
            else _tools_stage(start, render_platform_check(plan)),
            "tools_copy": "" if packages else "COPY --from=envbuild-tools /out/ /",
            "mnt": MOUNT_POINT,
            "meta": IMAGE_META,
            "clamp": CLAMP,
            "epoch": str(plan.epoch),
            "start": START_STAGE,
            "copy_stages": "\n".join(render_copy_stage(s, plan.epoch) for s in plan.sources if s.mode == "none")
            or "# no copy-only sources: no stage of their own",
            "sources": "\n".join(
                render_buildkit_source(s, plan.epoch, plan.installer is not None) for s in plan.sources
            )
            or "# no sources in the lock",
            "labels": render_labels(plan),
        },
    )


def render_buildkit_packages_script(plan: ContextPlan) -> str:
    """The packages step's script on BuildKit (``images/packages.buildkit.sh.in``)."""
    values = {
        "mnt": MOUNT_POINT,
        "meta": IMAGE_META,
        "report": PACKAGES_REPORT,
        "clamp": CLAMP,
        "packages_epoch": str(PACKAGES_EPOCH),
        "platform_check": platform_check_shell(plan),
        "install": render_install(plan),
        "compile": render_compile(plan),
    }
    return fill(load_template("packages.buildkit.sh.in"), values)


def render_compile(plan: ContextPlan) -> str:
    """The bytecode of the build backends the sources' steps import (:attr:`.ContextPlan.compiled`), written
    once here: every source's step would otherwise compile them in memory (setuptools: 0.25 s a step)."""
    if not plan.compiled:
        return "# no locked package is a source's build requirement: no bytecode to compile"
    names = " ".join(shlex.quote(name) for name in plan.compiled)
    return f"PYTHONHASHSEED=0 python3 stage_packages.py compile requirements.txt {names}"


def render_install(plan: ContextPlan) -> str:
    """The install itself: the lock's uv (``images/install.uv.sh.in``) when it pins one, else the base's pip
    (``images/install.pip.sh.in``)."""
    if plan.installer is None:
        return load_template("install.pip.sh.in").rstrip("\n")
    return fill(load_template("install.uv.sh.in"), {"stage": UV_STAGE}).rstrip("\n")


def render_tools_dockerfile(plan: ContextPlan) -> str:
    """The tools image's Dockerfile (``images/Dockerfile.tools.in``): the base and the tools layer."""
    base = base_reference(plan)
    stage = _tools_stage(base, "# the platform: the packages script checks it before it installs anything")
    return fill(load_template("Dockerfile.tools.in"), {"lock_name": plan.lock_name, "base": base, "tools_stage": stage})


def render_packages_dockerfile(plan: ContextPlan) -> str:
    """The packages image's Dockerfile on BuildKit (``images/Dockerfile.packages.in``), on the tools image."""
    values = {
        "lock_name": plan.lock_name,
        "tools": tools_reference(plan),
        "mnt": MOUNT_POINT,
    }
    return fill(load_template("Dockerfile.packages.in"), values)
