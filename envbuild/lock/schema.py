"""The JSON schema of lockfile version 1, generated from the model and committed beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envbuild.lock.model import LOCK_VERSION, Lock
from envbuild.lock.typed import json_schema

SCHEMA_PATH = Path(__file__).with_name(f"lock-v{LOCK_VERSION}.schema.json")


def lock_schema() -> dict[str, Any]:
    return json_schema(
        Lock,
        title=f"envbuild lockfile, version {LOCK_VERSION}",
        schema_id=f"https://envbuild.dev/schema/lock-v{LOCK_VERSION}.json",
    )


def schema_text() -> str:
    return json.dumps(lock_schema(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":  # regenerate: python -m envbuild.lock.schema
    SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
