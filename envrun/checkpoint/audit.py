"""Audit a Hugging Face checkpoint directory from config.json and safetensors headers only.

Why: verl saves HF weights with ``checkpoint.strict=False`` because the MTP layers are absent from
the trained model, and that leniency would equally let a lost ``lm_head`` or expert shard pass
(upstream-facts §4). The audit is the check that only the MTP layers are missing. It never reads
tensor data, so it costs a few megabytes of headers even for a checkpoint of a terabyte.

The checkpoint is hostile input (a hub download, an export of a job someone else configured), and the
order of work keeps every cost bounded by what was read: config.json and the index are read within
their size limits and opened only as regular files inside the model directory
(:mod:`envrun.checkpoint.untrusted`); what config.json declares is checked against how many tensors
the index (or the single file) holds before any expected name is generated; each shard's header is
bounded by what the index places in it. Everything refused is an :class:`InputError` naming the file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.errors import InputError
from envrun.checkpoint.layout import (
    ModelConfigError,
    ModelLayout,
    derive_expectation,
    implausible_counts,
    load_layout,
    split_layer_name,
)
from envrun.checkpoint.safetensors_header import SafetensorsHeaderError, read_safetensors_header
from envrun.checkpoint.untrusted import JSONLimitError, MiB, brief, load_json, locate, read_limited

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# The GLM-5-sized index of benchmarks/bench_audit.py is 5.4 MB (59,870 tensors); an FP8 export with a
# scale per weight, of a model with more experts, is several times that. JSON objects in an index:
# the document, metadata, weight_map.
MAX_INDEX_BYTES = 64 * MiB
MAX_INDEX_CONTAINERS = 10_000
# Every file named is looked up, and the missing ones listed; the benchmark's GLM-5-sized checkpoint
# has 100 shard files, and 10,000 shards of 10 GB would be 100 TB.
MAX_SHARD_FILES = 10_000
_NAME_MAX = 255  # bytes in a file name (Linux NAME_MAX)


class CheckpointIndexError(InputError):
    """model.safetensors.index.json is not JSON or does not map tensor names to shard file names."""


@dataclass(frozen=True)
class AuditReport:
    """The outcome of :func:`audit_checkpoint`; ``ok`` is the only field a caller must look at."""

    ok: bool
    missing: tuple[str, ...]  # lost tensors outside the MTP layers
    unexpected: tuple[str, ...]  # tensors no loader asks for, or that the index does not place
    mtp_layers: tuple[int, ...]
    mtp_present: bool  # every tensor of every MTP layer is there
    mtp_missing: tuple[str, ...]  # tolerated: a lenient export drops the MTP layers
    shards_missing: tuple[str, ...]  # files the index names that do not exist
    shards_unindexed: tuple[str, ...]  # *.safetensors files in the directory no loader will open
    shards: tuple[str, ...]  # files whose headers were read
    layout: ModelLayout
    tensors: int  # tensors found where the index says they are
    bytes_read: int  # config + index + headers; tensor data is never read

    def to_json(self) -> dict[str, Any]:
        """The JSON document of issue 4 §4, with extra keys after the four that are promised."""
        return {
            "ok": self.ok,
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "mtp": {"layers": list(self.mtp_layers), "present": self.mtp_present},
            "mtp_missing": list(self.mtp_missing),
            "shards_missing": list(self.shards_missing),
            "shards_unindexed": list(self.shards_unindexed),
            "shards": len(self.shards),
            "tensors": self.tensors,
            "num_hidden_layers": self.layout.num_hidden_layers,
            "first_k_dense_replace": self.layout.first_k_dense_replace,
            "n_routed_experts": self.layout.n_routed_experts,
            "tie_word_embeddings": self.layout.tie_word_embeddings,
        }


def audit_checkpoint(model_dir: Path) -> AuditReport:
    """Audit ``model_dir``. Raises :class:`InputError` (exit 2) for input that cannot be read at all."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: not a directory; pass the model directory holding config.json")
    # When config.json is absent, load_layout says so in its own words.
    config_path = _locate(model_dir, "config.json", _config_error) or model_dir / "config.json"
    layout = load_layout(config_path)
    bytes_read = config_path.stat().st_size

    # transformers tries the single file before the index, so an audit must look where it looks.
    # Anything by either name that is not a regular file is refused, not skipped: a loader's
    # isfile() would skip a FIFO named model.safetensors, but a checkpoint holding one is hostile.
    held: dict[str, frozenset[str]] = {}
    shards_missing: list[str] = []
    single = _locate(model_dir, SINGLE_FILE, _header_error)
    index_path = None if single else _locate(model_dir, INDEX_FILE, _index_error)
    if single is not None:
        weight_map = None
        shard_names = [SINGLE_FILE]
        header = read_safetensors_header(single)
        _check_counts(layout, config_path, len(header.tensors), single)
        held[SINGLE_FILE] = frozenset(header.tensors)
        bytes_read += header.bytes_read
    elif index_path is not None:
        weight_map, placed, index_bytes = _read_index(index_path)
        bytes_read += index_bytes
        _check_counts(layout, config_path, len(weight_map), index_path)
        shard_names = sorted(placed)
        for shard in shard_names:
            path = _locate(model_dir, shard, _header_error)
            if path is None:
                shards_missing.append(shard)
                continue
            header = read_safetensors_header(path, expected_tensors=placed[shard])
            held[shard] = frozenset(header.tensors)
            bytes_read += header.bytes_read
    else:
        raise InputError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE}; not a safetensors checkpoint")

    if weight_map is None:
        present = set(held[SINGLE_FILE])
        misplaced: set[str] = set()
        unindexed: set[str] = set()
    else:
        # A tensor counts only where the index places it: that is the only place a loader looks.
        present = {name for name, shard in weight_map.items() if name in held.get(shard, ())}
        misplaced = set(weight_map) - present
        unindexed = {name for shard, names in held.items() for name in names if weight_map.get(name) != shard}

    expect = derive_expectation(layout, present)
    mtp = set(layout.mtp_layers)
    lost = (expect.required | expect.mtp_required | misplaced) - present
    # MTP tensors are tolerated however they went missing, even ones the index still lists: the
    # loaders skip MTP keys, and a lenient save may keep an index entry for a tensor it dropped.
    lost_mtp = {name for name in lost if _layer_of(name) in mtp}
    missing = lost - lost_mtp
    unexpected = (present - expect.required - expect.mtp_required - expect.allowed) | unindexed

    return AuditReport(
        ok=not missing and not unexpected and not shards_missing,
        missing=natural_sorted(missing),
        unexpected=natural_sorted(unexpected),
        mtp_layers=layout.mtp_layers,
        # With no MTP layers declared there is nothing to be present; false keeps "present" meaning
        # "the run can train MTP" rather than "nothing is lost".
        mtp_present=bool(mtp) and not lost_mtp,
        mtp_missing=natural_sorted(lost_mtp),
        shards_missing=tuple(shards_missing),
        shards_unindexed=_unindexed_files(model_dir, set(shard_names)),
        shards=tuple(sorted(held)),
        layout=layout,
        tensors=len(present),
        bytes_read=bytes_read,
    )


