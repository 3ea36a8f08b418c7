"""Audit a Hugging Face checkpoint directory from config.json and safetensors headers only.

Why: verl saves HF weights with ``checkpoint.strict=False`` because the MTP layers are absent from
the trained model, and that leniency would equally let a lost ``lm_head``, an expert shard or one
parameter of every layer pass (upstream-facts §4). The audit is the check that only the MTP layers are
missing. It never reads tensor data, so it costs a few megabytes of headers even for a checkpoint of a
terabyte.

What the checkpoint must hold comes from the architecture, never from the checkpoint itself
(:func:`envrun.checkpoint.expected.expectation`): the modelling code's own names when a python with
transformers is at hand (``expected=``), else the static description of the locked transformers' code
for the architectures it covers. Any other architecture, or a quantised checkpoint, is refused (exit 2):
the audit cannot say it is complete. ``trust_uniform_layers=True`` asks by name for the weaker
uniform-layers check, and the report says that is what ran.

A run audits a model directory through :func:`audit_model`, wherever it runs (this host, a Ray node):
its :class:`ModelAudit` words every failure one way, and preflight's one verdict judges it.

The checkpoint is hostile input (a hub download, an export of a job someone else configured), and the
order of work keeps every cost bounded by what was read: config.json and the index are read within
their size limits and opened only as regular files inside the model directory
(:mod:`envrun.checkpoint.untrusted`); what config.json declares is checked against how many tensors
the index (or the single file) holds before any expected name is generated, and a source of names is
told the most it may return; each shard's header is bounded by what the index places in it.
Everything refused is an :class:`InputError` naming the file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.data.jsonout import jfield
from envbuild.errors import EnvbuildError, InputError
from envrun.checkpoint.expected import (
    Check,
    Expectation,
    ExpectedNames,
    NameSource,
    UnsupportedArchitectureError,
    expectation,
    weak_check,
)
from envrun.checkpoint.layout import (
    ModelConfigError,
    ModelLayout,
    implausible_counts,
    layout_from_config,
    plausible_limit,
    read_config,
    split_layer_name,
)
from envrun.checkpoint.modelnames import ModelNames, ModelNamesError
from envrun.checkpoint.names import group_missing, natural_sorted, render_numbers
from envrun.checkpoint.safetensors_header import SafetensorsHeaderError, read_safetensors_header
from envrun.checkpoint.untrusted import MiB, brief, locate, read_json

__all__ = [
    "AuditReport",
    "CheckpointIndexError",
    "ModelAudit",
    "UnsupportedArchitectureError",
    "audit_checkpoint",
    "audit_model",
]

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
NOT_A_MODEL_DIR = "not a directory; pass the model directory holding config.json"


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
    check: Check = "architecture"  # what the expected names came from; "uniform-layers" is the weak one
    expected_from: str = ""  # the same, for people
    missing_groups: tuple[str, ...] = ()  # ``missing`` by tensor and layers, as a person reads it
    notes: tuple[str, ...] = ()  # fields of config.json the modelling code does not read, and the like

    def to_json(self) -> dict[str, Any]:
        """The JSON document of issue 4 §4, with extra keys after the four that are promised."""
        lay = self.layout
        # As many layers as the checkpoint's own tensor count made plausible (layout.implausible_counts).
        moe = [i for i in range(lay.num_hidden_layers) if lay.is_moe(i)]
        dense = sorted(set(range(lay.num_hidden_layers)) - set(moe))
        return {
            "ok": self.ok,
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "mtp": {"layers": list(self.mtp_layers), "present": self.mtp_present},
            "check": self.check,
            "expected_from": self.expected_from,
            "missing_groups": list(self.missing_groups),
            "notes": list(self.notes),
            "mtp_missing": list(self.mtp_missing),
            "shards_missing": list(self.shards_missing),
            "shards_unindexed": list(self.shards_unindexed),
            "shards": len(self.shards),
            "tensors": self.tensors,
            "model_type": lay.model_type,
            "num_hidden_layers": lay.num_hidden_layers,
            "layers": {"dense": render_numbers(dense, braces=False), "moe": render_numbers(moe, braces=False)},
            "first_k_dense_replace": lay.first_k_dense_replace if lay.mlp_layer_types is None else None,
            "n_routed_experts": lay.n_routed_experts,
            "tie_word_embeddings": lay.tie_word_embeddings,
        }


@dataclass(frozen=True)
class _Held:
    """Where the checkpoint's tensors are, as a loader finds them."""

    present: frozenset[str]  # in the file the index places them in
    misplaced: frozenset[str]  # indexed, but not in that file
    unindexed: frozenset[str]  # in a file, but the index places them elsewhere or nowhere
    shards: tuple[str, ...]  # files read
    shards_missing: tuple[str, ...]
    named: frozenset[str]  # every file the index names (or the single file)
    bytes_read: int


