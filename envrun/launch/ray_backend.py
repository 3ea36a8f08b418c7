"""The Ray backend: submit the trainer to a Ray cluster through Ray's job submission API.

The multi-node path: the submitted entry point is the trainer's driver, and verl itself places the
workers on the cluster. Before anything is submitted, every node answers for itself
(:mod:`envrun.cluster.nodecheck`). The job carries the lock digest in its metadata and the recipe's
environment in its runtime env; its logs stream back; Ctrl-C or SIGTERM stops it on the cluster.
"""

from __future__ import annotations

import shlex
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from envbuild.data.jsonout import to_jsonable
from envbuild.errors import EngineError
from envbuild.interrupts import deferred_interrupts, while_stopping
from envbuild.progress import Progress
from envrun import ray_api
from envrun.launch.base import LaunchResult, LogSink
from envrun.plan import RunPlan
from envrun.preflightline import PreflightLine

if TYPE_CHECKING:
    from envrun.cluster.state import ClusterState
    from envrun.exports import ExportSearch
    from envrun.probe.report import ExportLayout

STOP_TIMEOUT_SECONDS = 60.0


def runtime_env(plan: RunPlan) -> dict[str, Any]:
    return {"env_vars": dict(plan.env)}


def metadata(plan: RunPlan) -> dict[str, str]:
    return {"envrun.recipe": plan.recipe, "envrun.lock.sha256": plan.lock_sha256}