def _locate(model_dir: Path, name: str, error: Callable[[Path, str], InputError]) -> Path | None:
    return locate(model_dir, name, lambda message: error(model_dir / name, message))


def _config_error(path: Path, message: str) -> InputError:
    return ModelConfigError(f"{path}: {message}")


def _header_error(path: Path, message: str) -> InputError:
    return SafetensorsHeaderError(path, message)


def _index_error(path: Path, message: str) -> InputError:
    return CheckpointIndexError(f"{path}: {message}")


def _check_counts(layout: ModelLayout, config_path: Path, held: int, source: Path) -> None:
    # Before derive_expectation builds a name: a 100-byte config.json can declare a billion layers.
    problem = implausible_counts(layout, held)
    if problem:
        raise ModelConfigError(f"{config_path}: {problem}; {source} holds {held:,} tensors")


def _read_index(path: Path) -> tuple[dict[str, str], Counter[str], int]:
    """weight_map of the index at ``path``, how many tensors it places in each file, the bytes read."""

    def fail(message: str) -> InputError:
        return _index_error(path, message)

    raw = read_limited(path, MAX_INDEX_BYTES, "an index", fail)
    try:
        doc = load_json(raw, max_containers=MAX_INDEX_CONTAINERS)
    except JSONLimitError as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise fail(f"not readable JSON ({exc})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise fail("weight_map must be a non-empty object of tensor name -> shard file")
    if set(map(type, weight_map.values())) != {str}:
        name = min(name for name, shard in weight_map.items() if type(shard) is not str)
        raise fail(f"weight_map[{brief(name)}] is {brief(weight_map[name])}, not a shard file name")
    shards = Counter(weight_map.values())
    bad = sorted(shard for shard in shards if not _is_shard_file_name(shard))
    if bad:
        # A path with a separator could point the audit (and a loader) outside the model directory.
        raise fail(f"weight_map names {brief(bad[0])}, not a .safetensors file name in this directory")
    if len(shards) > MAX_SHARD_FILES:
        raise fail(f"weight_map names {len(shards):,} shard files, more than the {MAX_SHARD_FILES:,} an audit reads")
    return weight_map, shards, len(raw)


def _is_shard_file_name(name: str) -> bool:
    # Printable: the name is printed in the report, and a control character in it could rewrite the
    # terminal; NUL would not even reach open(). Short: a longer name is no file on Linux.
    return (
        name.endswith(".safetensors")
        and "/" not in name
        and "\\" not in name
        and name.isprintable()
        and len(name.encode("utf-8", "surrogatepass")) <= _NAME_MAX
    )


def _unindexed_files(model_dir: Path, named: set[str]) -> tuple[str, ...]:
    # Reported, not failed: a stale shard left from an earlier save is ignored by every loader,
    # but a person looking at the directory should know it is not part of the checkpoint.
    return tuple(sorted(p.name for p in model_dir.glob("*.safetensors") if p.name not in named))


def _layer_of(name: str) -> int | None:
    split = split_layer_name(name)
    return split[0] if split else None


_DIGITS = re.compile(r"([0-9]+)")
# "05" folded into a range would print as "5", a different name; only canonical numbers fold, and
# only numbers of a sane length: a tensor name may carry a number of 5,000 digits, which int() refuses.
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,17}")
# Real names carry two numbers (layer, expert) in eight parts; sorting and folding look no further,
# so that a name of 20,000 numbers costs no more than one of eight.
_MAX_SORTED_NUMBERS = 8
_MAX_FOLDED_NUMBERS = 4
_MAX_FOLDED_PARTS = 32
_MAX_SHOWN_NAME = 300
_MAX_INT_DIGITS = 4000
_HUGE_NUMBER = 10**_MAX_INT_DIGITS


