"""Benchmark: the checkpoint audit against opening every shard with safetensors.safe_open.

A GLM-5-sized checkpoint index (78 layers + 1 MTP layer, 256 routed experts, 100 shards, ~60k
tensors) is written with tests/lib/ckptgen.py: real safetensors files, tiny tensors. With
``--realistic-sizes`` each shard's header is then rewritten with approximate GLM-5 shapes and its
data section left as a hole (a sparse file), so shards have their real sizes (~1.5 TB in all)
while using almost no disk. Both approaches are then timed side by side, cold (the shards' pages
evicted from the page cache with posix_fadvise) and warm, and what they read is counted three ways:

- rchar: bytes through read()-style system calls (/proc/self/io); misses mmap, which safe_open uses.
- read_bytes: bytes this process caused to be fetched from storage (/proc/self/io); holes cost none.
- cached: bytes of the shards resident in the page cache afterwards (mincore), i.e. pages touched.

With ``--meta``, the expected names are also taken from the model itself: GLM-5 (78 layers x 256
experts, from the same config.json) built on the meta device by transformers 5.10.4 in the tests'
cached environment (tests/lib/pyenvs.py), as the locked image's python would build it; timed against
the static description, with the script's own split into import, build and names.

With ``--hostile``, the refusal of hostile variants of that checkpoint is timed as well (a FIFO, a link
to /dev/zero, sparse files of gigabytes, a config declaring a billion layers, JSON nested 100,000 deep,
objects by the million, a shape of 100,000 dimensions, an index naming 300,000 shards): each must end
in one InputError naming the file, in well under a second, which tests must not assert on time.

Run: .venv/bin/python benchmarks/bench_audit.py [--realistic-sizes] [--repeat 5] [--meta] [--hostile]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import mmap
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safetensors import safe_open  # noqa: E402

from envbuild.errors import InputError  # noqa: E402
from envrun.checkpoint import audit_checkpoint, read_safetensors_header  # noqa: E402
from envrun.checkpoint.expected import from_architecture  # noqa: E402
from envrun.checkpoint.layout import load_layout, plausible_limit  # noqa: E402
from envrun.checkpoint.modelnames import ModelNames, script_text  # noqa: E402
from tests.lib.ckptgen import CheckpointSpec, write_checkpoint, write_raw_safetensors  # noqa: E402

# Approximate GLM-5 dimensions, only to give shards realistic sizes; nothing reads the values.
H, MOE_FF, DENSE_FF, VOCAB, Q_LORA, KV_LORA = 6144, 2048, 12288, 154880, 2048, 512
SHAPES: list[tuple[str, tuple[int, ...]]] = [  # by name suffix; experts are handled first
    ("embed_tokens.weight", (VOCAB, H)),
    ("lm_head.weight", (VOCAB, H)),
    ("mlp.down_proj.weight", (H, DENSE_FF)),
    ("mlp.gate_proj.weight", (DENSE_FF, H)),
    ("mlp.up_proj.weight", (DENSE_FF, H)),
    ("mlp.gate.weight", (256, H)),
    ("q_a_proj.weight", (Q_LORA, H)),
    ("q_b_proj.weight", (64 * 256, Q_LORA)),
    ("kv_a_proj_with_mqa.weight", (KV_LORA + 64, H)),
    ("kv_b_proj.weight", (64 * 448, KV_LORA)),
    ("o_proj.weight", (H, 64 * 256)),
    ("indexer.wq_b.weight", (4096, Q_LORA)),
    ("indexer.wk.weight", (128, H)),
    ("indexer.weights_proj.weight", (32, H)),
    ("indexer.k_norm.weight", (128,)),
    ("indexer.k_norm.bias", (128,)),
    ("q_a_layernorm.weight", (Q_LORA,)),
    ("kv_a_layernorm.weight", (KV_LORA,)),
    ("eh_proj.weight", (H, 2 * H)),
]


def realistic_shape(name: str) -> tuple[str, tuple[int, ...]]:
    if name.endswith("e_score_correction_bias"):
        return "F32", (256,)
    if ".experts." in name or ".shared_experts." in name:
        return "BF16", ((H, MOE_FF) if name.endswith("down_proj.weight") else (MOE_FF, H))
    for suffix, shape in SHAPES:
        if name.endswith(suffix):
            return "BF16", shape
    return "BF16", (H,)  # the remaining norms


def inflate_to_realistic_sizes(path: Path) -> None:
    """Rewrite the header with realistic shapes; leave the data section as a hole."""
    header = read_safetensors_header(path)
    entries: dict[str, object] = {"__metadata__": header.metadata}
    offset = 0
    for name in header.tensors:
        dtype, shape = realistic_shape(name)
        size = (4 if dtype == "F32" else 2) * math.prod(shape)
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the writer pads to 8 bytes; keep data aligned the same way
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


# --- measurement -------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache (mincore over a mapping that itself faults nothing in)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb") as f:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(b & 1 for b in bytes(vec)) * mmap.PAGESIZE
        finally:
            _libc.munmap(addr, size)


def evict(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # only clean pages can be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def measure(fn: Callable[[], object], files: list[Path], cold: bool) -> dict[str, float]:
    if cold:
        evict(files)
    before = proc_io()
    start = time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    after = proc_io()
    return {
        "wall_s": wall,
        "rchar": after["rchar"] - before["rchar"],
        "read_bytes": after["read_bytes"] - before["read_bytes"],
        "cached": sum(resident_bytes(p) for p in files) if cold else float("nan"),
    }


def list_keys_with_safe_open(model_dir: Path) -> int:
    """The baseline: what a loader does to learn the names, via the index and safe_open."""
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    count = 0
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(model_dir / shard), framework="numpy") as f:
            count += len(list(f.keys()))
    return count


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


# --- hostile variants ---------------------------------------------------------------------------

INDEX = "model.safetensors.index.json"


def _prepend(path: Path, text: str) -> None:
    """Insert ``text`` as the first member of the JSON object in ``path``."""
    path.write_text(path.read_text().replace("{", "{" + text, 1))


def _add_to_weight_map(path: Path, entries: dict[str, str]) -> None:
    index = json.loads(path.read_text())
    index["weight_map"].update(entries)
    path.write_text(json.dumps(index))


def _replace(path: Path) -> Path:
    path.unlink()
    return path


def _single_file(d: Path, header: bytes) -> None:
    """Replace the shards and index of ``d`` by a single model.safetensors with ``header``."""
    for path in [*d.glob("*.safetensors"), d / INDEX]:
        path.unlink()
    write_raw_safetensors(d / "model.safetensors", header, b"\0" * 8)


NESTED = "[" * 100_000 + "]" * 100_000
HOSTILE: dict[str, Callable[[Path], object]] = {
    "config.json is a FIFO": lambda d: os.mkfifo(_replace(d / "config.json")),
    "the index links to /dev/zero": lambda d: _replace(d / INDEX).symlink_to("/dev/zero"),
    "config.json is a sparse 3 GB file": lambda d: os.truncate(d / "config.json", 3 << 30),
    "the index is a sparse 3 GB file": lambda d: os.truncate(d / INDEX, 3 << 30),
    "config.json (~90 bytes) declares 10^9 layers x 10^6 experts": lambda d: (d / "config.json").write_text(
        '{"model_type": "glm_moe_dsa", "num_hidden_layers": 1000000000, "n_routed_experts": 1000000}'
    ),
    "config.json nested 100,000 deep": lambda d: _prepend(d / "config.json", f'"deep": {NESTED},'),
    "the index nested 100,000 deep": lambda d: _prepend(d / INDEX, f'"deep": {NESTED},'),
    "the index holds 20M empty arrays (60 MB)": lambda d: _prepend(d / INDEX, '"pad": [%s[]],' % ("[]," * 20_000_000)),
    "the index names 300,000 shard files": lambda d: _add_to_weight_map(
        d / INDEX, {f"model.layers.9.t{k}": f"s{k}.safetensors" for k in range(300_000)}
    ),
    "a shard's header length is 99 MB (sparse 3 GB file)": lambda d: os.truncate(
        write_raw_safetensors(_replace(d / "model-00050-of-00100.safetensors"), b"", length=99_000_000), 3 << 30
    ),
    "model.safetensors: a shape of 100,000 dimensions of 2^63": lambda d: _single_file(
        d, b'{"a": {"dtype": "F32", "shape": [%s], "data_offsets": [0, 8]}}' % b",".join([b"%d" % 2**63] * 100_000)
    ),
    "model.safetensors: a header nested 100,000 deep": lambda d: _single_file(
        d, b'{"a": {"dtype": "F32", "shape": %s, "data_offsets": [0, 8]}}' % NESTED.encode()
    ),
    "model.safetensors: a header of 20M empty arrays (60 MB)": lambda d: _single_file(
        d, b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "pad": [%s[]]}}' % (b"[]," * 20_000_000)
    ),
}


def time_refusals(model_dir: Path, work: Path) -> None:
    """Audit a hostile variant of ``model_dir`` per case; print the time to the refusal and its line."""
    print("\nhostile variants of this checkpoint: time to refuse (best of 3), and the refusal")
    for title, make in HOSTILE.items():
        case = work / "case"
        shutil.copytree(model_dir, case, symlinks=True)
        make(case)
        times, message = [], "NOT REFUSED"
        for _ in range(3):
            start = time.perf_counter()
            try:
                audit_checkpoint(case)
            except InputError as exc:
                message = str(exc).replace(str(case), "DIR")
            times.append(time.perf_counter() - start)
        print(f"  {min(times) * 1000:7.1f} ms  {title}\n             {message[:150]}")
        shutil.rmtree(case)


def time_meta_names(model_dir: Path, repeat: int) -> None:
    """Expected names from the model on the meta device, against the static description."""
    import subprocess

    from tests.lib.pyenvs import HF_STACK, cached_venv

    python = (str(cached_venv(HF_STACK).python),)
    config = (model_dir / "config.json").read_bytes()
    held = audit_checkpoint(model_dir).tensors
    limit = plausible_limit(held)
    layout = load_layout(model_dir / "config.json")

    static_s = []
    for _ in range(repeat):
        start = time.perf_counter()
        static = from_architecture(layout)
        static_s.append(time.perf_counter() - start)
    walls, splits = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        names = ModelNames(python)(config, limit)  # a new source each time: it keeps its answer
        walls.append(time.perf_counter() - start)
        done = subprocess.run([*python, "-c", script_text(), str(limit)], input=config, capture_output=True, check=True)
        splits.append(json.loads(done.stdout)["seconds"])
    assert names.names == static.required, "the model's names and the static description differ"
    audit_static = min(_timed(lambda: audit_checkpoint(model_dir)) for _ in range(repeat))
    audit_model = min(_timed(lambda: audit_checkpoint(model_dir, expected=names)) for _ in range(repeat))
    med = {k: statistics.median(s[k] for s in splits) for k in ("import", "build", "names")}
    print(f"\nexpected names of {len(names.names):,} tensors (median of {repeat}); {names.source}")
    print(f"  static description (envrun, host)        {statistics.median(static_s) * 1000:8.1f} ms")
    print(
        f"  model on the meta device, whole process  {statistics.median(walls):8.2f} s   "
        f"(import {med['import']:.2f} s, build {med['build']:.2f} s, save_pretrained's names {med['names']:.2f} s)"
    )
    print(f"  meta / static: {statistics.median(walls) / statistics.median(static_s):,.0f}x; the same names")
    print(
        f"  audit with the static names {audit_static * 1000:.1f} ms, with the model's names {audit_model * 1000:.1f} ms"
    )


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=78)
    parser.add_argument("--mtp", type=int, default=1)
    parser.add_argument("--first-k-dense", type=int, default=3)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--realistic-sizes", action="store_true", help="sparse shards of GLM-5's real size")
    parser.add_argument("--hostile", action="store_true", help="also time the refusal of hostile variants")
    parser.add_argument("--meta", action="store_true", help="also time expected names from the model (meta device)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_audit_") as tmp:
        model_dir = Path(tmp) / "model"
        spec = CheckpointSpec(
            layers=args.layers,
            mtp_layers=args.mtp,
            first_k_dense=args.first_k_dense,
            experts=args.experts,
            shards=args.shards,
        )
        start = time.perf_counter()
        write_checkpoint(model_dir, spec)
        shards = sorted(model_dir.glob("*.safetensors"))
        if args.realistic_sizes:
            for path in shards:
                inflate_to_realistic_sizes(path)
        generated = time.perf_counter() - start
        apparent = sum(p.stat().st_size for p in shards)
        on_disk = sum(p.stat().st_blocks * 512 for p in shards)

        report = audit_checkpoint(model_dir)
        keys = list_keys_with_safe_open(model_dir)
        assert report.ok and report.tensors == keys, (report.ok, report.tensors, keys)
        print(
            f"checkpoint: {args.layers} layers + {args.mtp} MTP, {args.experts} experts, {len(shards)} shards, "
            f"{keys} tensors; shards {human(apparent)} apparent, {human(on_disk)} on disk; generated in {generated:.1f} s"
        )

        candidates = {
            "audit_checkpoint": lambda: audit_checkpoint(model_dir),
            "safe_open + keys()": lambda: list_keys_with_safe_open(model_dir),
        }
        files = shards + [model_dir / "model.safetensors.index.json", model_dir / "config.json"]
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(args.repeat):
            for state in ("cold", "warm"):
                for name, fn in candidates.items():  # interleaved, so drift hits both alike
                    results.setdefault((name, state), []).append(measure(fn, files, cold=state == "cold"))

        print(f"\nmedian of {args.repeat} runs            wall      rchar       read_bytes   cached (pages touched)")
        for state in ("cold", "warm"):
            for name in candidates:
                runs = results[(name, state)]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                cached = "-" if state == "warm" else human(med["cached"])
                print(
                    f"  {state:4}  {name:20} {med['wall_s'] * 1000:7.1f} ms {human(med['rchar']):>10} "
                    f"{human(med['read_bytes']):>12}   {cached}"
                )
            a = {
                k: statistics.median(r[k] for r in results[("audit_checkpoint", state)])
                for k in ("wall_s", "rchar", "read_bytes", "cached")
            }
            b = {
                k: statistics.median(r[k] for r in results[("safe_open + keys()", state)])
                for k in ("wall_s", "rchar", "read_bytes", "cached")
            }
            ratios = [f"wall {a['wall_s'] / b['wall_s']:.2f}x"]
            if state == "cold":
                ratios.append(f"cached {a['cached'] / b['cached']:.2f}x" if b["cached"] else "cached n/a")
                ratios.append(
                    f"read_bytes {a['read_bytes'] / b['read_bytes']:.2f}x" if b["read_bytes"] else "read_bytes n/a"
                )
            print(f"  {state:4}  audit / safe_open: {', '.join(ratios)}")
        print(f"\naudit's own count of bytes read (config + index + headers): {human(report.bytes_read)}")
        if args.meta:
            time_meta_names(model_dir, min(args.repeat, 3))
        if args.hostile:
            time_refusals(model_dir, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
