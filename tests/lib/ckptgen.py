"""Write GLM-5-shaped (glm_moe_dsa) checkpoints at tiny sizes with the real safetensors writer.

Names follow the Hugging Face layout as stored on disk: per-expert MLP tensors, shared experts, the
noaux_tc router with its score-correction bias, MLA attention with the DSA indexer, and MTP layers
``N..N+M-1`` as a full decoder block plus enorm/hnorm/eh_proj/shared_head.norm (upstream-facts §4).
They are the names transformers 5.10.4's save_pretrained writes for the same config, which
tests/test_checkpoint_real.py checks; this writer exists for sizes save_pretrained cannot reach here
(GLM-5's 78 layers x 256 experts) and for speed.
Shapes are tiny: the audit reads names and header fields, never values, so only counts matter.

Used by the tests and by benchmarks/bench_audit.py (GLM-5 size: 78 layers, 1 MTP, 256 experts).
Hostile checkpoints are built from a valid one by the tests themselves; :func:`write_raw_safetensors`
writes a header byte for byte, and :func:`run_audit_guarded` runs the CLI where a hang or a runaway
allocation fails the test instead of the suite.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
from safetensors.numpy import save_file

ATTENTION = (
    "self_attn.q_a_proj.weight",
    "self_attn.q_a_layernorm.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.kv_a_proj_with_mqa.weight",
    "self_attn.kv_a_layernorm.weight",
    "self_attn.kv_b_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.indexer.wq_b.weight",
    "self_attn.indexer.wk.weight",
    "self_attn.indexer.k_norm.weight",
    "self_attn.indexer.k_norm.bias",
    "self_attn.indexer.weights_proj.weight",
)
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
PROJ = ("gate_proj", "up_proj", "down_proj")
MTP_HEAD = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


@dataclass(frozen=True)
class CheckpointSpec:
    layers: int = 4
    mtp_layers: int = 1
    first_k_dense: int = 1
    experts: int = 4
    tied: bool = False
    include_mtp: bool = True  # False: the lenient export, MTP declared in config.json but not saved
    shards: int = 3
    single_file: bool = False  # model.safetensors without an index


def config_dict(spec: CheckpointSpec) -> dict[str, object]:
    # transformers 5.10.4's glm_moe_dsa reads mlp_layer_types, never first_k_dense_replace (without the
    # list it makes the first 3 layers dense): the list says what first_k_dense means here, the way
    # save_pretrained writes it into every config.json.
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "num_hidden_layers": spec.layers,
        "num_nextn_predict_layers": spec.mtp_layers,
        "first_k_dense_replace": spec.first_k_dense,
        "mlp_layer_types": ["dense" if i < spec.first_k_dense else "sparse" for i in range(spec.layers)],
        "n_routed_experts": spec.experts,
        "n_shared_experts": 1,
        "tie_word_embeddings": spec.tied,
        "hidden_size": 2,
        "torch_dtype": "bfloat16",
    }


def layer_names(spec: CheckpointSpec, layer: int) -> list[str]:
    """One decoder layer's tensors, in the order a saver writes them."""
    names = list(NORMS) + list(ATTENTION)
    if layer < spec.first_k_dense or spec.experts == 0:
        names += [f"mlp.{p}.weight" for p in PROJ]
    else:
        names += ["mlp.gate.weight", "mlp.gate.e_score_correction_bias"]
        names += [f"mlp.experts.{e}.{p}.weight" for e in range(spec.experts) for p in PROJ]
        names += [f"mlp.shared_experts.{p}.weight" for p in PROJ]
    if layer >= spec.layers:
        names += list(MTP_HEAD)
    return [f"model.layers.{layer}.{n}" for n in names]


def tensor_names(spec: CheckpointSpec) -> list[str]:
    """Every tensor of the checkpoint ``spec`` describes, in on-disk order."""
    names = ["model.embed_tokens.weight"]
    for i in range(spec.layers):
        names += layer_names(spec, i)
    names.append("model.norm.weight")
    if not spec.tied:
        names.append("lm_head.weight")
    if spec.include_mtp:
        for i in range(spec.layers, spec.layers + spec.mtp_layers):
            names += layer_names(spec, i)
    return names


_ARRAYS = {
    1: np.ones((2,), dtype=np.float16),
    2: np.ones((2, 2), dtype=np.float16),
}


def _array(name: str) -> np.ndarray:
    if name.endswith("e_score_correction_bias"):
        return np.zeros((4,), dtype=np.float32)  # F32 on disk, like the real router bias
    one_d = "norm" in name or name.endswith(".bias")
    return _ARRAYS[1 if one_d else 2]


