"""A preflight check's line: its name, its verdict and why. The one type every check reports in, here
(:mod:`envrun.preflight`), in the job probe's verdict and on a cluster's nodes; the plan records them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from envbuild.data.jsonout import jfield

PreflightStatus = Literal["ok", "fail", "skip"]


@dataclass(frozen=True)
class PreflightLine:
    """One line of the preflight report: a check's name, its verdict and why."""

    name: str
    status: PreflightStatus
    detail: str
    # What the check was told (a node's own answer), for the record.
    facts: Mapping[str, Any] | None = jfield(None, omit="none")
