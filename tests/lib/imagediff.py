"""What differs between a saved reference image and another build of it, said the way ``envbuild
check`` says it: for a reproducibility assertion's message, so that a mismatch names its files."""

from __future__ import annotations

import json
from pathlib import Path

from envbuild.check.explain import explain
from envbuild.data.jsonout import to_jsonable
from envbuild.engine.client import Engine
from envbuild.image.normalise import save_added_layers
from envbuild.progress import silent


def why_different(reference_archive: Path, engine: Engine, image_id: str, base: str, work: Path) -> str:
    """``image_id`` saved from ``engine`` without the layers of ``base`` (as the reference archive was
    saved) and explained against ``reference_archive``; JSON, one difference per line."""
    work.mkdir(parents=True, exist_ok=True)
    skip = set(engine.inspect(base)["RootFS"]["Layers"])  # type: ignore[index]
    other = save_added_layers(engine, image_id, work / f"{image_id.removeprefix('sha256:')[:12]}.tar", skip, silent)
    return "\n".join(json.dumps(to_jsonable(d)) for d in explain(reference_archive, other))