def shard_file_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def write_checkpoint(
    directory: Path,
    spec: CheckpointSpec = CheckpointSpec(),
    *,
    drop: Iterable[str] = (),
    extra: Iterable[str] = (),
    unindexed: Iterable[str] = (),
    ghost: Iterable[str] = (),
) -> dict[str, list[str]]:
    """Write config.json, the shards and the index into ``directory``; return shard -> names.

    ``drop`` removes names everywhere; ``extra`` adds names to the last shard and the index;
    ``unindexed`` adds names to the first shard only; ``ghost`` adds index entries, pointing at the
    first shard, for tensors no shard holds.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_dict(spec), indent=2) + "\n")
    dropped = set(drop)
    names = [n for n in tensor_names(spec) if n not in dropped] + list(extra)
    count = 1 if spec.single_file else spec.shards
    # Contiguous chunks, as savers fill shards in order: a layer's tensors stay mostly together.
    size = -(-len(names) // count)
    layout = {
        ("model.safetensors" if spec.single_file else shard_file_name(k + 1, count)): names[k * size : (k + 1) * size]
        for k in range(count)
    }
    weight_map: dict[str, str] = {}
    total = 0
    for k, (shard, shard_names) in enumerate(layout.items()):
        stored = shard_names + (list(unindexed) if k == 0 else [])
        tensors = {n: _array(n) for n in stored}
        save_file(tensors, str(directory / shard), metadata={"format": "pt"})
        weight_map.update((n, shard) for n in shard_names)
        total += sum(a.nbytes for n, a in tensors.items() if n in set(shard_names))
    if not spec.single_file:
        first = next(iter(layout))
        weight_map.update((n, first) for n in ghost)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return layout


def write_raw_safetensors(path: Path, header: object, data: bytes = b"", *, length: int | None = None) -> Path:
    """A .safetensors file with ``header`` as given (JSON-encoded unless bytes) and ``length`` as its
    length field (default: the header's real length), so malformed and hostile headers can be written."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class AuditRun:
    returncode: int
    stdout: str
    stderr: str


def run_audit_guarded(
    model_dir: Path, *args: str, timeout: float = 10, address_space: int = 768 << 20, process: bool = False
) -> AuditRun:
    """``envrun checkpoint audit MODEL_DIR *args`` in a child process limited to ``timeout`` seconds and
    ``address_space`` bytes more than it starts with: a regression to a hang or to building names until
    memory runs out then fails the one test (a timeout, or a MemoryError that is not exit status 2)
    instead of the suite. A guard, not a timing assertion: a healthy audit of these inputs takes well
    under a second.

    The child is this process forked, calling ``envrun.cli.main`` with its stdout and stderr on files:
    the CLI as users run it, without the ~0.6 s (and, on a loaded machine, several seconds) a new
    interpreter spends importing envbuild for each case. ``process=True`` starts ``python -m envrun.cli``
    instead, for the cases that are about the entry point itself."""
    argv = ["checkpoint", "audit", str(model_dir), *args]
    if process:
        return _run_process(argv, timeout, address_space)
    _warm_cli()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            _child(argv, out.fileno(), err.fileno(), address_space)
        status = _wait(pid, timeout)
        if status is None:
            raise AssertionError(f"envrun checkpoint audit {model_dir} did not finish within {timeout} s")
        return AuditRun(os.waitstatus_to_exitcode(status), _text(out), _text(err))


def _warm_cli() -> None:
    # Every import the CLI makes, once, in this process: forked children then start with them.
    from envrun.cli.main import build_parser

    build_parser()


def _child(argv: list[str], out: int, err: int, address_space: int) -> None:
    code = 70
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
        limit = _address_space_now() + address_space
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        from envrun.cli.main import main

        code = main(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _address_space_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)  # the child this helper forked, by its pid
    os.waitpid(pid, 0)
    return None


def _text(handle: IO[bytes]) -> str:
    handle.seek(0)
    return handle.read().decode("utf-8", "backslashreplace")


def _run_process(argv: list[str], timeout: float, address_space: int) -> AuditRun:
    def limit_memory() -> None:
        limit = _address_space_now() + address_space
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        proc = subprocess.run(
            [sys.executable, "-m", "envrun.cli.main", *argv],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            timeout=timeout,
            preexec_fn=limit_memory,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"envrun {' '.join(argv)} did not finish within {timeout} s") from None
    out, err = (b.decode("utf-8", "backslashreplace") for b in (proc.stdout, proc.stderr))
    return AuditRun(proc.returncode, out, err)
