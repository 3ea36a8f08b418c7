"""Read and strictly validate the header of a .safetensors file without touching tensor data.

Layout (safetensors spec): 8 bytes little-endian u64 ``n``, then ``n`` bytes of UTF-8 JSON mapping
tensor names to ``{"dtype", "shape", "data_offsets"}`` (plus an optional ``__metadata__`` of strings),
then the data section. Offsets are relative to the start of the data section.

Only ``8 + n`` bytes are read; the file size from ``fstat`` is enough to tell that the data section
is complete, so a truncated shard is caught without reading it.

A header is hostile input: the file is opened only if it is a regular file (without blocking, see
:mod:`envrun.checkpoint.untrusted`); ``n`` is bounded by the format's 100 MB, by the file, and, when
the caller knows how many tensors the file should hold, by what they can plausibly need; the JSON is
bounded in depth and in objects per byte before it is parsed; and shapes are bounded in dimensions,
their sizes computed only until they pass what the data section holds.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

from envbuild.errors import InputError
from envrun.checkpoint.untrusted import JSONLimitError, brief, load_json, open_regular

# The reference implementation refuses headers over 100 MB; a larger length field means a corrupt
# or hostile file, and reading it would cost memory for nothing.
MAX_HEADER_SIZE = 100_000_000
# What a file that should hold k tensors may spend on its header: the GLM-5-sized shards of the
# benchmark spend ~110 bytes per tensor, and writers add a small __metadata__. Ten times that, so
# only an absurd header is refused.
HEADER_BYTES_PER_TENSOR = 1024
HEADER_SLACK = 64 * 1024
# The smallest entry, '"a":{"dtype":"U8","shape":[],"data_offsets":[0,0]},', is 51 bytes for three
# containers; JSON denser in objects and arrays than one per 16 bytes is no header, and parsing it
# would cost ~60 bytes of memory per 2 bytes of "[]".
HEADER_BYTES_PER_CONTAINER = 16
# numpy stops at 64 dimensions (32 before numpy 2).
MAX_DIMS = 64
# A key followed by whitespace before its colon: legal JSON, which the count of '":' would miss.
_SPACED_KEY = re.compile(rb'"[ \t\n\r]+:')

# Bits per element. Sub-byte float types exist since safetensors 0.6 (F4, F6_*), so sizes are in
# bits and a tensor's total must be a whole number of bytes; the FNUZ float8 types are read by 0.8.
DTYPE_BITS: dict[str, int] = {
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"), 8),
    **dict.fromkeys(("I16", "U16", "F16", "BF16"), 16),
    **dict.fromkeys(("I32", "U32", "F32"), 32),
    **dict.fromkeys(("I64", "U64", "F64", "C64"), 64),
    **{"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6},
}


class SafetensorsHeaderError(InputError):
    """A .safetensors file is truncated or its header is malformed: the file cannot be trusted."""

    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class TensorInfo(NamedTuple):
    """One tensor entry of a header: enough to know what is stored, never the data itself.

    A NamedTuple, not a frozen dataclass: a GLM-5 checkpoint has ~60k entries and the dataclass
    constructor was a measurable part of the audit's time.
    """

    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]


@dataclass(frozen=True)
class SafetensorsHeader:
    """The parsed header of one file, and how many bytes were read to get it."""

    path: Path
    header_size: int
    file_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    @property
    def bytes_read(self) -> int:
        return 8 + self.header_size


def read_safetensors_header(path: Path, expected_tensors: int | None = None) -> SafetensorsHeader:
    """Parse and validate ``path``'s header; raise :class:`SafetensorsHeaderError` naming the file.

    ``expected_tensors``: how many tensors the file should hold (what the index places in it); a
    header longer than those could need is refused before it is read."""

    def fail(message: str) -> SafetensorsHeaderError:
        return SafetensorsHeaderError(path, message)

    fd, _ = open_regular(path, fail)
    try:
        if hasattr(os, "posix_fadvise"):
            # No readahead: past the header lie gigabytes of tensor data that the audit never
            # needs; the kernel would otherwise fetch the next few megabytes of every shard.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        file_size = os.fstat(fd).st_size
        if file_size < 8:
            raise fail(f"truncated: {file_size} bytes, shorter than the 8-byte header length")
        (header_size,) = struct.unpack("<Q", _pread_exact(fd, 8, 0))
        if header_size == 0 or header_size > MAX_HEADER_SIZE:
            raise fail(f"malformed header: length {header_size} is outside 1..{MAX_HEADER_SIZE}")
        if 8 + header_size > file_size:
            raise fail(f"truncated: header length {header_size} exceeds the {file_size - 8} bytes after it")
        if expected_tensors is not None:
            plausible = HEADER_SLACK + HEADER_BYTES_PER_TENSOR * expected_tensors
            if header_size > plausible:
                raise fail(
                    f"header of {header_size:,} bytes, implausible for the {expected_tensors:,} tensors "
                    f"the index places in this file (at most {plausible:,})",
                )
        raw = _pread_exact(fd, header_size, 8)
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(raw) != header_size:  # the file shrank between fstat and read
        raise fail("truncated while reading the header")
    data_size = file_size - 8 - header_size
    tensors, metadata = _parse_header(path, raw, data_size)
    _check_data_section(path, tensors, data_size)
    return SafetensorsHeader(path, header_size, file_size, tensors, metadata)


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    """Read up to ``size`` bytes at ``offset``; shorter only if the file ends first."""
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _parse_header(path: Path, raw: bytes, data_size: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    try:
        doc = load_json(raw, max_containers=len(raw) // HEADER_BYTES_PER_CONTAINER + 3)
        if isinstance(doc, dict) and _may_hide_duplicates(raw, doc):
            doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except JSONLimitError as exc:
        raise SafetensorsHeaderError(path, f"malformed header: {exc}") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SafetensorsHeaderError(path, f"malformed header: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SafetensorsHeaderError(path, f"malformed header: a JSON {type(doc).__name__}, expected an object")
    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    problems: list[str] = []
    # A GLM-5 shard repeats a few dozen (dtype, shape) pairs hundreds of times: each size is worked
    # out once. Per header, not per process: a hostile header must not grow a cache that outlives it.
    sizes: dict[tuple[object, ...], int | str] = {}
    for name, entry in doc.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                problems.append("__metadata__ must map strings to strings")
            else:
                metadata = dict(entry)
            continue
        info = _parse_entry(entry, sizes, data_size)
        if isinstance(info, str):
            problems.append(f"tensor {brief(name)}: {info}")
        else:
            tensors[name] = info
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SafetensorsHeaderError(path, f"malformed header: {problems[0]}{more}")
    return tensors, metadata


def _may_hide_duplicates(raw: bytes, doc: dict[str, Any]) -> bool:
    """json.loads keeps the last of duplicate keys silently. Every key in the text ends in '":' (or in '"',
    whitespace, ':'), and a '"' inside a string is escaped, so the text holds at least as many '":' as it
    has keys: when it holds more than the parsed document has (the names, and the keys of each entry and
    of __metadata__), a duplicate may have been collapsed, and the slow, exact check (a Python hook per
    object) decides. Counting (C speed) keeps that check off every header without duplicates. Every key
    counts: keying the count on the entries' fields alone missed every duplicate in a header with
    __metadata__ (the key it adds made up for the one lost), that is, in every shard transformers writes."""
    if _SPACED_KEY.search(raw):
        return True
    keys = len(doc) + sum(len(entry) for entry in doc.values() if type(entry) is dict)
    return raw.count(b'":') > keys


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last duplicate silently; two entries for one tensor name is corruption.
    out = dict(pairs)
    if len(out) != len(pairs):  # cheap test first: this hook runs for every one of ~60k entries
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {brief(dup)}")
    return out


def _parse_entry(entry: object, sizes: dict[tuple[object, ...], int | str], data_size: int) -> TensorInfo | str:
    """Return the entry as TensorInfo, or a string saying what is wrong with it.

    ``sizes`` caches byte sizes by (dtype, *shape), so that the fast path below only checks the
    offsets against them."""
    if type(entry) is dict and len(entry) == 3:
        try:
            dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        except KeyError:
            return _parse_entry_slowly(entry, data_size)
        # Only plain ints may key the cache: True == 1 and hashes alike, but is no dimension.
        if (
            type(dtype) is str
            and type(shape) is list
            and type(offsets) is list
            and len(offsets) == 2
            and set(map(type, shape)) <= {int}
        ):
            key = (dtype, *shape)
            nbytes = sizes.get(key)
            if nbytes is None:
                nbytes = sizes[key] = _size_or_problem(dtype, shape, data_size)
            begin, end = offsets
            if (
                type(nbytes) is int
                and type(begin) is int
                and type(end) is int
                and 0 <= begin <= end
                and end - begin == nbytes
            ):
                return TensorInfo(dtype, tuple(shape), (begin, end))
    return _parse_entry_slowly(entry, data_size)


def _size_or_problem(dtype: object, shape: list[object], data_size: int) -> int | str:
    """The byte size of a tensor of ``dtype`` x ``shape``, or what is wrong with them."""
    # `type() is`, not isinstance: a bool is an int in Python, and true in a shape is malformed.
    bits = DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits is None:
        return f"unknown dtype {brief(dtype)}"
    if len(shape) > MAX_DIMS:
        return f"shape has {len(shape)} dimensions, more than {MAX_DIMS}"
    if not all(type(dim) is int and dim >= 0 for dim in shape):
        return f"shape {brief(shape)} is not a list of non-negative integers"
    dims = cast("list[int]", shape)  # just checked
    if any(dim >> 64 for dim in dims):
        # The reference reads dimensions as 64-bit integers; JSON allows 4,300 digits.
        return f"shape {brief(shape)} has a dimension of 2**64 or more"
    if 0 in dims:
        return 0
    # Stop multiplying once the product passes what the data section holds: 64 dimensions of 2**63
    # would otherwise make a number of 1,200 digits. Not before 2**64 bits, so that sizes below that
    # stay exact for the offsets message ("span 4 bytes, F32 x [2] needs 8").
    limit = max(8 * data_size, 1 << 64)
    for dim in dims:
        bits *= dim
        if bits > limit:
            return f"{dtype} x {brief(shape)} needs more than the {data_size:,} bytes the data section holds"
    if bits % 8:
        return f"{dtype} x {brief(shape)} is not a whole number of bytes"
    return bits // 8


def _parse_entry_slowly(entry: object, data_size: int) -> TensorInfo | str:
    """Every check, with the message that names the first problem."""
    if type(entry) is not dict:
        return "entry is not an object"
    absent = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if absent:
        return f"lacks {', '.join(absent)}"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if type(dtype) is not str or dtype not in DTYPE_BITS:
        return f"unknown dtype {brief(dtype)}"
    if type(shape) is not list:
        return f"shape {brief(shape)} is not a list of non-negative integers"
    nbytes = _size_or_problem(dtype, shape, data_size)
    if isinstance(nbytes, str):
        return nbytes
    if type(offsets) is not list or len(offsets) != 2 or not (_is_uint(offsets[0]) and _is_uint(offsets[1])):
        return f"data_offsets {brief(offsets)} is not [begin, end]"
    begin, end = offsets
    if end < begin:
        return f"data_offsets {brief(offsets)} end before begin"
    if end - begin != nbytes:
        return f"data_offsets {brief(offsets)} span {brief(end - begin)} bytes, {dtype} x {brief(shape)} needs {nbytes}"
    return TensorInfo(dtype, tuple(shape), (begin, end))


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and type(value) is int and value >= 0


def _check_data_section(path: Path, tensors: dict[str, TensorInfo], data_size: int) -> None:
    # Like the reference loader: tensors must tile the data section exactly, with no gap or
    # overlap, so a shorter file is truncated and a longer one is not what its header says.
    cursor = 0
    for name, info in sorted(tensors.items(), key=lambda kv: kv[1].data_offsets):
        begin, end = info.data_offsets
        if begin != cursor:
            what = "overlaps the previous tensor" if begin < cursor else f"leaves a gap at byte {cursor}"
            raise SafetensorsHeaderError(path, f"malformed header: tensor {brief(name)} {what}")
        cursor = end
    if cursor > data_size:
        raise SafetensorsHeaderError(
            path, f"truncated: the header needs {cursor} bytes of tensor data, the file holds {data_size}"
        )
    if cursor < data_size:
        raise SafetensorsHeaderError(
            path, f"malformed: {data_size - cursor} bytes after the last tensor that the header does not describe"
        )
