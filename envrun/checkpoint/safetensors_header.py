"""Read and strictly validate the header of a .safetensors file without touching tensor data.

Layout (safetensors spec): 8 bytes little-endian u64 ``n``, then ``n`` bytes of UTF-8 JSON mapping
tensor names to ``{"dtype", "shape", "data_offsets"}`` (plus an optional ``__metadata__`` of strings),
then the data section. Offsets are relative to the start of the data section.

Only ``8 + n`` bytes are read; the file size from ``fstat`` is enough to tell that the data section
is complete, so a truncated shard is caught without reading it.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from envbuild.errors import InputError

# The reference implementation refuses headers over 100 MB; a larger length field means a corrupt
# or hostile file, and reading it would cost memory for nothing.
MAX_HEADER_SIZE = 100_000_000

# Bits per element. Sub-byte float types exist since safetensors 0.6 (F4, F6_*), so sizes are in
# bits and a tensor's total must be a whole number of bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
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


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Parse and validate ``path``'s header; raise :class:`SafetensorsHeaderError` naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise SafetensorsHeaderError(path, f"cannot open: {exc.strerror or exc}") from exc
    try:
        if hasattr(os, "posix_fadvise"):
            # No readahead: past the header lie gigabytes of tensor data that the audit never
            # needs; the kernel would otherwise fetch the next few megabytes of every shard.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        file_size = os.fstat(fd).st_size
        if file_size < 8:
            raise SafetensorsHeaderError(path, f"truncated: {file_size} bytes, shorter than the 8-byte header length")
        (header_size,) = struct.unpack("<Q", _pread_exact(fd, 8, 0))
        if header_size == 0 or header_size > MAX_HEADER_SIZE:
            raise SafetensorsHeaderError(
                path, f"malformed header: length {header_size} is outside 1..{MAX_HEADER_SIZE}"
            )
        if 8 + header_size > file_size:
            raise SafetensorsHeaderError(
                path, f"truncated: header length {header_size} exceeds the {file_size - 8} bytes after it"
            )
        raw = _pread_exact(fd, header_size, 8)
    except OSError as exc:
        raise SafetensorsHeaderError(path, f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(raw) != header_size:  # the file shrank between fstat and read
        raise SafetensorsHeaderError(path, "truncated while reading the header")
    tensors, metadata = _parse_header(path, raw)
    _check_data_section(path, tensors, file_size - 8 - header_size)
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


def _parse_header(path: Path, raw: bytes) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text)
        if isinstance(doc, dict) and _may_hide_duplicates(raw, len(doc)):
            doc = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorsHeaderError(path, f"malformed header: not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise SafetensorsHeaderError(path, f"malformed header: a JSON {type(doc).__name__}, expected an object")
    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    problems: list[str] = []
    for name, entry in doc.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                problems.append("__metadata__ must map strings to strings")
            else:
                metadata = dict(entry)
            continue
        info = _parse_entry(entry)
        if isinstance(info, str):
            problems.append(f"tensor {name!r}: {info}")
        else:
            tensors[name] = info
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SafetensorsHeaderError(path, f"malformed header: {problems[0]}{more}")
    return tensors, metadata


def _may_hide_duplicates(raw: bytes, entries: int) -> bool:
    """json.loads keeps the last of duplicate keys silently. A duplicate tensor entry, or a duplicate key
    inside one, leaves more occurrences of an entry's keys in the text than there are entries: counting
    them (C speed) decides whether the slow, exact check (a Python hook per object) is needed at all."""
    return any(raw.count(key) > entries for key in (b'"dtype"', b'"shape"', b'"data_offsets"'))


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last duplicate silently; two entries for one tensor name is corruption.
    out = dict(pairs)
    if len(out) != len(pairs):  # cheap test first: this hook runs for every one of ~60k entries
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {dup!r}")
    return out


_NBYTES: dict[tuple[object, ...], int | str] = {}  # (dtype, *shape) -> byte size, or what is wrong


def _parse_entry(entry: object) -> TensorInfo | str:
    """Return the entry as TensorInfo, or a string saying what is wrong with it.

    A GLM-5 checkpoint repeats a few dozen (dtype, shape) pairs ~60k times: their byte sizes are
    worked out once each, and the fast path below only checks the offsets against them."""
    if type(entry) is dict and len(entry) == 3:
        try:
            dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        except KeyError:
            return _parse_entry_slowly(entry)
        # Only plain ints may key the cache: True == 1 and hashes alike, but is no dimension.
        if (
            type(dtype) is str
            and type(shape) is list
            and type(offsets) is list
            and len(offsets) == 2
            and set(map(type, shape)) <= {int}
        ):
            key = (dtype, *shape)
            nbytes = _NBYTES.get(key)
            if nbytes is None:
                nbytes = _NBYTES.setdefault(key, _size_or_problem(dtype, shape))
            begin, end = offsets
            if (
                type(nbytes) is int
                and type(begin) is int
                and type(end) is int
                and 0 <= begin <= end
                and end - begin == nbytes
            ):
                return TensorInfo(dtype, tuple(shape), (begin, end))
    return _parse_entry_slowly(entry)


def _size_or_problem(dtype: object, shape: list[object]) -> int | str:
    """The byte size of a tensor of ``dtype`` x ``shape``, or what is wrong with them."""
    # `type() is`, not isinstance: a bool is an int in Python, and true in a shape is malformed.
    bits = DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits is None:
        return f"unknown dtype {dtype!r}"
    for dim in shape:
        if not isinstance(dim, int) or type(dim) is not int or dim < 0:
            return f"shape {shape!r} is not a list of non-negative integers"
        bits *= dim
    if bits % 8:
        return f"{dtype} x {shape} is not a whole number of bytes"
    return bits // 8


def _parse_entry_slowly(entry: object) -> TensorInfo | str:
    """Every check, with the message that names the first problem."""
    if type(entry) is not dict:
        return "entry is not an object"
    absent = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if absent:
        return f"lacks {', '.join(absent)}"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if type(dtype) is not str or dtype not in DTYPE_BITS:
        return f"unknown dtype {dtype!r}"
    if type(shape) is not list:
        return f"shape {shape!r} is not a list of non-negative integers"
    nbytes = _size_or_problem(dtype, shape)
    if isinstance(nbytes, str):
        return nbytes
    if type(offsets) is not list or len(offsets) != 2 or not (_is_uint(offsets[0]) and _is_uint(offsets[1])):
        return f"data_offsets {offsets!r} is not [begin, end]"
    begin, end = offsets
    if end < begin:
        return f"data_offsets {offsets!r} end before begin"
    if end - begin != nbytes:
        return f"data_offsets {offsets!r} span {end - begin} bytes, {dtype} x {shape} needs {nbytes}"
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
            raise SafetensorsHeaderError(path, f"malformed header: tensor {name!r} {what}")
        cursor = end
    if cursor > data_size:
        raise SafetensorsHeaderError(
            path, f"truncated: the header needs {cursor} bytes of tensor data, the file holds {data_size}"
        )
    if cursor < data_size:
        raise SafetensorsHeaderError(
            path, f"malformed: {data_size - cursor} bytes after the last tensor that the header does not describe"
        )
