"""A line of `envbuild check`'s history (``history.jsonl``) that reads back, and lines that differ from it
by the fields a test names: for the tests of hostile and damaged history files."""

from __future__ import annotations

import json

GOOD = {
    "time": "2026-11-01T02:00:00Z",
    "lock": "m.lock.yaml",
    "lock_sha256": "a" * 64,
    "ok": True,
    "reproducible": True,
    "image_id": "sha256:" + "1" * 64,
    "pins": {"source:lib": "ok"},
}


def line(**changes: object) -> str:
    """:data:`GOOD` with ``changes``, as one line of the file."""
    return json.dumps({**GOOD, **changes}) + "\n"
