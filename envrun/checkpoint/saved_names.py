"""Print the tensor names ``save_pretrained`` writes for a config.json, without allocating a weight.

Self-contained on purpose: the standard library, torch and transformers, nothing of envrun, so that
any python with transformers can run it — the locked image's own, which does not have envrun:

    python saved_names.py MAX_NAMES < config.json
    python saved_names.py MAX_NAMES /mounted/config.json      (in a container, which has no stdin)
    python -c "$SCRIPT_TEXT" MAX_NAMES < config.json      (envrun.checkpoint.modelnames does this)

The model is built by ``AutoModelForCausalLM.from_config`` on the meta device (no memory for weights:
GLM-5's 78 layers x 256 experts build in well under a second), and ``save_pretrained`` itself runs,
with its one write call, ``safetensors`` ``save_file``, replaced by a recorder of the names it is
given. So the names are those of the real save: tied weights removed, fused experts split back into
one tensor per expert (transformers' reverse weight conversion), whatever the installed version does.
Only persistent buffers (routers' score-correction biases, a few KB) get real storage, because
save_pretrained asks meta tensors for their parameter and a buffer is none. No network, no remote code.

Prints one JSON object on stdout: ``{"names": [...], "class": ..., "transformers": ..., "torch": ...,
"config_sha256": ..., "seconds": {...}}``. Exit 2, with one line on stderr, when transformers refuses
the config or cannot build or save its model (or it would have more than MAX_NAMES tensors); exit 1
when this python cannot do it at all (no torch or transformers, or a transformers whose
save_pretrained no longer writes through ``modeling_utils.safe_save_file``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any

REFUSED = 2
UNABLE = 1


class Refused(Exception):
    """The config, not this python, is why there are no names."""


class Unable(Exception):
    """This python cannot produce the names."""


def saved_names(config: bytes, max_names: int) -> dict[str, object]:
    """The names ``save_pretrained`` writes for the model of ``config`` (config.json's bytes)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    started = time.perf_counter()
    _check_size(config, max_names)
    try:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, modeling_utils
    except ImportError as exc:
        raise Unable(f"this python cannot import torch and transformers: {exc}") from None
    if not hasattr(modeling_utils, "safe_save_file"):
        raise Unable(
            f"transformers {transformers.__version__}: save_pretrained no longer writes through "
            "modeling_utils.safe_save_file; this script needs updating"
        )
    transformers.utils.logging.disable_progress_bar()
    imported = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="saved-names-") as tmp:
        with open(os.path.join(tmp, "config.json"), "wb") as f:
            f.write(config)
        try:
            model_config = AutoConfig.from_pretrained(tmp, local_files_only=True, trust_remote_code=False)
        except Exception as exc:
            raise Refused(f"transformers {transformers.__version__} refuses this config.json: {_brief(exc)}") from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config, trust_remote_code=False)
    except Exception as exc:
        raise Refused(f"transformers {transformers.__version__} cannot build this model: {_brief(exc)}") from None
    built = time.perf_counter()
    _give_buffers_storage(model, torch)
    names: list[str] = []
    real_save_file = modeling_utils.safe_save_file
    modeling_utils.safe_save_file = lambda tensors, filename, metadata=None: names.extend(tensors)
    try:
        with tempfile.TemporaryDirectory(prefix="saved-names-") as out:
            model.save_pretrained(out, max_shard_size=2**62)
    except Exception as exc:
        raise Refused(f"transformers {transformers.__version__} cannot save this model: {_brief(exc)}") from None
    finally:
        modeling_utils.safe_save_file = real_save_file
    if len(names) > max_names:
        raise Refused(f"the model has {len(names):,} tensors, more than the {max_names:,} expected")
    return {
        "names": sorted(names),
        "class": type(model).__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config_sha256": hashlib.sha256(config).hexdigest(),
        "seconds": {
            "import": round(imported - started, 3),
            "build": round(built - imported, 3),
            "names": round(time.perf_counter() - built, 3),
        },
    }


def _check_size(config: bytes, max_names: int) -> None:
    # On the JSON, before transformers sees it: its config classes build per-layer lists in
    # __post_init__ (glm_moe_dsa's mlp_layer_types and indexer_types), so a config.json of 70 bytes
    # declaring 10^9 layers would exhaust memory there. Each layer is at least one tensor, each expert
    # three.
    try:
        doc = json.loads(config)
    except ValueError as exc:
        raise Refused(f"config.json is not JSON: {_brief(exc)}") from None
    if not isinstance(doc, dict):
        raise Refused("config.json is not a JSON object")
    for key, per in (("num_hidden_layers", 1), ("n_routed_experts", 3), ("num_local_experts", 3), ("num_experts", 3)):
        value = doc.get(key)
        if isinstance(value, int) and value * per > max_names:
            raise Refused(f"{key} {value:,}: more than the {max_names:,} tensors expected")


def _give_buffers_storage(model: Any, torch: Any) -> None:
    for module in model.modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta and name not in module._non_persistent_buffers_set:
                module._buffers[name] = torch.zeros(buffer.shape, dtype=buffer.dtype)


def _brief(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:300] + "..."


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or not argv[0].isdigit():
        print("usage: python saved_names.py MAX_NAMES [CONFIG_JSON] (default: config.json on stdin)", file=sys.stderr)
        return REFUSED
    if len(argv) == 2:  # a container run through an engine has no stdin: the file is mounted
        with open(argv[1], "rb") as f:
            config = f.read()
    else:
        config = sys.stdin.buffer.read()
    out = sys.stdout
    try:
        # Whatever transformers or torch print goes to stderr: stdout carries the one JSON document.
        with contextlib.redirect_stdout(sys.stderr):
            result = saved_names(config, int(argv[0]))
    except (Refused, Unable) as exc:
        print(f"saved_names: {exc}", file=sys.stderr)
        return REFUSED if isinstance(exc, Refused) else UNABLE
    json.dump(result, out)
    out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
