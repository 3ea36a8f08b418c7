"""User configuration: ``$ENVBUILD_CONFIG`` or ``~/.config/envbuild/config.yaml``.

```yaml
cache_dir: /var/cache/envbuild           # default ~/.cache/envbuild (or $ENVBUILD_CACHE)
mirrors:                                 # like git's url.<base>.insteadOf
  https://github.com/: https://git.internal.example/github/
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from envbuild.errors import InputError
from envbuild.mirrors import Mirrors


@dataclass(frozen=True)
class Config:
    cache_dir: Path
    mirrors: Mirrors


def default_config_path() -> Path:
    if env := os.environ.get("ENVBUILD_CONFIG"):
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "envbuild" / "config.yaml"


def default_cache_dir() -> Path:
    if env := os.environ.get("ENVBUILD_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "envbuild"


def load_config(path: Path | None = None) -> Config:
    path = path or default_config_path()
    data: object = {}
    if path.exists():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise InputError(f"{path}: cannot read config: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level")
    unknown = set(data) - {"cache_dir", "mirrors"}
    if unknown:
        raise InputError(f"{path}: {sorted(unknown)[0]}: unknown key (known keys: cache_dir, mirrors)")
    mirrors = data.get("mirrors") or {}
    if not isinstance(mirrors, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mirrors.items()):
        raise InputError(f"{path}: mirrors: expected a mapping of URL prefix to URL prefix")
    cache = data.get("cache_dir")
    if cache is not None and not isinstance(cache, str):
        raise InputError(f"{path}: cache_dir: expected a string")
    return Config(
        cache_dir=Path(cache).expanduser() if cache else default_cache_dir(),
        mirrors=Mirrors(tuple(mirrors.items())),
    )
