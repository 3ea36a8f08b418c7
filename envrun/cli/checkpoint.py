"""``envrun checkpoint audit``: parse, call :func:`envrun.checkpoint.audit.audit_checkpoint`, print."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from envbuild.cli.common import add_command_group, command_words


def add_checkpoint_command(commands: argparse._SubParsersAction) -> None:
    actions = add_command_group(commands, "checkpoint", "inspect Hugging Face checkpoints")
    audit = actions.add_parser(
        "audit",
        help="check a checkpoint is complete except, at most, its MTP layers (reads headers only)",
        description="Exit 0 if complete (MTP layers may be absent), 1 if anything else is missing "
        "or unexpected, or if --model-python's python could not give the model's names (no report "
        "then, even with --json: nothing was checked), 2 if the input cannot be read or its "
        "architecture cannot be checked.",
    )
    audit.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    audit.add_argument("--json", action="store_true", help="print the report as JSON (every name)")
    audit.add_argument(
        "--model-python",
        metavar="PYTHON",
        help="expected names from the model itself: this python (a command, e.g. the image's "
        "'docker run --rm -i IMAGE python3') builds it from config.json on the meta device",
    )
    audit.add_argument(
        "--trust-uniform-layers",
        action="store_true",
        help="for an architecture the audit cannot describe: check only that layers are alike "
        "(a tensor lost from every layer then passes); the report names this weaker check",
    )
    audit.set_defaults(handler=checkpoint_audit)


def checkpoint_audit(args: argparse.Namespace) -> int:
    # Imported here so that `envrun --help` and other subcommands do not pay for it.
    from envrun.checkpoint.audit import audit_checkpoint
    from envrun.checkpoint.modelnames import ModelNames
    from envrun.checkpoint.report import render_audit

    names = ModelNames(command_words("--model-python", args.model_python)) if args.model_python is not None else None
    report = audit_checkpoint(args.model_dir, expected=names, trust_uniform_layers=args.trust_uniform_layers)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_audit(report, args.model_dir))
    return 0 if report.ok else 1
