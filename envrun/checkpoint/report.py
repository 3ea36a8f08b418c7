"""The audit's report for people: what was checked, the verdict, then what is missing or unexpected,
every name through :mod:`envrun.checkpoint.names` (sorted naturally, folded, escaped)."""

from __future__ import annotations

from pathlib import Path

from envbuild.escape import for_terminal
from envrun.checkpoint.audit import AuditReport
from envrun.checkpoint.names import abbreviate_names, render_numbers, shown_name


def render_audit(report: AuditReport, model_dir: Path, limit: int = 40) -> str:
    """The human summary: what was checked, the verdict, then what is missing or unexpected."""
    lay = report.layout
    dense = lay.num_hidden_layers - lay.moe_layers_between(0, lay.num_hidden_layers)
    lines = [
        f"checkpoint {model_dir}: {'OK' if report.ok else 'NOT OK'}",
        f"  expected names: {report.expected_from}",
        f"  layers: {lay.num_hidden_layers} ({dense} dense, {lay.num_hidden_layers - dense} MoE), "
        f"experts: {lay.n_routed_experts} routed + {lay.n_shared_experts} shared, "
        f"lm_head: {'tied' if lay.tie_word_embeddings else 'own'}",
        f"  shards: {len(report.shards)} read, {len(report.shards_missing)} missing; tensors: {report.tensors}",
    ]
    if report.mtp_layers:
        state = "present" if report.mtp_present else f"absent ({len(report.mtp_missing)} tensors missing, tolerated)"
        lines.append(f"  MTP layers {render_numbers(report.mtp_layers)}: {state}")
    else:
        lines.append("  MTP layers: none declared")
    lines.extend(f"  note: {note}" for note in report.notes)
    for title, count, folded in (
        ("missing shard files", len(report.shards_missing), abbreviate_names(report.shards_missing)),
        ("missing", len(report.missing), list(report.missing_groups)),
        ("unexpected", len(report.unexpected), abbreviate_names(report.unexpected)),
        (
            "shard files not in the index (ignored by loaders)",
            len(report.shards_unindexed),
            abbreviate_names(report.shards_unindexed),
        ),
    ):
        if count:
            lines.append(f"  {title} ({count}):")
            lines.extend(f"    {shown_name(n)}" for n in folded[:limit])
            if len(folded) > limit:
                lines.append(f"    ... and {len(folded) - limit} more groups")
    # Every line carries text the checkpoint or the image's python chose (names, the expected names'
    # source, notes): each leaves through the one terminal escape (names are escaped already).
    return "\n".join(for_terminal(line) for line in lines)
