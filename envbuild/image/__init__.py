"""`envbuild image`: plan → context → Dockerfile → (engine) → check → normalise → record.

Each stage hands the next a typed value; only the engine module (not here) talks to a daemon.
"""

from envbuild.image.assemble import BuildContext, ContextError, assemble_context
from envbuild.image.inimage_verdict import compare_inimage, inimage_command
from envbuild.image.plan import ContextPlan, FilePlan, SourcePlan, plan_context
from envbuild.image.record import BuildRecord, build_record, provenance, sbom
from envbuild.image.render import render_dockerfile

__all__ = [
    "BuildContext",
    "BuildRecord",
    "ContextError",
    "ContextPlan",
    "FilePlan",
    "SourcePlan",
    "assemble_context",
    "build_record",
    "compare_inimage",
    "inimage_command",
    "plan_context",
    "provenance",
    "render_dockerfile",
    "sbom",
]
