"""The guard on lenient saving: every Hugging Face export a run wrote, where the pinned verl writes it,
may lack the MTP layers and nothing else.

Where the exports are comes from the job probe, which read it from the verl the job ran
(:class:`envrun.probe.report.ExportLayout`: ``trainer.default_local_dir`` as a worker resolves it, and
verl's own layout under it, ``global_step_*/actor/model/huggingface`` for Megatron in verl 0.9.1), never
from a constant here. Each export is audited on the machine that holds it: this host for the local and
docker backends (the docker backend's output directory is a host directory mounted into the
container), a task on each node for Ray (:mod:`envrun.cluster.onnode`). The verdict is a pure function
of what was found: when the config says HF weights are saved and none is found, the run is not ok; a
config that saves none (``trainer.save_freq=-1``) says so, never "0 exports, ok". Without the probe's
layout (``--skip-check job-probe``, a recipe without a probe) nothing can be searched, and the verdict
is not ok: a lenient save is accepted only checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.data.jsonout import to_jsonable
from envrun.checkpoint.audit import ModelAudit, audit_model
from envrun.checkpoint.modelnames import ModelNames
from envrun.probe.report import ExportLayout

# Why a run whose exports could not be located does not succeed, and what to do.
UNCHECKED = (
    "a lenient checkpoint save is accepted only with its exports audited: run with the job probe, "
    "or audit each export with `envrun checkpoint audit`"
)


@dataclass(frozen=True)
class ExportSearch:
    """What a search for exports found: where it looked, whether the directory was there at all."""

    where: str  # "this host", "2 node(s)"
    present: bool  # the checkpoint directory exists there (on at least one node)
    audits: tuple[ModelAudit, ...]
    unseen: tuple[str, ...] = ()  # per node, the checkpoint files another node holds and it cannot see


@dataclass(frozen=True)
class ExportVerdict:
    detail: str  # what was found, in one line
    audits: tuple[ModelAudit, ...] = ()
    failures: tuple[str, ...] = ()  # one per lost export, or the missing export itself
    layout: ExportLayout | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "where": self.detail,
            "ok": self.ok,
            "layout": to_jsonable(self.layout),
            "exports": to_jsonable(self.audits),
            "failures": list(self.failures),
        }


def search_here(layout: ExportLayout, names: ModelNames | None = None) -> ExportSearch:
    """The exports under the layout's directory on this host, each audited against ``names`` (one model
    build for every step's export: ``names`` asks once per config.json)."""
    assert layout.root is not None
    root = Path(layout.root)
    if not root.is_dir():
        return ExportSearch("this host", False, ())
    found = sorted(p for p in root.glob(layout.pattern) if p.is_dir())  # the root's own name is no pattern
    return ExportSearch("this host", True, tuple(audit_model(str(p), names) for p in found))


def search_from_answers(answers: Iterable[dict[str, Any]], root: str | None = None) -> ExportSearch:
    """What each node found (:func:`envrun.cluster.onnode.exports`), as one search; with ``root``, also
    the checkpoint files under it that some node cannot see (a resume there would miss them)."""
    from envrun.cluster.storage import unseen_files

    answers = list(answers)
    audits: list[ModelAudit] = []
    present = False
    for answer in answers:
        found = answer.get("exports") or {}
        present = present or bool(found.get("present"))
        node = str(answer.get("name") or answer.get("node_id") or "")
        if answer.get("error"):
            audits.append(ModelAudit("", False, error=f"did not answer: {answer['error']}", node=node))
        audits += [ModelAudit.of_answer(a, node) for a in found.get("audits") or ()]
    unseen = unseen_files(answers, root) if root else ()
    return ExportSearch(f"{len(answers)} node(s)", present, tuple(audits), unseen)


def export_verdict(layout: ExportLayout | None, search: ExportSearch | None, not_checked: str = "") -> ExportVerdict:
    """The guard's verdict (pure): ``search`` is None when nothing could be searched."""
    if layout is None:  # only the probe reads where verl writes: unlocated is unchecked, never "ok"
        why = f"exports not checked: {not_checked or 'no export layout (the job probe did not run)'}"
        return ExportVerdict(why, failures=(f"{why}; {UNCHECKED}",))
    target = f"{layout.root}/{layout.pattern}"
    if layout.root is None or search is None:
        why = not_checked or "trainer.default_local_dir did not resolve"
        failures = (f"{why}, and {layout.why}",) if layout.expected else ()
        return ExportVerdict(f"exports not checked: {why}", failures=failures, layout=layout)
    if search.unseen and not search.audits:
        return ExportVerdict(
            f"checkpoints under {layout.root} on {search.where}", failures=search.unseen, layout=layout
        )
    audits = search.audits
    bad = tuple(a.failure for a in audits if not a.ok) + search.unseen
    if audits:
        sources = sorted({a.expected_from for a in audits if a.expected_from})
        names = f"; names: {'; '.join(sources)}" if sources else ""
        return ExportVerdict(f"{len(audits)} export(s) under {target} on {search.where}{names}", audits, bad, layout)
    if layout.expected:
        there = "holds no export" if search.present else "does not exist"
        return ExportVerdict(
            f"no export under {target} on {search.where}",
            failures=(f"{layout.root} {there} on {search.where}, though {layout.why}", *search.unseen),
            layout=layout,
        )
    return ExportVerdict(f"no periodic export ({layout.why}); nothing to audit", failures=search.unseen, layout=layout)