def _natural_key(name: str) -> tuple[Any, ...]:
    # split() with a group alternates text and number, so position i has the same type in every key.
    # int() refuses more than 4300 digits: longer numbers (no layer has them) sort after all others,
    # by length; the name itself breaks every tie, "05" against "5" included, so the order is total.
    parts: list[Any] = _DIGITS.split(name, maxsplit=_MAX_SORTED_NUMBERS)
    for i in range(1, len(parts), 2):
        digits = len(parts[i])
        parts[i] = int(parts[i]) if digits < _MAX_INT_DIGITS else _HUGE_NUMBER + digits
    return tuple(parts), name


def natural_sorted(names: Iterable[str]) -> tuple[str, ...]:
    """Sort so that layer 10 follows layer 9: deterministic and readable."""
    return tuple(sorted(names, key=_natural_key))


def abbreviate_names(names: list[str] | tuple[str, ...]) -> list[str]:
    """Fold names that differ in one number into ranges, innermost number first.

    ``model.layers.5.mlp.experts.{0..255}.down_proj.weight`` instead of 256 lines, and then
    ``model.layers.{3..77}.mlp.experts.{0..255}.down_proj.weight`` when every MoE layer lost it.
    """
    # Each name becomes tokens split on ".", numbers as sets so that folding is a set union.
    items: list[tuple[str | frozenset[int], ...]] = [
        tuple(frozenset([int(t)]) if _CANONICAL_INT.fullmatch(t) else t for t in name.split("."))
        if name.count(".") < _MAX_FOLDED_PARTS
        else (name,)
        for name in names
    ]
    depth = max((sum(isinstance(t, frozenset) for t in item) for item in items), default=0)
    for k in range(min(depth, _MAX_FOLDED_NUMBERS)):
        groups: dict[tuple[Any, ...], set[int]] = {}
        for item in items:
            positions = [i for i, t in enumerate(item) if isinstance(t, frozenset)]
            if len(positions) <= k:
                groups.setdefault(item, set())
                continue
            pos = positions[-1 - k]
            key = item[:pos] + (None,) + item[pos + 1 :]
            groups.setdefault(key, set()).update(item[pos])  # type: ignore[arg-type]
        items = [
            tuple(frozenset(nums) if t is None else t for t in key) if nums else key for key, nums in groups.items()
        ]
    # Order groups by their smallest numbers, so "layers.7" follows "layers.{3..5}".
    items.sort(key=lambda item: tuple((1, 0, t) if isinstance(t, str) else (0, min(t), "") for t in item))
    return [".".join(t if isinstance(t, str) else _render_numbers(t) for t in item) for item in items]


