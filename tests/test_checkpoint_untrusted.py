"""envrun.checkpoint.untrusted: which files may be opened, how much is read, what JSON may cost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envrun.checkpoint.untrusted import JSONLimitError, brief, load_json, locate, read_limited


def fail(message: str) -> InputError:
    return InputError(message)


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


# --- load_json ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        nested(64),
        '{"a":' * 63 + "{}" + "}" * 63,
        '{"a": [' + ",".join(["[[1]]"] * 1000) + "]}",  # wide, not deep: 3,002 brackets, depth 4
        '{"template": "' + "{%" * 1000 + "[[[" * 100 + '"}',  # brackets in strings are no structure
        '{"a": "\\"' + "[" * 100 + '", "b": "\\\\"}',  # escaped quotes, escaped backslash before a quote
    ],
)
def test_json_within_the_limits_is_parsed_as_json_loads_would(text: str) -> None:
    assert load_json(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        nested(65),
        nested(100_000),
        '{"a":' * 64 + "{}" + "}" * 64,
        "[" + "[1,[1," * 40 + "]]" * 40 + "]",  # never two brackets in a row in the text
        '{"a": "\\\\", "b": ' + nested(65) + "}",  # the quote after an escaped backslash closes its string
        "[" * 100_000,  # unclosed
    ],
)
def test_json_nested_deeper_than_the_limit_is_refused(text: str) -> None:
    with pytest.raises(JSONLimitError, match="JSON nested deeper than 64 levels"):
        load_json(text.encode())


def test_objects_and_arrays_are_counted_outside_strings_only() -> None:
    text = '{"a": [[], {}, []], "b": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}'
    assert load_json(text.encode(), max_containers=5) == json.loads(text)
    with pytest.raises(JSONLimitError, match="5 JSON objects and arrays, more than the 4 allowed"):
        load_json(text.encode(), max_containers=4)


def test_a_recursion_error_is_unreadable_json_not_a_traceback() -> None:
    # With a limit above the interpreter's, json.loads itself gives up: that is still a ValueError.
    # 5,000 levels are past the recursion limit (1,000) and cost the depth scan 0.1 s; 50,000 cost 12 s.
    with pytest.raises(JSONLimitError, match="nested deeper than 100000 levels"):
        load_json(nested(5_000).encode(), max_depth=100_000)


@pytest.mark.parametrize("raw", [b"\xff{}", b"{", b"]]]]", b'{"a": 1' + b"0" * 5000 + b"}"])
def test_other_unreadable_json_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        load_json(raw)


def test_brief_keeps_messages_short() -> None:
    assert brief("a" * 10**6).startswith("'aaa") and len(brief("a" * 10**6)) < 80
    assert len(brief(list(range(10**6)))) < 80
    deep: list[object] = []
    for _ in range(10_000):
        deep = [deep]
    assert brief(deep) == "[[[...]]]"  # reprlib stops at a depth; repr() would recurse 10,000 times
    assert brief(True) == "True" and brief("F32") == "'F32'"


# --- locate and read_limited --------------------------------------------------------------------


def test_locate_admits_regular_files_and_links_inside(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "real.json").write_text("{}")
    (tmp_path / "plain.json").write_text("{}")
    (tmp_path / "link.json").symlink_to("sub/real.json")
    (tmp_path / "dangling.json").symlink_to("gone.json")
    assert locate(tmp_path, "plain.json", fail) == tmp_path / "plain.json"
    assert locate(tmp_path, "link.json", fail) == tmp_path / "link.json"
    assert locate(tmp_path, "absent.json", fail) is None
    assert locate(tmp_path, "dangling.json", fail) is None


def test_locate_refuses_what_is_not_a_regular_file_inside(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "outside.json").write_text("{}")
    (model / "out.json").symlink_to("../outside.json")
    (model / "dir.json").mkdir()
    os.mkfifo(model / "fifo.json")
    (model / "to-fifo.json").symlink_to("fifo.json")
    (model / "zero.json").symlink_to("/dev/zero")
    (model / "self").symlink_to(".")  # a link to the directory itself is inside but no file
    expected = {
        "out.json": "outside the model directory",
        "zero.json": "a symlink to /dev/zero, outside the model directory",
        "dir.json": "a directory, not a regular file",
        "fifo.json": "a FIFO, not a regular file",
        "to-fifo.json": "a FIFO, not a regular file",
        "self": "a directory, not a regular file",
    }
    for name, message in expected.items():
        with pytest.raises(InputError, match=message):
            locate(model, name, fail)


def test_read_limited_reads_up_to_the_limit_and_refuses_beyond_unread(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * (2 << 20))
    assert read_limited(path, 2 << 20, "a test file", fail) == b"x" * (2 << 20)
    with pytest.raises(InputError, match="2,097,152 bytes, over the 1 MiB limit for a test file"):
        read_limited(path, 1 << 20, "a test file", fail)
