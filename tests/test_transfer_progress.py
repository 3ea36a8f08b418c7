"""The lines a push or a pull says, from the engine's per-layer events (envbuild.engine.transfer).

The events are docker 20.10's own, as its push API streams them to a registry that answers every upload
with 500: one layer pushing, then failing, the engine counting down to each of its retries. Before, those
were dropped, and such a push said nothing for some 50 s before it failed. The real push, against the real
registry, is tests/test_image_build.py's; this is the rendering above it."""

from __future__ import annotations

from envbuild.engine.transfer import LayerProgress

FAILING_PUSH = [
    {"status": "The push refers to repository [127.0.0.1:5077/x]"},
    {"status": "Preparing", "progressDetail": {}, "id": "5f70bf18a086"},
    {"status": "Pushing", "progressDetail": {"current": 512, "total": 2048}, "id": "5f70bf18a086"},
    *(
        {"status": f"Retrying in {n} second{'s' if n > 1 else ''}", "progressDetail": {}, "id": "5f70bf18a086"}
        for n in range(5, 0, -1)
    ),  # fmt: skip
    {"status": "Pushing", "progressDetail": {"current": 512, "total": 2048}, "id": "5f70bf18a086"},
    *({"status": f"Retrying in {n} seconds", "progressDetail": {}, "id": "5f70bf18a086"} for n in range(10, 1, -1)),
]


def test_each_retry_of_a_layer_is_said_once_not_each_second() -> None:
    said: list[str] = []
    progress = LayerProgress(said.append, "push", "127.0.0.1:5077/x:1")
    for event in FAILING_PUSH:
        progress.event(event)
    assert said == [
        "push 127.0.0.1:5077/x:1: layer 5f70bf18a086 failed, the engine retrying in 5 seconds",
        "push 127.0.0.1:5077/x:1: layer 5f70bf18a086 failed, the engine retrying in 10 seconds",
    ]


def test_a_layer_that_went_after_a_retry_is_done() -> None:
    said: list[str] = []
    progress = LayerProgress(said.append, "push", "r/x:1")
    for event in [*FAILING_PUSH[1:4], {"status": "Pushed", "progressDetail": {}, "id": "5f70bf18a086"}]:
        progress.event(event)
    assert said[-1] == "push r/x:1: layer 5f70bf18a086 sent (2.05 kB), 1 of 1 done"
    assert progress.fetched() == (1, 2048)
