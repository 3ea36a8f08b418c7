"""User configuration: ``$ENVBUILD_CONFIG`` or ``~/.config/envbuild/config.yaml``.

```yaml
cache_dir: /var/cache/envbuild           # default ~/.cache/envbuild; $ENVBUILD_CACHE wins over it
mirrors:                                 # like git's url.<base>.insteadOf
  https://github.com/: https://git.internal.example/github/
```

Read like a lockfile: the same YAML reader (a regular file only, so a FIFO named by ``--config`` or
``$ENVBUILD_CONFIG`` is refused, never waited on; size cap, UTF-8, no anchors or aliases) and the same
strict decoder, so every problem is reported at once as ``FILE:LINE: FIELD: message`` and exits 2.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from envbuild.data.decode import decode_yaml
from envbuild.data.typed import mfield, shown
from envbuild.data.yamlfile import read_capped
from envbuild.errors import DataFileError, Problem
from envbuild.git.mirrors import Mirrors, check_rule


class ConfigError(DataFileError):
    """The config file failed validation: every problem, each with its file and line (exit 2)."""


@dataclass(frozen=True)
class Config:
    cache_dir: Path
    mirrors: Mirrors


@dataclass(frozen=True)
class SourceOptions:
    """Where every stage that reads pins finds them: the cache, the mirrors, whether the network may be
    used, and how many fetches run at once (`--cache-dir`, `--mirror`, `--offline`, `--jobs`). Verify,
    fetch, image and check each take it whole, inside their own options."""

    cache_dir: Path
    mirrors: Mirrors = field(default_factory=Mirrors)
    offline: bool = False
    jobs: int = 8

    def lock_command(self, *words: str | os.PathLike[str]) -> str:
        """``envbuild lock WORDS`` with this cache and these mirrors, quoted so that it runs as printed: the
        advice a refusal gives (`lock fetch` fills exactly this cache, `lock update --base` pins a base, …)."""
        argv = ["envbuild", "lock", *map(str, words), "--cache-dir", str(self.cache_dir)]
        for rule, target in self.mirrors.rules:
            argv += ["--mirror", f"{rule}={target}"]
        return shlex.join(argv)


def cache_dir_problem(value: str) -> str | None:
    """Why a cache directory as written is refused (the file's ``cache_dir``, ``--cache-dir``), or None: an empty
    one would be the working directory, filled with the cache's folders."""
    if not value or any(not c.isprintable() for c in value):
        return f"{shown(value)} is empty or contains control characters; give a directory path"
    return None


@dataclass(frozen=True)
class ConfigFile:
    """The config file as written."""

    cache_dir: str | None = mfield(None, check=cache_dir_problem, description="cache of repositories and files")
    mirrors: dict[str, str] = field(default_factory=dict)


def _default(variable: str, xdg: str, home: str, *tail: str) -> Path:
    """``$variable``, else ``tail`` under ``$xdg`` (default ``~/home``)."""
    if env := os.environ.get(variable):
        return Path(env)
    return Path(os.environ.get(xdg) or Path.home() / home, *tail)


def load_config(path: Path | None = None) -> Config:
    """The config in force. A file named by ``--config`` or ``$ENVBUILD_CONFIG`` must exist (a typo must
    not silently drop its mirrors); the default one may be absent, but not a symlink to nothing. The cache directory: ``$ENVBUILD_CACHE``
    over the file's ``cache_dir`` over the default, as pip and uv let the environment win over their files
    (a command line's ``--cache-dir`` wins over all three, in the command)."""
    from_env = path is None and bool(os.environ.get("ENVBUILD_CONFIG"))
    named = path is not None or from_env
    path = path or _default("ENVBUILD_CONFIG", "XDG_CONFIG_HOME", ".config", "envbuild", "config.yaml")
    # A default that is a symlink to nothing (a share not mounted) or a loop is there and unreadable: said, not
    # taken as absent, which would drop its mirrors without a word.
    present = named or os.path.lexists(path)
    try:
        parsed = parse_config(read_capped(path, ConfigError), str(path)) if present else ConfigFile()
    except ConfigError as exc:
        if not from_env:
            raise
        # a file it cannot read, named in a profile long ago: the line says where the name came from
        named_by = " (the file $ENVBUILD_CONFIG names)"
        raise ConfigError(
            [replace(p, message=p.message + named_by) if not p.line else p for p in exc.problems]
        ) from None
    cache_dir = Path(parsed.cache_dir).expanduser() if parsed.cache_dir else None
    if cache_dir is None or os.environ.get("ENVBUILD_CACHE"):
        cache_dir = _default("ENVBUILD_CACHE", "XDG_CACHE_HOME", ".cache", "envbuild")
    return Config(cache_dir=cache_dir, mirrors=Mirrors(tuple(parsed.mirrors.items())))


def parse_config(data: bytes | str, file: str = "<config>") -> ConfigFile:
    mirror_problems = lambda parsed, root: _mirror_problems(root, file)  # noqa: E731
    return decode_yaml(data, file, ConfigFile, ConfigError, default=ConfigFile(), checks=mirror_problems)


def _mirror_problems(root: yaml.Node, file: str) -> list[Problem]:
    """Each mirror rule checked on its own line (the decoder has checked the shape already)."""
    if not isinstance(root, yaml.MappingNode):
        return []
    problems = []
    for key, value in root.value:
        if key.value != "mirrors" or not isinstance(value, yaml.MappingNode):
            continue
        for source, target in value.value:
            if (
                isinstance(source, yaml.ScalarNode)
                and isinstance(target, yaml.ScalarNode)
                and (problem := check_rule(source.value, target.value)) is not None
            ):
                problems.append(Problem(file, source.start_mark.line + 1, "mirrors", problem))
    return problems
