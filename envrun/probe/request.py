"""What the job probe is asked: the run's own config name, overrides and entry module (a leaf: the run
plan carries one, and the probe's runners turn it into a command line)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.data.jsonout import to_jsonable

SOURCE_FILE = Path(__file__).with_name("job_script.py")


@dataclass(frozen=True)
class ProbeRequest:
    """What the probe composes and imports: the run's own config name and overrides."""

    config_name: str
    overrides: tuple[str, ...]
    entry_module: str
    skip_imports: Mapping[str, str] = field(default_factory=dict)  # module -> the recipe's reason

    def argv(self, python: str) -> list[str]:
        """The command that runs the probe with ``python`` (the script travels as ``-c``: nothing of
        envrun needs to be where it runs)."""
        return [python, "-c", SOURCE_FILE.read_text(encoding="utf-8"), json.dumps(to_jsonable(self), sort_keys=True)]
