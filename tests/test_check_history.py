"""The check history file and the check reports (JSON, Markdown, HTML grid)."""

from __future__ import annotations

import json
import multiprocessing
from html.parser import HTMLParser
from pathlib import Path

import pytest

from envbuild.check.history import (
    HistoryEntry,
    append_history,
    last_image_id,
    read_history,
)
from envbuild.check.report import (
    CheckReport,
    Difference,
    FileDifference,
    render_html,
    render_markdown,
)
from envbuild.errors import InputError
from envbuild.verify.results import PinResult, VerifyReport


def entry(
    n: int,
    *,
    lock: str = "l.yaml",
    sha: str = "a" * 64,
    image: str | None = None,
    pins: dict[str, str] | None = None,
    reproducible: bool | None = True,
) -> HistoryEntry:
    return HistoryEntry(
        time=f"2026-11-{n:02d}T02:00:00Z",
        lock=lock,
        lock_sha256=sha,
        ok=True,
        reproducible=reproducible,
        image_id=image,
        pins=pins or {"source:m": "ok"},
    )


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "h" / "history.jsonl"
    assert read_history(path) == []
    append_history(path, entry(1, image="sha256:1"))
    append_history(path, entry(2, image="sha256:2", sha="b" * 64))
    assert [e.image_id for e in read_history(path)] == ["sha256:1", "sha256:2"]
    assert last_image_id(read_history(path), "a" * 64) == "sha256:1"
    assert last_image_id(read_history(path), "c" * 64) is None


def test_interrupted_write_is_skipped_and_repaired(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    append_history(path, entry(1, image="sha256:1"))
    with open(path, "a") as out:
        out.write('{"time": "2026-11-02T0')  # a writer killed mid-line
    warnings: list[str] = []
    assert [e.image_id for e in read_history(path, warnings.append)] == ["sha256:1"]
    assert warnings and "incomplete last line" in warnings[0]
    append_history(path, entry(3, image="sha256:3"))
    assert [e.image_id for e in read_history(path, warnings.append)] == ["sha256:1", "sha256:3"]


def test_corrupt_history_is_a_clear_input_error(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text('not json\n{"time": 1}\n')
    with pytest.raises(InputError, match=r"history.jsonl:1: not valid JSON"):
        read_history(path)
    path.write_text('{"time": 1}\n')
    with pytest.raises(InputError, match=r"history.jsonl:1: not a history entry \(missing image_id"):
        read_history(path)


def _append_many(path: str, worker: int) -> None:
    for i in range(50):
        append_history(Path(path), entry(1 + i % 28, image=f"sha256:{worker}-{i}"))


def test_concurrent_appends_keep_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    procs = [multiprocessing.Process(target=_append_many, args=(str(path), w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert len(read_history(path)) == 150


def report(reproducible: bool = False) -> CheckReport:
    verify = VerifyReport(
        "l.yaml",
        (
            PinResult("source", "megatron-lm", "ok", "tag at ba7b5eb"),
            PinResult("source", "vllm", "behind", "head is 3 commits ahead | moved"),
        ),
    )
    diff = Difference(
        "layer 4",
        "sha256:aaa",
        "sha256:bbb",
        (
            FileDifference(
                "opt/envbuild/src/stamp/BUILD_TIME", "changed", ("content",), "offset 0: '2026-11-01' vs '2026-11-02'"
            ),
        ),
        omitted=2,
    )
    return CheckReport(
        verify, reproducible, ("sha256:1", "sha256:2"), () if reproducible else (diff,), compared_with="history"
    )


def test_check_json_shape() -> None:
    data = report().to_json()
    assert set(data) >= {"ok", "verify", "reproducible", "image_ids", "differences"}
    assert data["ok"] is False and data["verify"]["ok"] is True
    assert data["differences"][0]["files"][0]["path"].endswith("BUILD_TIME")
    assert report(reproducible=True).to_json()["ok"] is True
    json.dumps(data)


def test_markdown_names_the_differing_file_and_escapes_tables() -> None:
    text = render_markdown(report())
    assert "❌" in text and "did not reproduce" in text
    assert "`opt/envbuild/src/stamp/BUILD_TIME`" in text and "offset 0" in text and "2 more" in text
    assert "head is 3 commits ahead \\| moved" in text


class _Grid(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_html_grid_has_a_row_per_pin_and_a_column_per_night() -> None:
    history = [
        entry(1, pins={"source:m": "ok", "package:six": "ok"}),
        entry(2, pins={"source:m": "tag-moved", "package:six": "ok"}, reproducible=False),
        entry(3, lock="other.yaml", pins={"source:x": "ok"}),
        entry(4, pins={"source:m": "ok", "source:<script>": "behind"}, reproducible=None),
    ]
    page = render_html(history, "l.yaml")
    assert "<script>" not in page  # names are escaped
    grid = _Grid()
    grid.feed(page)
    header, *rows = grid.rows
    assert len(header) == 1 + 3  # pin column + three runs of l.yaml
    table = {row[0]: row[1:] for row in rows}
    assert table["source:m"] == ["ok", "tag-moved", "ok"]
    assert table["source:<script>"] == ["–", "–", "behind"]
    assert table["image"] == ["reproduced", "not reproduced", "not built"]
