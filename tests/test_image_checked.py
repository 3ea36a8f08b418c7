"""envbuild.image.checked: which image a build keeps when it normalised beside the check with the parents of
the lock's last raw image. The engine's step and the normalising are stand-ins here, above their own
real tests (tests/test_engine_buildkit.py runs a step on the engine; tests/test_image_build.py builds,
checks and normalises real images, and compares the meta layer's parents with the raw image's)."""

from __future__ import annotations

import io
import json
import tarfile
from types import SimpleNamespace
from typing import Any

import pytest

from envbuild.engine.containers import RunOutput
from envbuild.image import checked
from envbuild.image import inimage_probe as probe
from envbuild.image.normalise import CanonicalImage


def header(path: str, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o755, 0, 0, mtime
    return info


def parents(mtime: int) -> dict[str, tarfile.TarInfo]:
    return {"/opt": header("/opt", 1), "/opt/envbuild": header("/opt/envbuild", mtime)}


def report_output(envbuild_mtime: int, exit_code: int = 0) -> RunOutput:
    out = io.StringIO()
    report = {"stat": {"/opt": [0o755, 0, 0, 1], "/opt/envbuild": [0o755, 0, 0, envbuild_mtime]}}
    probe.write_encoded(json.dumps(report), out)
    return RunOutput(exit_code, out.getvalue(), "boom\n" if exit_code else "")


class Engine:
    """What checked_and_normalised asks of the engine: one step, and the images it may remove."""

    def __init__(self, output: RunOutput) -> None:
        self.output, self.removed, self.tags = output, [], {}  # type: ignore[var-annotated]
        self.events: list[str] = []

    def run_step(
        self,
        image: str,
        command: list[str],
        files: dict[str, bytes],
        *,
        mount: str,
        started: Any = None,
        say: Any = None,
    ) -> RunOutput:
        self.events.append("step")
        if started is not None:
            started.set()
        return self.output

    def inspect(self, ref: str) -> dict[str, Any]:
        return {"Id": ref, "RepoTags": self.tags.get(ref, [])}

    def remove(self, ref: str, force: bool = False) -> int:
        self.removed.append(ref)
        return 1


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each normalising, by the mtime of /opt/envbuild it kept; its image is named by that mtime."""
    made: list[int] = []

    def normalise(engine: object, raw_id: str, base: str, epoch: int, say: object, added: tuple) -> CanonicalImage:
        with tarfile.open(fileobj=io.BytesIO(added[0].tar)) as layer:
            mtime = int(layer.getmember("opt/envbuild").mtime)
        made.append(mtime)
        return CanonicalImage(f"sha256:{mtime}", ())

    monkeypatch.setattr(checked, "normalise", normalise)
    monkeypatch.setattr(checked, "base_reference", lambda plan: "base")
    monkeypatch.setattr(checked, "compare_inimage", lambda report, manifest: [])
    return made


CONTEXT: Any = SimpleNamespace(plan=SimpleNamespace(epoch=5), manifest={})


def run(engine: Engine, predicted: dict[str, tarfile.TarInfo] | None) -> CanonicalImage:
    meta = {"manifest.json": b"{}"}
    done = checked.checked_and_normalised(
        engine,  # type: ignore[arg-type]
        "sha256:raw",
        "raw:tag",
        CONTEXT,
        meta,
        predicted,
        lambda _: None,
    )
    assert checked.parents_entry(done.parents) == {
        "/opt": [0o755, 0, 0, 1],
        "/opt/envbuild": [0o755, 0, 0, done_mtime(done)],
    }
    return done.image


def done_mtime(done: checked.Checked) -> int:
    return int(done.parents["/opt/envbuild"].mtime)


def test_the_last_build_s_parents_held_the_image_normalised_beside_the_check_is_kept(loads: list[int]) -> None:
    engine = Engine(report_output(envbuild_mtime=7))
    assert run(engine, parents(7)).image_id == "sha256:7"
    assert loads == [7] and engine.removed == []


def test_parents_that_moved_are_loaded_again_as_the_check_reports_them(loads: list[int]) -> None:
    """A lock without source_date_epoch moves its epoch with a moved pin: /opt/envbuild's mtime moves too."""
    engine = Engine(report_output(envbuild_mtime=9))
    assert run(engine, parents(7)).image_id == "sha256:9"
    assert loads == [7, 9] and engine.removed == ["sha256:7"]
    assert run(Engine(report_output(envbuild_mtime=9)), None).image_id == "sha256:9"  # no last build: after the check


def test_a_failed_check_keeps_no_normalised_image(loads: list[int]) -> None:
    engine = Engine(report_output(envbuild_mtime=7, exit_code=1))
    with pytest.raises(checked.InImageMismatch, match="the in-image check exited with status 1: boom"):
        run(engine, parents(7))
    assert engine.removed == ["sha256:7"]


def test_the_next_build_predicts_the_parents_the_check_reported(loads: list[int]) -> None:
    """What a build keeps of the reported parents (parents_entry) is what the next one predicts with."""
    engine = Engine(report_output(envbuild_mtime=7))
    first = checked.checked_and_normalised(engine, "sha256:raw", "raw:tag", CONTEXT, {}, None, lambda _: None)  # type: ignore[arg-type]
    kept = json.loads(json.dumps(checked.parents_entry(first.parents)))  # as the cache's map keeps it
    predicted = checked.last_parents(kept)
    assert predicted is not None and run(Engine(report_output(envbuild_mtime=7)), predicted).image_id == "sha256:7"
    assert loads == [7, 7]  # the second build normalised once, with the prediction


@pytest.mark.parametrize(
    "kept",
    [None, [], {}, {"/opt": [0o755, 0, 0, 1]}, {"/opt": "x", "/opt/envbuild": [1, 2, 3, 4]}, {"/opt": [-1, 0, 0, 1]}],
)
def test_a_kept_prediction_that_does_not_read_as_a_report_predicts_nothing(kept: object) -> None:
    assert checked.last_parents(kept) is None