def _render_numbers(numbers: frozenset[int]) -> str:
    ordered = sorted(numbers)
    if len(ordered) == 1:
        return str(ordered[0])
    runs: list[list[int]] = [[ordered[0], ordered[0]]]
    for n in ordered[1:]:
        if n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return "{" + ",".join(str(a) if a == b else f"{a}..{b}" for a, b in runs) + "}"


def shown_name(name: str) -> str:
    # Names come from the checkpoint: a newline or an escape sequence in one must not forge a line of
    # the report or rewrite the terminal, and a name of megabytes must not become one line of them.
    if not name.isprintable():
        name = ascii(name)[1:-1]
    if len(name) > _MAX_SHOWN_NAME:
        half = _MAX_SHOWN_NAME // 2
        name = f"{name[:half]}...({len(name) - 2 * half} characters)...{name[-half:]}"
    return name


def render_audit(report: AuditReport, model_dir: Path, limit: int = 40) -> str:
    """The human summary: what was checked, the verdict, then what is missing or unexpected."""
    lay = report.layout
    dense = lay.num_hidden_layers - lay.moe_layers_between(0, lay.num_hidden_layers)
    lines = [
        f"checkpoint {model_dir}: {'OK' if report.ok else 'NOT OK'}",
        f"  layers: {lay.num_hidden_layers} ({dense} dense, {lay.num_hidden_layers - dense} MoE), "
        f"experts: {lay.n_routed_experts} routed + {lay.n_shared_experts} shared, "
        f"lm_head: {'tied' if lay.tie_word_embeddings else 'own'}",
        f"  shards: {len(report.shards)} read, {len(report.shards_missing)} missing; tensors: {report.tensors}",
    ]
    if report.mtp_layers:
        state = "present" if report.mtp_present else f"absent ({len(report.mtp_missing)} tensors missing, tolerated)"
        lines.append(f"  MTP layers {_render_numbers(frozenset(report.mtp_layers))}: {state}")
    else:
        lines.append("  MTP layers: none declared")
    for title, names in (
        ("missing shard files", report.shards_missing),
        ("missing", report.missing),
        ("unexpected", report.unexpected),
        ("shard files not in the index (ignored by loaders)", report.shards_unindexed),
    ):
        if names:
            folded = abbreviate_names(names)
            lines.append(f"  {title} ({len(names)}):")
            lines.extend(f"    {shown_name(n)}" for n in folded[:limit])
            if len(folded) > limit:
                lines.append(f"    ... and {len(folded) - limit} more groups")
    return "\n".join(lines)