def audit_checkpoint(
    model_dir: Path,
    *,
    expected: ExpectedNames | NameSource | None = None,
    trust_uniform_layers: bool = False,
) -> AuditReport:
    """Audit ``model_dir``. Raises :class:`InputError` (exit 2) for input that cannot be read at all,
    and for an architecture it cannot check unless ``expected`` (the model's own names, or a source of
    them such as :class:`envrun.checkpoint.modelnames.ModelNames`) or ``trust_uniform_layers`` is given."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: {NOT_A_MODEL_DIR}")
    # When config.json is absent, read_config says so in its own words.
    config_path = _locate(model_dir, "config.json", _config_error) or model_dir / "config.json"
    config, doc = read_config(config_path)
    layout = layout_from_config(doc, config_path)
    weak = weak_check(layout, config_path, expected is not None, trust_uniform_layers)
    held = _read_held(model_dir, layout, config_path, len(config))
    expect = expectation(layout, config, config_path, expected, weak=weak, present=held.present, max_names=_limit(held))
    return _compare(model_dir, layout, held, expect)


@dataclass(frozen=True)
class ModelAudit:
    """An audit of a model directory (the one the job reads, or an export a run wrote), wherever it ran
    (this host, a Ray node or a Slurm task, whose answer is its JSON), or what stopped it: what preflight's
    one verdict and the export guard judge."""

    path: str
    ok: bool
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    check: str | None = None  # what the expected names came from ("architecture", "model", …)
    expected_from: str = ""  # the same, for people
    error: str | None = None  # what stopped the audit, naming the path: no names were compared
    node: str = jfield("", omit="empty")  # the node that holds it ("" on this host)
    shards_missing: tuple[str, ...] = jfield((), omit="empty")  # files the index names that are not there

    @classmethod
    def of_answer(cls, answer: Mapping[str, Any], node: str = "") -> ModelAudit:
        """A node's answer (JSON from the node: each field taken for what it says, nothing trusted more)."""
        error = answer.get("error")
        return cls(
            str(answer.get("path") or ""),
            bool(answer.get("ok")),
            tuple(str(name) for name in answer.get("missing") or ()),
            tuple(str(name) for name in answer.get("unexpected") or ()),
            str(answer["check"]) if answer.get("check") is not None else None,
            str(answer.get("expected_from") or ""),
            str(error) if error else None,
            node,
            tuple(str(name) for name in answer.get("shards_missing") or ()),
        )

    @property
    def failure(self) -> str:
        """Why it is not ok, in one line: the error (it names the path), or the first files and names lost."""
        where = f"{self.node}: " if self.node else ""
        if self.error:
            return f"{where}{self.error}"
        # A missing shard file can be all there is to say: one that held only MTP tensors loses no other.
        files = [f"missing shard file {name}" for name in self.shards_missing[:3]]
        lost = ", ".join([*files, *self.missing[:3], *self.unexpected[:3]])
        names = f" (names: {self.expected_from})" if self.expected_from else ""
        return f"{where}{self.path}: {lost}{names}"


def audit_model(path: str, names: ModelNames | None) -> ModelAudit:
    """The audit of the model directory ``path`` against ``names`` (the job's model, from
    :func:`envrun.checkpoint.modelnames.job_names`; None: envrun's static description), or the failure
    that stopped it, in the same words on this host and on every node. A failure to get the model's
    names is one: there is no fallback to the description."""
    if not Path(path).is_dir():
        return ModelAudit(path, False, error=f"{path}: {NOT_A_MODEL_DIR}")
    try:
        report = audit_checkpoint(Path(path), expected=names)
    except ModelNamesError as exc:
        made = f" the lock's transformers {names.transformers} builds" if names and names.transformers else ""
        error = f"the expected names could not be had from the model{made} (no fallback to envrun's description)"
        return ModelAudit(path, False, error=f"{path}: {error}: {exc}")
    except EnvbuildError as exc:
        return ModelAudit(path, False, error=f"{path}: checkpoint unreadable: {str(exc).splitlines()[0]}")
    return ModelAudit(
        path,
        report.ok,
        report.missing,
        report.unexpected,
        report.check,
        report.expected_from,
        shards_missing=report.shards_missing,
    )


def _limit(held: _Held) -> int:
    return plausible_limit(len(held.present) + len(held.misplaced))


