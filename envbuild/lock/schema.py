"""The JSON schema of each lockfile version, generated from the one model and committed beside it.

Version 1's schema is the model without the fields version 2 introduced (``since=2``), so it stays the
schema version 1 always had; version 2's is the whole model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envbuild.data.typed import json_schema
from envbuild.lock.model import LOCK_VERSION, LOCK_VERSIONS, Lock

SCHEMA_PATHS = {version: Path(__file__).with_name(f"lock-v{version}.schema.json") for version in LOCK_VERSIONS}


def lock_schema(version: int = LOCK_VERSION) -> dict[str, Any]:
    return json_schema(
        Lock,
        title=f"envbuild lockfile, version {version}",
        schema_id=f"https://envbuild.dev/schema/lock-v{version}.json",
        version=version,
    )


def schema_text(version: int = LOCK_VERSION) -> str:
    return json.dumps(lock_schema(version), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":  # regenerate: python -m envbuild.lock.schema
    for number, path in SCHEMA_PATHS.items():
        path.write_text(schema_text(number), encoding="utf-8")
        print(f"wrote {path}")