class RayLauncher:
    def __init__(self, address: str, cluster: ClusterState | None = None) -> None:
        """``cluster``: the state of the cluster `envrun cluster up` started, when the run names it (its
        hosts' engines are asked too)."""
        self.address, self.cluster = address, cluster
        self.job_id: str | None = None

    def check_target(self, plan: RunPlan, skip: frozenset[str], progress: Progress) -> tuple[PreflightLine, ...]:
        """Each alive node's own answer: the lock it runs, its NPUs, the model, the data and the probe there."""
        from envrun.cluster.network import network_lines
        from envrun.cluster.nodecheck import (
            CHECK,
            NodeAsk,
            ask_nodes,
            capacity_line,
            cluster_cpu_line,
            data_lines,
            engine_image_lines,
            job_address_line,
            model_lines,
            node_lines,
            probe_lines_of,
        )
        from envrun.cluster.storage import storage_line
        from envrun.preflight import NETWORK_CHECK, PROBE_CHECK, RAY_CHECK, STORAGE_CHECK

        storage = str(plan.output_dir) if plan.output_dir is not None and STORAGE_CHECK not in skip else None
        ask = NodeAsk(
            model=str(plan.model) if plan.model and "model" not in skip else None,
            data=tuple(str(p) for p in plan.data_files) if "data" not in skip else (),
            probe=to_jsonable(plan.probe) if plan.probe and PROBE_CHECK not in skip else None,
            python=plan.python,
            env=plan.env,
            transformers=plan.transformers,
            network=NETWORK_CHECK not in skip,
            storage=storage,
        )
        progress(f"asking every node of {self.address} which lock it runs and what the job would meet there")
        cluster = self.cluster
        with ThreadPoolExecutor(max_workers=1) as beside:
            # A cluster envrun started: its hosts' engines say what each node runs, asked over ssh while
            # the nodes answer (at 8 nodes on one machine: 1.4 s that no longer adds to the node job's).
            engines = beside.submit(engine_image_lines, cluster) if cluster is not None else None
            try:
                answers = ask_nodes(self.address, ask)
            except EngineError as exc:  # unverified is refused: a job never starts on nodes nobody checked
                return (PreflightLine(CHECK, "fail", f"the nodes could not be asked which lock they run: {exc}"),)
            engine_lines = engines.result() if engines is not None else ()
        ips = cluster.expected_ips() if cluster is not None else {}
        lines = node_lines(answers, plan.lock_sha256, plan.lock_file, ips) + engine_lines
        if cluster is not None:
            address = job_address_line(answers, cluster.ips[0] if cluster.ips else None)
            lines += (address,) if address is not None else ()
        lines += (capacity_line(answers, plan.nnodes, plan.npus_per_node),)
        lines += model_lines(answers) + data_lines(answers, len(plan.data_files)) + probe_lines_of(answers)
        if NETWORK_CHECK not in skip:
            lines += network_lines(answers, plan.env, plan.npus_per_node)
        if storage is not None:
            lines += (storage_line(answers, storage),)
        cpus = cluster_cpu_line(answers) if RAY_CHECK not in skip else None  # a skip is said by run_preflight
        lines += (cpus,) if cpus is not None else ()
        skipped = {name: PreflightLine(name, "skip", "skipped by --skip-check") for name in sorted(skip)}
        asked_here = ("model", "data", PROBE_CHECK, NETWORK_CHECK, STORAGE_CHECK)
        return lines + tuple(line for name, line in skipped.items() if name in asked_here)

    def find_exports(self, plan: RunPlan, layout: ExportLayout, progress: Progress) -> ExportSearch:
        """Each node searches its own files and audits what it holds (the client sees none of them)."""
        from envrun.checkpoint.audit import ModelAudit
        from envrun.cluster.nodecheck import NodeAsk, ask_nodes
        from envrun.exports import ExportSearch, search_from_answers

        assert layout.root is not None
        progress(f"asking every node of {self.address} for the exports under {layout.root}")
        try:
            ask = NodeAsk(
                lock=False,
                exports={"root": layout.root, "pattern": layout.pattern},
                python=plan.python,
                env=plan.env,
                transformers=plan.transformers,
                checkpoints=layout.root,
            )
            answers = ask_nodes(self.address, ask)
        except EngineError as exc:
            return ExportSearch(
                "the cluster", False, (ModelAudit("", False, error=f"the nodes could not be asked: {exc}"),)
            )
        return search_from_answers(answers, layout.root)

    def describe(self, plan: RunPlan) -> dict[str, Any]:
        """The submission :meth:`launch` would make (for the dry run); the id is drawn at submission."""
        return {
            "backend": "ray",
            "address": self.address,
            "entrypoint": shlex.join(plan.argv),
            "runtime_env": runtime_env(plan),
            "metadata": metadata(plan),
            "submission_id": f"envrun-{plan.recipe}-<12 hex digits, drawn at submission>",
        }

    def launch(self, plan: RunPlan, log: LogSink) -> LaunchResult:
        client = ray_api.job_client(self.address)
        self.job_id = None
        try:
            with deferred_interrupts():  # Ctrl-C while it is submitted: taken once the job can be stopped
                self.job_id = ray_api.submit(
                    client,
                    self.address,
                    plan.argv,
                    runtime_env=runtime_env(plan),
                    submission_id=f"envrun-{plan.recipe}-{uuid.uuid4().hex[:12]}",
                    metadata=metadata(plan),
                )
            log(f"envrun: submitted Ray job {self.job_id} to {self.address}\n")
            with ray_api.following(self.address, self.job_id):  # the head lost mid-job: one line, the run failed
                ray_api.tail_logs(client, self.job_id, log)
                return self._result(client)
        except KeyboardInterrupt:
            if self.job_id is None:
                raise  # nothing was submitted
            with ray_api.following(self.address, self.job_id):
                with while_stopping(lambda: None):  # a second Ctrl-C must not leave the job running
                    client.stop_job(self.job_id)
                ray_api.wait_terminal(client, self.job_id, STOP_TIMEOUT_SECONDS)
                info = client.get_job_info(self.job_id)
            return LaunchResult(
                info.driver_exit_code,
                interrupted=True,
                detail=f"Ray job {self.job_id} stopped ({info.status.value})",
            )

    def _result(self, client: Any) -> LaunchResult:
        assert self.job_id is not None
        status = ray_api.wait_terminal(client, self.job_id, STOP_TIMEOUT_SECONDS)
        info = client.get_job_info(self.job_id)
        code = info.driver_exit_code
        if code is None:
            code = 0 if status == "SUCCEEDED" else 1
        return LaunchResult(code, detail=f"Ray job {self.job_id} {status}: {info.message or ''}".strip())