def _compare(model_dir: Path, layout: ModelLayout, held: _Held, expect: Expectation) -> AuditReport:
    present, mtp = held.present, set(layout.mtp_layers)
    lost = (expect.required | expect.mtp_required | held.misplaced) - present
    # MTP tensors are tolerated however they went missing, even ones the index still lists: the
    # loaders skip MTP keys, and a lenient save may keep an index entry for a tensor it dropped.
    lost_mtp = {name for name in lost if (split := split_layer_name(name)) and split[0] in mtp}
    missing = lost - lost_mtp
    unexpected = (present - expect.required - expect.mtp_required - expect.allowed) | held.unindexed
    return AuditReport(
        ok=not missing and not unexpected and not held.shards_missing,
        missing=natural_sorted(missing),
        unexpected=natural_sorted(unexpected),
        mtp_layers=layout.mtp_layers,
        # With no MTP layers declared there is nothing to be present; false keeps "present" meaning
        # "the run can train MTP" rather than "nothing is lost".
        mtp_present=bool(mtp) and not lost_mtp,
        mtp_missing=natural_sorted(lost_mtp),
        shards_missing=held.shards_missing,
        shards_unindexed=_unindexed_files(model_dir, held.named),
        shards=held.shards,
        layout=layout,
        tensors=len(present),
        bytes_read=held.bytes_read,
        check=expect.check,
        expected_from=expect.source,
        missing_groups=tuple(group_missing(missing, expect, layout.num_hidden_layers)),
        notes=layout.notes,
    )


def _read_held(model_dir: Path, layout: ModelLayout, config_path: Path, bytes_read: int) -> _Held:
    # transformers tries the single file before the index, so an audit must look where it looks.
    # Anything by either name that is not a regular file is refused, not skipped: a loader's
    # isfile() would skip a FIFO named model.safetensors, but a checkpoint holding one is hostile.
    single = _locate(model_dir, SINGLE_FILE, SafetensorsHeaderError)
    index_path = None if single else _locate(model_dir, INDEX_FILE, _index_error)
    if single is not None:
        header = read_safetensors_header(single)
        _check_counts(layout, config_path, len(header.tensors), single)
        return _Held(
            present=frozenset(header.tensors),
            misplaced=frozenset(),
            unindexed=frozenset(),
            shards=(SINGLE_FILE,),
            shards_missing=(),
            named=frozenset({SINGLE_FILE}),
            bytes_read=bytes_read + header.bytes_read,
        )
    if index_path is None:
        raise InputError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE}; not a safetensors checkpoint")
    weight_map, placed, index_bytes = _read_index(index_path)
    bytes_read += index_bytes
    _check_counts(layout, config_path, len(weight_map), index_path)
    held: dict[str, frozenset[str]] = {}
    shards_missing: list[str] = []
    for shard in sorted(placed):
        path = _locate(model_dir, shard, SafetensorsHeaderError)
        if path is None:
            shards_missing.append(shard)
            continue
        header = read_safetensors_header(path, expected_tensors=placed[shard])
        held[shard] = frozenset(header.tensors)
        bytes_read += header.bytes_read
    # A tensor counts only where the index places it: that is the only place a loader looks.
    present = frozenset(name for name, shard in weight_map.items() if name in held.get(shard, ()))
    return _Held(
        present=present,
        misplaced=frozenset(weight_map) - present,
        unindexed=frozenset(n for shard, names in held.items() for n in names if weight_map.get(n) != shard),
        shards=tuple(sorted(held)),
        shards_missing=tuple(shards_missing),
        named=frozenset(placed),
        bytes_read=bytes_read,
    )


def _locate(model_dir: Path, name: str, error: Callable[[Path, str], InputError]) -> Path | None:
    return locate(model_dir, name, lambda message: error(model_dir / name, message))


def _config_error(path: Path, message: str) -> InputError:
    return ModelConfigError(f"{path}: {message}")


def _index_error(path: Path, message: str) -> InputError:
    return CheckpointIndexError(f"{path}: {message}")


def _check_counts(layout: ModelLayout, config_path: Path, held: int, source: Path) -> None:
    # Before any expected name is built: a 100-byte config.json can declare a billion layers.
    problem = implausible_counts(layout, held)
    if problem:
        raise ModelConfigError(f"{config_path}: {problem}; {source} holds {held:,} tensors")


def _read_index(path: Path) -> tuple[dict[str, str], Counter[str], int]:
    """weight_map of the index at ``path``, how many tensors it places in each file, the bytes read."""

    def fail(message: str) -> InputError:
        return _index_error(path, message)

    raw, doc = read_json(path, MAX_INDEX_BYTES, "an index", fail, max_containers=MAX_INDEX_CONTAINERS)
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


def _unindexed_files(model_dir: Path, named: frozenset[str]) -> tuple[str, ...]:
    # Reported, not failed: a stale shard left from an earlier save is ignored by every loader,
    # but a person looking at the directory should know it is not part of the checkpoint.
    return tuple(sorted(p.name for p in model_dir.glob("*.safetensors") if p.name not in named))
